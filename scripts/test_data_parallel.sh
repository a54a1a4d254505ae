#!/usr/bin/env bash
# Data parallelism and ZeRO against one rank: the same model, the same global batch (16 rows of 16 tokens,
# as 2 micro-steps of 8 rows), the same steps, on 2 and 4 ranks with --zero 0, 1, 2 and 3, and hybrid
# sharding 2 x 2 with stages 1, 2 and 3 (mpirun, CPU build, FP32). The losses of every step and the final parameters must agree with the
# single rank's within 1e-5 relative: only the order of the additions in the gradient average differs.
# Also compares the bytes each rank sent per step with the ring algorithms' theory (llmc/zero.h).
#   usage: scripts/test_data_parallel.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "  ok   $*"; }
bad() { failed=$((failed + 1)); echo "  FAIL $*"; }
export OMP_NUM_THREADS=1

flags=(--model custom --layers 2 --heads 2 --channels 32 --vocab-size 50257 --max-seq-len 32 --seq-len 16
       --total-batch-size 256 --steps 5 --lr-schedule constant --learning-rate 1e-3 --val-every 0
       --sample-tokens 0 --train-data "data/classics_train.bin")
run() {  # run NAME RANKS ZERO DP_SHARD: B = 8 / RANKS rows per rank and micro-step
    local name=$1 ranks=$2 zero=$3 shard=$4
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" --batch-size $((8 / ranks)) \
        --zero "$zero" --dp-shard "$shard" --output-dir "$work/$name" >"$work/$name.out" 2>&1 ||
        bad "$name: the run failed: $(grep -m1 error: "$work/$name.out")"
}
run one 1 0 1
layouts="zero0_2:2:0:2 zero0_4:4:0:4 zero1_2:2:1:2 zero1_4:4:1:4 zero2_2:2:2:2 zero2_4:4:2:4 zero3_2:2:3:2
         zero3_4:4:3:4 hsdp1_2x2:4:1:2 hsdp2_2x2:4:2:2 hsdp3_2x2:4:3:2"
for layout in $layouts; do IFS=: read -r name ranks zero shard <<<"$layout"; run "$name" "$ranks" "$zero" "$shard"; done

echo "data parallelism vs one rank ($binary)"
/usr/bin/python3 - "$work" $layouts >"$work/compare.out" <<'EOF' || true
import json, sys
import numpy as np
work, layouts = sys.argv[1], [l.split(":") for l in sys.argv[2:]]
def steps(name):
    lines = [json.loads(l) for l in open(f"{work}/{name}/log.jsonl")]
    return [l for l in lines if l["event"] == "step"]
def parameters(name):
    return np.fromfile(f"{work}/{name}/model.bin", dtype=np.float32, offset=1024)
# the parameter buffer as the program lays it out: chunks padded to a multiple of 8 x shards elements
L, C, Vp, maxT = 2, 32, 50304, 32
chunks = [Vp * C + maxT * C] + [12 * C * C + 13 * C] * L + [2 * C]
def padded_total(shards):
    return sum((c + 8 * shards - 1) // (8 * shards) * (8 * shards) for c in chunks)
one = steps("one")
reference = parameters("one")
bad = 0
for name, ranks, zero, shard in layouts:
    ranks, zero, shard = int(ranks), int(zero), int(shard)
    losses = [s["loss"] for s in steps(name)]
    loss_error = max(abs(a["loss"] - b) / abs(a["loss"]) for a, b in zip(one, losses))
    param_error = float(np.linalg.norm(parameters(name) - reference) / np.linalg.norm(reference))
    sent = steps(name)[-1]["comm_bytes"]
    if zero == 0:   # all-reduce of the whole gradient
        P = padded_total(1)
        theory = 2 * (ranks - 1) / ranks * P * 4
        formula = f"2(N-1)/N x {P} x 4"
    else:
        # reduce-scatter within K (stages 2-3: every micro-step, A = 2), the all-gather of the parameters
        # within K, and the all-reduce of the shard across the M groups. Stage 3 gathers a chunk when a
        # buffer does not hold it: with this 2-layer model both blocks fit the two block buffers, so each
        # chunk is gathered once per step, as at stages 1-2 (a deep model gathers each block twice).
        K, M, A = shard, ranks // shard, (2 if zero >= 2 else 1)
        P = padded_total(K)
        theory = ((A + 1) * (K - 1) / K + 2 * (M - 1) / M / K) * P * 4
        formula = f"(({A}+1)(K-1)/K + 2(M-1)/(MK)) x {P} x 4"
    comm_error = abs(sent - theory) / theory
    ok = len(losses) == len(one) == 5 and loss_error <= 1e-5 and param_error <= 1e-5 and comm_error <= 0.01
    bad += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {name:9} {ranks} ranks, zero {zero}, dp-shard {shard}: losses rel err "
          f"{loss_error:.1e}, final parameters {param_error:.1e} (tol 1e-5); sent {sent} B/step, "
          f"theory {formula} = {theory:.0f} ({100 * comm_error:.3f}%)")
print(f"RESULT {len(layouts) - bad} {bad}")
EOF
grep -v '^RESULT' "$work/compare.out"
read -r _ compared_ok compared_bad < <(grep '^RESULT' "$work/compare.out" || echo "RESULT 0 1")
passed=$((passed + compared_ok))
failed=$((failed + compared_bad))
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
