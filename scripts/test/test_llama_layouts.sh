#!/usr/bin/env bash
# Llama 3 through every axis: a grouped-query model (4 query heads sharing 2 K/V heads, SwiGLU, RMSNorm, RoPE,
# an untied head) on tp 2, tp 2 + sequence parallelism, cp 2 ring and Ulysses, pp 2 (1f1b, and zb-h1, whose W
# adds the untied head's gradient, at ZeRO-2), dp 2 at ZeRO-3, recompute, and one 8-rank 3-axis layout, each against one rank on the same global batch (16 rows of 16 tokens as 2
# micro-steps), 3 steps, with a validation loss and a text sample at the end (mpirun, CPU build, FP32). As for
# GPT-2 (scripts/test/test_nd_layouts.sh): losses and the final model.bin within 1e-5 relative, activation
# memory equal to llmc/planning/memory.h's formula to the byte, and the bytes rank 0 sent per step on each
# axis equal to the axis's formula, which counts K/V heads apart from query heads: the cp ring carries K/V
# blocks of the 2 K/V heads only, half of what 4 would carry. A checkpoint saved by tp 2 x pp 2 is resumed by
# dp 2 x cp 2, and the single rank's model.bin (a Llama model file) is loaded and trained on by cp 2 x tp 2. Sampling with the key/value cache gives the text the whole-sequence passes give, token for
# token, on one rank and under tp + sp, cp and pp.
#   usage: scripts/test/test_llama_layouts.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
run_steps=3  # a step after the first (which may allocate) for the budget, and one after the checkpoint of step 2

# 2 layers (pp 2: one each), 4 query heads of 16 channels over 2 K/V heads (tp 2: 2 and 1 per rank; Ulysses cp 2:
# 1 K/V head per rank), 96 hidden units (tp 2: 48, a multiple of 8), T = 16 (cp 2 zigzag: 4 chunks of 4)
# the classics folded into 512 token ids (test_lib.sh's folded_data): the layouts are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--arch llama --layers 2 --heads 4 --kv-heads 2 --channels 64 --ffn-hidden 96 --vocab-size 512
       --max-seq-len 32 --seq-len 16 --lr-schedule constant --learning-rate 1e-3 --val-every 3 --val-batches 2
       --sample-tokens 8 --train-data "$work/data/train.bin" --val-data "$work/data/val.bin"
       --tokenizer "$work/data/tokenizer.bin" --total-batch-size 256)
run_layout one 1 8
# name:ranks:B:flags (commas for spaces); B = 8 / data-parallel ranks
layouts="tp2:2:8:--tp,2
         tp2_sp:2:8:--tp,2,--sequence-parallel
         cp2_ring:2:8:--cp,2,--cp-mode,ring
         cp2_ulysses:2:8:--cp,2,--cp-mode,ulysses
         pp2_1f1b:2:8:--pp,2,--pp-schedule,1f1b
         pp2_zbh1_dp2_zero2:4:4:--pp,2,--pp-schedule,zb-h1,--zero,2
         dp2_zero3:2:4:--zero,3
         dp2_selective:2:4:--recompute,selective
         pp2_cp2_tp2_sp:8:8:--pp,2,--cp,2,--tp,2,--sequence-parallel"
run_layouts "$layouts"

# a checkpoint saved at step 2 by tp 2 x pp 2, resumed by dp 2 x cp 2 (ZeRO-1)
run_layout saved 4 8 --tp 2 --pp 2 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/resumed" && cp "$work"/saved/checkpoint_2* "$work/resumed/"
run_layout resumed 4 4 --cp 2 --zero 1 --resume

# the single rank's model.bin (the Llama model file) loaded and trained on: by one rank, and by cp 2 x tp 2
run_layout from_file_one 1 8 --model "$work/one/model.bin" --steps 2
run_layout from_file_cp2_tp2 4 8 --model "$work/one/model.bin" --steps 2 --cp 2 --tp 2

# sampling without the cache: the same text as with it (every run above sampled with it)
samples="one:1:8: tp2_sp:2:8:--tp,2,--sequence-parallel cp2_ring:2:8:--cp,2 pp2_1f1b:2:8:--pp,2"
for sample in $samples; do
    IFS=: read -r name ranks batch layout_flags <<<"$sample"
    run_layout "${name}_uncached" "$ranks" "$batch" ${layout_flags//,/ } --sample-cache false
done

echo "Llama 3 layouts vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" "$samples" $layouts >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import (compare_continued, compare_resumed, compare_run, cp_bytes, cp_bytes_against_formula,
                          events, memory_against_formula, pp_bytes, report, result)
work, samples, layouts = sys.argv[1], sys.argv[2].split(), [l.split(":") for l in sys.argv[3:]]
L, C, NH, KV, H, Vp, T, A, s = 2, 64, 4, 2, 96, 512, 16, 2, 4
HS = C // NH
Q = (NH + 2 * KV) * HS                      # the qkv projection's output columns


def tp_bytes(tp, sp, batch):
    """llmc/parallel/tensor_parallel.h's tp_bytes_per_step: f and g around the blocks and the vocabulary-parallel
    embedding and loss; under SP the norms' weight gradients are summed too (one weight per RMSNorm: C each)."""
    N, share = batch * T, (tp - 1) / tp
    loss = 2 * share * 3 * N * 4
    if not sp:
        return A * ((8 * L + 4) * share * N * C * s + loss)
    return A * ((10 * L + 5) * share * N * C * s + loss) + 2 * share * C * (2 * L + 1) * s


def padded(count, shards):
    multiple = 128 * shards                 # llmc/model/parameters.h's chunk padding
    return -(-count // multiple) * multiple


def dp_zero3_bytes(K):
    """llmc/parallel/zero.h at ZeRO-3 over K ranks, this 2-layer model (both blocks stay in the two block buffers,
    so each chunk is gathered once per step): a reduce-scatter per micro-step and the gather, (A + 1)(K-1)/K P s,
    P the chunks padded for K shards: wte; per block ln1w, qkvw, attprojw, ln2w, fcw (gate and up), fcprojw;
    lnfw and the untied lmhead."""
    block = C + Q * C + C * C + C + 2 * H * C + H * C
    P = padded(Vp * C, K) + L * padded(block, K) + padded(C + Vp * C, K)
    return (A + 1) * (K - 1) / K * P * s


results = []
for name, ranks, batch, flags in layouts:
    flags = flags.split(",")
    try:
        same_run, run_words = compare_run(work, name, "one", steps=3, validations=2, sample=True)
        same_memory, memory_words, _ = memory_against_formula(work, name)
        good, words = same_run and same_memory, f"{run_words}; {memory_words}"
        step = events(work, name, "step")[-1]
        checks = []
        if "--cp" in flags:  # the K/V heads' columns, Ckv = KV HS, not the query heads' C
            theory = cp_bytes(flags, int(batch), layers=L, channels=C, seq_len=T, micro_steps=A, kv_channels=KV * HS)
            checks.append(cp_bytes_against_formula(work, name, theory))
        if "--tp" in flags and "--pp" not in flags and "--cp" not in flags:
            tp = int(flags[flags.index("--tp") + 1])
            theory, sent = tp_bytes(tp, "--sequence-parallel" in flags, int(batch)), step["tp_comm_bytes"]
            error = abs(sent - theory) / theory
            checks.append((error <= 1e-3, f"tp axis sent {sent} B/step, formula {theory:.0f} ({100 * error:.4f}%)"))
        if "--zero" in flags and "--pp" not in flags:  # (the loss's and the norm's all-reduces add a few bytes: 1%)
            theory, sent = dp_zero3_bytes(int(ranks)), step["comm_bytes"]
            error = abs(sent - theory) / theory
            checks.append((error <= 1e-2, f"dp sent {sent} B/step, formula {theory:.0f} ({100 * error:.4f}%)"))
        if flags[:2] == ["--pp", "2"] and len(flags) == 4:  # rank 0's activations to stage 1, no tied embedding
            theory = pp_bytes("1f1b", 2, 1, A, int(batch), T, C, 32, Vp, tied_head=False)
            sent = step["pp_comm_bytes"]
            checks.append((sent == theory, f"pp axis sent {sent} B/step, formula {theory}"))
        for same, check_words in checks:
            good, words = good and same, f"{words}; {check_words}"
    except Exception as error:  # a run that failed left no log or no model
        good, words = False, f"no result ({error})"
    results.append(report(good, f"{name:16} {ranks} ranks: {words}"))
what = "saved by tp 2 x pp 2, resumed by dp 2 x cp 2 (ZeRO-1)"
try:
    results.append(compare_resumed(work, "resumed", "one", 2, what))
except Exception as error:
    results.append(report(False, f"{what}: no result ({error})"))
results.append(compare_continued(work, "from_file_cp2_tp2", "from_file_one", 2,
                                 "model.bin of one rank (a Llama model file) loaded by cp 2 x tp 2"))
for sample in samples:
    name = sample.split(":")[0]
    cached = [e["text"] for e in events(work, name, "sample")]
    whole = [e["text"] for e in events(work, f"{name}_uncached", "sample")]
    results.append(report(len(cached) == 1 and cached == whole,
                          f"{name}: the sample with the key/value cache {'equals' if cached == whole else 'DIFFERS from'} "
                          f"the whole-sequence passes' ({cached} / {whole})"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"
add_python_result "$work/compare.out"
finish
