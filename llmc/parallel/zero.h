/*
Data parallelism and ZeRO: N ranks, each training on its own rows of the batch, sharing the optimizer work.

Data parallelism (every stage). The global batch of a step is N * B rows; the data loader gives rank r the
rows [r*B, r*B + B) of it (llmc/io/dataloader.h states the invariant). Each rank runs forward and backward on
its rows, so its gradient is the mean loss gradient over ITS rows (dloss = 1 / (B * T * micro-steps)).
The average of the N gradients is the mean over all N * B rows: exactly the gradient one rank would
compute on the whole batch, up to the order of the additions.

When. A chunk's gradient (the embeddings, one block, the final layernorm: see llmc/model/gpt2.cuh) is final once
the backward pass of the LAST micro-step has gone through it; the backward pass reports each chunk as that
happens (on one rank: final layernorm, blocks L-1 .. 0, embeddings; under pipeline parallelism each rank
its own stages' chunks, llmc/parallel/pipeline.h) and zero_reduce_chunk hands it over to
the communication stream at once, so on a GPU block l's reduction runs while block l-1's backward
kernels run:
    compute stream:  ... backward(l) [event] backward(l-1) [event] ...           [wait] norm, AdamW
    comm stream:                 wait -> reduce(l)     wait -> reduce(l-1) ...
No kernel of the step writes a chunk's gradient after it was handed over, and the optimizer waits for
the comm stream. Both streams are non-blocking (neither waits for the legacy stream nor for the other),
so events are the only order between them; the CPU build checks that they suffice by holding back each
stream's work until a wait or a sync forces it (LLMC_CPU_LATE_STREAMS, llmc/cpu/runtime.h;
scripts/test/test_streams.sh, and scripts/test/mutate_waits.sh deletes each wait in turn). The waits:
    comm waits for compute   chunk_ready, before a chunk's reduction (its gradient is complete) and before a
                             gather (the kernels that read the buffer's previous chunk have been issued)
    compute waits for comm   reductions_done, before the gradient norm and AdamW; gather_done[w], before a
                             block uses gathered parameters; working_free[w], before a gradient buffer
                             is reused

The stages (Rajbhandari et al., "ZeRO", 2020), for P parameters on N ranks:
  stage 0  plain data parallelism. Every rank keeps everything: parameters, gradients, fp32 master
           weights and the two AdamW moments. Gradients are all-reduced (averaged) over all ranks, and
           every rank takes the same deterministic AdamW step, so the parameters stay identical without
           being sent. Sends 2 (N-1)/N * P gradient elements per rank and step.
  stage 1  the optimizer state is sharded: each chunk is cut into N equal shards (llmc/model/gpt2.cuh pads
           chunks to make that possible) and rank r keeps master weights and moments for shard r only.
           Gradients are reduce-scattered (averaged): rank r receives just the average of shard r, updates
           the parameters of shard r, and an all-gather sends every rank the updated parameters. Sends
           (N-1)/N * P gradient elements plus (N-1)/N * P parameter elements: the same 2 (N-1)/N * P.
  stage 2  the gradients are sharded too: there is no full-size gradient buffer. A chunk's gradient is
           computed into a working buffer (one for the embeddings, two alternating for the blocks, one for
           the final layernorm), reduce-scattered into this rank's shard as soon as that chunk's backward
           pass is done, on EVERY micro-step, and added to the shard's running sum; the working buffer is
           then cleared for the next chunk that uses it. Sends (N-1)/N * P per micro-step plus the
           all-gather's (N-1)/N * P per step.
  stage 3  the parameters are sharded too (FSDP): rank r keeps only shard r of every chunk. A chunk's
           full parameters are all-gathered into a working buffer when a kernel first needs them (the
           embeddings, two alternating block buffers, the final layernorm) and stay there until the buffer
           is needed for another chunk: each block is gathered for its forward pass and again for its
           backward pass, except the last one, which is still there when the backward pass turns around.
           After the optimizer step every gathered copy is stale and is gathered again on next use.
           Sends (N-1)/N * P twice (forward, backward) plus the reduce-scatter: 3 (N-1)/N * P per step
           (gradient accumulation gathers and reduces once per micro-step). The gathers run on the comm
           stream: while block l computes, block l+1's parameters (l-1's in the backward pass) arrive in the
           other block buffer.
Hybrid sharding (HSDP): with --dp-shard K the N = M * K ranks form M groups of K; the state is sharded
within a group (stages 1-2 over K) and each shard's gradient is then averaged across the M groups with an
all-reduce between the ranks that hold the same shard.

Expert parallelism (llmc/parallel/expert_parallel.h): the experts' tensors, at the tail of each block's chunk,
differ between the ep ranks of a group, so that part of the chunk is averaged over the ranks holding the same
experts (ep.experts_replicas) and scaled by 1/ep, the rest over all data-parallel ranks. At stage 0 these are
two all-reduces of the chunk's two parts. From stage 1 the state of every chunk is sharded over the ranks
holding the same experts (the shard group is ep.experts_replicas: dp/ep x cp ranks), so each shard is
reduce-scattered there; then the dense part of the shard, which the ep ranks of a group hold alike, is
averaged over the ep group (as HSDP's replicas average theirs), and the experts' part scaled by 1/ep.
Bytes per step, with P this rank's parameters (its layout, padding included), P_e its experts' part (the tails
of its block chunks from expertfcw on), D = dp x cp gradient ranks, G = ep, R = D/G the experts' replicas:
    stage 0:    2 (D-1)/D (P - P_e) s + 2 (R-1)/R P_e s
    stages 1-3: the stage's formula above over N = R shard ranks, plus once per step the all-reduce of the dense
                part of this rank's shard over the ep group, 2 (G-1)/G d s (d: the elements of its shards of
                the chunks that lie before the chunks' expert tails)
scripts/test/test_moe_layouts.sh holds the runs' bytes against these.

The global gradient norm (for clipping) is the norm of the averaged gradient: at stage 0 every rank has
all of it; at stages 1-2 each rank squares its shard and the squares are summed over the shard group.

Optimizer offload (--offload optimizer; DeepSpeed's ZeRO-Offload). The fp32 master weights (BF16 build) and
AdamW's m and v of this rank's shard live in pinned host memory; in the FP32 build the parameters are their own
master copy and stay on the device, so only m and v move. The parameters and gradients stay on the device. The
update streams the state through the device's own AdamW kernel in pieces (each chunk's shard cut into pieces of
at most one block chunk's shard and at most kOffloadPieceElements elements), double-buffered in two device
staging slots, on a copy stream of its own:
    copy stream:     up(0) up(1) [wait updated(0)] down(0) up(2) [wait updated(1)] down(1) up(3) ...
    compute stream:  [wait uploaded(0)] AdamW(0) [wait uploaded(1)] AdamW(1) [wait uploaded(2)] AdamW(2) ...
So piece k+1 travels up while piece k updates, and piece k travels down after its update. Piece k+2 reuses
piece k's slot: its upload follows piece k's download on the copy stream, and that download waited for piece
k's update, so stream order alone keeps the slot until it is free. Two waits, both events, no host
synchronisation inside the step:
    compute waits for copy   uploaded[slot], before a piece's update (its state has arrived)
    copy waits for compute   updated[slot], before a piece's download (its update has written the slot)
The next step's first upload follows this step's last download on the same stream. Checkpoints read and write
the host copies directly, after synchronising the copy stream (outside the step).
Why the device's kernel and not a host AdamW (DeepSpeed's CPU Adam): the same kernel on the same numbers gives
the same bits as without offload, on the CPU build and on a GPU alike (adamw.cuh computes every element from its
own values and (seed, index) alone, so cutting tensors into pieces changes no bit), and there is one AdamW to
read and test instead of two that would have to agree. The price: the state crosses PCIe twice per step (up and
down, 2 x 12 bytes per parameter of the shard in BF16, 2 x 8 in FP32), after the gradients are final, so none of
it hides behind the forward and backward passes (llmc/planning/planner.h counts it whole). A host AdamW would
move only the gradients down and the parameters up (2 x 2 bytes) but compute at the host's speed, in a second
implementation of the update whose rounding would differ.
Device memory kept: the two staging slots, 2 x piece x (12 or 8) bytes (llmc/planning/memory.h counts them).

Checkpoints: a rank writes its shard of the parameters and the state to its file (zero_write_shard) and
reads what it holds back from the files of any layout (zero_read_shards); which file is whose, and the
rest of a checkpoint: llmc/parallel/reshard.h.
*/
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>
#include "../cuda_common.cuh"
#include "comm.h"
#include "mesh.h"
#include "expert_parallel.h"
#include "../model/gpt2.cuh"
#include "../device_memory.h"
#include "../io/checkpoint.h"
#include "../optimizer_config.h"

struct Zero {
    int stage = 0;
    int shards = 1;                          // the optimizer state is cut this many ways (1 at stage 0)
    int shard_rank = 0;                      // which shard this rank keeps
    const ParameterLayout* layout = nullptr;
    Communicator* data_parallel = nullptr;   // every data-parallel rank (stage 0 averages over it); null: one process
    Communicator* shard_group = nullptr;     // stages 1, 2: the ranks that split one copy of the state
    Communicator* replicate_group = nullptr; // stages 1, 2: the ranks holding the same shard (HSDP)
    Communicator* expert_replicas = nullptr; // expert parallelism: the ranks holding the same experts
    Communicator* dense_replicas = nullptr;  // ... and the ep group, which holds the dense parts alike
    int ep = 1;
    bool first_microbatch = true;            // the backward pass now running is the step's first microbatch's
    bool last_microbatch = true;             // ... its last microbatch's
    // the tensors this rank leaves out of gradient norms (other ranks count their copies), as ascending
    // [offset, end) ranges of the parameter buffer (norm_left_out)
    std::vector<std::pair<size_t, size_t>> left_out_of_norm;

    float* master = nullptr;                 // this rank's shard: fp32 master weights (BF16 build only)
    float* m = nullptr;                      // ... AdamW's first moment
    float* v = nullptr;                      // ... and second moment (all three in pinned host memory
                                             // when offloaded)

    // --offload optimizer: master, m, v above are host memory; pieces of them visit the device's staging slots
    bool offload = false;
    struct OffloadPiece { int chunk; size_t first, count; };  // elements [first, + count) of the shard buffers
    std::vector<OffloadPiece> offload_pieces;  // every held chunk's shard, in order, cut into pieces
    float* staging[2][3] = {};               // per slot: master (BF16 build only), m, v of one piece
    cudaEvent_t uploaded[2] = {};            // recorded on the copy stream when a slot's upload ends
    cudaEvent_t updated[2] = {};             // recorded on the compute stream when a slot's update ends
    cudaStream_t copy_stream = nullptr;      // non-blocking: the uploads and downloads of the state
    long long offload_downloads = 0;         // device-to-host copies of the state so far (the host never
                                             // reads them in the step: llmc/io/logger.h's HostCalls)
    floatX* grad_shard = nullptr;            // stage 1, 2: the averaged gradient of this rank's shard

    // stage 2: where chunk gradients are computed before they are reduced into grad_shard
    floatX* working[4] = {};                 // embeddings, blocks (two, alternating), final layernorm (stages 2, 3)
    cudaEvent_t working_free[4] = {};        // recorded when a working buffer has been reduced and cleared
    floatX* reduced = nullptr;               // one chunk's reduced shard, before it is added to grad_shard

    // stage 3: this rank's shard of the parameters, and the gathered chunks (same four roles as `working`)
    floatX* param_shard = nullptr;
    floatX* gathered[4] = {};
    int gathered_chunk[4] = {-1, -1, -1, -1}; // which chunk each buffer holds (or is receiving); -1: none, stale
    cudaEvent_t gather_done[4] = {};          // recorded on the comm stream when a gather into the buffer ends
    int last_block_gathered = -1;             // tells the forward pass (ascending) from the backward pass
    int gather_direction = 1;                 // +1 while blocks are asked for in ascending order, -1 descending

    cudaStream_t comm_stream = nullptr;      // non-blocking, beside the model's compute stream
    cudaEvent_t chunk_ready = nullptr;
    cudaEvent_t reductions_done = nullptr;
};

// This rank's shard of chunk c: elements [shard_start, shard_start + shard_size) of the parameter buffer,
// stored at shard_offset in the shard-sized buffers (chunks are padded to a multiple of the shard count).
inline size_t shard_size(const Zero& z, int chunk) { return z.layout->chunk_size(chunk) / z.shards; }
inline size_t shard_start(const Zero& z, int chunk) {
    return z.layout->chunk_start(chunk) + (size_t)z.shard_rank * shard_size(z, chunk);
}
inline size_t shard_offset(const Zero& z, int chunk) { return z.layout->chunk_start(chunk) / z.shards; }

// The tensors of `layout` this rank leaves out of a gradient norm: of a tensor that other ranks hold copies of,
// only one copy counts (ParameterLayout::counts_in_norm: under tensor parallelism the replicated tensors on tp
// rank 0, under pipeline parallelism the first stage's embeddings). Ascending [offset, end) ranges.
inline std::vector<std::pair<size_t, size_t>> norm_left_out(const ParameterLayout& layout) {
    std::vector<std::pair<size_t, size_t>> left_out;
    for_each_tensor_in_file_order(layout, [&](int kind, int, size_t offset, size_t elements) {
        if (!layout.counts_in_norm(kind)) left_out.push_back({offset, offset + elements});
    });
    std::sort(left_out.begin(), left_out.end());
    return left_out;
}

// The parts of [first, end) (parameter-buffer coordinates) outside the ascending ranges `left_out`, ascending.
inline std::vector<std::pair<size_t, size_t>> norm_counted_parts(const std::vector<std::pair<size_t, size_t>>& left_out,
                                                                 size_t first, size_t end) {
    std::vector<std::pair<size_t, size_t>> parts;
    size_t next = first;  // counted up to here
    for (const auto& [out_first, out_end] : left_out) {
        if (out_end <= next) continue;
        if (out_first >= end) break;
        if (out_first > next) parts.push_back({next, out_first});
        next = std::max(next, out_end);
    }
    if (next < end) parts.push_back({next, end});
    return parts;
}

// stage 0 to 3; mesh null for a single process. The model's layout must be padded for the shard count
// (gpt2_allocate with zero_shard_count()), allocated without full gradients from stage 2 on and without
// full parameters at stage 3.
// Under expert parallelism the shards are the ranks holding the same experts.
inline int zero_shard_count(int stage, const Mesh* mesh, const ExpertParallel* ep = nullptr) {
    if (stage == 0 || !mesh) return 1;
    return ep && ep->size > 1 ? ep->experts_replicas.size : mesh->shard.size;
}

// stages 2, 3: the sizes of the four working buffers (embeddings, two blocks, final layernorm)
inline std::array<size_t, 4> working_buffer_sizes(const ParameterLayout& layout) {
    const size_t block = layout.largest_block_chunk();
    return {layout.chunk_size(0), block, block, layout.chunk_size(layout.num_chunks() - 1)};
}

// stages 2, 3: which working buffer chunk c's gradient (and, at stage 3, its gathered parameters) goes to
inline int working_buffer_of(const Zero& z, int chunk) {
    const int last = z.layout->num_chunks() - 1;
    return chunk == 0 ? 0 : chunk == last ? 3 : 1 + chunk % 2;
}

// stage 3: chunk c's full parameters, gathered unless the buffer still holds them
// Starts gathering chunk c into its buffer on the comm stream, once the compute stream has reached this
// point (so every kernel that used the buffer's previous chunk has been enqueued before it).
inline void start_gather(Zero& z, GPT2& model, int chunk) {
    const int w = working_buffer_of(z, chunk);
    cudaCheck(cudaEventRecord(z.chunk_ready, model.stream));
    cudaCheck(cudaStreamWaitEvent(z.comm_stream, z.chunk_ready, 0));
    const floatX* shard = z.param_shard + shard_offset(z, chunk);
    if (z.shard_group) {
        all_gather(*z.shard_group, z.gathered[w], shard, shard_size(z, chunk), z.comm_stream);
    } else {
        cudaCheck(cudaMemcpyAsync(z.gathered[w], shard, shard_size(z, chunk) * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, z.comm_stream));
    }
    cudaCheck(cudaEventRecord(z.gather_done[w], z.comm_stream));
    z.gathered_chunk[w] = chunk;
}

// stage 3: chunk c's full parameters, ready for kernels on the compute stream. Blocks are asked for in order
// (1, 2, ... in the forward pass, L, L-1, ... in the backward pass), so after handing out block c the next
// block in the same direction is gathered into the other block buffer while block c computes. A block asked
// for twice in a row (recomputation reruns a block's forward pass just before its backward pass) keeps the
// direction it had.
inline floatX* zero_gather_chunk(Zero& z, GPT2& model, int chunk) {
    const int w = working_buffer_of(z, chunk);
    if (z.gathered_chunk[w] != chunk) start_gather(z, model, chunk);
    cudaCheck(cudaStreamWaitEvent(model.stream, z.gather_done[w], 0));
    const int L = model.config.num_layers;
    if (chunk >= 1 && chunk <= L) {
        if (chunk != z.last_block_gathered) z.gather_direction = chunk > z.last_block_gathered ? 1 : -1;
        const int next = chunk + z.gather_direction;
        if (next >= 1 && next <= L && model.layout.holds(next) && z.gathered_chunk[working_buffer_of(z, next)] != next)
            start_gather(z, model, next);
        z.last_block_gathered = chunk;
    }
    return z.gathered[w];
}

// Chunk c's part of this rank's shard on the device: its parameters (where AdamW writes them; element k of the
// shard is parameter shard_start + k) and its averaged gradient, once the step's reductions are done.
inline floatX* shard_parameters(const Zero& z, GPT2& model, int chunk) {
    return z.stage == 3 ? z.param_shard + shard_offset(z, chunk) : model.params + shard_start(z, chunk);
}
inline const floatX* shard_gradients(const Zero& z, GPT2& model, int chunk) {
    return z.stage == 0 ? model.grads + shard_start(z, chunk) : z.grad_shard + shard_offset(z, chunk);
}

// --offload optimizer: the most elements of one piece (64 MiB per fp32 array), and the elements of a piece for
// `layout`: one block chunk's shard (the blocks go up one piece each, the larger embedding chunk in several),
// at most kOffloadPieceElements. A multiple of 128, as chunks are padded to 128 x shards: every piece starts
// 16-byte aligned in the shard buffers, as the staging slots do.
constexpr size_t kOffloadPieceElements = (size_t)1 << 24;
inline size_t offload_piece_elements(const ParameterLayout& layout) {
    return std::min(kOffloadPieceElements, layout.largest_block_chunk() / layout.shards);
}

// --offload optimizer: the state in pinned host memory (m, v zero; the master weights, BF16 build, from the
// parameters the device holds), the pieces, the staging slots, their events and the copy stream.
inline void offload_init(Zero& z, GPT2& model) {
    const size_t shard_total = z.layout->total / z.shards;
    z.m = tracked_host_alloc<float>(shard_total, MemoryKind::OptimizerState, "(AdamW m, offloaded)");
    z.v = tracked_host_alloc<float>(shard_total, MemoryKind::OptimizerState, "(AdamW v, offloaded)");
    std::fill(z.m, z.m + shard_total, 0.0f);
    std::fill(z.v, z.v + shard_total, 0.0f);
    if (sizeof(floatX) != sizeof(float)) {
        z.master = tracked_host_alloc<float>(shard_total, MemoryKind::OptimizerState, "(master weights, offloaded)");
        std::fill(z.master, z.master + shard_total, 0.0f);
        std::vector<floatX> params;
        for (int c = 0; c < z.layout->num_chunks(); c++) {
            if (!z.layout->holds(c)) continue;
            params.resize(shard_size(z, c));
            copy_to_host(params.data(), shard_parameters(z, model, c), params.size(), model.stream);
            std::copy(params.begin(), params.end(), z.master + shard_offset(z, c));  // as init_master_weights
        }
    }
    const size_t piece = offload_piece_elements(*z.layout);
    for (int c = 0; c < z.layout->num_chunks(); c++)
        for (size_t at = 0; z.layout->holds(c) && at < shard_size(z, c); at += piece)
            z.offload_pieces.push_back({c, shard_offset(z, c) + at, std::min(piece, shard_size(z, c) - at)});
    for (int slot = 0; slot < 2; slot++) {
        for (int a = z.master ? 0 : 1; a < 3; a++)
            z.staging[slot][a] = tracked_alloc<float>(piece, MemoryKind::OptimizerState, "offload staging");
        cudaCheck(cudaEventCreateWithFlags(&z.uploaded[slot], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&z.updated[slot], cudaEventDisableTiming));
    }
    cudaCheck(cudaStreamCreateWithFlags(&z.copy_stream, cudaStreamNonBlocking));
}

// Sets up the optimizer for `stage` and gives the model its parameters `values` (host, in the layout's
// order): whole in model.params, or, at stage 3, this rank's shard of them. offload_optimizer: the master
// weights and moments in pinned host memory (the top of the file).
inline void zero_init(Zero& z, int stage, Mesh* mesh, GPT2& model, const std::vector<float>& values,
                      ExpertParallel* ep = nullptr, bool offload_optimizer = false) {
    z.stage = stage;
    z.offload = offload_optimizer;
    z.layout = &model.layout;
    z.left_out_of_norm = norm_left_out(model.layout);
    z.shards = zero_shard_count(stage, mesh, ep);
    const bool experts_split = ep && ep->size > 1;
    z.shard_rank = z.shards > 1 ? (experts_split ? ep->experts_replicas.rank : mesh->shard.rank) : 0;
    if (model.layout.shards != z.shards)
        fatal("the parameter layout is padded for %d shard(s), ZeRO stage %d needs %d", model.layout.shards, stage,
              z.shards);
    if (mesh) {
        z.data_parallel = &mesh->gradient;
        z.shard_group = &mesh->shard;
        z.replicate_group = &mesh->axis[DP_REPLICATE];
    }
    if (experts_split) {
        z.expert_replicas = &ep->experts_replicas;
        z.dense_replicas = &ep->dense_replicas;
        z.ep = ep->size;
        if (stage >= 1) z.shard_group = &ep->experts_replicas;
    }
    const size_t shard_total = model.layout.total / z.shards;
    if (stage < 3) {
        gpt2_set_parameters(model, values);
    } else {
        std::vector<floatX> mine(shard_total);
        for (int c = 0; c < model.layout.num_chunks(); c++)
            for (size_t i = 0; i < shard_size(z, c); i++) mine[shard_offset(z, c) + i] = (floatX)values[shard_start(z, c) + i];
        z.param_shard = tracked_alloc<floatX>(shard_total, MemoryKind::Parameters);
        copy_to_device(z.param_shard, mine.data(), shard_total, model.stream);
        const std::array<size_t, 4> sizes = working_buffer_sizes(model.layout);
        for (int w = 0; w < 4; w++) {
            z.gathered[w] = tracked_alloc<floatX>(sizes[w], MemoryKind::Parameters);
            cudaCheck(cudaEventCreateWithFlags(&z.gather_done[w], cudaEventDisableTiming));
        }
    }
    if (z.offload) {
        offload_init(z, model);
    } else {
        z.m = tracked_alloc<float>(shard_total, MemoryKind::OptimizerState);
        z.v = tracked_alloc<float>(shard_total, MemoryKind::OptimizerState);
        cudaCheck(cudaMemsetAsync(z.m, 0, shard_total * sizeof(float), model.stream));
        cudaCheck(cudaMemsetAsync(z.v, 0, shard_total * sizeof(float), model.stream));
        if (sizeof(floatX) != sizeof(float)) {
            z.master = tracked_alloc<float>(shard_total, MemoryKind::OptimizerState);
            for (int c = 0; c < model.layout.num_chunks(); c++) {
                if (!model.layout.holds(c)) continue;
                init_master_weights(z.master + shard_offset(z, c), shard_parameters(z, model, c), shard_size(z, c),
                                    model.stream);
            }
        }
    }
    if (stage >= 1) z.grad_shard = tracked_alloc<floatX>(shard_total, MemoryKind::Gradients);
    if (stage >= 2) {
        const std::array<size_t, 4> sizes = working_buffer_sizes(model.layout);
        for (int w = 0; w < 4; w++) {
            z.working[w] = tracked_alloc<floatX>(sizes[w], MemoryKind::Gradients);
            cudaCheck(cudaMemsetAsync(z.working[w], 0, sizes[w] * sizeof(floatX), model.stream));
            cudaCheck(cudaEventCreateWithFlags(&z.working_free[w], cudaEventDisableTiming));
        }
        size_t largest_shard = 0;
        for (int c = 0; c < model.layout.num_chunks(); c++) largest_shard = std::max(largest_shard, shard_size(z, c));
        z.reduced = tracked_alloc<floatX>(largest_shard, MemoryKind::Gradients);
    }
    cudaCheck(cudaStreamCreateWithFlags(&z.comm_stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&z.chunk_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&z.reductions_done, cudaEventDisableTiming));
}

inline void zero_free(Zero& z) {
    if (z.offload) {
        cudaCheck(cudaStreamSynchronize(z.copy_stream));  // the last downloads into the host memory freed below
        for (int slot = 0; slot < 2; slot++) {
            for (float* buffer : z.staging[slot]) tracked_free(buffer);
            cudaCheck(cudaEventDestroy(z.uploaded[slot]));
            cudaCheck(cudaEventDestroy(z.updated[slot]));
        }
        cudaCheck(cudaStreamDestroy(z.copy_stream));
    }
    for (void* p : {(void*)z.master, (void*)z.m, (void*)z.v, (void*)z.grad_shard, (void*)z.reduced,
                    (void*)z.param_shard, (void*)z.gathered[0], (void*)z.gathered[1], (void*)z.gathered[2],
                    (void*)z.gathered[3]})
        tracked_free(p);
    for (int w = 0; w < 4; w++) {
        if (z.gather_done[w]) cudaCheck(cudaEventDestroy(z.gather_done[w]));
        if (!z.working[w]) continue;
        tracked_free(z.working[w]);
        cudaCheck(cudaEventDestroy(z.working_free[w]));
    }
    cudaCheck(cudaStreamDestroy(z.comm_stream));
    cudaCheck(cudaEventDestroy(z.chunk_ready));
    cudaCheck(cudaEventDestroy(z.reductions_done));
    z = Zero{};
}

// ----------------------------------------------------------------------------
// gradients

// Start of a step: no gradient yet.
inline void zero_begin_step(Zero& z, GPT2& model) {
    if (model.small_batch_norm_squared)
        cudaCheck(cudaMemsetAsync(model.small_batch_norm_squared, 0, sizeof(float), model.stream));
    if (z.stage < 2) {
        gpt2_zero_grads(model);
    } else {  // the working buffers are cleared after each use
        cudaCheck(cudaMemsetAsync(z.grad_shard, 0, z.layout->total / z.shards * sizeof(floatX), model.stream));
    }
}

// ----------------------------------------------------------------------------
// the model's way in: where a chunk's parameters and gradients are (llmc/model/forward_backward.cuh calls these
// at the points where a block needs them)

// Chunk c's parameters, ready for kernels on the compute stream: in model.params, or at stage 3 gathered from
// the ranks' shards (zero_gather_chunk).
inline floatX* zero_parameters_of(Zero& z, GPT2& model, int chunk) {
    return z.stage == 3 ? zero_gather_chunk(z, model, chunk) : model.params + model.layout.chunk_start(chunk);
}

// The buffer chunk c's gradient is in before its reduction (what zero_gradients_of handed out).
inline floatX* zero_unreduced_gradient(Zero& z, GPT2& model, int chunk) {
    return z.stage >= 2 ? z.working[working_buffer_of(z, chunk)] : model.grads + model.layout.chunk_start(chunk);
}

// Where chunk c's gradient accumulates: its place in model.grads, or at stages 2 and 3 the working buffer
// for it, once the comm stream has reduced and cleared that buffer's last use. Asked just before the first
// write to the chunk's gradient.
inline floatX* zero_gradients_of(Zero& z, GPT2& model, int chunk) {
    if (z.stage >= 2) cudaCheck(cudaStreamWaitEvent(model.stream, z.working_free[working_buffer_of(z, chunk)], 0));
    return zero_unreduced_gradient(z, model, chunk);
}

// Before each microbatch's passes: whether it is the step's first, and its last.
inline void zero_begin_microbatch(Zero& z, bool first, bool last) {
    z.first_microbatch = first;
    z.last_microbatch = last;
}

// Whether a chunk's gradient, once complete, is reduced now: on the step's last microbatch, or on every one
// at stages 2 and 3 (there is no full-size gradient buffer to accumulate in).
inline bool zero_reduces_now(const Zero& z) { return z.stage >= 2 || z.last_microbatch; }

// Under expert parallelism (ep > 1): the elements at the end of chunk c that are this rank's experts (from
// expertfcw to the chunk's end, padding included; 0 for chunks without experts).
inline size_t expert_tail_of_chunk(const ParameterLayout& layout, int chunk, int ep) {
    const int L = layout.config.num_layers;
    if (ep == 1 || chunk < 1 || chunk > L || !layout.holds(chunk) || layout.elements(EXPERTFCW, chunk - 1) == 0)
        return 0;
    return layout.chunk_start(chunk) + layout.chunk_size(chunk) - layout.offset(EXPERTFCW, chunk - 1);
}

// Stages 1-3 under expert parallelism: this rank's shard of chunk c, averaged over its shard group, becomes
// the mean over all data-parallel ranks: its dense part averaged over the ep group, its experts' part / ep.
inline void average_shard_over_ep(Zero& z, int chunk, floatX* shard) {
    const size_t experts = expert_tail_of_chunk(*z.layout, chunk, z.ep);
    if (experts == 0) {
        if (z.ep > 1) all_reduce(*z.dense_replicas, shard, shard_size(z, chunk), Reduction::Average, z.comm_stream);
        return;
    }
    // the shard's elements, in chunk coordinates, and where the experts begin
    const size_t first = (size_t)z.shard_rank * shard_size(z, chunk), end = first + shard_size(z, chunk);
    const size_t experts_first = z.layout->chunk_size(chunk) - experts;
    const size_t dense_end = std::min(end, std::max(first, experts_first));
    if (dense_end > first) all_reduce(*z.dense_replicas, shard, dense_end - first, Reduction::Average, z.comm_stream);
    if (end > dense_end) moe_scale(shard + (dense_end - first), 1.0f / (float)z.ep, end - dense_end, z.comm_stream);
}

// Called when chunk c's gradient is complete and zero_reduces_now: averages it over the data-parallel
// ranks, whole (stage 0) or into this rank's shard (stages 1, 2, 3), on the comm stream once the compute
// stream got there.
inline void zero_reduce_chunk(Zero& z, GPT2& model, int chunk) {
    floatX* chunk_grads = zero_unreduced_gradient(z, model, chunk);
    const bool alone = z.data_parallel == nullptr || z.data_parallel->size == 1;
    if (z.stage == 0 && alone) return;
    cudaCheck(cudaEventRecord(z.chunk_ready, model.stream));
    cudaCheck(cudaStreamWaitEvent(z.comm_stream, z.chunk_ready, 0));
    if (z.stage >= 2) {
        const int w = working_buffer_of(z, chunk);
        floatX* shard = z.grad_shard + shard_offset(z, chunk);
        const size_t count = shard_size(z, chunk);
        if (z.shard_group) {
            reduce_scatter(*z.shard_group, z.reduced, z.working[w], count, Reduction::Average, z.comm_stream);
        } else {
            cudaCheck(cudaMemcpyAsync(z.reduced, z.working[w], count * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                      z.comm_stream));
        }
        residual_forward(shard, shard, z.reduced, count, z.comm_stream);  // the running sum over micro-steps
        if (z.last_microbatch && z.replicate_group && z.replicate_group->size > 1)
            all_reduce(*z.replicate_group, shard, count, Reduction::Average, z.comm_stream);
        if (z.last_microbatch) average_shard_over_ep(z, chunk, shard);
        cudaCheck(cudaMemsetAsync(z.working[w], 0, z.layout->chunk_size(chunk) * sizeof(floatX), z.comm_stream));
        cudaCheck(cudaEventRecord(z.working_free[w], z.comm_stream));
        return;
    }
    if (z.stage == 0) {
        const size_t size = z.layout->chunk_size(chunk);
        const size_t experts = expert_tail_of_chunk(*z.layout, chunk, z.ep);
        all_reduce(*z.data_parallel, chunk_grads, size - experts, Reduction::Average, z.comm_stream);
        if (experts > 0) {
            all_reduce(*z.expert_replicas, chunk_grads + size - experts, experts, Reduction::Average, z.comm_stream);
            moe_scale(chunk_grads + size - experts, 1.0f / (float)z.ep, experts, z.comm_stream);
        }
        return;
    }
    floatX* shard = z.grad_shard + shard_offset(z, chunk);
    const size_t count = shard_size(z, chunk);
    if (z.shard_group) {
        reduce_scatter(*z.shard_group, shard, chunk_grads, count, Reduction::Average, z.comm_stream);
        if (z.replicate_group->size > 1) all_reduce(*z.replicate_group, shard, count, Reduction::Average, z.comm_stream);
        average_shard_over_ep(z, chunk, shard);
    } else {
        cudaCheck(cudaMemcpyAsync(shard, chunk_grads, count * sizeof(floatX), cudaMemcpyDeviceToDevice, z.comm_stream));
    }
}

// Makes the compute stream wait for every reduction handed over so far.
inline void zero_wait_for_gradients(Zero& z, GPT2& model) {
    cudaCheck(cudaEventRecord(z.reductions_done, z.comm_stream));
    cudaCheck(cudaStreamWaitEvent(model.stream, z.reductions_done, 0));
}

// model.results->grad_norm_squared = this rank's part of the squared L2 norm of the averaged gradient, on
// the compute stream after zero_wait_for_gradients: the squares of the gradient it holds (all of it at stage
// 0, its shard from stage 1), summed over the shard group. Of a tensor that other ranks hold copies of, only
// one copy counts: the parameter layout says which (ParameterLayout::counts_in_norm: under tensor parallelism
// the replicated tensors on tp rank 0, under pipeline parallelism the first stage's embeddings). The sum
// over the ranks that hold different parts of the model (tp, pp) is the model's
// (llmc/parallel/parallel_context.h's gradient_norm).
inline void zero_gradient_norm(Zero& z, GPT2& model) {
    const ParameterLayout& layout = *z.layout;
    const floatX* grads = z.stage == 0 ? model.grads : z.grad_shard;
    // the parts of `grads` this rank counts, as [first, end) element ranges, adjacent ones merged
    std::vector<std::pair<size_t, size_t>> counted;
    auto count = [&](size_t first, size_t end) {
        if (first >= end) return;
        if (!counted.empty() && counted.back().second == first) counted.back().second = end;
        else counted.push_back({first, end});
    };
    for (int c = 0; c < layout.num_chunks(); c++) {
        // chunk c's part of the buffer: [held, held_end) in parameter-buffer coordinates, at `at` in `grads`
        const size_t held = z.stage == 0 ? layout.chunk_start(c) : shard_start(z, c);
        const size_t held_end = held + (z.stage == 0 ? layout.chunk_size(c) : shard_size(z, c));
        const size_t at = z.stage == 0 ? held : shard_offset(z, c);
        for (const auto& [first, end] : norm_counted_parts(z.left_out_of_norm, held, held_end))
            count(at + (first - held), at + (end - held));
    }
    float* squared = &model.results->grad_norm_squared;
    cudaCheck(cudaMemsetAsync(squared, 0, sizeof(float), model.stream));
    for (const auto& [first, end] : counted)
        global_norm_squared_accumulate(squared, model.shared.norm_scratch, grads + first, end - first, model.stream);
    if (z.stage > 0 && z.shard_group && z.shard_group->size > 1)
        all_reduce(*z.shard_group, squared, 1, Reduction::Sum, model.stream);
}

// The noise scale's small batch (llmc/noise_scale.h): when the step's first microbatch has completed chunk c's
// gradient (on every tp rank whole: its partial sums added up, which llmc/noise_scale.h's layout check ensures),
// adds the squares of the parts this rank counts to *model.small_batch_norm_squared, on the compute stream before
// the chunk's reduction (zero_reduce_chunk) or the next microbatch's passes touch the buffer. The buffer holds
// the microbatch's gradient / microbatches (the loss's scale, step_loss_scale).
inline void zero_small_batch_norm(Zero& z, GPT2& model, int chunk) {
    if (!model.small_batch_norm_squared || !z.first_microbatch) return;
    const floatX* grads = zero_unreduced_gradient(z, model, chunk);  // element chunk_start + k at grads[k]
    const size_t start = z.layout->chunk_start(chunk);
    for (const auto& [first, end] : norm_counted_parts(z.left_out_of_norm, start, start + z.layout->chunk_size(chunk)))
        global_norm_squared_accumulate(model.small_batch_norm_squared, model.shared.norm_scratch, grads + (first - start),
                                       end - first, model.stream);
}

// Where this rank keeps the gradient of chunk c once the step's reductions are done: the whole chunk
// (stage 0) or this rank's shard of it; *count elements.
inline floatX* zero_chunk_gradient(Zero& z, GPT2& model, int chunk, size_t* count) {
    *count = z.stage == 0 ? z.layout->chunk_size(chunk) : shard_size(z, chunk);
    return z.stage == 0 ? model.grads + z.layout->chunk_start(chunk) : z.grad_shard + shard_offset(z, chunk);
}

// ----------------------------------------------------------------------------
// the optimizer step

// --offload optimizer: the AdamW step of zero_optimizer_step, piece by piece through the staging slots (the
// diagram at the top of the file). chunk_tensors: each chunk's tensors, in chunk-shard coordinates; a piece
// takes the parts of them that fall in it, each with the index of its first element within its tensor.
inline void offloaded_update(Zero& z, GPT2& model, const std::vector<std::vector<AdamWTensor>>& chunk_tensors,
                             const AdamWConfig& adamw, float learning_rate, int step, float grad_scale) {
    const std::vector<Zero::OffloadPiece>& pieces = z.offload_pieces;
    float* host[3] = {z.master, z.m, z.v};
    auto move = [&](int k, bool up) {  // piece k's state between the host and its slot, on the copy stream
        for (int a = 0; a < 3; a++) {
            if (!host[a]) continue;
            float* on_host = host[a] + pieces[k].first;
            const size_t bytes = pieces[k].count * sizeof(float);
            if (up) {
                cudaCheck(cudaMemcpyAsync(z.staging[k % 2][a], on_host, bytes, cudaMemcpyHostToDevice, z.copy_stream));
            } else {
                cudaCheck(cudaMemcpyAsync(on_host, z.staging[k % 2][a], bytes, cudaMemcpyDeviceToHost, z.copy_stream));
                z.offload_downloads++;
            }
        }
        if (up) cudaCheck(cudaEventRecord(z.uploaded[k % 2], z.copy_stream));
    };
    const int count = (int)pieces.size();
    for (int k = 0; k < std::min(2, count); k++) move(k, true);
    std::vector<AdamWTensor> tensors;
    for (int k = 0; k < count; k++) {
        const int slot = k % 2, c = pieces[k].chunk;
        const size_t first = pieces[k].first - shard_offset(z, c), end = first + pieces[k].count;  // in c's shard
        tensors.clear();
        for (const AdamWTensor& t : chunk_tensors[c]) {
            const size_t from = std::max(t.offset, first), to = std::min(t.offset + t.count, end);
            if (from < to) tensors.push_back({from - first, to - from, t.first_index + (from - t.offset), t.seed,
                                              t.weight_decay});
        }
        cudaCheck(cudaStreamWaitEvent(model.stream, z.uploaded[slot], 0));
        adamw_update_tensors(shard_parameters(z, model, c) + first, z.staging[slot][0], z.staging[slot][1],
                             z.staging[slot][2], shard_gradients(z, model, c) + first, tensors.data(),
                             (int)tensors.size(), learning_rate, adamw.beta1, adamw.beta2, adamw.eps, step, grad_scale,
                             model.stream);
        cudaCheck(cudaEventRecord(z.updated[slot], model.stream));
        cudaCheck(cudaStreamWaitEvent(z.copy_stream, z.updated[slot], 0));
        move(k, false);
        if (k + 2 < count) move(k + 2, true);  // into the slot piece k just left, after its download
    }
}

// One AdamW step on this rank's shard of every tensor (weight decay on matrices only), then, at stages 1-2,
// an all-gather of every chunk so that all ranks hold all the new parameters. step: 1-based; grad_scale
// multiplies the gradients (clipping); seed: fresh per step, for the stochastic rounding to bf16.
// One launch per chunk: the pieces of its tensors in this rank's shard, each with the seed of its tensor's
// place in the model file's order (whichever chunks this rank holds) and the index of its first element within the tensor.
inline void zero_optimizer_step(Zero& z, GPT2& model, const AdamWConfig& adamw, float learning_rate, int step,
                                float grad_scale, uint32_t seed) {
    std::vector<std::vector<AdamWTensor>> chunk_tensors(model.layout.num_chunks());
    for_each_tensor_in_file_order(model.layout, [&](int kind, int layer, size_t offset, size_t count) {
        const uint32_t tensor_seed = seed + 0x9e3779b9u * (uint32_t)tensor_file_index(model.config, kind, layer);
        const int chunk = model.layout.chunk_of(kind, layer);
        const size_t first = std::max(offset, shard_start(z, chunk));
        const size_t end = std::min(offset + count, shard_start(z, chunk) + shard_size(z, chunk));
        if (first >= end) return;  // no part of this tensor is in this rank's shard
        const float decay = tensor_kind_info(kind).is_matrix ? adamw.weight_decay : 0.0f;
        const size_t in_chunk_shard = first - shard_start(z, chunk);
        // the rounding hashes the element's index: a tp rank's slices are numbered after the lower ranks'
        // (so no two ranks round alike), replicated tensors alike on every rank (so their copies stay equal)
        // (an ep rank's experts after the lower ranks')
        const size_t slice_first = tensor_is_expert(kind)       ? (size_t)model.layout.ep_rank * count
                                   : tensor_is_replicated(kind) ? 0
                                                                : (size_t)model.layout.tp_rank * count;
        chunk_tensors[chunk].push_back({in_chunk_shard, end - first, slice_first + first - offset, tensor_seed, decay});
    });
    if (z.offload) {
        offloaded_update(z, model, chunk_tensors, adamw, learning_rate, step, grad_scale);
    } else {
        for (int c = 0; c < model.layout.num_chunks(); c++) {
            if (!model.layout.holds(c)) continue;
            const size_t in_shard = shard_offset(z, c);  // the shard's element k is element in_shard + k of the state
            adamw_update_tensors(shard_parameters(z, model, c), z.master ? z.master + in_shard : nullptr,
                                 z.m + in_shard, z.v + in_shard, shard_gradients(z, model, c), chunk_tensors[c].data(),
                                 (int)chunk_tensors[c].size(), learning_rate, adamw.beta1, adamw.beta2, adamw.eps, step,
                                 grad_scale, model.stream);
        }
    }
    if (z.stage == 3) {
        for (int& chunk : z.gathered_chunk) chunk = -1;  // every gathered copy is stale now
        z.last_block_gathered = -1;
    } else if (z.stage >= 1 && z.shard_group && z.shards > 1) {
        for (int c = 0; c < model.layout.num_chunks(); c++)
            if (model.layout.holds(c))
                all_gather(*z.shard_group, model.params + model.layout.chunk_start(c), model.params + shard_start(z, c),
                           shard_size(z, c), model.stream);
    }
}

// All parameters as host values, on every rank (a collective at stage 3: every rank must call it).
inline std::vector<float> zero_parameters(Zero& z, GPT2& model) {
    if (z.stage < 3) return gpt2_get_parameters(model);
    std::vector<float> values(model.layout.total);
    std::vector<floatX> chunk_values;
    for (int c = 0; c < model.layout.num_chunks(); c++) {
        if (!model.layout.holds(c)) continue;
        const floatX* gathered = zero_gather_chunk(z, model, c);
        chunk_values.resize(model.layout.chunk_size(c));
        copy_to_host(chunk_values.data(), gathered, chunk_values.size(), model.stream);
        std::copy(chunk_values.begin(), chunk_values.end(), values.begin() + model.layout.chunk_start(c));
    }
    return values;
}

// ----------------------------------------------------------------------------
// checkpoints (llmc/parallel/reshard.h): this rank's shard into a file, and back from the files of any layout

// whether this rank writes a file (the first replica group does; the others hold the same shards)
inline bool zero_writes_shard(const Zero& z) {
    return z.replicate_group == nullptr || z.replicate_group->rank == 0;
}

// The sections of this rank's shard in its checkpoint file, in file order: the parameters (floatX, gathered from
// the chunks it holds; the others' places are zeros), then in fp32 the master weights (where kept) and AdamW's two
// moments. A synchronous save streams them to the file one by one (zero_write_shard); an asynchronous one copies
// them all to host memory first (llmc/parallel/reshard.h's AsyncCheckpoint).
enum class ShardSection { Params, Master, AdamM, AdamV };
constexpr ShardSection kShardSections[] = {ShardSection::Params, ShardSection::Master, ShardSection::AdamM,
                                           ShardSection::AdamV};
inline const char* shard_section_name(ShardSection section) {
    switch (section) {
        case ShardSection::Params: return "params";
        case ShardSection::Master: return "master";
        case ShardSection::AdamM: return "adamw_m";
        case ShardSection::AdamV: return "adamw_v";
    }
    return "";
}
inline bool zero_has_shard_section(const Zero& z, ShardSection section) {
    return section == ShardSection::Params || (section == ShardSection::Master ? z.master != nullptr
                                               : section == ShardSection::AdamM ? z.m != nullptr : z.v != nullptr);
}
inline size_t zero_shard_section_bytes(const Zero& z, const GPT2& model, ShardSection section) {
    return model.layout.total / z.shards * (section == ShardSection::Params ? sizeof(floatX) : sizeof(float));
}

// Copies a section of this rank's shard into host memory `to` (zero_shard_section_bytes, zeroed where no held
// chunk lands): issued on model.stream, in host memory once that stream is synchronised (the offloaded state is
// host memory already, and is copied at once).
inline void zero_copy_shard_section(Zero& z, GPT2& model, ShardSection section, void* to) {
    if (section == ShardSection::Params) {
        floatX* params = static_cast<floatX*>(to);
        for (int c = 0; c < model.layout.num_chunks(); c++) {
            if (!model.layout.holds(c)) continue;
            const floatX* from = z.stage == 3 ? z.param_shard + shard_offset(z, c) : model.params + shard_start(z, c);
            cudaCheck(cudaMemcpyAsync(params + shard_offset(z, c), from, shard_size(z, c) * sizeof(floatX),
                                      cudaMemcpyDeviceToHost, model.stream));
        }
        return;
    }
    const float* state = section == ShardSection::Master ? z.master : section == ShardSection::AdamM ? z.m : z.v;
    const size_t bytes = zero_shard_section_bytes(z, model, section);
    if (!z.offload) {
        cudaCheck(cudaMemcpyAsync(to, state, bytes, cudaMemcpyDeviceToHost, model.stream));
        return;
    }
    cudaCheck(cudaStreamSynchronize(z.copy_stream));  // the last step's downloads have landed
    memcpy(to, state, bytes);
}

// Adds this rank's shard of the parameters and the optimizer state to `writer`, section by section through one
// host buffer.
inline void zero_write_shard(Zero& z, GPT2& model, CheckpointWriter& writer) {
    for (ShardSection section : kShardSections) {
        if (!zero_has_shard_section(z, section)) continue;
        std::vector<char> host(zero_shard_section_bytes(z, model, section));
        zero_copy_shard_section(z, model, section, host.data());
        cudaCheck(cudaStreamSynchronize(model.stream));
        writer.add(shard_section_name(section), host.data(), host.size());
    }
}

// One file of a checkpoint as zero_read_shards reads it: shard `shard` of `part`, the part of the model the rank
// that saved it held (its pipeline stages' chunks, its tp slice, its ep group's experts, padded for its
// shard count; llmc/parallel/reshard.h's saved_shards).
struct SavedShard {
    ParameterLayout part;
    int shard = 0;
};

// Reads the checkpoint whose main file is main_path (of step `step`, listing `shard_files`; file f holding
// saved_files[f]) into this rank's parameters and optimizer state: from every file, the elements that fall in
// what this rank holds now, whatever layout saved them.
inline void zero_read_shards(Zero& z, GPT2& model, const std::string& main_path,
                             const std::vector<ShardFileEntry>& shard_files, long long step,
                             const std::vector<SavedShard>& saved_files) {
    const ParameterLayout& now = model.layout;
    // host copies of what this rank holds: all parameters (stages 0-2) or its shard (stage 3), and its state
    const size_t my_count = now.total / z.shards;
    std::vector<floatX> params(z.stage == 3 ? my_count : now.total, (floatX)0.0f);
    std::vector<float> master(z.master ? my_count : 0, 0.0f), m(my_count, 0.0f), v(my_count, 0.0f);

    for (int file = 0; file < (int)saved_files.size(); file++) {
        const ParameterLayout& saved = saved_files[file].part;
        const int saved_shards = saved.shards, k = saved_files[file].shard;
        const size_t saved_count = saved.total / saved_shards;
        const std::string path = shard_path(main_path, file);
        CheckpointReader reader(path);
        if (file > 0) check_shard_file(reader, path, main_path, shard_files[file - 1], step);
        std::vector<floatX> saved_params(saved_count);
        std::vector<float> saved_master(z.master ? saved_count : 0), saved_m(saved_count), saved_v(saved_count);
        reader.read("params", saved_params.data(), saved_count * sizeof(floatX));
        if (z.master) reader.read("master", saved_master.data(), saved_count * sizeof(float));
        reader.read("adamw_m", saved_m.data(), saved_count * sizeof(float));
        reader.read("adamw_v", saved_v.data(), saved_count * sizeof(float));
        // the parameters both layouts hold, as runs in parameter-buffer coordinates of each
        for_each_common_run(saved, now, [&](size_t from, size_t to, size_t count) {
            const int c = saved.chunk_of_offset(from);  // a run lies in one tensor, so in one chunk
            // clipped to saved shard k, which the file holds at its chunk c's offset
            const size_t saved_size = saved.chunk_size(c) / saved_shards;
            const size_t saved_first = saved.chunk_start(c) + k * saved_size;
            const size_t first = std::max(from, saved_first), end = std::min(from + count, saved_first + saved_size);
            if (first >= end) return;
            const size_t in_file = saved.chunk_start(c) / saved_shards - saved_first;  // + element -> file index
            const size_t target = to - from;                                           // + element -> `now`'s
            // parameters: the whole buffer (stages 0-2) or this rank's shard (stage 3)
            const size_t mine = shard_start(z, c), mine_end = mine + shard_size(z, c), my_at = shard_offset(z, c);
            for (size_t e = first; e < end; e++) {
                const size_t here = e + target;
                if (z.stage < 3) params[here] = saved_params[e + in_file];
                if (here < mine || here >= mine_end) continue;
                const size_t i = my_at + (here - mine);
                if (z.stage == 3) params[i] = saved_params[e + in_file];
                if (z.master) master[i] = saved_master[e + in_file];
                m[i] = saved_m[e + in_file];
                v[i] = saved_v[e + in_file];
            }
        });
    }
    // on the compute stream, after the work already issued there (set-up's master weights, for one)
    copy_to_device(z.stage == 3 ? z.param_shard : model.params, params.data(), params.size(), model.stream);
    if (z.offload) {  // host memory: written once no download is still on its way into it
        cudaCheck(cudaStreamSynchronize(z.copy_stream));
        if (z.master) std::copy(master.begin(), master.end(), z.master);
        std::copy(m.begin(), m.end(), z.m);
        std::copy(v.begin(), v.end(), z.v);
    } else {
        if (z.master) copy_to_device(z.master, master.data(), my_count, model.stream);
        copy_to_device(z.m, m.data(), my_count, model.stream);
        copy_to_device(z.v, v.data(), my_count, model.stream);
    }
    for (int& chunk : z.gathered_chunk) chunk = -1;
}
