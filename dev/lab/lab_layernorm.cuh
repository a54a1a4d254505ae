/*
Kernel lab: layernorm forward, fused residual + layernorm forward, layernorm backward; and the same three for
RMSNorm (family "rmsnorm"), which the same kernels run without the centering and the bias.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/layernorm.cuh"

namespace layernorm_lab {

// the forward pass in double: out, mean, rstd for N rows of C
struct ForwardReference {
    std::vector<double> out, mean, rstd;
};

inline ForwardReference reference_forward(const std::vector<float>& x, const std::vector<float>& weight,
                                          const std::vector<float>& bias, int N, int C) {
    ForwardReference ref;
    ref.out.resize((size_t)N * C);
    ref.mean.resize(N);
    ref.rstd.resize(N);
    for (int row = 0; row < N; row++) {
        const float* xr = &x[(size_t)row * C];
        double sum = 0.0;
        for (int i = 0; i < C; i++) sum += xr[i];
        const double mean = sum / C;
        double squares = 0.0;
        for (int i = 0; i < C; i++) squares += (xr[i] - mean) * (xr[i] - mean);
        const double rstd = 1.0 / std::sqrt(squares / C + 1e-5);
        for (int i = 0; i < C; i++) ref.out[(size_t)row * C + i] = (xr[i] - mean) * rstd * weight[i] + bias[i];
        ref.mean[row] = mean;
        ref.rstd[row] = rstd;
    }
    return ref;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void check_forward(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    // an offset mean (inputs in [-1.5, 2.5]) so that a variance taken as E[x^2] - mean^2 would lose digits
    const std::vector<float> x = round_to_floatX(random_floats((size_t)N * C, -1.5f, 2.5f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const std::vector<float> bias = round_to_floatX(random_floats(C));
    const ForwardReference ref = reference_forward(x, weight, bias, N, C);

    DeviceBuffer<floatX> d_x(x.size()), d_weight(C), d_bias(C), d_out(x.size());
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    d_x.upload(x);
    d_weight.upload(weight);
    d_bias.upload(bias);
    d_out.poison();
    d_mean.poison();
    d_rstd.poison();
    layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_x.ptr, d_weight.ptr, d_bias.ptr, N, C, 0);
    cudaCheck(cudaDeviceSynchronize());

    // FP32: mean and rstd come from fp32 sums of C <= 1600 terms (error ~ sqrt(C) * 2^-24 relative,
    // ~1e-6) and rsqrtf (2 ulp); out = norm * w + b then adds a few roundings of 2^-24 on terms of size
    // <= 4: ~1e-6 absolute where norm * w and b cancel, hence atol 5e-6.
    // BF16: out is additionally rounded to bf16, 8 mantissa bits: up to 2^-9 relative; 2^-8 leaves room
    // for the fp32 error to push a value across a rounding boundary.
    check_close("layernorm_forward out" + shape, d_out.download(), ref.out, 5e-6, by_precision(1e-5, 1.0 / 256));
    // statistics are fp32 in both builds: a mean of size ~0.5 from an fp32 sum is good to ~1e-7
    // absolute; rstd = rsqrt of an fp32 variance, good to a few 2^-24 relative
    check_close("layernorm_forward mean" + shape, d_mean.download(), ref.mean, 1e-6, 1e-5);
    check_close("layernorm_forward rstd" + shape, d_rstd.download(), ref.rstd, 0.0, 1e-5);

    // mean and rstd may be omitted (inference): out must not change
    const std::vector<float> out_with_stats = d_out.download();
    d_out.poison();
    layernorm_forward(d_out.ptr, nullptr, nullptr, d_x.ptr, d_weight.ptr, d_bias.ptr, N, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_true("layernorm_forward without mean/rstd" + shape, same_bits(d_out.download(), out_with_stats),
               "same bits as with statistics");
}

inline void check_fused_residual(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const std::vector<float> inp1 = round_to_floatX(random_floats((size_t)N * C, -1.0f, 2.0f));
    const std::vector<float> inp2 = round_to_floatX(random_floats((size_t)N * C, -1.5f, 1.0f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const std::vector<float> bias = round_to_floatX(random_floats(C));
    // the residual is stored in floatX; the normalization sees the stored (rounded) values
    std::vector<float> residual(inp1.size());
    for (size_t i = 0; i < residual.size(); i++) residual[i] = (float)(floatX)(inp1[i] + inp2[i]);
    const ForwardReference ref = reference_forward(residual, weight, bias, N, C);

    DeviceBuffer<floatX> d_inp1(inp1.size()), d_inp2(inp2.size()), d_weight(C), d_bias(C);
    DeviceBuffer<floatX> d_residual(inp1.size()), d_normed(inp1.size());
    DeviceBuffer<float> d_mean(N), d_rstd(N);
    d_inp1.upload(inp1);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    d_bias.upload(bias);
    d_residual.poison();
    d_normed.poison();
    d_mean.poison();
    d_rstd.poison();
    fused_residual_layernorm_forward(d_residual.ptr, d_normed.ptr, d_mean.ptr, d_rstd.ptr, d_inp1.ptr, d_inp2.ptr,
                                     d_weight.ptr, d_bias.ptr, N, C, 0);
    cudaCheck(cudaDeviceSynchronize());

    // the residual is one fp32 addition rounded once to floatX, exactly what the reference did: same bits
    check_close("fused_residual residual" + shape, d_residual.download(), to_double(residual), 0.0, 0.0);
    // as for layernorm_forward (see check_forward)
    check_close("fused_residual normed" + shape, d_normed.download(), ref.out, 5e-6, by_precision(1e-5, 1.0 / 256));
    check_close("fused_residual mean" + shape, d_mean.download(), ref.mean, 1e-6, 1e-5);
    check_close("fused_residual rstd" + shape, d_rstd.download(), ref.rstd, 0.0, 1e-5);
}

inline void check_residual(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const std::vector<float> inp1 = round_to_floatX(random_floats((size_t)N * C, -1.0f, 2.0f));
    const std::vector<float> inp2 = round_to_floatX(random_floats((size_t)N * C, -1.5f, 1.0f));
    std::vector<double> sum(inp1.size());
    for (size_t i = 0; i < sum.size(); i++) sum[i] = (float)(floatX)(inp1[i] + inp2[i]);
    DeviceBuffer<floatX> d_inp1(inp1.size()), d_inp2(inp2.size()), d_out(inp1.size());
    d_inp1.upload(inp1);
    d_inp2.upload(inp2);
    d_out.poison();
    residual_forward(d_out.ptr, d_inp1.ptr, d_inp2.ptr, inp1.size(), 0);
    // one fp32 addition rounded once to floatX, as in the reference: same bits
    check_close("residual_forward" + shape, d_out.download(), sum, 0.0, 0.0);
}

inline void check_backward(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const std::vector<float> x = round_to_floatX(random_floats((size_t)N * C, -1.5f, 2.5f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * C));
    // non-zero starting gradients: all three outputs accumulate
    const std::vector<float> dinp_start = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> dweight_start = round_to_floatX(random_floats(C));
    const std::vector<float> dbias_start = round_to_floatX(random_floats(C));
    // the statistics the forward pass would have kept, as fp32 (what the kernel reads)
    const std::vector<float> unit_bias(C, 0.0f);
    const ForwardReference forward = reference_forward(x, weight, unit_bias, N, C);
    std::vector<float> mean(N), rstd(N);
    for (int row = 0; row < N; row++) {
        mean[row] = (float)forward.mean[row];
        rstd[row] = (float)forward.rstd[row];
    }

    std::vector<double> dinp_ref(dinp_start.begin(), dinp_start.end());
    std::vector<double> dweight_ref(dweight_start.begin(), dweight_start.end());
    std::vector<double> dbias_ref(dbias_start.begin(), dbias_start.end());
    std::vector<double> norm(C), dnorm(C);
    for (int row = 0; row < N; row++) {
        const size_t offset = (size_t)row * C;
        double sum_dnorm = 0.0, sum_dnorm_norm = 0.0;
        for (int i = 0; i < C; i++) {
            norm[i] = ((double)x[offset + i] - mean[row]) * rstd[row];
            dnorm[i] = (double)dout[offset + i] * weight[i];
            sum_dnorm += dnorm[i];
            sum_dnorm_norm += dnorm[i] * norm[i];
            dweight_ref[i] += dout[offset + i] * norm[i];
            dbias_ref[i] += dout[offset + i];
        }
        for (int i = 0; i < C; i++)
            dinp_ref[offset + i] += rstd[row] * (dnorm[i] - sum_dnorm / C - norm[i] * (sum_dnorm_norm / C));
    }

    DeviceBuffer<floatX> d_x(x.size()), d_weight(C), d_dout(dout.size());
    DeviceBuffer<floatX> d_dinp(x.size()), d_dweight(C), d_dbias(C);
    DeviceBuffer<float> d_mean(N), d_rstd(N), d_scratch(layernorm_backward_scratch_floats(N, C));
    d_x.upload(x);
    d_weight.upload(weight);
    d_dout.upload(dout);
    d_mean.upload(mean);
    d_rstd.upload(rstd);
    auto run = [&]() {
        d_dinp.upload(dinp_start);
        d_dweight.upload(dweight_start);
        d_dbias.upload(dbias_start);
        d_scratch.poison();  // the kernel must write every partial sum it later adds
        layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_x.ptr, d_weight.ptr,
                           d_mean.ptr, d_rstd.ptr, N, C, 0);
        cudaCheck(cudaDeviceSynchronize());
    };
    run();
    const std::vector<float> dinp = d_dinp.download(), dweight = d_dweight.download(), dbias = d_dbias.download();

    // dinp: FP32 sums over C terms (relative ~sqrt(C) * 2^-24) of values ~1, times rstd ~1, plus the
    // starting value: ~1e-6 absolute where the terms cancel, hence atol 5e-6.
    // BF16: the accumulated result is rounded to bf16, 2^-9 relative; 2^-8 leaves room for the fp32
    // error near rounding boundaries.
    check_close("layernorm_backward dinp (+=)" + shape, dinp, dinp_ref, 5e-6, by_precision(1e-5, 1.0 / 256));
    // dweight/dbias: fp32 sums of N terms of size ~1 (block partials, then N/8-row warp sums): the
    // error grows like sqrt(N) * 2^-24 * |sum|; 1e-4 absolute covers N = 1024 with a wide margin.
    // BF16 adds the final rounding of the accumulated value, 2^-9 relative.
    check_close("layernorm_backward dweight (+=)" + shape, dweight, dweight_ref, 1e-4, by_precision(1e-5, 1.0 / 256));
    check_close("layernorm_backward dbias (+=)" + shape, dbias, dbias_ref, 1e-4, by_precision(1e-5, 1.0 / 256));

    run();
    check_true("layernorm_backward deterministic" + shape,
               same_bits(dinp, d_dinp.download()) && same_bits(dweight, d_dweight.download()) &&
                   same_bits(dbias, d_dbias.download()),
               "two runs, same bits in dinp, dweight, dbias");
}

inline void bench(int N, int C, const std::string& note) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C) + note;
    DeviceBuffer<floatX> a((size_t)N * C), b((size_t)N * C), c((size_t)N * C), d((size_t)N * C), weight(C), bias(C),
        dweight(C), dbias(C);
    DeviceBuffer<float> mean(N), rstd(N), scratch(layernorm_backward_scratch_floats(N, C));
    a.upload(random_floats(a.count));
    b.upload(random_floats(b.count));
    c.upload(random_floats(c.count));
    weight.upload(random_floats(C));
    bias.upload(random_floats(C));
    dweight.upload(random_floats(C));
    dbias.upload(random_floats(C));
    const double elements = (double)N * C;
    const double row_stats = (double)N * 2 * sizeof(float);

    double ms = time_ms([&] { layernorm_forward(d.ptr, mean.ptr, rstd.ptr, a.ptr, weight.ptr, bias.ptr, N, C, 0); });
    report_bench("layernorm_forward" + shape, ms, 2 * elements * sizeof(floatX) + row_stats, 0);

    ms = time_ms([&] {
        fused_residual_layernorm_forward(c.ptr, d.ptr, mean.ptr, rstd.ptr, a.ptr, b.ptr, weight.ptr, bias.ptr, N, C, 0);
    });
    report_bench("fused_residual_layernorm_forward" + shape, ms, 4 * elements * sizeof(floatX) + row_stats, 0);

    // the accumulated dinp grows with every repeat; harmless for timing
    ms = time_ms([&] {
        layernorm_backward(c.ptr, dweight.ptr, dbias.ptr, scratch.ptr, b.ptr, a.ptr, weight.ptr, mean.ptr, rstd.ptr, N,
                           C, 0);
    });
    // reads dout, inp, dinp; writes dinp; plus the partial sums written and read once
    report_bench("layernorm_backward" + shape, ms,
                 4 * elements * sizeof(floatX) + row_stats + 2.0 * scratch.count * sizeof(float), 0);
}

// ----------------------------------------------------------------------------
// RMSNorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + epsilon)

// the forward pass in double: out and rstd for N rows of C
inline ForwardReference reference_rms_forward(const std::vector<float>& x, const std::vector<float>& weight, int N,
                                              int C, double epsilon) {
    ForwardReference ref;
    ref.out.resize((size_t)N * C);
    ref.rstd.resize(N);
    for (int row = 0; row < N; row++) {
        const float* xr = &x[(size_t)row * C];
        double squares = 0.0;
        for (int i = 0; i < C; i++) squares += (double)xr[i] * xr[i];
        const double rstd = 1.0 / std::sqrt(squares / C + epsilon);
        for (int i = 0; i < C; i++) ref.out[(size_t)row * C + i] = xr[i] * rstd * weight[i];
        ref.rstd[row] = rstd;
    }
    return ref;
}

// epsilon 1e-5 (Llama 3's) and 1e-6 (Llama 2's): the kernel must use the one it is given
inline void check_rms_forward(int N, int C, float epsilon) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C) + " eps=" + std::to_string(epsilon);
    // a row of small values makes epsilon matter: rows of [-0.01, 0.01] have mean(x^2) ~ 3e-5
    std::vector<float> x = round_to_floatX(random_floats((size_t)N * C, -1.5f, 2.5f));
    const std::vector<float> small = round_to_floatX(random_floats(C, -0.01f, 0.01f));
    std::copy(small.begin(), small.end(), x.begin());
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const ForwardReference ref = reference_rms_forward(x, weight, N, C, epsilon);

    DeviceBuffer<floatX> d_x(x.size()), d_weight(C), d_out(x.size());
    DeviceBuffer<float> d_rstd(N);
    d_x.upload(x);
    d_weight.upload(weight);
    d_out.poison();
    d_rstd.poison();
    rmsnorm_forward(d_out.ptr, d_rstd.ptr, d_x.ptr, d_weight.ptr, N, C, epsilon, 0);
    cudaCheck(cudaDeviceSynchronize());
    // as layernorm_forward's (check_forward): fp32 sums of C squares, rsqrtf, a few roundings of 2^-24 on terms
    // of size <= 4 (FP32); the output rounded to bf16 (BF16)
    check_close("rmsnorm_forward out" + shape, d_out.download(), ref.out, 5e-6, by_precision(1e-5, 1.0 / 256));
    check_close("rmsnorm_forward rstd" + shape, d_rstd.download(), ref.rstd, 0.0, 1e-5);

    const std::vector<float> out_with_rstd = d_out.download();
    d_out.poison();
    rmsnorm_forward(d_out.ptr, nullptr, d_x.ptr, d_weight.ptr, N, C, epsilon, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_true("rmsnorm_forward without rstd" + shape, same_bits(d_out.download(), out_with_rstd),
               "same bits as with it");
}

inline void check_rms_fused_residual(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const float epsilon = 1e-5f;
    const std::vector<float> inp1 = round_to_floatX(random_floats((size_t)N * C, -1.0f, 2.0f));
    const std::vector<float> inp2 = round_to_floatX(random_floats((size_t)N * C, -1.5f, 1.0f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    std::vector<float> residual(inp1.size());
    for (size_t i = 0; i < residual.size(); i++) residual[i] = (float)(floatX)(inp1[i] + inp2[i]);
    const ForwardReference ref = reference_rms_forward(residual, weight, N, C, epsilon);

    DeviceBuffer<floatX> d_inp1(inp1.size()), d_inp2(inp2.size()), d_weight(C);
    DeviceBuffer<floatX> d_residual(inp1.size()), d_normed(inp1.size());
    DeviceBuffer<float> d_rstd(N);
    d_inp1.upload(inp1);
    d_inp2.upload(inp2);
    d_weight.upload(weight);
    d_residual.poison();
    d_normed.poison();
    d_rstd.poison();
    fused_residual_rmsnorm_forward(d_residual.ptr, d_normed.ptr, d_rstd.ptr, d_inp1.ptr, d_inp2.ptr, d_weight.ptr, N, C,
                                   epsilon, 0);
    cudaCheck(cudaDeviceSynchronize());
    // as check_fused_residual's: the residual the same bits, the rest as the forward pass
    check_close("fused_residual_rmsnorm residual" + shape, d_residual.download(), to_double(residual), 0.0, 0.0);
    check_close("fused_residual_rmsnorm normed" + shape, d_normed.download(), ref.out, 5e-6,
                by_precision(1e-5, 1.0 / 256));
    check_close("fused_residual_rmsnorm rstd" + shape, d_rstd.download(), ref.rstd, 0.0, 1e-5);
}

inline void check_rms_backward(int N, int C) {
    const std::string shape = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const float epsilon = 1e-5f;
    const std::vector<float> x = round_to_floatX(random_floats((size_t)N * C, -1.5f, 2.5f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * C));
    // non-zero starting gradients: both outputs accumulate
    const std::vector<float> dinp_start = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> dweight_start = round_to_floatX(random_floats(C));
    const ForwardReference forward = reference_rms_forward(x, weight, N, C, epsilon);
    std::vector<float> rstd(N);
    for (int row = 0; row < N; row++) rstd[row] = (float)forward.rstd[row];

    // the chain rule in double, from the definition: y_i = x_i r w_i with r = (mean_j x_j^2 + eps)^(-1/2), so
    // dr/dx_i = -r^3 x_i / C and dL/dx_i = r w_i g_i - (r^3 x_i / C) sum_j w_j g_j x_j
    std::vector<double> dinp_ref(dinp_start.begin(), dinp_start.end());
    std::vector<double> dweight_ref(dweight_start.begin(), dweight_start.end());
    for (int row = 0; row < N; row++) {
        const size_t offset = (size_t)row * C;
        const double r = rstd[row];
        double sum = 0.0;
        for (int j = 0; j < C; j++) sum += (double)weight[j] * dout[offset + j] * x[offset + j];
        for (int i = 0; i < C; i++) {
            dinp_ref[offset + i] += r * weight[i] * dout[offset + i] - r * r * r * x[offset + i] / C * sum;
            dweight_ref[i] += (double)dout[offset + i] * x[offset + i] * r;
        }
    }

    DeviceBuffer<floatX> d_x(x.size()), d_weight(C), d_dout(dout.size()), d_dinp(x.size()), d_dweight(C);
    DeviceBuffer<float> d_rstd(N), d_scratch(layernorm_backward_scratch_floats(N, C));
    d_x.upload(x);
    d_weight.upload(weight);
    d_dout.upload(dout);
    d_rstd.upload(rstd);
    auto run = [&]() {
        d_dinp.upload(dinp_start);
        d_dweight.upload(dweight_start);
        d_scratch.poison();  // the kernel must write every partial sum it later adds
        rmsnorm_backward(d_dinp.ptr, d_dweight.ptr, d_scratch.ptr, d_dout.ptr, d_x.ptr, d_weight.ptr, d_rstd.ptr, N, C,
                         0);
        cudaCheck(cudaDeviceSynchronize());
    };
    run();
    const std::vector<float> dinp = d_dinp.download(), dweight = d_dweight.download();
    // as layernorm_backward's (check_backward): fp32 sums over C terms for dinp, over N rows for dweight
    check_close("rmsnorm_backward dinp (+=)" + shape, dinp, dinp_ref, 5e-6, by_precision(1e-5, 1.0 / 256));
    check_close("rmsnorm_backward dweight (+=)" + shape, dweight, dweight_ref, 1e-4, by_precision(1e-5, 1.0 / 256));
    run();
    check_true("rmsnorm_backward deterministic" + shape,
               same_bits(dinp, d_dinp.download()) && same_bits(dweight, d_dweight.download()),
               "two runs, same bits in dinp, dweight");
}

#ifdef LLMC_CPU
// The column bands of the backward pass change no bit (llmc/kernels/layernorm.cuh, "Width"): the same inputs
// under the H100's limits and the A100's, at a width where the two split the columns into different numbers
// of bands, give the same dinp, dweight and dbias.
inline void check_bands_change_no_bit(Norm norm, int N, int C) {
    const bool layer = norm == Norm::Layer;
    const std::string name = std::string(layer ? "layernorm" : "rmsnorm") + "_backward N=" + std::to_string(N) +
                             " C=" + std::to_string(C) + ": the H100's bands and the A100's give the same bits";
    const std::vector<float> x = round_to_floatX(random_floats((size_t)N * C, -1.5f, 2.5f));
    const std::vector<float> weight = round_to_floatX(random_floats(C, -1.5f, 1.5f));
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> dinp_start = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> dweight_start = round_to_floatX(random_floats(C));
    const ForwardReference forward = layer ? reference_forward(x, weight, std::vector<float>(C, 0.0f), N, C)
                                           : reference_rms_forward(x, weight, N, C, 1e-5);
    const std::vector<float> mean(forward.mean.begin(), forward.mean.end());  // empty for RMSNorm
    const std::vector<float> rstd(forward.rstd.begin(), forward.rstd.end());

    DeviceBuffer<floatX> d_x(x.size()), d_weight(C), d_dout(dout.size()), d_dinp(x.size()), d_dweight(C), d_dbias(C);
    DeviceBuffer<float> d_mean(N), d_rstd(N), d_scratch(layernorm_backward_scratch_floats(N, C));
    d_x.upload(x);
    d_weight.upload(weight);
    d_dout.upload(dout);
    if (layer) d_mean.upload(mean);
    d_rstd.upload(rstd);
    // every output, one after the other, as computed under `gpu`'s limits; *bands: how many it used
    auto outputs_under = [&](const cudacpu::EmulatedGpu& gpu, int* bands) {
        cudacpu::set_emulated_gpu(gpu);
        *bands = norm_backward_bands(C, norm).count;
        d_dinp.upload(dinp_start);
        d_dweight.upload(dweight_start);
        d_dbias.upload(dweight_start);
        d_scratch.poison();
        if (layer)
            layernorm_backward(d_dinp.ptr, d_dweight.ptr, d_dbias.ptr, d_scratch.ptr, d_dout.ptr, d_x.ptr, d_weight.ptr,
                               d_mean.ptr, d_rstd.ptr, N, C, 0);
        else
            rmsnorm_backward(d_dinp.ptr, d_dweight.ptr, d_scratch.ptr, d_dout.ptr, d_x.ptr, d_weight.ptr, d_rstd.ptr,
                             N, C, 0);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> all = d_dinp.download();
        for (const DeviceBuffer<floatX>* b : {&d_dweight, &d_dbias}) {
            const std::vector<float> part = b->download();
            all.insert(all.end(), part.begin(), part.end());
        }
        return all;
    };
    const cudacpu::EmulatedGpu& chosen = cudacpu::emulated_gpu();
    int h100_bands = 0, a100_bands = 0;
    const std::vector<float> h100 = outputs_under(cudacpu::kH100, &h100_bands);
    const std::vector<float> a100 = outputs_under(cudacpu::kA100, &a100_bands);
    cudacpu::set_emulated_gpu(chosen);
    // different band counts, or the check would compare a split with itself
    check_true(name, h100_bands != a100_bands && same_bits(h100, a100),
               std::to_string(h100_bands) + " and " + std::to_string(a100_bands) + " bands");
}
#endif

}  // namespace layernorm_lab

void lab_layernorm() {
    if (!family_selected("layernorm")) return;
#ifdef LLMC_CPU
    // At C=768 the backward kernel asks for exactly the 48 KiB a kernel gets without opting in: it must opt
    // in anyway, or one static __shared__ variable more would make the launch fail on a GPU. (The CPU
    // device records each kernel's opt-in; it cannot see static shared memory.) First, before a wider C has
    // opted in for more.
    {
        const int N = 37, C = 768;
        const size_t bytes = (size_t)LAYERNORM_WARPS_PER_BLOCK * 2 * layernorm_slice_width(C) * sizeof(float);
        DeviceBuffer<floatX> x((size_t)N * C), dx((size_t)N * C), weight(C), dweight(C), dbias(C);
        DeviceBuffer<float> mean(N), rstd(N), scratch(layernorm_backward_scratch_floats(N, C));
        for (DeviceBuffer<floatX>* b : {&x, &dx, &weight, &dweight, &dbias}) b->zero();
        mean.zero();
        rstd.zero();
        layernorm_backward(dx.ptr, dweight.ptr, dbias.ptr, scratch.ptr, x.ptr, x.ptr, weight.ptr, mean.ptr, rstd.ptr,
                           N, C, 0);
        const auto& limits = cudacpu::shared_memory_limits();
        const auto opted = limits.find(reinterpret_cast<const void*>(layernorm_backward_kernel));
        check_true("layernorm_backward opts in at C=768 (48 KiB)", opted != limits.end() && opted->second >= bytes,
                   opted == limits.end() ? "no opt-in" : std::to_string(opted->second) + " bytes");
    }
#endif
    // rows: 37 and 5 are not multiples of the 8 rows a block takes (5 leaves warps idle);
    // widths: 64 and 200 fill less than one 32-lane pass of 16-byte chunks, 1600 ends in a partial pass,
    // 768 is GPT-2 124M's; the backward pass's shared memory is 48 KiB at 768, 112 KiB at 1600 and 128 KiB
    // at 2048 (more than a kernel gets without opting in); 16384 takes 5 column bands on an H100, 7 on an
    // A100, the last one narrower
    struct Shape { int N, C; };
    const Shape shapes[] = {{37, 64}, {37, 200}, {5, 1600}, {37, 2048}, {37, 768}, {1024, 768}, {3, 16384}};
    for (const Shape& s : shapes) {
        layernorm_lab::check_forward(s.N, s.C);
        layernorm_lab::check_fused_residual(s.N, s.C);
        layernorm_lab::check_residual(s.N, s.C);
        layernorm_lab::check_backward(s.N, s.C);
    }
#ifdef LLMC_CPU
    layernorm_lab::check_bands_change_no_bit(Norm::Layer, 21, 3072);  // one band on an H100, two on an A100
#endif
    if (lab.bench) {
#ifdef LLMC_CPU
        layernorm_lab::bench(1024, 768, " (CPU: B*T=1024)");
#else
        layernorm_lab::bench(8 * 1024, 768, "");
#endif
    }
}

void lab_rmsnorm() {
    if (!family_selected("rmsnorm")) return;
    // the shapes of lab_layernorm, and Llama 3 8B's width, 4096: there the backward pass's shared memory is
    // 128 KiB, one column sum per warp (layernorm's two take two column bands); 16384, Llama 3 405B's, takes
    // 3 bands on an H100
    struct Shape { int N, C; };
    const Shape shapes[] = {{37, 64}, {37, 200}, {5, 1600}, {37, 2048}, {37, 768}, {1024, 768}, {9, 4096}, {3, 16384}};
    for (const Shape& s : shapes) {
        layernorm_lab::check_rms_forward(s.N, s.C, 1e-5f);
        layernorm_lab::check_rms_fused_residual(s.N, s.C);
        layernorm_lab::check_rms_backward(s.N, s.C);
    }
#ifdef LLMC_CPU
    layernorm_lab::check_bands_change_no_bit(Norm::RMS, 21, 6144);  // one band on an H100, two on an A100
#endif
    layernorm_lab::check_rms_forward(37, 768, 1e-6f);
}
