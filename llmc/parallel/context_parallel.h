/*
Context parallelism: the cp ranks of a group split every sequence between them, so each holds T/cp of its
positions, and only attention, the one op that mixes positions, talks.

Everything else in a block works row by row (layernorms, matmuls, GELU, the residual stream, the loss), so
it runs unchanged on the rows a rank holds. The embeddings need the right position rows of wpe, and
attention needs every earlier position's keys and values. The parameters are the same on every cp rank;
each computes its rows' share of their gradient, and the data-parallel reduction sums the shares
(llmc/parallel/mesh.h's gradient group is dp x cp).

The split (--cp-split). Under a causal mask position t attends to t + 1 keys, so the last positions are
the most work. Cutting the sequence into cp contiguous pieces gives the last rank the most attention
work and the first the least (its queries see only its own keys): the contiguous split. The zigzag split
cuts it into 2 cp chunks of Tc = T/(2cp) and gives rank i chunks i and 2cp-1-i, an early one and a late
one, so every rank does the same work. cp = 2, T = 8:

    position   0 1 | 2 3 | 4 5 | 6 7          zigzag: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    chunk        0 |   1 |   2 |   3
    rank         0 |   1 |   1 |   0

A rank's rows are kept chunk-major: first its first chunk for all B sequences, then its second, so each
chunk is an ordinary (B, Tc) batch whose row t sits at position chunk_position + t. The embeddings look
up wpe chunk by chunk (cp_sequence_chunks), and the attention kernels take blocks of rows at any position
(llmc/kernels/attention.cuh's pairs). Sequence parallelism (--tp with --sequence-parallel) then cuts the rank's
B T/cp rows, chunk-major as they are, into tp contiguous slices: the blocks work row by row and gather the
slices back before attention, so only the embedding minds where a slice's rows sit in the chunks
(llmc/parallel/tensor_parallel.h's vocab_parallel_embedding_forward). T/cp must divide by tp.

Ring attention (--cp-mode ring; Liu et al. 2023). The keys and values of one rank's rows are a block; the
blocks travel around the ring of cp ranks, each rank passing the block it holds to rank + 1 while it
computes attention of its queries against it:

    step 0      step 1      step 2      step 3              (cp = 4: which rank's keys each rank holds)
    r0: K0      r0: K3      r0: K2      r0: K1
    r1: K1      r1: K0      r1: K3      r1: K2
    r2: K2      r2: K1      r2: K0      r2: K3
    r3: K3      r3: K2      r3: K1      r3: K0

Each (query chunk, key chunk) pair gives a partial output and log-sum-exp over its keys, merged into the
running result (attention_merge: the exact softmax over the union). Under zigzag a pair is the diagonal,
wholly visible or wholly masked (skipped). The next block travels on a stream of its own while the
compute stream works on the one in hand. Only the k and v columns travel, packed as (B, Tc, 2 Ckv'): the
K/V heads alone, so with grouped-query attention (fewer K/V heads than query heads, llmc/kernels/attention.cuh)
the blocks, and the ring's bytes, shrink with them.
The backward pass uses the merged lse and D = rowsum(dO * O) of the merged output, so every pair's
gradient is exact on its own (attention_backward_pair): dQ accumulates where the queries are, and dK, dV
of a block accumulate in a buffer that travels with the block, visits every rank, and comes home after
cp passes.

Ulysses (--cp-mode ulysses; Jacobs et al. 2023). An all-to-all turns the qkv rows from "my T/cp positions,
all heads" into "all T positions, my heads / cp": attention then runs on whole sequences with no mask
offsets at all, and another all-to-all turns its output back. cp rank d gets part d of the query heads
and part d of the K/V heads, so both (per tp rank) must divide by cp; then a query head and the K/V head
of its group land on the same rank (query heads d NH'/cp .. read K/V heads from d KVH'/cp on, as
NH'/cp = G KVH'/cp), and each rank runs grouped attention with NH'/cp and KVH'/cp heads. The backward
pass sends dO to the heads' owners (and O again, for D), and dqkv back.

Bytes sent per rank and micro-step on the cp axis (s = sizeof(floatX), N = B T/cp rows per rank, Cq' and
Ckv' the columns of this tp rank's query heads and of its key (or value) heads, W' = Cq' + 2 Ckv' a qkv row,
l the layers a rank runs, F the forward passes per layer: 2 under --recompute full, which runs every block
forward again before its backward pass, else 1):
  ring      a block of K/V is N 2 Ckv' values; forward: cp-1 passes of it; backward: cp-1 passes of the
            block and cp of its gradient                            ((cp-1) F + 2cp - 1) l 2 N Ckv' s
  ulysses   an all-to-all of n values sends (cp-1)/cp n; forward: qkv (N W') and the output (N Cq');
            backward: dO and O (N Cq' each) and dqkv (N W')     ((F + 1) W' + (F + 2) Cq') l (cp-1)/cp N s
Without grouping (Ckv' = Cq' = C', W' = 3 C') these are ((cp-1) F + 2cp - 1) l 2 N C' s and
(4 F + 5) l (cp-1)/cp N C' s. cp_bytes_per_step is this formula; the layout test compares it with the bytes
counted.
*/
#pragma once

#include <algorithm>
#include <string>
#include <vector>
#include "../cuda_common.cuh"
#include "comm.h"
#include "../device_memory.h"
#include "../kernels/attention.cuh"
#include "../kernels/encoder.cuh"
#include "../io/logger.h"
#include "layout.h"

// ----------------------------------------------------------------------------
// the split and the mode (their names: llmc/parallel/layout.h), and what they need of the model

// The one line that says why a sequence of seq_len positions cannot be split over cp ranks ("" when it
// can): zigzag cuts it into 2 cp chunks, contiguous into cp; Ulysses hands each cp rank heads / tp / cp of
// each tp rank's heads.
inline std::string cp_layout_error(int cp, ContextParallelMode mode, SequenceSplit split, int seq_len, int num_heads,
                                   int tp) {
    const int chunks = split == SequenceSplit::Zigzag ? 2 * cp : cp;
    char text[256];
    text[0] = '\0';
    if (cp > 1 && seq_len % chunks != 0) {
        snprintf(text, sizeof(text), "sequence length %d cannot be split %s over cp %d: it must be a multiple of "
                 "%s%d", seq_len, split == SequenceSplit::Zigzag ? "zigzag" : "contiguously", cp,
                 split == SequenceSplit::Zigzag ? "2*cp = " : "cp = ", chunks);
    } else if (cp > 1 && mode == ContextParallelMode::Ulysses && (num_heads / tp) % cp != 0) {
        snprintf(text, sizeof(text), "%d attention heads per tp rank cannot be split over Ulysses cp %d: heads / "
                 "tp must be a multiple of cp", num_heads / tp, cp);
    }
    return text;
}
// Stops with that line if the sequence cannot be split.
inline void cp_check_layout(int cp, ContextParallelMode mode, SequenceSplit split, int seq_len, int num_heads, int tp) {
    const std::string error = cp_layout_error(cp, mode, split, seq_len, num_heads, tp);
    if (!error.empty()) fatal("%s", error.c_str());
}

// ----------------------------------------------------------------------------
// which positions a rank holds

// Rows of a batch that hold consecutive positions of B sequences: row first_row + b T + t is position
// `position + t` of sequence b. The embeddings' launchers (llmc/kernels/encoder.cuh) see one chunk as an
// ordinary (B, T) batch whose wpe starts at row `position`. A batch of whole sequences is the one chunk
// {0, 0, T}; a context-parallel rank holds its positions as one or two chunks (cp_sequence_chunks below).
struct SequenceChunk {
    int first_row;
    int position;
    int T;
};

struct ContextParallel {
    int size = 1;                                  // cp: ranks that split every sequence
    int rank = 0;                                  // this rank's place on the cp axis
    ContextParallelMode mode = ContextParallelMode::Ring;
    SequenceSplit split = SequenceSplit::Zigzag;
    Communicator* group = nullptr;                 // the cp axis of the mesh; null with one rank
    // ring: the blocks travel on `stream`, beside the attention on the compute stream
    cudaStream_t stream = nullptr;
    cudaEvent_t block_ready = nullptr, block_arrived = nullptr;
    floatX* key_values[2] = {};    // (N, 2 Ckv') the K/V block in hand and the one arriving
    floatX* dkey_values[2] = {};   // (N, 2 Ckv') their gradients, travelling with them in the backward pass
    floatX* partial_out = nullptr; // (B Tc, Cq') one pair's output, before it is merged
    float* partial_lse = nullptr;  // (B, NH', Tc)
    // ulysses: the all-to-all's messages, and the head-sharded output and its gradient
    floatX* message_out = nullptr; // (N, W') (W' = Cq' + 2 Ckv', a qkv row)
    floatX* message_in = nullptr;  // (N, W')
    floatX* heads_out = nullptr;   // (B T, Cq'/cp)
    floatX* heads_dout = nullptr;  // (B T, Cq'/cp)
    // measuring (cp_begin_measuring): events around this rank's attention kernels, in (start, end) pairs;
    // the ring's waits fall outside them. Mutable: the passes get the group as const and only add marks.
    bool measuring = false;
    mutable std::vector<cudaEvent_t> marks;
};

inline int cp_chunks_per_rank(SequenceSplit split) { return split == SequenceSplit::Zigzag ? 2 : 1; }

// The chunk of the sequence that a rank's k-th chunk is (in units of chunks of the split).
__host__ __device__ inline int cp_chunk_index(SequenceSplit split, int cp, int rank, int k) {
    return split == SequenceSplit::Zigzag ? (k == 0 ? rank : 2 * cp - 1 - rank) : rank;
}

// A rank's chunks of B sequences are SequenceChunks (llmc/kernels/encoder.cuh): rows from first_row (of the rank's
// B * T_local) on, row first_row + b T + t at position `position + t` of sequence b.
// The chunks of cp rank `rank` (one chunk of all T_local positions without context parallelism).
inline std::vector<SequenceChunk> cp_chunks_of_rank(const ContextParallel& cp, int rank, int B, int T_local) {
    if (cp.size == 1) return {SequenceChunk{0, 0, T_local}};
    const int chunks = cp_chunks_per_rank(cp.split), Tc = T_local / chunks;
    std::vector<SequenceChunk> result;
    for (int k = 0; k < chunks; k++)
        result.push_back(SequenceChunk{k * B * Tc, cp_chunk_index(cp.split, cp.size, rank, k) * Tc, Tc});
    return result;
}
// this rank's
inline std::vector<SequenceChunk> cp_sequence_chunks(const ContextParallel& cp, int B, int T_local) {
    return cp_chunks_of_rank(cp, cp.rank, B, T_local);
}

// This rank's rows (B * T / cp, chunk-major) of a batch of B sequences of T token ids.
inline std::vector<int> cp_local_tokens(const ContextParallel& cp, const int* tokens, int B, int T) {
    const int T_local = T / cp.size;
    std::vector<int> local((size_t)B * T_local);
    for (const SequenceChunk& chunk : cp_sequence_chunks(cp, B, T_local))
        for (int b = 0; b < B; b++)
            std::copy(tokens + (size_t)b * T + chunk.position, tokens + (size_t)b * T + chunk.position + chunk.T,
                      local.begin() + chunk.first_row + (size_t)b * chunk.T);
    return local;
}

// The cp rank that holds `position` of one sequence of length T, and the row there.
inline int cp_owner_of_position(const ContextParallel& cp, int position, int T, int* row) {
    for (int rank = 0; rank < cp.size; rank++)
        for (const SequenceChunk& chunk : cp_chunks_of_rank(cp, rank, 1, T / cp.size))
            if (position >= chunk.position && position < chunk.position + chunk.T) {
                *row = chunk.first_row + position - chunk.position;
                return rank;
            }
    fatal("position %d is outside a sequence of %d", position, T);
}

// ----------------------------------------------------------------------------
// the group's buffers and stream (B sequences of T_local rows; `heads` the head geometry of a tp rank)

// Ulysses hands each cp rank part of the query heads and the same part of the K/V heads: one line saying
// why it cannot ("" when it can).
inline std::string ulysses_heads_error(int cp, const AttentionHeads& heads) {
    char text[256];
    text[0] = '\0';
    if (heads.q_heads % cp != 0 || heads.kv_heads % cp != 0)
        snprintf(text, sizeof(text), "Ulysses cp %d must divide the %d query heads and the %d key/value heads of "
                 "each tp rank", cp, heads.q_heads, heads.kv_heads);
    return text;
}
inline void ulysses_check_heads(int cp, const AttentionHeads& heads) {
    const std::string error = ulysses_heads_error(cp, heads);
    if (!error.empty()) fatal("%s", error.c_str());
}

inline void cp_create(ContextParallel& cp, int B, int T_local, AttentionHeads heads) {
    if (cp.size == 1) return;
    check_attention_heads(heads);
    const size_t N = (size_t)B * T_local;
    if (cp.mode == ContextParallelMode::Ring) {
        cudaCheck(cudaStreamCreateWithFlags(&cp.stream, cudaStreamNonBlocking));
        cudaCheck(cudaEventCreateWithFlags(&cp.block_ready, cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&cp.block_arrived, cudaEventDisableTiming));
        const size_t block = N * 2 * heads.kv_columns();  // packed K/V rows: the K/V heads only
        for (int i = 0; i < 2; i++) {
            cp.key_values[i] = tracked_alloc<floatX>(block, MemoryKind::Workspace, "ring K/V blocks");
            cp.dkey_values[i] = tracked_alloc<floatX>(block, MemoryKind::Workspace, "ring dK/dV blocks");
        }
        const size_t chunk_rows = N / cp_chunks_per_rank(cp.split);
        cp.partial_out = tracked_alloc<floatX>(chunk_rows * heads.q_columns(), MemoryKind::Workspace,
                                               "ring partial output");
        cp.partial_lse = tracked_alloc<float>(chunk_rows * heads.q_heads, MemoryKind::Workspace, "ring partial lse");
    } else {
        ulysses_check_heads(cp.size, heads);
        cp.message_out = tracked_alloc<floatX>(N * heads.qkv_columns(), MemoryKind::Workspace, "ulysses messages");
        cp.message_in = tracked_alloc<floatX>(N * heads.qkv_columns(), MemoryKind::Workspace, "ulysses messages");
        cp.heads_out = tracked_alloc<floatX>(N * heads.q_columns(), MemoryKind::Workspace,
                                             "ulysses head-sharded output");
        cp.heads_dout = tracked_alloc<floatX>(N * heads.q_columns(), MemoryKind::Workspace,
                                              "ulysses head-sharded output gradient");
    }
}

inline float cp_attention_milliseconds(ContextParallel& cp);

inline void cp_destroy(ContextParallel& cp) {
    cp_attention_milliseconds(cp);  // destroys the marks of an unfinished measurement
    if (cp.stream) {
        cudaCheck(cudaStreamDestroy(cp.stream));
        cudaCheck(cudaEventDestroy(cp.block_ready));
        cudaCheck(cudaEventDestroy(cp.block_arrived));
    }
    cp.stream = nullptr;
    for (floatX** buffer : {&cp.key_values[0], &cp.key_values[1], &cp.dkey_values[0], &cp.dkey_values[1],
                            &cp.partial_out, &cp.message_out, &cp.message_in, &cp.heads_out, &cp.heads_dout}) {
        tracked_free(*buffer);
        *buffer = nullptr;
    }
    tracked_free(cp.partial_lse);
    cp.partial_lse = nullptr;
}

// ----------------------------------------------------------------------------
// measuring the attention kernels' time (the load balance of the split)

inline void cp_mark(const ContextParallel& cp, cudaStream_t stream) {
    if (!cp.measuring) return;
    cudaEvent_t mark;
    cudaCheck(cudaEventCreate(&mark));
    cudaCheck(cudaEventRecord(mark, stream));
    cp.marks.push_back(mark);
}
inline void cp_begin_measuring(ContextParallel& cp) { cp.measuring = true; }
// milliseconds between the marks of each (start, end) pair, added up; stops measuring
inline float cp_attention_milliseconds(ContextParallel& cp) {
    float total = 0.0f;
    for (size_t i = 0; i + 1 < cp.marks.size(); i += 2) {
        cudaCheck(cudaEventSynchronize(cp.marks[i + 1]));
        float milliseconds = 0.0f;
        cudaCheck(cudaEventElapsedTime(&milliseconds, cp.marks[i], cp.marks[i + 1]));
        total += milliseconds;
    }
    for (cudaEvent_t mark : cp.marks) cudaCheck(cudaEventDestroy(mark));
    cp.marks.clear();
    cp.measuring = false;
    return total;
}

// After the measured step: each cp rank's time in its attention kernels (the ring's waits left out), gathered
// over the cp axis (a collective) and printed by rank 0 with max/min, the split's load balance, and logged.
inline void cp_report_attention_balance(ContextParallel& cp, Logger& logger, bool main_rank, cudaStream_t stream) {
    const std::vector<float> times = gather_values(*cp.group, cp_attention_milliseconds(cp), stream);
    if (!main_rank) return;
    const float slowest = *std::max_element(times.begin(), times.end());
    const float fastest = *std::min_element(times.begin(), times.end());
    std::string list;
    for (int r = 0; r < cp.size; r++) list += (r ? ", " : "") + std::to_string(times[r]);
    printf("attention time per cp rank (%s split, %s), last step: %s ms; max/min %.3f\n", cp_split_name(cp.split),
           cp_mode_name(cp.mode), list.c_str(), fastest > 0 ? slowest / fastest : 0.0f);
    logger.write(JsonLine("attention_balance").text("split", cp_split_name(cp.split)).text("mode", cp_mode_name(cp.mode))
                     .raw("milliseconds", "[" + list + "]").number("max_over_min", fastest > 0 ? slowest / fastest : 0));
}

// ----------------------------------------------------------------------------
// ring attention

// Starts passing `count` values of `block` to rank + 1 and receiving rank - 1's into `arriving`, on the
// ring's stream, once the compute stream has made `block`; cp_ring_arrived makes the compute stream wait.
inline void cp_ring_pass(const ContextParallel& cp, const floatX* block, floatX* arriving, size_t count,
                         cudaStream_t stream) {
    cudaCheck(cudaEventRecord(cp.block_ready, stream));
    cudaCheck(cudaStreamWaitEvent(cp.stream, cp.block_ready, 0));
    send_recv(*cp.group, block, (cp.rank + 1) % cp.size, arriving, (cp.rank + cp.size - 1) % cp.size, count,
              cp.stream);
    cudaCheck(cudaEventRecord(cp.block_arrived, cp.stream));
}
inline void cp_ring_arrived(const ContextParallel& cp, cudaStream_t stream) {
    cudaCheck(cudaStreamWaitEvent(stream, cp.block_arrived, 0));
}

// The k and v columns of qkv (N, Cq' + 2 Ckv') packed into kv (N, 2 Ckv'), or (unpack) dk, dv from dkv into
// dqkv's.
inline void cp_pack_key_values(floatX* kv, const floatX* qkv, size_t N, const AttentionHeads& heads,
                               cudaStream_t stream) {
    const size_t packed = 2 * heads.kv_columns() * sizeof(floatX), row = heads.qkv_columns() * sizeof(floatX);
    cudaCheck(cudaMemcpy2DAsync(kv, packed, qkv + heads.q_columns(), row, packed, N, cudaMemcpyDeviceToDevice, stream));
}
inline void cp_unpack_key_values(floatX* dqkv, const floatX* dkv, size_t N, const AttentionHeads& heads,
                                 cudaStream_t stream) {
    const size_t packed = 2 * heads.kv_columns() * sizeof(floatX), row = heads.qkv_columns() * sizeof(floatX);
    cudaCheck(cudaMemcpy2DAsync(dqkv + heads.q_columns(), row, dkv, packed, packed, N, cudaMemcpyDeviceToDevice,
                                stream));
}

// Calls fn(query chunk, key chunk) for every pair of this rank's query chunks and the chunks of rank
// `source`'s block in which some query sees some key.
template <class Function>
void cp_for_each_visible_pair(const ContextParallel& cp, int source, int B, int T_local, const floatX* qkv,
                              const floatX* kv, const AttentionHeads& heads, Function&& fn) {
    const std::vector<SequenceChunk> queries = cp_sequence_chunks(cp, B, T_local);
    const std::vector<SequenceChunk> keys = cp_chunks_of_rank(cp, source, B, T_local);
    const size_t qkv_row = heads.qkv_columns(), kv_row = 2 * heads.kv_columns();
    for (int q = 0; q < (int)queries.size(); q++)
        for (int k = 0; k < (int)keys.size(); k++) {
            if (keys[k].position > queries[q].position + queries[q].T - 1) continue;  // wholly masked
            fn(q, queries[q], AttentionBlock{qkv + queries[q].first_row * qkv_row, queries[q].T, queries[q].position},
               k, packed_key_values(kv + keys[k].first_row * kv_row, keys[k].T, keys[k].position, heads));
        }
}

// out (N, Cq'), lse (chunks B, NH', Tc) over every position up to each row's, from this rank's qkv
// (N, Cq' + 2 Ckv').
inline void ring_attention_forward(const ContextParallel& cp, floatX* out, float* lse, const floatX* qkv, int B,
                                   int T_local, AttentionHeads heads, cudaStream_t stream) {
    const size_t N = (size_t)B * T_local, block = N * 2 * heads.kv_columns();
    const int chunks = cp_chunks_per_rank(cp.split), Tc = T_local / chunks;
    std::vector<bool> started(chunks, false);
    int in_hand = 0;
    cp_pack_key_values(cp.key_values[in_hand], qkv, N, heads, stream);
    for (int step = 0; step < cp.size; step++) {
        const int source = (cp.rank - step + cp.size) % cp.size;  // whose block is in hand
        const bool more = step + 1 < cp.size;
        if (more) cp_ring_pass(cp, cp.key_values[in_hand], cp.key_values[1 - in_hand], block, stream);
        cp_mark(cp, stream);
        cp_for_each_visible_pair(cp, source, B, T_local, qkv, cp.key_values[in_hand], heads,
                                 [&](int q, const SequenceChunk& chunk, AttentionBlock queries, int, KeyValueBlock keys) {
            floatX* chunk_out = out + (size_t)chunk.first_row * heads.q_columns();
            float* chunk_lse = lse + (size_t)q * B * heads.q_heads * Tc;
            if (!started[q]) {
                attention_forward_pair(chunk_out, chunk_lse, queries, keys, B, heads, stream);
                started[q] = true;
            } else {
                attention_forward_pair(cp.partial_out, cp.partial_lse, queries, keys, B, heads, stream);
                attention_merge(chunk_out, chunk_lse, cp.partial_out, cp.partial_lse, B, Tc, heads, stream);
            }
        });
        cp_mark(cp, stream);
        if (more) {
            cp_ring_arrived(cp, stream);
            in_hand = 1 - in_hand;
        }
    }
}

// dqkv (N, Cq' + 2 Ckv') is overwritten with the gradient of this rank's qkv; D: workspace of chunks B NH' Tc
// floats.
inline void ring_attention_backward(const ContextParallel& cp, floatX* dqkv, float* D, const floatX* dout,
                                    const floatX* qkv, const floatX* out, const float* lse, int B, int T_local,
                                    AttentionHeads heads, cudaStream_t stream) {
    const size_t N = (size_t)B * T_local, block = N * 2 * heads.kv_columns();
    const int chunks = cp_chunks_per_rank(cp.split), Tc = T_local / chunks;
    const size_t chunk_lse = (size_t)B * heads.q_heads * Tc;  // lse and D values of one query chunk
    // the chunks are (chunks B) sequences of Tc rows as far as D's row sums go
    attention_backward_preprocess(D, dout, out, chunks * B, Tc, heads, stream);
    cudaCheck(cudaMemsetAsync(dqkv, 0, N * heads.qkv_columns() * sizeof(floatX), stream));  // dQ accumulates here
    int in_hand = 0;
    cp_pack_key_values(cp.key_values[in_hand], qkv, N, heads, stream);
    cudaCheck(cudaMemsetAsync(cp.dkey_values[in_hand], 0, block * sizeof(floatX), stream));
    for (int step = 0; step < cp.size; step++) {
        const int source = (cp.rank - step + cp.size) % cp.size;
        if (step + 1 < cp.size) cp_ring_pass(cp, cp.key_values[in_hand], cp.key_values[1 - in_hand], block, stream);
        cp_mark(cp, stream);
        cp_for_each_visible_pair(cp, source, B, T_local, qkv, cp.key_values[in_hand], heads,
                                 [&](int q, const SequenceChunk& chunk, AttentionBlock queries, int k, KeyValueBlock keys) {
            const size_t row_of_key = (size_t)k * B * Tc;  // the key chunk's first row in the block
            attention_backward_pair(dqkv + (size_t)chunk.first_row * heads.qkv_columns(),
                                    cp.dkey_values[in_hand] + row_of_key * 2 * heads.kv_columns(), D + q * chunk_lse,
                                    dout + (size_t)chunk.first_row * heads.q_columns(), lse + q * chunk_lse, queries,
                                    keys, B, heads, stream);
        });
        cp_mark(cp, stream);
        // the block's gradient moves on with it (after the last step it arrives home); the stream that
        // carried the block carries it too, so the ring's messages keep one order on every rank
        cp_ring_pass(cp, cp.dkey_values[in_hand], cp.dkey_values[1 - in_hand], block, stream);
        cp_ring_arrived(cp, stream);
        in_hand = 1 - in_hand;
    }
    cp_unpack_key_values(dqkv, cp.dkey_values[in_hand], N, heads, stream);
}

// ----------------------------------------------------------------------------
// Ulysses: all-to-alls between "my rows, all heads" and "all rows, my heads"
//
// A row of `groups` column groups (qkv: q, k, v; the output: one), each cut into cp parts, one per rank:
// the first group's parts `first` columns wide, the others' `rest` (qkv: Cq'/cp and Ckv'/cp, so that rank d
// gets part d of the query heads and part d of the K/V heads; without grouping first = rest). Rank d's heads
// are part d of every group. The message for rank d holds, for each of the sender's rows in order, its part
// d of each group: message[d][row][0 .. first + (groups - 1) rest), which is a qkv (or output) row of the
// head geometry rank d runs.
struct UlyssesRow {
    int groups;
    int first;  // columns of one part of group 0
    int rest;   // columns of one part of each further group
    __host__ __device__ int part_columns() const { return first + (groups - 1) * rest; }  // one rank's share
};
inline UlyssesRow ulysses_qkv_row(const AttentionHeads& heads, int cp) {
    return UlyssesRow{3, heads.q_columns() / cp, heads.kv_columns() / cp};
}
inline UlyssesRow ulysses_output_row(const AttentionHeads& heads, int cp) {
    return UlyssesRow{1, heads.q_columns() / cp, 0};
}

// message[d][r][c] <-> sequence[r][column of part d's column c] (to_message: sequence -> message)
__global__ void ulysses_sequence_message_kernel(floatX* message, floatX* sequence, int rows, UlyssesRow row, int cp,
                                                bool to_message) {
    const size_t part = row.part_columns(), sequence_row = (size_t)cp * part;
    const size_t vectors = (size_t)cp * rows * part / x128::size;
    const GridStride share = grid_stride(vectors);
    for (size_t v = share.first; v < share.end; v += share.step) {
        const size_t index = v * x128::size;
        const size_t c = index % part, r = index / part % rows, d = index / (part * rows);
        // group 0 spans sequence columns [0, cp first), group g >= 1 [cp first + (g-1) cp rest, ...); part d
        // of a group starts d parts into it (a vector never crosses a part: both widths are multiples of HS)
        const size_t column = c < (size_t)row.first
                                  ? d * row.first + c
                                  : (size_t)cp * row.first + (c - row.first) / row.rest * cp * row.rest +
                                        d * row.rest + (c - row.first) % row.rest;
        floatX* in_sequence = sequence + r * sequence_row + column;
        if (to_message) store128(message + index, load128(in_sequence));
        else store128(in_sequence, load128(message + index));
    }
}

// message[s][r][c] <-> heads[b][position][c], where row r of rank s is position `position` of sequence b
// (to_message: heads -> message); a row has `width` columns
__global__ void ulysses_heads_message_kernel(floatX* message, floatX* heads, int B, int T_local, int width, int cp,
                                             SequenceSplit split, bool to_message) {
    const int chunks = split == SequenceSplit::Zigzag ? 2 : 1, Tc = T_local / chunks, T = T_local * cp;
    const size_t rows = (size_t)B * T_local, vectors = (size_t)cp * rows * width / x128::size;
    const GridStride share = grid_stride(vectors);
    for (size_t v = share.first; v < share.end; v += share.step) {
        const size_t index = v * x128::size;
        const size_t c = index % width, r = index / width % rows;
        const int s = (int)(index / ((size_t)width * rows));
        const int k = (int)(r / ((size_t)B * Tc)), b = (int)(r / Tc % B), t = (int)(r % Tc);
        const int position = cp_chunk_index(split, cp, s, k) * Tc + t;
        floatX* in_heads = heads + ((size_t)b * T + position) * width + c;
        if (to_message) store128(message + index, load128(in_heads));
        else store128(in_heads, load128(message + index));
    }
}

inline void ulysses_sequence_message(floatX* message, floatX* sequence, int rows, UlyssesRow row, int cp,
                                     bool to_message, cudaStream_t stream) {
    const int block_size = 256;
    launch(ulysses_sequence_message_kernel,
           grid_size_for((size_t)cp * rows * row.part_columns() / x128::size, block_size), block_size, 0, stream,
           message, sequence, rows, row, cp, to_message);
}
inline void ulysses_heads_message(floatX* message, floatX* heads, int B, int T_local, int width, int cp,
                                  SequenceSplit split, bool to_message, cudaStream_t stream) {
    const int block_size = 256;
    launch(ulysses_heads_message_kernel, grid_size_for((size_t)cp * B * T_local * width / x128::size, block_size),
           block_size, 0, stream, message, heads, B, T_local, width, cp, split, to_message);
}

// sequence (N, cp part) -> heads (B T, part): this rank's heads of every row of the sequence
inline void ulysses_to_heads(const ContextParallel& cp, floatX* heads, floatX* sequence, int B, int T_local,
                             UlyssesRow row, cudaStream_t stream) {
    const int rows = B * T_local;
    const size_t per_rank = (size_t)rows * row.part_columns();
    ulysses_sequence_message(cp.message_out, sequence, rows, row, cp.size, true, stream);
    all_to_all(*cp.group, cp.message_in, cp.message_out, per_rank, stream);
    ulysses_heads_message(cp.message_in, heads, B, T_local, row.part_columns(), cp.size, cp.split, false, stream);
}
// heads (B T, part) -> sequence (N, cp part): every head of this rank's rows
inline void ulysses_to_sequence(const ContextParallel& cp, floatX* sequence, floatX* heads, int B, int T_local,
                                UlyssesRow row, cudaStream_t stream) {
    const int rows = B * T_local;
    const size_t per_rank = (size_t)rows * row.part_columns();
    ulysses_heads_message(cp.message_out, heads, B, T_local, row.part_columns(), cp.size, cp.split, true, stream);
    all_to_all(*cp.group, cp.message_in, cp.message_out, per_rank, stream);
    ulysses_sequence_message(cp.message_in, sequence, rows, row, cp.size, false, stream);
}

// the heads one cp rank runs: its part of the query heads and of the K/V heads
inline AttentionHeads ulysses_rank_heads(const ContextParallel& cp, const AttentionHeads& heads) {
    ulysses_check_heads(cp.size, heads);
    return AttentionHeads{heads.q_heads / cp.size, heads.kv_heads / cp.size, heads.head_size};
}

// qkv (N, W') in: this rank's rows; out: its heads' q, k, v of every row (B T, W'/cp), kept that way for the
// backward pass. out (N, Cq') this rank's rows; lse (B, NH'/cp, T) its heads'.
inline void ulysses_attention_forward(const ContextParallel& cp, floatX* out, float* lse, floatX* qkv, int B,
                                      int T_local, AttentionHeads heads, cudaStream_t stream) {
    const int T = T_local * cp.size;
    const AttentionHeads mine = ulysses_rank_heads(cp, heads);
    // in place: the rows leave qkv for the message before the heads come back into it (as many values)
    ulysses_to_heads(cp, qkv, qkv, B, T_local, ulysses_qkv_row(heads, cp.size), stream);
    cp_mark(cp, stream);
    attention_forward(cp.heads_out, lse, qkv, B, T, mine, stream);
    cp_mark(cp, stream);
    ulysses_to_sequence(cp, out, cp.heads_out, B, T_local, ulysses_output_row(heads, cp.size), stream);
}

// dqkv (N, W') overwritten; qkv and lse as the forward pass left them, out and dout this rank's rows.
inline void ulysses_attention_backward(const ContextParallel& cp, floatX* dqkv, float* D, const floatX* dout,
                                       const floatX* qkv, const floatX* out, const float* lse, int B, int T_local,
                                       AttentionHeads heads, cudaStream_t stream) {
    const int T = T_local * cp.size;
    const AttentionHeads mine = ulysses_rank_heads(cp, heads);
    const UlyssesRow output_row = ulysses_output_row(heads, cp.size);
    // (the kernels move values either way, so they take non-const pointers; these two are only read)
    ulysses_to_heads(cp, cp.heads_dout, const_cast<floatX*>(dout), B, T_local, output_row, stream);
    ulysses_to_heads(cp, cp.heads_out, const_cast<floatX*>(out), B, T_local, output_row, stream);
    // dqkv holds the head-sharded gradient first (as many values), then, in place, this rank's rows of it
    cp_mark(cp, stream);
    attention_backward(dqkv, D, cp.heads_dout, qkv, cp.heads_out, lse, B, T, mine, stream);
    cp_mark(cp, stream);
    ulysses_to_sequence(cp, dqkv, dqkv, B, T_local, ulysses_qkv_row(heads, cp.size), stream);
}

// ----------------------------------------------------------------------------
// attention on this rank's rows, whatever the layout (one rank: the plain kernels); `heads` those of this
// tp rank

inline void cp_attention_forward(const ContextParallel& cp, floatX* out, float* lse, floatX* qkv, int B, int T_local,
                                 AttentionHeads heads, cudaStream_t stream) {
    if (cp.size == 1) {
        cp_mark(cp, stream);
        attention_forward(out, lse, qkv, B, T_local, heads, stream);
        cp_mark(cp, stream);
    } else if (cp.mode == ContextParallelMode::Ring) ring_attention_forward(cp, out, lse, qkv, B, T_local, heads, stream);
    else ulysses_attention_forward(cp, out, lse, qkv, B, T_local, heads, stream);
}

inline void cp_attention_backward(const ContextParallel& cp, floatX* dqkv, float* D, const floatX* dout,
                                  const floatX* qkv, const floatX* out, const float* lse, int B, int T_local,
                                  AttentionHeads heads, cudaStream_t stream) {
    if (cp.size == 1) {
        cp_mark(cp, stream);
        attention_backward(dqkv, D, dout, qkv, out, lse, B, T_local, heads, stream);
        cp_mark(cp, stream);
    } else if (cp.mode == ContextParallelMode::Ring)
        ring_attention_backward(cp, dqkv, D, dout, qkv, out, lse, B, T_local, heads, stream);
    else ulysses_attention_backward(cp, dqkv, D, dout, qkv, out, lse, B, T_local, heads, stream);
}

// ----------------------------------------------------------------------------
// the formula of the header comment: bytes this rank sends on the cp axis per step (m micro-steps, `layers`
// blocks on this rank, forward_passes F per block and micro-step; `heads` those of one tp rank)

inline double cp_bytes_per_step(ContextParallelMode mode, int cp, int B, int T, const AttentionHeads& heads,
                                 int layers, int forward_passes, int micro_steps, size_t value_bytes) {
    if (cp == 1) return 0.0;
    const double N = (double)B * T / cp, F = forward_passes;
    const double Cq = heads.q_columns(), Ckv = heads.kv_columns(), W = heads.qkv_columns();
    const double per_layer = mode == ContextParallelMode::Ring
                                 ? ((cp - 1) * F + 2 * cp - 1) * 2 * N * Ckv
                                 : ((F + 1) * W + (F + 2) * Cq) * (cp - 1) / (double)cp * N;
    return per_layer * layers * micro_steps * value_bytes;
}
