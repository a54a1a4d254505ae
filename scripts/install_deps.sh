#!/usr/bin/env bash
# Installs the Debian packages the project needs (when run as root; otherwise prints the command).
#   g++, boost.context (fibers of the CPU device), OpenBLAS (CPU matmuls)
# The CUDA toolkit (nvcc, cuBLAS) is expected at /usr/local/cuda or on PATH; on plain Debian it is the
# package nvidia-cuda-toolkit from the non-free section.
set -euo pipefail
packages=(g++ make libboost-context-dev libopenblas-dev)
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
