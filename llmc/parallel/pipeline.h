/*
Pipeline parallelism: the executor that runs a schedule's actions on a model's stages.

The pp ranks of the mesh (llmc/parallel/mesh.h) each hold V consecutive runs of layers, the stages of
llmc/parallel/pipeline_schedule.h: model stage s = v p + r of S = p V holds layers [s L/S, (s+1) L/S). The first
stage also holds the embeddings, the last one the final layernorm, and the LM head, which is tied to wte:
the last stage keeps its own copy of the embedding chunk (llmc/model/parameters.h's ParameterLayout holds only a
rank's chunks). A step's batch is cut into m microbatches, the gradient-accumulation micro-steps. The
schedule says in which order a rank runs the forward (F) and backward (B) passes of (microbatch, virtual
stage); pipeline_step runs any such list:

    F(j, s)   receive the input activations (B x T x C) from stage s-1 (stage 0: look up the embeddings)
              run the stage's blocks
              send the output to stage s+1 (stage S-1: LM head, loss, and at once the loss's backward pass
              through the LM head and the final layernorm: the record keeps the gradient of the output,
              not the logits)
    B(j, s)   receive the gradient of the output from stage s+1 (stage S-1: computed in F)
              run the stage's blocks backwards, accumulating their parameter gradients
              send the gradient of the input to stage s-1 (stage 0: the embeddings' gradients)

Everything a backward pass needs from its forward pass is one stage record (llmc/model/gpt2.cuh's
StageActivations). A rank keeps a pool of them, as many as its schedule has microbatches in flight:
m under gpipe, p - r under 1f1b (pipeline_record_assignment says which record each action uses).
The rank's side of the pipeline (its actions and records, the links to its neighbours that carry the
activations and gradients, and the bytes they send) is llmc/parallel/pipeline_links.h; a stage's pieces of
the model (embed, blocks, head and loss, and their backward passes) are llmc/model/forward_backward.cuh's.

The tied embeddings. wte gets a gradient on the first stage (the lookup) and on the last (the LM head).
After the step's data-parallel reductions, the two are added up over a two-rank group (pipeline_sum_tied_
embedding); both copies then take the same AdamW step and stay equal, and the training matches one rank
(the sum is the same, up to the order of the additions). wpe goes along (the chunk is the unit of
sharding): its gradient on the last stage is 0. The gradient norm counts the first stage's copy only.

Data parallelism and ZeRO work within a stage: each stage's chunks are sharded and reduced over that
stage's gradient group, exactly as without a pipeline (llmc/parallel/zero.h is unchanged but for the chunks it
skips). Tensor parallelism composes too: the pp links join the ranks of equal tp rank, each sending its
R = N (N/tp under sequence parallelism) rows.

Measuring. On the step being measured every rank notes, with the clock, the start and end of each action
and of each wait for a message (on a GPU it then waits for the stream after each action: the timeline is
honest, the overlap slightly lower). pipeline_collect_timeline gathers them to rank 0, which prints the
bubble beside the formula and writes a Chrome trace (--trace, scripts/pipeline_timeline.py draws it).
*/
#pragma once

#include <chrono>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "pipeline_links.h"
#include "parallel_context.h"
#include "../model/forward_backward.cuh"
#include "../io/logger.h"

// ----------------------------------------------------------------------------
// measuring

// Milliseconds since the measured step began (on a GPU, once the stream has done what it was given); 0
// when not measuring.
inline double pipeline_clock(const Pipeline& pipe, GPT2& model) {
    if (!pipe.measuring) return 0.0;
    cudaCheck(cudaStreamSynchronize(model.stream));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pipe.origin).count();
}
inline void pipeline_note(Pipeline& pipe, const PipelineAction& action, bool wait, double start, double end) {
    if (pipe.measuring) pipe.events.push_back({action, start, end, wait});
}

// Starts measuring the next pipeline_step: the stages agree on the moment it begins.
inline void pipeline_begin_measuring(Pipeline& pipe, GPT2& model) {
    barrier(*pipe.group, model.stream);
    pipe.measuring = true;
    pipe.events.clear();
    pipe.origin = std::chrono::steady_clock::now();
}

// The measured step's events of every pipeline rank, on pp rank 0 (a collective over the pp axis; the other
// ranks get an empty timeline). Events travel as 6 floats each: kind, microbatch, virtual stage, wait,
// start, end.
inline PipelineTimeline pipeline_collect_timeline(Pipeline& pipe, GPT2& model) {
    pipe.measuring = false;
    const size_t capacity = 4 * (size_t)pipe.microbatches * pipe.virtual_stages;  // actions and waits
    if (pipe.events.size() > capacity) fatal("pipeline: %zu events measured, room for %zu", pipe.events.size(), capacity);
    std::vector<float> mine(6 * capacity, -1.0f);
    for (size_t i = 0; i < pipe.events.size(); i++) {
        const PipelineEvent& e = pipe.events[i];
        const float fields[6] = {(float)e.action.kind, (float)e.action.microbatch, (float)e.action.virtual_stage,
                                 e.wait ? 1.0f : 0.0f, (float)e.start_ms, (float)e.end_ms};
        std::copy(fields, fields + 6, mine.begin() + 6 * i);
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
            const float* f = everyone.data() + (r * capacity + i) * 6;
            if (f[0] < 0) break;
            const PipelineAction action{f[0] == 0 ? PipelineAction::Forward : PipelineAction::Backward, (int)f[1], (int)f[2]};
            timeline.ranks[r].push_back({action, f[4], f[5], f[3] != 0});
        }
    pipeline_measure(timeline);
    return timeline;
}

// Rank 0's report of a measured step: each stage's bubble beside the formulas, and its peak of records in
// flight beside the schedule's.
inline void pipeline_print_timeline(const PipelineTimeline& t, PipelineSchedule schedule) {
    const double plain = (double)(t.p - 1) / (t.m + t.p - 1), interleaved = (double)(t.p - 1) / (t.V * t.m + t.p - 1);
    printf("pipeline %s, p %d, m %d, V %d: the measured step took %.1f ms; bubble (p-1)/(m+p-1) = %.3f, "
           "interleaved (p-1)/(V m+p-1) = %.3f\n", t.schedule.c_str(), t.p, t.m, t.V, t.step_ms, plain, interleaved);
    for (int r = 0; r < t.p; r++)
        printf("  pp rank %d: bubble %.3f measured, %.3f formula; records in flight at the peak %d (formula %d)\n", r,
               t.bubble_fraction[r], pipeline_bubble_fraction(schedule, t.p, t.m, t.V), t.peak_activations[r],
               pipeline_peak_activations(schedule, r, t.p, t.m, t.V));
}

// After the measured step: rank 0 prints each stage's bubble and records in flight beside the formulas, logs
// them, and writes the timeline as a Chrome trace if asked (the gathering is a collective over the pp axis).
inline void pipeline_report_timeline(ParallelContext& par, GPT2& model, Logger& logger, const std::string& trace_path) {
    Pipeline& pipe = par.pipe;
    const PipelineTimeline timeline = pipeline_collect_timeline(pipe, model);
    if (!par.main_rank) return;
    pipeline_print_timeline(timeline, pipe.schedule);
    std::string bubbles, peaks;
    for (int r = 0; r < pipe.size; r++) {
        bubbles += (r ? ", " : "") + std::to_string(timeline.bubble_fraction[r]);
        peaks += (r ? ", " : "") + std::to_string(timeline.peak_activations[r]);
    }
    logger.write(JsonLine("pipeline").text("schedule", timeline.schedule).integer("pp", pipe.size)
                     .integer("microbatches", pipe.microbatches).integer("virtual_stages", pipe.virtual_stages)
                     .number("step_ms", timeline.step_ms).raw("bubble", "[" + bubbles + "]")
                     .number("bubble_formula", pipeline_bubble_fraction(pipe.schedule, pipe.size, pipe.microbatches,
                                                                        pipe.virtual_stages))
                     .raw("peak_records", "[" + peaks + "]"));
    if (!trace_path.empty()) {
        write_text_file(trace_path, pipeline_chrome_trace(timeline));
        printf("wrote %s\n", trace_path.c_str());
    }
}

// ----------------------------------------------------------------------------
// running a schedule

inline int pipeline_model_stage(const Pipeline& pipe, const PipelineAction& a) {
    return pipeline_model_stage(pipe.rank, a.virtual_stage, pipe.size);
}

// One forward pass of microbatch `a` through one of this rank's stages, into `record`: the input received
// (or the embeddings looked up), the blocks, the output sent (or, on the last stage, the loss). With
// `targets`, when `training`, the last stage also takes the loss's backward pass through the head; with
// targets only it adds the loss up (validation); without, it leaves the logits (sampling).
inline void pipeline_forward(ParallelContext& par, GPT2& model, const PipelineAction& a, int record_index,
                             const int* tokens, const int* targets, float dloss, bool training, int B, int T) {
    Pipeline& pipe = par.pipe;
    StageActivations& record = model.records[record_index];
    const int s = pipeline_model_stage(pipe, a), S = pipe.size * pipe.virtual_stages;
    const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
    const double waiting = pipeline_clock(pipe, model);
    send_finish(&pipe.output_sent[record_index], model.stream);  // the record's last output may still be on the way
    if (s > 0) recv(pipe.activations_in, record.input, rows, /*peer: the sender*/ 0, model.stream);
    const double start = pipeline_clock(pipe, model);
    pipeline_note(pipe, a, true, waiting, start);
    if (s == 0) gpt2_embed(model, par, record, tokens, B, T);
    gpt2_stage_forward(model, par, record, s * model.stage_layers, model.stage_layers, B, T);
    if (s < S - 1) {
        send_async(pipe.activations_out, record.blocks.back().output, rows, /*peer: the receiver*/ 1, model.stream,
                   pipe.activation_stream, &pipe.output_sent[record_index]);
    } else {
        gpt2_head_forward(model, par, record, B, T);
        if (targets) gpt2_loss(model, par, targets, B, T, dloss);
        if (targets && training) {
            gpt2_head_backward(model, par, record, B, T);
            // the LM head's share is all this rank adds to wte
            if (!model.first_stage) chunk_gradient_done(model, par, 0);
        }
    }
    pipeline_note(pipe, a, false, start, pipeline_clock(pipe, model));
}

// The backward pass of microbatch `a` through one of this rank's stages, from `record`; the gradient of the
// stage's input goes out from staging buffer `staging`.
inline void pipeline_backward(ParallelContext& par, GPT2& model, const PipelineAction& a, int record_index,
                              int staging, int B, int T) {
    Pipeline& pipe = par.pipe;
    StageActivations& record = model.records[record_index];
    const int s = pipeline_model_stage(pipe, a), S = pipe.size * pipe.virtual_stages;
    const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
    const double waiting = pipeline_clock(pipe, model);
    if (s < S - 1) recv(pipe.gradients_in, record.doutput, rows, /*peer: the sender*/ 0, model.stream);
    const double start = pipeline_clock(pipe, model);
    pipeline_note(pipe, a, true, waiting, start);
    gpt2_stage_backward(model, par, record, s * model.stage_layers, model.stage_layers, B, T);
    if (s > 0) {
        cudaCheck(cudaMemcpyAsync(pipe.staging[staging], record.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        send_async(pipe.gradients_out, pipe.staging[staging], rows, /*peer: the receiver*/ 1, model.stream,
                   pipe.gradient_stream, &pipe.staging_sent[staging]);
    } else {
        gpt2_embed_backward(model, par, record, B, T);
        chunk_gradient_done(model, par, 0);
    }
    pipeline_note(pipe, a, false, start, pipeline_clock(pipe, model));
}

// Waits (in stream order) for every send of the step, so no buffer is in flight between steps.
inline void pipeline_finish_sends(Pipeline& pipe, GPT2& model) {
    for (SendRequest& request : pipe.output_sent) send_finish(&request, model.stream);
    for (SendRequest& request : pipe.staging_sent) send_finish(&request, model.stream);
}

// One training step's forward and backward passes: this rank's schedule over m microbatches of B x T
// tokens (tokens and targets: m B T host ids, microbatch after microbatch; the first stage reads the
// tokens, the last the targets). Each microbatch's loss gradient is scaled by dloss; gradients accumulate,
// and llmc/parallel/zero.h reduces each chunk's as soon as microbatch m-1 has finished it.
inline void pipeline_step(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B, int T,
                          float dloss) {
    Pipeline& pipe = par.pipe;
    const size_t N = (size_t)B * T;
    for (size_t i = 0; i < pipe.actions.size(); i++) {
        const PipelineAction& a = pipe.actions[i];
        for (int b : pipe.gradient_sends.finish_before[i]) send_finish(&pipe.staging_sent[b], model.stream);
        zero_begin_microbatch(par.zero, a.microbatch == pipe.microbatches - 1);
        if (a.kind == PipelineAction::Forward) {
            pipeline_forward(par, model, a, pipe.record_of[i], tokens + a.microbatch * N, targets + a.microbatch * N,
                             dloss, /*training=*/true, B, T);
        } else {
            pipeline_backward(par, model, a, pipe.record_of[i], pipe.gradient_sends.buffer[i], B, T);
        }
    }
    pipeline_finish_sends(pipe, model);
}

// The forward pass of one microbatch through every stage, in stage order (validation, sampling): on the
// last stage, the loss added up (targets given) or the logits left in model.logits.
inline void pipeline_forward_only(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B,
                                  int T) {
    for (int v = 0; v < par.pipe.virtual_stages; v++)
        pipeline_forward(par, model, PipelineAction{PipelineAction::Forward, 0, v}, 0, tokens, targets, 0.0f,
                         /*training=*/false, B, T);
    pipeline_finish_sends(par.pipe, model);
}

// After the step's gradient reductions (zero_wait_for_gradients): wte's (and wpe's) gradient on the first
// and on the last stage becomes the sum of the two.
inline void pipeline_sum_tied_embedding(ParallelContext& par, GPT2& model) {
    if (par.pipe.size == 1 || !model.layout.holds(0)) return;
    size_t count = 0;
    floatX* gradient = zero_chunk_gradient(par.zero, model, 0, &count);
    all_reduce(par.pipe.tied, gradient, count, Reduction::Sum, model.stream);
}

