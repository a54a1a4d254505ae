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

Sends do not wait for the receiver (send_async in llmc/parallel/comm.h): 1F1B's neighbours send to each other at the
same moment, one the activations, the other a gradient, and blocking sends would deadlock them. The
activations go out from the stage record, and the send has finished before a forward pass takes the record
again; the gradients go out from staging buffers, each waited for where pipeline_gradient_sends
(llmc/parallel/pipeline_schedule.h) proves it cannot deadlock. Every directed pair of neighbours has a link of its
own, a two-rank communicator: rank r sends activations to r+1 on one, receives them from r-1 on another,
and the same for gradients the other way. A link then carries its messages in the same order at both
ends (what NCCL, without tags, needs to pair a send with its receive), and on each rank one stream only
ever uses it (the sends go out on a send stream per direction, receives wait on the compute stream), so
no two streams' operations on one communicator can hold each other up.

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

Bytes this rank sends per step on the pp axis, for a = B T C activation elements per message (B T C / tp
under sequence parallelism), s bytes per element, and this rank's V stages (model stages v p + r):
    activations   m a s for each of its stages but the last model stage S-1
    gradients     m a s for each of its stages but the first, stage 0
    tied wte      e s on the first and the last stage's ranks (p > 1), e = the embedding chunk's
                  gradient this rank holds: the whole chunk at ZeRO-0, its shard at ZeRO >= 1 (a two-rank
                  all-reduce sends half of it twice)
    loss, norm    4 (p-1)/p and 8 (p-1)/p bytes (rounded down): the loss broadcast from the last stage and
                  the all-reduce of the squared gradient norm
(pipeline_bytes_per_step)
*/
#pragma once

#include <chrono>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "mesh.h"
#include "../model/gpt2.cuh"
#include "zero.h"
#include "pipeline_schedule.h"

struct Pipeline {
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    int size = 1, rank = 0;                 // p, and this rank's place on the pp axis
    int virtual_stages = 1;                 // V
    int microbatches = 1;                   // m
    int num_layers = 0;
    std::vector<PipelineAction> actions;    // this rank's, in order
    std::vector<int> record_of;             // per action: the stage record it uses
    int records = 1;                        // the pool's size
    Communicator* group = nullptr;          // the pp axis: the loss's broadcast, the norm's sum
    // the links (p > 1), two-rank groups in which the sender is rank 0 and the receiver rank 1
    Communicator activations_out, activations_in;  // to rank r+1, from rank r-1
    Communicator gradients_out, gradients_in;      // to rank r-1, from rank r+1
    Communicator tied;                      // the first and the last stage's ranks (p > 1): wte's gradient
    cudaStream_t activation_stream = nullptr, gradient_stream = nullptr;  // GPU: the sends of each link
    std::vector<SendRequest> output_sent;   // per record: its output, sent to the next stage
    PipelineGradientSends gradient_sends;   // which staging buffer each gradient goes out from, and when
    std::vector<floatX*> staging;           // the gradients of stage inputs, sent to the previous stage
    std::vector<SendRequest> staging_sent;
    // the step being measured
    bool measuring = false;
    std::chrono::steady_clock::time_point origin;
    std::vector<PipelineEvent> events;      // this rank's actions and waits
};

// One line saying why this layout cannot run (empty: it can). Whether the world splits into pp ranks is the
// mesh's to check.
inline std::string pipeline_layout_error(PipelineSchedule schedule, int p, int V, int m, int num_layers) {
    const char* name = pipeline_schedule_name(schedule);
    char text[256] = "";
    if (schedule != PipelineSchedule::Interleaved && V != 1) {
        snprintf(text, sizeof(text), "--pp-virtual %d: only the interleaved schedule has virtual stages (the schedule "
                 "is %s)", V, name);
    } else if (num_layers % (p * V) != 0) {
        snprintf(text, sizeof(text), "%d layers cannot be cut into --pp %d x --pp-virtual %d = %d stages of equal "
                 "size: layers must be a multiple of pp x V", num_layers, p, V, p * V);
    } else if (schedule == PipelineSchedule::Interleaved && p == 1) {
        snprintf(text, sizeof(text), "the interleaved schedule needs --pp at least 2 (with one pipeline rank there is "
                 "nothing to interleave)");
    } else if (schedule == PipelineSchedule::Interleaved && m % p != 0) {
        snprintf(text, sizeof(text), "the interleaved schedule needs the microbatches (%d: --total-batch-size / (B x T "
                 "x data-parallel ranks)) to be a multiple of --pp %d", m, p);
    }
    return text;
}

// The part of the model pipeline rank `rank` runs (llmc/model/gpt2.cuh): its chunks, the layers per stage, and
// as many stage records as its schedule has microbatches in flight.
inline ModelPart pipeline_model_part(PipelineSchedule schedule, int rank, int p, int V, int m, int num_layers) {
    ModelPart part;
    part.held_chunks = pipeline_held_chunks(rank, p, V, num_layers);
    part.stage_layers = num_layers / (p * V);
    part.records = pipeline_peak_activations(schedule, rank, p, m, V);
    return part;
}
inline ModelPart pipeline_model_part(const Pipeline& pipe) {
    return pipeline_model_part(pipe.schedule, pipe.rank, pipe.size, pipe.virtual_stages, pipe.microbatches,
                               pipe.num_layers);
}

// Every rank calls this together (the links are made by splitting the pp axis). message_elements: the
// activations of one microbatch on this rank (R x C).
inline void pipeline_create(Pipeline& pipe, Mesh& mesh, PipelineSchedule schedule, int V, int m, int num_layers,
                            size_t message_elements) {
    pipe.schedule = schedule;
    pipe.size = mesh.layout.sizes[PP];
    pipe.rank = mesh.coords[PP];
    pipe.virtual_stages = V;
    pipe.microbatches = m;
    pipe.num_layers = num_layers;
    const std::string error = pipeline_layout_error(schedule, pipe.size, V, m, num_layers);
    if (!error.empty()) fatal("%s", error.c_str());
    std::vector<std::vector<PipelineAction>> lists;  // every rank's: the gradient sends' plan looks at all
    for (int r = 0; r < pipe.size; r++) lists.push_back(pipeline_actions(schedule, r, pipe.size, m, V));
    pipe.actions = lists[pipe.rank];
    pipe.gradient_sends = pipeline_gradient_sends(lists, pipe.rank, m, V);
    pipe.record_of = pipeline_record_assignment(pipe.actions, &pipe.records);
    if (pipe.records != pipeline_peak_activations(schedule, pipe.rank, pipe.size, m, V))
        fatal("pipeline %s: the actions need %d records, the formula says %d", pipeline_schedule_name(schedule),
              pipe.records, pipeline_peak_activations(schedule, pipe.rank, pipe.size, m, V));
    pipe.group = &mesh.axis[PP];
    if (pipe.size > 1) {
        // one split of the pp axis per directed pair (sender, receiver); a rank keeps the two of each direction
        // it belongs to
        const int p = pipe.size, r = pipe.rank;
        for (int direction : {+1, -1})
            for (int sender = 0; sender < p; sender++) {
                const int receiver = (sender + direction + p) % p;
                const bool member = r == sender || r == receiver;
                Communicator link = comm_split(mesh.axis[PP], member ? 0 : 1, r == sender ? 0 : 1);
                Communicator* keep = !member ? nullptr
                                     : direction > 0 ? (r == sender ? &pipe.activations_out : &pipe.activations_in)
                                                     : (r == sender ? &pipe.gradients_out : &pipe.gradients_in);
                if (keep) *keep = link;
                else comm_destroy(link);
            }
        const bool holds_wte = pipe.rank == 0 || pipe.rank == pipe.size - 1;
        pipe.tied = comm_split(mesh.axis[PP], holds_wte ? 0 : 1, pipe.rank);
    }
    cudaCheck(cudaStreamCreateWithFlags(&pipe.activation_stream, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&pipe.gradient_stream, cudaStreamNonBlocking));
    pipe.output_sent.resize(pipe.records);
    for (SendRequest& request : pipe.output_sent) send_request_create(request);
    pipe.staging.resize(pipe.gradient_sends.buffers);
    pipe.staging_sent.resize(pipe.gradient_sends.buffers);
    for (int b = 0; b < pipe.gradient_sends.buffers; b++) {
        pipe.staging[b] = tracked_alloc<floatX>(message_elements, MemoryKind::Communication, "pipeline gradient");
        send_request_create(pipe.staging_sent[b]);
    }
}

inline void pipeline_free(Pipeline& pipe) {
    if (pipe.size > 1) {
        for (Communicator* link : {&pipe.activations_out, &pipe.activations_in, &pipe.gradients_out, &pipe.gradients_in})
            comm_destroy(*link);
        comm_destroy(pipe.tied);
    }
    for (SendRequest& request : pipe.output_sent) send_request_destroy(request);
    for (int b = 0; b < pipe.gradient_sends.buffers; b++) {
        tracked_free(pipe.staging[b]);
        send_request_destroy(pipe.staging_sent[b]);
    }
    cudaCheck(cudaStreamDestroy(pipe.activation_stream));
    cudaCheck(cudaStreamDestroy(pipe.gradient_stream));
    pipe = Pipeline{};
}

// bytes sent over the pipeline's own groups (the pp axis itself counts with the mesh's groups)
inline uint64_t pipeline_link_bytes(const Pipeline& pipe) {
    return pipe.activations_out.bytes_sent + pipe.gradients_out.bytes_sent + pipe.tied.bytes_sent;
}
inline void pipeline_reset_bytes(Pipeline& pipe) {
    pipe.activations_out.bytes_sent = pipe.gradients_out.bytes_sent = pipe.tied.bytes_sent = 0;
}

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

// ----------------------------------------------------------------------------
// running a schedule

inline int pipeline_model_stage(const Pipeline& pipe, const PipelineAction& a) {
    return pipeline_model_stage(pipe.rank, a.virtual_stage, pipe.size);
}

// One forward pass of microbatch `a` through one of this rank's stages, into `record`: the input received
// (or the embeddings looked up), the blocks, the output sent (or, on the last stage, the loss). With
// `targets` and `hooks` the last stage also takes the loss's backward pass through the head (training);
// with targets only it adds the loss up (validation); without, it leaves the logits (sampling).
inline void pipeline_forward(Pipeline& pipe, GPT2& model, const PipelineAction& a, int record_index,
                             const int* tokens, const int* targets, float dloss, const BackwardHooks* hooks,
                             int B, int T) {
    StageActivations& record = model.records[record_index];
    const int s = pipeline_model_stage(pipe, a), S = pipe.size * pipe.virtual_stages;
    const size_t rows = tp_rows(model.tp, B * T) * (size_t)model.config.channels;
    const double waiting = pipeline_clock(pipe, model);
    send_finish(&pipe.output_sent[record_index], model.stream);  // the record's last output may still be on the way
    if (s > 0) recv(pipe.activations_in, record.input, rows, /*peer: the sender*/ 0, model.stream);
    const double start = pipeline_clock(pipe, model);
    pipeline_note(pipe, a, true, waiting, start);
    if (s == 0) gpt2_embed(model, record, tokens, B, T);
    gpt2_stage_forward(model, record, s * model.stage_layers, B, T);
    if (s < S - 1) {
        send_async(pipe.activations_out, record.blocks.back().output, rows, /*peer: the receiver*/ 1, model.stream,
                   pipe.activation_stream, &pipe.output_sent[record_index]);
    } else {
        gpt2_head_forward(model, record, B, T);
        if (targets) gpt2_loss(model, targets, B, T, dloss);
        if (targets && hooks) {
            gpt2_head_backward(model, record, B, T, *hooks);
            if (!model.first_stage) chunk_final(*hooks, 0);  // the LM head's share is all this rank adds to wte
        }
    }
    pipeline_note(pipe, a, false, start, pipeline_clock(pipe, model));
}

// The backward pass of microbatch `a` through one of this rank's stages, from `record`; the gradient of the
// stage's input goes out from staging buffer `staging`.
inline void pipeline_backward(Pipeline& pipe, GPT2& model, const PipelineAction& a, int record_index, int staging,
                              const BackwardHooks& hooks, int B, int T) {
    StageActivations& record = model.records[record_index];
    const int s = pipeline_model_stage(pipe, a), S = pipe.size * pipe.virtual_stages;
    const size_t rows = tp_rows(model.tp, B * T) * (size_t)model.config.channels;
    const double waiting = pipeline_clock(pipe, model);
    if (s < S - 1) recv(pipe.gradients_in, record.doutput, rows, /*peer: the sender*/ 0, model.stream);
    const double start = pipeline_clock(pipe, model);
    pipeline_note(pipe, a, true, waiting, start);
    gpt2_stage_backward(model, record, s * model.stage_layers, B, T, hooks);
    if (s > 0) {
        cudaCheck(cudaMemcpyAsync(pipe.staging[staging], record.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        send_async(pipe.gradients_out, pipe.staging[staging], rows, /*peer: the receiver*/ 1, model.stream,
                   pipe.gradient_stream, &pipe.staging_sent[staging]);
    } else {
        gpt2_embed_backward(model, record, B, T, hooks);
        chunk_final(hooks, 0);
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
// tokens, the last the targets). Each microbatch's loss gradient is scaled by dloss; gradients accumulate
// and reach llmc/parallel/zero.h through its hooks (a chunk is final for the step with microbatch m-1).
inline void pipeline_step(Pipeline& pipe, GPT2& model, Zero& optimizer, const int* tokens, const int* targets,
                          int B, int T, float dloss) {
    const size_t N = (size_t)B * T;
    for (size_t i = 0; i < pipe.actions.size(); i++) {
        const PipelineAction& a = pipe.actions[i];
        for (int b : pipe.gradient_sends.finish_before[i]) send_finish(&pipe.staging_sent[b], model.stream);
        const BackwardHooks hooks = zero_backward_hooks(optimizer, model, a.microbatch == pipe.microbatches - 1);
        if (a.kind == PipelineAction::Forward) {
            pipeline_forward(pipe, model, a, pipe.record_of[i], tokens + a.microbatch * N, targets + a.microbatch * N,
                             dloss, &hooks, B, T);
        } else {
            pipeline_backward(pipe, model, a, pipe.record_of[i], pipe.gradient_sends.buffer[i], hooks, B, T);
        }
    }
    pipeline_finish_sends(pipe, model);
}

// The forward pass of one microbatch through every stage, in stage order (validation, sampling): on the
// last stage, the loss added up (targets given) or the logits left in model.logits.
inline void pipeline_forward_only(Pipeline& pipe, GPT2& model, const int* tokens, const int* targets, int B, int T) {
    for (int v = 0; v < pipe.virtual_stages; v++)
        pipeline_forward(pipe, model, PipelineAction{PipelineAction::Forward, 0, v}, 0, tokens, targets, 0.0f, nullptr,
                         B, T);
    pipeline_finish_sends(pipe, model);
}

// After the step's gradient reductions (zero_wait_for_gradients): wte's (and wpe's) gradient on the first
// and on the last stage becomes the sum of the two.
inline void pipeline_sum_tied_embedding(Pipeline& pipe, Zero& optimizer, GPT2& model) {
    if (pipe.size == 1 || !model.layout.holds(0)) return;
    size_t count = 0;
    floatX* gradient = zero_chunk_gradient(optimizer, model, 0, &count);
    all_reduce(pipe.tied, gradient, count, Reduction::Sum, model.stream);
}

// The loss (or anything in a device float) from the last stage's rank to the others of the pp axis.
inline void pipeline_share_from_last_stage(Pipeline& pipe, float* value, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast(*pipe.group, value, count, pipe.size - 1, stream);
}

// ----------------------------------------------------------------------------
// the whole model, from its parts

// The whole model's parameters (host, the model file's layout: tp = 1, every chunk) from every rank's part
// `mine` (host, in `layout`): a collective over the mesh's model group (pp x tp ranks, numbered pp rank x tp
// + tp rank). Stops if two ranks' copies of a parameter differ (tp-replicated tensors, the first and last
// stage's embeddings), which would mean the copies drifted apart.
inline std::vector<float> gather_whole_model(Communicator& model_group, const Pipeline& pipe,
                                             const ParameterLayout& layout, const std::vector<float>& mine,
                                             cudaStream_t stream) {
    const ParameterLayout whole(layout.config);
    std::vector<ParameterLayout> parts;  // each member's
    size_t largest = 0;                  // the all-gather moves equal blocks: the largest part's size
    for (int member = 0; member < model_group.size; member++) {
        const std::vector<char> held = pipeline_held_chunks(member / layout.tp, pipe.size, pipe.virtual_stages,
                                                            layout.config.num_layers);
        parts.emplace_back(layout.config, layout.shards, layout.tp, member % layout.tp, held);
        largest = std::max(largest, parts.back().total);
    }
    std::vector<float> everyone = mine;
    if (model_group.size > 1) {
        float* device = tracked_alloc<float>(largest * model_group.size, MemoryKind::Communication, "whole model");
        copy_to_device(device + model_group.rank * largest, mine.data(), mine.size(), stream);
        all_gather(model_group, device, device + model_group.rank * largest, largest, stream);
        everyone.resize(largest * model_group.size);
        copy_to_host(everyone.data(), device, everyone.size(), stream);
        tracked_free(device);
    }
    std::vector<float> values(whole.total, 0.0f);
    std::vector<char> written(whole.total, 0);
    for (int member = 0; member < model_group.size; member++) {
        const float* from = everyone.data() + member * largest;
        for_each_common_run(parts[member], whole, [&](size_t at, size_t to, size_t count) {
            if (written[to] && memcmp(&values[to], from + at, count * sizeof(float)) != 0)
                fatal("rank %d of the model group (pp rank %d, tp rank %d) holds a copy of a parameter that differs "
                      "from another rank's", member, member / layout.tp, member % layout.tp);
            std::copy(from + at, from + at + count, values.begin() + to);
            std::fill(written.begin() + to, written.begin() + to + count, 1);
        });
    }
    return values;
}

// Host values on the last stage's rank become the same on every rank of the pp axis (a collective).
template <typename T>
void pipeline_share_host_from_last_stage(Pipeline& pipe, T* values, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast_host(*pipe.group, values, count, pipe.size - 1, stream);
}

// One number from every rank of the pp axis, on all of them (a collective): for reports per stage.
inline std::vector<float> pipeline_gather_values(Pipeline& pipe, float value, cudaStream_t stream) {
    return pipe.size == 1 ? std::vector<float>{value} : gather_values(*pipe.group, value, stream);
}

// ----------------------------------------------------------------------------
// the bytes formula (see the top of the file)

inline double pipeline_bytes_per_step(int rank, int p, int V, int m, double activation_elements,
                                      double element_bytes, double embedding_gradient_elements) {
    if (p == 1) return 0.0;
    const int S = p * V;
    double bytes = 0;
    for (int v = 0; v < V; v++) {
        const int s = pipeline_model_stage(rank, v, p);
        if (s < S - 1) bytes += m * activation_elements * element_bytes;
        if (s > 0) bytes += m * activation_elements * element_bytes;
    }
    if (rank == 0 || rank == p - 1) bytes += embedding_gradient_elements * element_bytes;
    bytes += (double)ring_share(sizeof(float), p) + (double)ring_share(sizeof(float), p, 2);
    return bytes;
}
