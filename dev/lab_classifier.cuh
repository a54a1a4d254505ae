/*
Kernel lab: the fused classifier (softmax + cross-entropy + dlogits in place), against a double-precision
reference.

Shapes: GPT-2's vocabulary (V = 50257 padded to Vp = 50304) and a small odd one (V = 77, Vp = 80: the
last chunk of real columns is partly padding in both precisions). The padded columns of the input hold
NaN, so a kernel that lets them into the max or the sum produces NaN everywhere, and the output must
overwrite them with exact zeros. Targets outside [0, V) must give a NaN loss and the plain softmax
gradient, without reading out of bounds (AddressSanitizer watches the target -1 on row 0).
*/
#pragma once

#include "lab.h"
#include "../llmc/fused_classifier.cuh"

// ----------------------------------------------------------------------------
// reference: loss = log sum_j exp(z_j - m) + m - z_t;  dlogits_j = (softmax_j - [j == t]) * dloss, 0 in padding

static void classifier_lab_reference(const std::vector<float>& logits, const std::vector<int>& targets, float dloss,
                                     int N, int V, int Vp, std::vector<double>& losses, std::vector<double>& dlogits) {
    losses.assign(N, 0.0);
    dlogits.assign((size_t)N * Vp, 0.0);
    for (int n = 0; n < N; n++) {
        const float* z = &logits[(size_t)n * Vp];
        double max = -INFINITY;
        for (int j = 0; j < V; j++) max = std::max(max, (double)z[j]);
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += std::exp((double)z[j] - max);
        const int t = targets[n];
        const bool valid = t >= 0 && t < V;
        losses[n] = valid ? std::log(sum) + max - (double)z[t] : NAN;
        for (int j = 0; j < V; j++) {
            const double probability = std::exp((double)z[j] - max) / sum;
            dlogits[(size_t)n * Vp + j] = (probability - (j == t ? 1.0 : 0.0)) * (double)dloss;
        }
    }
}

static bool classifier_lab_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ----------------------------------------------------------------------------
// one shape; `bad_targets` puts targets outside [0, V) on the first and last rows

static void classifier_lab_check_shape(int N, int V, int Vp, bool bad_targets, int threads_per_row) {
    char shape[96];
    snprintf(shape, sizeof(shape), "N=%d V=%d Vp=%d%s, %d threads", N, V, Vp, bad_targets ? " bad targets" : "",
             threads_per_row);
    const std::string name = shape;
    const float dloss = 1.0f / N;

    // logits in [-4, 4], the range a trained GPT-2 produces before the softmax; padding is NaN
    std::vector<float> logits = round_to_floatX(random_floats((size_t)N * Vp, -4.0f, 4.0f));
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = NAN;
    std::vector<int> targets = random_ints(N, 0, V);
    targets[N - 1] = V - 1;  // the last real column: inside the chunk that is partly padding
    if (N > 2) targets[1] = 0;
    if (bad_targets) {
        targets[0] = -1;           // would read just before the buffer
        targets[N - 1] = 1 << 30;  // would read far past it
    }

    std::vector<double> losses_reference, dlogits_reference;
    classifier_lab_reference(logits, targets, dloss, N, V, Vp, losses_reference, dlogits_reference);

    DeviceBuffer<floatX> d_logits((size_t)N * Vp);
    DeviceBuffer<float> d_losses(N);
    DeviceBuffer<int> d_targets(N);
    d_targets.upload(targets);
    const cudaStream_t stream = 0;

    std::vector<float> first_losses, first_dlogits;
    for (int run = 0; run < 2; run++) {
        d_logits.upload(logits);
        d_losses.poison();
        fused_classifier(d_logits.ptr, d_losses.ptr, dloss, d_targets.ptr, N, V, Vp, stream, threads_per_row);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> losses = d_losses.download();
        const std::vector<float> dlogits = d_logits.download();
        if (run == 1) {
            const bool same = classifier_lab_same_bits(losses, first_losses) &&
                              classifier_lab_same_bits(dlogits, first_dlogits);
            check_true("fused_classifier deterministic " + name, same);
            break;
        }
        first_losses = losses;
        first_dlogits = dlogits;

        // Loss: computed in fp32 from exactly the values the reference sees, in both precisions. The sum S
        // of up to 50257 terms exp(z - m) in (0, 1] is formed by ~100 sequential fp32 additions per thread
        // and a 9-level merge: relative error well under 1e-5, which is an absolute error under 1e-5 in
        // log S; expf/logf add a few ulp. The loss itself is ~11 (log 50257 plus a few).
        const double loss_atol = 1e-5, loss_rtol = 1e-6;
        if (bad_targets) {
            bool nan_where_bad = std::isnan(losses[0]) && std::isnan(losses[N - 1]);
            check_true("fused_classifier loss NaN for bad targets " + name, nan_where_bad);
            std::vector<float> good(losses.begin() + 1, losses.end() - 1);
            std::vector<double> good_reference(losses_reference.begin() + 1, losses_reference.end() - 1);
            check_close("fused_classifier losses (valid rows) " + name, good, good_reference, loss_atol, loss_rtol);
        } else {
            check_close("fused_classifier losses " + name, losses, losses_reference, loss_atol, loss_rtol);
        }
        // dlogits: p_j * dloss is 1e-8 .. 1e-4 here, p_t - 1 about -1. FP32: p_j carries the relative error of
        // S and of expf (< 1e-5 as above), and p_t - 1 one more rounding of a number near 1 (2^-24).
        // BF16: the result is then rounded once to bf16, 2^-9 relative; allow 2^-8. No atol is needed
        // beyond a token one: every error is relative to the value, and padding must be exactly 0.
        check_close("fused_classifier dlogits " + name, dlogits, dlogits_reference, 1e-12,
                    by_precision(1e-5, std::ldexp(1.0, -8)));
        bool padding_zero = true;
        for (int n = 0; n < N; n++)
            for (int j = V; j < Vp; j++) padding_zero = padding_zero && dlogits[(size_t)n * Vp + j] == 0.0f;
        check_true("fused_classifier dlogits padding is 0 " + name, padding_zero);
    }
}

// ----------------------------------------------------------------------------
// benchmark: B*T = 8192 rows of the padded GPT-2 vocabulary

static void classifier_lab_bench() {
#ifdef LLMC_CPU
    const int N = 32;  // the CPU is slow: 32 rows instead of B*T = 8192
#else
    const int N = 8 * 1024;
#endif
    const int V = 50257, Vp = 50304;
    DeviceBuffer<floatX> logits((size_t)N * Vp);
    DeviceBuffer<float> losses(N);
    DeviceBuffer<int> targets(N);
    logits.upload(random_floats(logits.count, -4.0f, 4.0f));
    targets.upload(random_ints(N, 0, V));
    const cudaStream_t stream = 0;
    // each run turns the previous run's gradients into new ones: finite values, the same amount of work
    const double ms =
        time_ms([&] { fused_classifier(logits.ptr, losses.ptr, 1.0f / N, targets.ptr, N, V, Vp, stream); });
    // bytes: the logits read once and the gradients written once (the second read of a row mostly hits L2)
    char name[96];
    snprintf(name, sizeof(name), "fused_classifier N=%d Vp=%d", N, Vp);
    report_bench(name, ms, 2.0 * N * Vp * sizeof(floatX), 0);
}

void lab_classifier() {
    if (!family_selected("classifier")) return;
    // both block sizes the launcher uses (512 on a GPU, one warp on the CPU device), on every device
    for (int threads_per_row : {512, 32}) {
        classifier_lab_check_shape(5, 50257, 50304, false, threads_per_row);
        classifier_lab_check_shape(7, 77, 80, false, threads_per_row);
        classifier_lab_check_shape(3, 77, 80, true, threads_per_row);
        classifier_lab_check_shape(4, 1, 8, false, threads_per_row);  // a single class: loss 0, gradient 0
    }
    if (lab.bench) classifier_lab_bench();
}
