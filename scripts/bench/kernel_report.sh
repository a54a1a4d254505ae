#!/usr/bin/env bash
# Evidence about the GPU kernels without a GPU. Compiles dev/lab/kernel_lab.cu (which includes every kernel
# header) once per architecture with ptxas -v, keeps the PTX, and prints per kernel: registers, shared
# memory, spills, theoretical occupancy, and the tensor-core (HMMA), FFMA and shared-load instruction
# counts; then a roofline estimate of a GPT-2 124M training step on an H100 (scripts/bench/kernel_report.py
# holds the arithmetic and the model). Fails on any register spill, and in the BF16 build on an attention
# forward/backward kernel without HMMA, or when the kernels a grouped-query attention case launches (Llama 3
# 8B's heads: 32 query heads over 8 K/V heads of 128) have none. Ends with `N passed, M failed`.
#   usage: scripts/bench/kernel_report.sh [BF16|FP32] [--ptx DIR]  (GPU_ARCH="80 90" by default, as the Makefile)
# --ptx DIR: the PTX that the Makefile's kernel_lab build keeps (BF16, DIR/kernel_lab.compute_<arch>.ptx, make
# test passes build/kernel_lab_ptx); only ptxas runs then, on that PTX, instead of the whole compile. An
# architecture whose PTX is missing, or older than a file in llmc/ or dev/lab/, is compiled as without it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ptx_dir=
if [[ ${1:-} == --ptx ]]; then set -- BF16 "$@"; fi
precision=${1:-BF16}
if [[ $# -ge 2 ]]; then
    [[ $2 == --ptx && $# -eq 3 ]] || { echo "error: usage: $0 [BF16|FP32] [--ptx DIR]" >&2; exit 2; }
    [[ $precision == BF16 ]] || { echo "error: --ptx holds kernel_lab's BF16 PTX, not $precision's" >&2; exit 2; }
    ptx_dir=$3
fi
case $precision in
    BF16) precision_flag=() ;;
    FP32) precision_flag=(-DENABLE_FP32) ;;
    *) echo "error: precision must be BF16 or FP32, not '$precision'" >&2; exit 2 ;;
esac
read -r -a archs <<<"${GPU_ARCH:-80 90}"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $nvcc ]] || { echo "error: no nvcc (looked on PATH and at /usr/local/cuda/bin)" >&2; exit 2; }
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The dynamic shared memory each launcher asks for at GPT-2 124M (C = 768), from the launchers' own size
# functions, built for the CPU (a second). If they change name the report says "static only". Also the
# grouped-query case's heads, through the launchers' own check (attention_heads refuses what they cannot run).
cat >"$work/shared_bytes.cpp" <<'EOF'
#include <cstdio>
#include "llmc/kernels/attention.cuh"
#include "llmc/kernels/layernorm.cuh"
template <int HS>
void print_attention() {
    printf("attention_forward %d %zu\n", HS, (size_t)attention_forward_shared_bytes<HS>());
    printf("attention_dkdv %d %zu\n", HS, (size_t)attention_dkdv_shared_bytes<HS>());
    printf("attention_dq %d %zu\n", HS, (size_t)attention_dq_shared_bytes<HS>());
}
int main() {
    print_attention<16>(), print_attention<32>(), print_attention<48>(), print_attention<64>();
    print_attention<80>(), print_attention<96>(), print_attention<112>(), print_attention<128>();
    printf("layernorm_backward 0 %zu\n", norm_backward_bands(768, Norm::Layer).shared_bytes);
    printf("rmsnorm_backward 0 %zu\n", norm_backward_bands(768, Norm::RMS).shared_bytes);
    const AttentionHeads gqa = attention_heads(32, 8, 128);
    printf("gqa %d %d %d %d\n", gqa.q_heads, gqa.kv_heads, gqa.head_size, gqa.group());
}
EOF
if g++ -std=c++17 -DLLMC_CPU -fopenmp "${precision_flag[@]}" -I. -x c++ "$work/shared_bytes.cpp" -o "$work/shared_bytes" \
        -lboost_context -fopenmp 2>"$work/probe_errors.txt"; then
    "$work/shared_bytes" >"$work/shared_bytes.txt"
fi

# one compile per architecture, side by side (each is one single-threaded nvcc; make test runs this alone), or
# ptxas alone on the kept PTX where it is there and newer than every source
compiles=()
for arch in "${archs[@]}"; do
    dir="$work/sm_$arch"
    mkdir -p "$dir"
    kept="$ptx_dir/kernel_lab.compute_$arch.ptx"
    if [[ -n $ptx_dir && -f $kept && -z $(find llmc dev/lab -newer "$kept" -print -quit) ]]; then
        echo "sm_$arch: ptxas on $kept"
        cp "$kept" "$dir/"
        # as nvcc runs ptxas for kernel_lab (-lineinfo: --generate-line-info), with -v for the report
        "$nvcc" -cubin -arch="sm_$arch" -Xptxas -v,--generate-line-info "$dir/kernel_lab.compute_$arch.ptx" \
            -o "$dir/kernel_lab.cubin" >"$dir/ptxas.txt" 2>&1 &
    else
        [[ -n $ptx_dir ]] && echo "sm_$arch: no up-to-date $kept, compiling dev/lab/kernel_lab.cu"
        # -c: no link needed; --keep leaves the PTX (and the cubin) in $dir
        "$nvcc" -std=c++17 -O3 -gencode "arch=compute_$arch,code=sm_$arch" -Xptxas -v --keep --keep-dir "$dir" \
            "${precision_flag[@]}" -x cu -c dev/lab/kernel_lab.cu -o "$dir/kernel_lab.o" >"$dir/ptxas.txt" 2>&1 &
    fi
    compiles+=($!)
done
for i in "${!archs[@]}"; do
    arch=${archs[$i]} dir="$work/sm_${archs[$i]}"
    if ! wait "${compiles[$i]}"; then
        kill "${compiles[@]}" 2>/dev/null || true
        tail -n 20 "$dir/ptxas.txt" >&2
        echo "error: nvcc failed to compile dev/lab/kernel_lab.cu for sm_$arch" >&2
        exit 1
    fi
    if command -v cuobjdump >/dev/null 2>&1; then
        cuobjdump -sass "$dir/kernel_lab.o" >"$dir/sass.txt"
    fi
done

"$python" scripts/bench/kernel_report.py "$work" "$precision" "${archs[@]}"
