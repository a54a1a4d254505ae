#!/usr/bin/env bash
# Data parallelism against one rank: the same model, the same global batch (16 rows of 16 tokens, as 2
# micro-steps of 8 rows), the same steps, on 1, 2 and 4 ranks (mpirun, CPU build, FP32). The losses of every
# step and the final parameters must agree within 1e-5 relative: only the order of the additions in the
# gradient average differs. Also compares the bytes each rank sent per step with the ring all-reduce's
# 2 (N-1)/N x (parameter bytes).
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
run() {  # run RANKS: B = 8 / RANKS rows per rank and micro-step
    local ranks=$1
    mpirun --oversubscribe --allow-run-as-root -np "$ranks" "$binary" "${flags[@]}" --batch-size $((8 / ranks)) \
        --output-dir "$work/ranks$ranks" >"$work/ranks$ranks.out" 2>&1 || bad "$ranks ranks: the run failed"
}
for ranks in 1 2 4; do run $ranks; done

echo "data parallelism vs one rank ($binary)"
/usr/bin/python3 - "$work" >"$work/compare.out" <<'EOF' || true
import json, sys
import numpy as np
work = sys.argv[1]
def steps(ranks):
    lines = [json.loads(l) for l in open(f"{work}/ranks{ranks}/log.jsonl")]
    return [l for l in lines if l["event"] == "step"]
def parameters(ranks):
    return np.fromfile(f"{work}/ranks{ranks}/model.bin", dtype=np.float32, offset=1024)
one = steps(1)
reference = parameters(1)
num_parameters = reference.size
bad = 0
for ranks in (2, 4):
    losses = [s["loss"] for s in steps(ranks)]
    loss_error = max(abs(a["loss"] - b) / abs(a["loss"]) for a, b in zip(one, losses))
    params = parameters(ranks)
    param_error = float(np.linalg.norm(params - reference) / np.linalg.norm(reference))
    sent = steps(ranks)[-1]["comm_bytes"]
    theory = 2 * (ranks - 1) / ranks * num_parameters * 4
    comm_error = abs(sent - theory) / theory
    ok = len(losses) == len(one) == 5 and loss_error <= 1e-5 and param_error <= 1e-5 and comm_error <= 0.01
    bad += not ok
    print(f"  {'ok  ' if ok else 'FAIL'} {ranks} ranks x {8 // ranks} rows: 5 losses worst rel err {loss_error:.2e}, "
          f"final parameters rel err (norm) {param_error:.2e} (tol 1e-5); sent {sent} bytes per step, "
          f"theory 2(N-1)/N x {num_parameters} x 4 = {theory:.0f} ({100 * comm_error:.3f}%)")
print(f"RESULT {2 - bad} {bad}")
EOF
grep -v '^RESULT' "$work/compare.out"
read -r _ compared_ok compared_bad < <(grep '^RESULT' "$work/compare.out" || echo "RESULT 0 1")
passed=$((passed + compared_ok))
failed=$((failed + compared_bad))
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
