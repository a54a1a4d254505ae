/*
A pipeline rank (llmc/parallel/pipeline.h runs it): which stages it holds, its schedule's actions over the
step's microbatches and the stage record each one uses, and the links to its neighbours.

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
                Communicator link = comm_split(mesh.axis[PP], member ? 0 : 1, r == sender ? 0 : 1,
                                               direction > 0 ? "pp activations link" : "pp gradients link");
                Communicator* keep = !member ? nullptr
                                     : direction > 0 ? (r == sender ? &pipe.activations_out : &pipe.activations_in)
                                                     : (r == sender ? &pipe.gradients_out : &pipe.gradients_in);
                if (keep) *keep = link;
                else comm_destroy(link);
            }
        const bool holds_wte = pipe.rank == 0 || pipe.rank == pipe.size - 1;
        pipe.tied = comm_split(mesh.axis[PP], holds_wte ? 0 : 1, pipe.rank, "pp first and last stage");
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

// The loss (or anything in a device float) from the last stage's rank to the others of the pp axis.
inline void pipeline_share_from_last_stage(Pipeline& pipe, float* value, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast(*pipe.group, value, count, pipe.size - 1, stream);
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
