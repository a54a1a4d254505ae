# The comparisons the layout tests (scripts/test/test_*.sh) make between training runs, in one place: each script
# runs the training program once per layout into $work/NAME, then its Python heredoc imports this module
# (PYTHONPATH="$(dirname "$0")") to judge those runs against one rank's.
#
# A run's directory holds log.jsonl, one JSON event a line ({"event": "step", "step": 3, "loss": ...},
# "val_loss", "sample", "memory", ...), and model.bin, llm.c's file: a 1024-byte header, then every
# parameter as fp32. A layout agrees with the reference run when its losses and its final parameters (in
# norm) agree within a relative tolerance.
#
# Each check prints one line, "  ok   WHAT" or "  FAIL WHAT" (as test_lib.sh's ok and bad do), and
# returns whether it passed; the script keeps those answers in a list and ends with result(list), the line
# "RESULT <passed> <failed>" that test_lib.sh's add_python_result adds to the script's tally.
import json
import math

import numpy as np

# The relative tolerance of every comparison here (all of them run the FP32 build). A layout changes only the
# order of float additions (a matmul's sum split into partial sums, a gradient summed over microbatches or
# ranks), which moves the losses and the final parameters by a few fp32 roundings: measured at most 1e-7 on
# the losses and 6e-7 on the parameters in these tests (5 to 12 steps), 2e-6 at tp 3 (a wider model, split
# in three). A wrong slice, a missing reduction or a lost step moves them by 1e-4 or more.
TOLERANCE, TOLERANCE_WORDS = 1e-5, "tol 1e-5"


def events(work, name, kind):
    """The events of one kind ("step", "val_loss", "sample", "memory", ...) in the run's log, in order."""
    with open(f"{work}/{name}/log.jsonl") as log:
        return [e for e in (json.loads(line) for line in log) if e["event"] == kind]


def losses(work, name, kind="step"):
    """The losses the run logged, training ("step") or validation ("val_loss"), in order."""
    return [e["loss"] for e in events(work, name, kind)]


def parameters(work, name):
    """The run's final parameters, from its model.bin."""
    return np.fromfile(f"{work}/{name}/model.bin", dtype=np.float32, offset=1024)


def loss_error(reference, mine):
    """The largest relative difference between two lists of losses, pair by pair; infinite with no pair."""
    return max([abs(b - a) / abs(a) for a, b in zip(reference, mine)] or [math.inf])


def parameter_error(mine, reference):
    """The relative difference of two parameter vectors in norm; infinite when their sizes differ."""
    if mine.shape != reference.shape:
        return math.inf
    return float(np.linalg.norm(mine - reference) / np.linalg.norm(reference))


def cp_bytes(flags, batch, layers, channels, seq_len, micro_steps, value_bytes=4, kv_channels=None):
    """The bytes rank 0 sends on the cp axis per step, llmc/parallel/context_parallel.h's formula, for a layout given
    as its list of flags (--cp, --tp, --pp, --cp-mode ulysses, --recompute full) and B rows per data-parallel
    rank: N = B T / cp rows per rank and micro-step, Cq' = C/tp the columns of a tp rank's query heads, Ckv' those
    of its key (or value) heads (kv_channels / tp; kv_channels = C when there are as many K/V heads as query
    heads), W' = Cq' + 2 Ckv', l = L/pp layers, F forward passes per layer (2 under full recomputation);
        ring     ((cp-1) F + 2cp - 1) l 2 N Ckv' s     ulysses  ((F + 1) W' + (F + 2) Cq') l (cp-1)/cp N s
    per micro-step."""
    value = lambda flag, default: int(flags[flags.index(flag) + 1]) if flag in flags else default
    cp, tp, pp = value("--cp", 1), value("--tp", 1), value("--pp", 1)
    F = 2 if "full" in flags else 1
    kv_channels = channels if kv_channels is None else kv_channels
    N, cq, ckv, l = batch * seq_len / cp, channels / tp, kv_channels / tp, layers / pp
    if "ulysses" in flags:
        per_layer = ((F + 1) * (cq + 2 * ckv) + (F + 2) * cq) * (cp - 1) / cp * N
    else:
        per_layer = ((cp - 1) * F + 2 * cp - 1) * 2 * N * ckv
    return micro_steps * l * per_layer * value_bytes


def pipeline_stage_rank(schedule, stage, p):
    """The pipeline rank holding a model stage (llmc/parallel/pipeline_schedule.h): stage s on rank s mod p, except
    under zbv, whose V holds stages r and 2p - 1 - r on rank r."""
    if schedule == "zbv" and stage >= p:
        return 2 * p - 1 - stage
    return stage % p


def pp_bytes(schedule, p, V, m, B, seq_len, channels, max_seq_len, padded_vocab, tp=1, sp=False, shards=1, zero=0,
             rank=0, value_bytes=4, tied_head=True):
    """The bytes pipeline rank `rank` sends per step (pipeline_bytes_per_step in llmc/parallel/pipeline.h): m a s
    for each of its stages whose next stage is on another rank (the activations), m a s for each whose previous
    stage is (the gradients), the tied embedding chunk's gradient e s (its shard at ZeRO >= 1) when the first and
    the last stage are on different ranks and this is one of them (GPT-2; an untied head, Llama's, has none), and
    the loss's broadcast and the norm's
    all-reduce (4 and 8 bytes, times (p-1)/p rounded down). a = B T C (/ tp under sequence parallelism)."""
    if p == 1:
        return 0
    a, S, s = B * seq_len * channels // (tp if sp else 1), p * V, value_bytes
    sent = 0
    for stage in range(S):
        if pipeline_stage_rank(schedule, stage, p) != rank:
            continue
        sent += m * a * s * (stage < S - 1 and pipeline_stage_rank(schedule, stage + 1, p) != rank)
        sent += m * a * s * (stage > 0 and pipeline_stage_rank(schedule, stage - 1, p) != rank)
    last = pipeline_stage_rank(schedule, S - 1, p)
    if tied_head and last != 0 and rank in (0, last):
        multiple = 128 * shards  # llmc/model/parameters.h pads each chunk to this; tp slices wte's rows
        e = -(-(padded_vocab * channels // tp + max_seq_len * channels) // multiple) * multiple
        sent += e // (shards if zero >= 1 else 1) * s
    return sent + 4 * (p - 1) // p + 8 * (p - 1) // p


def trace_passes(path, rank=0):
    """The forwards and backwards pipeline rank `rank` ran, in order, from a --trace file: (kind, virtual stage)
    pairs, kind "F" or "B" (W passes, and the waits, left out)."""
    with open(path) as trace:
        events = json.load(trace)["traceEvents"]
    return [(e["name"][0], e["args"]["virtual_stage"]) for e in events
            if e.get("cat") == "work" and e["tid"] == rank and e["name"][0] in "FB"]


def dp_bytes(schedule, p, V, m, stage_layers, zero, dp, channels, max_seq_len, padded_vocab, passes=None, rank=0,
             value_bytes=4):
    """The bytes pipeline rank `rank` sends per step to its data-parallel group (llmc/parallel/zero.h), in any step
    but the first (the first finds chunks that the validation before it gathered), for dp ranks that share one copy
    of the state (no HSDP, tp or cp). P: the rank's chunks (the embedding chunk on the first and on the last
    stage's rank, its stages' blocks, the final layernorm chunk on the last stage's rank), each padded to a
    multiple of 128 N elements (N = dp at ZeRO >= 1, else 1); m microbatches, s bytes per element:
        ZeRO-0  each chunk all-reduced after the last microbatch:       2 (N-1)/N P s
        ZeRO-1  reduce-scattered after the last, all-gathered after AdamW: 2 (N-1)/N P s
        ZeRO-2  reduce-scattered after EVERY microbatch, then the all-gather:  (m + 1) (N-1)/N P s
        ZeRO-3  reduce-scattered after every microbatch, and the gathers:  (m P + e + f + G b) (N-1)/N s
    At ZeRO-3 the optimizer step leaves every gathered chunk stale: the embedding and the final layernorm chunk
    (e and f elements, where held) are gathered once each, as their buffers hold nothing else; the blocks (b
    elements each) share two buffers by parity, and G counts the times a pass asks for a block that its buffer
    does not hold: a forward asks for its stage's blocks first to last, a backward last to first, a W for none
    (no recomputation). `passes` gives the rank's forwards and backwards in order (trace_passes). zero.h also
    gathers the next block ahead; that changes when a block arrives, not how often, as long as no pass ends beside
    another block of its rank, which holds for rank 0 at p >= 2 (its stages' neighbours are on rank 1).
    Plus the mean loss's all-reduce over the data-parallel ranks and, at ZeRO >= 1, the squared gradient norm's
    over the shard group: 4 bytes each, 2 (N-1)/N of them rounded down.

    With the embedding chunk reduced once per step instead of every microbatch, ZeRO-2 and 3 fall short by
    (m - 1) (N-1)/N e s."""
    N, S, s = dp, p * V, value_bytes
    multiple = 128 * (N if zero >= 1 else 1)  # llmc/model/parameters.h pads each chunk to this
    padded = lambda elements: -(-elements // multiple) * multiple
    e, b, f = (padded(padded_vocab * channels + max_seq_len * channels), padded(12 * channels**2 + 13 * channels),
               padded(2 * channels))
    # the rank's model stages, by virtual stage (pipeline_stage_rank's placement), and their blocks (chunks 1..L)
    stages = [(rank if v == 0 else 2 * p - 1 - rank) if schedule == "zbv" else v * p + rank for v in range(V)]
    blocks = [list(range(sum(stage_layers[:stage]) + 1, sum(stage_layers[:stage + 1]) + 1)) for stage in stages]
    once = [e] * (0 in stages or S - 1 in stages) + [f] * (S - 1 in stages)  # at ZeRO-3 gathered once per step
    chunks = once + [b] * sum(len(stage_blocks) for stage_blocks in blocks)
    P = sum(chunks)
    all_reduce = lambda nbytes: 2 * nbytes * (N - 1) // N  # comm.h's ring_share, per call
    small = all_reduce(4) * (2 if zero >= 1 else 1)  # the loss, and the norm at ZeRO >= 1
    if zero == 0:
        return sum(all_reduce(c * s) for c in chunks) + small
    if zero <= 2:
        return (2 if zero == 1 else m + 1) * (N - 1) * P // N * s + small
    buffers, G = [None, None], 0  # the block each of the two block buffers holds
    for kind, v in passes:
        for chunk in blocks[v] if kind == "F" else reversed(blocks[v]):
            G += buffers[chunk % 2] != chunk
            buffers[chunk % 2] = chunk
    return (m * P + sum(once) + G * b) * (N - 1) // N * s + small


def cp_bytes_against_formula(work, name, theory):
    """The cp axis's bytes of the run's last step against the formula, within 0.1%.
    Returns whether they agree and the words for the ok/FAIL line."""
    sent = events(work, name, "step")[-1]["cp_comm_bytes"]
    error = abs(sent - theory) / theory if theory else abs(sent)
    return error <= 1e-3, f"cp axis sent {sent} B/step, formula {theory:.0f} ({100 * error:.4f}%, tol 0.1%)"


def report(good, what):
    """Prints the check's ok/FAIL line; returns good."""
    print(f"  {'ok  ' if good else 'FAIL'} {what}")
    return good


def result(results):
    """The closing line for add_python_result: how many of the checks passed and how many failed."""
    print(f"RESULT {sum(results)} {len(results) - sum(results)}")


def compare_run(work, name, reference, steps, validations=0, sample=False):
    """Run `name` against `reference`, trained from the same model on the same global batch: `steps`
    training and `validations` validation losses, each within TOLERANCE relative, the final parameters
    within TOLERANCE in norm, and (sample=True) the one text sample the same.
    Returns whether it agrees and the words for its ok/FAIL line."""
    ref_losses, my_losses = losses(work, reference), losses(work, name)
    step_error = loss_error(ref_losses, my_losses)
    param_error = parameter_error(parameters(work, name), parameters(work, reference))
    good = len(my_losses) == len(ref_losses) == steps and step_error <= TOLERANCE and param_error <= TOLERANCE
    words = f"losses rel err {step_error:.1e}, final parameters {param_error:.1e}"
    if validations:
        ref_val, my_val = losses(work, reference, "val_loss"), losses(work, name, "val_loss")
        val_error = loss_error(ref_val, my_val)
        good &= len(my_val) == len(ref_val) == validations and val_error <= TOLERANCE
        words += f", validation {val_error:.1e}"
    words += f" ({TOLERANCE_WORDS})"
    if sample:
        ref_text, my_text = events(work, reference, "sample"), events(work, name, "sample")
        same = len(ref_text) == 1 and [e["text"] for e in my_text] == [e["text"] for e in ref_text]
        good &= same
        words += f"; sample {'the same' if same else 'DIFFERS'}"
    return good, words


def memory_against_formula(work, name):
    """The activations and the workspace the run held (its last "memory" event) against llmc/planning/memory.h's
    formulas, which count the same buffers and must match to the byte.
    Returns whether both match, the words for the ok/FAIL line, and the event."""
    memory = events(work, name, "memory")[-1]
    good = (memory["activation_bytes"] == memory["activation_formula_bytes"] and
            memory["workspace_bytes"] == memory["workspace_formula_bytes"])
    words = (f"activations {memory['activation_bytes']} B held, formula {memory['activation_formula_bytes']:.0f}; "
             f"workspace {memory['workspace_bytes']} B, formula {memory['workspace_formula_bytes']:.0f}")
    return good, words, memory


def compare_resumed(work, name, reference, first_step, what):
    """A run resumed from the checkpoint of step first_step against the uninterrupted reference run: every
    step after first_step logged, with its loss within TOLERANCE relative, and the final parameters
    within TOLERANCE in norm. Prints the ok/FAIL line; returns whether it passed."""
    ref = {e["step"]: e["loss"] for e in events(work, reference, "step")}
    mine = {e["step"]: e["loss"] for e in events(work, name, "step")}
    resumed = [s for s in mine if s > first_step]
    step_error = max([abs(mine[s] - ref[s]) / abs(ref[s]) if s in ref else math.inf for s in resumed] or [math.inf])
    param_error = parameter_error(parameters(work, name), parameters(work, reference))
    good = len(resumed) == len(ref) - first_step and step_error <= TOLERANCE and param_error <= TOLERANCE
    return report(good, f"{what}: steps {first_step + 1}..{len(ref)} losses rel err {step_error:.1e}, final "
                        f"parameters {param_error:.1e} ({TOLERANCE_WORDS})")


def compare_continued(work, name, reference, steps, what):
    """One model file trained on for `steps` more steps in a layout (run `name`) and by one rank (run
    `reference`): the losses and the final parameters must agree. Prints the ok/FAIL line; returns whether
    it passed."""
    good, words = compare_run(work, name, reference, steps)
    return report(good, f"{what}, against one rank: {steps} {words}")


def host_call_budget_error(work, name):
    """'' when every rank kept the README's budget of host calls inside train_step in every step after the first
    (which may allocate: first-use buffers, the matmuls' plans): no allocation, no free, and one device-to-host
    copy and one synchronisation (the step's read of its loss and norm), plus one of each per mixture-of-experts
    layer pass (its rows per expert), plus the copies of the offloaded optimizer state (--offload optimizer:
    device-to-host, but never waited for in the step); else what broke it. The run's first step, and steps whose pipeline timeline
    the trainer measured (the last one under pp: they log no counts), are left out; a run with no other step,
    or without counts (a GPU build), breaks it."""
    logged = events(work, name, "step")
    steps = [step for step in logged[1:] if "host_calls" in step]
    if not steps:
        return f"no step with host_calls after the first of {len(logged)}"
    for step in steps:
        calls = step["host_calls"]
        downloads = calls.get("offload_downloads", [0] * len(calls["moe_layer_passes"]))
        for rank, passes in enumerate(calls["moe_layer_passes"]):
            expected = {"allocations": 0, "frees": 0, "d2h_copies": 1 + passes + downloads[rank], "syncs": 1 + passes}
            for kind, budget in expected.items():
                if calls[kind][rank] != budget:
                    return f"step {step['step']}, rank {rank}: {calls[kind][rank]} {kind}, the budget is {budget}"
    return ""


def host_call_summary(work, name):
    """The last counted step's host calls, rank by rank, as "d2h/syncs/event waits (MoE passes)": for the ok line."""
    steps = [step for step in events(work, name, "step") if "host_calls" in step]
    if not steps:
        return "no counts"
    calls = steps[-1]["host_calls"]
    ranks = zip(calls["d2h_copies"], calls["syncs"], calls["event_waits"], calls["moe_layer_passes"])
    return "d2h/syncs/event waits per rank: " + ", ".join(
        f"{d}/{s}/{w}" + (f" ({p} MoE)" if p else "") for d, s, w, p in ranks)
