/*
Stages of any size: how many consecutive layers each model stage of the pipeline holds.
*/
#pragma once

#include <algorithm>
#include <cmath>
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

// The first layer (0-based) of model stage `stage`: the layers of the stages before it.
inline int pipeline_first_layer(const std::vector<int>& stage_layers, int stage) {
    int first = 0;
    for (int s = 0; s < stage; s++) first += stage_layers[s];
    return first;
}

/*
The layers of each of the S = pp V model stages. A given --pp-layers list is checked (count S, each >= 1, sum L).
Auto balances the compute: FLOPs per token, forward + backward (the backward twice the forward):
  one block:        72 C^2 (the four matmuls, 12 C^2 weights) + 12 C T (attention's scores and mixing)
  LM head + loss:   6 C Vp (the tied head's matmul) + 10 Vp (softmax, loss and their gradient, a few per logit)
  embedding lookup: ~0 (a gather and a scatter-add of C values per token)
so the first stage's extra is 0 and the last's is head / block in layer-equivalents. Memory is not balanced:
the planner reports each stage's (the first stage holds the most activation records under 1f1b).
*/
inline std::vector<int> pipeline_stage_split(const GPT2Config& config, const Layout& l) {
    const int L = config.num_layers, S = l.pp * l.pp_virtual;
    if (L < S) fatal("pipeline: %d layers cannot fill %d stages (pp %d x %d per rank) with one each", L, S, l.pp, l.pp_virtual);
    if (l.pp_layers.empty()) {
        const double C = config.channels, T = l.seq_len, Vp = config.padded_vocab_size;
        const double block = 72 * C * C + 12 * C * T;
        const double head_and_loss = 6 * C * Vp + 10 * Vp;
        return pipeline_balanced_layers(L, S, 0.0, head_and_loss / block);
    }
    if ((int)l.pp_layers.size() != S)
        fatal("--pp-layers: %d entries for %d model stages (pp %d x %d per rank)", (int)l.pp_layers.size(), S, l.pp, l.pp_virtual);
    int sum = 0;
    for (int n : l.pp_layers) {
        if (n < 1) fatal("--pp-layers: every stage needs at least one layer");
        sum += n;
    }
    if (sum != L) fatal("--pp-layers: the stages hold %d layers, the model has %d", sum, L);
    return l.pp_layers;
}
