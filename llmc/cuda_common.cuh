/*
Everything a kernel header needs, in both builds.

Every kernel in llmc/ is written once in CUDA C++ and compiled two ways:
  - by nvcc for the GPU (this header then pulls in the CUDA runtime, cuda_bf16 and cooperative_groups);
  - by g++ for the CPU (this header then pulls in llmc/cpu/cuda.h, the CPU execution layer that runs the
    same kernels: fibers for threads, a scheduler for barriers and warp operations, host memory for
    device memory).
Code below this point must not care which build it is in. The few places that must (cuBLASLt versus
OpenBLAS, NCCL versus MPI) test LLMC_CPU, which the Makefile defines for the CPU build.

Rules the kernels follow so that both builds compute the same thing:
  - launches go through launch(kernel, grid, block, smem, stream, args...), never raw triple-chevrons;
  - dynamic shared memory is declared with DYNAMIC_SHARED(type, name);
  - bf16 values are converted to float explicitly before arithmetic ((float)x), and back with (floatX)y:
    on the GPU bf16 + bf16 rounds to bf16, so the CPU stand-in refuses to compile it;
  - elementwise kernels are grid-stride loops over Packed128 chunks, sized by grid_size_for().
*/
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <map>

#ifdef LLMC_CPU
#include "cpu/cuda.h"
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#endif

// ----------------------------------------------------------------------------
// error checking: every runtime call is wrapped, and a failure names the call site

inline void cuda_check_impl(cudaError_t error, const char* file, int line) {
    if (error != cudaSuccess) {
        fprintf(stderr, "error: CUDA call failed at %s:%d: %s\n", file, line, cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(call) cuda_check_impl((call), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// precision: floatX is the type of parameters, activations and gradients.
// BF16 is the default; -DENABLE_FP32 gives an all-fp32 build for exact comparisons.
// Master weights, optimizer state, losses and all statistics are fp32 in both.

#ifdef ENABLE_FP32
typedef float floatX;
#define PRECISION_NAME "FP32"
#else
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "BF16"
#endif

// ----------------------------------------------------------------------------
// dynamic shared memory, one spelling for both builds

#ifdef LLMC_CPU
#define DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::cudacpu::dynamic_shared_memory())
#else
#define DYNAMIC_SHARED(T, name) \
    extern __shared__ __align__(16) unsigned char llmc_dynamic_smem_[]; \
    T* name = reinterpret_cast<T*>(llmc_dynamic_smem_)
#endif

// ----------------------------------------------------------------------------
// kernel launch: the one place where a kernel is started. Errors in the launch configuration (too many
// threads, too much shared memory) are caught here in both builds.

#ifndef LLMC_CPU
template <typename... KernelParams, typename... Args>
void launch(void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
    kernel<<<grid, block, shared_bytes, stream>>>(static_cast<KernelParams>(args)...);  // the one raw launch
    cudaCheck(cudaGetLastError());
}
#endif
// (the CPU build's launch() lives in llmc/cpu/device.h)

// A kernel may use more than 48 KiB of dynamic shared memory (the GPU's default cap) only once it has said
// so. Launchers call this before every launch of a kernel with dynamic shared memory: it sets the
// attribute the first time and whenever a launch needs more than before, and is a map lookup otherwise.
// Opting in even at or below 48 KiB keeps a launch valid when a __shared__ variable is later added to the
// kernel (static and dynamic shared memory share the cap). Called from the one host thread that launches.
template <typename... KernelParams>
void opt_in_shared_memory(void (*kernel)(KernelParams...), size_t shared_bytes) {
    static std::map<const void*, size_t> opted_in;  // per kernel: the largest size asked for so far
    size_t& largest = opted_in[reinterpret_cast<const void*>(kernel)];
    if (shared_bytes <= largest) return;
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes));
    largest = shared_bytes;
}

// ----------------------------------------------------------------------------
// the device we run on, asked once

inline const cudaDeviceProp& device_properties() {
    static cudaDeviceProp props = [] {
        cudaDeviceProp p;
        int device = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaGetDeviceProperties(&p, device));
        return p;
    }();
#ifdef LLMC_CPU
    // the CPU device's limits are those of the GPU it emulates, which the kernel lab switches (llmc/cpu/runtime.h)
    static const cudacpu::EmulatedGpu* asked_under = &cudacpu::emulated_gpu();
    if (asked_under != &cudacpu::emulated_gpu()) {
        asked_under = &cudacpu::emulated_gpu();
        cudaCheck(cudaGetDeviceProperties(&props, 0));
    }
#endif
    return props;
}

// ----------------------------------------------------------------------------
// copies that are finished when they return, for set-up, checkpoints, samples and tests
//
// The training step runs on non-blocking streams, and the legacy stream that a plain cudaMemcpy or
// cudaMemset uses does not wait for them (nor they for it). So these copies go on the stream whose work
// wrote (or will read) the buffer, after everything already issued there, and wait for it: the host may
// read its buffer, or reuse it, at once. The step itself uses cudaMemcpyAsync and events instead.

template <class T>
void copy_to_device(T* device, const T* host, size_t count, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(device, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaStreamSynchronize(stream));
}
template <class T>
void copy_to_host(T* host, const T* device, size_t count, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
}

inline __host__ __device__ constexpr int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

// A grid for a grid-stride loop over `work_items`: enough blocks to fill every multiprocessor a few times
// over, never more than there is work. On the CPU device (few "multiprocessors") each emulated thread then
// runs a long loop, which is what makes emulation cheap.
inline int grid_size_for(long long work_items, int block_size) {
    int enough = device_properties().multiProcessorCount * 4;
    int needed = ceil_div(work_items, block_size);
    return needed < enough ? (needed > 0 ? needed : 1) : enough;
}

// The share of a grid-stride loop over [0, count) that belongs to the calling thread:
//     const GridStride share = grid_stride(count);
//     for (size_t i = share.first; i < share.end; i += share.step) ...
// On the GPU, thread t takes items t, t + threads, t + 2*threads, ...: neighbouring threads touch
// neighbouring items at the same moment, so the loads of a warp coalesce. The CPU device runs one
// emulated thread's whole loop before the next thread starts, so that order would make every thread
// stride across the whole array and fetch each cache line several times, long after its neighbours did;
// there each thread takes one contiguous stretch of items instead. Each item is still processed exactly
// once by exactly one thread; only which thread takes which item differs.
struct GridStride {
    size_t first, end, step;
};
// the share of [0, count) of party `party` out of `parties`, in the device's preferred order
__device__ __forceinline__ GridStride share_of(size_t count, size_t party, size_t parties) {
#ifdef LLMC_CPU
    const size_t per_party = (count + parties - 1) / parties;
    const size_t first = party * per_party < count ? party * per_party : count;
    const size_t end = first + per_party < count ? first + per_party : count;
    return GridStride{first, end, 1};
#else
    return GridStride{party, count, parties};
#endif
}
// the calling thread's share among all threads of the grid
__device__ __forceinline__ GridStride grid_stride(size_t count) {
    return share_of(count, (size_t)blockIdx.x * blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}
// the calling thread's share among the threads of its block
__device__ __forceinline__ GridStride block_stride(size_t count) { return share_of(count, threadIdx.x, blockDim.x); }

// ----------------------------------------------------------------------------
// Packed128: 16 bytes of elements moved with one vector load/store (LDG.128 on the GPU)

template <class ElementType>
struct alignas(16) Packed128 {
    static constexpr int size = sizeof(int4) / sizeof(ElementType);
    ElementType payload[size];

    Packed128() = default;
    __device__ __host__ explicit Packed128(int4 bits) { memcpy(&payload, &bits, sizeof(bits)); }
    __device__ __host__ static Packed128 constant(ElementType value) {
        Packed128 result;
        for (int k = 0; k < size; k++) result.payload[k] = value;
        return result;
    }
    __device__ __host__ ElementType& operator[](int index) { return payload[index]; }
    __device__ __host__ const ElementType& operator[](int index) const { return payload[index]; }
    __device__ __host__ int4 get_bits() const {
        int4 bits;
        memcpy(&bits, &payload, sizeof(bits));
        return bits;
    }
};
typedef Packed128<float> f128;
typedef Packed128<floatX> x128;

template <class ElementType>
__device__ __forceinline__ Packed128<ElementType> load128(const ElementType* address) {
    return Packed128<ElementType>{*reinterpret_cast<const int4*>(address)};
}
// load that will not be reused: do not keep it in cache
template <class ElementType>
__device__ __forceinline__ Packed128<ElementType> load128cs(const ElementType* address) {
    return Packed128<ElementType>{__ldcs(reinterpret_cast<const int4*>(address))};
}
template <class ElementType>
__device__ __forceinline__ void store128(ElementType* target, Packed128<ElementType> value) {
    *reinterpret_cast<int4*>(target) = value.get_bits();
}
template <class ElementType>
__device__ __forceinline__ void store128cs(ElementType* target, Packed128<ElementType> value) {
    __stcs(reinterpret_cast<int4*>(target), value.get_bits());
}

// ----------------------------------------------------------------------------
// reductions inside a warp and a block (fp32), by an operation that is associative and commutative: how it
// combines two values, and its identity, which stands for a value no thread holds

struct ReduceSum {
    static constexpr float identity = 0.0f;
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct ReduceMax {
    static constexpr float identity = -INFINITY;
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class Reduce>
__device__ __forceinline__ float warp_reduce(float value) {
    for (int offset = 16; offset > 0; offset /= 2) value = Reduce()(value, __shfl_xor_sync(0xffffffff, value, offset));
    return value;
}

// Over all threads of the block; every thread gets the result. blockDim.x must be a multiple of 32. The
// trailing barrier lets a caller reduce twice in a row without a race on `partials` (one array per operation).
template <class Reduce>
__device__ inline float block_reduce(float value) {
    __shared__ float partials[32];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int num_warps = blockDim.x / 32;
    value = warp_reduce<Reduce>(value);
    if (lane == 0) partials[warp] = value;
    __syncthreads();
    value = lane < num_warps ? partials[lane] : Reduce::identity;
    value = warp_reduce<Reduce>(value);
    __syncthreads();
    return value;
}

__device__ __forceinline__ float warp_reduce_sum(float value) { return warp_reduce<ReduceSum>(value); }
__device__ __forceinline__ float warp_reduce_max(float value) { return warp_reduce<ReduceMax>(value); }
__device__ inline float block_reduce_sum(float value) { return block_reduce<ReduceSum>(value); }
__device__ inline float block_reduce_max(float value) { return block_reduce<ReduceMax>(value); }

// ----------------------------------------------------------------------------
// Deterministic column sums. Several backward kernels (bias gradient, layernorm weight/bias gradients)
// reduce over all B*T rows. Each block writes the partial sums of its rows to a scratch array
// partials[num_partials][columns], and add_column_partials adds them up in a fixed order:
//     target[c] += sum over groups g of (sum over the rows p of group g of partials[p][c])
// where the partial rows are cut into at most COLUMN_PARTIAL_GROUPS groups of consecutive rows. Same bits
// every run (the grouping depends on the shape alone), no atomics.
//
// Why groups: one thread per column summing every partial row gives a tiny grid. GPT-2 124M at B=16,
// T=1024 (N = 16384 rows, C = 768) on an H100 (132 SMs):
//   bias gradients: 256 partial rows (N / 64), columns C, 3C, 4C; layernorm: 396 rows (3 blocks per SM), C.
//   one pass, 256 threads a block, each thread summing all the rows:   3, 9, 12 blocks (and 3 for layernorm)
//   pass 1, grid (columns / 64, groups), 64 threads a block, 8 rows a thread in 32 groups (layernorm: 13
//   rows in 31 groups):                                                 384, 1152, 1536 (and 372) blocks
//   pass 2, 64 threads a block, each adding its column's 32 (31) group sums: 12, 36, 48 (and 12) blocks
// Pass 1 writes each group's sum over the group's first partial row (the rows are scratch, and only the
// thread that owns the column reads them), so no further memory is needed.

constexpr int COLUMN_PARTIAL_GROUPS = 32;
constexpr int COLUMN_PARTIALS_BLOCK_SIZE = 64;

// The partial rows of one group: [group * rows_per_group, min((group + 1) * rows_per_group, num_partials))
inline __host__ __device__ int column_partials_rows_per_group(int num_partials) {
    return ceil_div(num_partials, COLUMN_PARTIAL_GROUPS);
}

// pass 1: partials[group's first row][c] = the sum of the group's rows, in row order. grid.y: the group.
__global__ void sum_column_partial_groups_kernel(float* partials, int num_partials, int columns) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= columns) return;
    const int rows_per_group = column_partials_rows_per_group(num_partials);
    const int first = blockIdx.y * rows_per_group;
    const int end = min(first + rows_per_group, num_partials);
    float sum = 0.0f;
    for (int p = first; p < end; p++) sum += partials[(size_t)p * columns + column];
    partials[(size_t)first * columns + column] = sum;
}

// pass 2: target[c] += the group sums, in group order
__global__ void add_column_partial_groups_kernel(floatX* target, const float* partials, int num_partials,
                                                 int columns) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    if (column >= columns) return;
    const int rows_per_group = column_partials_rows_per_group(num_partials);
    float sum = 0.0f;
    for (int first = 0; first < num_partials; first += rows_per_group) {
        sum += partials[(size_t)first * columns + column];
    }
    target[column] = (floatX)((float)target[column] + sum);
}

// partials: num_partials rows of `columns` floats; overwritten (used as the first pass's output)
inline void add_column_partials(floatX* target, float* partials, int num_partials, int columns, cudaStream_t stream) {
    if (num_partials < 1 || columns < 1) return;
    const int groups = ceil_div(num_partials, column_partials_rows_per_group(num_partials));
    const int column_blocks = ceil_div(columns, COLUMN_PARTIALS_BLOCK_SIZE);
    launch(sum_column_partial_groups_kernel, dim3(column_blocks, groups), COLUMN_PARTIALS_BLOCK_SIZE, 0, stream,
           partials, num_partials, columns);
    launch(add_column_partial_groups_kernel, column_blocks, COLUMN_PARTIALS_BLOCK_SIZE, 0, stream, target, partials,
           num_partials, columns);
}
