#!/usr/bin/env bash
# Runs every test suite that `make test` built and adds up their closing lines into one:
#   N passed, M failed
# Each CPU suite of kernels runs in both lane orders (LLMC_CPU_REVERSE_LANES=0/1): a race between
# threads shows up as a difference between the two. GPU suites run only when a GPU answers.
set -u
cd "$(dirname "$0")/../.."

# Two OS threads run blocks; passive waiting keeps idle OpenMP threads from stealing the other core.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=PASSIVE
# OpenBLAS 0.3.21 does not recognise newer Intel cores and falls back to a slow kernel; name the core
# type when the CPU has AVX-512 (on a CPU without it that kernel would crash).
if grep -q avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi

# The GPU programs' build (make test passes it as LLMC_GPU_BUILD): in the background at the lowest priority, in a
# session of its own (stopped with the script), so that nvcc takes the time the CPU suites leave idle; the suites
# that need its output wait for it below.
gpu_build_pid=
if [[ -n ${LLMC_GPU_BUILD:-} ]]; then
    gpu_build_log=$(mktemp)
    setsid nice -n 19 bash -c "$LLMC_GPU_BUILD" >"$gpu_build_log" 2>&1 </dev/null &
    gpu_build_pid=$!
    trap '[[ -n $gpu_build_pid ]] && kill -- -"$gpu_build_pid" 2>/dev/null' EXIT
fi

total_passed=0 total_failed=0 broken=()
run_suite() {  # run_suite NAME COMMAND...
    local name=$1
    shift
    echo "=== $name"
    local log start=$SECONDS
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    local status=${PIPESTATUS[0]}
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    rm -f "$log"
    if [[ -z "$line" ]]; then
        echo "--- $name: exited $status without a result line"
        broken+=("$name")
        total_failed=$((total_failed + 1))
        return
    fi
    local passed failed
    passed=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    failed=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    if [[ $status -ne 0 && $failed -eq 0 ]]; then failed=1; fi
    [[ $failed -ne 0 ]] && broken+=("$name")
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    echo "--- $name: $passed passed, $failed failed ($((SECONDS - start)) s)"
}

run_suite "bf16 stand-in vs CUDA toolkit" build/test_bf16
run_suite "CPU execution layer" build/test_cpu_layer
run_suite "CPU execution layer, reverse lane order" env LLMC_CPU_REVERSE_LANES=1 build/test_cpu_layer
run_suite "CPU execution layer, ASan+UBSan" build/test_cpu_layer_asan
# the named models' family (every kernel at every named model's widths, under two GPUs' limits) runs in the
# forward lane order of each precision and under the sanitizers; the reverse-lane runs check the same kernels
# at the other families' shapes
run_suite "kernel lab, CPU, BF16" ./kernel_lab_cpu
run_suite "kernel lab, CPU, BF16, reverse lane order" env LLMC_CPU_REVERSE_LANES=1 ./kernel_lab_cpu --skip models
run_suite "kernel lab, CPU, FP32" ./kernel_lab_fp32_cpu
run_suite "kernel lab, CPU, FP32, reverse lane order" env LLMC_CPU_REVERSE_LANES=1 ./kernel_lab_fp32_cpu --skip models
run_suite "kernel lab, CPU, BF16, ASan+UBSan" ./kernel_lab_cpu_asan
run_suite "checkpoints, schedules, logger, MFU" build/test_host
run_suite "flags: the parser, and train_gpt's --help against it" build/test_flags
run_suite "the house's rules: options.h's includes, file names, the pipeline's files, MoE's parameters" \
    bash scripts/test/test_structure.sh
run_suite "pipeline schedules: every layout simulated, bubbles and memory vs formulas" build/test_pipeline
run_suite "data loader and tokenizer file" build/test_data
run_suite "readers of untrusted input: fuzzer-found and malformed files, flags (dev/fuzz/)" build/test_fuzz_regressions
run_suite "memory accounting and the ZeRO memory plan" build/test_memory
run_suite "parameter layouts: operand alignment, a pipeline or ep rank's chunks" build/test_parameter_layout
run_suite "planner: Llama 3 405B's layouts fit, recompute auto against an exhaustive search, --plan-search" build/test_planner
run_suite "cost model by hand: the plan's terms and the prices per call, under a hand-written profile" build/test_cost_model
run_suite "machine profile: the format and its refusals, alpha-beta costs, tiers, shape tables" build/test_machine
# one process per rank, more ranks than cores; mpirun refuses root unless told
mpi_run=(env OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS)
for ranks in 1 2 4 8; do
    run_suite "communication layer and mesh, CPU, $ranks MPI rank(s)" "${mpi_run[@]}" -np $ranks build/test_comm
done
run_suite "calibration: calibrate.sh --quick writes a profile (every key, fits, plausible rates) that --plan reads, CPU, FP32" \
    bash scripts/test/test_calibrate.sh ./train_gpt_fp32_cpu
run_suite "backward split into B and W vs the fused pass, CPU, FP32, 1 rank" build/test_weight_split
for layout in "--tp 2" "--tp 2 --sequence-parallel 1" "--cp 2" ""; do
    run_suite "backward split into B and W vs the fused pass, 2 MPI ranks ${layout:-(dp 2)}" \
        "${mpi_run[@]}" -np 2 build/test_weight_split $layout
done
run_suite "GPT-2 BPE encoder vs the npm package's" /usr/bin/python3 data/test_tokenizer.py
run_suite "PyTorch references (GPT-2, Llama 3) self-check" /usr/bin/python3 dev/test/model_reference.py --self-check
reference_models="small 124M llama_small llama_100M moe_small llama_moe_small llama_moe_capacity moe_every"
model_name() {  # the suite's words for a reference preset
    case $1 in
        moe_small) echo "GPT-2 small with experts" ;;
        llama_moe_small) echo "Llama 3 small with experts" ;;
        llama_moe_capacity) echo "Llama 3 small with experts, capacity factor 0.5" ;;
        moe_every) echo "GPT-2 small (3 blocks) with experts in every 2nd block" ;;
        llama_*) echo "Llama 3 ${1#llama_}" ;;
        *) echo "GPT-2 $1" ;;
    esac
}
for size in $reference_models; do
    reference=(--model build/ref/${size}_model.bin --state build/ref/${size}_state.bin)
    model=$(model_name "$size")
    run_suite "$model vs PyTorch, CPU, FP32" ./test_gpt_fp32_cpu "${reference[@]}"
    run_suite "$model vs PyTorch, CPU, BF16" ./test_gpt_cpu "${reference[@]}"
done
run_suite "training program: bad input and resume, CPU, FP32" bash scripts/test/test_train.sh ./train_gpt_fp32_cpu
run_suite "training program: bad input and resume, CPU, BF16" bash scripts/test/test_train.sh ./train_gpt_cpu
run_suite "data parallelism vs one rank, CPU, FP32 (and ZeRO stages in BF16)" \
    bash scripts/test/test_data_parallel.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
run_suite "tensor and sequence parallelism vs one rank, CPU, FP32 (and BF16)" \
    bash scripts/test/test_tensor_parallel.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
run_suite "pipeline parallelism vs one rank, CPU, FP32" bash scripts/test/test_pipeline.sh ./train_gpt_fp32_cpu
run_suite "memory timeline: --trace's counters by category, rank 0's peak equal to the memory report's, CPU, FP32" \
    bash scripts/test/test_memory_timeline.sh ./train_gpt_fp32_cpu
run_suite "gradient noise scale: estimator vs brute force, layouts, resume, refusals, CPU, FP32" \
    bash scripts/test/test_noise_scale.sh ./train_gpt_fp32_cpu
run_suite "pipeline stages of any size and zero-bubble schedules vs one rank, CPU, FP32" \
    bash scripts/test/test_pipeline_stages.sh ./train_gpt_fp32_cpu
run_suite "a batch ramp on dp, ZeRO, pp and tp vs one rank, resumed across a threshold, CPU, FP32" \
    bash scripts/test/test_batch_ramp.sh ./train_gpt_fp32_cpu
run_suite "context parallelism (ring, Ulysses) vs one rank, CPU, FP32 (and BF16)" \
    bash scripts/test/test_context_parallel.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
run_suite "N-D layouts (dp, pp, cp, tp, ZeRO, recompute) vs one rank, CPU, FP32" \
    bash scripts/test/test_nd_layouts.sh ./train_gpt_fp32_cpu
run_suite "Llama 3 (grouped-query attention) through every axis vs one rank, CPU, FP32" \
    bash scripts/test/test_llama_layouts.sh ./train_gpt_fp32_cpu
run_suite "mixture of experts through dp, ZeRO, pp, tp, cp, ep and recompute vs one rank, CPU, FP32" \
    bash scripts/test/test_moe_layouts.sh ./train_gpt_fp32_cpu
run_suite "the README's guided tour: every command" bash scripts/test/test_tour.sh
run_suite "faults: a stalled rank (also at start-up, in a split, before a first receive, in the abort), mixed or interrupted checkpoints, bit flips, a killed rank moved, CPU, FP32" \
    bash scripts/test/test_faults.sh ./train_gpt_fp32_cpu
run_suite "asynchronous checkpoints: the same bits as synchronous ones, resumed, killed mid-write, refusals, CPU, FP32" \
    bash scripts/test/test_async_checkpoint.sh ./train_gpt_fp32_cpu
run_suite "runs that heal themselves: the supervisor past a killed and a stalled rank, goodput, the Young-Daly interval, CPU, FP32" \
    bash scripts/test/test_supervise.sh ./train_gpt_fp32_cpu
run_suite "stragglers: a rank slowed 2x named in one line and log.jsonl, none without, refusals, 4 MPI ranks, CPU, FP32" \
    bash scripts/test/test_stragglers.sh ./train_gpt_fp32_cpu
run_suite "activation recomputation vs none, bit for bit, CPU, FP32 and BF16" \
    bash scripts/test/test_recompute.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
run_suite "per-block recomputation and activation offload vs none, bit for bit, memory held vs the formula, CPU, FP32" \
    bash scripts/test/test_recompute_blocks.sh ./train_gpt_fp32_cpu
run_suite "optimizer offload vs none, bit for bit (dp, ZeRO 0-3, HSDP, pp, tp, resume, replica check), CPU, FP32 and BF16" \
    bash scripts/test/test_offload_optimizer.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
run_suite "--recompute auto: three budgets and one too small, the plan's letters, bits equal to none, a layout vs one rank, CPU, FP32" \
    bash scripts/test/test_recompute_auto.sh ./train_gpt_fp32_cpu
run_suite "stream waits: late streams vs one rank, CPU, FP32 (and BF16)" \
    bash scripts/test/test_streams.sh ./train_gpt_fp32_cpu ./train_gpt_cpu
if [[ -n $gpu_build_pid ]]; then
    wait "$gpu_build_pid"
    gpu_build_status=$?
    gpu_build_pid=
    gpu_build_result() {
        cat "$gpu_build_log"
        if [[ $gpu_build_status -eq 0 ]]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
    }
    run_suite "the GPU programs compile and link (nvcc, built in the background)" gpu_build_result
    rm -f "$gpu_build_log"
fi
# what the compiler says about the GPU kernels (spills, tensor-core instructions): needs nvcc, not a GPU; ptxas
# reads the PTX that kernel_lab's build kept
run_suite "kernel report (ptxas, PTX)" bash scripts/bench/kernel_report.sh --ptx build/kernel_lab_ptx
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    run_suite "kernel lab, GPU, BF16" ./kernel_lab
    run_suite "kernel lab, GPU, FP32" ./kernel_lab_fp32
    run_suite "communication layer and mesh, GPU (NCCL), 1 rank" "${mpi_run[@]}" -np 1 build/test_comm_gpu
    for size in $reference_models; do
        reference=(--model build/ref/${size}_model.bin --state build/ref/${size}_state.bin)
        model=$(model_name "$size")
        run_suite "$model vs PyTorch, GPU, FP32" ./test_gpt_fp32 "${reference[@]}"
        run_suite "$model vs PyTorch, GPU, BF16" ./test_gpt "${reference[@]}"
    done
    run_suite "training program: bad input and resume, GPU, BF16" bash scripts/test/test_train.sh ./train_gpt
else
    echo "=== no GPU here: the GPU programs were compiled and linked, not run"
fi

echo
[[ ${#broken[@]} -gt 0 ]] && printf 'failing suites: %s\n' "$(IFS=';'; echo "${broken[*]}")"
echo "$total_passed passed, $total_failed failed"
[[ $total_failed -eq 0 ]]
