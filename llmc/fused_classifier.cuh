/*
The fused classifier: softmax, cross-entropy loss and the gradient of the loss with respect to the
logits, in one kernel that reads each row of logits twice and writes it once.

For one row (one token position) with logits z_0 .. z_{V-1} and target class t:

    softmax     p_j  = exp(z_j - m) / S,      m = max_j z_j,   S = sum_j exp(z_j - m)
    loss        L    = -log p_t = log S + m - z_t                   (m + log S is the log-sum-exp)
    gradient    dL/dz_j = p_j - [j == t]

Subtracting the row maximum m changes nothing mathematically (it cancels between numerator and S) but
keeps every exp() at most 1, so nothing overflows in fp32.

The training loss is the mean over the N rows, so each row's gradient is multiplied by dloss = dMean/dL
(1/N for a plain mean; the caller folds in gradient accumulation over micro-steps). The logits buffer is
overwritten in place with these gradients: the forward's logits are never needed again, and the
gradient buffer for a 50304-wide vocabulary is the largest activation in GPT-2.

The vocabulary is padded from V real columns to Vp (GPT-2: 50257 -> 50304, a multiple of 64 and of the
vector width) so that rows stay aligned for 128-bit loads. Padded columns are not classes: they take no
part in the max or the sum, and their gradient is written as exactly 0 (whatever they held before).

One pass for the max and the sum ("online softmax"): each thread keeps a running maximum m and a sum S of
exp(z - m); when a larger value m' arrives, the sum so far is rescaled, S <- S * exp(m - m'). Two such
partial results (m_a, S_a) and (m_b, S_b) merge the same way:
    m = max(m_a, m_b),   S = S_a * exp(m_a - m) + S_b * exp(m_b - m)
so threads merge across the warp with shuffles, then across warps through shared memory.

Targets outside [0, V) (a corrupt data shard, an ignore marker): nothing is read at that index; the row's
loss is written as NaN so the caller's non-finite-loss check fires, and its gradient is the softmax alone,
p_j * dloss (there is no class to subtract).
*/
#pragma once

#include <cfloat>
#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// kernel

// the running (maximum, sum of exp(z - maximum)) of a set of logits; an empty set is (-FLT_MAX, 0),
// which merges with anything without producing exp(-inf + inf) = NaN
struct SoftmaxRunningSum {
    float max;
    float sum;
};

__device__ __forceinline__ SoftmaxRunningSum merge_running_sums(SoftmaxRunningSum a, SoftmaxRunningSum b) {
    SoftmaxRunningSum merged;
    merged.max = fmaxf(a.max, b.max);
    merged.sum = a.sum * expf(a.max - merged.max) + b.sum * expf(b.max - merged.max);
    return merged;
}

// One block per row. Rows are Vp long and Vp is a multiple of x128::size, so every row starts 16-byte
// aligned and is a whole number of 128-bit chunks. blockDim.x: a multiple of 32, at most 1024.
__global__ void fused_classifier_kernel(floatX* logits, float* losses, float dloss, const int* targets,
                                        int V, int Vp) {
    __shared__ SoftmaxRunningSum warp_results[32];
    const int row = blockIdx.x;
    floatX* row_logits = logits + (size_t)row * Vp;
    const int target = targets[row];
    const bool target_is_class = target >= 0 && target < V;

    // The loss needs the target's logit, and pass 2 overwrites the row: read it now, before the barrier
    // below, which every thread passes before it writes anything.
    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target_is_class) target_logit = (float)row_logits[target];

    // pass 1: running max and sum over the real columns [0, V) of this thread's chunks
    SoftmaxRunningSum mine = {-FLT_MAX, 0.0f};
    const int chunks_with_classes = ceil_div(V, x128::size);
    const GridStride class_chunks = block_stride(chunks_with_classes);
    for (size_t chunk = class_chunks.first; chunk < class_chunks.end; chunk += class_chunks.step) {
        const x128 packed = load128(row_logits + chunk * x128::size);  // plain load: pass 2 reads it again
        const int first_column = chunk * x128::size;
        float chunk_max = -FLT_MAX;
        for (int k = 0; k < x128::size; k++) {
            if (first_column + k < V) chunk_max = fmaxf(chunk_max, (float)packed[k]);
        }
        if (chunk_max > mine.max) {
            mine.sum *= expf(mine.max - chunk_max);
            mine.max = chunk_max;
        }
        for (int k = 0; k < x128::size; k++) {
            if (first_column + k < V) mine.sum += expf((float)packed[k] - mine.max);
        }
    }

    // merge across the warp (butterfly: every lane ends with the warp's result) ...
    for (int offset = 16; offset > 0; offset /= 2) {
        SoftmaxRunningSum other;
        other.max = __shfl_xor_sync(0xffffffff, mine.max, offset);
        other.sum = __shfl_xor_sync(0xffffffff, mine.sum, offset);
        mine = merge_running_sums(mine, other);
    }
    // ... then across warps: every thread merges the warp results in the same order, so all threads hold
    // bit-identical row statistics
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    if (lane == 0) warp_results[warp] = mine;
    __syncthreads();
    SoftmaxRunningSum row_stats = warp_results[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) row_stats = merge_running_sums(row_stats, warp_results[w]);

    if (threadIdx.x == 0) {
        losses[row] = target_is_class ? logf(row_stats.sum) + row_stats.max - target_logit : NAN;
    }

    // pass 2: overwrite the whole row, padding included, with the gradient
    const float inverse_sum = 1.0f / row_stats.sum;
    const GridStride row_chunks = block_stride(Vp / x128::size);
    for (size_t chunk = row_chunks.first; chunk < row_chunks.end; chunk += row_chunks.step) {
        const int first_column = chunk * x128::size;
        const x128 packed = load128cs(row_logits + first_column);  // last read of the logits
        x128 gradient;
        for (int k = 0; k < x128::size; k++) {
            const int column = first_column + k;
            float value = 0.0f;  // padded columns
            if (column < V) {
                const float probability = expf((float)packed[k] - row_stats.max) * inverse_sum;
                value = (probability - (column == target ? 1.0f : 0.0f)) * dloss;
            }
            gradient[k] = (floatX)value;
        }
        store128(row_logits + first_column, gradient);  // plain store: the matmul backward reads it next
    }
}

// ----------------------------------------------------------------------------
// launcher

// logits (N, Vp): in: the logits; out: dloss * dL/dlogits, padded columns [V, Vp) set to 0 (written).
// losses (N): the per-row cross-entropy loss (written, not accumulated); NaN for a target outside [0, V).
// dloss: the gradient of the final loss with respect to each row's loss (e.g. 1/N for the mean).
// Requires Vp % x128::size == 0 (8 in BF16, 4 in FP32) and a 16-byte aligned logits pointer.
// threads_per_row: the block size, a multiple of 32 up to 1024; 0 picks the device's best (see below).
inline void fused_classifier(floatX* logits, float* losses, float dloss, const int* targets, int N, int V,
                             int Vp, cudaStream_t stream, int threads_per_row = 0) {
    if (V <= 0 || V > Vp || Vp % x128::size != 0) {
        fprintf(stderr, "error: fused_classifier needs 0 < V <= Vp and Vp a multiple of %d (got V=%d, Vp=%d)\n",
                x128::size, V, Vp);
        exit(EXIT_FAILURE);
    }
    if (N <= 0) return;
    // 512 threads: enough loads in flight per row on the GPU (1024 gains little, since a row is only
    // ~6K chunks). The CPU device pays for every emulated thread (a fiber, and a switch at each shuffle
    // and barrier) and gains nothing from more of them: one warp per row there.
#ifdef LLMC_CPU
    const int block_size = threads_per_row > 0 ? threads_per_row : 32;
#else
    const int block_size = threads_per_row > 0 ? threads_per_row : 512;
#endif
    launch(fused_classifier_kernel, N, block_size, 0, stream, logits, losses, dloss, targets, V, Vp);
}

// ----------------------------------------------------------------------------
// the loss the host reads: the mean over rows, then over micro-batches, kept on the device
//
// The training loop reads the loss once per step, together with the gradient norm, instead of waiting for
// each micro-batch's losses (the host would idle through every backward pass). One thread adds the rows
// in order, in double, and rounds each micro-batch's mean to float before adding it to the running sum:
// exactly what the host loop did, so the logged losses keep their bits. (One thread: about 0.1 ms for the
// 16K rows of a B=16, T=1024 micro-batch, next to the micro-step's hundreds of milliseconds.)

__global__ void accumulate_mean_loss_kernel(double* running_sum, const float* losses, int N) {
    double total = 0.0;
    for (int i = 0; i < N; i++) total += losses[i];
    *running_sum += (double)(float)(total / N);
}

__global__ void finish_mean_loss_kernel(float* mean, double* running_sum, int count) {
    *mean = (float)(*running_sum / count);
    *running_sum = 0.0;
}

// running_sum += mean of losses[0, N), rounded to float
inline void accumulate_mean_loss(double* running_sum, const float* losses, int N, cudaStream_t stream) {
    launch(accumulate_mean_loss_kernel, 1, 1, 0, stream, running_sum, losses, N);
}

// mean = running_sum / count (the mean over `count` accumulated means), and running_sum restarts at 0
inline void finish_mean_loss(float* mean, double* running_sum, int count, cudaStream_t stream) {
    launch(finish_mean_loss_kernel, 1, 1, 0, stream, mean, running_sum, count);
}
