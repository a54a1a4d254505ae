#!/usr/bin/env python3
"""Draws a pipeline timeline from a Chrome trace: one row per pipeline rank, one box per forward or
backward pass, the waits for a message hatched, idle time left grey.

    /usr/bin/python3 scripts/pipeline_timeline.py TRACE.json [-o TIMELINE.png]

The trace is the one llmc/parallel/pipeline_timeline.h writes (pipeline_chrome_trace): complete events ("ph": "X") with
tid = pipeline rank, names "F3" / "B3", args microbatch and virtual_stage, times in microseconds; the
simulator writes it (build/test_pipeline --trace 1f1b 4 8 out.json), and the training program writes it from
the times it measured on its last step (--trace), with the waits for messages added: "wait F3" (category
"wait") is the time the rank waited for F3's input (before B3: for its output's gradient). The title gives
the measured bubble as pipeline_measure in llmc/parallel/pipeline_simulator.h defines it: over the step, from the first
start to the last end on any rank, the fraction of time a rank does not compute, waits included (the mean
over ranks, and the range when they differ).

The pictures in docs/pipeline/ were made so (p = 4, m = 8; interleaved with V = 2):
    make build/test_pipeline && build/test_pipeline --trace 1f1b 4 8 /tmp/1f1b.json
    /usr/bin/python3 scripts/pipeline_timeline.py /tmp/1f1b.json -o docs/pipeline/1f1b_p4_m8.png
and measured_gpipe_p4_m8.png from the last step of a training run on the CPU (4 ranks sharing 2 cores; the same
with --pp-schedule 1f1b for measured_1f1b_p4_m8.png):
    make train_gpt_fp32_cpu && OMP_NUM_THREADS=1 mpirun --oversubscribe -np 4 ./train_gpt_fp32_cpu --model custom \
        --layers 32 --channels 512 --heads 8 --seq-len 32 --batch-size 1 --total-batch-size 256 --steps 2 \
        --val-every 0 --sample-tokens 0 --save-model false --pp 4 --pp-schedule gpipe --trace /tmp/gpipe.json
    /usr/bin/python3 scripts/pipeline_timeline.py /tmp/gpipe.json -o docs/pipeline/measured_gpipe_p4_m8.png

Needs matplotlib (Debian: python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

FORWARD_COLOUR = "#4c72b0"
BACKWARD_COLOUR = "#dd8452"
WEIGHTS_COLOUR = "#55a868"  # weight-gradient passes of a split backward
IDLE_COLOUR = "#e8e8e8"
WAIT_COLOUR, WAIT_HATCH_COLOUR = "#f6f6f6", "#a0a0a0"  # lighter than idle, hatched
DPI = 100
MARGIN_INCHES = 1.8  # row names on the left, the legend on the right
PIXELS_PER_CHARACTER = 5.0  # of a 7-point label at DPI
LABEL_PIXELS = 20  # "7.1" and a little space


def read_trace_events(path):
    """Returns (the trace, its list of events): a Chrome trace is a list of events or an object holding them in
    traceEvents. An unreadable file ends the script with one error line."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        sys.exit(f"error: cannot read the trace {path}: {error}")
    raw = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        sys.exit(f"error: {path} has no list of trace events")
    return trace, raw


def read_trace(path):
    """Returns (events, row names, layout): events as dicts with rank, name, kind, wait, microbatch,
    virtual_stage, start and end in milliseconds."""
    trace, raw = read_trace_events(path)
    events, row_names = [], {}
    for e in raw:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            row_names[int(e["tid"])] = e.get("args", {}).get("name", f"rank {e['tid']}")
        if e.get("ph") != "X":
            continue
        name = str(e.get("name", "?"))
        wait = e.get("cat") == "wait" or name.startswith("wait ")
        action = name.removeprefix("wait ")
        args = e.get("args", {})
        events.append({
            "rank": int(e["tid"]),
            "name": action,
            "kind": {"B": "backward", "W": "weights"}.get(action[:1], "forward"),
            "wait": wait,
            "microbatch": args.get("microbatch"),
            "virtual_stage": int(args.get("virtual_stage", 0)),
            "start": float(e["ts"]) / 1000.0,
            "end": (float(e["ts"]) + float(e["dur"])) / 1000.0,
        })
    if not events:
        sys.exit(f"error: {path} holds no complete events (\"ph\": \"X\")")
    layout = trace.get("otherData", {}) if isinstance(trace, dict) else {}
    return events, row_names, layout


def measure(events):
    """Step time and each rank's bubble fraction, as pipeline_measure in llmc/parallel/pipeline_simulator.h defines
    them: the step spans every event, waits included; only the forward and backward passes are busy time."""
    first = min(e["start"] for e in events)
    last = max(e["end"] for e in events)
    step = last - first
    busy = {}
    for e in events:
        busy[e["rank"]] = busy.get(e["rank"], 0.0) + (0.0 if e["wait"] else e["end"] - e["start"])
    bubbles = {rank: (step - work) / step if step > 0 else 0.0 for rank, work in busy.items()}
    return first, step, bubbles


def milliseconds(value):
    """33 for a simulated step, 14600 rather than 1.46e+04 for a measured one."""
    return f"{value:.4g}" if value < 1000 else f"{value:.0f}"


def draw(events, row_names, layout, output, title=None):
    first, step, bubbles = measure(events)
    ranks = sorted(bubbles)
    virtual_stages = max(e["virtual_stage"] for e in events) + 1
    # wide enough that the shortest pass holds a label of LABEL_PIXELS (within 8 to 24 inches)
    shortest = min((e["end"] - e["start"] for e in events if not e["wait"]), default=step)
    fig_width = min(max(8.0, step / max(shortest, 1e-9) * LABEL_PIXELS / DPI + MARGIN_INCHES), 24.0)
    axes_pixels = (fig_width - MARGIN_INCHES) * DPI
    fig, ax = plt.subplots(figsize=(fig_width, 0.9 + 0.55 * len(ranks)))
    for row, rank in enumerate(ranks):
        # the whole step in grey: whatever stays grey is the rank's bubble
        ax.barh(row, step, left=0, height=0.8, color=IDLE_COLOUR, edgecolor="none")
    row_of = {rank: row for row, rank in enumerate(ranks)}
    for e in events:
        start, width = e["start"] - first, e["end"] - e["start"]
        if e["wait"]:  # not work: no colour, no label
            ax.barh(row_of[e["rank"]], width, left=start, height=0.8, color=WAIT_COLOUR, hatch="////",
                    edgecolor=WAIT_HATCH_COLOUR, linewidth=0)
            continue
        colour = {"forward": FORWARD_COLOUR, "backward": BACKWARD_COLOUR, "weights": WEIGHTS_COLOUR}[e["kind"]]
        # later virtual stages lighter, so an interleaved schedule's rounds can be told apart
        alpha = 1.0 - 0.45 * e["virtual_stage"] / max(virtual_stages - 1, 1)
        ax.barh(row_of[e["rank"]], width, left=start, height=0.8, color=colour, alpha=alpha,
                edgecolor="white", linewidth=0.8)
        label = str(e["microbatch"]) if e["microbatch"] is not None else e["name"]
        if virtual_stages > 1:
            label += f".{e['virtual_stage']}"
        # a label only where it fits
        if width / step * axes_pixels >= PIXELS_PER_CHARACTER * (len(label) + 1):
            ax.text(start + width / 2, row_of[e["rank"]], label, ha="center", va="center", fontsize=7,
                    color="white")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([row_names.get(rank, f"rank {rank}") for rank in ranks])
    ax.invert_yaxis()  # rank 0 on top, where the pipeline starts
    ax.set_xlim(0, step)
    ax.set_xlabel("time (ms)")
    values = [bubbles[rank] for rank in ranks]
    mean = sum(values) / len(values)
    spread = "" if max(values) - min(values) < 5e-4 else f" (ranks {min(values):.1%} to {max(values):.1%})"
    if title is None:
        schedule = layout.get("schedule", "pipeline")
        shape = ", ".join(f"{key}={layout[name]}" for key, name in
                          (("p", "pipeline_ranks"), ("m", "microbatches"), ("V", "virtual_stages"))
                          if name in layout and (key != "V" or layout[name] > 1))
        title = schedule + (f" ({shape})" if shape else "")
    ax.set_title(f"{title}: step {milliseconds(step)} ms, bubble {mean:.1%}{spread}")
    legend = [Patch(color=FORWARD_COLOUR, label="forward"), Patch(color=BACKWARD_COLOUR, label="backward")]
    if any(e["kind"] == "weights" for e in events):
        legend.append(Patch(color=WEIGHTS_COLOUR, label="weights"))
    if any(e["wait"] for e in events):
        legend.append(Patch(facecolor=WAIT_COLOUR, edgecolor=WAIT_HATCH_COLOUR, hatch="////", label="wait"))
    legend.append(Patch(color=IDLE_COLOUR, label="idle"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=DPI)
    plt.close(fig)
    return step, mean


def main():
    parser = argparse.ArgumentParser(description="Draws a pipeline timeline (PNG) from a Chrome trace (JSON).")
    parser.add_argument("trace", help="Chrome trace JSON (llmc/parallel/pipeline_timeline.h's pipeline_chrome_trace)")
    parser.add_argument("-o", "--output", help="PNG to write (default: the trace's name with .png)")
    parser.add_argument("--title", help="title instead of the schedule and layout")
    args = parser.parse_args()
    output = args.output or os.path.splitext(args.trace)[0] + ".png"
    events, row_names, layout = read_trace(args.trace)
    step, bubble = draw(events, row_names, layout, output, args.title)
    waits = sum(e["wait"] for e in events)
    ranks = len({e["rank"] for e in events})
    print(f"{output}: {len(events) - waits} actions and {waits} waits on {ranks} ranks, step {milliseconds(step)} ms, "
          f"bubble {bubble:.4f}")


if __name__ == "__main__":
    main()
