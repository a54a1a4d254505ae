/*
The squared global norm of the gradients, for gradient clipping:

    ||g||^2 = sum_i g_i^2      over every gradient of the model (the caller takes the square root,
                               adds up ranks' shares, and scales the update by min(1, max_norm / ||g||))

It must be deterministic: the clipping factor multiplies every update, so a norm that changed in its last
bit from run to run would make whole training runs unrepeatable. Floating-point addition is not
associative, so the order of additions must be fixed, which rules out atomicAdd from many blocks. Instead:
  1. a grid-stride kernel, with a grid that depends only on the device and the element count: each
     thread squares its elements and adds them up, each block reduces its threads (block_reduce_sum) and
     writes one partial sum to scratch[block];
  2. a one-block kernel adds the partials up in a fixed order and writes (or adds to) the result.
The same device, count and data give the same bits every time.

Accuracy: with few threads (the CPU device has a handful of "multiprocessors") one thread adds tens of
thousands of squares, and an fp32 running sum that long loses ~1e-3 of its value (each addition rounds
relative to the growing total). So each thread adds a chunk's squares in fp32 and the chunks into a
double; the short block and partial sums that follow stay in fp32.

The model's gradients may live in several arrays (one per parameter chunk): call global_norm_squared for
the first and global_norm_squared_accumulate for the others, in a fixed order, to get the total.
*/
#pragma once

#include <climits>
#include "../cuda_common.cuh"

constexpr int global_norm_block_size = 512;

// ----------------------------------------------------------------------------
// kernels

// partials[blockIdx.x] = sum of squares of this block's elements: 128-bit chunks for [0, packed_count),
// then single elements for [packed_count, count) (a tail, or everything for an unaligned pointer)
__global__ void sum_of_squares_partials_kernel(float* partials, const floatX* values, size_t count,
                                               size_t packed_count) {
    double thread_sum = 0.0;
    const GridStride chunks = grid_stride(packed_count / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const x128 packed = load128cs(values + chunk * x128::size);
        float chunk_sum = 0.0f;
        for (int k = 0; k < x128::size; k++) {
            const float value = (float)packed[k];
            chunk_sum += value * value;
        }
        thread_sum += chunk_sum;
    }
    const GridStride tail = grid_stride(count - packed_count);
    for (size_t i = packed_count + tail.first; i < packed_count + tail.end; i += tail.step) {
        const float value = (float)values[i];
        thread_sum += value * value;
    }
    const float sum = block_reduce_sum((float)thread_sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *out = (accumulate ? *out : 0) + sum of partials. One block: each thread adds a fixed, strided subset
// of the partials in index order, then the block reduction combines threads in a fixed tree.
__global__ void sum_partials_kernel(float* out, const float* partials, int num_partials, bool accumulate) {
    float sum = 0.0f;
    for (int p = threadIdx.x; p < num_partials; p += blockDim.x) sum += partials[p];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *out = (accumulate ? *out : 0.0f) + sum;
}

// ----------------------------------------------------------------------------
// launchers

// How many floats `scratch` must hold: the largest grid grid_size_for() ever gives (4 blocks per
// multiprocessor: 528 on an H100 SXM). Allocate once and reuse for every call.
inline int global_norm_scratch_count() { return grid_size_for(INT_MAX, 1); }

inline void global_norm_squared_impl(float* out, float* scratch, const floatX* values, size_t count,
                                     bool accumulate, cudaStream_t stream) {
    const bool packed = (uintptr_t)values % 16 == 0;
    const size_t packed_count = packed ? count / x128::size * x128::size : 0;
    const long long work_items = packed ? (long long)(count / x128::size) + 1 : (long long)count;
    const int num_blocks = grid_size_for(work_items, global_norm_block_size);
    launch(sum_of_squares_partials_kernel, num_blocks, global_norm_block_size, 0, stream,
           scratch, values, count, packed_count);
    launch(sum_partials_kernel, 1, 256, 0, stream, out, (const float*)scratch, num_blocks, accumulate);
}

// out (1 float): written with sum_i values[i]^2 (fp32 accumulation, deterministic).
// scratch: global_norm_scratch_count() floats, overwritten.
inline void global_norm_squared(float* out, float* scratch, const floatX* values, size_t count,
                                cudaStream_t stream) {
    global_norm_squared_impl(out, scratch, values, count, false, stream);
}

// out (1 float): ACCUMULATES, *out += sum_i values[i]^2, for gradients held in several arrays.
inline void global_norm_squared_accumulate(float* out, float* scratch, const floatX* values, size_t count,
                                           cudaStream_t stream) {
    global_norm_squared_impl(out, scratch, values, count, true, stream);
}
