/*
The CPU build's CUDA: included by llmc/cuda_common.cuh instead of the toolkit's headers when LLMC_CPU is
defined. It maps CUDA's keywords onto C++ and pulls in the pieces of the CPU execution layer:
    vector_types.h        dim3, int4, float4, ...
    bf16.h                __nv_bfloat16, bit-identical to the toolkit's conversions
    runtime.h             cudaMalloc, cudaMemcpy, streams, events, device properties
    device.h              threads as fibers, barriers, warp operations, launch()
    cooperative_groups.h  thread_block, tiled_partition, reduce
*/
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

// Function qualifiers mean nothing on the CPU; shared memory is per block, and a block runs on one OS thread.
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(bytes) alignas(bytes)

#include "vector_types.h"
#include "bf16.h"
#include "runtime.h"
#include "device.h"
#include "cooperative_groups.h"

// ----------------------------------------------------------------------------
// device math and memory intrinsics

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
inline size_t max(size_t a, size_t b) { return a > b ? a : b; }

inline float __int_as_float(int bits) { float f; memcpy(&f, &bits, 4); return f; }
inline int __float_as_int(float f) { int bits; memcpy(&bits, &f, 4); return bits; }
inline unsigned __float_as_uint(float f) { unsigned bits; memcpy(&bits, &f, 4); return bits; }
inline float __uint_as_float(unsigned bits) { float f; memcpy(&f, &bits, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// cache hints (streaming loads and stores) are plain accesses on the CPU
template <class T> inline T __ldcs(const T* address) { return *address; }
template <class T> inline T __ldg(const T* address) { return *address; }
template <class T> inline void __stcs(T* address, T value) { *address = value; }

// ----------------------------------------------------------------------------
// atomics: blocks run on several OS threads, so these are real atomic read-modify-writes

inline int atomicAdd(int* address, int value) { return __atomic_fetch_add(address, value, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* address, unsigned value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* address, float value) {
    unsigned* bits = reinterpret_cast<unsigned*>(address);
    unsigned old = __atomic_load_n(bits, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(bits, &old, __float_as_uint(__uint_as_float(old) + value), true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return __uint_as_float(old);
}
inline int atomicMax(int* address, int value) {
    int expected = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (expected < value &&
           !__atomic_compare_exchange_n(address, &expected, value, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return expected;
}
inline int atomicCAS(int* address, int compare, int value) {
    __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
inline unsigned atomicCAS(unsigned* address, unsigned compare, unsigned value) {
    __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
