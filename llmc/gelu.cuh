/*
GELU, the MLP's nonlinearity, in GPT-2's tanh approximation:
    gelu(x)  = 0.5 x (1 + tanh(u)),            u = sqrt(2/pi) (x + 0.044715 x^3)
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
(the derivative is the product rule on x * (1 + tanh(u)) / 2, with d tanh(u)/du = 1 - tanh(u)^2).

What each launcher does with its outputs:
    gelu_forward   out: overwritten
    gelu_backward  dinp: overwritten with gelu'(inp) * dout. dinp may be the same buffer as dout (the
                   model does this to save memory): each thread reads its chunk of dout before writing
                   the same chunk of dinp, and no thread touches another's chunk.

Both are elementwise: a grid-stride loop over 16-byte chunks (x128). N % x128::size == 0 is required
(8 in BF16, 4 in FP32); in GPT-2, N = B*T*4C always is.
*/
#pragma once

#include "cuda_common.cuh"

constexpr float GELU_SQRT_2_OVER_PI = 0.7978845608028654f;
constexpr float GELU_CUBIC_COEFFICIENT = 0.044715f;

// ----------------------------------------------------------------------------
// kernels

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    const size_t stride = (size_t)gridDim.x * blockDim.x * x128::size;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < N; i += stride) {
        const x128 x = load128cs(inp + i);
        x128 result;
        for (int k = 0; k < x128::size; k++) {
            const float xk = (float)x[k];
            const float u = GELU_SQRT_2_OVER_PI * (xk + GELU_CUBIC_COEFFICIENT * xk * xk * xk);
            result[k] = (floatX)(0.5f * xk * (1.0f + tanhf(u)));
        }
        store128(out + i, result);
    }
}

// not __restrict__: dinp and dout may be the same buffer
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    const size_t stride = (size_t)gridDim.x * blockDim.x * x128::size;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * x128::size; i < N; i += stride) {
        const x128 x = load128cs(inp + i);
        const x128 g = load128cs(dout + i);
        x128 result;
        for (int k = 0; k < x128::size; k++) {
            const float xk = (float)x[k];
            const float u = GELU_SQRT_2_OVER_PI * (xk + GELU_CUBIC_COEFFICIENT * xk * xk * xk);
            const float tanh_u = tanhf(u);
            const float du_dx = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC_COEFFICIENT * xk * xk);
            const float slope = 0.5f * (1.0f + tanh_u) + 0.5f * xk * (1.0f - tanh_u * tanh_u) * du_dx;
            result[k] = (floatX)(slope * (float)g[k]);
        }
        store128(dinp + i, result);
    }
}

// ----------------------------------------------------------------------------
// launchers

inline void gelu_check_size(const char* caller, size_t N) {
    if (N == 0 || N % x128::size != 0) {
        fprintf(stderr, "error: %s: N = %zu must be a positive multiple of %d (16 bytes of %s)\n", caller, N,
                x128::size, PRECISION_NAME);
        exit(EXIT_FAILURE);
    }
}

constexpr int GELU_BLOCK_SIZE = 512;

void gelu_forward(floatX* out, const floatX* inp, size_t N, cudaStream_t stream) {
    gelu_check_size("gelu_forward", N);
    const int grid = grid_size_for(N / x128::size, GELU_BLOCK_SIZE);
    launch(gelu_forward_kernel, grid, GELU_BLOCK_SIZE, 0, stream, out, inp, N);
}

void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N, cudaStream_t stream) {
    gelu_check_size("gelu_backward", N);
    const int grid = grid_size_for(N / x128::size, GELU_BLOCK_SIZE);
    launch(gelu_backward_kernel, grid, GELU_BLOCK_SIZE, 0, stream, dinp, inp, dout, N);
}
