/*
GELU, the MLP's nonlinearity, in GPT-2's tanh approximation:
    gelu(x)  = 0.5 x (1 + tanh(u)),            u = sqrt(2/pi) (x + 0.044715 x^3)
    gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
(the derivative is the product rule on x * (1 + tanh(u)) / 2, with d tanh(u)/du = 1 - tanh(u)^2).
The kernels evaluate it through the logistic function s = 1 / (1 + exp(-2u)), using
    (1 + tanh(u)) / 2 = s,     1 - tanh(u)^2 = 4 s (1 - s)
so gelu(x) = x s and gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2). One exp instead of
a tanh: cheaper (much cheaper on the CPU, where tanhf is a slow library call), and more accurate for
negative x, where 1 + tanh(u) would cancel. exp(-2u) overflowing to infinity for very negative u gives
s = 0, the right limit.

What each launcher does with its outputs:
    gelu_forward   out: overwritten
    gelu_backward  dinp: overwritten with gelu'(inp) * dout. dinp may be the same buffer as dout (the
                   model does this to save memory): each thread reads its chunk of dout before writing
                   the same chunk of dinp, and no thread touches another's chunk.

Both are elementwise: a grid-stride loop over 16-byte chunks (x128). N % x128::size == 0 is required
(8 in BF16, 4 in FP32); in GPT-2, N = B*T*4C always is.
*/
#pragma once

#include "../cuda_common.cuh"

constexpr float GELU_SQRT_2_OVER_PI = 0.7978845608028654f;
constexpr float GELU_CUBIC_COEFFICIENT = 0.044715f;

// ----------------------------------------------------------------------------
// kernels

// s = 1 / (1 + exp(-2u)) = (1 + tanh(u)) / 2, u = sqrt(2/pi) (x + 0.044715 x^3): gelu(x) = x s
__device__ __forceinline__ float gelu_logistic(float x) {
    const float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC_COEFFICIENT * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    const GridStride chunks = grid_stride(N / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const x128 x = load128cs(inp + i);
        x128 result;
        for (int k = 0; k < x128::size; k++) {
            const float xk = (float)x[k];
            const float s = gelu_logistic(xk);
            result[k] = (floatX)(xk * s);
        }
        store128(out + i, result);
    }
}

// not __restrict__: dinp and dout may be the same buffer
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    const GridStride chunks = grid_stride(N / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const x128 x = load128cs(inp + i);
        const x128 g = load128cs(dout + i);
        x128 result;
        for (int k = 0; k < x128::size; k++) {
            const float xk = (float)x[k];
            const float s = gelu_logistic(xk);
            const float du_dx = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC_COEFFICIENT * xk * xk);
            const float slope = s + 2.0f * xk * s * (1.0f - s) * du_dx;
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
