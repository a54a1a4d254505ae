#!/usr/bin/env python3
"""Draws the expert-load picture of a mixture-of-experts run from its log.jsonl: for each layer, the share of
the step's routed rows each expert ran, step by step (one line per expert; a balanced router keeps them all
at 1/E, the dashed line), and below them the load-balancing loss, whose uniform value is the number of
layers (1 per layer), and the assignments dropped by a capacity factor.

    /usr/bin/python3 scripts/expert_load.py out/log.jsonl [-o expert_load.png] [--title TEXT]

The log's "experts" events (llmc/io/logger.h, one per step) hold "tokens": rows per layer and expert, summed
over the step's microbatches and ranks, "aux_loss" and "z_loss" (sums over layers of their means) and
"dropped". Prints one line per layer with the first and last step's largest and smallest shares.

Needs matplotlib (Debian: python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def expert_events(path):
    events = []
    with open(path) as f:
        for line in f:
            event = json.loads(line)
            if event.get("event") == "experts":
                events.append(event)
    return events


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="a run's log.jsonl")
    parser.add_argument("-o", "--output", default="expert_load.png", help="the PNG to write")
    parser.add_argument("--title", default="", help="a title above the picture")
    args = parser.parse_args()
    events = expert_events(args.log)
    if not events:
        sys.exit(f"error: {args.log} has no 'experts' events (a run without experts, or an empty log)")
    steps = [e["step"] for e in events]
    experts = len(events[0]["tokens"][0])
    # the blocks with a mixture (--moe-every N > 1: a dense block routes no rows, and gets no panel)
    mixtures = [layer for layer in range(len(events[0]["tokens"])) if any(sum(e["tokens"][layer]) for e in events)]
    layers = len(mixtures)
    share = {layer: [[e["tokens"][layer][x] / max(1, sum(e["tokens"][layer])) for e in events] for x in range(experts)]
             for layer in mixtures}

    figure, axes = plt.subplots(layers + 1, 1, figsize=(8, 2.2 * (layers + 1)), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for axis, layer in zip(axes, mixtures):
        for x in range(experts):
            axis.plot(steps, share[layer][x], linewidth=1.2, label=f"expert {x}")
        axis.axhline(1.0 / experts, color="grey", linestyle="--", linewidth=0.8)
        axis.set_ylabel(f"layer {layer}\nshare of rows")
        axis.set_ylim(0, max(max(max(s) for s in share[layer]) * 1.1, 2.0 / experts))
        first = [share[layer][x][0] for x in range(experts)]
        last = [share[layer][x][-1] for x in range(experts)]
        print(f"layer {layer}: shares at step {steps[0]} {min(first):.3f}..{max(first):.3f}, at step {steps[-1]} "
              f"{min(last):.3f}..{max(last):.3f} (balanced: {1 / experts:.3f})")
    axes[0].legend(loc="upper right", fontsize=7, ncol=min(experts, 4))
    axis = axes[-1]
    axis.plot(steps, [e["aux_loss"] for e in events], color="black", label="load-balancing loss")
    axis.axhline(layers, color="grey", linestyle="--", linewidth=0.8)
    axis.set_ylabel("aux loss")
    axis.set_xlabel("step")
    if any(e["dropped"] for e in events):
        dropped = axis.twinx()
        dropped.plot(steps, [e["dropped"] for e in events], color="tab:red", linewidth=0.8)
        dropped.set_ylabel("dropped", color="tab:red")
    if args.title:
        figure.suptitle(args.title)
    figure.tight_layout()
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
