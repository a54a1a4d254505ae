#!/usr/bin/env python3
"""Draws loss curves from one or more training logs: the training loss of every step as a thin line and
the validation loss as markers joined by a line, against the step, one colour per log.

    /usr/bin/python3 scripts/loss_curves.py out/a/log.jsonl [out/b/log.jsonl ...] -o curves.png
        [--labels a b ...] [--log-y] [--title TEXT]

The logs are the log.jsonl files llmc/io/logger.h writes: one JSON object per line, with "event": "step"
(members step, loss, ...) and "event": "val_loss" (step, loss). A resumed run appends to its log, so a log
may hold several "config" events and the same step more than once (the steps between the checkpoint and
the point where the first run stopped): the last value logged for a step wins, as it belongs to the run
that carried on. A NaN loss is logged as null and left out of the curve. The legend names each curve after
the log's directory (out/a/log.jsonl -> a) unless --labels is given.

When a log holds "noise_scale" events (a run with --noise-scale, llmc/noise_scale.h), a second panel beside
the losses draws the gradient noise scale B_simple (in tokens, log scale) against the step, with the step's
batch in tokens as a dashed line: where B_simple lies above the batch, a bigger batch would still save steps.
Steps whose B_simple is null (the smoothed |G|^2 not yet positive) are left out.

make train calls it at the end (scripts/train_default.sh) to write <output-dir>/loss.png.
Needs matplotlib (Debian: python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, MaxNLocator  # noqa: E402


def read_losses(path):
    """Returns ({step: training loss}, {step: validation loss}, {step: (B_simple, tokens per step)}) from one
    log, the last value of a step winning. Lines that are not JSON (a run killed mid-write leaves a partial last
    line) are skipped."""
    train, val, noise = {}, {}, {}
    with open(path) as log:
        for line in log:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or record.get("step") is None:
                continue
            if record.get("event") == "noise_scale" and record.get("b_simple") is not None:
                noise[int(record["step"])] = (float(record["b_simple"]), float(record["big_tokens"]))
            if record.get("loss") is None:
                continue
            if record.get("event") == "step":
                train[int(record["step"])] = float(record["loss"])
            elif record.get("event") == "val_loss":
                val[int(record["step"])] = float(record["loss"])
    return train, val, noise


def default_label(path):
    directory = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return directory or path


def main():
    parser = argparse.ArgumentParser(description="Plot training and validation loss from log.jsonl files.")
    parser.add_argument("logs", nargs="+", help="log.jsonl files written by the trainer")
    parser.add_argument("-o", "--output", default="loss_curves.png", help="PNG to write")
    parser.add_argument("--labels", nargs="+", help="legend names, one per log (default: the log's directory)")
    parser.add_argument("--log-y", action="store_true", help="logarithmic loss axis")
    parser.add_argument("--title", default="loss", help="the picture's title")
    args = parser.parse_args()
    if args.labels is not None and len(args.labels) != len(args.logs):
        parser.error(f"{len(args.labels)} labels for {len(args.logs)} logs")
    labels = args.labels or [default_label(path) for path in args.logs]

    try:
        logs = [read_losses(path) for path in args.logs]
    except OSError as error:
        sys.exit(f"error: cannot read {error.filename}: {error.strerror}")
    with_noise = any(noise for _, _, noise in logs)
    if with_noise:
        figure, (axes, noise_axes) = plt.subplots(1, 2, figsize=(15, 5.5))
    else:
        figure, axes = plt.subplots(figsize=(9, 5.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    summary = []
    for index, ((train, val, noise), label) in enumerate(zip(logs, labels)):
        colour = colours[index % len(colours)]
        if train:
            steps = sorted(train)
            axes.plot(steps, [train[s] for s in steps], color=colour, linewidth=0.8, alpha=0.8,
                      label=f"{label} train")
        if val:
            steps = sorted(val)
            axes.plot(steps, [val[s] for s in steps], color=colour, linewidth=1.8, marker="o", markersize=4,
                      label=f"{label} val")
        if noise:
            steps = sorted(noise)
            noise_axes.plot(steps, [noise[s][0] for s in steps], color=colour, linewidth=1.2, label=f"{label} B_simple")
            noise_axes.plot(steps, [noise[s][1] for s in steps], color=colour, linewidth=1.0, linestyle="--",
                            label=f"{label} batch")
        if not train and not val:
            print(f"warning: {args.logs[index]} holds no losses", file=sys.stderr)
        summary.append(f"{label}: {len(train)} steps, {len(val)} validation losses" +
                       (f", {len(noise)} noise scales" if noise else ""))

    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.set_ylabel("loss (cross-entropy, nats)")
    if args.log_y:
        axes.set_yscale("log")
        for set_formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
            set_formatter(FormatStrFormatter("%g"))  # 6 and 4, not 6 x 10^0: losses span less than a decade
    axes.set_title(args.title)
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    if with_noise:
        noise_axes.set_xlabel("step")
        noise_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        noise_axes.set_ylabel("tokens")
        noise_axes.set_yscale("log")
        noise_axes.set_title("gradient noise scale B_simple = tr(Sigma) / |G|^2 (smoothed), and the batch")
        noise_axes.grid(True, which="both", alpha=0.3)
        noise_axes.legend()
    figure.tight_layout()
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output} ({'; '.join(summary)})")


if __name__ == "__main__":
    main()
