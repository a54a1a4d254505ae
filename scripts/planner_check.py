#!/usr/bin/env python3
"""The planner against runs: the table, the three verdicts and the picture of scripts/bench/check_planner.sh.

    /usr/bin/python3 scripts/planner_check.py RUNS [--first 3] [--last 7] [--markdown FILE] [--picture FILE]

RUNS holds layouts.tsv (name, ranks, group, description, tab-separated, one layout a line) and, per layout NAME,
NAME/log.jsonl (the run's log: its step events' "ms") and NAME.plan (what --plan printed: its "estimated step"
line). Measured: the median of the step times of steps FIRST to LAST. Prints the table, then one PASS or FAIL
line per target; exits 1 when one fails.

Needs matplotlib for the picture (Debian: python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import json
import re
import statistics
import sys

MEDIAN_ERROR_TARGET = 0.15  # the targets
SPEARMAN_TARGET = 0.9
PICK_TARGET = 0.10


def measured_ms(log, first, last):
    times = [e["ms"] for e in map(json.loads, open(log)) if e["event"] == "step" and first <= e["step"] <= last]
    if len(times) != last - first + 1:
        sys.exit(f"planner_check.py: {log} has {len(times)} of steps {first} to {last}")
    return statistics.median(times)


def predicted_ms(plan):
    text = open(plan).read()
    found = re.search(r"^estimated step ([0-9.eE+-]+) s", text, re.M)
    if not found:
        sys.exit(f"planner_check.py: no 'estimated step' line in {plan}")
    return 1e3 * float(found.group(1))


def ranks_of(values):
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs, ys):
    """Pearson's correlation of the ranks."""
    rx, ry = ranks_of(xs), ranks_of(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    covariance = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    spread = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return covariance / spread if spread > 0 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs")
    parser.add_argument("--first", type=int, default=3)
    parser.add_argument("--last", type=int, default=7)
    parser.add_argument("--markdown")
    parser.add_argument("--picture")
    parser.add_argument("--note", default="", help="what the markdown's closing line says of the machine")
    parser.add_argument("--build", default="the CPU build", help="what ran, for the picture's title")
    args = parser.parse_args()

    rows = []
    for line in open(f"{args.runs}/layouts.tsv"):
        name, ranks, group, description = line.rstrip("\n").split("\t")
        measured = measured_ms(f"{args.runs}/{name}/log.jsonl", args.first, args.last)
        predicted = predicted_ms(f"{args.runs}/{name}.plan")
        rows.append(dict(name=name, ranks=int(ranks), group=group, description=description, measured=measured,
                         predicted=predicted, error=predicted / measured - 1))

    header = f"{'layout':20} {'ranks':>5} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  flags"
    print(header)
    for r in rows:
        print(f"{r['name']:20} {r['ranks']:5d} {r['measured']:12.1f} {r['predicted']:13.1f} {100 * r['error']:+7.1f}%  "
              f"{r['description']}")

    median_error = statistics.median(abs(r["error"]) for r in rows)
    rho = spearman([r["measured"] for r in rows], [r["predicted"] for r in rows])
    pick_group = [r for r in rows if r["group"] == "pick"]
    verdicts = [
        (median_error <= MEDIAN_ERROR_TARGET,
         f"median |error| {100 * median_error:.1f}% over {len(rows)} layouts (target <= {100 * MEDIAN_ERROR_TARGET:.0f}%)"),
        (rho >= SPEARMAN_TARGET, f"Spearman rank correlation {rho:.3f} (target >= {SPEARMAN_TARGET})"),
    ]
    if pick_group:  # one GPU has no group of layouts of the same work on several ranks: its check has none
        pick = min(pick_group, key=lambda r: r["predicted"])
        fastest = min(pick_group, key=lambda r: r["measured"])
        pick_excess = pick["measured"] / fastest["measured"] - 1
        verdicts.append((pick_excess <= PICK_TARGET,
                         f"the planner's pick of the {len(pick_group)} layouts of group 'pick', {pick['name']}, measures "
                         f"{pick['measured']:.1f} ms, {100 * pick_excess:+.1f}% of the fastest measured "
                         f"({fastest['name']}, {fastest['measured']:.1f} ms) (target <= +{100 * PICK_TARGET:.0f}%)"))
    else:
        print("the pick: no layouts in group 'pick' here, not checked")
    for good, text in verdicts:
        print(f"{'PASS' if good else 'FAIL'} {text}")

    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("| layout | ranks | flags | measured ms | predicted ms | error |\n| --- | --- | --- | --- | --- | --- |\n")
            for r in rows:
                f.write(f"| {r['name']}{' (pick group)' if r['group'] == 'pick' else ''} | {r['ranks']} | "
                        f"{r['description']} | {r['measured']:.1f} | {r['predicted']:.1f} | {100 * r['error']:+.1f}% |\n")
            f.write("\n")
            for good, text in verdicts:
                f.write(f"- {'PASS' if good else 'FAIL'}: {text}\n")
            if args.note:
                f.write(f"- {args.note}\n")
        print(f"wrote {args.markdown}")
    if args.picture:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 6.5))
        low = 0.8 * min(min(r["measured"], r["predicted"]) for r in rows)
        high = 1.25 * max(max(r["measured"], r["predicted"]) for r in rows)
        ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
        ax.fill_between([low, high], [low * (1 - MEDIAN_ERROR_TARGET), high * (1 - MEDIAN_ERROR_TARGET)],
                        [low * (1 + MEDIAN_ERROR_TARGET), high * (1 + MEDIAN_ERROR_TARGET)], color="grey", alpha=0.2,
                        label=f"within {100 * MEDIAN_ERROR_TARGET:.0f}%")
        for ranks, marker in ((1, "o"), (2, "s"), (4, "^")):
            chosen = [r for r in rows if r["ranks"] == ranks]
            ax.scatter([r["measured"] for r in chosen], [r["predicted"] for r in chosen], marker=marker,
                       label=f"{ranks} rank{'s' if ranks > 1 else ''}", zorder=3)
        for r in rows:
            ax.annotate(r["name"], (r["measured"], r["predicted"]), fontsize=6, xytext=(3, 2),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel("measured ms per step (median of steps after warm-up)")
        ax.set_ylabel("predicted ms per step (--plan --machine)")
        ax.set_title(f"The planner against {len(rows)} runs of {args.build}\nmedian |error| {100 * median_error:.1f}%, "
                     f"Spearman {rho:.3f}", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        fig.savefig(args.picture, dpi=120)
        print(f"wrote {args.picture}")
    return 0 if all(good for good, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
