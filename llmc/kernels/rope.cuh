/*
Rotary position embedding (RoPE, Su et al. 2021), Llama's positions: instead of adding a learned position
vector to the input, each query and key head vector is rotated by angles proportional to its token's
position, so that q . k depends on the two positions only through their difference.

A head vector of hs values is hs/2 pairs (x_2i, x_2i+1), adjacent elements as Meta's Llama reference pairs
them. Pair i turns at the frequency
    f_i = theta^(-2i / hs)                 theta = --rope-theta (500000 for Llama 3)
and at position p by the angle a = p f_i:
    out_2i   = x_2i cos a - x_2i+1 sin a
    out_2i+1 = x_2i sin a + x_2i+1 cos a
The backward pass is the transpose of that rotation, the rotation by -a:
    dx_2i   =  dout_2i cos a + dout_2i+1 sin a
    dx_2i+1 = -dout_2i sin a + dout_2i+1 cos a
The angle is the fp32 product p * f_i, as PyTorch's reference takes it, then its cosine and sine, whatever
floatX is. f_i itself is computed in double and rounded once to fp32, so that it is the same float on every
device: an fp32 powf may be off by an ulp or two from one math library to another, and at position p the
angle then moves by p times that (at p ~ 1000 about 1e-4 radians, far above fp32's rounding of the output).
The hs/2 frequencies depend on the model only, so they are a table, computed once per model on the device
(rope_frequencies): a double-precision pow per pair and call would cost a GPU far more than the rotation.

The layout is the qkv matmul's output: each of the N = B T rows holds the query heads, then the key heads,
then the value heads, hs values each (with grouped-query attention there are fewer key/value heads than
query heads; under tensor parallelism a rank holds its share of each). RoPE turns the first
q_heads + kv_heads heads of each row, in place, and leaves the values alone. The rows are one chunk of
B sequences (llmc/parallel/context_parallel.h's SequenceChunk): row b T + t is at position
first_position + t, so a context-parallel rank turns each of its chunks with that chunk's first position.

What each launcher does:
    rope_frequencies  the table: f_i for i < hs/2, fp32
    rope_forward    qkv: the query and key heads rotated in place
    rope_backward   dqkv: the query and key heads' gradients rotated back in place
One thread per pair, a grid-stride loop; hs must be even.
*/
#pragma once

#include "../cuda_common.cuh"
#include "../utils.h"

// ----------------------------------------------------------------------------
// kernels

// frequencies[i] = f_i, i < head_size / 2
__global__ void rope_frequencies_kernel(float* frequencies, int head_size, float theta) {
    const GridStride share = grid_stride((size_t)head_size / 2);
    for (size_t i = share.first; i < share.end; i += share.step)
        frequencies[i] = (float)pow((double)theta, -2.0 * (int)i / head_size);
}

// Rotates every (row, rotated head, pair) by `direction` (+1 forward, -1 backward) times its angle.
__global__ void rope_kernel(floatX* qkv, int B, int T, int first_position, int rotated_heads, int row_width,
                            int head_size, const float* frequencies, float direction) {
    const int pairs = head_size / 2;
    const GridStride share = grid_stride((size_t)B * T * rotated_heads * pairs);
    for (size_t item = share.first; item < share.end; item += share.step) {
        const int i = (int)(item % pairs);
        const size_t head = item / pairs % rotated_heads;
        const size_t row = item / pairs / rotated_heads;
        const int position = first_position + (int)(row % T);
        float sine, cosine;
        sincosf((float)position * frequencies[i], &sine, &cosine);
        sine *= direction;
        floatX* pair = qkv + row * row_width + head * head_size + 2 * i;
        const float x0 = (float)pair[0], x1 = (float)pair[1];
        pair[0] = (floatX)(x0 * cosine - x1 * sine);
        pair[1] = (floatX)(x0 * sine + x1 * cosine);
    }
}

// ----------------------------------------------------------------------------
// launchers

inline void rope_check_head_size(const char* caller, int head_size) {
    if (head_size <= 0 || head_size % 2 != 0)
        fatal("%s: the head size %d must be positive and even (RoPE turns pairs)", caller, head_size);
}

// frequencies (head_size / 2 floats of device memory): the table, once per model
void rope_frequencies(float* frequencies, int head_size, float theta, cudaStream_t stream) {
    rope_check_head_size("rope_frequencies", head_size);
    if (!(theta > 1.0f)) fatal("rope_frequencies: theta %g must exceed 1", theta);
    const int block_size = 256;
    launch(rope_frequencies_kernel, grid_size_for(head_size / 2, block_size), block_size, 0, stream, frequencies,
           head_size, theta);
}

inline void rope_launch(const char* caller, floatX* qkv, int B, int T, int first_position, int q_heads, int kv_heads,
                        int head_size, const float* frequencies, float direction, cudaStream_t stream) {
    rope_check_head_size(caller, head_size);
    const int rotated_heads = q_heads + kv_heads, row_width = (q_heads + 2 * kv_heads) * head_size;
    const int block_size = 256;
    launch(rope_kernel, grid_size_for((size_t)B * T * rotated_heads * (head_size / 2), block_size), block_size, 0,
           stream, qkv, B, T, first_position, rotated_heads, row_width, head_size, frequencies, direction);
}

// qkv (B T rows of q_heads + 2 kv_heads heads of head_size): the query and key heads rotated in place, by the
// frequencies rope_frequencies made
void rope_forward(floatX* qkv, int B, int T, int first_position, int q_heads, int kv_heads, int head_size,
                  const float* frequencies, cudaStream_t stream) {
    rope_launch("rope_forward", qkv, B, T, first_position, q_heads, kv_heads, head_size, frequencies, +1.0f, stream);
}

// dqkv (as qkv): the gradients of the rotated query and key heads become those of the heads before RoPE
void rope_backward(floatX* dqkv, int B, int T, int first_position, int q_heads, int kv_heads, int head_size,
                   const float* frequencies, cudaStream_t stream) {
    rope_launch("rope_backward", dqkv, B, T, first_position, q_heads, kv_heads, head_size, frequencies, -1.0f, stream);
}
