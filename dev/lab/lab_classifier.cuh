/*
Kernel lab: the fused classifier (softmax + cross-entropy + dlogits in place), against a double-precision
reference.

Shapes: GPT-2's vocabulary (V = 50257 padded to Vp = 50304) and a small odd one (V = 77, Vp = 80: the
last chunk of real columns is partly padding in both precisions). The padded columns of the input hold
NaN, so a kernel that lets them into the max or the sum produces NaN everywhere, and the output must
overwrite them with exact zeros. Targets outside [0, V) must give a NaN loss and the plain softmax
gradient, without reading out of bounds (AddressSanitizer watches the target -1 on row 0).

The vocabulary-parallel classifier (three kernels and two all-reduces) is checked by simulating tp ranks
in one process: the (N, Vp) logits are cut into tp column slices, each slice runs the kernels in its own
buffers, and the host plays the collectives between them (the maximum over slices, then the sums in rank
order). Losses and the re-assembled gradient are compared with the double reference and with the unsplit
fused_classifier; at tp = 1 the three kernels must give fused_classifier's bits exactly.
*/
#pragma once

#include <memory>
#include "lab.h"
#include "../../llmc/kernels/fused_classifier.cuh"

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
// the vocabulary-parallel classifier, tp ranks simulated in one process

// One shape over tp slices of Vp / tp columns each. `bad_targets` as above.
static void classifier_lab_check_vocab_parallel(int N, int V, int Vp, int tp, bool bad_targets, int threads_per_row) {
    char shape[128];
    snprintf(shape, sizeof(shape), "N=%d V=%d Vp=%d tp=%d%s, %d threads", N, V, Vp, tp,
             bad_targets ? " bad targets" : "", threads_per_row);
    const std::string name = shape;
    const int Vp_local = Vp / tp;
    const float dloss = 1.0f / N;

    // inputs as in classifier_lab_check_shape: padding holds NaN, so a slice that lets its columns past V
    // into the statistics (or a slice with none) poisons everything. Even rows also get one confident
    // logit, 6 above the rest, at a random class, as a trained model's rows have: the slices' maxima then
    // differ by about 6, and a sum left relative to its slice's maximum is off by a factor of e^6.
    std::vector<float> logits = random_floats((size_t)N * Vp, -4.0f, 4.0f);
    const std::vector<int> peaks = random_ints(N, 0, V);
    for (int n = 0; n < N; n += 2) logits[(size_t)n * Vp + peaks[n]] += 6.0f;
    logits = round_to_floatX(logits);
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = NAN;
    std::vector<int> targets = random_ints(N, 0, V);
    targets[N - 1] = V - 1;  // the last class: in the chunk where a slice's classes end
    if (N > 2) targets[1] = 0;
    if (N > 3) targets[2] = std::min(V - 1, Vp_local);  // the first column of the second slice, when a class
    if (bad_targets) {
        targets[0] = -1;
        targets[N - 1] = 1 << 30;
        if (N > 3) targets[2] = V;  // just past the classes: inside some slice's columns, owned by none
    }
    std::vector<double> losses_reference, dlogits_reference;
    classifier_lab_reference(logits, targets, dloss, N, V, Vp, losses_reference, dlogits_reference);

    DeviceBuffer<int> d_targets(N);
    d_targets.upload(targets);
    const cudaStream_t stream = 0;

    // the unsplit classifier, for comparison
    DeviceBuffer<floatX> d_full_logits((size_t)N * Vp);
    DeviceBuffer<float> d_full_losses(N);
    d_full_logits.upload(logits);
    d_full_losses.poison();
    fused_classifier(d_full_logits.ptr, d_full_losses.ptr, dloss, d_targets.ptr, N, V, Vp, stream, threads_per_row);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> fused_losses = d_full_losses.download();
    const std::vector<float> fused_dlogits = d_full_logits.download();

    // each simulated rank's buffers: its columns of the logits, its statistics, its losses
    std::vector<std::unique_ptr<DeviceBuffer<floatX>>> d_logits;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> d_stats, d_losses;
    for (int r = 0; r < tp; r++) {
        d_logits.push_back(std::make_unique<DeviceBuffer<floatX>>((size_t)N * Vp_local));
        d_stats.push_back(std::make_unique<DeviceBuffer<float>>(vocab_parallel_stats_floats(N)));
        d_losses.push_back(std::make_unique<DeviceBuffer<float>>(N));
    }
    auto slice_of = [&](int r) {
        std::vector<float> slice((size_t)N * Vp_local);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < Vp_local; j++) slice[(size_t)n * Vp_local + j] = logits[(size_t)n * Vp + r * Vp_local + j];
        return slice;
    };

    // the whole sequence; returns every rank's losses and the gradient re-assembled to (N, Vp)
    auto run = [&](std::vector<std::vector<float>>& rank_losses, std::vector<float>& dlogits) {
        for (int r = 0; r < tp; r++) {
            d_logits[r]->upload(slice_of(r));
            d_stats[r]->poison();   // kernel 1 must write all 4N statistics
            d_losses[r]->poison();
            vocab_parallel_softmax_partials(d_stats[r]->ptr, d_logits[r]->ptr, d_targets.ptr, N, r * Vp_local,
                                            Vp_local, V, stream, threads_per_row);
        }
        cudaCheck(cudaDeviceSynchronize());
        // all_reduce(stats[0, N), Max): the maximum is exact, in any order
        std::vector<std::vector<float>> stats(tp);
        for (int r = 0; r < tp; r++) stats[r] = d_stats[r]->download();
        std::vector<float> global_max(stats[0].begin(), stats[0].begin() + N);
        for (int r = 1; r < tp; r++)
            for (int n = 0; n < N; n++) global_max[n] = std::max(global_max[n], stats[r][n]);
        for (int r = 0; r < tp; r++) {
            std::copy(global_max.begin(), global_max.end(), stats[r].begin());
            d_stats[r]->upload(stats[r]);
            vocab_parallel_rescale_sums(d_stats[r]->ptr, N, stream);
        }
        cudaCheck(cudaDeviceSynchronize());
        // all_reduce(stats[N, 3N), Sum): fp32 additions in rank order, as MPI's reduction on one host does
        for (int r = 0; r < tp; r++) stats[r] = d_stats[r]->download();
        std::vector<float> sums(stats[0].begin() + N, stats[0].begin() + 3 * N);
        for (int r = 1; r < tp; r++)
            for (int i = 0; i < 2 * N; i++) sums[i] += stats[r][N + i];
        for (int r = 0; r < tp; r++) {
            std::copy(sums.begin(), sums.end(), stats[r].begin() + N);
            d_stats[r]->upload(stats[r]);
            vocab_parallel_loss_and_gradient(d_logits[r]->ptr, d_losses[r]->ptr, d_stats[r]->ptr, dloss,
                                             d_targets.ptr, N, r * Vp_local, Vp_local, V, stream, threads_per_row);
        }
        cudaCheck(cudaDeviceSynchronize());
        rank_losses.assign(tp, {});
        dlogits.assign((size_t)N * Vp, 0.0f);
        for (int r = 0; r < tp; r++) {
            rank_losses[r] = d_losses[r]->download();
            const std::vector<float> slice = d_logits[r]->download();
            for (int n = 0; n < N; n++)
                for (int j = 0; j < Vp_local; j++) dlogits[(size_t)n * Vp + r * Vp_local + j] = slice[(size_t)n * Vp_local + j];
        }
    };

    std::vector<std::vector<float>> rank_losses;
    std::vector<float> dlogits;
    run(rank_losses, dlogits);
    const std::vector<float>& losses = rank_losses[0];

    bool ranks_agree = true;  // every rank writes the same losses, bit for bit
    for (int r = 1; r < tp; r++) ranks_agree = ranks_agree && classifier_lab_same_bits(rank_losses[r], losses);
    check_true("vocab_parallel losses equal on every rank " + name, ranks_agree);

    // Against the reference: the same tolerances as fused_classifier, for the same reasons. S is now a sum
    // of tp rescaled slice sums instead of warp sums: each slice sum has the error bound of a shorter row,
    // the rescaling adds one expf (a few ulp) and the tp additions tp roundings, so the relative error of
    // S stays far under 1e-5 (loss) and p_j keeps the bound of fused_classifier's (dlogits).
    const double loss_atol = 1e-5, loss_rtol = 1e-6;
    const double dlogits_rtol = by_precision(1e-5, std::ldexp(1.0, -8));
    // Against fused_classifier: both are within the reference tolerance, so within twice it of each other
    // (an honest bound: neither is exact). In BF16 the two round nearly equal fp32 gradients to bf16, and a
    // value next to a rounding boundary can go either way: one bf16 ulp, at most 2^-7 relative.
    const double vs_fused_dlogits_rtol = by_precision(2e-5, std::ldexp(1.0, -7));
    std::vector<double> fused_losses_d = to_double(fused_losses), fused_dlogits_d = to_double(fused_dlogits);
    if (bad_targets) {
        bool nan_where_bad = std::isnan(losses[0]) && std::isnan(losses[N - 1]) && (N <= 3 || std::isnan(losses[2]));
        check_true("vocab_parallel loss NaN for bad targets " + name, nan_where_bad);
        std::vector<float> good;
        std::vector<double> good_reference, good_fused;
        for (int n = 0; n < N; n++) {
            if (std::isnan(losses_reference[n])) continue;
            good.push_back(losses[n]);
            good_reference.push_back(losses_reference[n]);
            good_fused.push_back(fused_losses_d[n]);
        }
        if (!good.empty()) {
            check_close("vocab_parallel losses (valid rows) " + name, good, good_reference, loss_atol, loss_rtol);
            check_close("vocab_parallel losses (valid rows) vs fused " + name, good, good_fused, 2 * loss_atol,
                        2 * loss_rtol);
        }
    } else {
        check_close("vocab_parallel losses " + name, losses, losses_reference, loss_atol, loss_rtol);
        check_close("vocab_parallel losses vs fused " + name, losses, fused_losses_d, 2 * loss_atol, 2 * loss_rtol);
    }
    check_close("vocab_parallel dlogits " + name, dlogits, dlogits_reference, 1e-12, dlogits_rtol);
    check_close("vocab_parallel dlogits vs fused " + name, dlogits, fused_dlogits_d, 1e-12, vs_fused_dlogits_rtol);
    bool padding_zero = true;
    for (int n = 0; n < N; n++)
        for (int j = V; j < Vp; j++) padding_zero = padding_zero && dlogits[(size_t)n * Vp + j] == 0.0f;
    check_true("vocab_parallel dlogits padding is 0 " + name, padding_zero);
    if (tp == 1) {
        // one rank: the rescaling multiplies by exp(0) = 1 and everything else is fused_classifier's arithmetic
        check_true("vocab_parallel tp=1 has fused_classifier's bits " + name,
                   classifier_lab_same_bits(losses, fused_losses) && classifier_lab_same_bits(dlogits, fused_dlogits));
    }

    std::vector<std::vector<float>> again_losses;
    std::vector<float> again_dlogits;
    run(again_losses, again_dlogits);
    check_true("vocab_parallel deterministic " + name,
               classifier_lab_same_bits(again_losses[0], losses) && classifier_lab_same_bits(again_dlogits, dlogits));
}

// The statistics of a slice without classes, and its rescaling, on their own: (-FLT_MAX, 0), target 0,
// and after kernel 2 a sum of exactly 0 (no NaN from -FLT_MAX - m), whatever the global maximum.
static void classifier_lab_check_empty_slice() {
    const int N = 3, V = 8, Vp_local = 16;
    const std::vector<int> targets = {0, V - 1, V + 3};  // none of them in the slice [V, V + 16)
    DeviceBuffer<floatX> d_logits((size_t)N * Vp_local);
    DeviceBuffer<float> d_stats(vocab_parallel_stats_floats(N));
    DeviceBuffer<int> d_targets(N);
    d_logits.poison();  // NaN: no column of the slice may be read into the statistics
    d_stats.poison();
    d_targets.upload(targets);
    vocab_parallel_softmax_partials(d_stats.ptr, d_logits.ptr, d_targets.ptr, N, V, Vp_local, V, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> stats = d_stats.download();
    bool empty = true;
    for (int n = 0; n < N; n++)
        empty = empty && stats[n] == -FLT_MAX && stats[N + n] == 0.0f && stats[2 * N + n] == 0.0f &&
                stats[3 * N + n] == -FLT_MAX;
    check_true("vocab_parallel slice without classes: (-FLT_MAX, 0, 0)", empty);
    // global maxima: another slice's value, an extreme one (-FLT_MAX - FLT_MAX = -inf), and -FLT_MAX itself
    const float global_max[N] = {3.5f, FLT_MAX, -FLT_MAX};
    for (int n = 0; n < N; n++) stats[n] = global_max[n];
    d_stats.upload(stats);
    vocab_parallel_rescale_sums(d_stats.ptr, N, 0);
    cudaCheck(cudaDeviceSynchronize());
    stats = d_stats.download();
    bool zero_sums = true;
    for (int n = 0; n < N; n++) zero_sums = zero_sums && stats[N + n] == 0.0f;
    check_true("vocab_parallel rescaled empty sum is exactly 0", zero_sums);
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
        // tensor parallelism over the vocabulary: the slices of GPT-2's padded vocabulary (3 rows: the CPU
        // device runs 50304 columns per row slowly); V = 77 over Vp = 128 in slices of 128/tp, so at tp=4 the
        // third slice has 13 classes (ending inside a 128-bit chunk) and the fourth none; bad targets; and a
        // single class, on the first slice only
        for (int tp : {1, 2, 4}) {
            classifier_lab_check_vocab_parallel(3, 50257, 50304, tp, false, threads_per_row);
            classifier_lab_check_vocab_parallel(7, 77, 128, tp, false, threads_per_row);
            classifier_lab_check_vocab_parallel(5, 77, 128, tp, true, threads_per_row);
            classifier_lab_check_vocab_parallel(4, 1, 32, tp, false, threads_per_row);
        }
    }
    classifier_lab_check_empty_slice();
    // a slice whose width is not a whole number of 128-bit chunks is refused with one line
    expect_failure("vocab_parallel refuses Vp_local % x128::size != 0", [] {
        vocab_parallel_softmax_partials(nullptr, nullptr, nullptr, 1, 0, x128::size + 2, 10, 0);
    }, "Vp_local a positive multiple of");
    if (lab.bench) classifier_lab_bench();
}
