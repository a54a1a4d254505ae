/*
The mixture-of-experts MLP's own kernels: the router, the dispatch of token rows to their experts and back,
and the router's two auxiliary losses. The experts themselves are ordinary matmuls (llmc/kernels/matmul.cuh),
one per expert on that expert's contiguous slice of the permuted rows; everything here happens around them.
Rows are the N = B T tokens of B sequences, row n = b T + t; E experts, K of them per token.

Router. z = the row's E logits (floatX). In fp32:
    p_i = exp(z_i - m) / S,   m = max_i z_i,   S = sum_i exp(z_i - m),   lse = m + log S
(subtracting m keeps every exp() at most 1). The top K experts e_0 .. e_{K-1} are those with the largest p, in
descending p, equal p going to the smaller expert index first: a total order, so which thread looked first
can never change the choice. Their weights are renormalised over the chosen, so that they sum to 1:
    w_k = p_{e_k} / s,   s = sum_{j<K} p_{e_j}   (summed in the order j = 0..K-1, here and in the backward)

Dispatch. Assignment (n, k) is a copy of row n for expert e_k. The plan sorts the N K assignments by expert,
then by (n, k), into a permuted buffer, so that expert e's rows are one contiguous (count_e, C) operand,
[offset_e, offset_e + count_e) with offset_e = sum_{e' < e} count_{e'}. With a capacity cap > 0, a sequence
keeps at most cap of its assignments per expert: they are visited in (t, k) order and an assignment is
dropped (slot -1) once cap of its sequence's went to its expert. A dropped assignment adds nothing to the
output and the other weights are not renormalised again (the token simply loses that expert's share).
    permute     permuted[slot(n, k)] = h[n]
    unpermute   out[n] = sum_{kept k, k = 0..K-1} w_k y[slot(n, k)]            (fp32, in that order)
The backward passes, by the chain rule through a copy and through a weighted sum:
    permute     dh[n] = sum_{kept k, k = 0..K-1} dpermuted[slot(n, k)]
    unpermute   dy[slot(n, k)] = w_k dout[n],    dw_k = dout[n] . y[slot(n, k)]     (dw_k = 0 when dropped)

Losses. The sequence-wise balance loss (Switch Transformer / GShard) and the router z-loss (ST-MoE):
    f[b,e] = routed[b,e] / (T K)         the share of sequence b's assignments sent to e, before drops
    P[b,e] = (1/T) sum_t p[bT+t, e]      the router's mean probability for e over b's tokens
    aux = (1/B) sum_b E sum_e f[b,e] P[b,e],       zloss = (1/N) sum_n lse_n^2
Under context parallelism a rank holds T of each sequence's S positions (S = T without it): routed then counts
the whole sequence's assignments (summed over the cp ranks by the caller), f divides by S K and P by S, and
each rank's sum is its rows' part of the loss, the parts adding up over the ranks.
f counts discrete choices and has no gradient; P carries it, so the loss lowers the probability of the
experts that already receive more than their share (aux is 1 when both are uniform). The z-loss keeps the
logits small, where the bf16 router matmul is accurate. The kernels compute the sums; the caller divides.

Gradients into the probabilities: the aux loss's, with aux_scale the caller's d total / d aux_layer / B
(alpha / B for one microbatch),
    dp[n,e] = aux_scale E f[b,e] / T
then the renormalisation's (dw_k / dp_{e_j} = ([j = k] - w_k) / s):
    dp[n,e_j] += (dw_j - sum_k dw_k w_k) / s
then through the softmax (dp_j / dz_i = p_j ([i = j] - p_i)), plus the z-loss's (d lse / d z_i = p_i):
    dz_i = p_i (dp_i - sum_j p_j dp_j) + z_scale 2 lse p_i          z_scale = beta / N for one microbatch
The matmuls dh += dz routerw and drouterw += dz^T h are the caller's.

What each launcher does with its outputs (all overwritten unless said otherwise):
    moe_router_forward      probs (N, E), lse (N), experts (N, K), weights (N, K)
    moe_dispatch_plan       slots (N K), expert_counts (E), routed_counts (B, E); in two halves,
                            moe_count_routed then moe_place_assignments, for a caller that needs the
                            counts in between
    moe_permute_forward     permuted: the sum of expert_counts rows, each written once
    moe_permute_backward    dinp (N, C): 0 for a row whose assignments were all dropped
    moe_unpermute_forward   out (N, C): likewise 0 for such a row
    moe_unpermute_backward  dexpert_out (every kept row), dweights (N, K)
    moe_aux_loss_forward    aux_sum, z_sum: ACCUMULATED (+=), one fp32 scalar each
    moe_aux_loss_backward   dprobs (N, E)
    moe_router_backward     dlogits (N, E); dprobs is read only
    moe_scale               data (count), in place: data *= factor (expert parallelism's 1/ep, below)
E <= 256 (one warp holds a row's logits, 8 per lane), 1 <= K <= E; the row kernels need C % x128::size == 0.
Nothing here uses atomics or depends on the order in which threads run: every sum has a fixed order.
*/
#pragma once

#include <climits>
#include "../cuda_common.cuh"
#include "../utils.h"

constexpr int MOE_MAX_EXPERTS = 256;
constexpr int MOE_EXPERTS_PER_LANE = MOE_MAX_EXPERTS / 32;
constexpr int MOE_WARPS_PER_BLOCK = 8;                    // the kernels with one warp per row (or per expert)
constexpr int MOE_BLOCK_SIZE = MOE_WARPS_PER_BLOCK * 32;
constexpr int MOE_AUX_BLOCK_SIZE = 1024;                  // the aux loss's one block

// ----------------------------------------------------------------------------
// router

// A warp holds one row: lane l has experts l, l + 32, l + 64, ... (consecutive lanes, consecutive logits).
__device__ __forceinline__ int moe_lane_expert(int lane, int i) { return lane + 32 * i; }

// The top-K order as one unsigned number, so that a warp finds the next choice with a plain max: p >= 0, and
// the bits of a non-negative float order like its value; the low half, the index's complement, makes the
// smaller index the larger key on equal p. Never 0 for a real expert, so 0 marks "taken" or "no expert".
// (A NaN p orders above every number: a corrupt row still chooses K real experts.)
__device__ __forceinline__ unsigned long long moe_topk_key(float p, int expert) {
    return ((unsigned long long)__float_as_uint(p) << 32) | (unsigned)(~expert);
}

__global__ void moe_router_forward_kernel(float* probs, float* lse, int* experts, float* weights,
                                          const floatX* logits, int N, int E, int K) {
    const int lane = threadIdx.x % 32;
    // `row` is the same for all lanes of a warp: whole warps leave together, the shuffles see all 32 lanes
    for (int row = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / 32; row < N;
         row += gridDim.x * MOE_WARPS_PER_BLOCK) {
        const floatX* z = logits + (size_t)row * E;
        float exps[MOE_EXPERTS_PER_LANE];
        float row_max = -INFINITY;
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            const int e = moe_lane_expert(lane, i);
            exps[i] = e < E ? (float)z[e] : -INFINITY;
            row_max = fmaxf(row_max, exps[i]);
        }
        row_max = warp_reduce_max(row_max);
        float sum = 0.0f;
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            exps[i] = moe_lane_expert(lane, i) < E ? expf(exps[i] - row_max) : 0.0f;
            sum += exps[i];
        }
        sum = warp_reduce_sum(sum);
        if (lane == 0) lse[row] = row_max + logf(sum);

        unsigned long long keys[MOE_EXPERTS_PER_LANE];
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            const int e = moe_lane_expert(lane, i);
            keys[i] = 0;
            if (e < E) {
                const float p = exps[i] / sum;
                probs[(size_t)row * E + e] = p;
                keys[i] = moe_topk_key(p, e);
            }
        }
        // K rounds, each taking the largest key left. Every lane sees every choice, so every lane adds up s in
        // the same order; lane k % 32 stores choice k, and divides it by s at the end (its own stores only).
        float chosen_sum = 0.0f;
        for (int k = 0; k < K; k++) {
            unsigned long long best = 0;
            for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) best = keys[i] > best ? keys[i] : best;
            for (int offset = 16; offset > 0; offset /= 2) {
                const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, offset);
                best = other > best ? other : best;
            }
            const int expert = (int)~(unsigned)best;
            const float p = __uint_as_float((unsigned)(best >> 32));
            chosen_sum += p;
            if (lane == k % 32) {
                experts[(size_t)row * K + k] = expert;
                weights[(size_t)row * K + k] = p;
            }
            for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++)
                if (moe_lane_expert(lane, i) == expert) keys[i] = 0;
        }
        for (int k = lane; k < K; k += 32) weights[(size_t)row * K + k] /= chosen_sum;
    }
}

__global__ void moe_router_backward_kernel(floatX* dlogits, const float* dprobs, const float* probs, const float* lse,
                                           const int* experts, const float* weights, const float* dweights, int N,
                                           int E, int K, float z_scale) {
    const int lane = threadIdx.x % 32;
    for (int row = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / 32; row < N;
         row += gridDim.x * MOE_WARPS_PER_BLOCK) {
        float p[MOE_EXPERTS_PER_LANE], dp[MOE_EXPERTS_PER_LANE];
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            const int e = moe_lane_expert(lane, i);
            p[i] = e < E ? probs[(size_t)row * E + e] : 0.0f;
            dp[i] = e < E ? dprobs[(size_t)row * E + e] : 0.0f;
        }
        // s as the forward pass summed it (the same floats in the same order: the same bits), and sum_k dw_k w_k;
        // every lane computes both from the same K loads
        const int* row_experts = experts + (size_t)row * K;
        const float* row_weights = weights + (size_t)row * K;
        const float* row_dweights = dweights + (size_t)row * K;
        float chosen_sum = 0.0f, weighted_dweights = 0.0f;
        for (int k = 0; k < K; k++) {
            chosen_sum += probs[(size_t)row * E + row_experts[k]];
            weighted_dweights += row_dweights[k] * row_weights[k];
        }
        for (int k = 0; k < K; k++) {
            const float renormalisation = (row_dweights[k] - weighted_dweights) / chosen_sum;
            for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++)  // unrolled, so dp stays in registers
                if (moe_lane_expert(lane, i) == row_experts[k]) dp[i] += renormalisation;
        }
        float p_dot_dp = 0.0f;
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) p_dot_dp += p[i] * dp[i];
        p_dot_dp = warp_reduce_sum(p_dot_dp);
        const float z_loss_slope = z_scale * 2.0f * lse[row];
        for (int i = 0; i < MOE_EXPERTS_PER_LANE; i++) {
            const int e = moe_lane_expert(lane, i);
            if (e < E) dlogits[(size_t)row * E + e] = (floatX)(p[i] * (dp[i] - p_dot_dp) + z_loss_slope * p[i]);
        }
    }
}

// ----------------------------------------------------------------------------
// dispatch plan
/*
In three launches, with no scratch memory beyond the outputs and no atomics:
  1. moe_count_routed_kernel, one block per sequence: routed[b,e].
  2. moe_expert_offsets_kernel, one warp per expert: kept[b,e] = min(routed[b,e], cap[b,e]) (routed[b,e]
     when dropless), count_e = sum_b kept[b,e], and before[b,e] = sum_{b' < b} kept[b',e], the rows of e that
     earlier sequences fill. before[b,e] is written over routed[b,e]: routed_counts is the one (B, E)
     buffer there is, and routed[b,e] is cheap to count again.
  3. moe_place_kernel, one block per sequence: each assignment's rank r among its sequence's assignments to
     the same expert, in (t, k) order. It is kept when r < cap[b,e], at
         slot = offset_e + before[b,e] + r
     since expert e's rows hold sequence 0's kept assignments, then sequence 1's, ... and a sequence's kept
     ones are its first cap[b,e]. The block counts routed[b,e] again on the way and writes it back.
cap[b,e] is the capacity, or what is left of it where a sequence comes in pieces (context parallelism: a piece
is routed as a sequence of its own, and the pieces before it in position order may have used some).
A sequence's T K assignments are consecutive in `experts` ((b T + t) K + k), already in (t, k) order. A
block's warps take consecutive slices of them and walk a slice 32 assignments at a time. In a chunk of 32,
the lanes holding the same expert are found with one ballot per bit of the expert's index; a lane's rank
among them is the number of them below it, and the lowest of them adds their number to the warp's count for
that expert. Kernel 3 walks twice: once to count each slice (as kernel 1 does), then, with the counts turned
into each slice's first rank per expert, to place.
The parallelism is the B sequences times 8 warps; one very long sequence is walked by 8 warps only.
*/

constexpr int MOE_PLAN_WARPS = 8;
constexpr int MOE_PLAN_BLOCK_SIZE = MOE_PLAN_WARPS * 32;
// Stands for "no expert" in a chunk (a lane past the end of its slice, or an index outside [0, E)): equal
// to no real expert, and 9 bits wide like them. Such assignments are neither counted nor kept.
constexpr int MOE_NO_EXPERT = MOE_MAX_EXPERTS;
constexpr int MOE_EXPERT_BITS = 9;

// The lanes of the warp whose `expert` equals the calling lane's: the lanes that agree with it on every bit.
__device__ __forceinline__ unsigned moe_lanes_with_same_expert(int expert) {
    unsigned same = 0xffffffffu;
    for (int bit = 0; bit < MOE_EXPERT_BITS; bit++) {
        const bool set = (expert >> bit) & 1;
        const unsigned lanes_set = __ballot_sync(0xffffffffu, set);
        same &= set ? lanes_set : ~lanes_set;
    }
    return same;
}

__device__ __forceinline__ int moe_chunk_expert(const int* sequence_experts, int at, int end, int E) {
    if (at >= end) return MOE_NO_EXPERT;
    const int expert = sequence_experts[at];
    return expert >= 0 && expert < E ? expert : MOE_NO_EXPERT;
}

// The calling warp's slice [first, end) of a sequence's `assignments`: whole chunks of 32, the last ones short
// or empty
struct MoeSlice {
    int first, end;
};
__device__ __forceinline__ MoeSlice moe_warp_slice(int assignments) {
    const int per_warp = ceil_div(ceil_div(assignments, MOE_PLAN_WARPS), 32) * 32;
    const int first = min((int)(threadIdx.x / 32) * per_warp, assignments);
    return MoeSlice{first, min(first + per_warp, assignments)};
}

// counts[e] = the number of the slice's assignments to e (counts: this warp's row of shared memory, all
// MOE_MAX_EXPERTS of it written)
__device__ void moe_count_slice(int* counts, const int* sequence_experts, MoeSlice slice, int E) {
    const int lane = threadIdx.x % 32;
    for (int e = lane; e < MOE_MAX_EXPERTS; e += 32) counts[e] = 0;
    __syncwarp();
    for (int chunk = slice.first; chunk < slice.end; chunk += 32) {
        const int expert = moe_chunk_expert(sequence_experts, chunk + lane, slice.end, E);
        const unsigned same = moe_lanes_with_same_expert(expert);
        const bool lowest = (same & ((1u << lane) - 1)) == 0;
        if (expert != MOE_NO_EXPERT && lowest) counts[expert] += __popc(same);
        __syncwarp();  // the next chunk's lowest lane for this expert may be another lane
    }
}

__global__ void moe_count_routed_kernel(int* routed_counts, const int* experts, int T, int K, int E) {
    __shared__ int counts[MOE_PLAN_WARPS][MOE_MAX_EXPERTS];
    const int b = blockIdx.x;
    moe_count_slice(counts[threadIdx.x / 32], experts + (size_t)b * T * K, moe_warp_slice(T * K), E);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int routed = 0;
        for (int w = 0; w < MOE_PLAN_WARPS; w++) routed += counts[w][e];
        routed_counts[(size_t)b * E + e] = routed;
    }
}

// cap[b,e] (see moe_place_assignments): the room sequence b has left for expert e; INT_MAX when dropless
__device__ inline int moe_room(int capacity, const int* capacity_left, int b, int E, int e) {
    if (capacity <= 0) return INT_MAX;
    return capacity_left != nullptr ? capacity_left[(size_t)b * E + e] : capacity;
}

// routed_counts: in routed[b,e], out before[b,e]
__global__ void moe_expert_offsets_kernel(int* expert_counts, int* routed_counts, int B, int E, int capacity,
                                          const int* capacity_left) {
    const int e = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (e >= E) return;  // whole warps
    int before = 0;      // kept rows of e in the sequences before this chunk of 32
    for (int first = 0; first < B; first += 32) {
        const int b = first + lane;
        const int routed = b < B ? routed_counts[(size_t)b * E + e] : 0;
        const int kept = b < B ? min(routed, moe_room(capacity, capacity_left, b, E, e)) : 0;
        int inclusive = kept;  // scan over the chunk's lanes: the kept rows of sequences first..b
        for (int offset = 1; offset < 32; offset *= 2) {
            const int below = __shfl_up_sync(0xffffffffu, inclusive, offset);
            if (lane >= offset) inclusive += below;
        }
        if (b < B) routed_counts[(size_t)b * E + e] = before + inclusive - kept;
        before += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) expert_counts[e] = before;
}

// routed_counts: in before[b,e], out routed[b,e] (this block's row b only)
__global__ void moe_place_kernel(int* slots, int* routed_counts, const int* experts, const int* expert_counts, int T,
                                 int K, int E, int capacity, const int* capacity_left) {
    __shared__ int ranks[MOE_PLAN_WARPS][MOE_MAX_EXPERTS];  // first counts per slice, then ranks
    __shared__ int first_row[MOE_MAX_EXPERTS];               // offset_e + before[b,e]
    const int b = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int* sequence_experts = experts + (size_t)b * T * K;
    int* sequence_slots = slots + (size_t)b * T * K;
    const MoeSlice slice = moe_warp_slice(T * K);
    moe_count_slice(ranks[warp], sequence_experts, slice, E);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int offset = 0;  // E <= 256 additions, the same in every block
        for (int earlier = 0; earlier < e; earlier++) offset += expert_counts[earlier];
        first_row[e] = offset + routed_counts[(size_t)b * E + e];
        int rank = 0;  // each slice's first rank for e: the assignments to e of the slices before it
        for (int w = 0; w < MOE_PLAN_WARPS; w++) {
            const int count = ranks[w][e];
            ranks[w][e] = rank;
            rank += count;
        }
        routed_counts[(size_t)b * E + e] = rank;
    }
    __syncthreads();
    for (int chunk = slice.first; chunk < slice.end; chunk += 32) {
        const int expert = moe_chunk_expert(sequence_experts, chunk + lane, slice.end, E);
        const unsigned same = moe_lanes_with_same_expert(expert);
        const unsigned below = same & ((1u << lane) - 1);
        const int rank = expert != MOE_NO_EXPERT ? ranks[warp][expert] + __popc(below) : 0;
        __syncwarp();  // every lane has read its expert's rank before the lowest lane moves it on
        if (expert != MOE_NO_EXPERT && below == 0) ranks[warp][expert] += __popc(same);
        __syncwarp();
        const bool kept = expert != MOE_NO_EXPERT && rank < moe_room(capacity, capacity_left, b, E, expert);
        if (chunk + lane < slice.end) sequence_slots[chunk + lane] = kept ? first_row[expert] + rank : -1;
    }
}

// ----------------------------------------------------------------------------
// permute and unpermute: grid-stride loops over 16-byte chunks of rows

__global__ void moe_permute_forward_kernel(floatX* permuted, const floatX* inp, const int* slots, int N, int K,
                                           int C) {
    const int chunks_per_row = C / x128::size;
    const GridStride share = grid_stride((size_t)N * K * chunks_per_row);
    for (size_t item = share.first; item < share.end; item += share.step) {
        const size_t assignment = item / chunks_per_row;
        const int column = (int)(item % chunks_per_row) * x128::size;
        const int slot = slots[assignment];
        if (slot < 0) continue;
        const x128 row_chunk = load128(inp + assignment / K * C + column);  // read K times: keep it cached
        store128(permuted + (size_t)slot * C + column, row_chunk);
    }
}

// out[n] = sum over kept k, in order, of weight_k rows[slot(n, k)]: the unpermute's forward, and with
// weights == nullptr (every weight 1, a multiplication that is exact) the permute's backward, the same gather
__global__ void moe_gather_rows_kernel(floatX* out, const floatX* rows, const int* slots, const float* weights,
                                       int N, int K, int C) {
    const int chunks_per_row = C / x128::size;
    const GridStride share = grid_stride((size_t)N * chunks_per_row);
    for (size_t item = share.first; item < share.end; item += share.step) {
        const size_t n = item / chunks_per_row;
        const int column = (int)(item % chunks_per_row) * x128::size;
        float sum[x128::size] = {};
        for (int k = 0; k < K; k++) {
            const int slot = slots[n * K + k];
            if (slot < 0) continue;
            const float weight = weights != nullptr ? weights[n * K + k] : 1.0f;
            const x128 row_chunk = load128cs(rows + (size_t)slot * C + column);  // each row is read once
            for (int j = 0; j < x128::size; j++) sum[j] += weight * (float)row_chunk[j];
        }
        x128 result;
        for (int j = 0; j < x128::size; j++) result[j] = (floatX)sum[j];
        store128(out + n * C + column, result);
    }
}

// One warp per row: dweights are dot products over C, a warp reduction each.
__global__ void moe_unpermute_backward_kernel(floatX* dexpert_out, float* dweights, const floatX* dout,
                                              const floatX* expert_out, const int* slots, const float* weights, int N,
                                              int K, int C) {
    const int lane = threadIdx.x % 32;
    for (int row = blockIdx.x * MOE_WARPS_PER_BLOCK + threadIdx.x / 32; row < N;
         row += gridDim.x * MOE_WARPS_PER_BLOCK) {
        const floatX* dout_row = dout + (size_t)row * C;
        for (int k = 0; k < K; k++) {
            const int slot = slots[(size_t)row * K + k];  // the same for the whole warp
            if (slot < 0) {
                if (lane == 0) dweights[(size_t)row * K + k] = 0.0f;
                continue;
            }
            const float weight = weights[(size_t)row * K + k];
            float dot = 0.0f;
            for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
                const x128 d = load128(dout_row + c);  // read K times
                const x128 y = load128cs(expert_out + (size_t)slot * C + c);
                x128 dy;
                for (int j = 0; j < x128::size; j++) {
                    dy[j] = (floatX)(weight * (float)d[j]);
                    dot += (float)d[j] * (float)y[j];
                }
                store128(dexpert_out + (size_t)slot * C + c, dy);
            }
            dot = warp_reduce_sum(dot);
            if (lane == 0) dweights[(size_t)row * K + k] = dot;
        }
    }
}

// ----------------------------------------------------------------------------
// the auxiliary losses
/*
The balance loss's sum, row by row: with b = b(n), S positions per sequence (this rank's T of them),
    sum_b E sum_e f[b,e] P[b,e] = E / (S^2 K) sum_n sum_e routed[b,e] p[n,e]
One block does the whole sum (the API has no scratch for per-block partials, and an fp32 atomicAdd would make
the bits depend on the order the blocks finish). It reads N E + N floats on one multiprocessor, which streams
on the order of 100 GB/s (an estimate, not measured here): at N = 16K rows and E = 64, 4 MiB, some tens of
microseconds against the milliseconds of the layer's expert matmuls; at N = 1M and E = 256, 1 GiB, about 10 ms,
where per-block partials in a caller's scratch buffer would be the next step.
*/

__global__ void moe_aux_loss_forward_kernel(float* aux_sum, float* z_sum, const float* probs, const float* lse,
                                            const int* routed_counts, int B, int T, int S, int E, int K) {
    const size_t N = (size_t)B * T;
    float routed_dot_probs = 0.0f;
    const GridStride items = block_stride(N * E);
    for (size_t i = items.first; i < items.end; i += items.step) {
        const size_t n = i / E, b = n / T;
        routed_dot_probs += (float)routed_counts[b * E + i % E] * probs[i];
    }
    float lse_squares = 0.0f;
    const GridStride rows = block_stride(N);
    for (size_t n = rows.first; n < rows.end; n += rows.step) lse_squares += lse[n] * lse[n];
    routed_dot_probs = block_reduce_sum(routed_dot_probs);
    lse_squares = block_reduce_sum(lse_squares);
    if (threadIdx.x == 0) {
        *aux_sum += (float)E / ((float)S * (float)S * (float)K) * routed_dot_probs;
        *z_sum += lse_squares;
    }
}

__global__ void moe_aux_loss_backward_kernel(float* dprobs, const int* routed_counts, int B, int T, int S, int E,
                                             int K, float aux_scale) {
    const GridStride share = grid_stride((size_t)B * T * E);
    for (size_t i = share.first; i < share.end; i += share.step) {
        const size_t n = i / E, b = n / T;
        const float f = (float)routed_counts[b * E + i % E] / ((float)S * (float)K);
        dprobs[i] = aux_scale * (float)E * f / (float)S;
    }
}

// ----------------------------------------------------------------------------
// expert parallelism: an expert's weight gradient sums the rows of ep data-parallel ranks, so the average
// over its replicas is ep times the mean over all dp ranks; data *= factor (= 1/ep) makes it that mean

__global__ void moe_scale_kernel(floatX* data, float factor, size_t count) {
    const GridStride items = grid_stride(count);
    for (size_t i = items.first; i < items.end; i += items.step) data[i] = (floatX)((float)data[i] * factor);
}

// ----------------------------------------------------------------------------
// launchers
//
// They take a routing's device arrays as one MoeRouting and its sizes as one MoeShape: every launcher reads and
// writes the same few arrays, so a caller names them once (llmc/model/moe.cuh: from the block's record).

// B sequences of T rows each (N = B T rows), of S positions each (S = T, or more where a rank holds T of each
// sequence's positions: context parallelism), E experts, K of them per row, C channels per row.
struct MoeShape {
    int B = 0, T = 0, S = 0, E = 0, K = 0, C = 0;
    int rows() const { return B * T; }
};

// A routing's device arrays, each written by one launcher and read by those after it (the table above).
struct MoeRouting {
    float* probs = nullptr;        // (N, E) the router's probabilities (fp32)
    float* lse = nullptr;          // (N)    the logits' logsumexp
    int* experts = nullptr;        // (N, K) each row's experts, best first
    float* weights = nullptr;      // (N, K) their renormalised weights
    int* slots = nullptr;          // (N K)  each assignment's row in the expert-sorted order, -1 if dropped
    int* routed_counts = nullptr;  // (B, E) each sequence's assignments per expert, before drops
    float* dprobs = nullptr;       // (N, E) the gradient of probs (the aux loss's part)
    float* dweights = nullptr;     // (N, K) the gradient of weights
};

inline void moe_check_experts(const char* caller, int E, int K) {
    if (E < 1 || E > MOE_MAX_EXPERTS)
        fatal("%s: %d experts: must be 1 to %d (one warp holds a row's router logits)", caller, E, MOE_MAX_EXPERTS);
    if (K < 1 || K > E) fatal("%s: %d experts per token out of %d: must be 1 to E", caller, K, E);
}

inline void moe_check_sequences(const char* caller, int B, int T, int S) {
    if (B < 1 || T < 1 || S < T)
        fatal("%s: B = %d sequences of T = %d rows (of S = %d positions): B and T must be at least 1, S at least T",
              caller, B, T, S);
}

inline void moe_check_rows(const char* caller, long long N, int K) {
    if (N < 1) fatal("%s: %lld rows: must be at least 1", caller, N);
    if (K < 1) fatal("%s: %d experts per token: must be at least 1", caller, K);
    if (N * K > INT_MAX) fatal("%s: %lld rows of %d assignments: more than int slots can number", caller, N, K);
}

inline void moe_check_width(const char* caller, int C) {
    if (C <= 0 || C % x128::size != 0)
        fatal("%s: C = %d must be a positive multiple of %d (16 bytes of %s)", caller, C, x128::size, PRECISION_NAME);
}

// N rows of E router logits -> r.probs, r.lse, the top-K r.experts and their renormalised r.weights. Ties: smaller
// expert index first; k in descending p.
void moe_router_forward(const MoeRouting& r, const floatX* logits, const MoeShape& s, cudaStream_t stream) {
    moe_check_experts("moe_router_forward", s.E, s.K);
    moe_check_rows("moe_router_forward", s.rows(), s.K);
    launch(moe_router_forward_kernel, grid_size_for(s.rows(), MOE_WARPS_PER_BLOCK), MOE_BLOCK_SIZE, 0, stream, r.probs,
           r.lse, r.experts, r.weights, logits, s.rows(), s.E, s.K);
}

inline void moe_check_plan(const char* caller, int B, int T, int K, int E) {
    moe_check_experts(caller, E, K);
    if (B < 1 || T < 1) fatal("%s: B = %d sequences of T = %d: both must be at least 1", caller, B, T);
    moe_check_rows(caller, (long long)B * T, K);
}

// The dispatch plan's first step alone: r.routed_counts[b*E + e] = assignments of sequence b to e (from r.experts).
void moe_count_routed(const MoeRouting& r, const MoeShape& s, cudaStream_t stream) {
    moe_check_plan("moe_count_routed", s.B, s.T, s.K, s.E);
    launch(moe_count_routed_kernel, s.B, MOE_PLAN_BLOCK_SIZE, 0, stream, r.routed_counts, r.experts, s.T,
           s.K, s.E);
}

// The rest of the plan, from the r.routed_counts that moe_count_routed left (and leaves them so again): r.slots and
// expert_counts as moe_dispatch_plan's. capacity_left (B*E ints, or null: `capacity` for every one) is the room
// each sequence has left for each expert, where the pieces of a longer sequence before it used some.
void moe_place_assignments(const MoeRouting& r, int* expert_counts, const MoeShape& s, int capacity,
                           const int* capacity_left, cudaStream_t stream) {
    moe_check_plan("moe_place_assignments", s.B, s.T, s.K, s.E);
    launch(moe_expert_offsets_kernel, ceil_div(s.E, MOE_WARPS_PER_BLOCK), MOE_BLOCK_SIZE, 0, stream, expert_counts,
           r.routed_counts, s.B, s.E, capacity, capacity_left);
    launch(moe_place_kernel, s.B, MOE_PLAN_BLOCK_SIZE, 0, stream, r.slots, r.routed_counts, r.experts,
           expert_counts, s.T, s.K, s.E, capacity, capacity_left);
}

// Where each of the N*K assignments goes in the expert-sorted order: r.slots[n*K+k] = its row in the permuted
// buffer, or -1 if dropped by capacity. Sorted by expert, then by (n, k). expert_counts[e] (E ints) = kept
// assignments of expert e; r.routed_counts[b*E + e] = assignments of sequence b to e before drops.
// capacity <= 0: dropless; else at most `capacity` kept per expert per sequence, visiting (t, then k).
// Returns nothing; the caller copies expert_counts to the host when it needs them.
void moe_dispatch_plan(const MoeRouting& r, int* expert_counts, const MoeShape& s, int capacity, cudaStream_t stream) {
    moe_count_routed(r, s, stream);
    moe_place_assignments(r, expert_counts, s, capacity, nullptr, stream);
}

// permuted[r.slots[n*K+k]] = inp[n] for every kept assignment (C channels)
void moe_permute_forward(floatX* permuted, const floatX* inp, const MoeRouting& r, const MoeShape& s,
                         cudaStream_t stream) {
    moe_check_rows("moe_permute_forward", s.rows(), s.K);
    moe_check_width("moe_permute_forward", s.C);
    launch(moe_permute_forward_kernel, grid_size_for((long long)s.rows() * s.K * (s.C / x128::size), MOE_BLOCK_SIZE),
           MOE_BLOCK_SIZE, 0, stream, permuted, inp, r.slots, s.rows(), s.K, s.C);
}

// dinp[n] = sum over kept k (in order k = 0..K-1, summed in fp32) of dpermuted[r.slots[n*K+k]]  (overwrites; 0 if
// all dropped)
void moe_permute_backward(floatX* dinp, const floatX* dpermuted, const MoeRouting& r, const MoeShape& s,
                          cudaStream_t stream) {
    moe_check_rows("moe_permute_backward", s.rows(), s.K);
    moe_check_width("moe_permute_backward", s.C);
    launch(moe_gather_rows_kernel, grid_size_for((long long)s.rows() * (s.C / x128::size), MOE_BLOCK_SIZE),
           MOE_BLOCK_SIZE, 0, stream, dinp, dpermuted, r.slots, (const float*)nullptr, s.rows(), s.K, s.C);
}

// out[n] = sum over kept k (in order, fp32) of r.weights[n*K+k] * expert_out[r.slots[n*K+k]]  (overwrites)
void moe_unpermute_forward(floatX* out, const floatX* expert_out, const MoeRouting& r, const MoeShape& s,
                           cudaStream_t stream) {
    moe_check_rows("moe_unpermute_forward", s.rows(), s.K);
    moe_check_width("moe_unpermute_forward", s.C);
    launch(moe_gather_rows_kernel, grid_size_for((long long)s.rows() * (s.C / x128::size), MOE_BLOCK_SIZE),
           MOE_BLOCK_SIZE, 0, stream, out, expert_out, r.slots, r.weights, s.rows(), s.K,
           s.C);
}

// dexpert_out[slot] = r.weights[n*K+k] * dout[n] for kept (n,k); r.dweights[n*K+k] = dot(dout[n], expert_out[slot])
// in fp32 (0 if dropped)
void moe_unpermute_backward(floatX* dexpert_out, const floatX* dout, const floatX* expert_out, const MoeRouting& r,
                            const MoeShape& s, cudaStream_t stream) {
    moe_check_rows("moe_unpermute_backward", s.rows(), s.K);
    moe_check_width("moe_unpermute_backward", s.C);
    launch(moe_unpermute_backward_kernel, grid_size_for(s.rows(), MOE_WARPS_PER_BLOCK), MOE_BLOCK_SIZE, 0, stream,
           dexpert_out, r.dweights, dout, expert_out, r.slots, r.weights, s.rows(), s.K, s.C);
}

// data[i] = data[i] * factor in fp32, rounded once to floatX, for i < count
void moe_scale(floatX* data, float factor, size_t count, cudaStream_t stream) {
    if (count == 0) return;
    launch(moe_scale_kernel, grid_size_for((long long)count, MOE_BLOCK_SIZE), MOE_BLOCK_SIZE, 0, stream, data, factor,
           count);
}

// The aux loss's value and the z-loss's: aux_sum += sum_b E * sum_e f[b,e] P[b,e]; z_sum += sum_n lse[n]^2 (fp32
// device scalars; the caller divides by B and N). T rows per sequence here, of its S positions.
void moe_aux_loss_forward(float* aux_sum, float* z_sum, const MoeRouting& r, const MoeShape& s, cudaStream_t stream) {
    moe_check_experts("moe_aux_loss_forward", s.E, s.K);
    moe_check_sequences("moe_aux_loss_forward", s.B, s.T, s.S);
    launch(moe_aux_loss_forward_kernel, 1, MOE_AUX_BLOCK_SIZE, 0, stream, aux_sum, z_sum, r.probs,
           r.lse, r.routed_counts, s.B, s.T, s.S, s.E, s.K);
}

// the aux loss's gradient: r.dprobs[n*E+e] = aux_scale * E * f[b,e] / S   (overwrites: dprobs starts as the aux part)
void moe_aux_loss_backward(const MoeRouting& r, const MoeShape& s, float aux_scale, cudaStream_t stream) {
    moe_check_experts("moe_aux_loss_backward", s.E, s.K);
    moe_check_sequences("moe_aux_loss_backward", s.B, s.T, s.S);
    launch(moe_aux_loss_backward_kernel, grid_size_for((long long)s.rows() * s.E, MOE_BLOCK_SIZE), MOE_BLOCK_SIZE, 0,
           stream, r.dprobs, r.routed_counts, s.B, s.T, s.S, s.E, s.K, aux_scale);
}

// dlogits (floatX, N x E) from r.dprobs (the aux part; read only) plus the renormalised weights' gradient
// r.dweights and the z-loss (z_scale * 2 * lse * p); see the spec for the formulas.
void moe_router_backward(floatX* dlogits, const MoeRouting& r, const MoeShape& s, float z_scale, cudaStream_t stream) {
    moe_check_experts("moe_router_backward", s.E, s.K);
    moe_check_rows("moe_router_backward", s.rows(), s.K);
    launch(moe_router_backward_kernel, grid_size_for(s.rows(), MOE_WARPS_PER_BLOCK), MOE_BLOCK_SIZE, 0, stream,
           dlogits, r.dprobs, r.probs, r.lse, r.experts,
           r.weights, r.dweights, s.rows(), s.E, s.K, z_scale);
}
