/*
Silent data corruption: a bit that flips in memory or in a GPU's arithmetic without any error. Nothing
crashes; one rank's copy of the parameters is simply wrong from then on, and through the gradients it
spreads into everyone's. What catches it is redundancy that exists by construction:
  replicas  the ranks of the gradient group (dp_replicate x dp_shard x cp) hold bit-identical parameters at
            ZeRO 0-2: they apply the same averaged gradient to the same values (ZeRO-1/2 all-gather the
            updated shards). At ZeRO-3 each shard exists once per dp_replicate group, so the dp_replicate
            ranks hold bit-identical shards.
  tp copies every tp rank holds the replicated tensors (wpe, the layernorms, the row-parallel biases) whole,
            and updates them with the same gradient: bit-identical too. (At ZeRO-3 the tp ranks' shards cut
            those tensors at different places, so they are not compared.)
check_replicas (--check-replicas N: every N steps) takes a checksum of every tensor this rank holds (of
its shard's part of it at ZeRO-3), gathers the checksums over each group and compares them. A mismatch
ends the run with one line naming the step, the tensor and the ranks; with three or more copies the
majority names the odd one out, with two only the pair is known. Cost: one copy of this rank's parameters
to the host and one pass over them (about 3 GB/s here), and one all-gather of 8 bytes per tensor per group
(scripts/bench/bench_replica_check.sh measures it); with N = 0 it never runs and costs nothing.
*/
#pragma once

#include <string>
#include <vector>
#include "../utils.h"
#include "../cpu/faults.h"
#include "../model/gpt2.cuh"
#include "comm.h"
#include "mesh.h"
#include "parallel_context.h"

// 64-bit checksum of a run of parameters: FNV-1a's step (xor, multiply by its prime) on 8-byte words, in
// four lanes that take every fourth word, so the processor overlaps their multiplications (one lane is a
// chain of dependent multiplies, 4x slower); the lanes and the tail are folded together at the end. A
// flipped bit changes its word, hence its lane's hash, hence the result.
inline uint64_t parameter_checksum(const void* data, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    const uint64_t prime = 1099511628211ull;
    uint64_t lane[4] = {14695981039346656037ull, 1, 2, 3};
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
        uint64_t words[4];
        memcpy(words, p + i, 32);
        for (int l = 0; l < 4; l++) {
            lane[l] = (lane[l] ^ words[l]) * prime;
            lane[l] ^= lane[l] >> 29;  // spreads the high bits' changes into the low ones the next xor meets
        }
    }
    uint64_t hash = lane[0];
    for (int l = 1; l < 4; l++) hash = (hash ^ lane[l]) * prime;
    for (; i < bytes; i++) hash = (hash ^ p[i]) * prime;
    return hash;
}

// A tensor instance in the error line: "ln2w of layer 3", "wte".
inline std::string tensor_instance_name(int kind, int layer) {
    return tensor_kind_info(kind).per_layer ? std::string(tensor_kind_info(kind).name) + " of layer " +
                                                  std::to_string(layer)
                                            : tensor_kind_info(kind).name;
}

// The checksum of every tensor instance this rank holds, in the model file's order: the whole tensor, or at
// ZeRO-3 the part of it in this rank's shard (empty parts have the empty checksum: replicas agree on it).
// The parameters come to pinned host memory made at the first check and kept (reachable until the process
// ends): a check allocates nothing after the first, and the copy runs at the link's full speed (a copy into
// pageable memory goes through a staging buffer of the driver's, in pieces).
inline std::vector<uint64_t> tensor_checksums(Zero& z, GPT2& model, std::vector<std::string>* names) {
    const ParameterLayout& layout = model.layout;
    const bool sharded = z.stage == 3;
    const size_t held_count = sharded ? layout.total / z.shards : layout.total;
    static floatX* pinned = nullptr;
    static size_t pinned_count = 0;
    if (pinned_count < held_count) {
        if (pinned) cudaCheck(cudaFreeHost(pinned));
        cudaCheck(cudaMallocHost(&pinned, held_count * sizeof(floatX)));
        pinned_count = held_count;
    }
    const floatX* held = pinned;
    copy_to_host(pinned, sharded ? z.param_shard : model.params, held_count, model.stream);
    std::vector<uint64_t> sums;
    for_each_tensor_in_file_order(layout, [&](int kind, int layer, size_t offset, size_t count) {
        size_t first = offset, end = offset + count, at = offset;  // buffer coordinates; `at`: index in `held`
        if (sharded) {
            const int chunk = layout.chunk_of(kind, layer);
            const size_t mine = shard_start(z, chunk), mine_end = mine + shard_size(z, chunk);
            first = std::max(first, mine), end = std::min(end, mine_end);
            at = shard_offset(z, chunk) + (first - mine);
        }
        sums.push_back(parameter_checksum(held + at, first < end ? (end - first) * sizeof(floatX) : 0));
        names->push_back(tensor_instance_name(kind, layer));
    });
    return sums;
}

// Compares the checksums `mine` (those with `compared` set) across `group`; stops with one line at the
// first tensor whose copies differ.
inline void compare_copies(Communicator& group, const char* what, const std::vector<uint64_t>& mine,
                           const std::vector<std::string>& names, const std::vector<char>& compared, int step,
                           cudaStream_t stream) {
    if (group.size == 1) return;
    const std::vector<uint64_t> everyone = all_gather_words(group, mine, stream);
    const std::vector<int> world_ranks = watched_members(group.watch);
    const size_t n = mine.size();
    for (size_t t = 0; t < n; t++) {
        if (!compared[t]) continue;
        auto copy = [&](int member) { return everyone[member * n + t]; };
        int differing = 0;
        for (int member = 1; member < group.size; member++) differing += copy(member) != copy(0);
        if (differing == 0) continue;
        // the odd one out: the member whose copy fewer than half the others share
        std::string odd, rest;
        for (int member = 0; member < group.size; member++) {
            int agreeing = 0;
            for (int other = 0; other < group.size; other++) agreeing += copy(other) == copy(member);
            std::string& list = 2 * agreeing > group.size ? rest : odd;
            list += (list.empty() ? "rank " : ", rank ") + std::to_string(world_ranks[member]);
        }
        if (rest.empty())
            fatal("silent data corruption at step %d: the copies of %s differ between %s (%s, no majority)", step,
                  names[t].c_str(), odd.c_str(), what);
        fatal("silent data corruption at step %d: %s holds a copy of %s that differs from %s's (%s)", step,
              odd.c_str(), names[t].c_str(), rest.c_str(), what);
    }
}

// --check-replicas: every copy of every tensor compared across the ranks that hold it (a collective over
// the replicas' group, the tp group and, under expert parallelism, the experts' replicas).
inline void check_replicas(ParallelContext& par, GPT2& model, int step) {
    std::vector<std::string> names;
    const std::vector<uint64_t> sums = tensor_checksums(par.zero, model, &names);
    const bool sharded = par.zero.stage == 3;
    Communicator& replicas = sharded ? par.mesh.axis[DP_REPLICATE] : par.mesh.gradient;
    // under expert parallelism (ZeRO 0) the experts are compared across the ranks that hold the same ones
    std::vector<char> dense, experts;
    for_each_tensor_in_file_order(model.layout, [&](int kind, int, size_t, size_t) {
        dense.push_back(par.ep.size == 1 || !tensor_is_expert(kind));
        experts.push_back(!dense.back());
    });
    compare_copies(replicas, "data-parallel replicas", sums, names, dense, step, model.stream);
    if (par.ep.size > 1)
        compare_copies(par.ep.experts_replicas, "replicas of an expert", sums, names, experts, step, model.stream);
    if (!sharded && par.tp.size > 1) {
        std::vector<char> replicated;
        for_each_tensor_in_file_order(model.layout, [&](int kind, int, size_t, size_t) {
            replicated.push_back(tensor_is_replicated(kind));
        });
        compare_copies(*par.tp.group, "tp copies of a replicated tensor", sums, names, replicated, step, model.stream);
    }
}

// The tests' silent data corruption (LLMC_FAULT_FLIP_BIT, llmc/cpu/faults.h): after step `step`'s update,
// one bit of one parameter on one rank. Nothing happens in the GPU build or without the variable.
inline void inject_planned_bit_flip(ParallelContext& par, GPT2& model, int step) {
    const PlannedBitFlip* flip = planned_bit_flip();
    if (!flip || flip->rank != par.world.rank || flip->step != step) return;
    int kind = 0;
    while (kind < NUM_TENSOR_KINDS && flip->tensor != tensor_kind_info(kind).name) kind++;
    if (kind == NUM_TENSOR_KINDS) fatal("LLMC_FAULT_FLIP_BIT: no tensor named '%s'", flip->tensor.c_str());
    const ParameterLayout& layout = model.layout;
    if (par.zero.stage == 3) fatal("LLMC_FAULT_FLIP_BIT: flips parameters of ZeRO stages 0-2 only");
    if (flip->layer >= model.config.num_layers || !layout.holds(layout.chunk_of(kind, flip->layer)) ||
        (size_t)flip->element >= layout.elements(kind, flip->layer) || flip->bit >= (int)(8 * sizeof(floatX)))
        fatal("LLMC_FAULT_FLIP_BIT: rank %d holds no element %lld, bit %d of %s", flip->rank, flip->element, flip->bit,
              tensor_instance_name(kind, flip->layer).c_str());
    floatX* address = model.params + layout.offset(kind, flip->layer) + flip->element;
    floatX value;
    copy_to_host(&value, address, 1, model.stream);
    unsigned char bytes[sizeof(floatX)];
    memcpy(bytes, &value, sizeof(floatX));
    bytes[flip->bit / 8] ^= (unsigned char)(1u << (flip->bit % 8));
    memcpy(&value, bytes, sizeof(floatX));
    copy_to_device(address, &value, 1, model.stream);
    fprintf(stderr, "fault injected: rank %d flipped bit %d of element %lld of %s after step %d\n", par.world.rank,
            flip->bit, flip->element, tensor_instance_name(kind, flip->layer).c_str(), step);
}
