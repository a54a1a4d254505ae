/*
Kernel lab: fused causal attention (llmc/attention.cuh), forward and backward.

The reference forms each head's full T x T probability matrix in double precision (fine on the host at
these sizes) and follows the textbook formulas, so it shares nothing with the kernels' tiling or online
softmax. The backward pass is checked on its own: it gets the reference forward's out and lse as inputs
(out rounded to floatX, as the kernel would store it), so a forward error cannot hide or cause a backward one.
*/
#pragma once

#include "lab.h"
#include "../llmc/attention.cuh"

// ----------------------------------------------------------------------------
// reference

// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C)
// magnitude: the sum of the absolute terms behind each output, sum_j P[i][j] |V[j]| (what bounds the error
// of rounding P to bf16 before its product with V)
inline void attention_forward_reference(const std::vector<float>& qkv, int B, int T, int NH, int HS,
                                        std::vector<double>& out, std::vector<double>& lse,
                                        std::vector<double>& magnitude) {
    const int C = NH * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    out.assign((size_t)B * T * C, 0.0);
    magnitude.assign((size_t)B * T * C, 0.0);
    lse.assign((size_t)B * NH * T, 0.0);
    std::vector<double> scores(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const float* q = &qkv[((size_t)b * T + i) * 3 * C + h * HS];
                double max_score = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const float* k = &qkv[((size_t)b * T + j) * 3 * C + C + h * HS];
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
                    scores[j] = scale * dot;
                    max_score = std::max(max_score, scores[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(scores[j] - max_score);
                double* o = &out[((size_t)b * T + i) * C + h * HS];
                double* m = &magnitude[((size_t)b * T + i) * C + h * HS];
                for (int j = 0; j <= i; j++) {
                    const double p = std::exp(scores[j] - max_score) / sum;
                    const float* v = &qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS];
                    for (int d = 0; d < HS; d++) {
                        o[d] += p * v[d];
                        m[d] += p * std::fabs(v[d]);
                    }
                }
                lse[((size_t)b * NH + h) * T + i] = max_score + std::log(sum);
            }
}

// dqkv (B, T, 3C) from dout (B, T, C); `out` is the forward output as the backward kernel sees it (floatX),
// used only for D = dout . out, exactly like the kernel. magnitude: the sums of absolute terms behind each
// gradient (scale sum |dS| |K| for dQ, scale sum |dS| |Q| for dK, sum P |dO| for dV).
inline void attention_backward_reference(const std::vector<float>& qkv, const std::vector<float>& dout,
                                         const std::vector<float>& out, int B, int T, int NH, int HS,
                                         std::vector<double>& dqkv, std::vector<double>& magnitude) {
    const int C = NH * HS;
    const double scale = 1.0 / std::sqrt((double)HS);
    dqkv.assign((size_t)B * T * 3 * C, 0.0);
    magnitude.assign((size_t)B * T * 3 * C, 0.0);
    std::vector<double> P((size_t)T * T), dS((size_t)T * T);
    auto q_at = [&](int b, int t) { return &qkv[((size_t)b * T + t) * 3 * C]; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int head = h * HS;
            // P, the full causal softmax matrix of this head
            for (int i = 0; i < T; i++) {
                double max_score = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += (double)q_at(b, i)[head + d] * q_at(b, j)[C + head + d];
                    P[(size_t)i * T + j] = scale * dot;
                    max_score = std::max(max_score, scale * dot);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(P[(size_t)i * T + j] - max_score);
                for (int j = 0; j <= i; j++) P[(size_t)i * T + j] = std::exp(P[(size_t)i * T + j] - max_score) / sum;
            }
            // dS = P * (dP - D), with dP = dO V^T and D = dO . O
            for (int i = 0; i < T; i++) {
                const float* g = &dout[((size_t)b * T + i) * C + head];
                const float* o = &out[((size_t)b * T + i) * C + head];
                double D = 0.0;
                for (int d = 0; d < HS; d++) D += (double)g[d] * o[d];
                for (int j = 0; j <= i; j++) {
                    double dP = 0.0;
                    for (int d = 0; d < HS; d++) dP += (double)g[d] * q_at(b, j)[2 * C + head + d];
                    dS[(size_t)i * T + j] = P[(size_t)i * T + j] * (dP - D);
                }
            }
            // dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO
            for (int i = 0; i < T; i++)
                for (int j = 0; j <= i; j++) {
                    const double p = P[(size_t)i * T + j], ds = dS[(size_t)i * T + j];
                    const float* g = &dout[((size_t)b * T + i) * C + head];
                    double* dq = &dqkv[((size_t)b * T + i) * 3 * C + head];
                    double* dk = &dqkv[((size_t)b * T + j) * 3 * C + C + head];
                    double* dv = &dqkv[((size_t)b * T + j) * 3 * C + 2 * C + head];
                    double* mq = &magnitude[((size_t)b * T + i) * 3 * C + head];
                    double* mk = &magnitude[((size_t)b * T + j) * 3 * C + C + head];
                    double* mv = &magnitude[((size_t)b * T + j) * 3 * C + 2 * C + head];
                    for (int d = 0; d < HS; d++) {
                        dq[d] += scale * ds * q_at(b, j)[C + head + d];
                        dk[d] += scale * ds * q_at(b, i)[head + d];
                        dv[d] += p * g[d];
                        mq[d] += scale * std::fabs(ds * q_at(b, j)[C + head + d]);
                        mk[d] += scale * std::fabs(ds * q_at(b, i)[head + d]);
                        mv[d] += p * std::fabs(g[d]);
                    }
                }
        }
}

// columns [part*C, (part+1)*C) of a (rows, 3C) matrix: part 0 = q, 1 = k, 2 = v
template <class T>
std::vector<T> attention_qkv_part(const std::vector<T>& qkv, int C, int part) {
    const size_t rows = qkv.size() / (3 * (size_t)C);
    std::vector<T> slice(rows * C);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) slice[r * C + c] = qkv[r * 3 * C + (size_t)part * C + c];
    return slice;
}

// qkv with q and k in [-3, 3] (scaled scores with a standard deviation of about 3, so the softmax is peaked
// and the running maximum really moves from tile to tile) and v in [-1, 1]; rounded to floatX
inline std::vector<float> attention_random_qkv(int B, int T, int C) {
    std::vector<float> qkv = random_floats((size_t)B * T * 3 * C);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < 2 * C; c++) qkv[r * 3 * C + c] *= 3.0f;
    return round_to_floatX(qkv);
}

// ----------------------------------------------------------------------------
// checks

inline void lab_attention_shape(int B, int T, int NH, int HS, bool check_determinism) {
    const int C = NH * HS;
    char shape[96];
    snprintf(shape, sizeof(shape), "(B=%d T=%d NH=%d HS=%d)", B, T, NH, HS);

    const std::vector<float> qkv = attention_random_qkv(B, T, C);
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)B * T * C));
    std::vector<double> out_ref, lse_ref, dqkv_ref, out_magnitude, dqkv_magnitude;
    attention_forward_reference(qkv, B, T, NH, HS, out_ref, lse_ref, out_magnitude);
    // what the backward kernel gets as its forward inputs: out stored as floatX, lse as fp32
    std::vector<float> out_seen(out_ref.begin(), out_ref.end());
    out_seen = round_to_floatX(out_seen);
    const std::vector<float> lse_seen(lse_ref.begin(), lse_ref.end());
    attention_backward_reference(qkv, dout, out_seen, B, T, NH, HS, dqkv_ref, dqkv_magnitude);

    DeviceBuffer<floatX> qkv_d((size_t)B * T * 3 * C), out_d((size_t)B * T * C), dout_d((size_t)B * T * C);
    DeviceBuffer<floatX> dqkv_d((size_t)B * T * 3 * C);
    DeviceBuffer<float> lse_d((size_t)B * NH * T), workspace_d((size_t)B * NH * T);
    qkv_d.upload(qkv);
    dout_d.upload(dout);

    // Tolerances. FP32 (llmc/attention_cuda_cores.cuh): everything is fp32; scores, exp and sums over at most
    // T = 256 terms of size ~1 lose a few units of 2^-24 each, i.e. ~1e-6 absolute on outputs and gradients of
    // size ~1 (the exp of a score near 10 amplifies its relative error by 10): 2e-5 absolute + 1e-4 relative.
    // BF16 (llmc/attention_tensor_cores.cuh): the reference sees the same rounded inputs, and two roundings
    // remain. The result is stored in bf16 (8 mantissa bits: up to 2^-9 = 2e-3 relative; 4e-3 leaves a factor
    // 2). And P (or dS) is rounded to bf16 before its tensor-core product, which moves each term of the sum
    // by up to 2^-9 of its size: the output can be off by 2^-9 times the sum of the absolute terms (the
    // reference's magnitude), which can exceed the output itself when terms cancel. We allow 2^-8 times
    // that sum. lse stays fp32 in both builds: 2e-5 absolute + 1e-5 relative.
    const double atol = by_precision(2e-5, 2e-5), rtol = by_precision(1e-4, 4e-3);
    const double rounded_terms_tol = by_precision(0.0, 1.0 / 256);
    auto allowance = [&](const std::vector<double>& magnitude) {
        std::vector<double> allowed(magnitude.size());
        for (size_t i = 0; i < magnitude.size(); i++) allowed[i] = rounded_terms_tol * magnitude[i];
        return allowed;
    };

    // forward
    out_d.poison();
    lse_d.poison();
    attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, C, NH, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> out_got = out_d.download();
    check_close(std::string("attention_forward out ") + shape, out_got, out_ref, atol, rtol, allowance(out_magnitude));
    check_close(std::string("attention_forward lse ") + shape, lse_d.download(), lse_ref, 2e-5, 1e-5);
    if (check_determinism) {
        out_d.poison();
        attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, C, NH, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> again = out_d.download();
        check_true(std::string("attention_forward deterministic ") + shape,
                   memcmp(again.data(), out_got.data(), again.size() * sizeof(float)) == 0, "two runs, same bits");
    }

    // backward, on the reference forward's out and lse
    out_d.upload(out_seen);
    lse_d.upload(lse_seen);
    dqkv_d.poison();
    workspace_d.poison();
    attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, C, NH, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> dqkv_got = dqkv_d.download();
    const char* part_names[3] = {"dq", "dk", "dv"};
    const std::vector<double> dqkv_allowed = allowance(dqkv_magnitude);
    for (int part = 0; part < 3; part++)
        check_close(std::string("attention_backward ") + part_names[part] + " " + shape,
                    attention_qkv_part(dqkv_got, C, part), attention_qkv_part(dqkv_ref, C, part), atol, rtol,
                    attention_qkv_part(dqkv_allowed, C, part));
    if (check_determinism) {
        dqkv_d.poison();
        workspace_d.poison();
        attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, C, NH, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> again = dqkv_d.download();
        check_true(std::string("attention_backward deterministic ") + shape,
                   memcmp(again.data(), dqkv_got.data(), again.size() * sizeof(float)) == 0, "two runs, same bits");
    }
}

inline void lab_attention_bench(int B, int T, int NH, int HS, const char* label) {
    const int C = NH * HS;
    DeviceBuffer<floatX> qkv_d((size_t)B * T * 3 * C), out_d((size_t)B * T * C), dout_d((size_t)B * T * C);
    DeviceBuffer<floatX> dqkv_d((size_t)B * T * 3 * C);
    DeviceBuffer<float> lse_d((size_t)B * NH * T), workspace_d((size_t)B * NH * T);
    qkv_d.upload(attention_random_qkv(B, T, C));
    dout_d.upload(random_floats((size_t)B * T * C));
    // causal: half of the T x T scores, two matmuls (QK^T and PV) of 2*HS flops per score
    const double forward_flops = 4.0 * B * NH * (double)T * T * HS / 2;
    // backward counted as 2.5x the forward (the usual convention: 5 matmuls against the forward's 2; the
    // recomputation of S and dP in the dQ pass is not counted as useful work)
    const double backward_flops = 2.5 * forward_flops;
    char name[96];
    snprintf(name, sizeof(name), "attention_forward %s", label);
    report_bench(name, time_ms([&] { attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, C, NH, 0); }), 0,
                 forward_flops);
    snprintf(name, sizeof(name), "attention_backward %s", label);
    report_bench(name, time_ms([&] {
                     attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr,
                                        B, T, C, NH, 0);
                 }),
                 0, backward_flops);
}

void lab_attention() {
    if (!family_selected("attention")) return;
    // T = 1; T not a multiple of the tile (32 rows on the CUDA cores, 64 on the tensor cores) and T exactly
    // one or two tiles; every head size the launchers accept (16 .. 128; the larger ones need more than
    // 48 KiB of shared memory in some kernel), 32, 64 and 128 across several tiles; one larger shape that
    // walks 4 to 8 tiles and also checks that two runs give the same bits
    lab_attention_shape(1, 1, 1, 32, false);
    lab_attention_shape(2, 37, 3, 64, false);
    lab_attention_shape(1, 64, 2, 16, false);
    lab_attention_shape(1, 50, 2, 128, false);
    lab_attention_shape(2, 33, 2, 48, false);
    lab_attention_shape(1, 40, 1, 80, false);    // the remaining head sizes of the dispatch, one head each
    lab_attention_shape(1, 70, 1, 96, false);
    lab_attention_shape(1, 45, 1, 112, false);
    lab_attention_shape(1, 97, 2, 32, false);    // 32, 64 and 128 over tiles that end past T
    lab_attention_shape(1, 130, 1, 128, false);
    lab_attention_shape(2, 128, 2, 64, false);
    lab_attention_shape(2, 256, 4, 64, true);

    if (lab.bench) {
#ifdef LLMC_CPU
        lab_attention_bench(1, 256, 4, 64, "(CPU: B=1 T=256 NH=4 HS=64)");
        // what one layer of a small GPT-2 124M training run on the CPU sees (batch 4, sequence 64)
        lab_attention_bench(4, 64, 12, 64, "(CPU: B=4 T=64 NH=12 HS=64)");
#else
        lab_attention_bench(8, 1024, 12, 64, "(B=8 T=1024 NH=12 HS=64)");
#endif
    }
}
