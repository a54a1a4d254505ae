/*
Causal multi-head self-attention, fused: forward and backward without ever forming the T x T matrix; with
grouped-query attention (GQA, as Llama 3), fewer key/value heads than query heads.

Heads (AttentionHeads below). NH query heads and KVH key/value heads of HS values each, KVH dividing NH:
the query heads come in KVH groups of G = NH / KVH consecutive heads, and query head h reads key/value head
h / G (PyTorch's repeat_interleave of the K/V heads). KVH = NH is plain multi-head attention (G = 1), and
gives the same bits as a build without grouping; KVH = 1 is multi-query attention. Writing Cq = NH * HS and
Ckv = KVH * HS for the widths of the query heads and of the key (or value) heads:

Layouts (the matmuls around attention produce and consume these directly, so there are no permute kernels):
  qkv   (B, T, Cq + 2 Ckv)   the QKV projection's output: q in columns [0, Cq), k in [Cq, Cq + Ckv), v in
                     [Cq + Ckv, Cq + 2 Ckv); query head h owns columns [h*HS, (h+1)*HS) of q, K/V head g
                     columns [g*HS, (g+1)*HS) of k and of v
  out   (B, T, Cq)   query head h's output in columns [h*HS, (h+1)*HS), ready for the output projection
  lse   (B, NH, T)   fp32 log-sum-exp of each row of scaled, masked scores (natural log), per query head; the
                     backward pass needs it, and so does ring attention, which merges partial results from
                     several key blocks
  dout  (B, T, Cq)   gradient of the loss with respect to out
  dqkv  (B, T, Cq + 2 Ckv)   gradient with respect to qkv, same layout; OVERWRITTEN by attention_backward (qkv
                     is an activation, not a parameter, so there is nothing to accumulate into); the pair
                     backward of ring attention ACCUMULATES instead (below)
  kv    (B, T, 2 Ckv)   keys and values PACKED, k in columns [0, Ckv), v in [Ckv, 2 Ckv): how ring attention
                     carries a key block (and its dK/dV) around the ring (below); the kernels also read keys
                     and values straight from the k and v columns of a qkv buffer. Either way v is Ckv
                     columns after k.

Forward. For one (b, h), with Q the T x HS slice of query head h, K and V those of its K/V head h / G and
scale = 1/sqrt(HS):
    S[i][j] = scale * Q[i] . K[j]            for j <= i (causal); masked entries are -infinity
    P[i][j] = exp(S[i][j] - lse[i]),  lse[i] = log sum_j exp(S[i][j])
    O[i]    = sum_j P[i][j] V[j]
Every query head is its own softmax: grouping only changes where K and V are read from.
Online softmax (FlashAttention): the keys are visited in tiles, and for each query row we keep a running
maximum m, a running sum l = sum_j exp(S[i][j] - m) and an unnormalised accumulator o = sum_j exp(S[i][j] - m) V[j]
over the keys seen so far. A new tile with scores s_j gives
    m' = max(m, max_j s_j),   c = exp(m - m')
    l' = c * l + sum_j exp(s_j - m'),   o' = c * o + sum_j exp(s_j - m') V[j]
(the rescale c brings the old terms onto the new maximum, so no exp ever overflows). After the last tile
O[i] = o / l and lse[i] = m + log(l).

Backward. With dO the incoming gradient, per query head h (P, dP, dS, D of that head):
    dP[i][j] = dO[i] . V[j]
    dS[i][j] = P[i][j] * (dP[i][j] - D[i]),   D[i] = sum_j P[i][j] dP[i][j] = dO[i] . O[i]
    dQ[i]    = scale * sum_j dS[i][j] K[j]
A K/V head feeds the G query heads of its group, so its gradient is the sum of theirs (the chain rule over
every use of K[j] and V[j]): with g running over the query heads of the group,
    dK[j]    = scale * sum_g sum_i dS_g[i][j] Q_g[i]
    dV[j]    = sum_g sum_i P_g[i][j] dO_g[i]
(G = 1: the usual dK = scale dS^T Q, dV = P^T dO).
P is recomputed tile by tile from Q, K and the saved lse (one exp per entry, no renormalisation needed), and
D is computed up front from dO and O by a small preprocessing kernel. dK and dV are sums over query rows
(of G heads), dQ is a sum over key rows; writing both from one kernel would need atomics (and atomic float
sums change bits from run to run). So the backward pass is two kernels:
  - dK/dV kernel: one block per key tile and K/V head; it walks, for each query head of the group in turn
    (head by head, in order), the query tiles from the diagonal to the end, all into the same dK, dV
    accumulators;
  - dQ kernel:    one block per query tile and query head; it walks the key tiles of its K/V head from the
    start to the diagonal.
That computes S, P and dP twice (once per kernel): per score entry 7 products of length HS instead of the
5 an atomic version would need (S, dP, dV, dK, dQ), 1.4x the work; in exchange every gradient element is
summed by one thread in a fixed order, so two runs give the same bits. (With G > 1 the G heads' terms of a
dK element all land in one block's registers, in the fixed head order: no atomics, no second pass.)

Two implementations of these formulas, one per precision, behind the same launchers below:
  llmc/kernels/attention_tensor_cores.cuh   BF16 build: every product of tiles is a tensor-core mma (bf16 operands,
                                    fp32 accumulation), the online softmax works on the accumulator fragments
                                    in registers, tiles stream in through cp.async double buffering.
  llmc/kernels/attention_cuda_cores.cuh     FP32 build: plain fp32 multiply-adds over tiles in shared memory; the
                                    exact reference path.
Both run the same schedule: one block per tile of 64 (tensor cores) or 32 (CUDA cores) rows, the longest
blocks first, nothing T x T ever stored (each block holds one tile of scores at a time, and the only per-row
state carried from tile to tile is (m, l, o): memory is O(T * HS) per head, not O(T^2)).

Workspace: the backward pass needs B * NH * T floats (the D values), passed as workspace_D.
Supported head sizes: multiples of 16 from 16 to 128 (the kernels are templates on HS; the launchers
dispatch at run time and refuse anything else). Any T >= 1.

Pairs of blocks (ring attention, context parallelism). A rank holds some positions of the sequence and sees
the keys and values of the others one block at a time. So the kernels are written for a pair: queries i
from one qkv-layout buffer (B, Tq, Cq + 2 Ckv) at absolute positions q_position + i (an AttentionBlock),
keys and values j at k_position + j (a KeyValueBlock), with query i seeing key j iff
    k_position + j <= q_position + i,   i.e.   j <= i + offset,   offset = q_position - k_position.
Self-attention above is the pair (qkv, key_values_of(qkv)) with offset 0. Since the visible keys of a row
are always a prefix 0 .. i + offset, a query tile needs only the key tiles up to its last row's last visible
key and a key tile only the query tiles from its first key's first viewer on: entirely masked tiles are
never visited.
With offset >= Tk (a key block wholly before the query block) nothing is masked; with offset <= -Tq nothing
is visible and the pair costs nothing. A row that sees no key of the pair gets O = 0 and lse = -infinity.
A key block is read through its row stride: its rows are the k and v columns of a qkv buffer
(B, Tk, Cq + 2 Ckv), as in self-attention (key_values_of), or packed (B, Tk, 2 Ckv) rows of k and v alone
(packed_key_values). The ring sends the packed form: a rank needs only the keys and values of the others'
blocks, and whole qkv rows would spend bytes on q columns nobody reads (a third of them without grouping,
more with it: the packed block shrinks with KVH). The kernels read every k and v row with the block's
stride (q, dout and dQ rows with their own, Cq + 2 Ckv, Cq and Cq + 2 Ckv), so both layouts give the same
products in the same order: the same bits.

Merging. Attention over the union of two disjoint key sets, from the results on each:
    lse' = log(exp(lse_a) + exp(lse_b)) = M + log(exp(lse_a - M) + exp(lse_b - M)),   M = max(lse_a, lse_b)
    O'   = exp(lse_a - lse') O_a + exp(lse_b - lse') O_b
(each O is sum_j exp(S[i][j] - lse) V[j] over its keys, so rescaling by exp(lse - lse') puts both on the
common normaliser). A side with lse = -infinity has no keys: the other side is taken as it is, bit for bit.
Merging is per query head and row, so grouping changes nothing here.
A ring's forward: out, lse <- the first pair's result (or lse = -infinity and out anything: the first merge
then takes the pair's result as it is), then merge each further pair's into them. Under the zigzag split
(2 cp chunks, rank i holding chunks i and 2cp-1-i, so that every rank gets the same causal work) a pair of
chunks is the diagonal (offset 0), wholly visible, or wholly masked (the caller skips it; here it is free).

The pair backward. With the MERGED lse (so P is the full row's softmax restricted to this pair's keys) and
D from the merged output (attention_backward_preprocess), the formulas above hold pair by pair: dQ of a
row is a sum over key blocks and dK, dV of a key row a sum over query blocks, so the pair backward ADDS
its dQ into the query rows of one dqkv-layout buffer (q columns) and dK, dV into the key rows of a target
in the keys' layout: dK of key row j, K/V head g at dkv_target + (b*Tk + j) * row_stride + g*HS, dV Ckv
further on. A ring whose key blocks travel packed accumulates their gradients packed too (a (B, Tk, 2 Ckv)
buffer, passed as it is), and that accumulator travels with the block, again without q columns; a key
block read from a qkv buffer has its gradient in a dqkv buffer (B, Tk, Cq + 2 Ckv), passed as dqkv + Cq.
Summed over the pairs of a ring in a fixed order the result is deterministic.
attention_backward is the pair (qkv, key_values_of(qkv)) that overwrites instead (dK, dV to dqkv + Cq): the
same kernel templates, with a template flag (ACCUMULATE) that only changes the final store, so the
overwriting instances pay nothing for the accumulation (no loads of the target, no registers for it).
*/
#pragma once

#include <type_traits>
#include "../cuda_common.cuh"
#include "../utils.h"

// The head geometry of one rank's attention: q_heads query heads in groups of group() sharing each of the
// kv_heads key/value heads, head_size values per head (the header comment's NH, KVH, HS). An aggregate, so
// that it is written in place as {q_heads, kv_heads, head_size}; every launcher checks it
// (check_attention_heads).
struct AttentionHeads {
    int q_heads;
    int kv_heads;
    int head_size;
    __host__ __device__ int q_columns() const { return q_heads * head_size; }      // Cq: a row of out or dout
    __host__ __device__ int kv_columns() const { return kv_heads * head_size; }    // Ckv: the k (or v) heads
    __host__ __device__ int qkv_columns() const { return (q_heads + 2 * kv_heads) * head_size; }  // a qkv row
    __host__ __device__ int group() const { return q_heads / kv_heads; }           // G: query heads per K/V head
};

// n / d and n % d for n >= 0, d > 0 (the kernels' head and step indices), in unsigned arithmetic: signed
// division adds the sign handling, and in these register-bound kernels ptxas then spent up to 27 more
// registers (sm_80, dQ kernel at HS = 80: 158 against 131), enough to fit fewer blocks on an SM.
__host__ __device__ inline int index_quotient(int n, int d) { return (int)((unsigned)n / (unsigned)d); }
__host__ __device__ inline int index_remainder(int n, int d) { return (int)((unsigned)n % (unsigned)d); }

// What the kernels get for one pair: where the queries and the keys start, the blocks' lengths, offset =
// q_position - k_position, the row strides (queries: a qkv row; keys: a qkv row or a packed k, v row), where
// a value head sits after its key head, and the group G.
struct AttentionPair {
    const floatX* q_source;   // (B, Tq, q_row_stride): q columns read
    const floatX* kv_source;  // the k columns of key row 0 of batch 0; v columns v_offset further on
    int Tq;
    int Tk;
    int offset;
    int q_row_stride;         // elements from one query row to the next (Cq + 2 Ckv); also dQ's rows
    int kv_row_stride;        // elements from one key row to the next (Cq + 2 Ckv or 2 Ckv); also dK's, dV's
    int v_offset;             // Ckv: from a key head to its value head, in the keys and in their gradients
    int group;                // G: query head h reads K/V head h / G
    // query i sees key j (and both are inside their blocks)
    __host__ __device__ bool sees(int query, int key) const { return key <= query + offset && key < Tk && query < Tq; }
    // the keys visible to any of the queries first_query .. first_query + rows - 1 are 0 .. this - 1
    __host__ __device__ int keys_seen_by(int first_query, int rows) const {
        const int last_query = (first_query + rows < Tq ? first_query + rows : Tq) - 1;
        const int end = last_query + offset + 1;
        return end < 0 ? 0 : (end < Tk ? end : Tk);
    }
    // the K/V head that query head h reads
    __host__ __device__ int kv_head_of(int h) const { return index_quotient(h, group); }
    // where query head h of batch b starts in q_source, and K/V head g in kv_source (its v: v_offset further)
    __host__ __device__ const floatX* q_head(int b, int h, int HS) const {
        return q_source + (size_t)b * Tq * q_row_stride + (size_t)h * HS;
    }
    __host__ __device__ const floatX* k_head(int b, int g, int HS) const {
        return kv_source + (size_t)b * Tk * kv_row_stride + (size_t)g * HS;
    }
    // the first query that sees `key` (Tq or more: none does)
    __host__ __device__ int first_query_seeing(int key) const { return key - offset > 0 ? key - offset : 0; }
};

#ifdef ENABLE_FP32
#include "attention_cuda_cores.cuh"
#else
#include "attention_tensor_cores.cuh"
#endif

// ----------------------------------------------------------------------------
// launchers for one head size (attention_forward and the others below check the shapes and dispatch), of
// whichever implementation the build included: both name their kernels, their shared memory per block and a
// block's rows and threads alike.

template <int HS>
void launch_attention_forward(floatX* out, float* lse, const AttentionPair& pair, int B, int NH, cudaStream_t stream) {
    const size_t shared_bytes = attention_forward_shared_bytes<HS>();
    opt_in_shared_memory(attention_forward_kernel<HS>, shared_bytes);
    const dim3 grid(ceil_div(pair.Tq, kAttentionBlockRows), NH, B);
    launch(attention_forward_kernel<HS>, grid, dim3(kAttentionThreads), shared_bytes, stream, out, lse, pair, NH);
}

// the dK/dV and dQ kernels, once D is in place: dK, dV into dkv_target in the keys' layout (pair.kv_row_stride
// per row, dV pair.v_offset after dK), dQ into the q columns of dq_target (rows of pair.q_row_stride), written
// or (ACCUMULATE) added. dK/dV: a block per key tile and K/V head; dQ: per query tile and query head.
template <int HS, bool ACCUMULATE>
void launch_attention_backward(floatX* dq_target, floatX* dkv_target, const float* D, const floatX* dout,
                               const AttentionPair& pair, const float* lse, int B, int NH, int KVH,
                               cudaStream_t stream) {
    const size_t dkdv_bytes = attention_dkdv_shared_bytes<HS>();
    const size_t dq_bytes = attention_dq_shared_bytes<HS>();
    opt_in_shared_memory(attention_backward_dkdv_kernel<HS, ACCUMULATE>, dkdv_bytes);
    opt_in_shared_memory(attention_backward_dq_kernel<HS, ACCUMULATE>, dq_bytes);
    launch(attention_backward_dkdv_kernel<HS, ACCUMULATE>, dim3(ceil_div(pair.Tk, kAttentionBlockRows), KVH, B),
           dim3(kAttentionThreads), dkdv_bytes, stream, dkv_target, dout, pair, lse, D, NH);
    launch(attention_backward_dq_kernel<HS, ACCUMULATE>, dim3(ceil_div(pair.Tq, kAttentionBlockRows), NH, B),
           dim3(kAttentionThreads), dq_bytes, stream, dq_target, dout, pair, lse, D, NH);
}

// ----------------------------------------------------------------------------
// Row `index` of an lse-shaped (B, NH, T) array is head h of position t of batch b; where that head's HS
// columns start in the matching (B, T, NH * HS) array (out, dout).
__device__ __forceinline__ size_t attention_row_start(size_t index, int T, int NH, int HS) {
    const size_t t = index % T;
    const size_t h = (index / T) % NH;
    const size_t b = index / ((size_t)T * NH);
    return (b * T + t) * NH * HS + h * HS;
}

// backward, first step: D[b][h][t] = dout[b][t][head h] . out[b][t][head h]. One thread per (b, h, t) row,
// grid-stride loop.

__global__ void attention_backward_preprocess_kernel(float* D, const floatX* dout, const floatX* out,
                                                     int B, int T, int NH, int HS) {
    const GridStride share = grid_stride((long long)B * NH * T);
    for (size_t index = share.first; index < share.end; index += share.step) {
        const size_t offset = attention_row_start(index, T, NH, HS);
        float sum = 0.0f;
        for (int column = 0; column < HS; column += x128::size) {
            x128 dout_packed = load128(dout + offset + column);
            x128 out_packed = load128(out + offset + column);
            for (int k = 0; k < x128::size; k++) sum += (float)dout_packed[k] * (float)out_packed[k];
        }
        D[index] = sum;
    }
}

// ----------------------------------------------------------------------------
// merging a partial result into a running one (the formulas in the header comment). One thread per
// (b, h, t) row: it reads both lse values, rescales the row's HS outputs and writes the new lse, so no other
// thread reads an lse it changes.

__global__ void attention_merge_kernel(floatX* out, float* lse, const floatX* out_partial, const float* lse_partial,
                                       int B, int T, int NH, int HS) {
    const GridStride share = grid_stride((long long)B * NH * T);
    for (size_t index = share.first; index < share.end; index += share.step) {
        const size_t offset = attention_row_start(index, T, NH, HS);
        const float lse_a = lse[index], lse_b = lse_partial[index];
        if (lse_b == -INFINITY) continue;  // the partial saw no key: nothing changes
        if (lse_a == -INFINITY) {          // the running row saw none yet: take the partial as it is
            for (int column = 0; column < HS; column += x128::size)
                store128(out + offset + column, load128(out_partial + offset + column));
            lse[index] = lse_b;
            continue;
        }
        const float larger = fmaxf(lse_a, lse_b);
        const float merged = larger + log1pf(expf(-fabsf(lse_a - lse_b)));
        const float weight_a = expf(lse_a - merged), weight_b = expf(lse_b - merged);
        for (int column = 0; column < HS; column += x128::size) {
            const x128 a = load128(out + offset + column);
            const x128 partial = load128(out_partial + offset + column);
            x128 result;
            for (int k = 0; k < x128::size; k++) result[k] = (floatX)(weight_a * (float)a[k] + weight_b * (float)partial[k]);
            store128(out + offset + column, result);
        }
        lse[index] = merged;
    }
}

// ----------------------------------------------------------------------------
// host launchers

// Calls fn(std::integral_constant<int, HS>{}) for the supported head sizes, refuses the others.
template <class Function>
void dispatch_attention_head_size(int head_size, Function&& fn) {
    switch (head_size) {
        case 16: fn(std::integral_constant<int, 16>{}); break;
        case 32: fn(std::integral_constant<int, 32>{}); break;
        case 48: fn(std::integral_constant<int, 48>{}); break;
        case 64: fn(std::integral_constant<int, 64>{}); break;
        case 80: fn(std::integral_constant<int, 80>{}); break;
        case 96: fn(std::integral_constant<int, 96>{}); break;
        case 112: fn(std::integral_constant<int, 112>{}); break;
        case 128: fn(std::integral_constant<int, 128>{}); break;
        default:
            fatal("attention supports head sizes 16, 32, ..., 128 (multiples of 16), got %d", head_size);
    }
}

// Stops with one line unless the kernels can run this geometry: at least one query and one K/V head, the
// query heads in whole groups, a head size the dispatch has.
inline void check_attention_heads(const AttentionHeads& heads) {
    if (heads.q_heads <= 0 || heads.kv_heads <= 0)
        fatal("attention needs at least one query head and one key/value head (got %d and %d)", heads.q_heads,
              heads.kv_heads);
    if (heads.q_heads % heads.kv_heads != 0)
        fatal("attention needs the %d query heads to divide into groups over the %d key/value heads", heads.q_heads,
              heads.kv_heads);
    dispatch_attention_head_size(heads.head_size, [](auto) {});  // refuses what the kernels do not support
}

// q_heads query heads over kv_heads key/value heads of head_size values, checked
inline AttentionHeads attention_heads(int q_heads, int kv_heads, int head_size) {
    const AttentionHeads heads{q_heads, kv_heads, head_size};
    check_attention_heads(heads);
    return heads;
}

// One block of a sequence in a qkv buffer (B, T, Cq + 2 Ckv): its rows 0 .. T-1 sit at absolute positions
// position .. position + T - 1.
struct AttentionBlock {
    const floatX* qkv;
    int T;
    int position;
};

// The keys and values of one block: key row j of batch b has its k columns (K/V head g at + g*HS) at
// k + (b*T + j) * row_stride and its v columns Ckv further on; its rows sit at positions position .. + T - 1.
struct KeyValueBlock {
    const floatX* k;
    int row_stride;
    int T;
    int position;
};

// the k and v columns of a qkv buffer (B, T, Cq + 2 Ckv)
inline KeyValueBlock key_values_of(AttentionBlock block, const AttentionHeads& heads) {
    return KeyValueBlock{block.qkv + heads.q_columns(), heads.qkv_columns(), block.T, block.position};
}
// packed keys and values (B, T, 2 Ckv): k in columns [0, Ckv), v in [Ckv, 2 Ckv)
inline KeyValueBlock packed_key_values(const floatX* kv, int T, int position, const AttentionHeads& heads) {
    return KeyValueBlock{kv, 2 * heads.kv_columns(), T, position};
}

inline AttentionPair attention_pair(const AttentionBlock& queries, const KeyValueBlock& keys,
                                    const AttentionHeads& heads) {
    check_attention_heads(heads);
    if (queries.T < 1 || keys.T < 1)
        fatal("attention blocks need at least one row (got Tq = %d, Tk = %d)", queries.T, keys.T);
    // a key row holds Ckv k and Ckv v columns; the kernels move 16 bytes at a time, so rows start 16-byte
    // aligned (query rows do: Cq + 2 Ckv is a multiple of 16 columns, as HS is)
    if (keys.row_stride < 2 * heads.kv_columns() || keys.row_stride % (16 / (int)sizeof(floatX)) != 0)
        fatal("a key block's rows need 2 Ckv = %d columns and 16-byte alignment (row stride %d)",
              2 * heads.kv_columns(), keys.row_stride);
    return AttentionPair{queries.qkv, keys.k, queries.T, keys.T, queries.position - keys.position,
                         heads.qkv_columns(), keys.row_stride, heads.kv_columns(), heads.group()};
}

// Ring attention's forward on one pair: out (B, Tq, Cq) and lse (B, NH, Tq) are overwritten with the
// normalised result over this pair's visible keys (rows that see none: out 0, lse -infinity).
void attention_forward_pair(floatX* out, float* lse, AttentionBlock queries, KeyValueBlock keys, int B,
                            AttentionHeads heads, cudaStream_t stream) {
    const AttentionPair pair = attention_pair(queries, keys, heads);
    dispatch_attention_head_size(heads.head_size, [&](auto head_size) {
        launch_attention_forward<decltype(head_size)::value>(out, lse, pair, B, heads.q_heads, stream);
    });
}

// (out, lse) <- their merge with (out_partial, lse_partial); all (B, T, Cq) and (B, NH, T). Deterministic.
void attention_merge(floatX* out, float* lse, const floatX* out_partial, const float* lse_partial, int B, int T,
                     AttentionHeads heads, cudaStream_t stream) {
    check_attention_heads(heads);
    const int block_size = 256;
    launch(attention_merge_kernel, grid_size_for((long long)B * heads.q_heads * T, block_size), block_size, 0,
           stream, out, lse, out_partial, lse_partial, B, T, heads.q_heads, heads.head_size);
}

// D (B, NH, T) = rowsum(dout * out) per query head: the pair backward's input, from the merged out.
void attention_backward_preprocess(float* D, const floatX* dout, const floatX* out, int B, int T,
                                   AttentionHeads heads, cudaStream_t stream) {
    check_attention_heads(heads);
    const int block_size = 256;
    launch(attention_backward_preprocess_kernel, grid_size_for((long long)B * heads.q_heads * T, block_size),
           block_size, 0, stream, D, dout, out, B, T, heads.q_heads, heads.head_size);
}

// Ring attention's backward on one pair, given D and lse (B, NH, Tq) of the merged forward and dout
// (B, Tq, Cq): ADDS dQ into the q columns of dq_target (B, Tq, Cq + 2 Ckv) and dK, dV into dkv_target, laid
// out like the keys (row stride keys.row_stride, dV Ckv after dK): dqkv + Cq for a (B, Tk, Cq + 2 Ckv) dqkv
// buffer, a packed (B, Tk, 2 Ckv) buffer as it is. Deterministic.
void attention_backward_pair(floatX* dq_target, floatX* dkv_target, const float* D, const floatX* dout,
                             const float* lse, AttentionBlock queries, KeyValueBlock keys, int B,
                             AttentionHeads heads, cudaStream_t stream) {
    const AttentionPair pair = attention_pair(queries, keys, heads);
    dispatch_attention_head_size(heads.head_size, [&](auto head_size) {
        launch_attention_backward<decltype(head_size)::value, true>(dq_target, dkv_target, D, dout, pair, lse, B,
                                                                    heads.q_heads, heads.kv_heads, stream);
    });
}

// the pair of a whole sequence with itself: queries and keys from one qkv buffer (B, T, Cq + 2 Ckv)
inline AttentionPair self_attention_pair(const floatX* qkv, int T, const AttentionHeads& heads) {
    const AttentionBlock block{qkv, T, 0};
    return attention_pair(block, key_values_of(block, heads), heads);
}

// out (B, T, Cq) and lse (B, NH, T) are overwritten.
void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, AttentionHeads heads,
                       cudaStream_t stream) {
    const AttentionPair pair = self_attention_pair(qkv, T, heads);
    dispatch_attention_head_size(heads.head_size, [&](auto head_size) {
        launch_attention_forward<decltype(head_size)::value>(out, lse, pair, B, heads.q_heads, stream);
    });
}

// dqkv (B, T, Cq + 2 Ckv) is overwritten (every element written); workspace_D holds B * NH * T floats.
// Two runs with the same inputs give the same bits.
void attention_backward(floatX* dqkv, float* workspace_D, const floatX* dout, const floatX* qkv, const floatX* out,
                        const float* lse, int B, int T, AttentionHeads heads, cudaStream_t stream) {
    const AttentionPair pair = self_attention_pair(qkv, T, heads);
    attention_backward_preprocess(workspace_D, dout, out, B, T, heads, stream);
    dispatch_attention_head_size(heads.head_size, [&](auto head_size) {
        launch_attention_backward<decltype(head_size)::value, false>(dqkv, dqkv + heads.q_columns(), workspace_D,
                                                                     dout, pair, lse, B, heads.q_heads,
                                                                     heads.kv_heads, stream);
    });
}
