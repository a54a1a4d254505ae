#!/usr/bin/env bash
# Checks that the compilers and libraries a build needs are installed; names the Debian package if not.
# usage: check_tools.sh cpu|gpu|mpi
set -u
missing=0
need() {  # need DESCRIPTION PACKAGE TEST...
    local what=$1 package=$2
    shift 2
    if ! "$@" >/dev/null 2>&1; then
        echo "error: $what not found: install it with 'apt-get install $package'" >&2
        missing=1
    fi
}
header() { echo "#include <$1>" | g++ -x c++ -E - >/dev/null 2>&1; }

case "${1:-}" in
cpu)
    need "g++ (C++17 compiler)" g++ command -v g++
    need "boost.context (fibers for the CPU device)" libboost-context-dev header boost/context/detail/fcontext.hpp
    need "OpenBLAS (matmuls on the CPU)" libopenblas-dev header cblas.h
    ;;
gpu)
    nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
    need "nvcc (CUDA toolkit; also provides cuBLAS/cuBLASLt)" nvidia-cuda-toolkit test -x "$nvcc"
    ;;
mpi)
    need "OpenMPI (mpicxx, mpirun)" "openmpi-bin libopenmpi-dev" command -v mpicxx
    need "OpenMPI's mpirun" openmpi-bin command -v mpirun
    ;;
*)
    echo "usage: $0 cpu|gpu|mpi" >&2
    exit 2
    ;;
esac
exit $missing
