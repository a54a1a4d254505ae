/*
Pipeline parallelism as data: which forward and backward passes each pipeline rank runs, in which order.

The model's layers are cut into S = p * V consecutive stages; pipeline rank r of p holds the V stages
r, r + p, r + 2p, ... ("virtual stages": virtual stage v of rank r is model stage s = v * p + r, and holds
layers [s L / S, (s+1) L / S)). A batch is cut into m microbatches. Microbatch j's forward pass goes
through stages 0, 1, ..., S-1 (each stage sends its output activations to the next), the loss is taken at
the end of stage S-1, and its backward pass comes back through S-1, ..., 0 (each stage sends the gradient
of its input to the previous one). A stage keeps the activations of a microbatch from its forward pass
until its backward pass: one "activation record" per (microbatch, virtual stage) in flight.

A schedule is a function (schedule, rank, p, m, V) -> the ordered list of this rank's actions, each
"forward or backward of microbatch j on virtual stage v". An executor (the training program) runs any
such list: before a forward it receives the input (except at stage 0), after it sends the output (except at
stage S-1); backwards the other way. Because a schedule is only data, it can be printed, simulated and
tested without a model (dev/test/test_pipeline.cu), and drawn from the trace of a real or simulated run
(scripts/pipeline_timeline.py).

The three schedules, for m microbatches on p ranks:

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
pipeline_simulate runs the lists under this model and measures T and the bubble; the tests check that
measurement against these formulas for every p <= 8, m <= 16, V <= 4.

Activations in flight (records a rank holds at its peak, each covering L / (p V) layers): gpipe m;
1f1b min(p - r, m); interleaved w + 1 records for w warm-up forwards (the steady state's first forward
comes before its first backward), or m V when the warm-up is everything. Rank 0 holds the most.
*/
#pragma once

#include <algorithm>
#include <string>
#include <vector>
#include "../utils.h"

enum class PipelineSchedule { GPipe, OneFOneB, Interleaved };

// One pass of one microbatch through one of this rank's virtual stages. Backward is the whole backward
// pass under a schedule that does not split it, else only its input-gradient part (what the previous stage
// waits for); Weights is then the weight-gradient part, which nothing downstream waits for.
struct PipelineAction {
    enum Kind { Forward, Backward, Weights } kind;
    int microbatch;
    int virtual_stage;
};

inline const std::vector<std::string>& pipeline_schedule_names() {
    static const std::vector<std::string> names = {"gpipe", "1f1b", "interleaved"};
    return names;
}
inline PipelineSchedule pipeline_schedule_from_name(const std::string& name) {
    if (name == "gpipe") return PipelineSchedule::GPipe;
    if (name == "1f1b") return PipelineSchedule::OneFOneB;
    if (name == "interleaved") return PipelineSchedule::Interleaved;
    fatal("pipeline schedule '%s': not a schedule (gpipe, 1f1b, interleaved)", name.c_str());
}
inline const char* pipeline_schedule_name(PipelineSchedule schedule) {
    return pipeline_schedule_names()[(int)schedule].c_str();
}

// Whether the schedule runs the backward as two actions, Backward (input gradient) and Weights.
inline bool pipeline_splits_backward(PipelineSchedule) { return false; }

// Time of one microbatch's forward, input-gradient backward and weight-gradient pass through each model
// stage (stages may be uneven), and the time of one message between ranks. A schedule that does not split
// the backward charges its Backward action backward + weights.
struct PipelineCosts {
    std::vector<double> forward, backward, weights;
    double send_ms = 0;
};
inline PipelineCosts pipeline_uniform_costs(int S, double forward, double backward, double weights,
                                            double send_ms = 0) {
    PipelineCosts costs;
    costs.forward.assign(S, forward);
    costs.backward.assign(S, backward);
    costs.weights.assign(S, weights);
    costs.send_ms = send_ms;
    return costs;
}

// Model stage of virtual stage v on rank r, and the layers [first, end) it holds out of L.
inline int pipeline_model_stage(int rank, int virtual_stage, int p) { return virtual_stage * p + rank; }
inline void pipeline_stage_layers(int rank, int virtual_stage, int p, int V, int num_layers, int* first, int* end) {
    const int s = pipeline_model_stage(rank, virtual_stage, p);
    *first = s * num_layers / (p * V);
    *end = (s + 1) * num_layers / (p * V);
}

// Which of the L + 2 parameter chunks (llmc/model/parameters.h: embeddings, blocks 0..L-1, final layernorm) rank
// `rank` holds: the blocks of its stages, the embedding chunk on the ranks of the first stage (the lookup)
// and of the last (the LM head, tied to wte), the final layernorm on the last.
inline std::vector<char> pipeline_held_chunks(int rank, int p, int V, int num_layers) {
    std::vector<char> held(num_layers + 2, 0);
    for (int v = 0; v < V; v++) {
        int first, end;
        pipeline_stage_layers(rank, v, p, V, num_layers, &first, &end);
        for (int layer = first; layer < end; layer++) held[layer + 1] = 1;
        if (first == 0) held[0] = 1;
        if (end == num_layers) held[0] = held[num_layers + 1] = 1;
    }
    return held;
}

// Refuses a layout no schedule can run, in one line.
inline void pipeline_check_layout(PipelineSchedule schedule, int rank, int p, int m, int V) {
    const char* name = pipeline_schedule_name(schedule);
    if (p < 1 || m < 1 || V < 1) fatal("pipeline %s: p %d, m %d, V %d must all be at least 1", name, p, m, V);
    if (rank < 0 || rank >= p) fatal("pipeline %s: rank %d is not one of the %d pipeline ranks", name, rank, p);
    if (schedule != PipelineSchedule::Interleaved && V != 1)
        fatal("pipeline %s: %d virtual stages per rank; only the interleaved schedule has more than 1", name, V);
    if (schedule == PipelineSchedule::Interleaved && m % p != 0)
        fatal("pipeline interleaved: %d microbatches are not a multiple of the %d pipeline ranks", m, p);
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

// The ordered actions of pipeline rank `rank` of p, for m microbatches and V virtual stages per rank (V = 1
// for gpipe and 1f1b). Model stage s = virtual_stage * p + rank holds layers [s L/(pV), (s+1) L/(pV)).
inline std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    switch (schedule) {
        case PipelineSchedule::GPipe: return gpipe_actions(m);
        case PipelineSchedule::OneFOneB: return one_f_one_b_actions(rank, p, m);
        case PipelineSchedule::Interleaved: return interleaved_actions(rank, p, m, V);
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
    return (double)(p - 1) / (double)(m + p - 1);
}

// Activation records rank `rank` holds at its peak (one per (microbatch, virtual stage) in flight).
inline int pipeline_peak_activations(PipelineSchedule schedule, int rank, int p, int m, int V) {
    pipeline_check_layout(schedule, rank, p, m, V);
    switch (schedule) {
        case PipelineSchedule::GPipe: return m;
        case PipelineSchedule::OneFOneB: return std::min(p - rank, m);
        case PipelineSchedule::Interleaved: {
            const int warmup = interleaved_warmup(rank, p, m, V);
            return warmup == m * V ? m * V : warmup + 1;
        }
    }
    fatal("unknown pipeline schedule %d", (int)schedule);
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

// ----------------------------------------------------------------------------
// timelines: what ran when. Filled by the simulator below, and by the training program from measured
// times (llmc/parallel/pipeline.h); both are measured and written out the same way.

struct PipelineEvent {
    PipelineAction action;
    double start_ms, end_ms;
    bool wait = false;  // measured runs: the rank waited for the action's message (not work)
};

struct PipelineTimeline {
    std::string schedule;                           // its name, for the trace
    int p = 1, m = 1, V = 1;
    std::vector<std::vector<PipelineEvent>> ranks;  // per pipeline rank, in the order it ran them
    // what pipeline_measure finds
    double step_ms = 0;                             // first start to last end, over all ranks
    std::vector<double> bubble_fraction;            // per rank: (step_ms - its busy time) / step_ms, where busy
                                                    // time is the actions' (waits are bubble)
    std::vector<int> peak_activations;              // per rank: most forwards whose backward had not run yet
    std::string problem;                            // simulator: why the lists cannot run (empty: they ran)
};

// Fills step_ms, bubble_fraction and peak_activations from the events.
inline void pipeline_measure(PipelineTimeline& timeline) {
    double first = 0, last = 0;
    bool any = false;
    for (const auto& events : timeline.ranks)
        for (const PipelineEvent& e : events) {
            first = any ? std::min(first, e.start_ms) : e.start_ms;
            last = any ? std::max(last, e.end_ms) : e.end_ms;
            any = true;
        }
    timeline.step_ms = last - first;
    timeline.bubble_fraction.assign(timeline.ranks.size(), 0.0);
    timeline.peak_activations.assign(timeline.ranks.size(), 0);
    for (size_t r = 0; r < timeline.ranks.size(); r++) {
        double busy = 0;
        int in_flight = 0;
        for (const PipelineEvent& e : timeline.ranks[r]) {
            if (e.wait) continue;
            busy += e.end_ms - e.start_ms;
            in_flight += e.action.kind == PipelineAction::Forward ? 1 : -1;
            timeline.peak_activations[r] = std::max(timeline.peak_activations[r], in_flight);
        }
        timeline.bubble_fraction[r] = timeline.step_ms > 0 ? (timeline.step_ms - busy) / timeline.step_ms : 0.0;
    }
}

// ----------------------------------------------------------------------------
// the simulator

// Runs the given per-rank action lists under the time model above: each rank takes its actions in order,
// each as soon as the rank is free and what it receives has arrived:
//   forward  (j, s > 0)        after forward (j, s - 1) ended      (its input activations)
//   backward (j, s < S - 1)    after backward (j, s + 1) ended     (the gradient of its output)
//   backward (j, s)            after forward (j, s) ended          (its own activation record)
// forward_ms and backward_ms are one microbatch through one rank's L/p layers; an action takes 1/V of it.
// A message between two ranks arrives send_ms after the pass that sent it ended (none when p = 1: every
// stage is on the one rank).
// Start times follow from these rules alone (the longest path to each action), so the order in which the
// loop below visits the ranks changes nothing. When no rank can take its next action, the lists deadlock:
// `problem` names what each waiting rank waits for. Lists that run but leave a pass out, run one twice,
// or name a microbatch or virtual stage that does not exist, are reported there too.
inline PipelineTimeline pipeline_simulate_actions(const std::vector<std::vector<PipelineAction>>& lists,
                                                  const std::string& schedule_name, int m, int V,
                                                  double forward_ms, double backward_ms, double send_ms = 0) {
    PipelineTimeline timeline;
    timeline.schedule = schedule_name;
    timeline.p = (int)lists.size();
    timeline.m = m;
    timeline.V = V;
    timeline.ranks.resize(lists.size());
    const int p = timeline.p, S = p * V;
    const double arrives_after = p > 1 ? send_ms : 0.0;  // a neighbouring stage is always on another rank
    // end time of each pass (microbatch j, model stage s), or -1 while it has not run
    std::vector<double> forward_end((size_t)m * S, -1.0), backward_end((size_t)m * S, -1.0);
    auto at = [S](int j, int s) { return (size_t)j * S + s; };
    auto stage_name = [p, V](const char* kind, int j, int s) {
        return std::string(kind) + std::to_string(j) + " of stage " + std::to_string(s) + " (rank " +
               std::to_string(s % p) + (V > 1 ? ", virtual stage " + std::to_string(s / p) : "") + ")";
    };
    for (int r = 0; r < p; r++)
        for (const PipelineAction& a : lists[r])
            if (a.microbatch < 0 || a.microbatch >= m || a.virtual_stage < 0 || a.virtual_stage >= V) {
                timeline.problem = "rank " + std::to_string(r) + " has " + pipeline_action_label(a, true) +
                                   ": no such microbatch or virtual stage";
                return timeline;
            }

    std::vector<size_t> next(p, 0);     // each rank's next action
    std::vector<double> free_at(p, 0);  // when each rank finished its previous action
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int r = 0; r < p; r++) {
            while (next[r] < lists[r].size()) {
                const PipelineAction& a = lists[r][next[r]];
                const int j = a.microbatch, s = pipeline_model_stage(r, a.virtual_stage, p);
                double ready = free_at[r];
                std::vector<double>& done = a.kind == PipelineAction::Forward ? forward_end : backward_end;
                if (done[at(j, s)] >= 0) {
                    timeline.problem = "rank " + std::to_string(r) + " runs " +
                                       stage_name(a.kind == PipelineAction::Forward ? "F" : "B", j, s) + " twice";
                    return timeline;
                }
                if (a.kind == PipelineAction::Forward) {
                    if (s > 0 && forward_end[at(j, s - 1)] < 0) break;  // waits for its input
                    if (s > 0) ready = std::max(ready, forward_end[at(j, s - 1)] + arrives_after);
                } else {
                    if (forward_end[at(j, s)] < 0) break;  // its forward has not run
                    if (s < S - 1 && backward_end[at(j, s + 1)] < 0) break;  // waits for its output's gradient
                    ready = std::max(ready, forward_end[at(j, s)]);
                    if (s < S - 1) ready = std::max(ready, backward_end[at(j, s + 1)] + arrives_after);
                }
                const double duration = (a.kind == PipelineAction::Forward ? forward_ms : backward_ms) / V;
                done[at(j, s)] = ready + duration;
                free_at[r] = ready + duration;
                timeline.ranks[r].push_back({a, ready, ready + duration});
                next[r]++;
                progressed = true;
            }
        }
    }

    // deadlock: every rank that has actions left waits for a pass that has not run
    std::string waits;
    for (int r = 0; r < p; r++) {
        if (next[r] == lists[r].size()) continue;
        const PipelineAction& a = lists[r][next[r]];
        const int j = a.microbatch, s = pipeline_model_stage(r, a.virtual_stage, p);
        std::string what;
        if (a.kind == PipelineAction::Forward) what = stage_name("F", j, s - 1);
        else if (forward_end[at(j, s)] < 0) what = stage_name("F", j, s);
        else what = stage_name("B", j, s + 1);
        waits += (waits.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits at " +
                 pipeline_action_label(a, V > 1) + " for " + what;
    }
    if (!waits.empty()) {
        timeline.problem = "deadlock: " + waits;
        return timeline;
    }
    // every list ran to its end: was every pass there?
    for (int j = 0; j < m; j++)
        for (int s = 0; s < S; s++) {
            if (forward_end[at(j, s)] < 0) timeline.problem = stage_name("F", j, s) + " never ran";
            else if (backward_end[at(j, s)] < 0) timeline.problem = stage_name("B", j, s) + " never ran";
            if (!timeline.problem.empty()) return timeline;
        }
    pipeline_measure(timeline);
    return timeline;
}

inline PipelineTimeline pipeline_simulate(PipelineSchedule schedule, int p, int m, int V, double forward_ms,
                                          double backward_ms, double send_ms = 0) {
    pipeline_check_layout(schedule, 0, p, m, V);
    std::vector<std::vector<PipelineAction>> lists;
    for (int r = 0; r < p; r++) lists.push_back(pipeline_actions(schedule, r, p, m, V));
    return pipeline_simulate_actions(lists, pipeline_schedule_name(schedule), m, V, forward_ms, backward_ms, send_ms);
}

// ----------------------------------------------------------------------------
// when a sent gradient's buffer may be used again

/*
A send completes once its receiver takes the message (NCCL's always; MPI's large ones), so a rank that waits
for one of its sends waits for the receiver to get to the matching receive. The executor (llmc/parallel/pipeline.h)
sends a stage's output from the stage record and waits for that send before the record's next forward
pass: safe, since that comes after the record's backward pass, which needed the next stage to have taken
the activations and used them. The gradient of a stage's input is different: the previous stage takes it
only at its backward pass, and nothing obliges that to come before the sender's next actions. Under the
interleaved schedule, waiting for it when the record is reused deadlocks (p 2, V 2, m 4: before their
forwards F3.0 and F2.0, ranks 0 and 1 each wait for the other to take a gradient, which the other takes
only at a backward after that forward). So gradients go out from
staging buffers, and the sender waits for each only where that cannot deadlock: before its first later
action that depends on the receiver having taken the message (or at the end of the step). "Depends on"
is found with vector clocks: clock(a)[q] = how many of rank q's actions must have run before action a, by
each rank's order and the simulator's rules (a forward after the previous stage's forward, a backward
after the next stage's backward and after its own forward). Action w depends on rank q's action c iff
clock(w)[q] > c's index. The staging buffers are then handed out like the records: the lowest free one.
*/
struct PipelineGradientSends {
    std::vector<int> buffer;                      // per action: the staging buffer of its gradient's send, or -1
    std::vector<std::vector<int>> finish_before;  // per action, and one more for the end of the step: the
                                                  // buffers whose sends must have finished before it
    int buffers = 0;                              // how many staging buffers the rank needs
};

inline PipelineGradientSends pipeline_gradient_sends(const std::vector<std::vector<PipelineAction>>& lists,
                                                     int rank, int m, int V) {
    const int p = (int)lists.size(), S = p * V;
    // where each pass (kind, microbatch, model stage) sits in its rank's list
    std::vector<int> index_of(2 * (size_t)m * S, -1);
    auto pass = [&](PipelineAction::Kind kind, int j, int s) -> int& { return index_of[((size_t)kind * m + j) * S + s]; };
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < lists[r].size(); i++) {
            const PipelineAction& a = lists[r][i];
            pass(a.kind, a.microbatch, pipeline_model_stage(r, a.virtual_stage, p)) = (int)i;
        }
    // vector clocks, computed in an order the dependencies allow
    std::vector<std::vector<std::vector<int>>> clock(p);
    for (int r = 0; r < p; r++) clock[r].resize(lists[r].size());
    std::vector<size_t> next(p, 0);  // each rank's first action without a clock yet
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int r = 0; r < p; r++)
            while (next[r] < lists[r].size()) {
                const size_t i = next[r];
                const PipelineAction& a = lists[r][i];
                const int j = a.microbatch, s = pipeline_model_stage(r, a.virtual_stage, p);
                std::vector<std::pair<int, int>> needs;  // (rank, index) of the passes this one waits for
                if (a.kind == PipelineAction::Forward && s > 0) needs.push_back({(s - 1) % p, pass(PipelineAction::Forward, j, s - 1)});
                if (a.kind == PipelineAction::Backward) {
                    needs.push_back({r, pass(PipelineAction::Forward, j, s)});
                    if (s < S - 1) needs.push_back({(s + 1) % p, pass(PipelineAction::Backward, j, s + 1)});
                }
                bool ready = true;
                for (auto [q, k] : needs) ready &= k >= 0 && (size_t)k < next[q];
                if (!ready) break;
                std::vector<int> c(p, 0);
                if (i > 0) c = clock[r][i - 1];
                c[r] = (int)i;
                for (auto [q, k] : needs) {
                    for (int x = 0; x < p; x++) c[x] = std::max(c[x], clock[q][k][x]);
                    c[q] = std::max(c[q], k + 1);
                }
                clock[r][i] = c;
                next[r]++;
                progressed = true;
            }
    }
    for (int r = 0; r < p; r++)
        if (next[r] < lists[r].size()) fatal("pipeline: the action lists deadlock (pipeline_simulate says where)");
    // the sends of `rank`, and where each may be waited for
    const std::vector<PipelineAction>& mine = lists[rank];
    PipelineGradientSends sends;
    sends.buffer.assign(mine.size(), -1);
    sends.finish_before.assign(mine.size() + 1, {});
    std::vector<char> busy;
    for (size_t i = 0; i < mine.size(); i++) {
        for (int b : sends.finish_before[i]) busy[b] = 0;
        const PipelineAction& a = mine[i];
        const int s = pipeline_model_stage(rank, a.virtual_stage, p);
        if (a.kind != PipelineAction::Backward || s == 0) continue;
        const int receiver = (s - 1) % p, taken = pass(PipelineAction::Backward, a.microbatch, s - 1);
        size_t wait = i + 1;
        while (wait < mine.size() && clock[rank][wait][receiver] <= taken) wait++;
        const int b = (int)(std::find(busy.begin(), busy.end(), 0) - busy.begin());
        if (b == (int)busy.size()) busy.push_back(0);
        busy[b] = 1;
        sends.buffer[i] = b;
        sends.finish_before[wait].push_back(b);
    }
    sends.buffers = (int)busy.size();
    return sends;
}

// ----------------------------------------------------------------------------
// Chrome trace event format (chrome://tracing, https://ui.perfetto.dev, scripts/pipeline_timeline.py): one
// complete event ("ph": "X") per action ("F3", "B3", "W3"; category "work") and per measured wait for a message
// ("wait F3": before F3, category "wait"), thread = pipeline rank, times in microseconds, plus a name for
// each rank's row and the layout under "otherData".

inline std::string pipeline_chrome_trace(const PipelineTimeline& timeline) {
    std::string json = "{\"otherData\": {\"schedule\": \"" + timeline.schedule + "\", \"pipeline_ranks\": " +
                       std::to_string(timeline.p) + ", \"microbatches\": " + std::to_string(timeline.m) +
                       ", \"virtual_stages\": " + std::to_string(timeline.V) + "},\n\"traceEvents\": [";
    char line[256];
    const char* separator = "\n";
    for (size_t r = 0; r < timeline.ranks.size(); r++) {
        snprintf(line, sizeof(line), "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %zu, "
                 "\"args\": {\"name\": \"rank %zu\"}}", separator, r, r);
        json += line;
        separator = ",\n";
    }
    for (size_t r = 0; r < timeline.ranks.size(); r++)
        for (const PipelineEvent& e : timeline.ranks[r]) {
            snprintf(line, sizeof(line),
                     "%s{\"name\": \"%s%c%d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %zu, \"ts\": %.3f, "
                     "\"dur\": %.3f, \"args\": {\"microbatch\": %d, \"virtual_stage\": %d}}",
                     separator, e.wait ? "wait " : "", e.action.kind == PipelineAction::Forward ? 'F' : e.action.kind == PipelineAction::Backward ? 'B' : 'W',
                     e.action.microbatch, e.wait ? "wait" : "work", r,
                     e.start_ms * 1000.0, (e.end_ms - e.start_ms) * 1000.0, e.action.microbatch,
                     e.action.virtual_stage);
            json += line;
            separator = ",\n";
        }
    json += "\n]}\n";
    return json;
}
