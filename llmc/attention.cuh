/*
Causal multi-head self-attention, fused: forward and backward without ever forming the T x T matrix.

Layouts (the matmuls around attention produce and consume these directly, so there are no permute kernels):
  qkv   (B, T, 3C)   the QKV projection's output: q in columns [0, C), k in [C, 2C), v in [2C, 3C);
                     head h owns columns [h*HS, (h+1)*HS) of each part (C = NH * HS)
  out   (B, T, C)    head h's output in columns [h*HS, (h+1)*HS), ready for the output projection
  lse   (B, NH, T)   fp32 log-sum-exp of each row of scaled, masked scores (natural log); the backward pass
                     needs it, and so does ring attention, which merges partial results from several key blocks
  dout  (B, T, C)    gradient of the loss with respect to out
  dqkv  (B, T, 3C)   gradient with respect to qkv, same layout; OVERWRITTEN (not accumulated): qkv is an
                     activation, not a parameter, so there is nothing to accumulate into

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

Tiling. A block has 128 threads and owns a tile of 32 rows (query rows in the forward and dQ kernels, key
rows in dK/dV). Four threads share one row: each computes 8 of the 32 scores of the row against the other
tile (columns quarter, quarter+4, ...) and owns HS/4 of the row's output dimensions (d = quarter, quarter+4,
..., interleaved so the four threads read neighbouring shared-memory words). Row maxima and sums combine the
four threads with __shfl_xor_sync over groups of 4 lanes. The probabilities P (and dS) go through a 32 x 33
shared tile so that each thread can then multiply a full row of P by its columns of V. Query and key tiles
are the same size, so causality is simple: query tile i needs key tiles 0..i, and only the diagonal tile
has masked entries. Rows and keys at or beyond T (the last tile when T is not a multiple of 32) load as
zeros, are masked out of the softmax and are never stored. Tiles are staged in shared memory as fp32 with
rows padded to HS+1 words (no bank conflicts between the 8 rows a warp reads). The inner products are
written as plain loops over the tiles; a tensor-core version would replace those two loops (scores and
P*V) by mma fragments and keep the online-softmax bookkeeping unchanged.

Why nothing T x T exists: each block holds one 32 x 32 tile of scores at a time, and the only per-row
state carried from tile to tile is (m, l, o). Memory is O(T * HS) per head, not O(T^2).

Workspace: the backward pass needs B * NH * T floats (the D values), passed as workspace_D.
Shared memory per block: forward (3 * 32 * (HS+1) + 32 * 33) floats, dK/dV (4 * 32 * (HS+1) + 2 * 32 * 33
+ 64) floats, dQ (4 * 32 * (HS+1) + 32 * 33) floats. That is above the default 48 KiB for the forward at
HS = 128, dK/dV at HS >= 80 and dQ at HS >= 96; the launchers ask for it once per kernel.
Supported head sizes: multiples of 16 from 16 to 128 (the kernels are templates on HS; the launchers
dispatch at run time and refuse anything else). Any T >= 1.
*/
#pragma once

#include <type_traits>
#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// tile geometry, shared by all kernels of this file

constexpr int kAttentionTile = 32;                                          // rows per tile (queries or keys)
constexpr int kAttentionThreads = 128;                                      // threads per block
constexpr int kThreadsPerRow = kAttentionThreads / kAttentionTile;          // 4 threads share a row
constexpr int kScoresPerThread = kAttentionTile / kThreadsPerRow;           // 8 of the row's 32 scores
constexpr int kScoreTileStride = kAttentionTile + 1;                        // padded row of a P or dS tile
static_assert(kThreadsPerRow == 4, "the row reductions below shuffle across groups of 4 lanes");

// shared-memory row stride of a (32, HS) tile: one word of padding moves consecutive rows to different banks
template <int HS>
__host__ __device__ constexpr int tile_stride() { return HS + 1; }

// Copies rows first_row .. first_row+31 of a row-major (T, row_stride) floatX matrix (columns 0..HS-1 from
// `source`) into a fp32 shared tile; rows at or beyond T become zeros. All threads of the block take part.
template <int HS>
__device__ void load_tile_to_shared(float* tile, const floatX* source, size_t row_stride, int first_row, int T) {
    constexpr int chunks_per_row = HS / x128::size;
    for (int chunk = threadIdx.x; chunk < kAttentionTile * chunks_per_row; chunk += blockDim.x) {
        const int row = chunk / chunks_per_row;
        const int column = (chunk % chunks_per_row) * x128::size;
        float* target = tile + row * tile_stride<HS>() + column;
        if (first_row + row < T) {
            x128 packed = load128(source + (size_t)(first_row + row) * row_stride + column);
            for (int k = 0; k < x128::size; k++) target[k] = (float)packed[k];
        } else {
            for (int k = 0; k < x128::size; k++) target[k] = 0.0f;
        }
    }
}

// The reverse: writes the tile's rows that are below T back to global memory as floatX.
template <int HS>
__device__ void store_tile_from_shared(floatX* target, size_t row_stride, const float* tile, int first_row, int T) {
    constexpr int chunks_per_row = HS / x128::size;
    for (int chunk = threadIdx.x; chunk < kAttentionTile * chunks_per_row; chunk += blockDim.x) {
        const int row = chunk / chunks_per_row;
        const int column = (chunk % chunks_per_row) * x128::size;
        if (first_row + row >= T) continue;
        const float* source = tile + row * tile_stride<HS>() + column;
        x128 packed;
        for (int k = 0; k < x128::size; k++) packed[k] = (floatX)source[k];
        store128(target + (size_t)(first_row + row) * row_stride + column, packed);
    }
}

// Sum and maximum over the 4 threads that share a row (lanes 4r .. 4r+3 of a warp).
__device__ __forceinline__ float row_group_sum(float value) {
    value += __shfl_xor_sync(0xffffffff, value, 1, kThreadsPerRow);
    value += __shfl_xor_sync(0xffffffff, value, 2, kThreadsPerRow);
    return value;
}
__device__ __forceinline__ float row_group_max(float value) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, 1, kThreadsPerRow));
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, 2, kThreadsPerRow));
    return value;
}

// ----------------------------------------------------------------------------
// forward: block (query tile, h, b); online softmax over the key tiles 0 .. query tile.
// Blocks are numbered so that the longest ones (last query tiles, most key tiles) start first.

template <int HS>
__global__ void attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int NH) {
    constexpr int stride = tile_stride<HS>();
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                              // (32, HS) this block's queries; reused for the output
    float* k_tile = q_tile + kAttentionTile * stride;    // (32, HS) current keys
    float* v_tile = k_tile + kAttentionTile * stride;    // (32, HS) current values
    float* p_tile = v_tile + kAttentionTile * stride;    // (32, 33) exp(S - m) of the current tile

    const int query_tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int C = NH * HS;
    const size_t qkv_row_stride = 3 * (size_t)C;
    const floatX* q_head = qkv + (size_t)b * T * qkv_row_stride + h * HS;
    const floatX* k_head = q_head + C;
    const floatX* v_head = q_head + 2 * C;
    const int row = threadIdx.x / kThreadsPerRow;        // this thread's query row within the tile
    const int quarter = threadIdx.x % kThreadsPerRow;    // which of the row's 4 threads
    const int first_query = query_tile * kAttentionTile;
    const int query = first_query + row;
    const float scale = 1.0f / sqrtf((float)HS);

    load_tile_to_shared<HS>(q_tile, q_head, qkv_row_stride, first_query, T);

    float o[dims_per_thread];                            // dims quarter, quarter+4, ... of the row's accumulator
    for (int j = 0; j < dims_per_thread; j++) o[j] = 0.0f;
    float running_max = -INFINITY;                       // m, the same in all 4 threads of the row
    float partial_sum = 0.0f;                            // this thread's share of l (summed over the 4 at the end)

    for (int key_tile = 0; key_tile <= query_tile; key_tile++) {
        const int first_key = key_tile * kAttentionTile;
        load_tile_to_shared<HS>(k_tile, k_head, qkv_row_stride, first_key, T);
        load_tile_to_shared<HS>(v_tile, v_head, qkv_row_stride, first_key, T);
        __syncthreads();  // the K and V tiles (and, the first time, Q) are complete

        // scores against keys quarter, quarter+4, ..., quarter+28 of the tile
        float s[kScoresPerThread];
        for (int i = 0; i < kScoresPerThread; i++) s[i] = 0.0f;
        for (int d = 0; d < HS; d++) {
            const float q = q_tile[row * stride + d];
            for (int i = 0; i < kScoresPerThread; i++) s[i] += q * k_tile[(quarter + kThreadsPerRow * i) * stride + d];
        }
        float tile_max = -INFINITY;
        for (int i = 0; i < kScoresPerThread; i++) {
            const int key = first_key + quarter + kThreadsPerRow * i;
            s[i] = (key <= query && key < T) ? s[i] * scale : -INFINITY;
            tile_max = fmaxf(tile_max, s[i]);
        }
        // key first_key <= query is never masked, so new_max is finite from the first tile on
        const float new_max = fmaxf(running_max, row_group_max(tile_max));
        const float correction = expf(running_max - new_max);   // exp(-inf) = 0 on the first tile
        partial_sum *= correction;
        for (int j = 0; j < dims_per_thread; j++) o[j] *= correction;
        for (int i = 0; i < kScoresPerThread; i++) {
            const float p = expf(s[i] - new_max);
            partial_sum += p;
            p_tile[row * kScoreTileStride + quarter + kThreadsPerRow * i] = p;
        }
        running_max = new_max;
        __syncwarp();  // the row's P values come from the 4 threads of the row, all in this warp

        for (int key = 0; key < kAttentionTile; key++) {
            const float p = p_tile[row * kScoreTileStride + key];
            for (int j = 0; j < dims_per_thread; j++) o[j] += p * v_tile[key * stride + quarter + kThreadsPerRow * j];
        }
        __syncthreads();  // everyone is done with K, V before the next tile overwrites them
    }

    const float row_sum = row_group_sum(partial_sum);
    const float inverse_sum = 1.0f / row_sum;
    // the Q row was only ever read by this row's threads: stage the output there for coalesced stores
    for (int j = 0; j < dims_per_thread; j++) q_tile[row * stride + quarter + kThreadsPerRow * j] = o[j] * inverse_sum;
    if (quarter == 0 && query < T) lse[((size_t)b * NH + h) * T + query] = running_max + logf(row_sum);
    __syncthreads();  // the whole output tile is staged
    store_tile_from_shared<HS>(out + (size_t)b * T * C + h * HS, C, q_tile, first_query, T);
}

// ----------------------------------------------------------------------------
// backward, step 1: D[b][h][t] = dout[b][t][head h] . out[b][t][head h]. One thread per (b, h, t) row,
// grid-stride loop.

__global__ void attention_backward_preprocess_kernel(float* D, const floatX* dout, const floatX* out,
                                                     int B, int T, int NH, int HS) {
    const int C = NH * HS;
    const long long rows = (long long)B * NH * T;
    for (long long index = blockIdx.x * (long long)blockDim.x + threadIdx.x; index < rows;
         index += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(index % T);
        const int h = (int)((index / T) % NH);
        const int b = (int)(index / ((long long)T * NH));
        const size_t offset = ((size_t)b * T + t) * C + (size_t)h * HS;
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
// backward, step 2: dK and dV. Block (key tile, h, b); the 4 threads of a key row own HS/4 dims of dK and
// dV of that key. Query tiles from the diagonal to the end: for each, recompute P^T and dP^T for the
// 32 x 32 tile, then dV += P^T dO and dK += dS^T Q (scaled once at the end).

template <int HS>
__global__ void attention_backward_dkdv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                               const float* lse, const float* D, int T, int NH) {
    constexpr int stride = tile_stride<HS>();
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* k_tile = shared;                                  // (32, HS) this block's keys; reused for dK
    float* v_tile = k_tile + kAttentionTile * stride;        // (32, HS) this block's values; reused for dV
    float* q_tile = v_tile + kAttentionTile * stride;        // (32, HS) current queries
    float* dout_tile = q_tile + kAttentionTile * stride;     // (32, HS) their output gradients
    float* p_tile = dout_tile + kAttentionTile * stride;     // (32, 33) P^T: row = key, column = query
    float* ds_tile = p_tile + kAttentionTile * kScoreTileStride;     // (32, 33) dS^T
    float* lse_tile = ds_tile + kAttentionTile * kScoreTileStride;   // (32) lse of the current queries
    float* d_tile = lse_tile + kAttentionTile;                       // (32) D of the current queries

    const int key_tile = blockIdx.x;
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int C = NH * HS;
    const size_t qkv_row_stride = 3 * (size_t)C;
    const floatX* q_head = qkv + (size_t)b * T * qkv_row_stride + h * HS;
    const floatX* k_head = q_head + C;
    const floatX* v_head = q_head + 2 * C;
    const floatX* dout_head = dout + (size_t)b * T * C + h * HS;
    const float* lse_head = lse + ((size_t)b * NH + h) * T;
    const float* d_head = D + ((size_t)b * NH + h) * T;
    const int row = threadIdx.x / kThreadsPerRow;        // this thread's key row within the tile
    const int quarter = threadIdx.x % kThreadsPerRow;
    const int first_key = key_tile * kAttentionTile;
    const int key = first_key + row;
    const int num_tiles = ceil_div(T, kAttentionTile);
    const float scale = 1.0f / sqrtf((float)HS);

    load_tile_to_shared<HS>(k_tile, k_head, qkv_row_stride, first_key, T);
    load_tile_to_shared<HS>(v_tile, v_head, qkv_row_stride, first_key, T);

    float dk[dims_per_thread], dv[dims_per_thread];
    for (int j = 0; j < dims_per_thread; j++) { dk[j] = 0.0f; dv[j] = 0.0f; }

    for (int query_tile = key_tile; query_tile < num_tiles; query_tile++) {
        const int first_query = query_tile * kAttentionTile;
        load_tile_to_shared<HS>(q_tile, q_head, qkv_row_stride, first_query, T);
        load_tile_to_shared<HS>(dout_tile, dout_head, C, first_query, T);
        if (threadIdx.x < kAttentionTile) {
            const int query = first_query + threadIdx.x;
            lse_tile[threadIdx.x] = query < T ? lse_head[query] : 0.0f;
            d_tile[threadIdx.x] = query < T ? d_head[query] : 0.0f;
        }
        __syncthreads();  // Q, dO, lse, D of this query tile (and, the first time, K and V) are complete

        // S^T and dP^T for queries quarter, quarter+4, ... against this thread's key
        float s[kScoresPerThread], dp[kScoresPerThread];
        for (int i = 0; i < kScoresPerThread; i++) { s[i] = 0.0f; dp[i] = 0.0f; }
        for (int d = 0; d < HS; d++) {
            const float k = k_tile[row * stride + d];
            const float v = v_tile[row * stride + d];
            for (int i = 0; i < kScoresPerThread; i++) {
                const int column = (quarter + kThreadsPerRow * i) * stride + d;
                s[i] += k * q_tile[column];
                dp[i] += v * dout_tile[column];
            }
        }
        for (int i = 0; i < kScoresPerThread; i++) {
            const int local_query = quarter + kThreadsPerRow * i;
            const int query = first_query + local_query;
            const bool visible = key <= query && query < T;
            const float p = visible ? expf(s[i] * scale - lse_tile[local_query]) : 0.0f;
            p_tile[row * kScoreTileStride + local_query] = p;
            ds_tile[row * kScoreTileStride + local_query] = p * (dp[i] - d_tile[local_query]);
        }
        __syncwarp();  // the key row's P^T and dS^T come from the 4 threads of the row, all in this warp

        for (int local_query = 0; local_query < kAttentionTile; local_query++) {
            const float p = p_tile[row * kScoreTileStride + local_query];
            const float ds = ds_tile[row * kScoreTileStride + local_query];
            for (int j = 0; j < dims_per_thread; j++) {
                const int column = local_query * stride + quarter + kThreadsPerRow * j;
                dv[j] += p * dout_tile[column];
                dk[j] += ds * q_tile[column];
            }
        }
        __syncthreads();  // everyone is done with this Q, dO tile before the next one overwrites it
    }

    // the K and V rows were only read by this row's threads: stage dK and dV there for coalesced stores
    for (int j = 0; j < dims_per_thread; j++) {
        k_tile[row * stride + quarter + kThreadsPerRow * j] = dk[j] * scale;
        v_tile[row * stride + quarter + kThreadsPerRow * j] = dv[j];
    }
    __syncthreads();  // the dK and dV tiles are staged
    floatX* dqkv_head = dqkv + (size_t)b * T * qkv_row_stride + h * HS;
    store_tile_from_shared<HS>(dqkv_head + C, qkv_row_stride, k_tile, first_key, T);
    store_tile_from_shared<HS>(dqkv_head + 2 * C, qkv_row_stride, v_tile, first_key, T);
}

// ----------------------------------------------------------------------------
// backward, step 3: dQ. Block (query tile, h, b); the 4 threads of a query row own HS/4 dims of dQ.
// Key tiles from the start to the diagonal: recompute P and dP, then dQ += dS K (scaled once at the end).

template <int HS>
__global__ void attention_backward_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                             const float* lse, const float* D, int T, int NH) {
    constexpr int stride = tile_stride<HS>();
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                                  // (32, HS) this block's queries; reused for dQ
    float* dout_tile = q_tile + kAttentionTile * stride;     // (32, HS) their output gradients
    float* k_tile = dout_tile + kAttentionTile * stride;     // (32, HS) current keys
    float* v_tile = k_tile + kAttentionTile * stride;        // (32, HS) current values
    float* ds_tile = v_tile + kAttentionTile * stride;       // (32, 33) dS: row = query, column = key

    const int query_tile = gridDim.x - 1 - blockIdx.x;       // longest blocks first
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int C = NH * HS;
    const size_t qkv_row_stride = 3 * (size_t)C;
    const floatX* q_head = qkv + (size_t)b * T * qkv_row_stride + h * HS;
    const floatX* k_head = q_head + C;
    const floatX* v_head = q_head + 2 * C;
    const floatX* dout_head = dout + (size_t)b * T * C + h * HS;
    const int row = threadIdx.x / kThreadsPerRow;        // this thread's query row within the tile
    const int quarter = threadIdx.x % kThreadsPerRow;
    const int first_query = query_tile * kAttentionTile;
    const int query = first_query + row;
    const float scale = 1.0f / sqrtf((float)HS);
    const float row_lse = query < T ? lse[((size_t)b * NH + h) * T + query] : 0.0f;
    const float row_d = query < T ? D[((size_t)b * NH + h) * T + query] : 0.0f;

    load_tile_to_shared<HS>(q_tile, q_head, qkv_row_stride, first_query, T);
    load_tile_to_shared<HS>(dout_tile, dout_head, C, first_query, T);

    float dq[dims_per_thread];
    for (int j = 0; j < dims_per_thread; j++) dq[j] = 0.0f;

    for (int key_tile = 0; key_tile <= query_tile; key_tile++) {
        const int first_key = key_tile * kAttentionTile;
        load_tile_to_shared<HS>(k_tile, k_head, qkv_row_stride, first_key, T);
        load_tile_to_shared<HS>(v_tile, v_head, qkv_row_stride, first_key, T);
        __syncthreads();  // K and V of this key tile (and, the first time, Q and dO) are complete

        float s[kScoresPerThread], dp[kScoresPerThread];
        for (int i = 0; i < kScoresPerThread; i++) { s[i] = 0.0f; dp[i] = 0.0f; }
        for (int d = 0; d < HS; d++) {
            const float q = q_tile[row * stride + d];
            const float g = dout_tile[row * stride + d];
            for (int i = 0; i < kScoresPerThread; i++) {
                const int column = (quarter + kThreadsPerRow * i) * stride + d;
                s[i] += q * k_tile[column];
                dp[i] += g * v_tile[column];
            }
        }
        for (int i = 0; i < kScoresPerThread; i++) {
            const int local_key = quarter + kThreadsPerRow * i;
            const int key = first_key + local_key;
            const bool visible = key <= query && query < T;
            const float p = visible ? expf(s[i] * scale - row_lse) : 0.0f;
            ds_tile[row * kScoreTileStride + local_key] = p * (dp[i] - row_d);
        }
        __syncwarp();  // the row's dS comes from the 4 threads of the row, all in this warp

        for (int local_key = 0; local_key < kAttentionTile; local_key++) {
            const float ds = ds_tile[row * kScoreTileStride + local_key];
            for (int j = 0; j < dims_per_thread; j++) dq[j] += ds * k_tile[local_key * stride + quarter + kThreadsPerRow * j];
        }
        __syncthreads();  // everyone is done with K, V before the next tile overwrites them
    }

    for (int j = 0; j < dims_per_thread; j++) q_tile[row * stride + quarter + kThreadsPerRow * j] = dq[j] * scale;
    __syncthreads();  // the dQ tile is staged
    store_tile_from_shared<HS>(dqkv + (size_t)b * T * qkv_row_stride + h * HS, qkv_row_stride, q_tile, first_query, T);
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
    return C / NH;
}

template <int HS>
size_t attention_forward_shared_bytes() {
    return sizeof(float) * (3 * kAttentionTile * tile_stride<HS>() + kAttentionTile * kScoreTileStride);
}
template <int HS>
size_t attention_dkdv_shared_bytes() {
    return sizeof(float) * (4 * kAttentionTile * tile_stride<HS>() + 2 * kAttentionTile * kScoreTileStride +
                            2 * kAttentionTile);
}
template <int HS>
size_t attention_dq_shared_bytes() {
    return sizeof(float) * (4 * kAttentionTile * tile_stride<HS>() + kAttentionTile * kScoreTileStride);
}

// out (B, T, C) and lse (B, NH, T) are overwritten.
void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
    const int HS = attention_head_size(C, NH);
    dispatch_attention_head_size(HS, [&](auto head_size) {
        constexpr int hs = decltype(head_size)::value;
        const size_t shared_bytes = attention_forward_shared_bytes<hs>();
        static bool large_shared_allowed = false;  // one of these per head size
        if (shared_bytes > 48 * 1024 && !large_shared_allowed) {
            allow_large_shared_memory(attention_forward_kernel<hs>, shared_bytes);
            large_shared_allowed = true;
        }
        const dim3 grid(ceil_div(T, kAttentionTile), NH, B);
        launch(attention_forward_kernel<hs>, grid, dim3(kAttentionThreads), shared_bytes, stream, out, lse, qkv, T, NH);
    });
}

// dqkv (B, T, 3C) is overwritten (every element written); workspace_D holds B * NH * T floats.
// Two runs with the same inputs give the same bits.
void attention_backward(floatX* dqkv, float* workspace_D, const floatX* dout, const floatX* qkv, const floatX* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    const int HS = attention_head_size(C, NH);
    dispatch_attention_head_size(HS, [&](auto head_size) {
        constexpr int hs = decltype(head_size)::value;
        const int block_size = 256;
        launch(attention_backward_preprocess_kernel, grid_size_for((long long)B * NH * T, block_size), block_size, 0,
               stream, workspace_D, dout, out, B, T, NH, hs);

        const size_t dkdv_bytes = attention_dkdv_shared_bytes<hs>();
        const size_t dq_bytes = attention_dq_shared_bytes<hs>();
        static bool large_shared_allowed = false;  // one of these per head size
        if (!large_shared_allowed) {
            if (dkdv_bytes > 48 * 1024) allow_large_shared_memory(attention_backward_dkdv_kernel<hs>, dkdv_bytes);
            if (dq_bytes > 48 * 1024) allow_large_shared_memory(attention_backward_dq_kernel<hs>, dq_bytes);
            large_shared_allowed = true;
        }
        const dim3 grid(ceil_div(T, kAttentionTile), NH, B);
        launch(attention_backward_dkdv_kernel<hs>, grid, dim3(kAttentionThreads), dkdv_bytes, stream,
               dqkv, dout, qkv, lse, workspace_D, T, NH);
        launch(attention_backward_dq_kernel<hs>, grid, dim3(kAttentionThreads), dq_bytes, stream,
               dqkv, dout, qkv, lse, workspace_D, T, NH);
    });
}
