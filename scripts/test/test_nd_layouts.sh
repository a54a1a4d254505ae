#!/usr/bin/env bash
# Every axis in one program: N-D layouts (data, pipeline, context and tensor parallelism, ZeRO, recompute)
# against one rank on the same model and the same global batch (16 rows of 16 tokens as 2 micro-steps,
# so every layout accumulates gradients; the pipelines' microbatches), 3 steps, with a validation loss and
# a text sample at the end (mpirun, CPU build, FP32). Each layout's losses must agree with the single
# rank's within 1e-5 relative and its final model.bin within 1e-5 relative in norm (the axes change only
# the order of additions; see scripts/test/layout_check.py), and the memory it held must equal llmc/planning/memory.h's
# formula to the byte, and where there is a cp axis, the bytes rank 0 sent on it must equal
# llmc/parallel/context_parallel.h's formula (within 0.1%; scripts/test/layout_check.py's cp_bytes). One more run resumes, in a 4-D layout, from a checkpoint another 3-D layout saved.
#   usage: scripts/test/test_nd_layouts.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
source "$(dirname "$0")/test_lib.sh"
export OMP_NUM_THREADS=1
run_steps=3  # a step after the first (which may allocate) for the budget, and one after the checkpoint of step 2

# 2 layers (pp 2: one each), 4 heads of 16 channels (tp 2 x Ulysses cp 2 would need 4), T = 16 (cp 2
# zigzag: 4 chunks of 4; with tp 2 sequence parallelism: 8 local rows split 2 ways)
# the classics folded into 512 token ids (test_lib.sh's folded_data): the layouts are this suite's subject, and
# GPT-2's 50,257 columns of embedding, LM head, loss and AdamW took most of each run's time
folded_data "$work/data" 512
flags=(--layers 2 --heads 4 --channels 64 --vocab-size 512 --max-seq-len 32 --seq-len 16
       --lr-schedule constant --learning-rate 1e-3 --val-every 3 --val-batches 2 --sample-tokens 8
       --train-data "$work/data/train.bin" --val-data "$work/data/val.bin"
       --tokenizer "$work/data/tokenizer.bin" --total-batch-size 256)
run_layout one 1 8
# name:ranks:B:flags (commas for spaces); B = 8 / data-parallel ranks
layouts="dp2_pp2_tp2_zero1_1f1b:8:4:--pp,2,--tp,2,--zero,1,--pp-schedule,1f1b
         pp2_cp2_tp2_sp_ring_zigzag:8:8:--pp,2,--cp,2,--tp,2,--sequence-parallel,--cp-mode,ring,--cp-split,zigzag
         dp2_cp2_pp2_zero3_gpipe_full:8:4:--cp,2,--pp,2,--zero,3,--pp-schedule,gpipe,--recompute,full
         hsdp2x2_tp2_zero3:8:2:--tp,2,--zero,3,--dp-shard,2
         dp2_pp2_cp2_tp2_zero2_sp:16:4:--pp,2,--cp,2,--tp,2,--zero,2,--sequence-parallel,--recompute,selective"
run_layouts "$layouts"

# a checkpoint saved at step 2 by dp 2 x pp 2 x tp 2 at ZeRO-1, resumed by cp 2 x pp 2 x tp 2 x dp 2 at
# ZeRO-3 under 1f1b: its last step must match the uninterrupted single rank
run_layout saved 8 4 --pp 2 --tp 2 --zero 1 --checkpoint-every 2 --keep-checkpoints 5
mkdir -p "$work/resumed" && cp "$work"/saved/checkpoint_2* "$work/resumed/"
run_layout resumed 16 4 --pp 2 --cp 2 --tp 2 --zero 3 --resume

echo "N-D layouts vs one rank ($binary)"
PYTHONPATH="$(dirname "$0")" /usr/bin/python3 - "$work" $layouts >"$work/compare.out" <<'EOF' || true
import sys
from layout_check import (compare_resumed, compare_run, cp_bytes, cp_bytes_against_formula, memory_against_formula,
                          report, result)
work, layouts = sys.argv[1], [l.split(":") for l in sys.argv[2:]]
results = []
for name, ranks, batch, flags in layouts:
    try:
        same_run, run_words = compare_run(work, name, "one", steps=3, validations=2, sample=True)
        same_memory, memory_words, _ = memory_against_formula(work, name)
        good, words = same_run and same_memory, f"{run_words}; {memory_words}"
        if "--cp" in flags.split(","):  # the model above: 2 layers, 64 channels, T = 16, 2 micro-steps
            theory = cp_bytes(flags.split(","), int(batch), layers=2, channels=64, seq_len=16, micro_steps=2)
            same_bytes, bytes_words = cp_bytes_against_formula(work, name, theory)
            good, words = good and same_bytes, f"{words}; {bytes_words}"
    except Exception as error:  # a run that failed left no log or no model
        good, words = False, f"no result ({error})"
    results.append(report(good, f"{name:28} {ranks:>2} ranks: {words}"))
what = "saved by dp 2 x pp 2 x tp 2 (ZeRO-1), resumed by dp 2 x pp 2 x cp 2 x tp 2 (ZeRO-3)"
try:
    results.append(compare_resumed(work, "resumed", "one", 2, what))
except Exception as error:
    results.append(report(False, f"{what}: no result ({error})"))
result(results)
EOF
grep -v '^RESULT' "$work/compare.out"
add_python_result "$work/compare.out"
finish
