/*
Every pipeline rank's action list played at once, without a model: the simulator of the time model that
llmc/parallel/pipeline_schedule.h states, and the groups of sends and receives the executor issues between actions.

Apart from the schedules because it answers another question. pipeline_schedule.h says what one rank runs, in
which order, and which records it holds, from (schedule, rank, p, m, V) alone; nothing there looks at another
rank. Everything here needs all p lists together: when an action can start, given the passes it waits for on
other ranks (pipeline_simulate_actions); which messages the actions exchange, and in which group each send goes
so that its receiver is already waiting (pipeline_message_groups places them by that simulated time); and whether
those groups complete under NCCL's synchronous semantics (pipeline_check_message_groups) and how long they take
(pipeline_simulate_groups). A pipeline plays every rank's lists once, when it is made (llmc/parallel/pipeline.h's
pipeline_create, through pipeline_all_groups), and keeps its rank's groups; the measured step is replayed here
(llmc/parallel/pipeline_timeline.h's pipeline_replay), the planner times a layout's bubble here
(llmc/planning/planner.h), and dev/test/test_pipeline.cu checks every schedule's formulas against it.
*/
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>
#include "../utils.h"
#include "pipeline_schedule.h"

// ----------------------------------------------------------------------------
// timelines: what ran when. Filled by the simulator below, and by the training program from measured times
// (llmc/parallel/pipeline_timeline.h); both are measured and written out the same way.

struct PipelineEvent {
    PipelineAction action;
    double start_ms, end_ms;
    bool wait = false;    // measured runs: the rank waited for the action's message (not work)
    double work_ms = -1;  // measured runs: the processor time the action took (-1: end - start)
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
            in_flight += e.action.kind == PipelineAction::Forward ? 1 : e.action.kind == PipelineAction::Backward ? -1 : 0;
            timeline.peak_activations[r] = std::max(timeline.peak_activations[r], in_flight);
        }
        timeline.bubble_fraction[r] = timeline.step_ms > 0 ? (timeline.step_ms - busy) / timeline.step_ms : 0.0;
    }
}

// An empty timeline of the layout, for the simulator or a measured step to fill.
inline PipelineTimeline pipeline_timeline_of(PipelineSchedule schedule, int p, int m, int V) {
    PipelineTimeline timeline;
    timeline.schedule = pipeline_schedule_name(schedule);
    timeline.p = p;
    timeline.m = m;
    timeline.V = V;
    timeline.ranks.resize(p);
    return timeline;
}

// ----------------------------------------------------------------------------
// the simulator

// Runs the given per-rank action lists under pipeline_schedule.h's time model: each rank takes its actions in order,
// each as soon as the rank is free and what it receives has arrived:
//   forward  (j, s > 0)        after forward (j, s - 1) ended      (its input activations)
//   backward (j, s < S - 1)    after backward (j, s + 1) ended     (the gradient of its output)
//   backward (j, s)            after forward (j, s) ended          (its own activation record)
//   weights  (j, s)            after backward (j, s) ended         (what its B kept)
// forward_ms and backward_ms are one microbatch through one rank's L/p layers; an action takes 1/V of it;
// lists that split the backward give B and W half of backward_ms each.
// A message between two ranks arrives send_ms after the pass that sent it ended (none when p = 1: every
// stage is on the one rank). Given `durations` (durations[r][i] for lists[r][i], in ms), each action takes its
// own time instead (pipeline_replay: a measured step's).
// Start times follow from these rules alone (the longest path to each action), so the order in which the
// loop below visits the ranks changes nothing. When no rank can take its next action, the lists deadlock:
// `problem` names what each waiting rank waits for. Lists that run but leave a pass out, run one twice,
// or name a microbatch or virtual stage that does not exist, are reported there too.
inline PipelineTimeline pipeline_simulate_actions(const std::vector<std::vector<PipelineAction>>& lists,
                                                  PipelineSchedule schedule, int m, int V,
                                                  double forward_ms, double backward_ms, double send_ms = 0,
                                                  const std::vector<std::vector<double>>* durations = nullptr) {
    PipelineTimeline timeline = pipeline_timeline_of(schedule, (int)lists.size(), m, V);
    const int p = timeline.p, S = p * V;
    // a message takes send_ms between ranks; zbv's two stages on rank p - 1 hand over in memory
    auto arrives_after = [&](int from_stage, int to_stage) {
        return pipeline_stage_rank(schedule, from_stage, p) == pipeline_stage_rank(schedule, to_stage, p) ? 0.0 : send_ms;
    };
    // end time of each pass (microbatch j, model stage s), or -1 while it has not run
    std::vector<double> forward_end((size_t)m * S, -1.0), backward_end((size_t)m * S, -1.0),
        weights_end((size_t)m * S, -1.0);
    // lists with W actions split each backward into two halves: B and W take backward_ms / 2 each
    bool split = false;
    for (const std::vector<PipelineAction>& list : lists)
        for (const PipelineAction& a : list) split |= a.kind == PipelineAction::Weights;
    const double kind_ms[3] = {forward_ms, split ? backward_ms / 2 : backward_ms, backward_ms / 2};
    const char* kind_letter[3] = {"F", "B", "W"};
    auto at = [S](int j, int s) { return (size_t)j * S + s; };
    auto stage_name = [&](const char* kind, int j, int s) {
        return std::string(kind) + std::to_string(j) + " of stage " + std::to_string(s) + " (rank " +
               std::to_string(pipeline_stage_rank(schedule, s, p)) +
               (V > 1 ? ", virtual stage " + std::to_string(s / p) : "") + ")";
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
                const int j = a.microbatch, s = pipeline_model_stage(schedule, r, a.virtual_stage, p);
                double ready = free_at[r];
                std::vector<double>& done = a.kind == PipelineAction::Forward    ? forward_end
                                            : a.kind == PipelineAction::Backward ? backward_end
                                                                                 : weights_end;
                if (done[at(j, s)] >= 0) {
                    timeline.problem = "rank " + std::to_string(r) + " runs " + stage_name(kind_letter[a.kind], j, s) +
                                       " twice";
                    return timeline;
                }
                if (a.kind == PipelineAction::Forward) {
                    if (s > 0 && forward_end[at(j, s - 1)] < 0) break;  // waits for its input
                    if (s > 0) ready = std::max(ready, forward_end[at(j, s - 1)] + arrives_after(s - 1, s));
                } else if (a.kind == PipelineAction::Weights) {
                    if (backward_end[at(j, s)] < 0) break;  // its B has not run
                    ready = std::max(ready, backward_end[at(j, s)]);
                } else {
                    if (forward_end[at(j, s)] < 0) break;  // its forward has not run
                    if (s < S - 1 && backward_end[at(j, s + 1)] < 0) break;  // waits for its output's gradient
                    ready = std::max(ready, forward_end[at(j, s)]);
                    if (s < S - 1) ready = std::max(ready, backward_end[at(j, s + 1)] + arrives_after(s + 1, s));
                }
                const double duration = durations ? (*durations)[r][next[r]] : kind_ms[a.kind] / V;
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
        const int j = a.microbatch, s = pipeline_model_stage(schedule, r, a.virtual_stage, p);
        std::string what;
        if (a.kind == PipelineAction::Forward) what = stage_name("F", j, s - 1);
        else if (a.kind == PipelineAction::Weights) what = stage_name("B", j, s);
        else if (forward_end[at(j, s)] < 0) what = stage_name("F", j, s);
        else what = stage_name("B", j, s + 1);
        waits += (waits.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits at " +
                 pipeline_action_label(a, V > 1) + " for " + what;
    }
    if (!waits.empty()) {
        timeline.problem = "deadlock: " + waits;
        return timeline;
    }
    // every list ran to its end: was every pass there? (lists of forwards alone, as validation runs, have none
    // of the others)
    bool backwards = false;
    for (const std::vector<PipelineAction>& list : lists)
        for (const PipelineAction& a : list) backwards |= a.kind != PipelineAction::Forward;
    for (int j = 0; j < m; j++)
        for (int s = 0; s < S; s++) {
            if (forward_end[at(j, s)] < 0) timeline.problem = stage_name("F", j, s) + " never ran";
            else if (backwards && backward_end[at(j, s)] < 0) timeline.problem = stage_name("B", j, s) + " never ran";
            else if (split && weights_end[at(j, s)] < 0) timeline.problem = stage_name("W", j, s) + " never ran";
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
    return pipeline_simulate_actions(lists, schedule, m, V, forward_ms, backward_ms, send_ms);
}

// ----------------------------------------------------------------------------
// the messages, in groups that NCCL can run

/*
NCCL's send and receive block the GPU until the peer arrives (a send completes only once its receiver has
started receiving), and operations that must progress at the same time have to be in one group. Under 1F1B
rank 0 sends activation j+1 and then waits for gradient j while rank 1 sends gradient j and then waits for
activation j+1: issued one at a time, each send waits for a receive the other rank posts only after its own
send. So the executor issues, before each action i of a rank, ONE group: the receives action i needs, and
sends of earlier actions' results (and after the last action, the sends left). The group completes, sends
included, before action i starts.

Which sends go in which group. A send posted before its receiver gets to the receive blocks its rank until the
receiver does. Sent right after the action that made it, a result can hold its rank up for long, or for ever:
under zbv rank r runs up to 2(p - r) - 1 forwards before anything comes back, and under zb-h1 a W sits between
a B and the next receive; there the ranks wait for each other, or for a busy peer, and the zero-bubble gain is
lost. So pipeline_message_groups places each send by the schedule's own time model (free sends; a forward 1,
a backward 2, B and W 1 each, over V): in the first group of its rank that starts no earlier than its receiver
posts the receive. The receiver is then waiting already, and the group costs the sender nothing. 1F1B gets
its classic "send the activations, receive the gradient" groups, and, timed with synchronous groups, every
schedule takes its free-send time on (nearly) every layout of the grid (dev/test/test_pipeline.cu).

A send held back reads a buffer that must still hold it. Activations stay in the sending stage's record until
its backward, which cannot start before they have arrived. A gradient is left in the doutput of the record that
its B then frees; when its send waits past the next forward that takes that record, B copies it to an outbox
(one of a pool of B T C buffers, as many as the rank's sends hold at once, pipeline_outboxes), and the send
reads the copy. pipeline_check_send_buffers proves both.

pipeline_message_groups lists the groups; pipeline_check_message_groups runs every rank's groups under
those synchronous semantics (a group completes when each of its operations' matching operations has been
posted by the peer) and says whether they can deadlock; given `one_at_a_time` it runs each operation as a
group of its own instead, the structure that deadlocks 1F1B (dev/test/test_pipeline.cu shows both, for every
schedule). A group that spans several communicators runs as one sub-group per communicator, one after
another, in an order NCCL may choose (PipelineCommOrder); the executor's messages all go on one, the pp
axis (llmc/parallel/pipeline.h says why). Messages between two ranks on one communicator are paired in
the order they are issued (NCCL has no tags), so the check also requires the k-th send from rank a to rank b
to be the message b expects as its k-th receive from a.
*/
struct PipelineMessage {
    bool send;                 // this rank sends it (else receives it)
    bool gradient;             // the gradient of a stage's input, going back (else a stage's output, forward)
    int microbatch;
    int from_stage, to_stage;  // model stages: to = from + 1 for activations, from - 1 for gradients
    int peer;                  // the pipeline rank at the other end
    int action;                // in the rank's list: the action that made it (send) or needs it (receive)
    int outbox = -1;           // a gradient sent from a copy (see pipeline_message_groups), else -1
    int communicator = 0;      // which communicator carries it, by an id every rank gives it alike: the
                               // executor's are all on the pp axis (0); a test gives them others to model
                               // a structure with more than one
};

// Each message of the pipeline, once: who sends it and who receives it, and the actions that make and need it.
inline void pipeline_messages_of(PipelineSchedule schedule, int rank, int p, int S, size_t i, const PipelineAction& a,
                                 std::vector<PipelineMessage>* sends, std::vector<PipelineMessage>* receives) {
    const int s = pipeline_model_stage(schedule, rank, a.virtual_stage, p), j = a.microbatch, at = (int)i;
    auto to = [&](int stage) { return pipeline_stage_rank(schedule, stage, p); };
    if (a.kind == PipelineAction::Forward && s < S - 1 && to(s + 1) != rank)
        sends->push_back({true, false, j, s, s + 1, to(s + 1), at});
    if (a.kind == PipelineAction::Backward && s > 0 && to(s - 1) != rank)
        sends->push_back({true, true, j, s, s - 1, to(s - 1), at});
    if (a.kind == PipelineAction::Forward && s > 0 && to(s - 1) != rank)
        receives->push_back({false, false, j, s - 1, s, to(s - 1), at});
    if (a.kind == PipelineAction::Backward && s < S - 1 && to(s + 1) != rank)
        receives->push_back({false, true, j, s + 1, s, to(s + 1), at});
}

inline bool pipeline_same_message(const PipelineMessage& a, const PipelineMessage& b) {
    return a.gradient == b.gradient && a.microbatch == b.microbatch && a.from_stage == b.from_stage &&
           a.to_stage == b.to_stage;
}

// Every rank's groups (lists[r]: rank r's actions): groups[r][i] is issued before rank r's action i, and
// groups[r][n] after its last. Within a group the sends come first, then the receive (an action needs one
// message at most). Messages between two ranks share one channel per direction, paired in the order they are
// posted, so a rank posts its sends to each peer in the order the peer receives them: a send goes in the
// first group that starts no earlier than its receiver posts the receive, but no earlier than the group of
// the send that the peer receives before it, and after that one within the group. A gradient whose send waits
// past the next forward that takes its record carries an outbox slot: the lowest free one, busy from its B to
// the group that sends it.
inline std::vector<std::vector<std::vector<PipelineMessage>>> pipeline_message_groups(
    const std::vector<std::vector<PipelineAction>>& lists, PipelineSchedule schedule, int V) {
    const int p = (int)lists.size(), S = p * V;
    int m = 0;
    for (const auto& list : lists)
        for (const PipelineAction& a : list) m = std::max(m, a.microbatch + 1);
    // the schedule's time model: when each action starts and ends with free sends
    const PipelineTimeline model = pipeline_simulate_actions(lists, schedule, m, V, 1.0, 2.0);
    if (!model.problem.empty())
        fatal("pipeline %s: the lists do not run: %s", pipeline_schedule_name(schedule), model.problem.c_str());
    // when each receive is posted (as its rank ends the action before the one that needs it), and that action
    struct Posted { double time; int action; };
    std::map<std::tuple<bool, int, int, int>, Posted> posted;  // (gradient, microbatch, from, to)
    auto key = [](const PipelineMessage& m) {
        return std::make_tuple(m.gradient, m.microbatch, m.from_stage, m.to_stage);
    };
    std::vector<std::vector<std::vector<PipelineMessage>>> groups(p);
    for (int r = 0; r < p; r++) {
        groups[r].resize(lists[r].size() + 1);
        for (size_t i = 0; i < lists[r].size(); i++) {
            std::vector<PipelineMessage> sends, receives;
            pipeline_messages_of(schedule, r, p, S, i, lists[r][i], &sends, &receives);
            for (const PipelineMessage& receive : receives) {
                posted[key(receive)] = {i == 0 ? 0.0 : model.ranks[r][i - 1].end_ms, (int)i};
                groups[r][i].push_back(receive);
            }
        }
    }
    for (int r = 0; r < p; r++) {
        const size_t n = lists[r].size();
        struct Placed { PipelineMessage send; size_t group; int received_at; };
        std::vector<Placed> placed;  // in the order the actions made them
        for (size_t i = 0; i < n; i++) {
            std::vector<PipelineMessage> sends, receives;
            pipeline_messages_of(schedule, r, p, S, i, lists[r][i], &sends, &receives);
            for (const PipelineMessage& send : sends) {
                const Posted receiver = posted.at(key(send));
                size_t k = i + 1;
                while (k < n && model.ranks[r][k].start_ms < receiver.time) k++;
                placed.push_back({send, k, receiver.action});
            }
        }
        // each peer's messages in the order it receives them: none in an earlier group than the one before it
        std::vector<size_t> by_receipt(placed.size());
        for (size_t x = 0; x < placed.size(); x++) by_receipt[x] = x;
        std::stable_sort(by_receipt.begin(), by_receipt.end(), [&](size_t a, size_t b) {
            return std::make_pair(placed[a].send.peer, placed[a].received_at) <
                   std::make_pair(placed[b].send.peer, placed[b].received_at);
        });
        for (size_t x = 1; x < by_receipt.size(); x++) {
            const Placed& before = placed[by_receipt[x - 1]];
            Placed& after = placed[by_receipt[x]];
            if (before.send.peer == after.send.peer) after.group = std::max(after.group, before.group);
        }
        int pool = 0;
        const std::vector<int> record_of = pipeline_record_assignment(lists[r], &pool);
        std::vector<size_t> outbox_busy_until;  // per slot: the group that sends its copy
        std::vector<std::vector<Placed>> sends_before(n + 1);
        for (Placed& x : placed) {
            const size_t i = x.send.action;
            bool retaken = false;  // a forward takes the gradient's record before the send goes
            for (size_t k = i + 1; k < x.group; k++)
                retaken |= x.send.gradient && lists[r][k].kind == PipelineAction::Forward && record_of[k] == record_of[i];
            if (retaken) {
                size_t slot = 0;
                while (slot < outbox_busy_until.size() && outbox_busy_until[slot] > i) slot++;
                if (slot == outbox_busy_until.size()) outbox_busy_until.push_back(0);
                outbox_busy_until[slot] = x.group;
                x.send.outbox = (int)slot;
            }
            sends_before[x.group].push_back(x);
        }
        for (size_t k = 0; k <= n; k++) {
            std::vector<Placed>& sends = sends_before[k];
            std::stable_sort(sends.begin(), sends.end(),
                             [](const Placed& a, const Placed& b) { return a.received_at < b.received_at; });
            std::vector<PipelineMessage> messages;
            for (const Placed& x : sends) messages.push_back(x.send);
            groups[r][k].insert(groups[r][k].begin(), messages.begin(), messages.end());
        }
    }
    return groups;
}

// Every rank's groups of sends and receives for the schedule's lists (pipeline_message_groups): the one play of
// all ranks' lists that a pipeline makes (pipeline_create) and that the planner makes for a layout. The outboxes
// a rank's part of the model holds (pipeline_model_part) are read from it.
inline std::vector<std::vector<std::vector<PipelineMessage>>> pipeline_all_groups(PipelineSchedule schedule, int p,
                                                                                int V, int m) {
    std::vector<std::vector<PipelineAction>> lists;
    for (int q = 0; q < p; q++) lists.push_back(pipeline_actions(schedule, q, p, m, V));
    return pipeline_message_groups(lists, schedule, V);
}

// The outboxes a rank's groups use at once (the pool's size).
inline int pipeline_outboxes(const std::vector<std::vector<PipelineMessage>>& groups) {
    int slots = 0;
    for (const auto& group : groups)
        for (const PipelineMessage& message : group) slots = std::max(slots, message.outbox + 1);
    return slots;
}

// Whether every gradient send that a rank's groups hold back still finds its data (see above): "" if so,
// else which send would read a refilled buffer. From its record: no forward of the last stage (which writes
// doutput) takes the record and no receive refills its doutput before the send goes. From an outbox: no other
// B fills that outbox before the send goes. record_of: the activation record of each action.
inline std::string pipeline_check_send_buffers(const std::vector<PipelineAction>& actions,
                                               const std::vector<std::vector<PipelineMessage>>& groups,
                                               const std::vector<int>& record_of, PipelineSchedule schedule, int rank,
                                               int p, int V) {
    const int S = p * V;
    auto what = [](const PipelineMessage& send) {
        return "the gradient of microbatch " + std::to_string(send.microbatch) + " from stage " +
               std::to_string(send.from_stage);
    };
    for (size_t g = 0; g < groups.size(); g++)
        for (const PipelineMessage& send : groups[g]) {
            if (!send.send || !send.gradient) continue;
            const size_t made = send.action;
            if (send.outbox >= 0) {
                for (const std::vector<PipelineMessage>& group : groups)
                    for (const PipelineMessage& other : group)
                        if (other.send && other.outbox == send.outbox && other.action > (int)made &&
                            other.action < (int)g)
                            return what(send) + " is sent after another gradient refills its outbox";
                continue;
            }
            const int record = record_of[made];
            for (size_t q = made + 1; q < g; q++)
                if (actions[q].kind == PipelineAction::Forward && record_of[q] == record &&
                    pipeline_model_stage(schedule, rank, actions[q].virtual_stage, p) == S - 1)
                    return what(send) + " is sent after the loss refills its record";
            for (size_t q = made + 1; q <= g; q++)
                for (const PipelineMessage& receive : groups[q])
                    if (!receive.send && receive.gradient && record_of[receive.action] == record)
                        return what(send) + " is sent after a receive refills its record";
        }
    return "";
}

inline std::string pipeline_message_label(const PipelineMessage& message) {
    return std::string(message.gradient ? "gradient" : "activations") + " of microbatch " +
           std::to_string(message.microbatch) + " from stage " + std::to_string(message.from_stage) + " to " +
           std::to_string(message.to_stage);
}

// Where each operation's match is: the k-th send from rank a to rank b on a communicator pairs with the k-th
// receive on b from a on that communicator (a channel). Fills match[rank][group][operation] with the peer's
// (group, operation); returns "" or what is mispaired.
struct PipelinePlace { int group, index; };
inline std::string pipeline_match_messages(const std::vector<std::vector<std::vector<PipelineMessage>>>& lists,
                                           std::vector<std::vector<std::vector<PipelinePlace>>>* match) {
    const int p = (int)lists.size();
    match->assign(p, {});
    using Channel = std::tuple<int, int, int>;  // (from, to, communicator)
    std::map<Channel, std::vector<PipelinePlace>> sent, received;
    for (int r = 0; r < p; r++) {
        (*match)[r].resize(lists[r].size());
        for (size_t g = 0; g < lists[r].size(); g++) {
            (*match)[r][g].resize(lists[r][g].size());
            for (size_t k = 0; k < lists[r][g].size(); k++) {
                const PipelineMessage& message = lists[r][g][k];
                if (message.peer < 0 || message.peer >= p || message.peer == r)
                    return "rank " + std::to_string(r) + " has a message to no other rank";
                (message.send ? sent[{r, message.peer, message.communicator}]
                              : received[{message.peer, r, message.communicator}]).push_back({(int)g, (int)k});
            }
        }
    }
    for (const auto& [channel, in_places] : received)
        if (!sent.count(channel))
            return "rank " + std::to_string(std::get<1>(channel)) + " receives " + std::to_string(in_places.size()) +
                   " messages from rank " + std::to_string(std::get<0>(channel)) + ", which sends none";
    for (const auto& [channel, out_places] : sent) {
        const auto [a, b, communicator] = channel;
        const std::vector<PipelinePlace>& in_places = received[channel];
        const std::string where = communicator ? " on communicator " + std::to_string(communicator) : "";
        if (out_places.size() != in_places.size())
            return "rank " + std::to_string(a) + " sends " + std::to_string(out_places.size()) + " messages to rank " +
                   std::to_string(b) + where + ", which receives " + std::to_string(in_places.size());
        for (size_t k = 0; k < out_places.size(); k++) {
            const PipelinePlace out = out_places[k], in = in_places[k];
            const PipelineMessage &m_out = lists[a][out.group][out.index], &m_in = lists[b][in.group][in.index];
            if (!pipeline_same_message(m_out, m_in))
                return "mismatched messages: rank " + std::to_string(a) + "'s send " + std::to_string(k) + " to rank " +
                       std::to_string(b) + where + " is the " + pipeline_message_label(m_out) +
                       ", its receive expects the " + pipeline_message_label(m_in);
            (*match)[a][out.group][out.index] = in;
            (*match)[b][in.group][in.index] = out;
        }
    }
    return "";
}

// The order in which a group's communicators run, one after another, as NCCL runs a group that spans several
// (one kernel per communicator on the stream; llmc/parallel/cpu_nccl_rules.h emulates it, LLMC_CPU_GROUP_ORDER):
//   Hash     by a hash of the communicator's id, which both ends compute alike
//   Reverse  the reverse of that
//   Issue    the order in which the rank's group first names each (the two ends may disagree)
enum class PipelineCommOrder { Hash, Reverse, Issue };
inline const char* pipeline_comm_order_name(PipelineCommOrder order) {
    return order == PipelineCommOrder::Hash ? "hash" : order == PipelineCommOrder::Reverse ? "reverse" : "issue";
}

// A group cut into its communicators' sub-groups, in the order they run.
inline std::vector<std::vector<PipelineMessage>> pipeline_sub_groups(const std::vector<PipelineMessage>& group,
                                                                     PipelineCommOrder order) {
    auto hash = [](int id) {  // splitmix64's finaliser: any fixed function of the id will do
        uint64_t h = (uint64_t)id + 0x9e3779b97f4a7c15ULL;
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
        return h ^ (h >> 31);
    };
    std::vector<std::vector<PipelineMessage>> sub;
    for (const PipelineMessage& message : group) {
        size_t c = 0;
        while (c < sub.size() && sub[c][0].communicator != message.communicator) c++;
        if (c == sub.size()) sub.emplace_back();
        sub[c].push_back(message);
    }
    if (order != PipelineCommOrder::Issue)
        std::stable_sort(sub.begin(), sub.end(), [&](const auto& a, const auto& b) {
            const uint64_t x = hash(a[0].communicator), y = hash(b[0].communicator);
            return order == PipelineCommOrder::Hash ? x < y : x > y;
        });
    return sub;
}

// Whether every rank's groups (lists[r]: the group before each action and after the last) complete under
// synchronous point-to-point semantics: "" if they do, else what deadlocks or is mispaired. A group runs as
// its communicators' sub-groups, one after another in `order` (one sub-group when one communicator carries
// everything); a sub-group completes once every one of its operations' matching operations is posted, that
// is, once the peer has reached (is running, or has finished) the sub-group that holds it; a rank reaches its
// next sub-group when its current one completes (the action between groups takes no part). With
// one_at_a_time each operation is a group of its own, in the same order.
inline std::string pipeline_check_message_groups(std::vector<std::vector<std::vector<PipelineMessage>>> lists,
                                                 PipelineCommOrder order = PipelineCommOrder::Hash,
                                                 bool one_at_a_time = false) {
    const int p = (int)lists.size();
    for (auto& groups : lists) {
        std::vector<std::vector<PipelineMessage>> serial;
        for (const auto& group : groups)
            if (one_at_a_time) {
                for (const PipelineMessage& message : group) serial.push_back({message});
            } else {
                for (const auto& sub : pipeline_sub_groups(group, order)) serial.push_back(sub);
                if (group.empty()) serial.emplace_back();
            }
        groups = serial;
    }
    std::vector<std::vector<std::vector<PipelinePlace>>> match;
    const std::string mispaired = pipeline_match_messages(lists, &match);
    if (!mispaired.empty()) return mispaired;
    // run: every rank stands at (has posted) its first unfinished sub-group
    std::vector<size_t> at(p, 0);
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int r = 0; r < p; r++)
            while (at[r] < lists[r].size()) {
                bool complete = true;
                for (size_t k = 0; k < lists[r][at[r]].size(); k++) {
                    const int peer = lists[r][at[r]][k].peer;
                    complete &= (size_t)match[r][at[r]][k].group <= at[peer];  // posted (or done) by the peer
                }
                if (!complete) break;
                at[r]++;
                progressed = true;
            }
    }
    std::string waits;
    for (int r = 0; r < p; r++) {
        if (at[r] == lists[r].size()) continue;
        for (size_t k = 0; k < lists[r][at[r]].size(); k++) {
            const PipelineMessage& message = lists[r][at[r]][k];
            if ((size_t)match[r][at[r]][k].group <= at[message.peer]) continue;
            waits += (waits.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits to " +
                     (message.send ? "send" : "receive") + " the " + pipeline_message_label(message);
            break;
        }
    }
    return waits.empty() ? "" : "deadlock: " + waits;
}

// The lists timed as the executor runs them: before action i rank r posts groups[r][i] and waits until every
// operation's match has been posted by its peer (synchronous sends, as NCCL's; a message itself takes no
// time), then runs the action for durations[r][i]. The timeline holds each action and each wait, as a
// measured run's does; `problem` says why the groups cannot run.
inline PipelineTimeline pipeline_simulate_groups(const std::vector<std::vector<PipelineAction>>& actions,
                                                 const std::vector<std::vector<std::vector<PipelineMessage>>>& groups,
                                                 PipelineSchedule schedule, int m, int V,
                                                 const std::vector<std::vector<double>>& durations) {
    PipelineTimeline timeline = pipeline_timeline_of(schedule, (int)actions.size(), m, V);
    const int p = timeline.p;
    std::vector<std::vector<std::vector<PipelinePlace>>> match;
    timeline.problem = pipeline_match_messages(groups, &match);
    if (!timeline.problem.empty()) return timeline;
    std::vector<size_t> at(p, 0);                  // the group each rank has posted
    std::vector<std::vector<double>> posted(p);    // when each rank posted each of its groups
    for (int r = 0; r < p; r++) posted[r].push_back(0.0);
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int r = 0; r < p; r++)
            while (at[r] < groups[r].size()) {
                const size_t g = at[r];
                double complete = posted[r][g];
                bool ready = true;
                for (size_t k = 0; k < groups[r][g].size() && ready; k++) {
                    const int peer = groups[r][g][k].peer;
                    const size_t their = match[r][g][k].group;
                    ready = their <= at[peer];
                    if (ready) complete = std::max(complete, posted[peer][their]);
                }
                if (!ready) break;
                at[r]++;
                progressed = true;
                if (g == actions[r].size()) continue;  // the group after the last action
                const PipelineAction& a = actions[r][g];
                if (complete > posted[r][g]) timeline.ranks[r].push_back({a, posted[r][g], complete, true});
                timeline.ranks[r].push_back({a, complete, complete + durations[r][g]});
                posted[r].push_back(complete + durations[r][g]);
            }
    }
    for (int r = 0; r < p; r++)
        if (at[r] < groups[r].size()) {
            timeline.problem = "deadlock: rank " + std::to_string(r) + " waits in its group before action " +
                               std::to_string(at[r]);
            return timeline;
        }
    pipeline_measure(timeline);
    return timeline;
}

// The schedule's lists run as the executor runs them, each model stage's passes taking their own times:
// stage_ms[s] is stage s's F, B and W of one microbatch (where the schedule does not split the backward, B is
// all of it and W unused). The groups of sends and receives are the executor's (pipeline_all_groups), timed with
// its synchronous semantics (pipeline_simulate_groups): a rank that posts a group waits for its peers, which
// under interleaved and zbv idles ranks that free sends would keep busy; the messages themselves take no time.
// The planner's bubble (llmc/planning/planner.h, from its estimated passes) and a measured step's planned bubble
// (llmc/parallel/pipeline_timeline.h, from the passes it measured) are both this.
inline PipelineTimeline pipeline_simulate_stages(PipelineSchedule schedule, int p, int m, int V,
                                                 const std::vector<std::array<double, 3>>& stage_ms) {
    if ((int)stage_ms.size() != p * V) fatal("pipeline: %zu stage times for %d stages", stage_ms.size(), p * V);
    std::vector<std::vector<PipelineAction>> lists;
    std::vector<std::vector<double>> durations(p);
    for (int r = 0; r < p; r++) {
        lists.push_back(pipeline_actions(schedule, r, p, m, V));
        for (const PipelineAction& a : lists[r])
            durations[r].push_back(stage_ms[pipeline_model_stage(schedule, r, a.virtual_stage, p)][a.kind]);
    }
    PipelineTimeline t = pipeline_simulate_groups(lists, pipeline_message_groups(lists, schedule, V), schedule, m, V,
                                                  durations);
    if (!t.problem.empty()) fatal("pipeline: the %s lists do not run: %s", pipeline_schedule_name(schedule), t.problem.c_str());
    return t;
}
