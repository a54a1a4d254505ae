/*
A pipeline rank (llmc/parallel/pipeline.h runs it): which stages it holds, its schedule's actions over the
step's microbatches, the stage record and weight record each one uses, the messages it exchanges with its
neighbours before each action, and how they travel.

Point to point as NCCL guarantees it. NCCL's send and receive block the GPU until the peer arrives, and
operations that must progress together must be in one group: under 1F1B neighbours send to each other at
the same moment (one the activations, the other a gradient), and two lone operations would wait for each
other. So before each action the rank issues one group (llmc/parallel/comm.h's send_and_receive): the receives
this action needs and the sends of earlier results whose receiver is ready for them (pipeline_message_groups in
llmc/parallel/pipeline_simulator.h finds them by playing all ranks' lists; its checker proves every schedule's
groups free of deadlock under these semantics, and shows that lone operations deadlock 1F1B). The group
completes before the action starts. The CPU build's sends are synchronous (MPI_Issend) so the tests see
NCCL's semantics at every message size.

One communicator for every message: the pp axis. NCCL runs a group that spans several communicators as one
kernel per communicator, one after another on the stream, in an order it chooses (its user guide, "Using
multiple NCCL communicators concurrently"; NVIDIA/nccl #1347 is such a deadlock), and the CPU build does the
same (llmc/parallel/comm.h, LLMC_CPU_GROUP_ORDER). With a communicator per neighbour link, as this file once
had, a middle rank's group holds operations on two links, and which link's kernel runs first decides whether
the ranks' groups meet. dev/test/test_pipeline.cu plays every schedule's groups with each message on its old
link (pipeline_check_message_groups, p = 2..8) under three orders: interleaved deadlocks under an order both
ends agree on (28 of its 104 layouts, the wrap-around link closing a cycle), interleaved and zbv under orders
each rank picks for itself (54 and all 56); gpipe, 1f1b and zb-h1 survive these three. The CPU build showed
it too: interleaved at pp 3, m 3, V 2 on per-link communicators (LLMC_FAULT_PER_LINK_P2P) hung under
LLMC_CPU_GROUP_ORDER=hash and ran under reverse (the communicators' identities decide which order is which). On the one communicator each group is one kernel and the order
question does not arise. NCCL's point to point works on
any communicator; the price is that messages between two ranks now share one channel per direction, paired
in the order they are posted. zbv's two chunks both cross each neighbour pair, both ways: rank r sends r+1
chunk 0's activations and chunk 1's gradients, which r+1 receives in its own action order. So
pipeline_message_groups posts a rank's sends to each peer in the order the peer receives them (holding a send
back, if need be, to the group of the one the peer takes before it), and pipeline_match_messages checks, for
every schedule, that the k-th message posted from a to b is the k-th that b receives from a.
For the watchdog each neighbour pair is still a named group ("pp link r-(r+1)", the axis' members), so a
stalled exchange is reported as a wait on that link for that peer, and the axis' own arrival counts stay those
of its collectives (the loss's broadcast, the norm's sum).

Bytes this rank sends per step on the pp axis, for a = B T C activation elements per message (B T C / tp
under sequence parallelism), s bytes per element, and this rank's V stages:
    activations   m a s for each of its stages whose next stage is on another rank (not the last, S-1)
    gradients     m a s for each of its stages whose previous stage is on another rank (not the first, 0)
    tied wte      e s on the first and the last stage's ranks, when they differ, e = the embedding chunk's
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
#include "../cpu/faults.h"
#include "comm.h"
#include "mesh.h"
#include "../model/gpt2.cuh"
#include "pipeline_schedule.h"
#include "pipeline_simulator.h"
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
    std::vector<int> outbox_of;             // per action: the outbox its gradient is copied to (-1: none)
    std::vector<int> head_of;               // per action: the head record it uses (-1: none)
    int records = 1, weight_records = 0;    // the pools' sizes
    int heads = 0;
    int outboxes = 0;
    Communicator* group = nullptr;          // the pp axis: the messages, the loss's broadcast, the norm's sum
    std::vector<int> link_watch;            // per neighbour pair (q, q+1 mod p): its name for the watchdog
    std::vector<Communicator> fault_links;  // LLMC_FAULT_PER_LINK_P2P only: per (chunk, pair), this rank's pairs
    bool tied_head = true;                  // the LM head is wte (GPT-2): the last stage holds a copy of it
    Communicator tied;                      // the first and the last stage's ranks, if two: wte's gradient
    // the step being measured
    bool measuring = false;
    std::chrono::steady_clock::time_point origin;
    std::vector<PipelineEvent> events;      // this rank's actions and waits
};

inline int pipeline_stage_count(const Pipeline& pipe) { return pipe.size * pipe.virtual_stages; }

// The watchdog's group for a message to or from neighbour `peer`: the link of the pair.
inline int pipeline_link_watch(const Pipeline& pipe, int peer) {
    const int p = pipe.size, r = pipe.rank;
    if (peer == (r + 1) % p) return pipe.link_watch.at(p == 2 ? 0 : r);
    if (peer == (r + p - 1) % p) return pipe.link_watch.at(p == 2 ? 0 : (r + p - 1) % p);
    fatal("pipeline: rank %d has no link to rank %d", r, peer);
}

// The send or receive of a message, `count` elements at `data`: on the pp axis, or under LLMC_FAULT_PER_LINK_P2P
// on the communicator of its pair and chunk (the old structure, which the fault's test sees deadlock).
inline PointToPoint pipeline_point_to_point(Pipeline& pipe, const PipelineMessage& message, floatX* data,
                                            size_t count) {
    const PointToPoint::Kind kind = message.send ? PointToPoint::Send : PointToPoint::Receive;
    const int watch = pipeline_link_watch(pipe, message.peer);
    if (pipe.fault_links.empty()) return PointToPoint{kind, pipe.group, data, count, message.peer, watch};
    const int p = pipe.size, pairs = (int)pipe.link_watch.size();
    const int pair = p == 2 ? 0 : message.peer == (pipe.rank + 1) % p ? pipe.rank : message.peer;
    const int chunk = pipe.schedule == PipelineSchedule::ZeroBubbleV && message.from_stage >= p ? 1 : 0;
    Communicator& link = pipe.fault_links.at(chunk * pairs + pair);
    return PointToPoint{kind, &link, data, count, 1 - link.rank, link.watch};
}

// Every rank's groups of sends and receives for the schedule's lists (pipeline_message_groups).
inline std::vector<std::vector<std::vector<PipelineMessage>>> pipeline_all_groups(PipelineSchedule schedule, int p,
                                                                                int V, int m) {
    std::vector<std::vector<PipelineAction>> lists;
    for (int q = 0; q < p; q++) lists.push_back(pipeline_actions(schedule, q, p, m, V));
    return pipeline_message_groups(lists, schedule, V);
}

// The part of the model pipeline rank `rank` runs (llmc/model/gpt2.cuh): its chunks, the most layers of any of
// its stages (its records are sized for that stage), as many stage, weight and head records as its schedule
// has passes in flight, and as many outboxes as its sends hold at once.
inline ModelPart pipeline_model_part(PipelineSchedule schedule, int rank, int p, int V, int m,
                                     const std::vector<int>& stage_layers, bool tied_head) {
    ModelPart part;
    part.outboxes = pipeline_outboxes(pipeline_all_groups(schedule, p, V, m)[rank]);
    part.held_chunks = pipeline_held_chunks(schedule, rank, p, V, stage_layers, tied_head);
    for (int v = 0; v < V; v++) {
        const int stage = pipeline_model_stage(schedule, rank, v, p);
        part.stage_layers = std::max(part.stage_layers, stage_layers[stage]);
        part.stage_first_layers.push_back(pipeline_first_layer(stage_layers, stage));
        part.stage_sizes.push_back(stage_layers[stage]);
    }
    part.records = pipeline_peak_activations(schedule, rank, p, m, V);
    part.weight_records = pipeline_peak_weight_records(schedule, rank, p, m, V);
    part.heads = std::max(1, pipeline_peak_head_records(schedule, rank, p, m, V));  // 1: unused off the last stage
    return part;
}

// Every rank calls this together (the tied embeddings' group is a split of the pp axis).
inline void pipeline_create(Pipeline& pipe, Mesh& mesh, PipelineSchedule schedule, int V, int m,
                            const std::vector<int>& stage_layers, bool tied_head) {
    pipe.schedule = schedule;
    pipe.tied_head = tied_head;
    pipe.size = mesh.layout.sizes[PP];
    pipe.rank = mesh.coords[PP];
    pipe.virtual_stages = V;
    pipe.microbatches = m;
    pipe.stage_layers = stage_layers;
    const int p = pipe.size, r = pipe.rank, S = p * V;
    pipe.last_stage_rank = pipeline_stage_rank(schedule, S - 1, p);
    pipe.actions = pipeline_actions(schedule, r, p, m, V);
    const std::vector<std::vector<std::vector<PipelineMessage>>> groups = pipeline_all_groups(schedule, p, V, m);
    const std::string stuck = pipeline_check_message_groups(groups);
    if (!stuck.empty()) fatal("pipeline %s: its sends and receives cannot run: %s", pipeline_schedule_name(schedule),
                              stuck.c_str());
    pipe.messages = groups[r];
    pipe.outboxes = pipeline_outboxes(pipe.messages);
    pipe.outbox_of.assign(pipe.actions.size(), -1);
    for (const std::vector<PipelineMessage>& group : pipe.messages)
        for (const PipelineMessage& message : group)
            if (message.send && message.outbox >= 0) pipe.outbox_of[message.action] = message.outbox;
    pipe.record_of = pipeline_record_assignment(pipe.actions, &pipe.records);
    const std::string late = pipeline_check_send_buffers(pipe.actions, pipe.messages, pipe.record_of, schedule, r, p, V);
    if (!late.empty()) fatal("pipeline %s: %s", pipeline_schedule_name(schedule), late.c_str());
    pipe.weight_record_of = pipeline_weight_record_assignment(pipe.actions, &pipe.weight_records);
    pipe.head_of = pipeline_head_assignment(pipe.actions, schedule, r, p, V, &pipe.heads);
    if (pipe.records != pipeline_peak_activations(schedule, r, p, m, V) ||
        pipe.weight_records != pipeline_peak_weight_records(schedule, r, p, m, V) ||
        pipe.heads != pipeline_peak_head_records(schedule, r, p, m, V))
        fatal("pipeline %s: the actions need %d records, %d weight records and %d head records, the formulas say "
              "%d, %d and %d", pipeline_schedule_name(schedule), pipe.records, pipe.weight_records, pipe.heads,
              pipeline_peak_activations(schedule, r, p, m, V), pipeline_peak_weight_records(schedule, r, p, m, V),
              pipeline_peak_head_records(schedule, r, p, m, V));
    pipe.group = &mesh.axis[PP];
    if (p > 1) {
        // the watchdog's name for each neighbour pair (q, q+1), the wrap-around (p-1, 0) only where a schedule
        // sends across it (interleaved); with p = 2 it is the pair (0, 1) again. Every rank registers them
        // in the same order, so equal links get equal indices.
        const int pairs = p == 2 ? 1 : schedule == PipelineSchedule::Interleaved ? p : p - 1;
        const std::vector<int> members = watched_members(mesh.axis[PP].watch);
        for (int q = 0; q < pairs; q++)
            pipe.link_watch.push_back(
                watched_group("pp link " + std::to_string(q) + "-" + std::to_string((q + 1) % p), members));
        if (fault_per_link_point_to_point()) {
            const int chunks = schedule == PipelineSchedule::ZeroBubbleV ? 2 : 1;
            pipe.fault_links.resize(chunks * pairs);
            for (int c = 0; c < chunks; c++)
                for (int q = 0; q < pairs; q++) {
                    const bool member = r == q || r == (q + 1) % p;
                    pipe.fault_links[c * pairs + q] =
                        comm_split(mesh.axis[PP], member ? 0 : kNotInGroup, r,
                                   "pp link " + std::to_string(q) + "-" + std::to_string((q + 1) % p) + " chunk " +
                                       std::to_string(c));
                }
        }
        // zbv holds the first and the last stage on rank 0: one copy of wte, nothing to add up; an untied head
        // leaves wte on the first stage alone
        const bool holds_wte = tied_head && pipe.last_stage_rank != 0 && (r == 0 || r == pipe.last_stage_rank);
        pipe.tied = comm_split(mesh.axis[PP], holds_wte ? 0 : kNotInGroup, r, "pp first and last stage");
    }
}

inline void pipeline_free(Pipeline& pipe) {
    for (Communicator& link : pipe.fault_links) comm_destroy(link);
    comm_destroy(pipe.tied);
    pipe = Pipeline{};
}

// bytes sent over the pipeline's own group, the tied embeddings' (the messages travel on the pp axis, which
// counts with the mesh's groups)
inline uint64_t pipeline_link_bytes(const Pipeline& pipe) { return pipe.tied.bytes_sent; }
inline void pipeline_reset_bytes(Pipeline& pipe) { pipe.tied.bytes_sent = 0; }

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

inline double pipeline_bytes_per_step(PipelineSchedule schedule, int rank, int p, int V, int m,
                                      double activation_elements, double element_bytes,
                                      double embedding_gradient_elements) {
    if (p == 1) return 0.0;
    const int S = p * V, last_stage_rank = pipeline_stage_rank(schedule, S - 1, p);
    const double message = m * activation_elements * element_bytes;
    double bytes = 0;
    for (int v = 0; v < V; v++) {
        const int s = pipeline_model_stage(schedule, rank, v, p);
        if (s < S - 1 && pipeline_stage_rank(schedule, s + 1, p) != rank) bytes += message;
        if (s > 0 && pipeline_stage_rank(schedule, s - 1, p) != rank) bytes += message;
    }
    if (last_stage_rank != 0 && (rank == 0 || rank == last_stage_rank))
        bytes += embedding_gradient_elements * element_bytes;
    bytes += (double)ring_share(sizeof(float), p) + (double)ring_share(sizeof(float), p, 2);
    return bytes;
}
