/*
SwiGLU, Llama's MLP nonlinearity (Shazeer, "GLU Variants Improve Transformer", 2020). The MLP's first matmul
gives each row 2H values, a gate g and an up-projection u (H each, the gate first); the nonlinearity joins them:
    out = silu(g) * u,         silu(g) = g s,   s = sigmoid(g) = 1 / (1 + exp(-g))
and the MLP's second matmul takes out (H per row) back to C. The backward pass, by the product rule:
    dg = dout * u * silu'(g),  silu'(g) = s + g s (1 - s) = s (1 + g (1 - s))
    du = dout * silu(g)
exp(-g) overflowing to infinity for very negative g gives s = 0, the right limit of both.

Layout: inp and dinp are (N, 2H) with row r's gate in [r 2H, r 2H + H) and its up-projection in
[r 2H + H, r 2H + 2H); out and dout are (N, H). Under tensor parallelism H is a rank's share of the hidden
units, the gate and up rows of the same units on the same rank.

What each launcher does with its outputs:
    swiglu_forward   out: overwritten
    swiglu_backward  dinp: overwritten (both halves)
Both are elementwise over 16-byte chunks of a row's H values: H % x128::size == 0 (8 in BF16, 4 in FP32).
*/
#pragma once

#include "../cuda_common.cuh"
#include "../utils.h"

// ----------------------------------------------------------------------------
// kernels

// Chunk c of the N H / x128::size that both kernels walk: x128::size hidden units of one row, each row H / x128::size
// chunks. Where its gate and up-projection sit in the (N, 2H) tensors inp and dinp, where it sits in the (N, H)
// tensors out and dout, and its gate and up values, read from inp: the layout above in one place, so that the
// forward and the backward pass cannot disagree on it.
struct SwigluChunk {
    size_t gate_at, up_at;  // offsets in inp and dinp: the up-projection is H after the gate
    size_t hidden_at;       // offset in out and dout
    x128 gate, up;
};

__device__ __forceinline__ SwigluChunk swiglu_load_chunk(const floatX* inp, size_t chunk, int H) {
    const int chunks_per_row = H / x128::size;
    const size_t row = chunk / chunks_per_row;
    const size_t column = chunk % chunks_per_row * x128::size;
    SwigluChunk c;
    c.gate_at = row * 2 * H + column;
    c.up_at = c.gate_at + H;
    c.hidden_at = row * H + column;
    c.gate = load128cs(inp + c.gate_at);
    c.up = load128cs(inp + c.up_at);
    return c;
}

__global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, int N, int H) {
    const GridStride chunks = grid_stride((size_t)N * (H / x128::size));
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const SwigluChunk c = swiglu_load_chunk(inp, chunk, H);
        x128 result;
        for (int k = 0; k < x128::size; k++) {
            const float gk = (float)c.gate[k];
            const float s = 1.0f / (1.0f + expf(-gk));
            result[k] = (floatX)(gk * s * (float)c.up[k]);
        }
        store128(out + c.hidden_at, result);
    }
}

__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, int N, int H) {
    const GridStride chunks = grid_stride((size_t)N * (H / x128::size));
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const SwigluChunk c = swiglu_load_chunk(inp, chunk, H);
        const x128 d = load128cs(dout + c.hidden_at);
        x128 dgate, dup;
        for (int k = 0; k < x128::size; k++) {
            const float gk = (float)c.gate[k];
            const float s = 1.0f / (1.0f + expf(-gk));
            dgate[k] = (floatX)((float)d[k] * (float)c.up[k] * s * (1.0f + gk * (1.0f - s)));
            dup[k] = (floatX)((float)d[k] * gk * s);
        }
        store128(dinp + c.gate_at, dgate);
        store128(dinp + c.up_at, dup);
    }
}

// ----------------------------------------------------------------------------
// launchers

inline void swiglu_check_shape(const char* caller, int N, int H) {
    if (N <= 0 || H <= 0 || H % x128::size != 0)
        fatal("%s: %d rows of H = %d: H must be a positive multiple of %d (16 bytes of %s)", caller, N, H, x128::size,
              PRECISION_NAME);
}

constexpr int SWIGLU_BLOCK_SIZE = 512;

// out (N, H) = silu(gate) * up, from inp (N, 2H)
void swiglu_forward(floatX* out, const floatX* inp, int N, int H, cudaStream_t stream) {
    swiglu_check_shape("swiglu_forward", N, H);
    launch(swiglu_forward_kernel, grid_size_for((size_t)N * H / x128::size, SWIGLU_BLOCK_SIZE), SWIGLU_BLOCK_SIZE, 0,
           stream, out, inp, N, H);
}

// dinp (N, 2H): the gradients of the gate and the up-projection, from inp (N, 2H) and dout (N, H)
void swiglu_backward(floatX* dinp, const floatX* inp, const floatX* dout, int N, int H, cudaStream_t stream) {
    swiglu_check_shape("swiglu_backward", N, H);
    launch(swiglu_backward_kernel, grid_size_for((size_t)N * H / x128::size, SWIGLU_BLOCK_SIZE), SWIGLU_BLOCK_SIZE, 0,
           stream, dinp, inp, dout, N, H);
}
