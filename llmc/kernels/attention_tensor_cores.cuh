/*
Causal attention on tensor cores: the BF16 build's kernels for the math in llmc/kernels/attention.cuh (which also
holds the layouts and the launchers' interface). FlashAttention-2's scheme, written for mma.sync m16n8k16
(llmc/kernels/mma.cuh draws its fragments): every product of two tiles is a grid of 16 x 8 x 16 tensor-core
multiplies with bf16 operands and fp32 accumulation, and everything between the products (masking, the
online softmax, dS = P * (dP - D)) happens on the fp32 accumulator fragments in registers.

Work split. A block is 4 warps and owns 64 rows (queries in the forward and dQ kernels, keys in dK/dV); each
warp owns 16 of them, which is exactly the row count of an mma tile, so a warp never needs another warp's
scores: the softmax statistics of a row live in the 4 lanes that hold it (lanes 4g .. 4g+3 hold rows g and
g+8 of the warp's 16) and combine with two shuffles. The block streams the other operand (keys and values,
or queries and output gradients) through shared memory in steps, double-buffered with cp.async: the copy
of step i+1 is in flight while step i is multiplied.

The products, for one warp (16 rows) and one step of S keys (S = 64 in the forward, 32 in the backward):
    forward  S  = Q K^T        (16 x S)   A = Q (kept in registers), B = K   (rows = keys: ldmatrix)
             O += P V          (16 x HS)  A = P (the S accumulators, repacked), B = V (ldmatrix .trans)
    dK/dV    S^T  = K Q^T, dP^T = V dO^T  (16 keys x 32 queries): A = K, V rows of the warp, B = Q, dO
             dV += P^T dO,  dK += dS^T Q  A = P^T, dS^T repacked, B = dO, Q (ldmatrix .trans)
    dQ       S = Q K^T, dP = dO V^T       A = Q, dO (kept in registers), B = K, V
             dQ += dS K                   A = dS repacked, B = K (ldmatrix .trans)
The repacking is what keeps P in registers: the accumulators of two neighbouring 16 x 8 score tiles hold,
lane by lane, exactly the elements that the A fragment of one 16 x 16 tile wants (rows g and g+8, columns
2t, 2t+1 of each half), so P becomes the next product's left operand by rounding pairs of floats to bf16.
Whether B is read straight or transposed follows from the product: a B operand is K x N "column-major",
i.e. N rows of K contiguous elements. K in Q K^T is stored that way (key rows, dims contiguous), so plain
ldmatrix delivers it; V in P V is stored K x N row-major (key rows again, but now the keys are the K
dimension), so ldmatrix .trans delivers it.

Precision: the operands of every mma are bf16 (Q, K, V, dO as stored; P and dS rounded from fp32 before their
product), all sums fp32. P's normaliser l and the statistics m, lse, D stay fp32. Rounding P costs up to 2^-9
relative per term, the same order as storing the output in bf16.

Pairs of blocks (ring attention): every kernel takes an AttentionPair (llmc/kernels/attention.cuh), so queries and
keys may come from different buffers at a position offset, with key and value rows (and their dK, dV)
pair.kv_row_stride apart (a qkv buffer's k, v columns or packed k, v rows); the step ranges come from the
pair (entirely masked steps are never visited) and the mask, applied in every step, from
AttentionPair::sees. Grouped-query attention only changes which heads a block reads: the forward and dQ
blocks belong to a query head and read the K/V head of its group (pair.kv_head_of), a dK/dV block belongs to a
K/V head and runs the query steps of its group's query heads one head after another (v sits pair.v_offset
after k, in the keys and in their gradients). The dK/dV and dQ kernels can add to their target instead of
overwriting it: the staged bf16 result and the target's value are summed in fp32 at the store (two
roundings per accumulation, the price of keeping the accumulators' register budget, hence occupancy,
exactly as in the overwriting case).

Scores are kept in log2 units: s * log2(e) / sqrt(HS), so each exponential is one exp2 (a single instruction
on the GPU); lse is converted back to the natural log on the way out and in.

Shared memory rows are HS + 8 bf16 long: the 16 pad bytes shift consecutive rows by 4 banks, so the 8 rows an
ldmatrix reads at once (16 bytes each) fall on 32 different banks. Per block, in rows of HS + 8 bf16:
forward 64 (Q) + 2 x 64 (K) + 2 x 64 (V); dK/dV 64 (K) + 64 (V) + 2 x 32 (Q) + 2 x 32 (dO) plus 2 x 32 lse and
D floats; dQ 64 (Q) + 64 (dO) + 2 x 32 (K) + 2 x 32 (V). At HS = 128 that is 85, 69 and 68 KiB: the launchers
opt in (opt_in_shared_memory).
*/
#pragma once

#include "../cuda_common.cuh"
#include "mma.cuh"

static_assert(sizeof(floatX) == 2, "the tensor-core attention takes bf16 operands (the FP32 build uses "
                                   "llmc/kernels/attention_cuda_cores.cuh)");

// ----------------------------------------------------------------------------
// geometry

constexpr int kMmaAttentionWarps = 4;
constexpr int kAttentionThreads = kMmaAttentionWarps * 32;    // threads per block
constexpr int kAttentionBlockRows = kMmaAttentionWarps * 16;  // rows a block owns: 16 per warp
constexpr int kForwardKeyStep = 64;                           // keys per step of the forward pass
constexpr int kBackwardStep = 32;                             // queries (dK/dV) or keys (dQ) per backward step
constexpr float kLog2e = 1.4426950408889634f;

// bf16 elements per row of a shared tile
template <int HS>
__host__ __device__ constexpr int padded_row() { return HS + 8; }

// ----------------------------------------------------------------------------
// moving tiles

// Starts copying rows first_row .. first_row+ROWS-1 (columns 0 .. HS-1) of a row-major bf16 matrix with
// `row_stride` elements per row into a shared tile; rows at or beyond T arrive as zeros (a zero K or V row
// then contributes nothing, where garbage could be a NaN that 0 * NaN spreads). All threads take part; the
// copies complete at the caller's cp_async_wait.
template <int HS, int ROWS>
__device__ void load_rows_async(floatX* tile, const floatX* source, size_t row_stride, int first_row, int T) {
    constexpr int chunks_per_row = HS / 8;  // 16 bytes each
    for (int chunk = threadIdx.x; chunk < ROWS * chunks_per_row; chunk += blockDim.x) {
        const int row = chunk / chunks_per_row;
        const int column = (chunk % chunks_per_row) * 8;
        const bool inside = first_row + row < T;
        const floatX* from = source + (size_t)(inside ? first_row + row : 0) * row_stride + column;
        cp_async_16_zero_fill(tile + row * padded_row<HS>() + column, from, inside);
    }
}

// Writes rows of a shared tile that are below T to global memory, 16 bytes per thread and step, or adds them
// to what is there (`accumulate`: the pair backward of ring attention; the sum is taken in fp32). Adding
// here rather than while staging keeps the accumulators' registers free of the extra work: they are dead by
// the time the target is read.
template <int HS, int ROWS>
__device__ void store_rows(floatX* target, size_t row_stride, const floatX* tile, int first_row, int T,
                           bool accumulate = false) {
    constexpr int chunks_per_row = HS / 8;
    for (int chunk = threadIdx.x; chunk < ROWS * chunks_per_row; chunk += blockDim.x) {
        const int row = chunk / chunks_per_row;
        const int column = (chunk % chunks_per_row) * 8;
        if (first_row + row >= T) continue;
        floatX* destination = target + (size_t)(first_row + row) * row_stride + column;
        x128 packed = load128(tile + row * padded_row<HS>() + column);
        if (accumulate) {
            const x128 previous = load128(destination);
            for (int k = 0; k < x128::size; k++) packed[k] = (floatX)((float)previous[k] + (float)packed[k]);
        }
        store128(destination, packed);
    }
}

// ----------------------------------------------------------------------------
// fragments from shared tiles (lane = 4 g + t throughout: g = lane / 4 picks rows, t = lane % 4 columns)

// The A operand at rows first_row .. +15, columns first_col .. +15 of a row-major tile. ldmatrix_x4's
// four 8 x 8 matrices are (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15,
// cols 8-15): A's registers in order. Lane L names row L % 16 of column half L / 16.
template <int HS>
__device__ __forceinline__ MmaA load_a(const floatX* tile, int first_row, int first_col) {
    const int lane = threadIdx.x % 32;
    MmaA a;
    ldmatrix_x4(a.x, tile + (first_row + lane % 16) * padded_row<HS>() + first_col + (lane / 16) * 8);
    return a;
}

// The B operands of two neighbouring n-tiles (n .. n+7 and n+8 .. n+15) over k .. k+15, from a tile
// stored n-major (a row per n, k contiguous: keys in Q K^T). Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 0-7), (n 8-15, k 8-15) = registers 0, 1 of the first operand, then of the second.
template <int HS>
__device__ __forceinline__ void load_b_pair_n_major(MmaB& first, MmaB& second, const floatX* tile, int n, int k) {
    const int lane = threadIdx.x % 32;
    const int matrix = lane / 8;
    uint32_t r[4];
    ldmatrix_x4(r, tile + (n + (matrix / 2) * 8 + lane % 8) * padded_row<HS>() + k + (matrix % 2) * 8);
    first = MmaB{{r[0], r[1]}};
    second = MmaB{{r[2], r[3]}};
}

// The same from a tile stored k-major (a row per k, n contiguous: values in P V), transposed on the way
// into registers. Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
template <int HS>
__device__ __forceinline__ void load_b_pair_k_major(MmaB& first, MmaB& second, const floatX* tile, int k, int n) {
    const int lane = threadIdx.x % 32;
    const int matrix = lane / 8;
    uint32_t r[4];
    ldmatrix_x4_trans(r, tile + (k + (matrix % 2) * 8 + lane % 8) * padded_row<HS>() + n + (matrix / 2) * 8);
    first = MmaB{{r[0], r[1]}};
    second = MmaB{{r[2], r[3]}};
}

// Writes a warp's 16 x HS accumulator rows (times a per-row factor) into rows first_row .. +15 of a shared
// tile as bf16: lane 4g + t holds rows g and g+8, columns 8n + 2t and 8n + 2t + 1.
template <int HS>
__device__ void stage_accumulators(floatX* tile, int first_row, const MmaAccumulator (&rows)[HS / 8],
                                   float factor_g, float factor_g8) {
    const int lane = threadIdx.x % 32;
    floatX* row_g = tile + (first_row + lane / 4) * padded_row<HS>() + 2 * (lane % 4);
    floatX* row_g8 = row_g + 8 * padded_row<HS>();
    #pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        row_g[8 * n] = (floatX)(rows[n].x[0] * factor_g);
        row_g[8 * n + 1] = (floatX)(rows[n].x[1] * factor_g);
        row_g8[8 * n] = (floatX)(rows[n].x[2] * factor_g8);
        row_g8[8 * n + 1] = (floatX)(rows[n].x[3] * factor_g8);
    }
}

// max and sum over the 4 lanes that hold a row
__device__ __forceinline__ float quad_max(float value) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, 1));
    return fmaxf(value, __shfl_xor_sync(0xffffffff, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
    value += __shfl_xor_sync(0xffffffff, value, 1);
    return value + __shfl_xor_sync(0xffffffff, value, 2);
}

// Accumulator element e (0..3) of an n-tile sits at row g + 8 (e / 2), column 8 n + 2 t + e % 2.
__device__ __forceinline__ int fragment_row(int e) { return (threadIdx.x % 32) / 4 + 8 * (e / 2); }
__device__ __forceinline__ int fragment_column(int n, int e) { return 8 * n + 2 * (threadIdx.x % 4) + e % 2; }

// ----------------------------------------------------------------------------
// forward: block (query tile of 64, query head h, b), reading K/V head h / G; the longest blocks (last query
// tiles) first. Key steps of 64 from key 0 to the last key a row of the tile sees (the diagonal for
// self-attention; llmc/kernels/attention.cuh's AttentionPair in general). Warp w: query rows 16 w .. 16 w + 15
// of the tile.

template <int HS>
__global__ void __launch_bounds__(kAttentionThreads)
attention_forward_kernel(floatX* out, float* lse, AttentionPair pair, int NH) {
    constexpr int tile_elements = kAttentionBlockRows * padded_row<HS>();
    DYNAMIC_SHARED(floatX, shared);
    floatX* q_tile = shared;                                               // this block's queries; then output
    floatX* k_tiles = q_tile + tile_elements;                              // two buffers of key steps
    floatX* v_tiles = k_tiles + 2 * tile_elements;                         // two buffers of value steps

    const int query_tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;                         // the query head; it reads K/V head h / G
    const int b = blockIdx.z;
    const int C = NH * HS;                            // out's row
    const size_t qkv_row_stride = pair.q_row_stride;  // query rows
    const size_t kv_row_stride = pair.kv_row_stride;  // key and value rows
    const int Tq = pair.Tq, Tk = pair.Tk;
    const floatX* q_head = pair.q_head(b, h, HS);
    const floatX* k_head = pair.k_head(b, pair.kv_head_of(h), HS);
    const floatX* v_head = k_head + pair.v_offset;
    const int warp_row = 16 * (threadIdx.x / 32);  // the warp's first row within the tile
    const int first_query = query_tile * kAttentionBlockRows;
    const float scale_log2 = kLog2e / sqrtf((float)HS);
    const int steps = ceil_div(pair.keys_seen_by(first_query, kAttentionBlockRows), kForwardKeyStep);

    if (steps > 0) {  // (a tile that sees no key loads nothing: its zero output is staged in q_tile directly)
        load_rows_async<HS, kAttentionBlockRows>(q_tile, q_head, qkv_row_stride, first_query, Tq);
        load_rows_async<HS, kForwardKeyStep>(k_tiles, k_head, kv_row_stride, 0, Tk);
        load_rows_async<HS, kForwardKeyStep>(v_tiles, v_head, kv_row_stride, 0, Tk);
        cp_async_commit();
    }

    MmaA q[HS / 16];                            // the warp's queries, 16 x HS, loaded once
    MmaAccumulator o[HS / 8] = {};              // unnormalised output rows (rows g, g+8 of the warp)
    float running_max[2] = {-INFINITY, -INFINITY};  // m of rows g and g+8, in log2 units
    float partial_sum[2] = {0.0f, 0.0f};        // this lane's share of l (the 4 lanes of a row add up at the end)

    for (int step = 0; step < steps; step++) {
        const int buffer = step % 2;
        if (step + 1 < steps) {  // the next keys and values fly in while this step is multiplied
            const int next_key = (step + 1) * kForwardKeyStep;
            const int next = (1 - buffer) * tile_elements;
            load_rows_async<HS, kForwardKeyStep>(k_tiles + next, k_head, kv_row_stride, next_key, Tk);
            load_rows_async<HS, kForwardKeyStep>(v_tiles + next, v_head, kv_row_stride, next_key, Tk);
            cp_async_commit();
            cp_async_wait<1>();  // all but the newest group: this step's tiles (and Q) have landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // ... for every thread's copies, not only this thread's
        if (step == 0)
            #pragma unroll
            for (int k = 0; k < HS / 16; k++) q[k] = load_a<HS>(q_tile, warp_row, 16 * k);
        const floatX* k_tile = k_tiles + buffer * tile_elements;
        const floatX* v_tile = v_tiles + buffer * tile_elements;

        // S = Q K^T: 16 rows x 64 keys, eight 16 x 8 accumulators
        MmaAccumulator s[kForwardKeyStep / 8] = {};
        #pragma unroll
        for (int n = 0; n < kForwardKeyStep / 8; n += 2)
            #pragma unroll
            for (int k = 0; k < HS / 16; k++) {
                MmaB keys_a, keys_b;
                load_b_pair_n_major<HS>(keys_a, keys_b, k_tile, 8 * n, 16 * k);
                mma_bf16_16816(s[n], q[k], keys_a);
                mma_bf16_16816(s[n + 1], q[k], keys_b);
            }

        // mask (keys a row does not see, keys past Tk), scale to log2 units, new running maxima
        const int first_key = step * kForwardKeyStep;
        float step_max[2] = {-INFINITY, -INFINITY};
        #pragma unroll
        for (int n = 0; n < kForwardKeyStep / 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int query = first_query + warp_row + fragment_row(e);
                const int key = first_key + fragment_column(n, e);
                s[n].x[e] = pair.sees(query, key) ? s[n].x[e] * scale_log2 : -INFINITY;
                step_max[e / 2] = fmaxf(step_max[e / 2], s[n].x[e]);
            }
        float correction[2], shift[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            // A row's visible keys are a prefix starting at key 0, so the maximum is finite from the first
            // step on, except in a row that sees no key at all: it stays -inf and exponents are taken against
            // 0 instead (every exp2 is then exp2(-inf) = 0, where -inf - -inf would give NaN).
            const float new_max = fmaxf(running_max[r], quad_max(step_max[r]));
            shift[r] = new_max == -INFINITY ? 0.0f : new_max;
            correction[r] = exp2f(running_max[r] - shift[r]);  // exp2(-inf) = 0 on the first step
            running_max[r] = new_max;
            partial_sum[r] *= correction[r];
        }
        #pragma unroll
        for (int n = 0; n < HS / 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) o[n].x[e] *= correction[e / 2];
        #pragma unroll
        for (int n = 0; n < kForwardKeyStep / 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[n].x[e] - shift[e / 2]);  // masked: exp2(-inf) = 0
                s[n].x[e] = p;
                partial_sum[e / 2] += p;
            }

        // O += P V: P (16 x 64) straight from the score accumulators, 16 keys per A operand
        #pragma unroll
        for (int k = 0; k < kForwardKeyStep / 16; k++) {
            const MmaA p = mma_a_from_accumulators(s[2 * k], s[2 * k + 1]);
            #pragma unroll
            for (int n = 0; n < HS / 8; n += 2) {
                MmaB values_a, values_b;
                load_b_pair_k_major<HS>(values_a, values_b, v_tile, 16 * k, 8 * n);
                mma_bf16_16816(o[n], p, values_a);
                mma_bf16_16816(o[n + 1], p, values_b);
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next step's prefetch refills it
    }

    // O = o / l and lse = m + log l, staged in the warp's own Q rows (no other warp reads them) for
    // coalesced stores
    // (a row that saw no key has l = 0: out 0, lse -inf)
    float row_sum[2], inverse_sum[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        row_sum[r] = quad_sum(partial_sum[r]);
        inverse_sum[r] = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
    }
    stage_accumulators<HS>(q_tile, warp_row, o, inverse_sum[0], inverse_sum[1]);
    if (threadIdx.x % 4 == 0) {
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            const int query = first_query + warp_row + fragment_row(2 * r);
            if (query < Tq)
                lse[((size_t)b * NH + h) * Tq + query] =
                    row_sum[r] > 0.0f ? (running_max[r] + log2f(row_sum[r])) / kLog2e : -INFINITY;
        }
    }
    __syncthreads();  // the whole output tile is staged
    store_rows<HS, kAttentionBlockRows>(out + (size_t)b * Tq * C + h * HS, C, q_tile, first_query, Tq);
}

// ----------------------------------------------------------------------------
// backward, dK and dV: block (key tile of 64, K/V head g, b), the longest blocks (first key tiles) first. For
// each query head of the group (g G .. g G + G - 1, in that order), query steps of 32 from the first query
// that sees the tile's first key (the tile's first key itself for self-attention) to the end: one sequence
// of G x (steps per head) steps, so the double buffering runs on from one head's last step into the next
// head's first, and every head's terms land in the same dK, dV accumulators in a fixed order (the group
// sum of llmc/kernels/attention.cuh). Warp w: key rows 16 w .. 16 w + 15. Everything is computed transposed
// (keys as rows), so that the block's own keys are the rows of every accumulator.

template <int HS, bool ACCUMULATE>
__global__ void __launch_bounds__(kAttentionThreads)
attention_backward_dkdv_kernel(floatX* dkv_target, const floatX* dout, AttentionPair pair,
                               const float* lse, const float* D, int NH) {
    constexpr int tile_elements = kAttentionBlockRows * padded_row<HS>();
    constexpr int step_elements = kBackwardStep * padded_row<HS>();
    DYNAMIC_SHARED(floatX, shared);
    floatX* k_tile = shared;                                     // this block's keys; then dK
    floatX* v_tile = k_tile + tile_elements;                     // this block's values; then dV
    floatX* q_steps = v_tile + tile_elements;                    // two buffers of query steps
    floatX* dout_steps = q_steps + 2 * step_elements;            // two buffers of their output gradients
    float* lse_steps = reinterpret_cast<float*>(dout_steps + 2 * step_elements);  // [2][32], log2 units
    float* d_steps = lse_steps + 2 * kBackwardStep;                              // [2][32]

    const int key_tile = blockIdx.x;
    const int kv_head = blockIdx.y;                   // g: its query heads are g G .. g G + G - 1
    const int b = blockIdx.z;
    const int C = NH * HS;                            // dout's row
    const size_t qkv_row_stride = pair.q_row_stride;  // query rows
    const size_t kv_row_stride = pair.kv_row_stride;  // key and value rows, and their dK, dV
    const int Tq = pair.Tq, Tk = pair.Tk;
    const floatX* k_head = pair.k_head(b, kv_head, HS);
    const floatX* v_head = k_head + pair.v_offset;
    const int warp_row = 16 * (threadIdx.x / 32);
    const int first_key = key_tile * kAttentionBlockRows;
    const int query_start = pair.first_query_seeing(first_key);
    const int head_steps = query_start < Tq ? ceil_div(Tq - query_start, kBackwardStep) : 0;  // per query head
    const int steps = pair.group * head_steps;
    if (ACCUMULATE && steps == 0) return;  // no query sees these keys: nothing to add
    const float scale = 1.0f / sqrtf((float)HS);
    const float scale_log2 = scale * kLog2e;
    // step s is query step s % head_steps of the group's query head s / head_steps: head by head, in order
    const int first_head = kv_head * pair.group;  // the group's query heads, from here on
    const floatX* q_group = pair.q_head(b, first_head, HS);
    const floatX* dout_group = dout + (size_t)b * Tq * C + first_head * HS;
    const float* lse_group = lse + ((size_t)b * NH + first_head) * Tq;
    const float* d_group = D + ((size_t)b * NH + first_head) * Tq;
    auto first_query_of_step = [&](int step) {
        return query_start + index_remainder(step, head_steps) * kBackwardStep;
    };

    // queries, output gradients, lse and D of step `step` into buffer step % 2 (lse and D by plain stores:
    // they are read after the same barrier as the asynchronous copies)
    auto load_query_step = [&](int step) {
        const int head = index_quotient(step, head_steps);  // within the group
        const int first_query = first_query_of_step(step);
        const int buffer = step % 2;
        const floatX* q_head = q_group + head * HS;
        const floatX* dout_head = dout_group + head * HS;
        const float* lse_head = lse_group + head * Tq;
        const float* d_head = d_group + head * Tq;
        load_rows_async<HS, kBackwardStep>(q_steps + buffer * step_elements, q_head, qkv_row_stride, first_query, Tq);
        load_rows_async<HS, kBackwardStep>(dout_steps + buffer * step_elements, dout_head, C, first_query, Tq);
        if (threadIdx.x < kBackwardStep) {
            const int query = first_query + threadIdx.x;
            lse_steps[buffer * kBackwardStep + threadIdx.x] = query < Tq ? lse_head[query] * kLog2e : 0.0f;
            d_steps[buffer * kBackwardStep + threadIdx.x] = query < Tq ? d_head[query] : 0.0f;
        }
    };
    if (steps > 0) {  // (no step: K, V stay unloaded and the zero dK, dV are staged without a barrier)
        load_rows_async<HS, kAttentionBlockRows>(k_tile, k_head, kv_row_stride, first_key, Tk);
        load_rows_async<HS, kAttentionBlockRows>(v_tile, v_head, kv_row_stride, first_key, Tk);
        load_query_step(0);
        cp_async_commit();
    }

    MmaAccumulator dk[HS / 8] = {}, dv[HS / 8] = {};  // rows: the warp's 16 keys
    for (int step = 0; step < steps; step++) {
        const int buffer = step % 2;
        if (step + 1 < steps) {
            load_query_step(step + 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this step's queries, gradients, lse and D (and, the first time, K and V) are in place
        const floatX* q_step = q_steps + buffer * step_elements;
        const floatX* dout_step = dout_steps + buffer * step_elements;
        const float* lse_step = lse_steps + buffer * kBackwardStep;
        const float* d_step = d_steps + buffer * kBackwardStep;

        // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x 32 queries
        MmaAccumulator st[kBackwardStep / 8] = {}, dpt[kBackwardStep / 8] = {};
        #pragma unroll
        for (int k = 0; k < HS / 16; k++) {
            const MmaA keys = load_a<HS>(k_tile, warp_row, 16 * k);
            const MmaA values = load_a<HS>(v_tile, warp_row, 16 * k);
            #pragma unroll
            for (int n = 0; n < kBackwardStep / 8; n += 2) {
                MmaB first, second;
                load_b_pair_n_major<HS>(first, second, q_step, 8 * n, 16 * k);
                mma_bf16_16816(st[n], keys, first);
                mma_bf16_16816(st[n + 1], keys, second);
                load_b_pair_n_major<HS>(first, second, dout_step, 8 * n, 16 * k);
                mma_bf16_16816(dpt[n], values, first);
                mma_bf16_16816(dpt[n + 1], values, second);
            }
        }

        // P^T = exp(S^T scale - lse) where visible, dS^T = P^T (dP^T - D)
        const int first_query = first_query_of_step(step);
        #pragma unroll
        for (int n = 0; n < kBackwardStep / 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = first_key + warp_row + fragment_row(e);
                const int local_query = fragment_column(n, e);
                const int query = first_query + local_query;
                const float p = pair.sees(query, key) ? exp2f(st[n].x[e] * scale_log2 - lse_step[local_query]) : 0.0f;
                st[n].x[e] = p;
                dpt[n].x[e] = p * (dpt[n].x[e] - d_step[local_query]);
            }

        // dV += P^T dO and dK += dS^T Q, 16 queries per A operand
        #pragma unroll
        for (int k = 0; k < kBackwardStep / 16; k++) {
            const MmaA p = mma_a_from_accumulators(st[2 * k], st[2 * k + 1]);
            const MmaA ds = mma_a_from_accumulators(dpt[2 * k], dpt[2 * k + 1]);
            #pragma unroll
            for (int n = 0; n < HS / 8; n += 2) {
                MmaB first, second;
                load_b_pair_k_major<HS>(first, second, dout_step, 16 * k, 8 * n);
                mma_bf16_16816(dv[n], p, first);
                mma_bf16_16816(dv[n + 1], p, second);
                load_b_pair_k_major<HS>(first, second, q_step, 16 * k, 8 * n);
                mma_bf16_16816(dk[n], ds, first);
                mma_bf16_16816(dk[n + 1], ds, second);
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next step's prefetch refills it
    }

    // dK (scaled once here) and dV staged in the warp's own K and V rows, then stored (or added) coalesced
    stage_accumulators<HS>(k_tile, warp_row, dk, scale, scale);
    stage_accumulators<HS>(v_tile, warp_row, dv, 1.0f, 1.0f);
    __syncthreads();
    floatX* dk_head = dkv_target + (size_t)b * Tk * kv_row_stride + kv_head * HS;
    store_rows<HS, kAttentionBlockRows>(dk_head, kv_row_stride, k_tile, first_key, Tk, ACCUMULATE);
    store_rows<HS, kAttentionBlockRows>(dk_head + pair.v_offset, kv_row_stride, v_tile, first_key, Tk, ACCUMULATE);
}

// ----------------------------------------------------------------------------
// backward, dQ: block (query tile of 64, query head h, b), reading K/V head h / G; the longest blocks (last
// query tiles) first. Key steps of 32 from 0 to the last key a row of the tile sees (the diagonal for
// self-attention). Warp w: query rows 16 w .. 16 w + 15.

template <int HS, bool ACCUMULATE>
__global__ void __launch_bounds__(kAttentionThreads)
attention_backward_dq_kernel(floatX* dq_target, const floatX* dout, AttentionPair pair,
                             const float* lse, const float* D, int NH) {
    constexpr int tile_elements = kAttentionBlockRows * padded_row<HS>();
    constexpr int step_elements = kBackwardStep * padded_row<HS>();
    DYNAMIC_SHARED(floatX, shared);
    floatX* q_tile = shared;                                     // this block's queries; then dQ
    floatX* dout_tile = q_tile + tile_elements;                  // their output gradients
    floatX* k_steps = dout_tile + tile_elements;                 // two buffers of key steps
    floatX* v_steps = k_steps + 2 * step_elements;               // two buffers of value steps

    const int query_tile = gridDim.x - 1 - blockIdx.x;
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
    const int warp_row = 16 * (threadIdx.x / 32);
    const int first_query = query_tile * kAttentionBlockRows;
    const int steps = ceil_div(pair.keys_seen_by(first_query, kAttentionBlockRows), kBackwardStep);
    if (ACCUMULATE && steps == 0) return;  // no row of the tile sees a key: nothing to add
    const float scale = 1.0f / sqrtf((float)HS);
    const float scale_log2 = scale * kLog2e;

    // lse (log2 units) and D of this lane's two rows, fixed for the whole block
    float row_lse[2], row_d[2];
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        const int query = first_query + warp_row + fragment_row(2 * r);
        row_lse[r] = query < Tq ? lse[((size_t)b * NH + h) * Tq + query] * kLog2e : 0.0f;
        row_d[r] = query < Tq ? D[((size_t)b * NH + h) * Tq + query] : 0.0f;
    }

    if (steps > 0) {  // (no step: nothing is loaded and the zero dQ is staged without a barrier)
        load_rows_async<HS, kAttentionBlockRows>(q_tile, q_head, qkv_row_stride, first_query, Tq);
        load_rows_async<HS, kAttentionBlockRows>(dout_tile, dout_head, C, first_query, Tq);
        load_rows_async<HS, kBackwardStep>(k_steps, k_head, kv_row_stride, 0, Tk);
        load_rows_async<HS, kBackwardStep>(v_steps, v_head, kv_row_stride, 0, Tk);
        cp_async_commit();
    }

    MmaA q[HS / 16], dout_rows[HS / 16];  // the warp's queries and output gradients, loaded once
    MmaAccumulator dq[HS / 8] = {};
    for (int step = 0; step < steps; step++) {
        const int buffer = step % 2;
        if (step + 1 < steps) {
            const int next_key = (step + 1) * kBackwardStep;
            const int next = (1 - buffer) * step_elements;
            load_rows_async<HS, kBackwardStep>(k_steps + next, k_head, kv_row_stride, next_key, Tk);
            load_rows_async<HS, kBackwardStep>(v_steps + next, v_head, kv_row_stride, next_key, Tk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this step's keys and values (and, the first time, Q and dO) are in place
        if (step == 0)
            #pragma unroll
            for (int k = 0; k < HS / 16; k++) {
                q[k] = load_a<HS>(q_tile, warp_row, 16 * k);
                dout_rows[k] = load_a<HS>(dout_tile, warp_row, 16 * k);
            }
        const floatX* k_step = k_steps + buffer * step_elements;
        const floatX* v_step = v_steps + buffer * step_elements;

        // S = Q K^T and dP = dO V^T: the warp's 16 queries x 32 keys
        MmaAccumulator s[kBackwardStep / 8] = {}, dp[kBackwardStep / 8] = {};
        #pragma unroll
        for (int k = 0; k < HS / 16; k++)
            #pragma unroll
            for (int n = 0; n < kBackwardStep / 8; n += 2) {
                MmaB first, second;
                load_b_pair_n_major<HS>(first, second, k_step, 8 * n, 16 * k);
                mma_bf16_16816(s[n], q[k], first);
                mma_bf16_16816(s[n + 1], q[k], second);
                load_b_pair_n_major<HS>(first, second, v_step, 8 * n, 16 * k);
                mma_bf16_16816(dp[n], dout_rows[k], first);
                mma_bf16_16816(dp[n + 1], dout_rows[k], second);
            }

        // dS = P (dP - D), P = exp(S scale - lse) where visible
        const int first_key = step * kBackwardStep;
        #pragma unroll
        for (int n = 0; n < kBackwardStep / 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int query = first_query + warp_row + fragment_row(e);
                const int key = first_key + fragment_column(n, e);
                const float p = pair.sees(query, key) ? exp2f(s[n].x[e] * scale_log2 - row_lse[e / 2]) : 0.0f;
                dp[n].x[e] = p * (dp[n].x[e] - row_d[e / 2]);
            }

        // dQ += dS K, 16 keys per A operand
        #pragma unroll
        for (int k = 0; k < kBackwardStep / 16; k++) {
            const MmaA ds = mma_a_from_accumulators(dp[2 * k], dp[2 * k + 1]);
            #pragma unroll
            for (int n = 0; n < HS / 8; n += 2) {
                MmaB first, second;
                load_b_pair_k_major<HS>(first, second, k_step, 16 * k, 8 * n);
                mma_bf16_16816(dq[n], ds, first);
                mma_bf16_16816(dq[n + 1], ds, second);
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next step's prefetch refills it
    }

    stage_accumulators<HS>(q_tile, warp_row, dq, scale, scale);  // the warp's own Q rows
    __syncthreads();
    store_rows<HS, kAttentionBlockRows>(dq_target + (size_t)b * Tq * qkv_row_stride + h * HS, qkv_row_stride,
                                        q_tile, first_query, Tq, ACCUMULATE);
}

// ----------------------------------------------------------------------------
// shared memory per block for one head size, which the launchers in llmc/kernels/attention.cuh opt in to

template <int HS>
constexpr size_t attention_forward_shared_bytes() {
    return sizeof(floatX) * (kAttentionBlockRows + 4 * kForwardKeyStep) * padded_row<HS>();
}
template <int HS>
constexpr size_t attention_dkdv_shared_bytes() {
    return sizeof(floatX) * (2 * kAttentionBlockRows + 4 * kBackwardStep) * padded_row<HS>() +
           sizeof(float) * 4 * kBackwardStep;
}
template <int HS>
constexpr size_t attention_dq_shared_bytes() {
    return sizeof(floatX) * (2 * kAttentionBlockRows + 4 * kBackwardStep) * padded_row<HS>();
}
