/*
Kernel lab: encoder forward (token + position embedding) and its deterministic backward.
*/
#pragma once

#include "lab.h"
#include "../llmc/encoder.cuh"

namespace encoder_lab {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// dwte/dwpe += the encoder backward of dout, in double
inline void reference_backward(std::vector<double>& dwte, std::vector<double>& dwpe, const std::vector<float>& dout,
                               const std::vector<int>& tokens, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t bt = (size_t)b * T + t;
            for (int c = 0; c < C; c++) {
                dwte[(size_t)tokens[bt] * C + c] += dout[bt * C + c];
                dwpe[(size_t)t * C + c] += dout[bt * C + c];
            }
        }
}

// How the token ids of a batch are drawn from [0, V)
enum class TokenMix {
    Uniform,     // every id equally likely
    OneToken,    // every position holds token 7
    HalfOneToken // token 7 at a random half of the positions (padding, end-of-text), the rest uniform
};

// B x T positions, C channels, token ids drawn from [0, V) as `mix` says.
// The position table has max_T > T rows: the rows past T must come back untouched.
inline void check(int B, int T, int C, int V, TokenMix mix = TokenMix::Uniform) {
    const int max_T = T + 3;
    std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                        " V=" + std::to_string(V);
    const int heavy_token = 7;
    std::vector<int> tokens = random_ints((size_t)B * T, 0, V);
    if (mix == TokenMix::OneToken) {
        shape += " one token";
        std::fill(tokens.begin(), tokens.end(), heavy_token);
    } else if (mix == TokenMix::HalfOneToken) {
        shape += " half one token";
        const std::vector<int> coin = random_ints(tokens.size(), 0, 2);
        for (size_t p = 0; p < tokens.size(); p++)
            if (coin[p] == 1) tokens[p] = heavy_token;
    }
    const std::vector<float> wte = round_to_floatX(random_floats((size_t)V * C));
    const std::vector<float> wpe = round_to_floatX(random_floats((size_t)max_T * C));

    // forward
    std::vector<double> out_ref((size_t)B * T * C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const size_t bt = (size_t)b * T + t;
                out_ref[bt * C + c] = (double)wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)t * C + c];
            }
    DeviceBuffer<int> d_tokens(tokens.size());
    DeviceBuffer<floatX> d_wte(wte.size()), d_wpe(wpe.size()), d_out(out_ref.size());
    d_tokens.upload(tokens);
    d_wte.upload(wte);
    d_wpe.upload(wpe);
    d_out.poison();
    encoder_forward(d_out.ptr, d_tokens.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    // one fp32 addition of two floatX values, rounded once to floatX: FP32 is off by at most half an
    // ulp (2^-24 relative); BF16 by at most 2^-9 relative after the rounding to 8 mantissa bits
    check_close("encoder_forward out" + shape, d_out.download(), out_ref, 0.0, by_precision(1.2e-7, 1.0 / 256));

    // backward: accumulates into non-zero starting gradients
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)B * T * C));
    const std::vector<float> dwte_start = round_to_floatX(random_floats(wte.size()));
    const std::vector<float> dwpe_start = round_to_floatX(random_floats(wpe.size()));
    std::vector<double> dwte_ref(dwte_start.begin(), dwte_start.end());
    std::vector<double> dwpe_ref(dwpe_start.begin(), dwpe_start.end());
    reference_backward(dwte_ref, dwpe_ref, dout, tokens, B, T, C);

    DeviceBuffer<floatX> d_dout(dout.size()), d_dwte(wte.size()), d_dwpe(wpe.size());
    d_dout.upload(dout);
    EncoderBackwardWorkspace workspace;
    encoder_backward_workspace_create(&workspace, B * T, C);
    auto run = [&]() {
        d_dwte.upload(dwte_start);
        d_dwpe.upload(dwpe_start);
        // poison: every list entry and partial row must be written before it is read
        cudaCheck(cudaMemset(workspace.device, 0xff, encoder_backward_workspace_ints(B * T) * sizeof(int)));
        cudaCheck(cudaMemset(workspace.partial_rows, 0xff,
                             (size_t)encoder_backward_max_partial_rows(B * T) * C * sizeof(float)));
        encoder_backward(d_dwte.ptr, d_dwpe.ptr, &workspace, d_dout.ptr, tokens.data(), B, T, C, 0);
        cudaCheck(cudaDeviceSynchronize());
    };
    run();
    const std::vector<float> dwte = d_dwte.download(), dwpe = d_dwpe.download();
    // each element is its start value plus an fp32 sum of up to B*T terms in [-1, 1] (B*T for a token
    // that fills the batch): FP32 error ~ sqrt(count) * 2^-24 * |terms|, far under 1e-5 for count <= 2048.
    // BF16: the accumulated value is rounded to 8 mantissa bits, 2^-9 relative (2^-8 for margin).
    check_close("encoder_backward dwte (+=)" + shape, dwte, dwte_ref, 1e-5, by_precision(1e-6, 1.0 / 256));
    check_close("encoder_backward dwpe (+=)" + shape, dwpe, dwpe_ref, 1e-5, by_precision(1e-6, 1.0 / 256));
    run();
    check_true("encoder_backward deterministic" + shape, same_bits(dwte, d_dwte.download()) &&
               same_bits(dwpe, d_dwpe.download()), "two runs, same bits in dwte, dwpe");

    // two calls back to back with different tokens and no synchronisation between them: the second must
    // not refill the host staging buffer before the first upload has read it
    const std::vector<int> tokens2 = random_ints((size_t)B * T, 0, V);
    const std::vector<float> dout2 = round_to_floatX(random_floats((size_t)B * T * C));
    DeviceBuffer<floatX> d_dout2(dout2.size());
    d_dout2.upload(dout2);
    // the second call accumulates onto the stored (rounded) result of the first, checked above
    std::vector<double> dwte_ref2(dwte.begin(), dwte.end()), dwpe_ref2(dwpe.begin(), dwpe.end());
    reference_backward(dwte_ref2, dwpe_ref2, dout2, tokens2, B, T, C);
    d_dwte.upload(dwte_start);
    d_dwpe.upload(dwpe_start);
    encoder_backward(d_dwte.ptr, d_dwpe.ptr, &workspace, d_dout.ptr, tokens.data(), B, T, C, 0);
    encoder_backward(d_dwte.ptr, d_dwpe.ptr, &workspace, d_dout2.ptr, tokens2.data(), B, T, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    // tolerances as above
    check_close("encoder_backward dwte, two calls" + shape, d_dwte.download(), dwte_ref2, 1e-5,
                by_precision(1e-6, 1.0 / 256));
    check_close("encoder_backward dwpe, two calls" + shape, d_dwpe.download(), dwpe_ref2, 1e-5,
                by_precision(1e-6, 1.0 / 256));
    encoder_backward_workspace_free(&workspace);
}

// skewed: token 7 at every other position, as padding would be
inline void bench(int B, int T, int C, int V, bool skewed, const std::string& note) {
    const std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                              (skewed ? " half one token" : "") + note;
    std::vector<int> tokens = random_ints((size_t)B * T, 0, V);
    if (skewed)
        for (size_t p = 0; p < tokens.size(); p += 2) tokens[p] = 7;
    DeviceBuffer<int> d_tokens(tokens.size());
    DeviceBuffer<floatX> wte((size_t)V * C), wpe((size_t)T * C), out((size_t)B * T * C);
    d_tokens.upload(tokens);
    wte.zero();  // contents do not matter for timing
    wpe.zero();
    const double activation = (double)B * T * C * sizeof(floatX);
    double ms = time_ms([&] { encoder_forward(out.ptr, d_tokens.ptr, wte.ptr, wpe.ptr, B, T, C, 0); });
    // reads one wte row and one wpe row per position (wpe mostly from cache), writes out
    report_bench("encoder_forward" + shape, ms, 3 * activation, 0);

    EncoderBackwardWorkspace workspace;
    encoder_backward_workspace_create(&workspace, B * T, C);
    ms = time_ms([&] { encoder_backward(wte.ptr, wpe.ptr, &workspace, out.ptr, tokens.data(), B, T, C, 0); });
    // dout read twice (once per table), dwte rows of the batch's tokens and dwpe read and written
    report_bench("encoder_backward (incl. host grouping)" + shape, ms, 4 * activation, 0);
    encoder_backward_workspace_free(&workspace);
}

}  // namespace encoder_lab

void lab_encoder() {
    if (!family_selected("encoder")) return;
    encoder_lab::check(2, 5, 64, 50);          // tiny; T odd
    encoder_lab::check(4, 37, 768, 50);        // GPT-2 width, ~3 positions per token id
    encoder_lab::check(3, 16, 200, 1000);      // most rows of dwte untouched; C not a multiple of 256
    // every position holds the same token: 128 = two full pieces of ENCODER_ROWS_PER_PIECE
    encoder_lab::check(4, 32, 64, 10, encoder_lab::TokenMix::OneToken);
    encoder_lab::check(2, 9, 1600, 50);        // widest GPT-2 width
    encoder_lab::check(2, 64, 64, 50304);      // GPT-2's padded vocabulary: token ids far apart
    // 5 ids over 400 positions: every token heavy, pieces of 64 and a shorter last one
    encoder_lab::check(2, 200, 64, 5);
    // skewed as padding makes it: one token at about 1024 of 2048 positions (16 pieces, the last short),
    // among single occurrences of GPT-2's vocabulary; and the same batch shape uniform
    encoder_lab::check(2, 1024, 768, 50304, encoder_lab::TokenMix::HalfOneToken);
    encoder_lab::check(2, 1024, 768, 50304);
    if (lab.bench) {
#ifdef LLMC_CPU
        encoder_lab::bench(1, 1024, 768, 50304, false, " (CPU: B=1)");
        encoder_lab::bench(1, 1024, 768, 50304, true, " (CPU: B=1)");
#else
        encoder_lab::bench(16, 1024, 768, 50304, false, "");
        encoder_lab::bench(16, 1024, 768, 50304, true, "");
#endif
    }
}
