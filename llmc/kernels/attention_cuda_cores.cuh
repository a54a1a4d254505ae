/*
Causal attention on the CUDA cores, in fp32: the FP32 build's kernels (the BF16 build runs
llmc/kernels/attention_tensor_cores.cuh). llmc/kernels/attention.cuh states the math, the layouts and the interface;
this file is one way to tile it, with every product a plain loop of fp32 multiply-adds over tiles in shared memory. It
is the exact reference path: no operand is ever rounded below fp32.

Tiling. A block has 128 threads and owns a tile of 32 rows (query rows in the forward and dQ kernels, key
rows in dK/dV). Query and key tiles are the same size, so causality is simple: query tile i needs key tiles
0..i, and only the diagonal tile has masked entries. Rows and keys at or beyond T (the last tile when T is
not a multiple of 32) load as zeros, are masked out of the softmax and are never stored. For a pair of
blocks (ring attention; AttentionPair in llmc/kernels/attention.cuh) the same holds with Tq, Tk and the position
offset: the tile ranges come from the pair, and the mask, applied in every tile, from AttentionPair::sees;
key and value rows (and their dK, dV) are pair.kv_row_stride apart (a qkv buffer's k, v columns or packed).
With grouped-query attention a forward or dQ block belongs to a query head and reads its group's K/V head
(pair.kv_head_of); a dK/dV block belongs to a K/V head and walks the query tiles of each query head of its
group in turn, adding all of them into the same accumulators.

Each step of a kernel is two small matrix products between 32-row tiles staged in shared memory (fp32):
  scores:       a 32 x 32 tile of S (and dP), each entry a dot product of length HS;
  accumulation: output rows += (32 x 32 tile of P or dS) times (32 x HS tile), each thread owning HS/4 dims.
Four threads share a row. In the scores step a thread computes 8 neighbouring entries of its row (columns
8*quarter .. 8*quarter+7); in the accumulation step it owns dims quarter*HS/4 .. (quarter+1)*HS/4 - 1 of the
row's output. Row maxima and sums combine the four threads with __shfl_xor_sync over groups of 4 lanes. The
probabilities P (and dS) go through a 32 x 33 shared tile between the two steps.

Two shared-memory layouts, chosen so that the innermost loops read consecutive words. That lets the CPU
build (where each emulated thread runs its loops on one core) turn them into SIMD loads and fused
multiply-adds with the accumulators in vector registers, and on the GPU it spreads a warp's reads over
distinct banks or makes them broadcasts:
  column tile (HS, 32+1), transposed: element (row r, dim d) at d * 33 + r. The scores step reads the other
      operand from one: for each d the 8 columns of a thread are 8 consecutive floats. In a warp (8 rows x 4
      threads) the 4 threads of a row read 4 different words (in 4 different banks) and the 8 rows read the
      same ones (a broadcast).
  row tile (32, HS+4): row r at r * (HS+4), and within the row each thread's HS/4 dims followed by one pad
      word, so dim d sits at d + d / (HS/4). The accumulation step reads one from a row: the HS/4 dims of a
      thread are consecutive. A warp reads the same row for all its 8 rows (a broadcast), and the pad word
      puts the 4 threads' stretches on different banks (they start (HS/4 + 1) words apart, an odd number);
      without it the 4 stretches would start HS/4 words apart and collide (2-way at HS = 64, 4-way at 128).
      The scores step reads its scalar operand (one word per d) from a row tile too: the 8 rows of a warp
      are (HS+4) words apart, which lands them on 8 different banks.
Which tile is stored in which layout follows from who reads it. The scores step of the backward kernels
runs with the roles of the tiles swapped (the row of a thread is a query in dK/dV and a key in dQ) so that
the tile a block keeps for its whole life is the column operand and every tile is needed in one layout
only; P and dS are then written transposed, read by other warps, and need a __syncthreads. The inner
products are written as plain loops over the tiles; a tensor-core version would replace the two steps by
mma fragments and keep the online-softmax bookkeeping unchanged.

Why nothing T x T exists: each block holds one 32 x 32 tile of scores at a time, and the only per-row
state carried from tile to tile is (m, l, o). Memory is O(T * HS) per head, not O(T^2).


Shared memory per block, with R = 32 * (HS+4) a row tile, K = 33 * HS a column tile and 32 * 33 a score
tile: forward 2R + K + 32*33 floats, dK/dV 2R + 2K + 2*32*33 + 64, dQ 2R + 2K + 32*33. That is above the
default 48 KiB for the forward at HS = 128, dK/dV at HS >= 80 and dQ at HS >= 96; the launchers opt in
(opt_in_shared_memory).
*/
#pragma once

#include "../cuda_common.cuh"

// ----------------------------------------------------------------------------
// tile geometry, shared by all kernels of this file

constexpr int kAttentionTile = 32;                                          // rows per tile (queries or keys)
constexpr int kAttentionThreads = 128;                                      // threads per block
constexpr int kAttentionBlockRows = kAttentionTile;                         // rows a block owns
constexpr int kThreadsPerRow = kAttentionThreads / kAttentionTile;          // 4 threads share a row
constexpr int kScoresPerThread = kAttentionTile / kThreadsPerRow;           // 8 of the row's 32 scores
constexpr int kColumnStride = kAttentionTile + 1;                           // padded row of a column or score tile
constexpr int kScoreTileFloats = kAttentionTile * kColumnStride;            // a 32 x 33 tile of P or dS
static_assert(kThreadsPerRow == 4, "the row reductions below shuffle across groups of 4 lanes");

// row tile (32, HS): HS/4 dims per thread, each thread's stretch followed by one pad word
template <int HS>
__host__ __device__ constexpr int row_tile_stride() { return HS + kThreadsPerRow; }
template <int HS>
__host__ __device__ constexpr int row_tile_floats() { return kAttentionTile * row_tile_stride<HS>(); }
template <int HS>
__device__ __forceinline__ int row_tile_index(int row, int d) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    return row * row_tile_stride<HS>() + d + d / dims_per_thread;
}
// where the stretch of dims of thread `quarter` starts within a row of a row tile
template <int HS>
__device__ __forceinline__ int row_tile_quarter_offset(int quarter) {
    return quarter * (HS / kThreadsPerRow + 1);
}

// column tile (HS, 32): the transpose, element (row, d) at d * 33 + row
template <int HS>
__host__ __device__ constexpr int column_tile_floats() { return HS * kColumnStride; }

enum class TileLayout { Rows, Columns };

// Copies rows first_row .. first_row+31 of a row-major (T, row_stride) floatX matrix (columns 0..HS-1 from
// `source`) into a fp32 shared tile of the given layout; rows at or beyond T become zeros. All threads of
// the block take part. (A warp reads whole rows from global memory, so the loads coalesce; the transposed
// stores of a column tile meet at most 2-way bank conflicts, once per tile.)
template <int HS, TileLayout layout>
__device__ void load_tile_to_shared(float* tile, const floatX* source, size_t row_stride, int first_row, int T) {
    constexpr int chunks_per_row = HS / x128::size;
    const GridStride share = block_stride(kAttentionTile * chunks_per_row);
    for (size_t chunk = share.first; chunk < share.end; chunk += share.step) {
        const int row = (int)chunk / chunks_per_row;
        const int column = ((int)chunk % chunks_per_row) * x128::size;
        const x128 packed = first_row + row < T ? load128(source + (size_t)(first_row + row) * row_stride + column)
                                                : x128::constant((floatX)0.0f);
        if constexpr (layout == TileLayout::Rows) {
            // 4 dims from a multiple of 4 never cross a pad word (HS/4 is a multiple of 4): one index per 4
            for (int group = 0; group < x128::size; group += 4) {
                float* target = tile + row_tile_index<HS>(row, column + group);
                for (int k = 0; k < 4; k++) target[k] = (float)packed[group + k];
            }
        } else {
            for (int k = 0; k < x128::size; k++) tile[(column + k) * kColumnStride + row] = (float)packed[k];
        }
    }
}

// The reverse for a row tile: writes its rows that are below T back to global memory as floatX, or adds
// them to what is there (`accumulate`: the pair backward of ring attention).
template <int HS>
__device__ void store_row_tile_from_shared(floatX* target, size_t row_stride, const float* tile, int first_row,
                                           int T, bool accumulate = false) {
    constexpr int chunks_per_row = HS / x128::size;
    const GridStride share = block_stride(kAttentionTile * chunks_per_row);
    for (size_t chunk = share.first; chunk < share.end; chunk += share.step) {
        const int row = (int)chunk / chunks_per_row;
        const int column = ((int)chunk % chunks_per_row) * x128::size;
        if (first_row + row >= T) continue;
        x128 packed;
        for (int group = 0; group < x128::size; group += 4) {  // as in the load: one index per 4 dims
            const float* source = tile + row_tile_index<HS>(row, column + group);
            for (int k = 0; k < 4; k++) packed[group + k] = (floatX)source[k];
        }
        floatX* destination = target + (size_t)(first_row + row) * row_stride + column;
        if (accumulate) {
            const x128 previous = load128(destination);
            for (int k = 0; k < x128::size; k++) packed[k] = (floatX)((float)previous[k] + (float)packed[k]);
        }
        store128(destination, packed);
    }
}

// The scores step: scores[i] += sum_d rows[row][d] * columns[d][first_column + i] for the 8 columns
// first_column .. first_column+7, with `rows` a row tile and `columns` a column tile. For each d: one
// scalar and 8 consecutive floats.
template <int HS>
__device__ __forceinline__ void add_tile_dot_products(float (&scores)[kScoresPerThread], const float* rows, int row,
                                                      const float* columns, int first_column) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    const float* row_start = rows + row * row_tile_stride<HS>();
    for (int quarter = 0; quarter < kThreadsPerRow; quarter++) {  // dims of each quarter, skipping its pad word
        for (int j = 0; j < dims_per_thread; j++) {
            const int d = quarter * dims_per_thread + j;
            const float a = row_start[row_tile_quarter_offset<HS>(quarter) + j];
            const float* b = columns + d * kColumnStride + first_column;
            for (int i = 0; i < kScoresPerThread; i++) scores[i] += a * b[i];
        }
    }
}

// The same for two products at once (S and dP in the backward kernels): one loop, two independent chains
// of multiply-adds, each summed in the same order as above.
template <int HS>
__device__ __forceinline__ void add_tile_dot_products(float (&scores_a)[kScoresPerThread], const float* rows_a,
                                                      const float* columns_a, float (&scores_b)[kScoresPerThread],
                                                      const float* rows_b, const float* columns_b, int row,
                                                      int first_column) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    const float* row_start_a = rows_a + row * row_tile_stride<HS>();
    const float* row_start_b = rows_b + row * row_tile_stride<HS>();
    for (int quarter = 0; quarter < kThreadsPerRow; quarter++) {
        for (int j = 0; j < dims_per_thread; j++) {
            const int d = quarter * dims_per_thread + j;
            const float a = row_start_a[row_tile_quarter_offset<HS>(quarter) + j];
            const float b = row_start_b[row_tile_quarter_offset<HS>(quarter) + j];
            const float* column_a = columns_a + d * kColumnStride + first_column;
            const float* column_b = columns_b + d * kColumnStride + first_column;
            for (int i = 0; i < kScoresPerThread; i++) {
                scores_a[i] += a * column_a[i];
                scores_b[i] += b * column_b[i];
            }
        }
    }
}

// The accumulation step: accumulator[j] += sum_r weights[row][r] * rows[r][dim j of `quarter`], with
// `weights` a 32 x 33 score tile (P or dS) and `rows` a row tile. For each r: one scalar and HS/4
// consecutive floats.
template <int HS>
__device__ __forceinline__ void add_weighted_rows(float (&accumulator)[HS / kThreadsPerRow], const float* weights,
                                                  int row, const float* rows, int quarter) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    const float* columns_start = rows + row_tile_quarter_offset<HS>(quarter);
    for (int r = 0; r < kAttentionTile; r++) {
        const float w = weights[row * kColumnStride + r];
        const float* b = columns_start + r * row_tile_stride<HS>();
        for (int j = 0; j < dims_per_thread; j++) accumulator[j] += w * b[j];
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
// forward: block (query tile, h, b); online softmax over the key tiles that hold a key visible to a row of
// the tile (0 .. the diagonal for self-attention; llmc/kernels/attention.cuh's AttentionPair in general).
// Blocks are numbered so that the longest ones (last query tiles, most key tiles) start first.
// Thread (row, quarter): query row `row`, keys 8*quarter .. 8*quarter+7 of each key tile, output dims of
// its quarter.

template <int HS>
__global__ void attention_forward_kernel(floatX* out, float* lse, AttentionPair pair, int NH) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                              // row tile: this block's queries; reused for the output
    float* k_tile = q_tile + row_tile_floats<HS>();      // column tile: current keys
    float* v_tile = k_tile + column_tile_floats<HS>();   // row tile: current values
    float* p_tile = v_tile + row_tile_floats<HS>();      // (32, 33) exp(S - m) of the current tile

    const int query_tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;                         // the query head; it reads K/V head h / G
    const int b = blockIdx.z;
    const int C = NH * HS;                            // out's row
    const size_t qkv_row_stride = pair.q_row_stride;  // query rows
    const size_t kv_row_stride = pair.kv_row_stride;  // key and value rows
    const floatX* q_head = pair.q_head(b, h, HS);
    const floatX* k_head = pair.k_head(b, pair.kv_head_of(h), HS);
    const floatX* v_head = k_head + pair.v_offset;
    const int row = threadIdx.x / kThreadsPerRow;        // this thread's query row within the tile
    const int quarter = threadIdx.x % kThreadsPerRow;    // which of the row's 4 threads
    const int first_column = quarter * kScoresPerThread; // its 8 keys within each key tile
    const int first_query = query_tile * kAttentionTile;
    const int query = first_query + row;
    const float scale = 1.0f / sqrtf((float)HS);
    const int key_tiles = ceil_div(pair.keys_seen_by(first_query, kAttentionTile), kAttentionTile);

    // (a tile that sees no key skips the load: its output rows are staged in q_tile without a barrier)
    if (key_tiles > 0) load_tile_to_shared<HS, TileLayout::Rows>(q_tile, q_head, qkv_row_stride, first_query, pair.Tq);

    float o[dims_per_thread];                            // this thread's dims of the row's accumulator
    for (int j = 0; j < dims_per_thread; j++) o[j] = 0.0f;
    float running_max = -INFINITY;                       // m, the same in all 4 threads of the row
    float partial_sum = 0.0f;                            // this thread's share of l (summed over the 4 at the end)

    for (int key_tile = 0; key_tile < key_tiles; key_tile++) {
        const int first_key = key_tile * kAttentionTile;
        load_tile_to_shared<HS, TileLayout::Columns>(k_tile, k_head, kv_row_stride, first_key, pair.Tk);
        load_tile_to_shared<HS, TileLayout::Rows>(v_tile, v_head, kv_row_stride, first_key, pair.Tk);
        __syncthreads();  // the K and V tiles (and, the first time, Q) are complete

        float s[kScoresPerThread];
        for (int i = 0; i < kScoresPerThread; i++) s[i] = 0.0f;
        add_tile_dot_products<HS>(s, q_tile, row, k_tile, first_column);
        float tile_max = -INFINITY;
        for (int i = 0; i < kScoresPerThread; i++) {
            const int key = first_key + first_column + i;
            s[i] = pair.sees(query, key) ? s[i] * scale : -INFINITY;
            tile_max = fmaxf(tile_max, s[i]);
        }
        // A row's visible keys are a prefix starting at key 0, so new_max is finite from the first tile on,
        // except in a row that sees no key at all: it stays -inf, and exponents are taken against 0 instead
        // (every exp is then exp(-inf) = 0, where -inf - -inf would give NaN).
        const float new_max = fmaxf(running_max, row_group_max(tile_max));
        const float shift = new_max == -INFINITY ? 0.0f : new_max;
        const float correction = expf(running_max - shift);   // exp(-inf) = 0 on the first tile
        partial_sum *= correction;
        for (int j = 0; j < dims_per_thread; j++) o[j] *= correction;
        for (int i = 0; i < kScoresPerThread; i++) {
            const float p = expf(s[i] - shift);
            partial_sum += p;
            p_tile[row * kColumnStride + first_column + i] = p;
        }
        running_max = new_max;
        __syncwarp();  // the row's P values come from the 4 threads of the row, all in this warp

        add_weighted_rows<HS>(o, p_tile, row, v_tile, quarter);
        __syncthreads();  // everyone is done with K, V before the next tile overwrites them
    }

    const float row_sum = row_group_sum(partial_sum);
    const bool seen_any = row_sum > 0.0f;                // false: no visible key, out 0 and lse -inf
    const float inverse_sum = seen_any ? 1.0f / row_sum : 0.0f;
    // the Q row was only ever read by this row's threads: stage the output there for coalesced stores
    float* out_row = q_tile + row * row_tile_stride<HS>() + row_tile_quarter_offset<HS>(quarter);
    for (int j = 0; j < dims_per_thread; j++) out_row[j] = o[j] * inverse_sum;
    if (quarter == 0 && query < pair.Tq)
        lse[((size_t)b * NH + h) * pair.Tq + query] = seen_any ? running_max + logf(row_sum) : -INFINITY;
    __syncthreads();  // the whole output tile is staged
    store_row_tile_from_shared<HS>(out + (size_t)b * pair.Tq * C + h * HS, C, q_tile, first_query, pair.Tq);
}

// ----------------------------------------------------------------------------
// backward: dK and dV (D comes from llmc/kernels/attention.cuh's preprocessing kernel). Block (key tile, K/V
// head g, b). For each query head of the group (g G .. g G + G - 1, in that order), query tiles from the
// first query that sees the tile's first key (the diagonal for self-attention) to the end: for each,
// recompute that head's P and dP for the 32 x 32 tile, then dV += P^T dO and dK += dS^T Q (scaled once at
// the end) into the same accumulators: the group sum of the header comment, in a fixed order.
// Scores step, thread (row, quarter): query row `row` of the query tile against keys 8*quarter ..
// 8*quarter+7 of this block (the block's own K and V are the column tiles). Accumulation step: key row
// `row`, dims of its quarter.

template <int HS, bool ACCUMULATE>
__global__ void attention_backward_dkdv_kernel(floatX* dkv_target, const floatX* dout,
                                               AttentionPair pair, const float* lse, const float* D, int NH) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* k_tile = shared;                                  // column tile: this block's keys
    float* v_tile = k_tile + column_tile_floats<HS>();       // column tile: this block's values
    float* q_tile = v_tile + column_tile_floats<HS>();       // row tile: current queries; reused for dK
    float* dout_tile = q_tile + row_tile_floats<HS>();       // row tile: their output gradients; reused for dV
    float* p_tile = dout_tile + row_tile_floats<HS>();       // (32, 33) P^T: row = key, column = query
    float* ds_tile = p_tile + kScoreTileFloats;              // (32, 33) dS^T
    float* lse_tile = ds_tile + kScoreTileFloats;            // (32) lse of the current queries
    float* d_tile = lse_tile + kAttentionTile;               // (32) D of the current queries

    const int key_tile = blockIdx.x;
    const int kv_head = blockIdx.y;                   // g: its query heads are g G .. g G + G - 1
    const int b = blockIdx.z;
    const int C = NH * HS;                            // dout's row
    const size_t qkv_row_stride = pair.q_row_stride;  // query rows
    const size_t kv_row_stride = pair.kv_row_stride;  // key and value rows, and their dK, dV
    const int Tq = pair.Tq, Tk = pair.Tk;
    const floatX* k_head = pair.k_head(b, kv_head, HS);
    const floatX* v_head = k_head + pair.v_offset;
    const int row = threadIdx.x / kThreadsPerRow;        // scores: query row; accumulation: key row
    const int quarter = threadIdx.x % kThreadsPerRow;
    const int first_column = quarter * kScoresPerThread; // scores: this thread's 8 keys within the tile
    const int first_key = key_tile * kAttentionTile;
    const int query_start = pair.first_query_seeing(first_key);
    if (ACCUMULATE && query_start >= Tq) return;         // no query sees these keys: nothing to add
    const float scale = 1.0f / sqrtf((float)HS);

    load_tile_to_shared<HS, TileLayout::Columns>(k_tile, k_head, kv_row_stride, first_key, Tk);
    load_tile_to_shared<HS, TileLayout::Columns>(v_tile, v_head, kv_row_stride, first_key, Tk);

    float dk[dims_per_thread], dv[dims_per_thread];     // key row `row`, this thread's dims
    for (int j = 0; j < dims_per_thread; j++) { dk[j] = 0.0f; dv[j] = 0.0f; }

    for (int h = kv_head * pair.group; h < (kv_head + 1) * pair.group; h++) {
        const floatX* q_head = pair.q_head(b, h, HS);
        const floatX* dout_head = dout + (size_t)b * Tq * C + h * HS;
        const float* lse_head = lse + ((size_t)b * NH + h) * Tq;
        const float* d_head = D + ((size_t)b * NH + h) * Tq;
        for (int first_query = query_start; first_query < Tq; first_query += kAttentionTile) {
            load_tile_to_shared<HS, TileLayout::Rows>(q_tile, q_head, qkv_row_stride, first_query, Tq);
            load_tile_to_shared<HS, TileLayout::Rows>(dout_tile, dout_head, C, first_query, Tq);
            if (threadIdx.x < kAttentionTile) {
                const int query = first_query + threadIdx.x;
                lse_tile[threadIdx.x] = query < Tq ? lse_head[query] : 0.0f;
                d_tile[threadIdx.x] = query < Tq ? d_head[query] : 0.0f;
            }
            __syncthreads();  // Q, dO, lse, D of this query tile (and, the first time, K and V) are complete

            // S and dP of query `row` against keys first_column .. first_column+7
            float s[kScoresPerThread], dp[kScoresPerThread];
            for (int i = 0; i < kScoresPerThread; i++) { s[i] = 0.0f; dp[i] = 0.0f; }
            add_tile_dot_products<HS>(s, q_tile, k_tile, dp, dout_tile, v_tile, row, first_column);
            const int query = first_query + row;
            for (int i = 0; i < kScoresPerThread; i++) {
                const int local_key = first_column + i;
                const float p = pair.sees(query, first_key + local_key) ? expf(s[i] * scale - lse_tile[row]) : 0.0f;
                p_tile[local_key * kColumnStride + row] = p;
                ds_tile[local_key * kColumnStride + row] = p * (dp[i] - d_tile[row]);
            }
            __syncthreads();  // P^T and dS^T are complete (a key row's entries come from all 32 query rows)

            add_weighted_rows<HS>(dv, p_tile, row, dout_tile, quarter);
            add_weighted_rows<HS>(dk, ds_tile, row, q_tile, quarter);
            __syncthreads();  // everyone is done with this Q, dO tile (and P^T, dS^T) before the next overwrites them
        }
    }

    // stage dK and dV in the (now free) Q and dO tiles for coalesced stores
    float* dk_row = q_tile + row * row_tile_stride<HS>() + row_tile_quarter_offset<HS>(quarter);
    float* dv_row = dout_tile + row * row_tile_stride<HS>() + row_tile_quarter_offset<HS>(quarter);
    for (int j = 0; j < dims_per_thread; j++) {
        dk_row[j] = dk[j] * scale;
        dv_row[j] = dv[j];
    }
    __syncthreads();  // the dK and dV tiles are staged
    floatX* dk_head = dkv_target + (size_t)b * Tk * kv_row_stride + kv_head * HS;
    store_row_tile_from_shared<HS>(dk_head, kv_row_stride, q_tile, first_key, Tk, ACCUMULATE);
    store_row_tile_from_shared<HS>(dk_head + pair.v_offset, kv_row_stride, dout_tile, first_key, Tk, ACCUMULATE);
}

// ----------------------------------------------------------------------------
// backward: dQ. Block (query tile, query head h, b), reading K/V head h / G. Key tiles from the start to
// the last one a row of the tile sees (the diagonal for self-attention): recompute P and dP, then
// dQ += dS K (scaled once at the end).
// Scores step, thread (row, quarter): key row `row` of the key tile against queries 8*quarter ..
// 8*quarter+7 of this block (the block's own Q and dO are the column tiles). Accumulation step: query row
// `row`, dims of its quarter.

template <int HS, bool ACCUMULATE>
__global__ void attention_backward_dq_kernel(floatX* dq_target, const floatX* dout,
                                             AttentionPair pair, const float* lse, const float* D, int NH) {
    constexpr int dims_per_thread = HS / kThreadsPerRow;
    DYNAMIC_SHARED(float, shared);
    float* q_tile = shared;                                  // column tile: this block's queries
    float* dout_tile = q_tile + column_tile_floats<HS>();    // column tile: their output gradients
    float* k_tile = dout_tile + column_tile_floats<HS>();    // row tile: current keys; reused for dQ
    float* v_tile = k_tile + row_tile_floats<HS>();          // row tile: current values
    float* ds_tile = v_tile + row_tile_floats<HS>();         // (32, 33) dS: row = query, column = key

    const int query_tile = gridDim.x - 1 - blockIdx.x;       // longest blocks first
    const int h = blockIdx.y;
    const int b = blockIdx.z;
    const int C = NH * HS;                            // dout's row
    const size_t qkv_row_stride = pair.q_row_stride;  // query rows, and their dQ
    const size_t kv_row_stride = pair.kv_row_stride;  // key and value rows
    const int Tq = pair.Tq, Tk = pair.Tk;
    const floatX* q_head = pair.q_head(b, h, HS);
    const floatX* k_head = pair.k_head(b, pair.kv_head_of(h), HS);
    const floatX* v_head = k_head + pair.v_offset;
    const floatX* dout_head = dout + (size_t)b * Tq * C + h * HS;
    const int row = threadIdx.x / kThreadsPerRow;        // scores: key row; accumulation: query row
    const int quarter = threadIdx.x % kThreadsPerRow;
    const int first_column = quarter * kScoresPerThread; // scores: this thread's 8 queries within the tile
    const int first_query = query_tile * kAttentionTile;
    const int key_tiles = ceil_div(pair.keys_seen_by(first_query, kAttentionTile), kAttentionTile);
    if (ACCUMULATE && key_tiles == 0) return;            // no row of the tile sees a key: nothing to add
    const float scale = 1.0f / sqrtf((float)HS);

    // lse and D of this thread's 8 queries, fixed for the whole block
    float query_lse[kScoresPerThread], query_d[kScoresPerThread];
    for (int i = 0; i < kScoresPerThread; i++) {
        const int query = first_query + first_column + i;
        query_lse[i] = query < Tq ? lse[((size_t)b * NH + h) * Tq + query] : 0.0f;
        query_d[i] = query < Tq ? D[((size_t)b * NH + h) * Tq + query] : 0.0f;
    }

    load_tile_to_shared<HS, TileLayout::Columns>(q_tile, q_head, qkv_row_stride, first_query, Tq);
    load_tile_to_shared<HS, TileLayout::Columns>(dout_tile, dout_head, C, first_query, Tq);

    float dq[dims_per_thread];                           // query row `row`, this thread's dims
    for (int j = 0; j < dims_per_thread; j++) dq[j] = 0.0f;

    for (int key_tile = 0; key_tile < key_tiles; key_tile++) {
        const int first_key = key_tile * kAttentionTile;
        load_tile_to_shared<HS, TileLayout::Rows>(k_tile, k_head, kv_row_stride, first_key, Tk);
        load_tile_to_shared<HS, TileLayout::Rows>(v_tile, v_head, kv_row_stride, first_key, Tk);
        __syncthreads();  // K and V of this key tile (and, the first time, Q and dO) are complete

        // S and dP of queries first_column .. first_column+7 against key `row`
        float s[kScoresPerThread], dp[kScoresPerThread];
        for (int i = 0; i < kScoresPerThread; i++) { s[i] = 0.0f; dp[i] = 0.0f; }
        add_tile_dot_products<HS>(s, k_tile, q_tile, dp, v_tile, dout_tile, row, first_column);
        const int key = first_key + row;
        for (int i = 0; i < kScoresPerThread; i++) {
            const int local_query = first_column + i;
            const int query = first_query + local_query;
            const float p = pair.sees(query, key) ? expf(s[i] * scale - query_lse[i]) : 0.0f;
            ds_tile[local_query * kColumnStride + row] = p * (dp[i] - query_d[i]);
        }
        __syncthreads();  // dS is complete (a query row's entries come from all 32 key rows)

        add_weighted_rows<HS>(dq, ds_tile, row, k_tile, quarter);
        __syncthreads();  // everyone is done with K, V (and dS) before the next tile overwrites them
    }

    // stage dQ in the (now free) K tile for coalesced stores
    float* dq_row = k_tile + row * row_tile_stride<HS>() + row_tile_quarter_offset<HS>(quarter);
    for (int j = 0; j < dims_per_thread; j++) dq_row[j] = dq[j] * scale;
    __syncthreads();  // the dQ tile is staged
    store_row_tile_from_shared<HS>(dq_target + (size_t)b * Tq * qkv_row_stride + h * HS, qkv_row_stride, k_tile,
                                   first_query, Tq, ACCUMULATE);
}

// ----------------------------------------------------------------------------
// shared memory per block for one head size, which the launchers in llmc/kernels/attention.cuh opt in to

template <int HS>
size_t attention_forward_shared_bytes() {
    return sizeof(float) * (2 * row_tile_floats<HS>() + column_tile_floats<HS>() + kScoreTileFloats);
}
template <int HS>
size_t attention_dkdv_shared_bytes() {
    return sizeof(float) * (2 * row_tile_floats<HS>() + 2 * column_tile_floats<HS>() + 2 * kScoreTileFloats +
                            2 * kAttentionTile);
}
template <int HS>
size_t attention_dq_shared_bytes() {
    return sizeof(float) * (2 * row_tile_floats<HS>() + 2 * column_tile_floats<HS>() + kScoreTileFloats);
}
