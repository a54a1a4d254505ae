/*
Kernel lab: SwiGLU forward and backward, on rows of gate and up-projection halves.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/swiglu.cuh"

namespace swiglu_lab {

inline double reference_silu(double g) { return g / (1.0 + std::exp(-g)); }

inline void check(int N, int H) {
    const std::string shape = " N=" + std::to_string(N) + " H=" + std::to_string(H);
    // gates in [-20, 20] reach both tails (s near 0, where exp(-g) is huge, and near 1)
    const std::vector<float> inp = round_to_floatX(random_floats((size_t)N * 2 * H, -20.0f, 20.0f));
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * H));
    std::vector<double> out_ref((size_t)N * H), dinp_ref((size_t)N * 2 * H);
    for (int row = 0; row < N; row++)
        for (int j = 0; j < H; j++) {
            const double g = inp[(size_t)row * 2 * H + j], u = inp[(size_t)row * 2 * H + H + j];
            const double d = dout[(size_t)row * H + j];
            // silu'(g) by the quotient rule on g / (1 + e^-g), independent of the kernel's s (1 + g (1 - s))
            const double e = std::exp(-g), slope = (1.0 + e + g * e) / ((1.0 + e) * (1.0 + e));
            out_ref[(size_t)row * H + j] = reference_silu(g) * u;
            dinp_ref[(size_t)row * 2 * H + j] = d * u * slope;
            dinp_ref[(size_t)row * 2 * H + H + j] = d * reference_silu(g);
        }
    DeviceBuffer<floatX> d_inp(inp.size()), d_dout(dout.size()), d_out(out_ref.size()), d_dinp(dinp_ref.size());
    d_inp.upload(inp);
    d_dout.upload(dout);
    d_out.poison();
    d_dinp.poison();
    swiglu_forward(d_out.ptr, d_inp.ptr, N, H, 0);
    swiglu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, N, H, 0);
    cudaCheck(cudaDeviceSynchronize());
    // FP32: expf within 2 ulp and a few fp32 products: ~1e-6 relative. Outputs reach |g u| <= 400, so a
    // relative bound; near zero (g s u small) a few 2^-24 of the terms, hence atol 1e-6.
    // BF16: the result rounded to 8 mantissa bits, 2^-9 relative (2^-8 for margin).
    const double rtol = by_precision(1e-5, 1.0 / 256);
    check_close("swiglu_forward out" + shape, d_out.download(), out_ref, 1e-6, rtol);
    check_close("swiglu_backward dinp (gate, up)" + shape, d_dinp.download(), dinp_ref, 1e-6, rtol);
}

}  // namespace swiglu_lab

void lab_swiglu() {
    if (!family_selected("swiglu")) return;
    // H: one 16-byte chunk per row (8 in BF16, so 8), widths that end rows mid-pass, Llama 3 8B's 14336
    for (int N : {1, 37})
        for (int H : {8, 200, 1024, 14336}) swiglu_lab::check(N, H);
}
