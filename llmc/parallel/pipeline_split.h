/*
Stages of any size: how many consecutive layers each model stage of the pipeline holds.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "layout.h"
#include "../model/parameters.h"
#include "../utils.h"

/*
The balanced split of L layers over S model stages. Stages are contiguous runs of layers, each >= 1. A stage's
cost is its layer count, plus first_stage_extra on stage 0 (the embedding) and last_stage_extra on stage S-1
(the LM head and loss), both in layer-equivalents of cost. The split minimises the most expensive stage:
  M = the least bound for which the capacities c_s = floor(M - extra_s) are all >= 1 and sum to at least L
  (M is some k + 0, k + first or k + last (+ both when S = 1), so the candidates are searched in order);
  every stage starts at its capacity, and the surplus is then taken away one layer at a time from the stage
  of the highest cost that still has more than one layer (ties: the highest stage index), which spreads the
  rest evenly and is deterministic.
Example: L = 8, S = 4, last extra 3: M = 4 (capacities 4, 4, 4, 1 sum to 13), the 5 surplus layers leave
stages 2, 1, 0, 2, 1 in turn: {3, 2, 2, 1}, costs 3, 2, 2, 4.
*/
inline std::vector<int> pipeline_balanced_layers(int L, int S, double first_stage_extra, double last_stage_extra) {
    std::vector<double> extra(S, 0.0);
    extra[0] += first_stage_extra;
    extra[S - 1] += last_stage_extra;
    std::vector<double> candidates;
    for (int k = 1; k <= L; k++)
        for (double e : {0.0, first_stage_extra, last_stage_extra, first_stage_extra + last_stage_extra})
            candidates.push_back(k + e);
    std::sort(candidates.begin(), candidates.end());
    constexpr double kSlack = 1e-9;  // a bound equal to k + extra must admit k layers despite rounding
    std::vector<int> layers(S, 0);
    for (double bound : candidates) {
        long long total = 0;
        bool every_stage_fits = true;
        for (int s = 0; s < S; s++) {
            layers[s] = (int)std::floor(bound - extra[s] + kSlack);
            if (layers[s] < 1) every_stage_fits = false;
            total += layers[s];
        }
        if (every_stage_fits && total >= L) break;
    }
    long long surplus = -(long long)L;
    for (int n : layers) surplus += n;
    for (; surplus > 0; surplus--) {
        int take = -1;
        for (int s = 0; s < S; s++)
            if (layers[s] > 1 && (take < 0 || layers[s] + extra[s] >= layers[take] + extra[take])) take = s;
        layers[take]--;
    }
    return layers;
}

/*
The balanced split for zbv's V, where rank r runs stages r and 2p - 1 - r, and rank 0 holds the LM head (stage
2p - 1) as well as the embedding (stage 0). What a rank costs is the sum of its two stages, so the ranks are
balanced, not the stages: balancing the 2p stages one by one would give rank 0 a full first stage on top of the
head. The ranks' layer counts are the balanced split of L over p with rank 0's extra the head's (each rank
holds at least two layers: one layer of each is set aside, which shifts every rank's cost alike and leaves the
balance unchanged). A rank's layers then go to its two stages as evenly as their costs allow: the stage
coming back up (the head's, on rank 0) gets floor((n - extra) / 2), at least 1, the stage going down the rest.
Example: L = 32, p = 4, head 8.2: ranks {2, 10, 10, 10} (rank 0: 2 + 8.2), stages {1, 5, 5, 5, 5, 5, 5, 1}.
*/
inline std::vector<int> pipeline_balanced_v_layers(int L, int p, double head_extra) {
    if (L < 2 * p) fatal("%d layers cannot be cut into the %d stages of zbv at pp %d", L, 2 * p, p);
    std::vector<int> rank_layers = pipeline_balanced_layers(L - p, p, head_extra, 0.0);
    std::vector<int> stages(2 * p, 0);
    for (int r = 0; r < p; r++) {
        const int n = rank_layers[r] + 1;
        const double extra = r == 0 ? head_extra : 0.0;
        const int up = std::min(n - 1, std::max(1, (int)std::floor((n - extra) / 2)));
        stages[2 * p - 1 - r] = up;
        stages[r] = n - up;
    }
    return stages;
}

// The first layer (0-based) of model stage `stage`: the layers of the stages before it.
inline int pipeline_first_layer(const std::vector<int>& stage_layers, int stage) {
    int first = 0;
    for (int s = 0; s < stage; s++) first += stage_layers[s];
    return first;
}

/*
The layers of each of the S = pp V model stages. A given --pp-layers list is checked (count S, each >= 1, sum L).
Auto balances the compute: FLOPs per token, forward + backward (the backward twice the forward):
  one block:        6 W for the four matmuls' W weights (GPT-2: 12 C^2, so 72 C^2; Llama: C (C + 2k) + C^2 + 3 C H
                    with k = C kv_heads / heads the channels of K and of V, H the SwiGLU's hidden units)
                    + 12 C T (attention's scores and mixing)
  LM head + loss:   6 C Vp (the LM head's matmul, tied or not) + 10 Vp (softmax, loss and their gradient, a few
                    per logit)
  embedding lookup: ~0 (a gather and a scatter-add of C values per token)
so the first stage's extra is 0 and the last's is head / block in layer-equivalents (zbv: the ranks' totals
balanced, pipeline_balanced_v_layers). Memory is not balanced:
the planner reports each stage's (the first stage holds the most activation records under 1f1b).
*/
// The FLOP counts above, per token of a sequence of T. A mixture of experts' MLP weighs as much as what a token
// meets: the shared experts, its K routed ones and the router (E x C). With a mixture every N blocks, a block
// weighs the blocks' mean (the split counts blocks as equals).
inline double pipeline_block_flops_per_token(const GPT2Config& config, int T) {
    const double C = config.channels;
    double weights = 0;
    for (int layer = 0; layer < config.num_layers; layer++) {
        const GPT2Config b = config.block(layer);
        weights += C * b.qkv_channels() + C * C + C * b.fc_channels() + (double)b.hidden() * C;
        if (b.moe())
            weights += (double)b.experts_per_token * C * (b.expert_fc_channels() + b.expert_hidden()) + (double)b.experts * C;
    }
    return 6 * weights / config.num_layers + 12 * C * T;
}
inline double pipeline_head_flops_per_token(const GPT2Config& config) {
    const double C = config.channels, Vp = config.padded_vocab_size;
    return 6 * C * Vp + 10 * Vp;
}

// Why a list of layers per stage cannot be the split of L layers into S stages ("": it can).
inline std::string pipeline_split_error(const std::vector<int>& stage_layers, int L, int S) {
    if ((int)stage_layers.size() != S)
        return "--pp-layers lists " + std::to_string(stage_layers.size()) + " stages, the pipeline has " +
               std::to_string(S) + " (pp x virtual stages per rank)";
    int sum = 0;
    for (size_t s = 0; s < stage_layers.size(); s++) {
        if (stage_layers[s] < 1) return "--pp-layers gives stage " + std::to_string(s) + " no layers";
        sum += stage_layers[s];
    }
    if (sum != L) return "--pp-layers adds up to " + std::to_string(sum) + " layers, the model has " + std::to_string(L);
    return "";
}

inline std::vector<int> pipeline_stage_split(const GPT2Config& config, const Layout& l) {
    const int L = config.num_layers, S = l.pp * l.pp_virtual;
    if (L < S) fatal("%d layers cannot be cut into %d stages (pp %d x %d per rank) of at least one layer", L, S, l.pp,
                     l.pp_virtual);
    if (l.pp_layers.empty()) {
        const double head = pipeline_head_flops_per_token(config) / pipeline_block_flops_per_token(config, l.seq_len);
        if (l.schedule == PipelineSchedule::ZeroBubbleV) return pipeline_balanced_v_layers(L, l.pp, head);
        return pipeline_balanced_layers(L, S, 0.0, head);
    }
    const std::string error = pipeline_split_error(l.pp_layers, L, S);
    if (!error.empty()) fatal("%s", error.c_str());
    return l.pp_layers;
}

// Which of the L + 2 parameter chunks (llmc/model/parameters.h: embeddings, blocks 0..L-1, final norm and an
// untied LM head) rank `rank` holds: the blocks of its stages, the embedding chunk on the ranks of the first
// stage (the lookup) and, when the LM head is tied to wte (GPT-2), of the last, the final chunk on the last.
inline std::vector<char> pipeline_held_chunks(PipelineSchedule schedule, int rank, int p, int V,
                                              const std::vector<int>& stage_layers, bool tied_head) {
    const int L = pipeline_first_layer(stage_layers, (int)stage_layers.size());
    std::vector<char> held(L + 2, 0);
    for (int v = 0; v < V; v++) {
        const int s = pipeline_model_stage(schedule, rank, v, p);
        const int first = pipeline_first_layer(stage_layers, s), end = first + stage_layers[s];
        for (int layer = first; layer < end; layer++) held[layer + 1] = 1;
        if (first == 0) held[0] = 1;
        if (end == L) held[L + 1] = 1;
        if (end == L && tied_head) held[0] = 1;
    }
    return held;
}

// One line saying why this layout cannot run (empty: it can). Whether the world splits into pp ranks is the
// mesh's to check, whether a --pp-layers list fits pipeline_stage_split's.
inline std::string pipeline_layout_error(PipelineSchedule schedule, int p, int V, int m, int num_layers) {
    const char* name = pipeline_schedule_name(schedule);
    char text[256] = "";
    if (schedule == PipelineSchedule::ZeroBubbleV && V != 2) {
        snprintf(text, sizeof(text), "--pp-virtual %d: zbv holds two stages per rank, in a V", V);
    } else if (schedule != PipelineSchedule::Interleaved && schedule != PipelineSchedule::ZeroBubbleV && V != 1) {
        snprintf(text, sizeof(text), "--pp-virtual %d: only the interleaved schedule has virtual stages (the schedule "
                 "is %s)", V, name);
    } else if (num_layers < p * V) {
        snprintf(text, sizeof(text), "%d layers cannot be cut into %d stages (pp %d x %d per rank) of at least one "
                 "layer", num_layers, p * V, p, V);
    } else if (schedule == PipelineSchedule::Interleaved && p == 1) {
        snprintf(text, sizeof(text), "the interleaved schedule needs --pp at least 2 (with one pipeline rank there is "
                 "nothing to interleave)");
    } else if (schedule == PipelineSchedule::Interleaved && m % p != 0) {
        snprintf(text, sizeof(text), "the interleaved schedule needs the microbatches (%d: --total-batch-size / (B x T "
                 "x data-parallel ranks)) to be a multiple of --pp %d", m, p);
    } else if (schedule == PipelineSchedule::ZeroBubbleH1 && m < p) {
        snprintf(text, sizeof(text), "zb-h1 needs at least as many microbatches (%d: --total-batch-size / (B x T x "
                 "data-parallel ranks)) as --pp %d", m, p);
    } else if (schedule == PipelineSchedule::ZeroBubbleV && m < 2 * p - 1) {
        snprintf(text, sizeof(text), "zbv needs at least 2 x --pp - 1 = %d microbatches (%d: --total-batch-size / (B x "
                 "T x data-parallel ranks))", 2 * p - 1, m);
    }
    return text;
}
