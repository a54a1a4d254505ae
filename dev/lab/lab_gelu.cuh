/*
Kernel lab: GELU (tanh approximation) forward and backward, the backward also in place.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/gelu.cuh"

namespace gelu_lab {

inline double reference_gelu(double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
}
inline double reference_gelu_slope(double x) {
    const double s = std::sqrt(2.0 / M_PI);
    const double tanh_u = std::tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + tanh_u) + 0.5 * x * (1.0 - tanh_u * tanh_u) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

inline void check(size_t N) {
    const std::string shape = " N=" + std::to_string(N);
    // [-6, 6] reaches both tails, where 1 + tanh(u) cancels (x < 0) and the slope crosses zero
    const std::vector<float> x = round_to_floatX(random_floats(N, -6.0f, 6.0f));
    const std::vector<float> dout = round_to_floatX(random_floats(N));
    std::vector<double> out_ref(N), dinp_ref(N);
    for (size_t i = 0; i < N; i++) {
        out_ref[i] = reference_gelu(x[i]);
        dinp_ref[i] = reference_gelu_slope(x[i]) * dout[i];
    }
    DeviceBuffer<floatX> d_x(N), d_dout(N), d_out(N), d_dinp(N);
    d_x.upload(x);
    d_dout.upload(dout);
    d_out.poison();
    d_dinp.poison();
    gelu_forward(d_out.ptr, d_x.ptr, N, 0);
    gelu_backward(d_dinp.ptr, d_x.ptr, d_dout.ptr, N, 0);
    cudaCheck(cudaDeviceSynchronize());
    // FP32: a handful of fp32 operations and tanhf (within 2 ulp) on values of size <= 6: ~1e-6
    // relative. For x < -3, 1 + tanh(u) cancels: tanh(u) is near -1, where its absolute error is up to
    // 2 ulp = 1.2e-7, so gelu's absolute error is up to 0.5|x| * 1.2e-7 < 1e-6, and the slope's up to
    // |0.5 - x tanh(u) sqrt(2/pi)(1 + 3*0.044715 x^2)| * 1.2e-7 ~ 28 * 1.2e-7 < 4e-6 (times |dout| <= 1).
    // BF16: the result is rounded to 8 mantissa bits, 2^-9 relative (2^-8 for margin).
    const double rtol = by_precision(1e-5, 1.0 / 256);
    const double forward_atol = 1e-6, backward_atol = 4e-6;
    check_close("gelu_forward out" + shape, d_out.download(), out_ref, forward_atol, rtol);
    check_close("gelu_backward dinp" + shape, d_dinp.download(), dinp_ref, backward_atol, rtol);

    // in place: dinp is the dout buffer
    gelu_backward(d_dout.ptr, d_x.ptr, d_dout.ptr, N, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_close("gelu_backward in place (dinp == dout)" + shape, d_dout.download(), dinp_ref, backward_atol, rtol);
}

inline void bench(size_t N, const std::string& note) {
    const std::string shape = " N=" + std::to_string(N) + note;
    DeviceBuffer<floatX> x(N), g(N), y(N);
    x.upload(random_floats(N, -4.0f, 4.0f));
    g.upload(random_floats(N));
    double ms = time_ms([&] { gelu_forward(y.ptr, x.ptr, N, 0); });
    report_bench("gelu_forward" + shape, ms, 2.0 * N * sizeof(floatX), 0);
    ms = time_ms([&] { gelu_backward(y.ptr, x.ptr, g.ptr, N, 0); });
    report_bench("gelu_backward" + shape, ms, 3.0 * N * sizeof(floatX), 0);
}

}  // namespace gelu_lab

void lab_gelu() {
    if (!family_selected("gelu")) return;
    gelu_lab::check(8);                // one chunk in BF16, two in FP32
    gelu_lab::check(8 * 37);           // fewer chunks than one block's threads
    gelu_lab::check(3072 * 37 + 8);    // grid-stride loop wraps, with a ragged last pass
    gelu_lab::check(4 * 768 * 128);    // GPT-2 124M's MLP width (4C = 3072) for 128 tokens
    if (lab.bench) {
#ifdef LLMC_CPU
        gelu_lab::bench((size_t)1024 * 3072, " (CPU: B*T=1024)");
#else
        gelu_lab::bench((size_t)8 * 1024 * 3072, "");
#endif
    }
}
