#!/usr/bin/env bash
# A mixture of experts through the axes it runs on: a Llama block whose MLP is 4 SwiGLU experts (2 per token)
# beside a shared expert, on dp 2 at ZeRO-3, pp 2, selective recomputation, tp 2 (each tp rank routing half the
# sequences through whole experts), tp 2 + SP, dp 2 x tp 2 at ZeRO-2 and pp 2 x tp 2 + SP,
# the tp axis's bytes against its formula (the experts' gradient sums counted); a capacity factor that drops
# assignments, on one rank and on dp 2; a GPT-2 block of 4 GELU experts and no shared one on dp 2 at ZeRO-2;
# and a checkpoint saved by dp 2 x pp 2 resumed by one rank. Expert parallelism (the experts split over ep ranks
# drawn from dp, rows moved by all-to-all): ep 2, ep 4, dp 4 x ep 2, ep 2 x tp 2 (tp bytes against the
# formula), ep 2 x pp 2, full recomputation, ZeRO 1-3, a capacity factor, GPT-2's block, the ep group's bytes
# against the formula where every row goes to every expert, and a checkpoint of dp 4 x ep 2 at ZeRO-1 resumed
# by one rank; the dp axis's bytes against llmc/parallel/zero.h's formula (experts averaged over their own
# replicas, the dense shards over the ep group). Context parallelism (the balance loss's counts summed over each
# sequence's pieces): cp 2 (ring, zigzag pieces), cp 2 Ulysses, ep 2 x cp 2, tp 2 x cp 2 and tp 2 + SP x cp 2
# (contiguous pieces; each tp rank routing a slice of the pieces, whose counts the tp ranks gather first); a
# capacity factor under cp 2, ep 2 x cp 2 and tp 2 x cp 2 (contiguous), where a piece gets what its sequence's
# pieces before it in position order left of each expert's capacity. The schedules that split the
# backward pass (the experts' and the router's weight gradients in W): zb-h1 on pp 2 and ep 2 x pp 2, and zbv
# on the same over 4 layers with a mixture in blocks 1 and 3. A mixture in every 2nd block
# (--moe-every 2: GPT-2's dense block, then the experts): ep 2 x pp 2, ep 2 at ZeRO-3, tp 2 (its bytes against
# the formula), full recomputation and a checkpoint of ep 2 x pp 2 resumed by one rank, against one rank of that
# model. Each against one rank on the
# same global batch (16 rows of 16 tokens as 2 micro-steps), 3 steps, with a validation loss and a text sample
# at the end (mpirun, CPU build, FP32): losses and the final model.bin within 1e-5 relative, activation memory
# equal to llmc/planning/memory.h's formula to the byte, and the routing each run logged (rows per expert per
# layer, dropped assignments, the load-balancing and z-losses) the same as one rank's. The axes a mixture of
# experts does not run on yet are refused with one line.
#   usage: scripts/test/test_moe_layouts.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
run_steps=3  # a step after the first (which may allocate) for the budget, and one after the checkpoint of step 2

# 2 layers (pp 2: one each), 4 experts of 32 SwiGLU hidden units, 2 per token, 1 shared; T = 16; the classics
# folded into 512 token ids (test_lib.sh's folded_data): the experts are this suite's subject, and GPT-2's 50,257
# columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
common=(--layers 2 --heads 4 --channels 64 --vocab-size 512 --max-seq-len 32 --seq-len 16 --lr-schedule constant
        --learning-rate 1e-3 --val-every 3 --val-batches 2 --sample-tokens 8 --train-data "$work/data/train.bin"
        --val-data "$work/data/val.bin" --tokenizer "$work/data/tokenizer.bin" --total-batch-size 256)
experts=(--experts 4 --experts-per-token 2)
flags=("${common[@]}" "${experts[@]}" --arch llama --kv-heads 2 --ffn-hidden 32 --shared-experts 1)
run_layout one 1 8
# name:ranks:B:flags (commas for spaces); B = 8 / data-parallel ranks
layouts="dp2_zero3:2:4:--zero,3
         pp2_1f1b:2:8:--pp,2,--pp-schedule,1f1b
         dp2_selective:2:4:--recompute,selective
         tp2:2:8:--tp,2
         tp2_sp:2:8:--tp,2,--sequence-parallel
         dp2_tp2_zero2:4:4:--tp,2,--zero,2
         pp2_tp2_sp:4:8:--pp,2,--tp,2,--sequence-parallel"
run_layouts "$layouts"
# a capacity of ceil(0.5 x 16 x 2 / 4) = 4 rows per expert and sequence: about half the assignments dropped
run_layout one_capacity 1 8 --capacity-factor 0.5
run_layout dp2_capacity 2 4 --capacity-factor 0.5
# a checkpoint saved at step 2 by dp 2 x pp 2 (ZeRO-1), resumed by one rank
run_layout saved 4 4 --pp 2 --zero 1 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/resumed" && cp "$work"/saved/checkpoint_2* "$work/resumed/"
run_layout resumed 1 8 --resume
# expert parallelism: the experts split over ep ranks of the dp ranks, rows moved by all-to-all
layouts="ep2:2:4:--ep,2
         ep4:4:2:--ep,4
         dp4_ep2:4:2:--ep,2
         ep2_tp2:4:4:--ep,2,--tp,2
         ep2_pp2:4:4:--ep,2,--pp,2
         ep2_full:2:4:--ep,2,--recompute,full
         ep2_zero1:2:4:--ep,2,--zero,1
         ep2_zero3:2:4:--ep,2,--zero,3
         dp4_ep2_zero2:4:2:--ep,2,--zero,2
         cp2:2:8:--cp,2
         cp2_ulysses:2:8:--cp,2,--cp-mode,ulysses
         ep2_cp2:4:4:--ep,2,--cp,2
         tp2_cp2:4:8:--tp,2,--cp,2
         tp2_sp_cp2_contiguous:4:8:--tp,2,--sequence-parallel,--cp,2,--cp-split,contiguous
         pp2_zbh1:2:8:--pp,2,--pp-schedule,zb-h1
         ep2_pp2_zbh1:4:4:--ep,2,--pp,2,--pp-schedule,zb-h1"
run_layouts "$layouts"
run_layout ep2_capacity 2 4 --ep 2 --capacity-factor 0.5
# the capacity under cp: zigzag pieces of 4 positions (a sequence's pieces 0 and 3 on rank 0, 1 and 2 on rank 1),
# and contiguous halves under tp 2, each tp rank routing half of its cp rank's pieces
layouts="cp2_capacity:2:8:--cp,2,--capacity-factor,0.5
         ep2_cp2_capacity:4:4:--ep,2,--cp,2,--capacity-factor,0.5
         tp2_cp2_contiguous_capacity:4:8:--tp,2,--cp,2,--cp-split,contiguous,--capacity-factor,0.5"
run_layouts "$layouts"
# a checkpoint saved at step 2 by dp 4 x ep 2 at ZeRO-1 (2 expert groups x 2 shards: 4 files), resumed by one rank
run_layout ep_saved 4 2 --ep 2 --zero 1 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/ep_resumed" && cp "$work"/ep_saved/checkpoint_2* "$work/ep_resumed/"
run_layout ep_resumed 1 8 --resume
# GPT-2's block: 4 GELU experts, 2 per token, no shared expert
flags=("${common[@]}" "${experts[@]}")
run_layout gpt2_one 1 8
run_layout gpt2_dp2_zero2 2 4 --zero 2
run_layout gpt2_ep2 2 4 --ep 2
# a mixture in every 2nd block (block 0 GPT-2's dense MLP with its biases, block 1 the experts, no shared one:
# the blocks' chunks and MLP widths differ): pp 2 puts the experts on one stage only
flags=("${common[@]}" "${experts[@]}" --moe-every 2)
run_layout every2_one 1 8
layouts="every2_ep2_pp2:4:4:--ep,2,--pp,2
         every2_ep2_zero3:2:4:--ep,2,--zero,3
         every2_tp2:2:8:--tp,2
         every2_dp2_full:2:4:--recompute,full"
run_layouts "$layouts"
# its checkpoint, saved at step 2 by ep 2 x pp 2 at ZeRO-1 (chunks of two sizes), resumed by one rank
run_layout every2_saved 4 4 --ep 2 --pp 2 --zero 1 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/every2_resumed" && cp "$work"/every2_saved/checkpoint_2* "$work/every2_resumed/"
run_layout every2_resumed 1 8 --resume
# zbv's V needs 2 pp stages per rank: 4 layers, a mixture in blocks 1 and 3 (Llama's block, the shared expert),
# so each rank runs one dense stage and one with experts; B 4 (2 on dp 2): the 4 microbatches zbv needs (>= 2 pp - 1),
# and one rank at B 4 too, so that the validation batches hold the same 4 rows
four_layers=("${common[@]}")
four_layers[1]=4  # common's first flag is --layers
flags=("${four_layers[@]}" "${experts[@]}" --arch llama --kv-heads 2 --ffn-hidden 32 --shared-experts 1 --moe-every 2)
run_layout zbv_one 1 4
run_layouts "pp2_zbv:2:4:--pp,2,--pp-schedule,zbv ep2_pp2_zbv:4:2:--ep,2,--pp,2,--pp-schedule,zbv"
# every row to every expert (K = E = 4), which fixes the all-to-all's blocks: its bytes against the formula
flags=("${common[@]}" --experts 4 --experts-per-token 4)
run_layout all_experts_one 1 8
run_layout all_experts_ep2 2 4 --ep 2

echo "mixture-of-experts layouts vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import compare_resumed, compare_run, events, memory_against_formula, report, result
work = sys.argv[1]


def routing(name):
    """The routing a run logged at each step: rows per (layer, expert), dropped, and the two losses."""
    return [(e["tokens"], e["dropped"], e["aux_loss"], e["z_loss"]) for e in events(work, name, "experts")]


def same_routing(name, reference):
    """Every step's rows per expert and drops equal to the reference's, the losses within 1e-5 relative (FP32:
    the same routing, the losses summed in another order over ranks)."""
    mine, ref = routing(name), routing(reference)
    if len(mine) != len(ref) or not ref:
        return False, f"routing logged for {len(mine)} steps, reference {len(ref)}"
    counts = all(m[0] == r[0] and m[1] == r[1] for m, r in zip(mine, ref))
    loss_error = max(abs(m[i] - r[i]) / abs(r[i]) for m, r in zip(mine, ref) for i in (2, 3))
    words = (f"routing {'the same' if counts else 'DIFFERS'} ({sum(map(sum, ref[0][0]))} rows, {ref[0][1]} dropped "
             f"at step 1), aux/z losses {loss_error:.1e}")
    return counts and loss_error <= 1e-5, words


L, C, NH, KV, He, E, T, A, s = 2, 64, 4, 2, 32, 4, 16, 2, 4
Q = (NH + 2 * KV) * (C // NH)


def tp_bytes(tp, sp, batch, zero, ep=1, expert_columns=3 * He, mixtures=L):
    """llmc/parallel/tensor_parallel.h's tp_bytes_per_step for this model: f and g around the blocks (the shared
    expert's MLP among them), the vocabulary-parallel embedding and loss, under SP the RMSNorm weights'
    gradient sums, and the router's and experts' gradient sums (E C (1 + (fc + He)/ep) per mixture block, fc + He
    = 2He + He for SwiGLU: a rank holds E/ep experts), once per step (per micro-step at ZeRO 2-3)."""
    N, share = batch * T, (tp - 1) / tp
    loss = 2 * share * 3 * N * 4
    reductions = A if zero >= 2 else 1
    experts = 2 * share * E * C * (1 + expert_columns / ep) * mixtures * s * reductions
    if not sp:
        return A * ((8 * L + 4) * share * N * C * s + loss) + experts
    return A * ((10 * L + 5) * share * N * C * s + loss) + 2 * share * C * (2 * L + 1) * s + experts


runs = [(name, "one") for name in ("dp2_zero3", "pp2_1f1b", "dp2_selective", "tp2", "tp2_sp", "dp2_tp2_zero2",
                                   "pp2_tp2_sp")]
runs += [(name, "one") for name in ("ep2", "ep4", "dp4_ep2", "ep2_tp2", "ep2_pp2", "ep2_full", "ep2_zero1", "ep2_zero3",
                                    "dp4_ep2_zero2", "cp2", "cp2_ulysses", "ep2_cp2")]
runs += [(name, "one_capacity") for name in ("dp2_capacity", "ep2_capacity", "cp2_capacity", "ep2_cp2_capacity",
                                             "tp2_cp2_contiguous_capacity")]
runs += [("gpt2_dp2_zero2", "gpt2_one"),
         ("gpt2_ep2", "gpt2_one"), ("all_experts_ep2", "all_experts_one")]
runs += [(name, "every2_one") for name in ("every2_ep2_pp2", "every2_ep2_zero3", "every2_tp2", "every2_dp2_full")]
runs += [("tp2_cp2", "one"), ("tp2_sp_cp2_contiguous", "one"), ("pp2_zbh1", "one"), ("ep2_pp2_zbh1", "one"), ("pp2_zbv", "zbv_one"), ("ep2_pp2_zbv", "zbv_one")]


def ep_bytes(ep, batch, K, E=4, micro_steps=2, layers=2):
    """llmc/parallel/expert_parallel.h's bytes per layer and pass with every row going to every expert: each
    forward pass gathers the counts ((ep-1) E 4 bytes), then forward and backward each dispatch and combine
    (ep-1)/ep of a rank's N K rows of C fp32 values; plus the gradient norm's all-reduce of one fp32 over the
    ep group (2 (ep-1)/ep 4 bytes, once per step)."""
    N = batch * T
    per_layer = (ep - 1) * E * 4 + 4 * (ep - 1) / ep * N * K * C * s
    return micro_steps * layers * per_layer + int(2 * (ep - 1) / ep * 4)
def parameter_chunks(llama, G, shards, every=1):
    """(padded size, expert tail) of each chunk of this model's parameter buffer (llmc/model/parameters.h): the
    embeddings, L blocks whose tails from expertfcw on are the rank's E/G experts (padding included), the final
    chunk; each padded to a multiple of 128 x shards elements. With a mixture every `every` blocks, the others
    are GPT-2's dense block (12 C^2 + 13 C, no experts)."""
    Vp, maxT, multiple = 512, 32, 128 * shards
    pad = lambda n: -(-n // multiple) * multiple
    if llama:  # RMSNorm weights, GQA qkv, the shared SwiGLU expert (2 x 32 rows, then 32 columns), the router
        dense, experts = C + (NH + 2 * KV) * (C // NH) * C + C * C + C + 2 * He * C + C * He + E * C, E * 3 * He * C
        embedding, final = Vp * C, C + Vp * C
    else:      # layernorms with biases, qkv and its bias, the projection's bias; 4C-wide GELU experts, no shared
        dense, experts = 4 * C + 3 * C * C + 3 * C + C * C + C + E * C, E * 2 * 4 * C * C
        embedding, final = Vp * C + maxT * C, 2 * C
    mixture = (pad(dense + experts // G), pad(dense + experts // G) - dense)
    blocks = [mixture if (l + 1) % every == 0 else (pad(12 * C * C + 13 * C), 0) for l in range(L)]
    return [(pad(embedding), 0)] + blocks + [(pad(final), 0)]


def dp_bytes(llama, zero, D, G, A=2, every=1):
    """llmc/parallel/zero.h's bytes per step for these chunks, with experts over ep G (1: none) of D dp ranks, as
    rank 0 sends them: stage 0, the dense part all-reduced over D and the experts over their R = D/G replicas;
    stages 1-3, the ZeRO stage's over the N = R shard ranks (stage 3 gathers each of this model's few chunks once
    per step, as stages 1-2 do), plus the dense part of shard 0 of each chunk all-reduced over the ep group."""
    R = D // G
    chunks = parameter_chunks(llama, G, 1 if zero == 0 else R, every)
    P, P_e = sum(size for size, _ in chunks), sum(tail for _, tail in chunks)
    if zero == 0:
        return 2 * (D - 1) / D * (P - P_e) * s + 2 * (R - 1) / R * P_e * s
    N = R
    zero_part = (2 if zero == 1 else A + 1) * (N - 1) / N * P * s
    dense_of_shard_0 = sum(min(size // N, size - tail) for size, tail in chunks)
    return zero_part + 2 * (G - 1) / G * dense_of_shard_0 * s


# the dp axis's bytes (all the run sent, less the other axes') against zero.h's formula: (llama, zero, D, G)
dp_layouts = {"dp2_zero3": (True, 3, 2, 1), "dp2_selective": (True, 0, 2, 1), "ep2": (True, 0, 2, 2),
              "ep4": (True, 0, 4, 4), "dp4_ep2": (True, 0, 4, 2), "ep2_full": (True, 0, 2, 2),
              "ep2_zero1": (True, 1, 2, 2), "ep2_zero3": (True, 3, 2, 2),
              "dp4_ep2_zero2": (True, 2, 4, 2), "dp2_capacity": (True, 0, 2, 1), "ep2_capacity": (True, 0, 2, 2),
              "gpt2_dp2_zero2": (False, 2, 2, 1), "gpt2_ep2": (False, 0, 2, 2),
              "every2_ep2_zero3": (False, 3, 2, 2, 2, 2), "every2_dp2_full": (False, 0, 2, 1, 2, 2)}
results = []
for name, reference in runs:
    try:
        same_run, run_words = compare_run(work, name, reference, steps=3, validations=2, sample=True)
        same_memory, memory_words, _ = memory_against_formula(work, name)
        routed, routing_words = same_routing(name, reference)
        good, words = same_run and same_memory and routed, f"{run_words}; {routing_words}; {memory_words}"
        if name in ("tp2", "tp2_sp", "dp2_tp2_zero2", "ep2_tp2", "every2_tp2"):  # the tp axis against the formula
            batch, zero = (4, 2) if name == "dp2_tp2_zero2" else (4, 0) if name == "ep2_tp2" else (8, 0)
            every = dict(expert_columns=2 * 4 * C, mixtures=1) if name == "every2_tp2" else {}  # GELU, block 1
            theory = tp_bytes(2, name == "tp2_sp", batch, zero, ep=2 if name == "ep2_tp2" else 1, **every)
            sent = events(work, name, "step")[-1]["tp_comm_bytes"]
            error = abs(sent - theory) / theory
            good, words = good and error <= 1e-3, f"{words}; tp axis sent {sent} B/step, formula {theory:.0f} ({100 * error:.4f}%)"
        if name in dp_layouts:  # the dp axis (within 1%: the loss's and the norm's one-float reductions are left out)
            step = events(work, name, "step")[-1]
            sent = step["comm_bytes"] - step["tp_comm_bytes"] - step["pp_comm_bytes"] - step["cp_comm_bytes"] - \
                step["ep_comm_bytes"]
            theory = dp_bytes(*dp_layouts[name])
            error = abs(sent - theory) / theory
            good, words = good and error <= 0.01, f"{words}; dp axis sent {sent} B/step, formula {theory:.0f} ({100 * error:.3f}%)"
        if name == "all_experts_ep2":  # the ep axis: the routed rows' all-to-alls, exact
            theory, sent = ep_bytes(2, 4, 4), events(work, name, "step")[-1]["ep_comm_bytes"]
            good, words = good and sent == theory, f"{words}; ep axis sent {sent} B/step, formula {theory:.0f}"
    except Exception as error:  # a run that failed left no log or no model
        good, words = False, f"no result ({error})"
    results.append(report(good, f"{name:16} vs {reference}: {words}"))
drops = routing("one_capacity")
results.append(report(bool(drops) and all(step[1] > 0 for step in drops),
                      f"the capacity factor dropped assignments at every step: {[step[1] for step in drops]}"))
rows = [sum(map(sum, step[0])) for step in routing("one")]  # dropless: every row to K = 2 experts in L = 2 layers
results.append(report(rows == [256 * 2 * 2] * 3, f"one rank, dropless: the experts ran 2 x 2 x 256 rows a step: {rows}"))
for resumed, reference, what in (("resumed", "one", "saved by dp 2 x pp 2 (ZeRO-1), resumed by one rank"),
                                 ("ep_resumed", "one", "saved by dp 4 x ep 2 (ZeRO-1), resumed by one rank"),
                                 ("every2_resumed", "every2_one",
                                  "a mixture every 2nd block, saved by ep 2 x pp 2 (ZeRO-1), resumed by one rank")):
    try:
        results.append(compare_resumed(work, resumed, reference, 2, what))
    except Exception as error:
        results.append(report(False, f"{what}: no result ({error})"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"
add_python_result "$work/compare.out"

# the axes a mixture of experts does not run on yet: one line each
refused_flags=("${common[@]}" --model custom --steps 1)
expect_refused "tp 2, B 3" "each tp rank routes whole sequences through the experts" 2 "${experts[@]}" --tp 2 \
    --batch-size 3
refused_flags+=(--batch-size 4)
expect_refused "shared experts without experts" "--shared-experts and --moe-every shape a mixture of experts" 1 \
    --shared-experts 1
expect_refused "a mixture every 3 of 2 blocks" "the mixture every N blocks needs 1 <= N <= layers" 1 "${experts[@]}" \
    --moe-every 3
expect_refused "more experts per token than experts" "a token goes to 1 .. min(16, experts)" 1 --experts 2 \
    --experts-per-token 3
expect_refused "ep without experts" "--ep 2 needs a mixture of experts" 2 --ep 2
expect_refused "ep not dividing dp" "--ep 2 does not divide the 1 data-parallel ranks" 2 "${experts[@]}" --ep 2 --tp 2
expect_refused "ep not dividing the experts" "--ep 4 does not divide the 6 experts" 4 --experts 6 --ep 4
expect_refused "ep with HSDP" "expert parallelism shards the optimizer state over the ranks holding the same experts" \
    4 "${experts[@]}" --ep 2 --zero 1 --dp-shard 2
finish
