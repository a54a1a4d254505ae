/*
Pipeline parallelism as data: which forward and backward passes each pipeline rank runs, in which order.

The model's layers are cut into S = p * V consecutive stages (llmc/parallel/pipeline.h's stage split says how many
layers each); pipeline rank r of p holds V of them, its "virtual stages". In loops, virtual stage v of rank r is model
stage s = v * p + r: rank r holds stages r, r + p, r + 2p, ... (every schedule but zbv). In a V (zbv, V = 2) it
holds stages r and 2p - 1 - r: the forward pass goes down the ranks 0..p-1 and comes back up p-1..0, so rank
p - 1 holds two neighbouring stages (p - 1 and p: the hand-over between them stays in memory) and rank 0 holds
both the first stage and the last (the embedding and the tied LM head on one rank). A batch is cut into m microbatches. Microbatch j's forward pass goes
through stages 0, 1, ..., S-1 (each stage sends its output activations to the next), the loss is taken at
the end of stage S-1, and its backward pass comes back through S-1, ..., 0 (each stage sends the gradient
of its input to the previous one). A stage keeps the activations of a microbatch from its forward pass
until its backward pass: one "activation record" per (microbatch, virtual stage) in flight.

A schedule is a function (schedule, rank, p, m, V) -> the ordered list of this rank's actions, each
"forward or backward of microbatch j on virtual stage v". An executor (the training program) runs any
such list: before a forward it receives the input (except at stage 0), after it sends the output (except at
stage S-1); backwards the other way. Because a schedule is only data, it can be printed, simulated and
tested without a model (dev/test/test_pipeline.cu), and drawn from the trace of a real or simulated run
(scripts/pipeline_timeline.py). This file holds what one rank's list is; what takes all ranks' lists at once
(the simulator, and the groups of messages between the actions) is llmc/parallel/pipeline_simulator.h.

The schedules, for m microbatches on p ranks:

  gpipe (Huang et al. 2019)  all m forwards, then all m backwards, both in microbatch order 0..m-1. Simple,
      but a rank holds all m activation records at once. Backwards in the same order as the forwards, not
      reversed: then every schedule here accumulates each parameter's gradient over the microbatches in
      the same order (0, 1, ..., m-1), so gpipe and 1f1b give the same bits, and the executor frees
      records first in, first out under both. (Reversed order would not shorten the step: the last
      stage has every microbatch's loss in hand when its backwards begin, in either order.)
  1f1b (Narayanan et al. 2019, PipeDream-Flush)  the same work in a different order: a warm-up of
      min(p - r - 1, m) forwards fills the pipeline, then the steady state alternates one forward and
      one backward (the oldest microbatch's), then a cool-down runs the backwards left over. A rank
      holds at most min(p - r, m) records instead of m; the step takes exactly as long as gpipe's.
  interleaved (Narayanan et al. 2021)  1f1b over V > 1 virtual stages per rank. Each stage is V times
      smaller, so filling and draining the pipeline costs V times less: the bubble shrinks by V, for V
      times more messages. Forwards go in rounds of p microbatches: microbatches 0..p-1 on virtual stage 0,
      the same p on virtual stage 1, ..., on V-1, then microbatches p..2p-1 from virtual stage 0 again;
      backwards the same, from virtual stage V-1 down to 0. Hence m must be a multiple of p. Rank r's
      warm-up runs (p - r - 1) * 2 + (V - 1) * p forwards (at most m V), then 1f1b, then the cool-down.
      (With V = 1 this is 1f1b's order with a deeper warm-up: the same bubble, more records.)
  zb-h1 and zbv (Qi et al. 2023 and 2024)  split each backward into B (the input gradient, which the previous
      stage waits for) and W (the weight gradients, which nobody waits for), and run the W passes where
      the other schedules wait. zb-h1 keeps 1f1b's order and memory; zbv runs two stages per rank in a V.
      Their orders, formulas and why are written above their generators below.

Time model and the bubble. A forward of one microbatch through one rank's share of the model (L/p layers)
takes f, its backward b (2 f in this file's tests: the backward computes both the input's and the
weights' gradients); an action on one virtual stage does 1/V of that work: f/V and b/V. Sending takes no
time (the simulator can charge each message between ranks a fixed time, but the formulas below are for
free sends), and a send never waits for its receiver (sends are asynchronous; receives wait). A step lasts T,
from the first action's start to the last one's end on any rank; every rank works m (f + b) of it, and the
rest is its bubble (waiting to be filled, waiting to be drained). Bubble fraction = (T - m (f + b)) / T,
the same on every rank:
  gpipe, 1f1b    T = (m + p - 1)(f + b):        bubble = (p - 1) / (m + p - 1)
                 (the forward wave reaches the last rank after (p - 1) f, the backward wave comes back to
                 rank 0 after (p - 1) b; all other time is work)
  interleaved    T = m (f + b) + (p - 1)(f + b) / V:   bubble = (p - 1) / (V m + p - 1)
                 (the same fill and drain, through stages V times shorter)
pipeline_simulate (pipeline_simulator.h) runs the lists under this model and measures T and the bubble; the
tests check that measurement against these formulas for every p <= 8, m <= 16, V <= 4.

Activations in flight (records a rank holds at its peak, each covering L / (p V) layers): gpipe m;
1f1b min(p - r, m); interleaved w + 1 records for w warm-up forwards (the steady state's first forward
comes before its first backward), or m V when the warm-up is everything. Rank 0 holds the most. zb-h1 as 1f1b,
zbv 2p on every rank (above their generators).
*/
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include "../utils.h"

enum class PipelineSchedule { GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleV };

// One pass of one microbatch through one of this rank's virtual stages. Backward is the whole backward
// pass under a schedule that does not split it, else only its input-gradient part (what the previous stage
// waits for); Weights is then the weight-gradient part, which nothing downstream waits for.
struct PipelineAction {
    enum Kind { Forward, Backward, Weights } kind;
    int microbatch;
    int virtual_stage;
};

inline const std::vector<std::string>& pipeline_schedule_names() {
    static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv"};
    return names;
}
inline PipelineSchedule pipeline_schedule_from_name(const std::string& name) {
    if (name == "gpipe") return PipelineSchedule::GPipe;
    if (name == "1f1b") return PipelineSchedule::OneFOneB;
    if (name == "interleaved") return PipelineSchedule::Interleaved;
    if (name == "zb-h1") return PipelineSchedule::ZeroBubbleH1;
    if (name == "zbv") return PipelineSchedule::ZeroBubbleV;
    fatal("pipeline schedule '%s': not a schedule (gpipe, 1f1b, interleaved, zb-h1, zbv)", name.c_str());
}
inline const char* pipeline_schedule_name(PipelineSchedule schedule) {
    return pipeline_schedule_names()[(int)schedule].c_str();
}

// Whether the schedule runs the backward as two actions, Backward (input gradient) and Weights.
inline bool pipeline_splits_backward(PipelineSchedule schedule) {
    return schedule == PipelineSchedule::ZeroBubbleH1 || schedule == PipelineSchedule::ZeroBubbleV;
}

// Where the model stages sit: virtual stage v of rank r is model stage v p + r in loops, and under zbv, in a V,
// stage r (v = 0) and 2p - 1 - r (v = 1).
inline int pipeline_model_stage(PipelineSchedule schedule, int rank, int virtual_stage, int p) {
    if (schedule == PipelineSchedule::ZeroBubbleV && virtual_stage == 1) return 2 * p - 1 - rank;
    return virtual_stage * p + rank;
}
inline int pipeline_stage_rank(PipelineSchedule schedule, int stage, int p) {
    return schedule == PipelineSchedule::ZeroBubbleV && stage >= p ? 2 * p - 1 - stage : stage % p;
}

// The first layer (0-based) of model stage `stage`: the layers of the stages before it.
inline int pipeline_first_layer(const std::vector<int>& stage_layers, int stage) {
    int first = 0;
    for (int s = 0; s < stage; s++) first += stage_layers[s];
    return first;
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

// Refuses a layout no schedule can run, in one line.
inline void pipeline_check_layout(PipelineSchedule schedule, int rank, int p, int m, int V) {
    const char* name = pipeline_schedule_name(schedule);
    if (p < 1 || m < 1 || V < 1) fatal("pipeline %s: p %d, m %d, V %d must all be at least 1", name, p, m, V);
    if (rank < 0 || rank >= p) fatal("pipeline %s: rank %d is not one of the %d pipeline ranks", name, rank, p);
    if (schedule == PipelineSchedule::ZeroBubbleV && V != 2)
        fatal("pipeline zbv: %d virtual stages per rank; the V holds 2", V);
    if (schedule != PipelineSchedule::Interleaved && schedule != PipelineSchedule::ZeroBubbleV && V != 1)
        fatal("pipeline %s: %d virtual stages per rank; only the interleaved schedule has more than 1", name, V);
    if (schedule == PipelineSchedule::Interleaved && m % p != 0)
        fatal("pipeline interleaved: %d microbatches are not a multiple of the %d pipeline ranks", m, p);
    if (schedule == PipelineSchedule::ZeroBubbleH1 && m < p)
        fatal("pipeline zb-h1: %d microbatches are fewer than the %d pipeline ranks", m, p);
    if (schedule == PipelineSchedule::ZeroBubbleV && m < 2 * p - 1)
        fatal("pipeline zbv: %d microbatches are fewer than 2 p - 1 = %d", m, 2 * p - 1);
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

// ----------------------------------------------------------------------------
// the schedules

inline std::vector<PipelineAction> gpipe_actions(int m) {
    std::vector<PipelineAction> actions;
    for (int j = 0; j < m; j++) actions.push_back({PipelineAction::Forward, j, 0});
    for (int j = 0; j < m; j++) actions.push_back({PipelineAction::Backward, j, 0});
    return actions;
}

inline std::vector<PipelineAction> one_f_one_b_actions(int rank, int p, int m) {
    std::vector<PipelineAction> actions;
    const int warmup = std::min(p - rank - 1, m);
    int forwards = 0, backwards = 0;  // microbatches whose forward / backward this rank has scheduled
    // warm-up: fill the pipeline. Rank r's first backward can only come back after microbatch 0 has gone
    // through the p - r - 1 ranks after it, so it runs that many forwards ahead (the last rank none).
    for (int i = 0; i < warmup; i++) actions.push_back({PipelineAction::Forward, forwards++, 0});
    // steady state: one forward, then the backward of the oldest microbatch in flight. Each new record is
    // matched by one freed, so the rank never holds more than warmup + 1.
    while (forwards < m) {
        actions.push_back({PipelineAction::Forward, forwards++, 0});
        actions.push_back({PipelineAction::Backward, backwards++, 0});
    }
    // cool-down: drain the pipeline, the backwards of the warm-up's microbatches.
    while (backwards < m) actions.push_back({PipelineAction::Backward, backwards++, 0});
    return actions;
}

// The k-th forward (or backward) of a rank under the interleaved schedule. Rounds of p V actions: round g
// runs microbatches g p .. g p + p - 1 through every virtual stage, p microbatches per virtual stage, in
// order 0..V-1 for forwards and V-1..0 for backwards.
inline PipelineAction interleaved_action(PipelineAction::Kind kind, int k, int p, int V) {
    const int round = k / (p * V), in_round = k % (p * V);
    const int virtual_stage = kind == PipelineAction::Forward ? in_round / p : V - 1 - in_round / p;
    return {kind, round * p + in_round % p, virtual_stage};
}

inline int interleaved_warmup(int rank, int p, int m, int V) {
    return std::min((p - rank - 1) * 2 + (V - 1) * p, m * V);
}

inline std::vector<PipelineAction> interleaved_actions(int rank, int p, int m, int V) {
    std::vector<PipelineAction> actions;
    const int total = m * V;  // forwards (and backwards) this rank runs
    const int warmup = interleaved_warmup(rank, p, m, V);
    int forwards = 0, backwards = 0;
    // warm-up: rank r's first backward (microbatch 0 on its last virtual stage) exists only once microbatch 0
    // has gone through all S stages and come back. Meanwhile the rank runs the rest of round 0, (V - 1) p
    // forwards, plus p - r - 1 for the ranks after it, as in 1f1b; with free sends that is already enough
    // for the smallest bubble. The standard form doubles the p - r - 1: once a send takes time, every
    // message in the steady state would stall the rank, and these extra forwards (p - r - 1 more records)
    // absorb the wait. With sends of 0.1 f, p = 4, m = 16, V = 2: 53.9 f per step, 57.9 f without them
    // (dev/test/test_pipeline.cu checks both claims).
    for (int i = 0; i < warmup; i++) actions.push_back(interleaved_action(PipelineAction::Forward, forwards++, p, V));
    // steady state: one forward, one backward
    while (forwards < total) {
        actions.push_back(interleaved_action(PipelineAction::Forward, forwards++, p, V));
        actions.push_back(interleaved_action(PipelineAction::Backward, backwards++, p, V));
    }
    // cool-down: the backwards left over
    while (backwards < total) actions.push_back(interleaved_action(PipelineAction::Backward, backwards++, p, V));
    return actions;
}

// zb-h1: 1f1b's order of forwards and backwards, each backward split into B (input gradient) and W (weight
// gradients), rank r running its first r W passes late. With free sends and F, B, W the times of the three
// passes of one microbatch through one rank's layers (B >= W), for m >= p:
//   T = m (F + B + W) + (p - 1)(F + B - W),   bubble = (p - 1)(F + B - W) / T
// against 1f1b's (p - 1)(F + B + W): with F = B = W a third of it, (p - 1) / (3 m + p - 1). Why: the last rank
// runs F and B back to back for its first p - 1 microbatches (their W wait), so each backward wave leaves it
// after F + B, not F + B + W, and comes back to rank 0 p - 1 B's later; in the cool-down each rank fills the
// time between two arriving B's with the W it held back. Rank r holds r of them: the last rank, whose B's
// start every wave, defers p - 1, rank 0 none (dev/test/test_pipeline.cu checks T, the bubble and the peaks
// by simulation for every p <= 8, p <= m <= 16). Records in flight (F to B) as in 1f1b, p - r; weight records
// (B to W) r + 1 at the peak.
inline std::vector<PipelineAction> zero_bubble_h1_actions(int rank, int p, int m) {
    std::vector<PipelineAction> actions;
    const int warmup = std::min(p - rank - 1, m), deferred = rank;
    int forwards = 0, backwards = 0, weights = 0;
    for (int i = 0; i < warmup; i++) actions.push_back({PipelineAction::Forward, forwards++, 0});
    while (forwards < m) {
        actions.push_back({PipelineAction::Forward, forwards++, 0});
        actions.push_back({PipelineAction::Backward, backwards++, 0});
        if (backwards > deferred) actions.push_back({PipelineAction::Weights, weights++, 0});
    }
    while (backwards < m) {  // cool-down: every B brings one W held back
        actions.push_back({PipelineAction::Backward, backwards++, 0});
        actions.push_back({PipelineAction::Weights, weights++, 0});
    }
    while (weights < m) actions.push_back({PipelineAction::Weights, weights++, 0});
    return actions;
}

// zbv: two stages per rank in a V (rank r holds stages r and 2p - 1 - r: chunk 0 going down the ranks, chunk 1
// coming back up), each backward split into B and W. Let one pass of one microbatch through one stage (half a
// rank's layers) take 1 unit, the same for F, B and W. Rank r's order:
//   1. 2(p - r) - 1 forwards on chunk 0: microbatch 0 reaches rank r at time r and comes back up to its chunk 1
//      at 2p - 1 - r; the forwards fill the time between.
//   2. r times: a forward on chunk 1, a forward on chunk 0. The deeper ranks' chunk 1 gets its inputs sooner,
//      the shallower ranks' later, and the extra chunk-0 forwards keep the ranks below supplied.
//   3. p - r times: F, B and W on chunk 1. Microbatch 0's loss (stage 2p - 1, on rank 0) has been taken; its B
//      comes down chunk 1 rank by rank, and W runs at once, while chunk 0's B is still on its way.
//   4. the steady state: F, B, W on chunk 0, then F, B, W on chunk 1 (one microbatch's whole work, both stages),
//      until every forward has run.
//   5. the cool-down: r times B on chunk 0 and B on chunk 1, their W held back (as in zb-h1: the deeper ranks'
//      B's are what the others wait for); then p - r times B and W on chunk 0; then the W's held back.
// With free sends, for m >= 2p - 1 (fewer microbatches leave phase 1 or 2 without forwards to run):
//   T = 6 m + p - 1 units,   bubble = (p - 1) / (6 m + p - 1)
// which is the least any schedule can do: rank p - 1 cannot start before microbatch 0 has gone through p - 1
// stages, and then has 6 m units of work. In the file's time model (a rank's F = f, B + W = b = 2 f, a pass
// through one of its two stages half of that) the same fraction: at p = 4, m = 8 it is 3/51 = 0.059, against
// zb-h1's 3/27 and 1f1b's 3/11. Records in flight (F to B) 2p on every rank, each of L/(2p) layers: the memory
// of 1f1b's rank 0 (p records of L/p layers), on every rank; weight records (B to W) 2r + 1 at the peak
// (dev/test/test_pipeline.cu checks T, the bubble and both peaks by simulation for every p <= 8,
// 2p - 1 <= m <= 16).
inline std::vector<PipelineAction> zero_bubble_v_actions(int rank, int p, int m) {
    std::vector<PipelineAction> actions;
    int forwards[2] = {0, 0}, backwards[2] = {0, 0}, weights[2] = {0, 0};  // per chunk, scheduled so far
    auto forward = [&](int chunk) { actions.push_back({PipelineAction::Forward, forwards[chunk]++, chunk}); };
    auto backward = [&](int chunk) { actions.push_back({PipelineAction::Backward, backwards[chunk]++, chunk}); };
    auto weight = [&](int chunk) { actions.push_back({PipelineAction::Weights, weights[chunk]++, chunk}); };
    for (int i = 0; i < 2 * (p - rank) - 1; i++) forward(0);
    for (int i = 0; i < rank; i++) forward(1), forward(0);
    for (int i = 0; i < p - rank; i++) forward(1), backward(1), weight(1);
    while (forwards[1] < m) {
        if (forwards[0] < m) forward(0);
        backward(0), weight(0);
        forward(1), backward(1), weight(1);
    }
    for (int i = 0; i < rank; i++) backward(0), backward(1);
    for (int i = 0; i < p - rank; i++) backward(0), weight(0);
    while (weights[1] < m) weight(1);
    while (weights[0] < m) weight(0);
    return actions;
}

// The ordered actions of pipeline rank `rank` of p, for m microbatches and V virtual stages per rank (V = 1
// for gpipe, 1f1b and zb-h1, 2 for zbv).
inline std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    switch (schedule) {
        case PipelineSchedule::GPipe: return gpipe_actions(m);
        case PipelineSchedule::OneFOneB: return one_f_one_b_actions(rank, p, m);
        case PipelineSchedule::Interleaved: return interleaved_actions(rank, p, m, V);
        case PipelineSchedule::ZeroBubbleH1: return zero_bubble_h1_actions(rank, p, m);
        case PipelineSchedule::ZeroBubbleV: return zero_bubble_v_actions(rank, p, m);
    }
    fatal("unknown pipeline schedule %d", (int)schedule);
}

// "F3" (forward of microbatch 3; "B3" backward, "W3" weight gradients), or "F3.1" (on virtual stage 1)
// when there are virtual stages
inline std::string pipeline_action_label(const PipelineAction& a, bool virtual_stages) {
    const char* kind = a.kind == PipelineAction::Forward ? "F" : a.kind == PipelineAction::Backward ? "B" : "W";
    std::string label = kind + std::to_string(a.microbatch);
    return virtual_stages ? label + "." + std::to_string(a.virtual_stage) : label;
}

// "F0 F1 B0 F2 B1 ...", or "F0.0 F1.0 F0.1 ..." (microbatch.virtual_stage) when any action is on a
// virtual stage other than 0.
inline std::string pipeline_describe(const std::vector<PipelineAction>& actions) {
    bool virtual_stages = false;
    for (const PipelineAction& a : actions) virtual_stages |= a.virtual_stage != 0;
    std::string text;
    for (const PipelineAction& a : actions)
        text += (text.empty() ? "" : " ") + pipeline_action_label(a, virtual_stages);
    return text;
}

// The bubble fraction of the time model above (the same on every rank).
inline double pipeline_bubble_fraction(PipelineSchedule schedule, int p, int m, int V) {
    pipeline_check_layout(schedule, 0, p, m, V);
    if (schedule == PipelineSchedule::Interleaved) return (double)(p - 1) / ((double)V * m + p - 1);
    if (schedule == PipelineSchedule::ZeroBubbleH1) return (double)(p - 1) / (3.0 * m + p - 1);  // F = B = W
    if (schedule == PipelineSchedule::ZeroBubbleV) return (double)(p - 1) / (6.0 * m + p - 1);   // F = B = W
    return (double)(p - 1) / (double)(m + p - 1);
}

// Activation records rank `rank` holds at its peak (one per (microbatch, virtual stage) in flight).
inline int pipeline_peak_activations(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    switch (schedule) {
        case PipelineSchedule::GPipe: return m;
        case PipelineSchedule::OneFOneB:
        case PipelineSchedule::ZeroBubbleH1: return std::min(p - rank, m);
        case PipelineSchedule::ZeroBubbleV: return 2 * p;
        case PipelineSchedule::Interleaved: {
            const int warmup = interleaved_warmup(rank, p, m, V);
            return warmup == m * V ? m * V : warmup + 1;
        }
    }
    fatal("unknown pipeline schedule %d", (int)schedule);
}

// Weight records rank `rank` holds at its peak (one per B whose W has not run): zb-h1 r + 1, zbv 2r + 1, none
// elsewhere.
inline int pipeline_peak_weight_records(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    if (schedule == PipelineSchedule::ZeroBubbleH1) return std::min(rank + 1, m);
    return schedule == PipelineSchedule::ZeroBubbleV ? 2 * rank + 1 : 0;
}

// Head records (llmc/model/gpt2.cuh's HeadRecord) the rank holding the last stage keeps at its peak; 0 on the
// others. Where the backward is whole, the head's runs within the forward and one record serves all. Where
// it is split, a microbatch keeps its record from its F to its W on the last stage: zb-h1's last rank runs F
// and B back to back and holds back p - 1 W's, so min(p, m) records; zbv's rank 0 runs F, B and W of the last
// stage together, so 1.
inline int pipeline_peak_head_records(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    if (pipeline_stage_rank(schedule, p * V - 1, p) != rank) return 0;
    return schedule == PipelineSchedule::ZeroBubbleH1 ? std::min(p, m) : 1;
}

// Records handed out from a pool: an action of kind `takes` takes the lowest-numbered free record, the
// action of kind `frees` of the same (microbatch, virtual stage) uses it and frees it; other actions use
// none (-1). *pool_size says how many records the list needs at its peak. A freeing action without its
// taking action earlier in the list stops the program.
inline std::vector<int> pipeline_pool_assignment(const std::vector<PipelineAction>& actions,
                                                 PipelineAction::Kind takes, PipelineAction::Kind frees,
                                                 int* pool_size) {
    std::vector<int> record(actions.size(), -1);
    std::vector<char> busy;
    std::vector<std::pair<int, int>> owner;  // per record: the (microbatch, virtual stage) using it
    for (size_t i = 0; i < actions.size(); i++) {
        const PipelineAction& a = actions[i];
        const std::pair<int, int> key{a.microbatch, a.virtual_stage};
        if (a.kind == takes) {
            const size_t free = std::find(busy.begin(), busy.end(), 0) - busy.begin();
            if (free == busy.size()) { busy.push_back(0); owner.push_back({-1, -1}); }
            busy[free] = 1;
            owner[free] = key;
            record[i] = (int)free;
        } else if (a.kind == frees) {
            size_t used = 0;
            while (used < owner.size() && !(busy[used] && owner[used] == key)) used++;
            if (used == owner.size())
                fatal("pipeline: %s has no %s before it", pipeline_action_label(a, true).c_str(),
                      takes == PipelineAction::Forward ? "forward" : "backward");
            busy[used] = 0;
            record[i] = (int)used;
        }
    }
    *pool_size = (int)busy.size();
    return record;
}

// Which activation record each action of a list uses: a forward takes one, the backward of the same
// (microbatch, virtual stage) (its input-gradient part under a split backward) uses and frees it. The pool
// needs as many records as the list's peak (pipeline_peak_activations for the schedules above).
inline std::vector<int> pipeline_record_assignment(const std::vector<PipelineAction>& actions, int* pool_size) {
    return pipeline_pool_assignment(actions, PipelineAction::Forward, PipelineAction::Backward, pool_size);
}

// Which weight-gradient record ("W record": what the weight gradients need, kept from B until W) each action
// uses under a split backward: a Backward takes one, the Weights action of the same (microbatch, virtual
// stage) uses and frees it; -1 where none. Without the split (no Weights actions) the pool stays empty.
inline std::vector<int> pipeline_weight_record_assignment(const std::vector<PipelineAction>& actions, int* pool_size) {
    bool split = false;
    for (const PipelineAction& a : actions) split |= a.kind == PipelineAction::Weights;
    if (!split) {
        *pool_size = 0;
        return std::vector<int>(actions.size(), -1);
    }
    return pipeline_pool_assignment(actions, PipelineAction::Backward, PipelineAction::Weights, pool_size);
}

// Which head record each action of the last stage's rank uses: under a split backward a forward of the last
// stage takes one, the W of the same microbatch uses and frees it, and its B uses it between; otherwise every
// forward of the last stage uses record 0. -1 for every other action, and an empty pool on the other ranks.
inline std::vector<int> pipeline_head_assignment(const std::vector<PipelineAction>& actions, PipelineSchedule schedule,
                                                 int rank, int p, int V, int* pool_size) {
    std::vector<int> head(actions.size(), -1);
    *pool_size = 0;
    const int last = p * V - 1;
    auto on_last_stage = [&](const PipelineAction& a) {
        return pipeline_model_stage(schedule, rank, a.virtual_stage, p) == last;
    };
    if (pipeline_stage_rank(schedule, last, p) != rank) return head;
    if (!pipeline_splits_backward(schedule)) {
        *pool_size = 1;
        for (size_t i = 0; i < actions.size(); i++)
            if (actions[i].kind == PipelineAction::Forward && on_last_stage(actions[i])) head[i] = 0;
        return head;
    }
    std::vector<PipelineAction> last_stage;  // the last stage's actions, in order, and where each is in `actions`
    std::vector<size_t> where;
    for (size_t i = 0; i < actions.size(); i++)
        if (on_last_stage(actions[i])) { last_stage.push_back(actions[i]); where.push_back(i); }
    const std::vector<int> pool = pipeline_pool_assignment(last_stage, PipelineAction::Forward, PipelineAction::Weights,
                                                           pool_size);
    for (size_t k = 0; k < last_stage.size(); k++) {
        head[where[k]] = pool[k];
        if (last_stage[k].kind != PipelineAction::Backward) continue;
        for (size_t f = 0; f < k; f++)  // B uses the record its microbatch's F took
            if (last_stage[f].kind == PipelineAction::Forward && last_stage[f].microbatch == last_stage[k].microbatch)
                head[where[k]] = pool[f];
    }
    return head;
}
