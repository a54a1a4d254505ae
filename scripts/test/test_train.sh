#!/usr/bin/env bash
# Tests of the training program as a user runs it:
#   - bad input: every case must end with ONE line "error: ..." naming the problem, a non-zero exit, no
#     crash (exit status < 128) and no checkpoint left behind;
#   - resume: 20 steps straight and 10 + resume + 10 give bit-identical losses.
# usage: scripts/test/test_train.sh ./train_gpt_fp32_cpu
set -u
binary=${1:?usage: $0 TRAIN_BINARY}
python=/usr/bin/python3
source "$(dirname "$0")/test_lib.sh"

# small files: shards of random tokens in a vocabulary of 100, a model file, and broken variants of each
"$python" - "$work" <<'EOF'
import struct, sys, random
work = sys.argv[1]
random.seed(7)
def shard(path, tokens, claimed=None, magic=20240520):
    header = [magic, 1, len(tokens) if claimed is None else claimed] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
good = [random.randrange(100) for _ in range(4000)]
shard(f"{work}/train.bin", good)
shard(f"{work}/val.bin", good[:1000])
shard(f"{work}/size_mismatch.bin", good[:1000], claimed=1200)
shard(f"{work}/wrong_magic.bin", good[:1000], magic=12345)
shard(f"{work}/token_out_of_range.bin", good[:500] + [150] + good[:499])
shard(f"{work}/tiny.bin", good[:20])

# model files: L=2, NH=2, C=32, V=100 (Vp=128), maxT=32, fp32
L, NH, C, V, Vp, maxT = 2, 2, 32, 100, 128, 32
def model(path, scale=0.02, magic=20240326, truncate=0, header=None):
    sizes = [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
             L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
    values = []
    for i, n in enumerate(sizes):
        if i in (2, 8, 14): values += [1.0] * n            # layernorm weights
        elif i in (3, 5, 7, 9, 11, 13, 15): values += [0.0] * n  # biases
        else: values += [random.gauss(0, 1) * scale for _ in range(n)]
    shape = header or (maxT, V, L, NH, C, Vp)  # a header may claim another shape than the data holds
    data = struct.pack("<256i", magic, 3, *shape, *([0] * 248)) + struct.pack("<%df" % len(values), *values)
    with open(path, "wb") as f:
        f.write(data[:len(data) - truncate])
model(f"{work}/model.bin")
model(f"{work}/model_truncated.bin", truncate=1000)
model(f"{work}/model_wrong_magic.bin", magic=777)
model(f"{work}/model_huge.bin", scale=3e37)   # finite weights whose products overflow: the loss is not finite
model(f"{work}/model_million_layers.bin", header=(maxT, V, 1000000, NH, C, Vp))
# every dimension near 2^31 (heads C/128: head size 128): the size it implies does not even fit in size_t
C_absurd = (2**31 - 1) // 128 * 128
model(f"{work}/model_absurd.bin", header=(2**31 - 1, C_absurd, 2**31 - 1, C_absurd // 128, C_absurd, C_absurd))
EOF

# the flags of a small healthy run; each case overrides some of them (a flag may be given only once)
declare -A defaults=([model]=custom [layers]=2 [heads]=2 [channels]=32 [vocab-size]=100 [max-seq-len]=32
                     [seq-len]=16 [batch-size]=2 [steps]=3 [val-every]=0 [sample-tokens]=0
                     [train-data]="$work/train.bin" [val-data]="$work/val.bin")
# run_args NAME=VALUE...: prints the default flags with these overrides, one per line
run_args() {
    declare -A flags
    local key
    for key in "${!defaults[@]}"; do flags[$key]=${defaults[$key]}; done
    local pair
    for pair in "$@"; do flags[${pair%%=*}]=${pair#*=}; done
    for key in "${!flags[@]}"; do printf -- '--%s\n%s\n' "$key" "${flags[$key]}"; done
}

# expect_error NAME PATTERN [NAME=VALUE...]: runs the binary with the default flags and these
# overrides, in a fresh output directory; the error line must contain PATTERN (a glob: * matches anything,
# for the parts that depend on the machine)
expect_error() {
    local name=$1 expected=$2
    shift 2
    local out="$work/out_$passed$failed"
    rm -rf "$out"
    local args
    mapfile -t args < <(run_args "$@" output-dir="$out")
    "$binary" "${args[@]}" >"$work/stdout" 2>"$work/stderr"
    local status=$?
    local lines message
    lines=$(grep -c . "$work/stderr")
    message=$(tail -n 1 "$work/stderr")
    if [[ $status -eq 0 ]]; then bad "$name: exited 0"; return; fi
    if [[ $status -ge 128 ]]; then bad "$name: crashed (status $status): $message"; return; fi
    if [[ $lines -ne 1 || $message != error:* ]]; then bad "$name: expected one 'error:' line, got $lines: $message"; return; fi
    if [[ $message != *$expected* ]]; then bad "$name: message lacks '$expected': $message"; return; fi
    if ls "$out"/checkpoint_* >/dev/null 2>&1; then bad "$name: left a checkpoint behind"; return; fi
    ok "$name: $message"
}

echo "bad input ($binary)"
expect_error "truncated model file" "size" model="$work/model_truncated.bin"
expect_error "model file with a wrong magic number" "not a model file" model="$work/model_wrong_magic.bin"
# refused when the header is read, before the parameters of the shape it claims are allocated
expect_error "model file whose header claims 1,000,000 layers" \
    "model_million_layers.bin: size 123392 bytes (120.50 KiB) does not match its header, which implies 50816021760 bytes (47.33 GiB: 12704005184 fp32 parameters for 1000000 layers" \
    model="$work/model_million_layers.bin"
expect_error "model file whose header's size overflows size_t" \
    "model_absurd.bin: size 123392 bytes (120.50 KiB) does not match its header, which implies 4753689184725301521*for 2147483647 layers" \
    model="$work/model_absurd.bin"
expect_error "missing model file" "not a model name" model="$work/nonexistent.bin"
expect_error "shard whose size disagrees with its header" "size_mismatch.bin" train-data="$work/size_mismatch.bin"
expect_error "shard with a wrong magic number" "wrong_magic.bin" train-data="$work/wrong_magic.bin"
expect_error "token id >= vocabulary size" "token" train-data="$work/token_out_of_range.bin"
expect_error "missing data files" "no file matches" train-data="$work/missing_*.bin"
expect_error "batch larger than a shard" "tiny.bin" train-data="$work/tiny.bin"
expect_error "batch size 0" "--batch-size must be" batch-size=0
expect_error "batch size that is not a number" "--batch-size expects an integer" batch-size=abc
expect_error "unknown flag" "--learning-rat" learning-rat=0.1
expect_error "unknown schedule" "lr-schedule" lr-schedule=linear
expect_error "sequence longer than the model's positions" "--seq-len 64 exceeds" seq-len=64
expect_error "heads that do not divide channels" "divisible by heads" heads=3
expect_error "total batch not a multiple of B*T" "total-batch-size" total-batch-size=100
expect_error "K/V heads that do not divide the heads" "K/V heads must divide the heads" arch=llama kv-heads=3
expect_error "K/V heads for a GPT-2 block" "add --arch llama" kv-heads=2
expect_error "an architecture that does not exist" "--arch bert: not gpt2 or llama" arch=bert
# a micro-batch no device holds: the first activation, B*T*C = 2,048,000,000 x 256 values, is 1.91 TiB in
# fp32 (976.56 GiB in bf16); the line names the category, the size and the device's memory
if [[ $binary == *fp32* ]]; then activation_size="1.91 TiB"; else activation_size="976.56 GiB"; fi
expect_error "micro-batch too large for the device" \
    "cannot allocate $activation_size of device memory for activations: * free of * (this program holds *)" \
    batch-size=1000000 seq-len=2048 max-seq-len=2048 channels=256 heads=4
expect_error "tokens per micro-step beyond an int" \
    "--batch-size 1048576 x --seq-len 4096 x 1 rank(s) = 4294967296 tokens per micro-step" \
    batch-size=1048576 seq-len=4096 max-seq-len=4096
expect_error "missing tokenizer for samples" "nonexistent_tokenizer" sample-tokens=8 tokenizer="$work/nonexistent_tokenizer.bin"
expect_error "non-finite loss" "not finite" model="$work/model_huge.bin" checkpoint-every=1
expect_error "resume without a checkpoint" "no complete checkpoint" resume=true
expect_error "ZeRO stage that does not exist" "--zero must be between 0 and 3" zero=4
expect_error "shard group that does not divide the ranks" "--dp-shard 3 does not divide the 1 data-parallel ranks" dp-shard=3
# a torchrun-style launch of 2 ranks without MPI: the CPU build's ranks need MPI; the GPU build needs a file
# to pass the NCCL id through (refused before any GPU is touched)
if [[ $binary == *_cpu ]]; then launch_hint="start them with mpirun"; else launch_hint="--nccl-init-file"; fi
RANK=0 WORLD_SIZE=2 expect_error "2 ranks from RANK/WORLD_SIZE without MPI" "$launch_hint"
RANK=0 WORLD_SIZE=2 LOCAL_RANK=2 LOCAL_WORLD_SIZE=2 expect_error "LOCAL_RANK outside LOCAL_WORLD_SIZE" \
    "LOCAL_RANK=2 of LOCAL_WORLD_SIZE=2"
# a batch script's environment (SLURM_NTASKS is the allocation, no srun step): one process, which trains
mapfile -t args < <(run_args output-dir="$work/batch_script")
if SLURM_JOB_ID=7 SLURM_NTASKS=8 SLURM_PROCID=0 SLURM_LOCALID=0 "$binary" "${args[@]}" >"$work/stdout" 2>&1 &&
   grep -q "^launcher: none, 1 rank$" "$work/stdout"; then
    ok "a batch script's SLURM_NTASKS=8 without an srun step runs one process"
else
    bad "batch-script environment: $(grep -m1 -E '^(launcher|error):' "$work/stdout")"
fi

# a corrupted checkpoint must be refused on resume
mapfile -t args < <(run_args checkpoint-every=3 output-dir="$work/corrupt")
"$binary" "${args[@]}" >/dev/null 2>&1
if [[ -f "$work/corrupt/checkpoint_3.bin" ]]; then
    printf 'XXXX' | dd of="$work/corrupt/checkpoint_3.bin" bs=1 seek=5000 conv=notrunc status=none
    mapfile -t args < <(run_args steps=5 resume=true output-dir="$work/corrupt")
    "$binary" "${args[@]}" >"$work/stdout" 2>"$work/stderr"
    status=$?
    message=$(tail -n 1 "$work/stderr")
    if [[ $status -ne 0 && $status -lt 128 && $message == error:* && $message == *checkpoint_3.bin* ]]; then
        ok "corrupted checkpoint refused: $message"
    else
        bad "corrupted checkpoint: status $status: $message"
    fi
else
    bad "corrupted checkpoint: the first run wrote no checkpoint"
fi

# ---- resume: 20 steps straight versus 10 + resume + 10 (constant schedule: the same for any --steps)
echo "resume ($binary)"
resume=(--model custom --layers 2 --heads 2 --channels 32 --vocab-size 100 --max-seq-len 32 --seq-len 16
        --batch-size 2 --total-batch-size 64 --lr-schedule constant --warmup-steps 3 --learning-rate 1e-2
        --val-every 0 --sample-tokens 0 --train-data "$work/train.bin" --checkpoint-every 10)
losses() { grep '"event": "step"' "$1/log.jsonl" | sed -E 's/.*"step": ([0-9]+),.*"loss": ([^,]+),.*/\1 \2/'; }
"$binary" "${resume[@]}" --steps 20 --output-dir "$work/straight" >/dev/null 2>&1 || bad "straight run failed"
"$binary" "${resume[@]}" --steps 10 --output-dir "$work/split" >/dev/null 2>&1 || bad "first half failed"
"$binary" "${resume[@]}" --steps 20 --resume --output-dir "$work/split" >"$work/resumed" 2>&1 || bad "resumed run failed"
straight=$(losses "$work/straight")
split=$(losses "$work/split")
count=$(echo "$split" | grep -c .)
if grep -q "resumed from .*checkpoint_10.bin at step 10" "$work/resumed" && [[ $count -eq 20 ]] &&
   [[ "$straight" == "$split" ]]; then
    ok "20 steps straight and 10 + resume + 10: the same 20 losses, bit for bit ($(echo "$straight" | tail -n 1))"
else
    bad "resume: losses differ or the run did not resume at step 10"
    diff <(echo "$straight") <(echo "$split") | head -5
fi

# ---- a block as wide as Llama 3 70B's (C = 8192, 64 heads of 128 over 8 K/V heads; a narrow MLP and a small
# vocabulary keep it to 166M parameters) trains a step: the norms' backward pass needs more shared memory
# than a block has at this width unless it splits the columns (llmc/kernels/layernorm.cuh). BF16 only: the
# build the GPUs run; ~30 s of CPU, most of it touching the 2.5 GB of state.
if [[ $binary != *fp32* ]]; then
    echo "one layer at Llama 3 70B's width ($binary)"
    "$binary" --model custom --arch llama --layers 1 --channels 8192 --heads 64 --kv-heads 8 --ffn-hidden 256 \
        --vocab-size 512 --max-seq-len 16 --seq-len 16 --batch-size 1 --steps 1 --val-every 0 --sample-tokens 0 \
        --train-data "$work/train.bin" --val-data "$work/val.bin" --output-dir "$work/wide" --save-model false \
        >"$work/wide.out" 2>&1
    status=$?
    loss=$(sed -nE 's/^step 1\/1 \| loss ([^ ]+) .*/\1/p' "$work/wide.out")
    if [[ $status -eq 0 ]] && awk -v l="$loss" 'BEGIN { exit !(l + 0 == l && l > 0 && l < 100) }'; then
        ok "C = 8192, 64 heads over 8 K/V heads: a step ends with loss $loss"
    else
        bad "C = 8192: exit $status, loss '$loss': $(grep -m1 error "$work/wide.out")"
    fi
fi

# ---- the CPU device's emulated GPU (llmc/cpu/runtime.h): a name it does not know is one line and an exit
if [[ $binary == *_cpu* ]]; then
    mapfile -t args < <(run_args output-dir="$work/device")
    LLMC_CPU_DEVICE=v100 "$binary" "${args[@]}" >/dev/null 2>"$work/device.err"
    status=$?
    if [[ $status -ne 0 && $status -lt 128 && $(wc -l <"$work/device.err") -eq 1 ]] &&
       grep -q "^error: LLMC_CPU_DEVICE=v100: must be h100 or a100" "$work/device.err"; then
        ok "LLMC_CPU_DEVICE=v100: $(cat "$work/device.err")"
    else
        bad "LLMC_CPU_DEVICE=v100: exit $status, $(head -c 300 "$work/device.err")"
    fi
fi

# ---- the model file written at the end loads back: its validation loss is the one the run ended with
echo "model file round trip ($binary)"
mapfile -t args < <(run_args steps=6 val-every=6 output-dir="$work/saved")
"$binary" "${args[@]}" >/dev/null 2>&1 || bad "training run that saves its model failed"
mapfile -t args < <(run_args model="$work/saved/model.bin" steps=1 val-every=1 output-dir="$work/reloaded")
"$binary" "${args[@]}" >/dev/null 2>&1 || bad "training run from the saved model failed"
val_loss() { grep '"event": "val_loss"' "$1/log.jsonl" | grep "\"step\": $2," | sed -E 's/.*"loss": ([^,]+),.*/\1/'; }
ended=$(val_loss "$work/saved" 6)
started=$(val_loss "$work/reloaded" 0)
# FP32: the file holds the parameters exactly. BF16: the file holds the fp32 master weights, and loading
# rounds them to nearest where training had rounded stochastically: the bf16 weights differ by up to one
# bf16 step (2^-8 relative), which moves a loss of ~4.6 by well under 1%.
if [[ $binary == *fp32* ]]; then tolerance=0; else tolerance=0.01; fi
if [[ -n "$ended" && -n "$started" ]] && awk -v a="$ended" -v b="$started" -v t="$tolerance" \
        'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * a) }'; then
    ok "model.bin reloads: validation loss $ended at the end, $started after loading"
else
    bad "model.bin round trip: validation loss '$ended' at the end, '$started' after loading"
fi

finish
