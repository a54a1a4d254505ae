#!/usr/bin/env python3
"""Draws a training step's memory as the lectures draw it: per pipeline rank, the bytes held over the step as a
stacked area by category (parameters, gradients and optimizer state at the bottom, flat; the records on top,
rising through the forward passes and falling through the backward passes), the peak marked and labelled.

    /usr/bin/python3 scripts/memory_timeline.py TRACE.json [-o MEMORY.png]

The trace is the one the training program writes with --trace (llmc/parallel/pipeline_timeline.h): beside the
pipeline's actions, counter events ("ph": "C") named "device memory, rank R" (and "host memory, rank R" where
a rank holds pinned host memory), one at every moment the records held change, args = bytes by category. The
categories add up to what the rank's books hold (llmc/device_memory.h), which is flat over a step because
nothing is allocated in one; what moves is which records hold a microbatch ("records") and which are idle
("records, idle"). The last sample is the moment the timeline was collected, after the step, with the room its
gather took ("communication"). So the peak of the total is the books' total then, the memory report's peak
(train_gpt prints it at the end, log.jsonl's "memory" event has it as peak_bytes for rank 0). The script prints each rank's peak,
in bytes, and the most its records held.

The picture in docs/memory/ was made so (4 stages of 1F1B over 8 microbatches of 512 tokens, the CPU build):
    make train_gpt_fp32_cpu && OMP_NUM_THREADS=1 mpirun --oversubscribe -np 4 ./train_gpt_fp32_cpu --model custom \\
        --layers 8 --heads 4 --channels 128 --seq-len 512 --max-seq-len 512 --batch-size 1 --total-batch-size 4096 \\
        --steps 2 --val-every 0 --sample-tokens 0 --save-model false --pp 4 --trace /tmp/memory.json
    /usr/bin/python3 scripts/memory_timeline.py /tmp/memory.json -o docs/memory/1f1b_p4_m8.png

Needs matplotlib (Debian: python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from pipeline_timeline import read_trace_events  # noqa: E402

# bottom to top, as the trace lists them: the records that hold a microbatch, whose top edge rises and falls as
# the lectures' profile does, then the idle ones up to the books' flat total
COLOURS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer state": "#55a868",
    "workspace": "#8172b3",
    "communication": "#937860",
    "other": "#8c8c8c",
    "activations, other": "#64b5cd",
    "records": "#c44e52",
    "records, idle": "#e8e8e8",
}
DPI = 100
COUNTER = re.compile(r"^(device|host) memory, rank (\d+)$")


def mebibytes(value):
    return f"{value / 2**20:.2f} MiB"


def read_counters(path):
    """Returns ({(memory, rank): [(ms, {category: bytes})]}, layout) from the trace's counter events."""
    trace, raw = read_trace_events(path)
    series = {}
    for e in raw:
        match = COUNTER.match(str(e.get("name", ""))) if e.get("ph") == "C" else None
        if match:
            key = (match.group(1), int(match.group(2)))
            series.setdefault(key, []).append((float(e["ts"]) / 1000.0, dict(e.get("args", {}))))
    if not series:
        sys.exit(f"error: {path} holds no memory counters (\"ph\": \"C\", \"device memory, rank R\"): "
                 "a trace of the training program's --trace is needed")
    for samples in series.values():
        samples.sort(key=lambda sample: sample[0])
    layout = trace.get("otherData", {}) if isinstance(trace, dict) else {}
    return series, layout


def peak_of(samples):
    """(bytes, ms) of the highest total, first reached: the books are flat over the step, and the last sample,
    when the timeline was collected, adds the room its gather took."""
    totals = [(sum(values.values()), ms) for ms, values in samples]
    best = max(total for total, _ in totals)
    return best, next(ms for total, ms in totals if total == best)


def records_most(samples):
    """(bytes, ms): the most the records held, first reached (the end of the warm-up's forward passes)."""
    most = max(values.get("records", 0) for _, values in samples)
    return most, next(ms for ms, values in samples if values.get("records", 0) == most)


def draw_panel(ax, samples, title):
    times = [ms for ms, _ in samples]
    categories = [c for c in COLOURS if any(c in values for _, values in samples)]
    categories += sorted({c for _, values in samples for c in values} - set(categories))
    bottom = [0.0] * len(samples)
    for category in categories:
        top = [b + values.get(category, 0) / 2**20 for b, (_, values) in zip(bottom, samples)]
        ax.fill_between(times, bottom, top, step="post", color=COLOURS.get(category, "#cccccc"), label=category,
                        linewidth=0)
        bottom = top
    peak, _ = peak_of(samples)
    _, at = records_most(samples)  # where the lectures mark it: the records at their most
    ax.axhline(peak / 2**20, color="black", linestyle="--", linewidth=0.8)
    ax.plot([at], [peak / 2**20], marker="v", color="black")
    ax.annotate(f"peak {mebibytes(peak)}", (at, peak / 2**20), xytext=(4, 4), textcoords="offset points",
                fontsize=8)
    ax.set_xlim(times[0], times[-1])
    ax.set_ylim(0, peak / 2**20 * 1.15)
    ax.set_ylabel("MiB")
    ax.set_title(title, fontsize=9)
    return categories


def draw(series, layout, output, title=None):
    ranks = sorted({rank for _, rank in series})
    memories = [m for m in ("device", "host") if any(key[0] == m for key in series)]
    fig, axes = plt.subplots(len(ranks), len(memories), figsize=(7.5 * len(memories) + 1.5, 1.2 + 2.2 * len(ranks)),
                             squeeze=False, sharex=True)
    legend = {}
    for row, rank in enumerate(ranks):
        for column, memory in enumerate(memories):
            samples = series.get((memory, rank))
            ax = axes[row][column]
            if not samples:
                ax.set_visible(False)
                continue
            draw_panel(ax, samples, f"rank {rank}, {memory} memory")
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
    for ax in axes[-1]:
        ax.set_xlabel("time in the step (ms)")
    if title is None:
        schedule = layout.get("schedule", "")
        shape = ", ".join(f"{key}={layout[name]}" for key, name in
                          (("p", "pipeline_ranks"), ("m", "microbatches"), ("V", "virtual_stages"))
                          if name in layout and (key != "V" or layout[name] > 1))
        title = "memory over a training step" + (f": {schedule} ({shape})" if schedule else "")
    fig.suptitle(title)
    fig.legend(list(legend.values())[::-1], list(legend)[::-1], loc="upper right", fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
    fig.savefig(output, dpi=DPI)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description="Draws a training step's memory by category (PNG) from a Chrome "
                                                 "trace (JSON) written by train_gpt's --trace.")
    parser.add_argument("trace", help="Chrome trace JSON (llmc/parallel/pipeline_timeline.h's pipeline_chrome_trace)")
    parser.add_argument("-o", "--output", help="PNG to write (default: the trace's name with _memory.png)")
    parser.add_argument("--title", help="title instead of the schedule and layout")
    args = parser.parse_args()
    output = args.output or os.path.splitext(args.trace)[0] + "_memory.png"
    series, layout = read_counters(args.trace)
    draw(series, layout, output, args.title)
    for (memory, rank), samples in sorted(series.items()):
        peak, _ = peak_of(samples)
        records, at = records_most(samples)
        print(f"rank {rank}: {memory} memory peak {peak} bytes ({mebibytes(peak)}); records held at most {records} "
              f"bytes ({mebibytes(records)}) at {at:.3f} ms")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
