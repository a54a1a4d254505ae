#!/usr/bin/env python3
"""The critical batch size, measured: the steps S and tokens E that runs at several fixed batch sizes take to
reach one validation loss, the trade-off of McCandlish et al. 2018 ("An Empirical Model of Large-Batch
Training") fitted to them, and the gradient noise scale the runs logged beside it.
scripts/bench/bench_critical_batch.sh drives it:

    critical_batch.py until --log DIR/log.jsonl --target L -- ./train_gpt_cpu ...
        runs the trainer and stops it at its first validation loss at or below L (exit 1 if it never got there)
    critical_batch.py ramp --target L --batches 512,1024,... DIR...
        prints a --batch-ramp built from the noise scale the runs in DIR... measured
    critical_batch.py report --target L --fixed DIR... [--ramp DIR] [--png P] [--markdown M]
        prints the table and the fit, draws the picture, writes the table as markdown

The model. A run at B tokens per step needs S = S_min (1 + B_noise / B) steps and E = E_min (1 + B / B_noise)
tokens to reach a loss, with B_noise = E_min / S_min: small batches waste no tokens but take many steps, big
ones take few steps but spend tokens on noise the gradient no longer has. Multiplied out,
(S / S_min - 1)(E / E_min - 1) = 1, a hyperbola in the (E, S) plane, and B_crit = E_min / S_min is the batch
at its knee, where a run takes 2 S_min steps and 2 E_min tokens. Since E = B S, S = S_min + E_min / B: a straight
line in 1 / B. The fit is that line by least squares weighted by 1 / S^2, so every run's relative error
counts alike (S spans an order of magnitude).

Steps to the target. The trainer validates every few steps on the same batches (train_gpt.cu's
validation_loss), so successive values compare. S is the step where the line through the last validation
above the target and the first at or below it crosses the target; E is the tokens seen at that (fractional)
step.

The noise scale. With --noise-scale the trainer logs B_simple = tr(Sigma) / |G|^2 (the paper's appendix A),
in tokens, from the gradient norms of a microbatch and of the whole step. A run whose step is one microbatch
has no second batch size to compare and logs none.

Reads the log.jsonl files llmc/io/logger.h writes. Needs numpy; the picture needs matplotlib (Debian:
python3-numpy, python3-matplotlib; call /usr/bin/python3).
"""
import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np


def read_events(path):
    """The log's events in order; a partial last line (a run stopped mid-write) is skipped."""
    events = []
    with open(path) as log:
        for line in log:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                events.append(record)
    return events


def parse_ramp(text):
    """'T0:B0,T1:B1,...' -> [(threshold, tokens per step), ...], as --batch-ramp reads it."""
    phases = []
    for item in text.split(","):
        threshold, tokens = item.split(":")
        phases.append((int(threshold), int(tokens)))
    return phases


class Run:
    """One training run's log: its batch per step, validation losses and noise-scale estimates."""

    def __init__(self, directory):
        self.directory = directory
        self.events = read_events(os.path.join(directory, "log.jsonl"))
        configs = [e for e in self.events if e.get("event") == "config"]
        if not configs:
            raise SystemExit(f"{directory}/log.jsonl: no config event (the run did not start)")
        flags = configs[0]["flags"]
        self.flags = flags
        micro = flags["batch-size"] * flags["seq-len"]
        self.micro_tokens = micro
        ramp = flags.get("batch-ramp") or ""
        total = flags["total-batch-size"] or micro
        self.phases = parse_ramp(ramp) if ramp else [(0, total)]
        self.learning_rate = flags["learning-rate"]
        self.val = [(e["step"], e["loss"]) for e in self.events
                    if e.get("event") == "val_loss" and e.get("loss") is not None]
        self.steps_logged = max([e["step"] for e in self.events if e.get("event") == "step"], default=0)
        # the trainer's own count where it logs one (batch_tokens, with --batch-ramp): the same, or this reads
        # the ramp wrongly
        for e in self.events:
            if e.get("event") == "step" and "batch_tokens" in e and e["batch_tokens"] != self.batch_of_step(e["step"] - 1):
                raise SystemExit(f"{directory}: step {e['step']} trained {e['batch_tokens']} tokens, the ramp "
                                 f"{self.phases} says {self.batch_of_step(e['step'] - 1)}")
        times = [e["time_s"] for e in self.events if "time_s" in e]
        self.seconds = max(times) if times else 0.0

    def batch_of_step(self, step):
        """Tokens of step `step` (0-based): a phase starts with the first step whose tokens seen before it
        reach its threshold (llmc/batch_ramp.h)."""
        return self.batch_after(self.tokens_before(step))

    def batch_after(self, seen):
        return [tokens for threshold, tokens in self.phases if seen >= threshold][-1]

    def tokens_before(self, step):
        seen = 0
        for _ in range(int(step)):
            seen += self.batch_after(seen)
        return seen

    def tokens_at(self, step):
        """Tokens seen after a fractional number of steps: the step in progress contributes its share."""
        whole = int(math.floor(step))
        seen = self.tokens_before(whole)
        return seen + (step - whole) * self.batch_after(seen)

    def is_fixed(self):
        return len(self.phases) == 1

    def crossing(self, target):
        """(steps, tokens) to the first validation loss at or below `target`, interpolated; None if never."""
        for (s0, l0), (s1, l1) in zip(self.val, self.val[1:]):
            if l1 <= target < l0:
                step = s0 + (l0 - target) / (l0 - l1) * (s1 - s0)
                return step, self.tokens_at(step)
        if self.val and self.val[0][1] <= target:
            return 0.0, 0.0
        return None

    def noise_scale(self):
        """[(step, tokens seen after it, smoothed B_simple in tokens)] from the trainer's --noise-scale events."""
        series = []
        for e in self.events:
            if e.get("event") != "noise_scale" or e.get("b_simple") is None:
                continue
            series.append((e["step"], self.tokens_before(e["step"]), float(e["b_simple"])))
        return series

    def noise_scale_at(self, tokens):
        """The smoothed B_simple logged last before `tokens` tokens were seen (None without a measurement)."""
        values = [b for _, seen, b in self.noise_scale() if seen <= tokens and math.isfinite(b) and b > 0]
        return values[-1] if values else None


def fit_tradeoff(batches, steps):
    """S = S_min + E_min / B by least squares weighted by 1 / S^2: returns (S_min, E_min)."""
    b, s = np.asarray(batches, float), np.asarray(steps, float)
    design = np.stack([np.ones_like(b), 1.0 / b], axis=1) / s[:, None]
    (s_min, e_min), *_ = np.linalg.lstsq(design, s / s, rcond=None)
    return float(s_min), float(e_min)


# ---- until: run the trainer to the target and stop it there

def command_until(args):
    if os.path.exists(args.log):
        os.remove(args.log)
    process = subprocess.Popen(args.command)
    reached = None
    while reached is None and process.poll() is None:
        time.sleep(0.5)
        if os.path.exists(args.log):
            losses = [e["loss"] for e in read_events(args.log) if e.get("event") == "val_loss"]
            reached = next((loss for loss in losses if loss is not None and loss <= args.target), None)
    if reached is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)  # past the target the rest of the run is not needed
    status = process.wait()
    if reached is None:
        losses = [e["loss"] for e in read_events(args.log) if e.get("event") == "val_loss"] if os.path.exists(args.log) else []
        last = f"{losses[-1]:.4f}" if losses and losses[-1] is not None else "none"
        print(f"FAILED: {os.path.dirname(args.log)} never reached validation loss {args.target} "
              f"(trainer exit {status}, last validation loss {last})")
        return 1
    return 0


# ---- ramp: a batch schedule from the measured noise scale

def best_fixed(runs, target):
    """The run with the least S x E to the target: on the hyperbola (S/S_min)(E/E_min) = S/S_min + E/E_min is
    least, 4, at the knee B = B_crit, so this is the batch that balances steps against tokens best."""
    reached = [(run, run.crossing(target)) for run in runs]
    reached = [(run, hit) for run, hit in reached if hit is not None]
    return min(reached, key=lambda pair: pair[1][0] * pair[1][1])[0] if reached else None


def command_ramp(args):
    """Prints a --batch-ramp and the learning rate of the best fixed batch, for the ramp to compete at.
    The batch follows the noise scale the given runs measured (a run logs none where its step is one
    microbatch): a power law B_simple = a T^k fitted to all their estimates against the tokens seen T (least
    squares on the logarithms: one estimate is noisy, the runs' trend is not), and at T the allowed batch
    nearest to it in ratio, up or down as the trend goes, until the most tokens a fixed run took."""
    batches = sorted(int(b) for b in args.batches.split(","))
    runs = [Run(d) for d in args.runs]
    best = best_fixed(runs, args.target)
    if best is None:
        print("no fixed-batch run reached the target", file=sys.stderr)
        return 1
    points = [(seen, b) for run in runs for _, seen, b in run.noise_scale() if math.isfinite(b) and b > 0]
    if len(points) < 2:
        print("no noise-scale measurements in the runs (train_gpt without --noise-scale?)", file=sys.stderr)
        return 1
    seen, noise = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    exponent, log_scale = np.polyfit(seen, noise, 1)
    end = max(hit[1] for hit in (run.crossing(args.target) for run in runs) if hit)
    phases = []
    for tokens in np.geomspace(min(p[0] for p in points), end, 200):
        trend = math.exp(log_scale) * tokens ** exponent
        nearest = min(batches, key=lambda b: abs(math.log(b / trend)))
        if not phases or nearest != phases[-1][1]:
            phases.append((int(tokens) if phases else 0, nearest))
    print(",".join(f"{threshold}:{tokens}" for threshold, tokens in phases), f"{best.learning_rate:g}")
    print(f"noise scale trend B_simple = {math.exp(log_scale):.4g} T^{exponent:.3f} over {len(points)} estimates",
          file=sys.stderr)
    return 0


# ---- report: the table, the fit, the picture

def command_report(args):
    fixed = [Run(d) for d in args.fixed]
    ramp = Run(args.ramp) if args.ramp else None
    failed = [run for run in fixed + ([ramp] if ramp else []) if run.crossing(args.target) is None]
    for run in failed:
        last = f"{run.val[-1][1]:.4f}" if run.val else "none"
        print(f"FAILED: {run.directory} never reached validation loss {args.target} (last {last})")

    rows = []
    for run in fixed:
        hit = run.crossing(args.target)
        if hit is None:
            continue
        rows.append(dict(run=run, batch=run.phases[0][1], steps=hit[0], tokens=hit[1],
                         noise=run.noise_scale_at(hit[1])))
    rows.sort(key=lambda r: r["batch"])
    if len(rows) < 3:
        print(f"FAILED: {len(rows)} fixed-batch runs reached the target; the fit needs at least 3")
        return 1
    s_min, e_min = fit_tradeoff([r["batch"] for r in rows], [r["steps"] for r in rows])
    fit_ok = s_min > 0 and e_min > 0
    b_crit = e_min / s_min if fit_ok else float("nan")
    best_run = best_fixed(fixed, args.target)
    best = next(r for r in rows if r["run"] is best_run)
    noises = [r["noise"] for r in rows if r["noise"]]
    noise_at_target = float(np.median(noises)) if noises else None

    lines = []
    head = ("| tokens per step | microbatches | learning rate | steps S | tokens E | S / S_min | E / E_min | "
            "B_simple at the target | wall s |")
    lines += [head, "| " + " | ".join(["---"] * 9) + " |"]

    def row(label, micro, run, steps, tokens, noise):
        ratio = (lambda v, m: f"{v / m:.2f}") if fit_ok else (lambda v, m: "-")
        return (f"| {label} | {micro} | {run.learning_rate:g} | {steps:.1f} | {tokens:,.0f} | {ratio(steps, s_min)} | "
                f"{ratio(tokens, e_min)} | {f'{noise:,.0f}' if noise else '-'} | {run.seconds:.0f} |")

    for r in rows:
        label = f"{r['batch']:,}" + (" (best S x E)" if r is best else "")
        lines.append(row(label, r["batch"] // r["run"].micro_tokens, r["run"], r["steps"], r["tokens"], r["noise"]))
    ramp_hit = ramp.crossing(args.target) if ramp else None
    if ramp_hit:
        phases = ", ".join(f"{t:,}" for _, t in ramp.phases)
        lines.append(row(f"ramp {phases}", "-", ramp, ramp_hit[0], ramp_hit[1], ramp.noise_scale_at(ramp_hit[1])))

    summary = [f"target validation loss {args.target}"]
    if fit_ok:
        residual = max(abs(s_min + e_min / r["batch"] - r["steps"]) / r["steps"] for r in rows)
        summary.append(f"fit (S/S_min - 1)(E/E_min - 1) = 1: S_min = {s_min:.1f} steps, E_min = {e_min:,.0f} tokens, "
                       f"B_crit = E_min / S_min = {b_crit:,.0f} tokens per step (worst relative miss of S: "
                       f"{100 * residual:.0f}%)")
    else:
        summary.append(f"fit failed: S_min = {s_min:.1f}, E_min = {e_min:,.0f} (both must be positive: the batches "
                       "do not bracket the knee)")
    if noise_at_target is not None:
        ratio = f", B_crit / B_simple = {b_crit / noise_at_target:.2f}" if fit_ok else ""
        summary.append(f"noise scale B_simple at the target loss (median over the runs that measure it): "
                       f"{noise_at_target:,.0f} tokens{ratio}")
    else:
        summary.append("noise scale: not measured (no noise_scale events in the logs: train_gpt without --noise-scale)")
    if ramp_hit:
        summary.append(f"ramp {ramp.flags.get('batch-ramp')}: {ramp_hit[0]:.1f} steps and {ramp_hit[1]:,.0f} tokens, "
                       f"against the best fixed batch ({best['batch']:,}): {best['steps']:.1f} steps and "
                       f"{best['tokens']:,.0f} tokens ({100 * (ramp_hit[0] / best['steps'] - 1):+.0f}% steps, "
                       f"{100 * (ramp_hit[1] / best['tokens'] - 1):+.0f}% tokens)")
    print("\n".join(lines))
    print("\n".join(summary))
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w") as out:
            out.write("\n".join(lines) + "\n\n" + "\n".join(f"- {line}" for line in summary) + "\n")
    if args.png:
        draw(args.png, args.target, rows, ramp, ramp_hit, s_min, e_min, fit_ok, b_crit)
    return 1 if failed or not fit_ok else 0


def draw(path, target, rows, ramp, ramp_hit, s_min, e_min, fit_ok, b_crit):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, (tradeoff, noise) = plt.subplots(1, 2, figsize=(12, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(rows):
        colour = colours[i % len(colours)]
        tradeoff.plot(r["tokens"], r["steps"], "o", color=colour, markersize=8, label=f"B = {r['batch']:,}")
        series = r["run"].noise_scale()
        if series:
            noise.plot([seen for _, seen, _ in series], [b for _, _, b in series], color=colour, lw=1.2,
                       label=f"B_simple, run at B = {r['batch']:,}")
            noise.axvline(r["tokens"], color=colour, lw=0.6, ls=":")
    if fit_ok:
        batches = np.geomspace(min(r["batch"] for r in rows) / 4, max(r["batch"] for r in rows) * 4, 200)
        tradeoff.plot(e_min + s_min * batches, s_min + e_min / batches, "k-", lw=1,
                      label=f"(S/S_min - 1)(E/E_min - 1) = 1, B_crit = {b_crit:,.0f}")
        tradeoff.axhline(s_min, color="gray", ls="--", lw=0.8)
        tradeoff.axvline(e_min, color="gray", ls="--", lw=0.8)
        tradeoff.plot(2 * e_min, 2 * s_min, "kx", markersize=9, label="B = B_crit: 2 S_min steps, 2 E_min tokens")
        noise.axhline(b_crit, color="black", ls="--", lw=1, label=f"B_crit from the fit, {b_crit:,.0f}")
    if ramp_hit:
        tradeoff.plot(ramp_hit[1], ramp_hit[0], "k*", markersize=14, label="the ramp")
        seen = np.linspace(0, ramp_hit[1], 400)
        noise.plot(seen, [ramp.batch_after(t) for t in seen], color="black", lw=2, drawstyle="steps-post",
                   label="the ramp's batch")
    tradeoff.set_xscale("log"), tradeoff.set_yscale("log")
    tradeoff.set_xlabel("tokens E to the target"), tradeoff.set_ylabel("optimizer steps S to the target")
    tradeoff.set_title(f"steps and tokens to validation loss {target}")
    tradeoff.legend(fontsize=8)
    noise.set_yscale("log")
    noise.set_xlabel("tokens seen (dotted: where each run reached the target)")
    noise.set_ylabel("tokens per step")
    noise.set_title("the gradient noise scale B_simple over training")
    noise.legend(fontsize=8)
    if not any(r["run"].noise_scale() for r in rows):
        noise.text(0.5, 0.5, "no noise-scale events in the logs", ha="center", transform=noise.transAxes)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command_name", required=True)
    until = commands.add_parser("until", help="run the trainer until its validation loss reaches the target")
    until.add_argument("--log", required=True)
    until.add_argument("--target", type=float, required=True)
    until.add_argument("command", nargs=argparse.REMAINDER)
    ramp = commands.add_parser("ramp", help="a --batch-ramp from the runs' noise scale")
    ramp.add_argument("--target", type=float, required=True)
    ramp.add_argument("--batches", required=True, help="the batches the ramp may use, comma-separated")
    ramp.add_argument("runs", nargs="+")
    report = commands.add_parser("report", help="table, fit and picture")
    report.add_argument("--target", type=float, required=True)
    report.add_argument("--fixed", nargs="+", required=True, help="output directories of the fixed-batch runs")
    report.add_argument("--ramp", help="output directory of the ramped run")
    report.add_argument("--png")
    report.add_argument("--markdown")
    args = parser.parse_args()
    if args.command_name == "until":
        if args.command and args.command[0] == "--":
            args.command = args.command[1:]
        return command_until(args)
    if args.command_name == "ramp":
        return command_ramp(args)
    return command_report(args)


if __name__ == "__main__":
    sys.exit(main())
