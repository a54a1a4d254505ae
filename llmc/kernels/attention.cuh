/*
Causal multi-head self-attention, fused: forward and backward without ever forming the T x T matrix.

Layouts (the matmuls around attention produce and consume these directly, so there are no permute kernels):
  qkv   (B, T, 3C)   the QKV projection's output: q in columns [0, C), k in [C, 2C), v in [2C, 3C);
                     head h owns columns [h*HS, (h+1)*HS) of each part (C = NH * HS)
  out   (B, T, C)    head h's output in columns [h*HS, (h+1)*HS), ready for the output projection
  lse   (B, NH, T)   fp32 log-sum-exp of each row of scaled, masked scores (natural log); the backward pass
                     needs it, and so does ring attention, which merges partial results from several key blocks
  dout  (B, T, C)    gradient of the loss with respect to out
  dqkv  (B, T, 3C)   gradient with respect to qkv, same layout; OVERWRITTEN by attention_backward (qkv is an
                     activation, not a parameter, so there is nothing to accumulate into); the pair backward
                     of ring attention ACCUMULATES instead (below)
  kv    (B, T, 2C)   keys and values PACKED, k in columns [0, C), v in [C, 2C): how ring attention carries a
                     key block (and its dK/dV) around the ring (below); the kernels also read keys and values
                     straight from the k and v columns of a qkv buffer

Forward. For one (b, h), with Q, K, V the T x HS slices of that head and scale = 1/sqrt(HS):
    S[i][j] = scale * Q[i] . K[j]            for j <= i (causal); masked entries are -infinity
    P[i][j] = exp(S[i][j] - lse[i]),  lse[i] = log sum_j exp(S[i][j])
    O[i]    = sum_j P[i][j] V[j]
Online softmax (FlashAttention): the keys are visited in tiles, and for each query row we keep a running
maximum m, a running sum l = sum_j exp(S[i][j] - m) and an unnormalised accumulator o = sum_j exp(S[i][j] - m) V[j]
over the keys seen so far. A new tile with scores s_j gives
    m' = max(m, max_j s_j),   c = exp(m - m')
    l' = c * l + sum_j exp(s_j - m'),   o' = c * o + sum_j exp(s_j - m') V[j]
(the rescale c brings the old terms onto the new maximum, so no exp ever overflows). After the last tile
O[i] = o / l and lse[i] = m + log(l).

Backward. With dO the incoming gradient:
    dV[j]    = sum_i P[i][j] dO[i]
    dP[i][j] = dO[i] . V[j]
    dS[i][j] = P[i][j] * (dP[i][j] - D[i]),   D[i] = sum_j P[i][j] dP[i][j] = dO[i] . O[i]
    dQ[i]    = scale * sum_j dS[i][j] K[j]
    dK[j]    = scale * sum_i dS[i][j] Q[i]
P is recomputed tile by tile from Q, K and the saved lse (one exp per entry, no renormalisation needed), and
D is computed up front from dO and O by a small preprocessing kernel. dK and dV are sums over query rows,
dQ is a sum over key rows; writing both from one kernel would need atomics (and atomic float sums change
bits from run to run). So the backward pass is two kernels:
  - dK/dV kernel: one block per key tile; it walks the query tiles from the diagonal to the end;
  - dQ kernel:    one block per query tile; it walks the key tiles from the start to the diagonal.
That computes S, P and dP twice (once per kernel): per score entry 7 products of length HS instead of the
5 an atomic version would need (S, dP, dV, dK, dQ), 1.4x the work; in exchange every gradient element is
summed by one thread in a fixed order, so two runs give the same bits.

Two implementations of these formulas, one per precision, behind the same two launchers below:
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
from one packed buffer (B, Tq, 3C) at absolute positions q_position + i (an AttentionBlock), keys and values
j at k_position + j (a KeyValueBlock), with query i seeing key j iff
    k_position + j <= q_position + i,   i.e.   j <= i + offset,   offset = q_position - k_position.
Self-attention above is the pair (qkv, key_values_of(qkv)) with offset 0. Since the visible keys of a row
are always a prefix 0 .. i + offset, a query tile needs only the key tiles up to its last row's last visible
key and a key tile only the query tiles from its first key's first viewer on: entirely masked tiles are
never visited.
With offset >= Tk (a key block wholly before the query block) nothing is masked; with offset <= -Tq nothing
is visible and the pair costs nothing. A row that sees no key of the pair gets O = 0 and lse = -infinity.
A key block is read through its row stride: its rows are the k and v columns of a qkv buffer (B, Tk, 3C),
as in self-attention (key_values_of), or packed (B, Tk, 2C) rows of k and v alone (packed_key_values). The
ring sends the packed form: a rank needs only the keys and values of the others' blocks, and whole qkv rows
would spend a third of every step's bytes on q columns nobody reads. The kernels read every k and v row with
the block's stride (q, dout and dQ rows with their own, 3C, C and 3C), so both layouts give the same
products in the same order: the same bits.

Merging. Attention over the union of two disjoint key sets, from the results on each:
    lse' = log(exp(lse_a) + exp(lse_b)) = M + log(exp(lse_a - M) + exp(lse_b - M)),   M = max(lse_a, lse_b)
    O'   = exp(lse_a - lse') O_a + exp(lse_b - lse') O_b
(each O is sum_j exp(S[i][j] - lse) V[j] over its keys, so rescaling by exp(lse - lse') puts both on the
common normaliser). A side with lse = -infinity has no keys: the other side is taken as it is, bit for bit.
A ring's forward: out, lse <- the first pair's result (or lse = -infinity and out anything: the first merge
then takes the pair's result as it is), then merge each further pair's into them. Under the zigzag split
(2 cp chunks, rank i holding chunks i and 2cp-1-i, so that every rank gets the same causal work) a pair of
chunks is the diagonal (offset 0), wholly visible, or wholly masked (the caller skips it; here it is free).

The pair backward. With the MERGED lse (so P is the full row's softmax restricted to this pair's keys) and
D from the merged output (attention_backward_preprocess), the formulas above hold pair by pair: dQ of a
row is a sum over key blocks and dK, dV of a key row a sum over query blocks, so the pair backward ADDS
its dQ into the query rows of one dqkv-layout buffer (q columns) and dK, dV into the key rows of a target
in the keys' layout: dK of key row j, head h at dkv_target + (b*Tk + j) * row_stride + h*HS, dV C further
on. A ring whose key blocks travel packed accumulates their gradients packed too (a (B, Tk, 2C) buffer,
passed as it is), and that accumulator travels with the block, again without q columns; a key block read
from a qkv buffer has its gradient in a dqkv buffer (B, Tk, 3C), passed as dqkv + C. Summed over the pairs
of a ring in a fixed order the result is deterministic.
attention_backward is the pair (qkv, key_values_of(qkv)) that overwrites instead (dK, dV to dqkv + C): the
same kernel templates, with a template flag (ACCUMULATE) that only changes the final store, so the
overwriting instances pay nothing for the accumulation (no loads of the target, no registers for it).
*/
#pragma once

#include <type_traits>
#include "../cuda_common.cuh"

// What the kernels get for one pair: where the queries and the keys start, the blocks' lengths, offset =
// q_position - k_position, and the keys' row stride (3C: the k, v columns of a qkv buffer; 2C: packed).
struct AttentionPair {
    const floatX* q_source;   // (B, Tq, 3C): q columns read
    const floatX* kv_source;  // the k columns of key row 0 of batch 0; v columns C further on
    int Tq;
    int Tk;
    int offset;
    int kv_row_stride;        // elements from one key row to the next
    // query i sees key j (and both are inside their blocks)
    __host__ __device__ bool sees(int query, int key) const { return key <= query + offset && key < Tk && query < Tq; }
    // the keys visible to any of the queries first_query .. first_query + rows - 1 are 0 .. this - 1
    __host__ __device__ int keys_seen_by(int first_query, int rows) const {
        const int last_query = (first_query + rows < Tq ? first_query + rows : Tq) - 1;
        const int end = last_query + offset + 1;
        return end < 0 ? 0 : (end < Tk ? end : Tk);
    }
    // where head h of batch b starts: its q columns in q_source, its k columns in kv_source (v: C further)
    __host__ __device__ const floatX* q_head(int b, int h, int NH, int HS) const {
        return q_source + (size_t)b * Tq * 3 * NH * HS + (size_t)h * HS;
    }
    __host__ __device__ const floatX* k_head(int b, int h, int HS) const {
        return kv_source + (size_t)b * Tk * kv_row_stride + (size_t)h * HS;
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
// Row `index` of an lse-shaped (B, NH, T) array is head h of position t of batch b; where that head's HS
// columns start in the matching (B, T, C) array.
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
            fprintf(stderr, "error: attention supports head sizes 16, 32, ..., 128 (multiples of 16), got %d\n",
                    head_size);
            exit(EXIT_FAILURE);
    }
}

inline int attention_head_size(int C, int NH) {
    if (NH <= 0 || C % NH != 0) {
        fprintf(stderr, "error: attention needs C (%d) divisible by the number of heads (%d)\n", C, NH);
        exit(EXIT_FAILURE);
    }
    dispatch_attention_head_size(C / NH, [](auto) {});  // refuses what the kernels do not support
    return C / NH;
}

// One block of a sequence in a packed qkv buffer (B, T, 3C): its rows 0 .. T-1 sit at absolute positions
// position .. position + T - 1.
struct AttentionBlock {
    const floatX* qkv;
    int T;
    int position;
};

// The keys and values of one block: key row j of batch b has its k columns (head h at + h*HS) at
// k + (b*T + j) * row_stride and its v columns C further on; its rows sit at positions position .. + T - 1.
struct KeyValueBlock {
    const floatX* k;
    int row_stride;
    int T;
    int position;
};

// the k and v columns of a qkv buffer (B, T, 3C)
inline KeyValueBlock key_values_of(AttentionBlock block, int C) {
    return KeyValueBlock{block.qkv + C, 3 * C, block.T, block.position};
}
// packed keys and values (B, T, 2C): k in columns [0, C), v in [C, 2C)
inline KeyValueBlock packed_key_values(const floatX* kv, int T, int position, int C) {
    return KeyValueBlock{kv, 2 * C, T, position};
}

inline AttentionPair attention_pair(const AttentionBlock& queries, const KeyValueBlock& keys, int C) {
    if (queries.T < 1 || keys.T < 1) {
        fprintf(stderr, "error: attention blocks need at least one row (got Tq = %d, Tk = %d)\n", queries.T, keys.T);
        exit(EXIT_FAILURE);
    }
    // a key row holds C k and C v columns; the kernels move 16 bytes at a time, so rows start 16-byte aligned
    if (keys.row_stride < 2 * C || keys.row_stride % (16 / (int)sizeof(floatX)) != 0) {
        fprintf(stderr, "error: a key block's rows need 2C = %d columns and 16-byte alignment (row stride %d)\n",
                2 * C, keys.row_stride);
        exit(EXIT_FAILURE);
    }
    return AttentionPair{queries.qkv, keys.k, queries.T, keys.T, queries.position - keys.position, keys.row_stride};
}

// Ring attention's forward on one pair: out (B, Tq, C) and lse (B, NH, Tq) are overwritten with the
// normalised result over this pair's visible keys (rows that see none: out 0, lse -infinity).
void attention_forward_pair(floatX* out, float* lse, AttentionBlock queries, KeyValueBlock keys, int B, int C,
                            int NH, cudaStream_t stream) {
    const AttentionPair pair = attention_pair(queries, keys, C);
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        launch_attention_forward<decltype(head_size)::value>(out, lse, pair, B, NH, stream);
    });
}

// (out, lse) <- their merge with (out_partial, lse_partial); all (B, T, C) and (B, NH, T). Deterministic.
void attention_merge(floatX* out, float* lse, const floatX* out_partial, const float* lse_partial, int B, int T,
                     int C, int NH, cudaStream_t stream) {
    const int head_size = attention_head_size(C, NH);
    const int block_size = 256;
    launch(attention_merge_kernel, grid_size_for((long long)B * NH * T, block_size), block_size, 0, stream,
           out, lse, out_partial, lse_partial, B, T, NH, head_size);
}

// D (B, NH, T) = rowsum(dout * out) per head: the pair backward's input, from the merged out.
void attention_backward_preprocess(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH,
                                   cudaStream_t stream) {
    const int head_size = attention_head_size(C, NH);
    const int block_size = 256;
    launch(attention_backward_preprocess_kernel, grid_size_for((long long)B * NH * T, block_size), block_size, 0,
           stream, D, dout, out, B, T, NH, head_size);
}

// Ring attention's backward on one pair, given D and lse (B, NH, Tq) of the merged forward and dout
// (B, Tq, C): ADDS dQ into the q columns of dq_target (B, Tq, 3C) and dK, dV into dkv_target, laid out like
// the keys (row stride keys.row_stride, dV C after dK): dqkv + C for a (B, Tk, 3C) dqkv buffer, a packed
// (B, Tk, 2C) buffer as it is. Deterministic.
void attention_backward_pair(floatX* dq_target, floatX* dkv_target, const float* D, const floatX* dout,
                             const float* lse, AttentionBlock queries, KeyValueBlock keys, int B, int C, int NH,
                             cudaStream_t stream) {
    const AttentionPair pair = attention_pair(queries, keys, C);
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        launch_attention_backward<decltype(head_size)::value, true>(dq_target, dkv_target, D, dout, pair, lse, B, NH,
                                                                    stream);
    });
}

// out (B, T, C) and lse (B, NH, T) are overwritten.
void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        launch_attention_forward<decltype(head_size)::value>(out, lse, AttentionPair{qkv, qkv + C, T, T, 0, 3 * C},
                                                             B, NH, stream);
    });
}

// dqkv (B, T, 3C) is overwritten (every element written); workspace_D holds B * NH * T floats.
// Two runs with the same inputs give the same bits.
void attention_backward(floatX* dqkv, float* workspace_D, const floatX* dout, const floatX* qkv, const floatX* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    attention_backward_preprocess(workspace_D, dout, out, B, T, C, NH, stream);
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        launch_attention_backward<decltype(head_size)::value, false>(dqkv, dqkv + C, workspace_D, dout,
                                                                     AttentionPair{qkv, qkv + C, T, T, 0, 3 * C},
                                                                     lse, B, NH, stream);
    });
}
