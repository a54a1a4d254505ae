/*
Kernel lab: encoder forward (token + position embedding) and its deterministic backward.

Tensor parallelism over the vocabulary is checked by simulating tp ranks in one process: each slice of
wte runs embedding_lookup_forward into its own (poisoned) buffer, the host sums the slices as the
all-reduce would (fp32, rounded once), and position_embedding_forward adds the positions, over all rows
and over uneven pieces of rows (sequence parallelism, first_row not a multiple of T). The result must have
encoder_forward's bits. encoder_backward per slice must give exactly the slice's rows of the full call's
dwte, and the full call's dwpe: the same additions in the same order, so no tolerance at all.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/encoder.cuh"

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

// The rows [first, first + rows) of a row-major (?, C) array
inline std::vector<float> rows_of(const std::vector<float>& all, size_t first, size_t rows, int C) {
    return std::vector<float>(all.begin() + first * C, all.begin() + (first + rows) * C);
}

// tp slices of ceil(V / tp) rows of wte each (the last ones shorter, or empty), B x T positions
inline void check_vocab_slices(int B, int T, int C, int V, int tp, TokenMix mix = TokenMix::Uniform) {
    const int N = B * T, max_T = T + 3;
    const std::string shape = " B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                              " V=" + std::to_string(V) + " tp=" + std::to_string(tp) +
                              (mix == TokenMix::OneToken ? " one token" : mix == TokenMix::HalfOneToken ?
                               " half one token" : "");
    std::vector<int> tokens = random_ints((size_t)N, 0, V);
    if (mix == TokenMix::OneToken) std::fill(tokens.begin(), tokens.end(), 7);
    if (mix == TokenMix::HalfOneToken) {
        const std::vector<int> coin = random_ints(tokens.size(), 0, 2);
        for (size_t p = 0; p < tokens.size(); p++)
            if (coin[p] == 1) tokens[p] = 7;
    }
    const std::vector<float> wte = round_to_floatX(random_floats((size_t)V * C));
    const std::vector<float> wpe = round_to_floatX(random_floats((size_t)max_T * C));
    DeviceBuffer<int> d_tokens(tokens.size());
    DeviceBuffer<floatX> d_wte(wte.size()), d_wpe(wpe.size()), d_full((size_t)N * C), d_slice((size_t)N * C);
    d_tokens.upload(tokens);
    d_wte.upload(wte);
    d_wpe.upload(wpe);
    d_full.poison();
    encoder_forward(d_full.ptr, d_tokens.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> full = d_full.download();

    const int slice_rows = (V + tp - 1) / tp;
    auto slice_start = [&](int r) { return std::min(V, r * slice_rows); };
    auto slice_size = [&](int r) { return std::min(V, (r + 1) * slice_rows) - slice_start(r); };

    // forward: each slice's lookup; exactly its tokens' rows, zeros elsewhere (the poison overwritten)
    std::vector<float> summed((size_t)N * C, 0.0f);
    for (int r = 0; r < tp; r++) {
        const int start = slice_start(r), rows = slice_size(r);
        d_slice.poison();
        embedding_lookup_forward(d_slice.ptr, d_tokens.ptr, d_wte.ptr + (size_t)start * C, start, rows, N, C, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> out = d_slice.download();
        std::vector<float> expected((size_t)N * C, 0.0f);
        for (int n = 0; n < N; n++)
            if (tokens[n] >= start && tokens[n] < start + rows)
                std::copy(wte.begin() + (size_t)tokens[n] * C, wte.begin() + (size_t)(tokens[n] + 1) * C,
                          expected.begin() + (size_t)n * C);
        check_true("embedding_lookup_forward slice " + std::to_string(r) + shape, same_bits(out, expected),
                   "its rows of wte, +0 elsewhere");
        for (size_t i = 0; i < summed.size(); i++) summed[i] += out[i];  // the all-reduce: fp32, in rank order
    }
    // + positions over all rows: encoder_forward's bits
    d_slice.upload(summed);  // rounded once to floatX, as the all-reduce does
    position_embedding_forward(d_slice.ptr, d_wpe.ptr, 0, N, T, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_true("lookup slices summed + positions = encoder_forward" + shape, same_bits(d_slice.download(), full),
               "bit for bit");
    // + positions over three uneven pieces of the rows (sequence parallelism): the first rows of the later
    // pieces are not at position 0
    const int cuts[4] = {0, N / 3 + 1, std::max(N / 3 + 1, 2 * N / 3 + 1), N};
    bool pieces_same = true;
    for (int k = 0; k < 3; k++) {
        const int first = cuts[k], rows = cuts[k + 1] - cuts[k];
        if (rows <= 0) continue;
        DeviceBuffer<floatX> piece((size_t)rows * C);
        piece.upload(rows_of(summed, first, rows, C));
        position_embedding_forward(piece.ptr, d_wpe.ptr, first, rows, T, C, 0);
        cudaCheck(cudaDeviceSynchronize());
        pieces_same = pieces_same && same_bits(piece.download(), rows_of(full, first, rows, C));
    }
    check_true("row pieces + positions (first_row offsets) = encoder_forward" + shape, pieces_same, "bit for bit");

    // backward: the full call, then each slice from the same starting gradients
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> dwte_start = round_to_floatX(random_floats(wte.size()));
    const std::vector<float> dwpe_start = round_to_floatX(random_floats(wpe.size()));
    DeviceBuffer<floatX> d_dout(dout.size()), d_dwte(wte.size()), d_dwpe(wpe.size());
    d_dout.upload(dout);
    EncoderBackwardWorkspace workspace;
    encoder_backward_workspace_create(&workspace, N, C);
    const size_t workspace_ints = encoder_backward_workspace_ints(N);
    const size_t partial_floats = (size_t)encoder_backward_max_partial_rows(N) * C;
    auto poison_workspace = [&] {
        cudaCheck(cudaMemset(workspace.device, 0xff, workspace_ints * sizeof(int)));
        if (partial_floats > 0) cudaCheck(cudaMemset(workspace.partial_rows, 0xff, partial_floats * sizeof(float)));
    };
    d_dwte.upload(dwte_start);
    d_dwpe.upload(dwpe_start);
    poison_workspace();
    encoder_backward(d_dwte.ptr, d_dwpe.ptr, &workspace, d_dout.ptr, tokens.data(), B, T, C, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> full_dwte = d_dwte.download(), full_dwpe = d_dwpe.download();
    for (int r = 0; r < tp; r++) {
        const int start = slice_start(r), rows = slice_size(r);
        DeviceBuffer<floatX> d_dwte_slice(std::max<size_t>(1, (size_t)rows * C));
        if (rows > 0) d_dwte_slice.upload(rows_of(dwte_start, start, rows, C));
        d_dwpe.upload(dwpe_start);
        poison_workspace();
        encoder_backward(d_dwte_slice.ptr, d_dwpe.ptr, &workspace, d_dout.ptr, tokens.data(), B, T, C, 0, start, rows);
        cudaCheck(cudaDeviceSynchronize());
        const std::string slice = " slice " + std::to_string(r) + " (" + std::to_string(rows) + " rows)" + shape;
        if (rows > 0) {
            std::vector<float> got = d_dwte_slice.download();
            got.resize((size_t)rows * C);
            check_true("encoder_backward dwte" + slice, same_bits(got, rows_of(full_dwte, start, rows, C)),
                       "the full call's rows, bit for bit");
        }
        check_true("encoder_backward dwpe" + slice, same_bits(d_dwpe.download(), full_dwpe), "bit for bit");
        // a slice that owns none of the batch's tokens sorts and uploads nothing
        bool owns_any = false;
        for (int token : tokens) owns_any = owns_any || (token >= start && token < start + rows);
        if (!owns_any) {
            std::vector<int> ints(workspace_ints);
            cudaCheck(cudaMemcpy(ints.data(), workspace.device, workspace_ints * sizeof(int), cudaMemcpyDeviceToHost));
            check_true("encoder_backward uploads nothing for a slice without tokens" + slice,
                       std::all_of(ints.begin(), ints.end(), [](int v) { return v == -1; }));
        }
    }
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
    constexpr int kSkewedVocab = 8192;
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
    // among mostly single occurrences; and the same batch shape uniform. The kernels touch only the batch's
    // rows, so a vocabulary of 8192 rows tests what GPT-2's would (whose ids far apart the C=64 case above
    // covers) at a sixth of the host's reference work, which dominated the lab's time at 50304 x 768. Under
    // AddressSanitizer C = 64: the pieces and the rows they touch are the same, and the width of 768 is the
    // second case's; at 768 these shapes took most of that run's encoder time.
    const int skewed_width = kSanitized ? 64 : 768;
    encoder_lab::check(2, 1024, skewed_width, kSkewedVocab, encoder_lab::TokenMix::HalfOneToken);
    encoder_lab::check(2, 1024, skewed_width, kSkewedVocab);
    // tensor parallelism over the vocabulary: tiny with T odd; one token (the other slices own none);
    // every token heavy, with an empty fourth slice (V = 5 in slices of 2); skewed at GPT-2's width and batch
    for (int tp : {1, 2, 4}) encoder_lab::check_vocab_slices(2, 5, 64, 50, tp);
    encoder_lab::check_vocab_slices(4, 32, 64, 10, 4, encoder_lab::TokenMix::OneToken);
    for (int tp : {2, 4}) encoder_lab::check_vocab_slices(2, 200, 64, 5, tp);
    for (int tp : {2, 4})
        encoder_lab::check_vocab_slices(2, 1024, skewed_width, kSkewedVocab, tp, encoder_lab::TokenMix::HalfOneToken);
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
