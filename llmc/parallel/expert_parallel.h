/*
Expert parallelism: the experts of a mixture of experts (llmc/model/moe.cuh) split over ep ranks, each holding
E/ep of them, and every row taken to the rank that holds its expert and back.

Which ranks. The ep ranks of a group are ep consecutive data-parallel ranks (Megatron draws them from the dp
ranks too): dp rank d is ep rank d % ep of group d / ep. They train on different rows, like any dp ranks;
each routes its own rows and holds experts [r E/ep, (r+1) E/ep) of every MoE block (ep rank r; the tensors'
slices are tensor_slice's, llmc/model/parameters.h, so checkpoints and the model file convert between ep sizes
like between tp sizes). Everything else, the router included, is whole on every ep rank.

A layer's pass. Each rank routes its N rows and sorts its N K assignments by expert (the dispatch plan), so
the rows for ep rank o's experts are one block. Then:
    counts   every rank's rows per expert, gathered over the group on the device (E ints per rank), then
             copied to the host in one copy: the sizes of the blocks below (NCCL's all-to-all takes its
             sizes as host arguments) and of each expert's matmuls
    dispatch all-to-all: the block for rank o goes to o. Rank o receives, from each source s in turn, s's
             rows for its experts, sorted by expert; it re-sorts them by expert, then by source. Sources
             are consecutive dp ranks holding consecutive rows of the global batch, so each expert's rows
             stand in the order one rank with the whole batch would have them, and its matmuls are that
             rank's matmuls on the same rows.
    experts  each of its experts on its rows
    combine  the reverse: outputs sorted back by source, all-to-all home, where the weighted sum takes them
The backward pass does the same with the gradients: the output gradients out to the experts, the input
gradients home. The weight gradient of an expert sums over the rows of all ep ranks of the group; the dp
ranks that hold the same experts (one per group, times cp) then average it (llmc/parallel/zero.h), and
since each row's gradient carries its own rank's 1 / rows, the average is scaled by 1/ep: the mean over
all dp ranks, as one rank would have it.

Bytes per layer and pass (floatX values of C channels per row, counts as 4-byte ints), for this rank:
    counts   (ep-1) E 4                       (an all-gather of E ints per rank)
    dispatch C s sum over the other ranks o of the rows this rank sends to o's experts
    combine  C s sum over the other sources s of the rows this rank's experts ran for s
Forward and backward each move one dispatch and one combine; the counts go once, in the forward pass
(again where recomputation reruns it). The step's log reports what the ep group sent (ep_comm_bytes);
scripts/test/test_moe_layouts.sh holds it against this formula where every row goes to every expert
(K = E), which fixes the blocks: (ep-1)/ep of each rank's N K rows leave it, and as many come back.
*/
#pragma once

#include <cmath>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "mesh.h"
#include "layout.h"

struct ExpertParallel {
    int size = 1, rank = 0;
    Communicator group;                // the ep ranks of this rank's group (same pp, cp, tp coordinates)
    Communicator experts_replicas;     // the ranks holding the same experts: one per group, times cp
    Communicator dense_replicas;       // the ep group again, for ZeRO 1-3's average of the dense gradient
                                       // (data-parallel traffic, kept apart from the all-to-alls' count)
    Communicator whole_model;          // ep x pp x tp: together they hold one whole copy of the model
};

// "" when --ep fits the layout and model, else the one line that says why not.
inline std::string ep_layout_error(int experts, const Layout& l) {
    if (l.ep == 1) return "";
    const int dp = layout_data_parallel(l);
    if (experts == 0) return "--ep " + std::to_string(l.ep) + " needs a mixture of experts (--experts)";
    if (dp % l.ep != 0)
        return "--ep " + std::to_string(l.ep) + " does not divide the " + std::to_string(dp) +
               " data-parallel ranks it is drawn from";
    if (experts % l.ep != 0)
        return "--ep " + std::to_string(l.ep) + " does not divide the " + std::to_string(experts) + " experts";
    if (l.dp_shard != 0 && l.dp_shard != dp)
        return "--dp-shard " + std::to_string(l.dp_shard) + " with --ep " + std::to_string(l.ep) +
               ": expert parallelism shards the optimizer state over the ranks holding the same experts (no HSDP)";
    return "";
}

// Every rank of the world calls this together, with the mesh built.
inline void ep_create(ExpertParallel& ep, Communicator& world, const Mesh& mesh, int size) {
    ep.size = size;
    const int dp_rank = mesh_data_parallel_rank(mesh);
    ep.rank = dp_rank % size;
    const int group_index = dp_rank / size;
    const int pp = mesh.coords[PP], cp = mesh.coords[CP], tp = mesh.coords[TP];
    const int pps = mesh.layout.sizes[PP], cps = mesh.layout.sizes[CP], tps = mesh.layout.sizes[TP];
    ep.group = comm_split(world, ((group_index * pps + pp) * cps + cp) * tps + tp, world.rank, "ep");
    ep.experts_replicas = comm_split(world, (ep.rank * pps + pp) * tps + tp, world.rank, "expert replicas");
    ep.dense_replicas = comm_split(world, ((group_index * pps + pp) * cps + cp) * tps + tp, world.rank,
                                   "dense replicas (ep)");
    ep.whole_model = comm_split(world, group_index * cps + cp, world.rank, "whole model (ep x pp x tp)");
}

inline void ep_destroy(ExpertParallel& ep) {
    if (ep.size == 1) return;
    comm_destroy(ep.group);
    comm_destroy(ep.experts_replicas);
    comm_destroy(ep.dense_replicas);
    comm_destroy(ep.whole_model);
}

// What a step routes on one rank, as the formula below counts it: B sequences of T rows through `layers` MoE
// layers in `microbatches` micro-steps (forward_passes: 2 where full recomputation reruns each forward pass), each
// row sent to experts_per_token of the `experts`, as `channels` values of value_bytes bytes.
struct RoutedSteps {
    int experts = 0, experts_per_token = 0, channels = 0;
    int B = 0, T = 0, layers = 0, microbatches = 1, forward_passes = 1;
    size_t value_bytes = 0;
};

// The formula above per step, the rows spread evenly over the experts (exact where every row goes to every expert,
// K = E): (ep-1)/ep of the rank's N K rows leave it in each dispatch and as many come back in each combine; plus the
// gradient norm's all-reduce of one fp32 over the ep group, once per step, rounded down to whole bytes as comm.h
// counts it.
inline double ep_bytes_per_step(int ep, const RoutedSteps& r) {
    if (ep == 1) return 0.0;
    const double share = (ep - 1.0) / ep, rows = (double)r.B * r.T * r.experts_per_token;
    const double counts = (ep - 1.0) * r.experts * 4;
    const double forward = counts + 2 * share * rows * r.channels * r.value_bytes;   // counts, dispatch, combine
    const double backward = 2 * share * rows * r.channels * r.value_bytes;
    return (double)r.layers * r.microbatches * (r.forward_passes * forward + backward) + std::floor(2 * share * 4);
}

// bytes this rank sent over the ep groups (the exchanges, the gradients' reductions, the whole model)
inline uint64_t ep_bytes_sent(const ExpertParallel& ep) {
    return ep.group.bytes_sent + ep.experts_replicas.bytes_sent + ep.dense_replicas.bytes_sent +
           ep.whole_model.bytes_sent;
}
inline void ep_reset_bytes(ExpertParallel& ep) {
    ep.group.bytes_sent = ep.experts_replicas.bytes_sent = ep.dense_replicas.bytes_sent = ep.whole_model.bytes_sent = 0;
}

// ----------------------------------------------------------------------------
// the routed rows' journey

// Rows per (source ep rank, expert), source-major, on the host: what ep_gather_counts gathered and moe_forward
// copied back (with ep 1, this rank's), and how wide a row is where the exchanges below move rows.
struct ExpertCounts {
    const int* rows;  // (ep, E) host
    int experts, ep, rank;
    size_t width;     // values per row
    int local() const { return experts / ep; }
    int from(int source, int local_expert) const { return rows[source * experts + rank * local() + local_expert]; }
    // rows source s sends to ep rank o's experts
    size_t block(int source, int owner) const {
        size_t total = 0;
        for (int e = owner * local(); e < (owner + 1) * local(); e++) total += rows[source * experts + e];
        return total;
    }
};

// Every ep rank's rows per expert (E ints on the device each), gathered on the device into `gathered` (ep E ints):
// returns the (ep, E) device table, source-major, that the host copies back in one piece (this rank's own counts
// at ep 1). The ints travel as pairs of bf16 elements, which collectives move bit for bit.
inline const int* ep_gather_counts(ExpertParallel& ep, int* gathered, const int* my_rows, int E, cudaStream_t stream) {
    if (ep.size == 1) return my_rows;
    static_assert(sizeof(int) == 2 * sizeof(__nv_bfloat16), "an int travels as two bf16 elements");
    all_gather(ep.group, reinterpret_cast<__nv_bfloat16*>(gathered), reinterpret_cast<const __nv_bfloat16*>(my_rows),
               2 * (size_t)E, stream);
    return gathered;
}

// Calls fn(local_expert, first_row, rows) for every expert of this rank with rows, its rows the block
// [first_row, + rows) of the rows sorted by expert, then by source.
template <class Function>
void for_each_local_expert(const ExpertCounts& n, Function&& fn) {
    size_t first = 0;
    for (int e = 0; e < n.local(); e++) {
        size_t rows = 0;
        for (int s = 0; s < n.ep; s++) rows += n.from(s, e);
        if (rows > 0) fn(e, first, (int)rows);
        first += rows;
    }
}

// Moves row blocks between the two orders of the rows this rank's experts run: as received (by source, then
// expert) and as the experts run them (by expert, then source).
inline void ep_reorder(const ExpertCounts& n, floatX* out, const floatX* in, bool to_expert_order, cudaStream_t stream) {
    const size_t width = n.width;
    std::vector<size_t> expert_first(n.local() + 1, 0);  // where each expert's rows start, by expert
    for (int e = 0; e < n.local(); e++) {
        size_t rows = 0;
        for (int s = 0; s < n.ep; s++) rows += n.from(s, e);
        expert_first[e + 1] = expert_first[e] + rows;
    }
    std::vector<size_t> placed(expert_first.begin(), expert_first.end() - 1);
    size_t at = 0;  // in the received order
    for (int s = 0; s < n.ep; s++) {
        for (int e = 0; e < n.local(); e++) {
            const size_t rows = n.from(s, e);
            if (rows == 0) continue;
            const size_t received = at * width, sorted = placed[e] * width;
            cudaCheck(cudaMemcpyAsync(out + (to_expert_order ? sorted : received), in + (to_expert_order ? received : sorted),
                                      rows * width * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
            placed[e] += rows;
            at += rows;
        }
    }
}

// Sends this rank's rows (sent: sorted by expert, so one block per owner) to the ranks of their experts;
// `received` gets the rows for this rank's experts sorted by expert, then source. exchange: room for them.
inline void ep_dispatch(ExpertParallel& ep, const ExpertCounts& n, floatX* received, const floatX* sent,
                        floatX* exchange, cudaStream_t stream) {
    std::vector<size_t> send(ep.size), receive(ep.size);
    for (int o = 0; o < ep.size; o++) send[o] = n.block(ep.rank, o) * n.width;
    for (int s = 0; s < ep.size; s++) receive[s] = n.block(s, ep.rank) * n.width;
    all_to_all_v(ep.group, exchange, receive, sent, send, stream);
    ep_reorder(n, received, exchange, /*to_expert_order=*/true, stream);
}

// The reverse of ep_dispatch: this rank's experts' rows (sorted by expert, then source) go home; `returned`
// gets this rank's own rows back, in the order they were sent.
inline void ep_combine(ExpertParallel& ep, const ExpertCounts& n, floatX* returned, const floatX* run,
                       floatX* exchange, cudaStream_t stream) {
    ep_reorder(n, exchange, run, /*to_expert_order=*/false, stream);
    std::vector<size_t> send(ep.size), receive(ep.size);
    for (int s = 0; s < ep.size; s++) send[s] = n.block(s, ep.rank) * n.width;
    for (int o = 0; o < ep.size; o++) receive[o] = n.block(ep.rank, o) * n.width;
    all_to_all_v(ep.group, returned, receive, exchange, send, stream);
}
