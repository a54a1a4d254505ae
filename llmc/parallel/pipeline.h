/*
Pipeline parallelism: the executor that runs a schedule's actions on a model's stages.

The pp ranks of the mesh (llmc/parallel/mesh.h) each hold V runs of consecutive layers, the model stages of
llmc/parallel/pipeline_schedule.h (which stage sits on which rank) and llmc/parallel/pipeline_split.h (how many
layers each stage holds: balanced by cost, or as --pp-layers lists them). The first stage also holds the
embeddings, the last one the final norm and the LM head. GPT-2's head is tied to wte: its last stage keeps its
own copy of the embedding chunk (llmc/model/parameters.h's ParameterLayout holds only a rank's chunks); Llama's
is a tensor of its own in the final chunk, and wte stays on the first stage alone. A step's
batch is cut into m microbatches, the gradient-accumulation micro-steps. The schedule says in which order a
rank runs the passes of (microbatch, virtual stage); pipeline_step runs any such list:

    F(j, s)   the input activations (B x T x C): received from stage s-1, handed over in memory when s-1 is on
              this rank too (zbv's turn at the bottom of its V), or looked up (stage 0: the embeddings)
              run the stage's blocks
              the output goes to stage s+1 (stage S-1: the final layernorm, the LM head and the loss, into a
              head record; where the backward is whole, at once the loss's backward pass through the head and
              the final layernorm too: the stage record keeps the gradient of the output, not the logits)
    B(j, s)   the gradient of the output from stage s+1 (stage S-1: computed in F, or under zb-h1 and zbv here,
              from the head record's dlogits)
              run the stage's blocks backwards: all of it, or under zb-h1 and zbv only the input gradients,
              keeping in a weight record what the weight gradients need
              the gradient of the input goes to stage s-1 (in memory when it is on this rank; stage 0: the
              embeddings' gradients)
    W(j, s)   (zb-h1, zbv) the weight gradients of the stage's blocks from the weight record, accumulated
              (stage S-1: the head's share of dwte too, from its head record, which is then free)
Why the head splits with the blocks: the LM head costs as much as several blocks (2 V C FLOPs per token each
way against a block's 24 C^2), and the stage split (llmc/parallel/pipeline_split.h) counts it as that many
layer-equivalents. Each of the head's three matmuls (logits, their input gradient, dwte) then lands in F, B and
W as a block's do, and the last stage's F, B and W each match the other stages'. Left whole in the last stage's
F, the head makes that F several blocks long, and every other stage waits for it once per microbatch.
Before each action the rank exchanges, as one group, the receives this action needs and the sends of earlier
results whose receiver is waiting for them by then (llmc/parallel/pipeline_links.h says why,
pipeline_simulator.h's pipeline_message_groups which).

Everything a backward pass needs from its forward pass is one stage record (llmc/model/gpt2.cuh's
StageActivations). A rank keeps a pool of them, as many as its schedule has microbatches in flight:
m under gpipe, p - r under 1f1b (pipeline_record_assignment says which record each action uses), and a pool
of weight records for the B passes whose W has not run yet (pipeline_weight_record_assignment).
The rank's side of the pipeline (its actions and records, how the activations and gradients travel to its
neighbours, and the bytes they send) is llmc/parallel/pipeline_links.h; a stage's pieces of
the model (embed, blocks, head and loss, and their backward passes) are llmc/model/forward_backward.cuh's.

The tied embeddings (GPT-2). wte gets a gradient on the first stage (the lookup) and on the last (the LM head).
Under zbv both are on rank 0, which adds the two into its one copy. Otherwise, after the step's data-parallel
reductions, the two are added up over a two-rank group
(pipeline_sum_tied_embedding); both copies then take the same AdamW step and stay equal, and the training matches one rank
(the sum is the same, up to the order of the additions). wpe goes along (the chunk is the unit of
sharding): its gradient on the last stage is 0. The gradient norm counts the first stage's copy only.

Data parallelism and ZeRO work within a stage: each stage's chunks are sharded and reduced over that
stage's gradient group, exactly as without a pipeline (llmc/parallel/zero.h is unchanged but for the chunks it
skips). Tensor parallelism composes too: the pp axis joins the ranks of equal tp rank, each sending its
R = N (N/tp under sequence parallelism) rows.

Measuring. On the step being measured every rank notes, with the clock, the start and end of each action
and of each wait for a message (on a GPU it then waits for the stream after each action: the timeline is
honest, the overlap slightly lower). pipeline_collect_timeline gathers them to rank 0, which prints the
bubble beside the formula and writes a Chrome trace (--trace, scripts/pipeline_timeline.py draws it).
*/
#pragma once

#include <chrono>
#include <ctime>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "pipeline_links.h"
#include "pipeline_simulator.h"
#include "parallel_context.h"
#include "../model/forward_backward.cuh"
#include "../io/logger.h"
#include "../cpu/faults.h"

// ----------------------------------------------------------------------------
// measuring

// Milliseconds since the measured step began (on a GPU, once the stream has done what it was given); 0
// when not measuring.
inline double pipeline_clock(const Pipeline& pipe, GPT2& model) {
    if (!pipe.measuring) return 0.0;
    cudaCheck(cudaStreamSynchronize(model.stream));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pipe.origin).count();
}
inline void pipeline_note(Pipeline& pipe, const PipelineAction& action, bool wait, double start, double end,
                          double work_ms = -1) {
    if (pipe.measuring) pipe.events.push_back({action, start, end, wait, work_ms});
}

// Milliseconds of processor time this process has used (the CPU build: its ranks may share cores, and an
// action's wall time then counts the other ranks' turns too); -1 on a GPU, where an action's work is its
// wall time, and when not measuring.
inline double pipeline_work_clock(const Pipeline& pipe) {
#ifdef LLMC_CPU
    timespec now{};
    if (!pipe.measuring || clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) != 0) return -1.0;
    return now.tv_sec * 1e3 + now.tv_nsec * 1e-6;
#else
    (void)pipe;
    return -1.0;
#endif
}

// The measured step replayed with one core per rank: each action takes the processor time it took and
// starts as soon as its rank is free and its input has come. With free sends (pipeline_simulate_actions) on a
// GPU, or with a core per rank, this is the measured step without the messages' time; on fewer cores than
// ranks it is the step the ranks would take each on a core of their own, which the wall clock cannot show.
// With synchronous groups (pipeline_simulate_groups) each action also waits, as the executor does, until its
// group's peers have posted their side.
inline PipelineTimeline pipeline_replay(const PipelineTimeline& measured, PipelineSchedule schedule,
                                        bool synchronous_groups) {
    std::vector<std::vector<PipelineAction>> lists(measured.p);
    std::vector<std::vector<double>> durations(measured.p);
    for (int r = 0; r < measured.p; r++)
        for (const PipelineEvent& e : measured.ranks[r]) {
            if (e.wait) continue;
            lists[r].push_back(e.action);
            durations[r].push_back(e.work_ms >= 0 ? e.work_ms : e.end_ms - e.start_ms);
        }
    if (!synchronous_groups)
        return pipeline_simulate_actions(lists, schedule, measured.m, measured.V, 0, 0, 0, &durations);
    return pipeline_simulate_groups(lists, pipeline_message_groups(lists, schedule, measured.V), schedule, measured.m,
                                    measured.V, durations);
}

// Starts measuring the next pipeline_step: the stages agree on the moment it begins.
inline void pipeline_begin_measuring(Pipeline& pipe, GPT2& model) {
    barrier(*pipe.group, model.stream);
    pipe.measuring = true;
    pipe.events.clear();
    pipe.origin = std::chrono::steady_clock::now();
}

// The measured step's events of every pipeline rank, on pp rank 0 (a collective over the pp axis; the other
// ranks get an empty timeline). Events travel as 7 floats each: kind, microbatch, virtual stage, wait,
// start, end, work.
inline PipelineTimeline pipeline_collect_timeline(Pipeline& pipe, GPT2& model) {
    pipe.measuring = false;
    const size_t capacity = 6 * (size_t)pipe.microbatches * pipe.virtual_stages;  // F, B, W actions and their waits
    if (pipe.events.size() > capacity) fatal("pipeline: %zu events measured, room for %zu", pipe.events.size(), capacity);
    constexpr size_t kFields = 7;
    std::vector<float> mine(kFields * capacity, -1.0f);
    for (size_t i = 0; i < pipe.events.size(); i++) {
        const PipelineEvent& e = pipe.events[i];
        const float fields[kFields] = {(float)e.action.kind, (float)e.action.microbatch, (float)e.action.virtual_stage,
                                       e.wait ? 1.0f : 0.0f, (float)e.start_ms, (float)e.end_ms, (float)e.work_ms};
        std::copy(fields, fields + kFields, mine.begin() + kFields * i);
    }
    float* device = tracked_alloc<float>(mine.size() * pipe.size, MemoryKind::Communication, "pipeline timeline");
    copy_to_device(device + mine.size() * pipe.rank, mine.data(), mine.size(), model.stream);
    all_gather(*pipe.group, device, device + mine.size() * pipe.rank, mine.size(), model.stream);
    std::vector<float> everyone(mine.size() * pipe.size);
    copy_to_host(everyone.data(), device, everyone.size(), model.stream);
    tracked_free(device);
    PipelineTimeline timeline;
    if (pipe.rank != 0) return timeline;
    timeline.schedule = pipeline_schedule_name(pipe.schedule);
    timeline.p = pipe.size;
    timeline.m = pipe.microbatches;
    timeline.V = pipe.virtual_stages;
    timeline.ranks.resize(pipe.size);
    for (int r = 0; r < pipe.size; r++)
        for (size_t i = 0; i < capacity; i++) {
            const float* f = everyone.data() + (r * capacity + i) * kFields;
            if (f[0] < 0) break;
            const PipelineAction action{(PipelineAction::Kind)(int)f[0], (int)f[1], (int)f[2]};
            timeline.ranks[r].push_back({action, f[4], f[5], f[3] != 0, f[6]});
        }
    pipeline_measure(timeline);
    return timeline;
}

// Rank 0's report of a measured step: each stage's bubble, measured and replayed with a core per rank (free
// sends; synchronous groups), beside the schedule's formula, and its peak of records in flight beside the
// schedule's.
inline void pipeline_print_timeline(const PipelineTimeline& t, const PipelineTimeline& replayed,
                                    const PipelineTimeline& synchronous, PipelineSchedule schedule) {
    printf("pipeline %s, p %d, m %d, V %d: the measured step took %.1f ms (replayed with a core per rank: %.1f with "
           "free sends, %.1f with synchronous groups); the formula's bubble %.3f\n", t.schedule.c_str(), t.p, t.m,
           t.V, t.step_ms, replayed.step_ms, synchronous.step_ms, pipeline_bubble_fraction(schedule, t.p, t.m, t.V));
    for (int r = 0; r < t.p; r++)
        printf("  pp rank %d: bubble %.3f measured, %.3f and %.3f replayed; records in flight at the peak %d "
               "(formula %d)\n", r, t.bubble_fraction[r], replayed.bubble_fraction[r],
               synchronous.bubble_fraction[r], t.peak_activations[r],
               pipeline_peak_activations(schedule, r, t.p, t.m, t.V));
}

// After the measured step: rank 0 prints each stage's bubble and records in flight beside the formulas, logs
// them, and writes the timeline as a Chrome trace if asked (the gathering is a collective over the pp axis).
inline void pipeline_report_timeline(ParallelContext& par, GPT2& model, Logger& logger, const std::string& trace_path) {
    Pipeline& pipe = par.pipe;
    const PipelineTimeline timeline = pipeline_collect_timeline(pipe, model);
    if (!par.main_rank) return;
    const PipelineTimeline replayed = pipeline_replay(timeline, pipe.schedule, false),
                           synchronous = pipeline_replay(timeline, pipe.schedule, true);
    for (const PipelineTimeline* t : {&replayed, &synchronous})
        if (!t->problem.empty()) fatal("pipeline: the measured step does not replay: %s", t->problem.c_str());
    pipeline_print_timeline(timeline, replayed, synchronous, pipe.schedule);
    std::string bubbles, replayed_bubbles, synchronous_bubbles, peaks, peak_formulas, layers;
    for (int r = 0; r < pipe.size; r++) {
        bubbles += (r ? ", " : "") + std::to_string(timeline.bubble_fraction[r]);
        replayed_bubbles += (r ? ", " : "") + std::to_string(replayed.bubble_fraction[r]);
        synchronous_bubbles += (r ? ", " : "") + std::to_string(synchronous.bubble_fraction[r]);
        peaks += (r ? ", " : "") + std::to_string(timeline.peak_activations[r]);
        peak_formulas += (r ? ", " : "") + std::to_string(pipeline_peak_activations(pipe.schedule, r, pipe.size,
                                                                                    pipe.microbatches, pipe.virtual_stages));
    }
    for (size_t s = 0; s < pipe.stage_layers.size(); s++) layers += (s ? ", " : "") + std::to_string(pipe.stage_layers[s]);
    logger.write(JsonLine("pipeline").text("schedule", timeline.schedule).integer("pp", pipe.size)
                     .integer("microbatches", pipe.microbatches).integer("virtual_stages", pipe.virtual_stages)
                     .number("step_ms", timeline.step_ms).raw("bubble", "[" + bubbles + "]")
                     .number("step_ms_replayed", replayed.step_ms).raw("bubble_replayed", "[" + replayed_bubbles + "]")
                     .number("step_ms_replayed_synchronous", synchronous.step_ms)
                     .raw("bubble_replayed_synchronous", "[" + synchronous_bubbles + "]")
                     .number("bubble_formula", pipeline_bubble_fraction(pipe.schedule, pipe.size, pipe.microbatches,
                                                                        pipe.virtual_stages))
                     .raw("peak_records", "[" + peaks + "]").raw("peak_records_formula", "[" + peak_formulas + "]")
                     .raw("stage_layers", "[" + layers + "]"));
    if (!trace_path.empty()) {
        write_text_file(trace_path, pipeline_chrome_trace(timeline));
        printf("wrote %s\n", trace_path.c_str());
    }
}

// ----------------------------------------------------------------------------
// running a schedule

inline int pipeline_model_stage(const Pipeline& pipe, const PipelineAction& a) {
    return pipeline_model_stage(pipe.schedule, pipe.rank, a.virtual_stage, pipe.size);
}
// Whether model stage s's neighbour s - 1 is on this rank too: then activations and gradients pass between the
// two in memory.
inline bool pipeline_previous_stage_here(const Pipeline& pipe, int s) {
    return s > 0 && pipeline_stage_rank(pipe.schedule, s - 1, pipe.size) == pipe.rank;
}

// The actions a list runs and the records and messages that go with them: a training step's schedule, or
// the forward passes of one microbatch through this rank's stages (validation, sampling).
struct PipelineRun {
    const std::vector<PipelineAction>& actions;
    const std::vector<std::vector<PipelineMessage>>& messages;
    const std::vector<int>& record_of;
    const std::vector<int>& weight_record_of;
    const std::vector<int>& outbox_of;  // the outbox a backward copies its input gradient to (-1: none)
    const std::vector<int>& head_of;    // the head record an action of the last stage uses (-1: none)
};

// Whether action i is the last action of its microbatch, in its list, to add to wte's gradient: stage 0's B
// (the lookup), or on the last stage the action that runs a tied LM head's weight gradient (its F, or its W
// under a split backward). Under zbv one rank holds both stages and either may come last; the embedding
// chunk's gradient for that microbatch is done after it (ZeRO-2 and 3 reduce it every microbatch).
inline bool pipeline_adds_last_to_embeddings(const Pipeline& pipe, const PipelineRun& run, size_t i) {
    const int S = pipeline_stage_count(pipe);
    const PipelineAction::Kind head_weights =
        pipeline_splits_backward(pipe.schedule) ? PipelineAction::Weights : PipelineAction::Forward;
    for (size_t j = run.actions.size(); j-- > 0;) {
        const PipelineAction& a = run.actions[j];
        const int s = pipeline_model_stage(pipe, a);
        if (a.microbatch != run.actions[i].microbatch) continue;
        if ((s == 0 && a.kind == PipelineAction::Backward) || (s == S - 1 && a.kind == head_weights && pipe.tied_head))
            return j == i;
    }
    return false;
}

// The record that the forward of (microbatch, model stage) uses in a run: where a stage on this rank hands its
// output over to the next stage here, and takes that stage's input gradient back. That forward ran before the
// next stage's, and its record lives until its own backward, after the next stage's.
inline StageActivations& pipeline_record_of_forward(const Pipeline& pipe, GPT2& model, const PipelineRun& run,
                                                    int microbatch, int stage) {
    for (size_t i = 0; i < run.actions.size(); i++) {
        const PipelineAction& a = run.actions[i];
        if (a.kind == PipelineAction::Forward && a.microbatch == microbatch && pipeline_model_stage(pipe, a) == stage)
            return model.records[run.record_of[i]];
    }
    fatal("pipeline: no forward of microbatch %d on stage %d here", microbatch, stage);
}

// The group of sends and receives before action i (i = the list's length: after the last action). A send
// carries a result of an earlier action (a stage's output from its record, or the gradient of its input, which
// the backward pass leaves in the record's doutput, or in an outbox when the send waits past the record's next
// use); a receive fills what action i needs (its record's input, or the gradient of its output into doutput).
inline void pipeline_exchange(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
    auto operation = [&](const PipelineMessage& message) {
        StageActivations& record = model.records[run.record_of[message.action]];
        floatX* data = message.outbox >= 0 ? model.outboxes[message.outbox]
                       : message.gradient  ? record.doutput
                       : message.send      ? record.output()
                                           : record.input;
        return pipeline_point_to_point(pipe, message, data, rows);
    };
    if (!run.messages[i].empty()) fault_stall("before-first-p2p", par.world.rank);  // the tests' stalled rank
    if (!fault_ungrouped_point_to_point()) {
        std::vector<PointToPoint> operations;
        for (const PipelineMessage& message : run.messages[i]) operations.push_back(operation(message));
        send_and_receive(operations, model.stream);
        return;
    }
    // the faulty structure: action i-1's results sent at once, then action i's inputs received, one at a time
    for (const std::vector<PipelineMessage>& group : run.messages)
        for (const PipelineMessage& message : group)
            if (message.send && (size_t)message.action + 1 == i) send_and_receive({operation(message)}, model.stream);
    for (const PipelineMessage& message : run.messages[i])
        if (!message.send) send_and_receive({operation(message)}, model.stream);
}

// One forward pass of microbatch `a` through one of this rank's stages, into its record: the embeddings looked
// up (first stage), the input handed over in memory (the previous stage is here too; received before
// otherwise), the blocks, and on the last stage the head and the loss, into the action's head record. With
// `targets`, when `training`, the loss's gradient replaces the logits, and where the backward is whole the
// head's backward pass follows at once; with targets only the loss is added up (validation); without, the
// logits stay (sampling).
inline void pipeline_forward(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, const int* tokens,
                             const int* targets, float dloss, bool training, int B, int T) {
    Pipeline& pipe = par.pipe;
    const PipelineAction& a = run.actions[i];
    StageActivations& record = model.records[run.record_of[i]];
    const int s = pipeline_model_stage(pipe, a), S = pipeline_stage_count(pipe);
    if (s == 0) {
        gpt2_embed(model, par, record, tokens, B, T);
    } else if (pipeline_previous_stage_here(pipe, s)) {
        const StageActivations& from = pipeline_record_of_forward(pipe, model, run, a.microbatch, s - 1);
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(record.input, from.output(), rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
    }
    gpt2_stage_forward(model, par, record, pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T);
    if (s < S - 1) return;
    HeadRecord& head = model.heads[run.head_of[i]];
    gpt2_head_forward(model, par, record, head, B, T);
    if (targets) gpt2_loss(model, par, head, targets, B, T, dloss);
    if (targets && training && !pipeline_splits_backward(pipe.schedule)) {
        gpt2_head_backward(model, par, record, head, B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    }
}

// The backward pass of microbatch `a` through one of this rank's stages, from its record: the whole of it, or
// under a schedule that splits it only the input gradients (B), leaving in the action's weight record what
// the weight gradients (W, pipeline_weights) need; on the last stage under the split, the head's input
// gradient first. The gradient of the stage's input stays in the record's doutput, to be sent, or handed over
// in memory to the previous stage when that is here too.
inline void pipeline_backward(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const PipelineAction& a = run.actions[i];
    StageActivations& record = model.records[run.record_of[i]];
    const int s = pipeline_model_stage(pipe, a), S = pipeline_stage_count(pipe);
    StageWeightRecord* weights = run.weight_record_of[i] >= 0 ? &model.weight_records[run.weight_record_of[i]] : nullptr;
    if (s == S - 1 && pipeline_splits_backward(pipe.schedule))
        gpt2_head_backward(model, par, record, model.heads[run.head_of[i]], B, T, /*weights_later=*/true);
    gpt2_stage_backward(model, par, record, pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T,
                        weights);
    if (s == 0) {
        gpt2_embed_backward(model, par, record, B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    } else if (pipeline_previous_stage_here(pipe, s)) {
        StageActivations& to = pipeline_record_of_forward(pipe, model, run, a.microbatch, s - 1);
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(to.doutput, record.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
    } else if (run.outbox_of[i] >= 0) {  // its send waits past the record's next forward: send a copy
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(model.outboxes[run.outbox_of[i]], record.doutput, rows * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, model.stream));
    }
}

// W: the weight gradients of microbatch `a` on one of this rank's stages, from the weight record its B filled
// (on the last stage, the head's share of dwte first, from its head record).
inline void pipeline_weights(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const int s = pipeline_model_stage(pipe, run.actions[i]);
    if (s == pipeline_stage_count(pipe) - 1) {
        gpt2_head_weights(model, par, model.heads[run.head_of[i]], B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    }
    gpt2_stage_weights(model, par, model.weight_records[run.weight_record_of[i]],
                       pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T);
}

// Runs a list: before each action the group of messages it needs (timed as the action's wait), then the action
// (timed as work); after the last, the last sends. tokens and targets: m B T host ids, microbatch after
// microbatch; each microbatch's loss gradient is scaled by dloss.
inline void pipeline_run(ParallelContext& par, GPT2& model, const PipelineRun& run, const int* tokens,
                         const int* targets, float dloss, bool training, int B, int T) {
    Pipeline& pipe = par.pipe;
    const size_t N = (size_t)B * T;
    for (size_t i = 0; i < run.actions.size(); i++) {
        const PipelineAction& a = run.actions[i];
        const double waiting = pipeline_clock(pipe, model);
        pipeline_exchange(par, model, run, i, B, T);
        const double start = pipeline_clock(pipe, model), work_start = pipeline_work_clock(pipe);
        pipeline_note(pipe, a, true, waiting, start);
        zero_begin_microbatch(par.zero, a.microbatch == pipe.microbatches - 1);
        const int* microbatch_targets = targets ? targets + a.microbatch * N : nullptr;
        switch (a.kind) {
            case PipelineAction::Forward:
                pipeline_forward(par, model, run, i, tokens + a.microbatch * N, microbatch_targets, dloss, training, B, T);
                break;
            case PipelineAction::Backward: pipeline_backward(par, model, run, i, B, T); break;
            case PipelineAction::Weights: pipeline_weights(par, model, run, i, B, T); break;
        }
        const double end = pipeline_clock(pipe, model);
        pipeline_note(pipe, a, false, start, end, work_start < 0 ? -1.0 : pipeline_work_clock(pipe) - work_start);
    }
    pipeline_exchange(par, model, run, run.actions.size(), B, T);
}

// One training step's forward and backward passes: this rank's schedule over m microbatches of B x T tokens
// (the first stage reads the tokens, the last the targets). Gradients accumulate, and llmc/parallel/zero.h
// reduces each chunk's as soon as microbatch m-1 has finished it.
inline void pipeline_step(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B, int T,
                          float dloss) {
    const Pipeline& pipe = par.pipe;
    pipeline_run(par, model,
                 {pipe.actions, pipe.messages, pipe.record_of, pipe.weight_record_of, pipe.outbox_of, pipe.head_of},
                 tokens, targets, dloss, /*training=*/true, B, T);
}

// The forward pass of one microbatch through every stage, in stage order (validation, sampling), on record 0:
// on the last stage, the loss added up (targets given) or the logits left in head record 0.
inline void pipeline_forward_only(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B,
                                  int T) {
    const Pipeline& pipe = par.pipe;
    std::vector<PipelineAction> actions;
    for (int v = 0; v < pipe.virtual_stages; v++) actions.push_back({PipelineAction::Forward, 0, v});
    const std::vector<std::vector<PipelineAction>> lists(pipe.size, actions);  // every rank's
    const std::vector<std::vector<PipelineMessage>> messages =
        pipeline_message_groups(lists, pipe.schedule, pipe.virtual_stages)[pipe.rank];
    // every stage runs on record 0: each output must leave before the next stage here overwrites it
    for (size_t g = 0; g < messages.size(); g++)
        for (const PipelineMessage& message : messages[g])
            if (message.send && g != (size_t)message.action + 1)
                fatal("pipeline: the forward-only pass would send stage %d's output late", message.from_stage);
    const std::vector<int> record_of(actions.size(), 0), none(actions.size(), -1);
    pipeline_run(par, model, {actions, messages, record_of, none, none, record_of}, tokens, targets, 0.0f,
                 /*training=*/false, B, T);
}

// After the step's gradient reductions (zero_wait_for_gradients): wte's (and wpe's) gradient on the first
// and on the last stage becomes the sum of the two.
inline void pipeline_sum_tied_embedding(ParallelContext& par, GPT2& model) {
    if (par.pipe.tied.size < 2) return;  // one pipeline rank, one rank holding both stages (zbv), or neither
    size_t count = 0;
    floatX* gradient = zero_chunk_gradient(par.zero, model, 0, &count);
    all_reduce(par.pipe.tied, gradient, count, Reduction::Sum, model.stream);
}

