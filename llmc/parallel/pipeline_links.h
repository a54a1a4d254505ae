/*
A pipeline rank (llmc/parallel/pipeline.h runs it): which stages it holds, its schedule's actions over the
step's microbatches, the stage record and weight record each one uses, the messages it exchanges with its
neighbours before each action, and the links that carry them.

Point to point as NCCL guarantees it. NCCL's send and receive block the GPU until the peer arrives, and
operations that must progress together must be in one group: under 1F1B neighbours send to each other at
the same moment (one the activations, the other a gradient), and two lone operations would wait for each
other. So before each action the rank issues one group (llmc/parallel/comm.h's send_and_receive): the sends of the
previous action's results and the receives this action needs (pipeline_message_groups in
llmc/parallel/pipeline_schedule.h, whose simulator proves every schedule's groups free of deadlock under these
semantics, and shows that lone operations deadlock 1F1B). The group completes before the action starts, so a
sent buffer is free again at once. The CPU build's sends are synchronous (MPI_Issend) so the tests see
NCCL's semantics at every message size.

Each neighbour pair (r, r+1) has a link of its own, a two-rank communicator that carries the activations
and gradients both ways (and (p-1, 0) for the interleaved schedule's wrap-around); messages between two
ranks are paired in the order they are issued, which the schedule's groups keep the same at both ends.
Ranks outside a pair get no communicator (comm_split's kNotInGroup).

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
#include "pipeline_split.h"

struct Pipeline {
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    int size = 1, rank = 0;                 // p, and this rank's place on the pp axis
    int virtual_stages = 1;                 // V
    int microbatches = 1;                   // m
    std::vector<int> stage_layers;          // layers of each of the p V model stages
    int last_stage_rank = 0;                // the rank of the last model stage: the loss
    std::vector<PipelineAction> actions;    // this rank's, in order
    std::vector<std::vector<PipelineMessage>> messages;  // per action, and one more after the last: the group
                                                         // of sends and receives issued before it
    std::vector<int> record_of;             // per action: the stage record it uses
    std::vector<int> weight_record_of;      // per action: the weight record it uses (-1: none)
    int records = 1, weight_records = 0;    // the pools' sizes
    Communicator* group = nullptr;          // the pp axis: the loss's broadcast, the norm's sum
    Communicator next_link, previous_link;  // the pairs (r, r+1) and (r-1, r) (p = 2: next_link is both)
    Communicator tied;                      // the first and the last stage's ranks (p > 1): wte's gradient
    // the step being measured
    bool measuring = false;
    std::chrono::steady_clock::time_point origin;
    std::vector<PipelineEvent> events;      // this rank's actions and waits
};

inline int pipeline_stage_count(const Pipeline& pipe) { return pipe.size * pipe.virtual_stages; }

// The link to pipeline rank `peer`, a neighbour.
inline Communicator& pipeline_link(Pipeline& pipe, int peer) {
    const int p = pipe.size;
    if (peer == (pipe.rank + 1) % p) return pipe.next_link;
    if (peer == (pipe.rank + p - 1) % p) return pipe.previous_link;
    fatal("pipeline: rank %d has no link to rank %d", pipe.rank, peer);
}

// The part of the model pipeline rank `rank` runs (llmc/model/gpt2.cuh): its chunks, the most layers of any of
// its stages (its records are sized for that stage), and as many stage records and weight records as its
// schedule has passes in flight.
inline ModelPart pipeline_model_part(PipelineSchedule schedule, int rank, int p, int V, int m,
                                     const std::vector<int>& stage_layers) {
    ModelPart part;
    part.held_chunks = pipeline_held_chunks(rank, p, V, stage_layers);
    for (int v = 0; v < V; v++)
        part.stage_layers = std::max(part.stage_layers, stage_layers[pipeline_model_stage(rank, v, p)]);
    part.records = pipeline_peak_activations(schedule, rank, p, m, V);
    part.weight_records = pipeline_peak_weight_records(schedule, rank, p, m, V);
    return part;
}

// Every rank calls this together (the links are made by splitting the pp axis).
inline void pipeline_create(Pipeline& pipe, Mesh& mesh, PipelineSchedule schedule, int V, int m,
                            const std::vector<int>& stage_layers) {
    pipe.schedule = schedule;
    pipe.size = mesh.layout.sizes[PP];
    pipe.rank = mesh.coords[PP];
    pipe.virtual_stages = V;
    pipe.microbatches = m;
    pipe.stage_layers = stage_layers;
    const int p = pipe.size, r = pipe.rank, S = p * V;
    pipe.last_stage_rank = pipeline_stage_rank(S - 1, p);
    pipe.actions = pipeline_actions(schedule, r, p, m, V);
    pipe.messages = pipeline_message_groups(pipe.actions, r, p, V);
    pipe.record_of = pipeline_record_assignment(pipe.actions, &pipe.records);
    pipe.weight_record_of = pipeline_weight_record_assignment(pipe.actions, &pipe.weight_records);
    if (pipe.records != pipeline_peak_activations(schedule, r, p, m, V) ||
        pipe.weight_records != pipeline_peak_weight_records(schedule, r, p, m, V))
        fatal("pipeline %s: the actions need %d records and %d weight records, the formulas say %d and %d",
              pipeline_schedule_name(schedule), pipe.records, pipe.weight_records,
              pipeline_peak_activations(schedule, r, p, m, V), pipeline_peak_weight_records(schedule, r, p, m, V));
    pipe.group = &mesh.axis[PP];
    if (p > 1) {
        // one split of the pp axis per neighbour pair (q, q+1); the wrap-around pair (p-1, 0) only where a
        // schedule sends across it (interleaved), and with p = 2 it is the pair (0, 1) again
        const int pairs = p == 2 ? 1 : V > 1 ? p : p - 1;  // interleaving sends stage p-1's output to rank 0
        for (int q = 0; q < pairs; q++) {
            const int low = q, high = (q + 1) % p;
            const bool member = r == low || r == high;
            Communicator link = comm_split(mesh.axis[PP], member ? 0 : kNotInGroup, r,
                                           "pp link " + std::to_string(low) + "-" + std::to_string(high));
            if (!member) continue;
            (r == low ? pipe.next_link : pipe.previous_link) = link;
        }
        if (p == 2) (r == 0 ? pipe.previous_link : pipe.next_link) = r == 0 ? pipe.next_link : pipe.previous_link;
        const bool holds_wte = r == 0 || r == pipe.last_stage_rank;
        pipe.tied = comm_split(mesh.axis[PP], holds_wte ? 0 : kNotInGroup, r, "pp first and last stage");
    }
}

inline void pipeline_free(Pipeline& pipe) {
    comm_destroy(pipe.next_link);
    if (pipe.size > 2) comm_destroy(pipe.previous_link);
    comm_destroy(pipe.tied);
    pipe = Pipeline{};
}

// bytes sent over the pipeline's own groups (the pp axis itself counts with the mesh's groups)
inline uint64_t pipeline_link_bytes(const Pipeline& pipe) {
    return pipe.next_link.bytes_sent + (pipe.size > 2 ? pipe.previous_link.bytes_sent : 0) + pipe.tied.bytes_sent;
}
inline void pipeline_reset_bytes(Pipeline& pipe) {
    pipe.next_link.bytes_sent = pipe.previous_link.bytes_sent = pipe.tied.bytes_sent = 0;
}

// The loss (or anything in a device float) from the last stage's rank to the others of the pp axis.
inline void pipeline_share_from_last_stage(Pipeline& pipe, float* value, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast(*pipe.group, value, count, pipe.last_stage_rank, stream);
}

// Host values on the last stage's rank become the same on every rank of the pp axis (a collective).
template <typename T>
void pipeline_share_host_from_last_stage(Pipeline& pipe, T* values, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast_host(*pipe.group, values, count, pipe.last_stage_rank, stream);
}

// One number from every rank of the pp axis, on all of them (a collective): for reports per stage.
inline std::vector<float> pipeline_gather_values(Pipeline& pipe, float value, cudaStream_t stream) {
    return pipe.size == 1 ? std::vector<float>{value} : gather_values(*pipe.group, value, stream);
}

// ----------------------------------------------------------------------------
// the bytes formula (see the top of the file)

inline double pipeline_bytes_per_step(int rank, int p, int V, int m,
                                      double activation_elements, double element_bytes,
                                      double embedding_gradient_elements) {
    if (p == 1) return 0.0;
    const int S = p * V;
    const double message = m * activation_elements * element_bytes;
    double bytes = 0;
    for (int v = 0; v < V; v++) {
        const int s = pipeline_model_stage(rank, v, p);
        if (s < S - 1) bytes += message;
        if (s > 0) bytes += message;
    }
    if (rank == 0 || rank == p - 1) bytes += embedding_gradient_elements * element_bytes;
    bytes += (double)ring_share(sizeof(float), p) + (double)ring_share(sizeof(float), p, 2);
    return bytes;
}
