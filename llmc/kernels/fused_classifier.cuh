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

Under tensor parallelism each rank holds only a slice of the vocabulary's columns: the three kernels of
"the vocabulary-parallel classifier" below compute the same loss and gradient from per-slice statistics
that the caller combines with two small all-reduces.
*/
#pragma once

#include <algorithm>
#include <cfloat>
#include "../cuda_common.cuh"

// ----------------------------------------------------------------------------
// kernel (and the two passes every classifier kernel here shares)

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

// Pass 1 over one row, shared by every classifier kernel below: the running (max, sum) of
// row_logits[0, classes), merged over the whole block. Every thread returns bit-identical statistics.
// classes may be 0 (the result is then the empty set's). warp_results: the kernel's __shared__ array of 32.
// Contains a __syncthreads that every thread of the block must reach.
__device__ __forceinline__ SoftmaxRunningSum block_softmax_running_sum(const floatX* row_logits, int classes,
                                                                       SoftmaxRunningSum* warp_results) {
    SoftmaxRunningSum mine = {-FLT_MAX, 0.0f};
    const int chunks_with_classes = ceil_div(classes, x128::size);
    const GridStride class_chunks = block_stride(chunks_with_classes);
    for (size_t chunk = class_chunks.first; chunk < class_chunks.end; chunk += class_chunks.step) {
        const x128 packed = load128(row_logits + chunk * x128::size);  // plain load: pass 2 reads it again
        const int first_column = chunk * x128::size;
        float chunk_max = -FLT_MAX;
        for (int k = 0; k < x128::size; k++) {
            if (first_column + k < classes) chunk_max = fmaxf(chunk_max, (float)packed[k]);
        }
        if (chunk_max > mine.max) {
            mine.sum *= expf(mine.max - chunk_max);
            mine.max = chunk_max;
        }
        for (int k = 0; k < x128::size; k++) {
            if (first_column + k < classes) mine.sum += expf((float)packed[k] - mine.max);
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
    return row_stats;
}

// Pass 2 over one row, shared by every classifier kernel below: overwrite row_logits[0, columns) with
// dloss * (softmax - onehot) for the classes [0, classes) and with exact zeros for the rest.
// target_column: the target's column in this row, or any value outside [0, classes) when it has none.
__device__ __forceinline__ void write_softmax_gradient(floatX* row_logits, int columns, int classes, int target_column,
                                                       SoftmaxRunningSum row_stats, float dloss) {
    const float inverse_sum = 1.0f / row_stats.sum;
    const GridStride row_chunks = block_stride(columns / x128::size);
    for (size_t chunk = row_chunks.first; chunk < row_chunks.end; chunk += row_chunks.step) {
        const int first_column = chunk * x128::size;
        const x128 packed = load128cs(row_logits + first_column);  // last read of the logits
        x128 gradient;
        for (int k = 0; k < x128::size; k++) {
            const int column = first_column + k;
            float value = 0.0f;  // padded columns
            if (column < classes) {
                const float probability = expf((float)packed[k] - row_stats.max) * inverse_sum;
                value = (probability - (column == target_column ? 1.0f : 0.0f)) * dloss;
            }
            gradient[k] = (floatX)value;
        }
        store128(row_logits + first_column, gradient);  // plain store: the matmul backward reads it next
    }
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
    // in pass 1, which every thread passes before it writes anything.
    float target_logit = 0.0f;
    if (threadIdx.x == 0 && target_is_class) target_logit = (float)row_logits[target];

    // pass 1: max and sum over the real columns [0, V)
    const SoftmaxRunningSum row_stats = block_softmax_running_sum(row_logits, V, warp_results);
    if (threadIdx.x == 0) {
        losses[row] = target_is_class ? logf(row_stats.sum) + row_stats.max - target_logit : NAN;
    }
    // pass 2: overwrite the whole row, padding included, with the gradient
    write_softmax_gradient(row_logits, Vp, V, target, row_stats, dloss);
}

// ----------------------------------------------------------------------------
// launcher (one rank: the whole vocabulary)

// Threads per row (the block size) of every classifier kernel: `requested` when positive. Otherwise 512
// on the GPU: enough loads in flight per row (1024 gains little, since a row is only ~6K chunks). The CPU
// device pays for every emulated thread (a fiber, and a switch at each shuffle and barrier) and gains
// nothing from more of them: one warp per row there.
inline int classifier_block_size(int requested) {
    if (requested > 0) return requested;
#ifdef LLMC_CPU
    return 32;
#else
    return 512;
#endif
}

// logits (N, Vp): in: the logits; out: dloss * dL/dlogits, padded columns [V, Vp) set to 0 (written).
// losses (N): the per-row cross-entropy loss (written, not accumulated); NaN for a target outside [0, V).
// dloss: the gradient of the final loss with respect to each row's loss (e.g. 1/N for the mean).
// Requires Vp % x128::size == 0 (8 in BF16, 4 in FP32) and a 16-byte aligned logits pointer.
// threads_per_row: the block size, a multiple of 32 up to 1024; 0 picks the device's best (see above).
inline void fused_classifier(floatX* logits, float* losses, float dloss, const int* targets, int N, int V,
                             int Vp, cudaStream_t stream, int threads_per_row = 0) {
    if (V <= 0 || V > Vp || Vp % x128::size != 0) {
        fprintf(stderr, "error: fused_classifier needs 0 < V <= Vp and Vp a multiple of %d (got V=%d, Vp=%d)\n",
                x128::size, V, Vp);
        exit(EXIT_FAILURE);
    }
    if (N <= 0) return;
    launch(fused_classifier_kernel, N, classifier_block_size(threads_per_row), 0, stream, logits, losses, dloss,
           targets, V, Vp);
}

// ----------------------------------------------------------------------------
// the vocabulary-parallel classifier (tensor parallelism)
/*
Under tensor parallelism each rank owns a contiguous slice of the padded vocabulary: the rows
[vocab_start, vocab_start + Vp_local) of wte, and so (the LM head is tied to wte) the same columns of the
logits. The full (N, Vp) logits are never gathered. The softmax needs statistics of whole rows, and they
split over the slices exactly as the running sums above split over threads. With rank r's classes K_r
(its columns j whose global index vocab_start + j is below V; possibly none):

    m_r = max_{j in K_r} z_j                   S_r = sum_{j in K_r} exp(z_j - m_r)      (empty: -FLT_MAX, 0)
    m   = max_r m_r                            S   = sum_r S_r * exp(m_r - m)
    z_t = sum_r (z_t if rank r owns t, else 0)      exactly one rank owns each target t in [0, V)

    loss      L = log S + m - z_t                                   (the same on every rank)
    gradient  dL/dz_j = exp(z_j - m) / S - [j == t]                 for rank r's own columns: needs only m, S

Three kernels, and between them two all-reduces over the tp group that the CALLER issues (a launcher never
communicates, so the collectives stay visible in the model code):

    1. vocab_parallel_softmax_partials     m_r, S_r and the owned target logit per row
           all_reduce(stats, N, Max)               stats[0, N) becomes m on every rank
    2. vocab_parallel_rescale_sums         S_r <- S_r * exp(m_r - m)
           all_reduce(stats + N, 2N, Sum)          S and z_t on every rank, in one call
    3. vocab_parallel_loss_and_gradient    every rank writes the same losses, and this rank's columns of
                                           the gradient in place of its logits

Per row, 3 floats cross the network instead of a Vp-wide row of logits.

The statistics buffer, 4N floats of device memory (vocab_parallel_stats_floats):
    stats[0, N)     row max: kernel 1 writes m_r; after the Max all-reduce it holds m
    stats[N, 2N)    row sum: kernel 1 writes S_r (relative to m_r); kernel 2 rescales it to m;
                    after the Sum all-reduce it holds S
    stats[2N, 3N)   target logit: z_t on the owning rank, 0 elsewhere; after the Sum all-reduce z_t
                    (x + 0 = x exactly, so every rank sees the owner's bits)
    stats[3N, 4N)   m_r again, kept for kernel 2, since the Max all-reduce overwrites stats[0, N)

A slice without classes reports (-FLT_MAX, 0); kernel 2 turns its sum into 0 * exp(-FLT_MAX - m) = 0, and
exp() of a non-positive argument never overflows, so no NaN appears. A target outside [0, V) is owned by
no rank: its loss is NaN and its gradient is the softmax alone, as in fused_classifier.

Determinism: every kernel reduces in a fixed order (the helpers above); the order of the all-reduces is
the collective's. With one rank (vocab_start = 0, Vp_local = Vp) the three kernels give the same bits as
fused_classifier at the same threads_per_row: kernel 2 multiplies by exp(0) = 1, all else is the same.
*/

// the number of floats of the statistics buffer for N rows
inline size_t vocab_parallel_stats_floats(int N) { return (size_t)4 * N; }

// the column of `target` in this rank's slice, or -1 when the slice does not own it (not a class here)
__device__ __forceinline__ int owned_target_column(int target, int vocab_start, int classes_local) {
    const long long column = (long long)target - vocab_start;  // no overflow for any int target
    return column >= 0 && column < classes_local ? (int)column : -1;
}

// Kernel 1, one block per row: this slice's (m_r, S_r) over its classes [0, classes_local), and the
// target's logit where this slice owns it.
__global__ void vocab_parallel_softmax_partials_kernel(float* stats, const floatX* logits, const int* targets, int N,
                                                       int vocab_start, int Vp_local, int classes_local) {
    __shared__ SoftmaxRunningSum warp_results[32];
    const int row = blockIdx.x;
    const floatX* row_logits = logits + (size_t)row * Vp_local;
    const SoftmaxRunningSum partial = block_softmax_running_sum(row_logits, classes_local, warp_results);
    if (threadIdx.x == 0) {
        const int target_column = owned_target_column(targets[row], vocab_start, classes_local);
        stats[row] = partial.max;
        stats[N + row] = partial.sum;
        stats[2 * N + row] = target_column >= 0 ? (float)row_logits[target_column] : 0.0f;
        stats[3 * N + row] = partial.max;
    }
}

// Kernel 2, a grid-stride loop over rows: S_r <- S_r * exp(m_r - m), with m = stats[row] (the all-reduced
// max) and m_r = stats[3N + row]
__global__ void vocab_parallel_rescale_sums_kernel(float* stats, int N) {
    const GridStride rows = grid_stride(N);
    for (size_t row = rows.first; row < rows.end; row += rows.step) {
        stats[N + row] *= expf(stats[3 * N + row] - stats[row]);
    }
}

// Kernel 3, one block per row: the loss from the global statistics, and the gradient on this slice
__global__ void vocab_parallel_loss_and_gradient_kernel(floatX* logits, float* losses, const float* stats, float dloss,
                                                        const int* targets, int N, int vocab_start, int Vp_local,
                                                        int classes_local, int V) {
    const int row = blockIdx.x;
    const SoftmaxRunningSum row_stats = {stats[row], stats[N + row]};
    const int target = targets[row];
    if (threadIdx.x == 0) {
        const bool target_is_class = target >= 0 && target < V;
        losses[row] = target_is_class ? logf(row_stats.sum) + row_stats.max - stats[2 * N + row] : NAN;
    }
    write_softmax_gradient(logits + (size_t)row * Vp_local, Vp_local, classes_local,
                           owned_target_column(target, vocab_start, classes_local), row_stats, dloss);
}

// Launchers. Arguments common to all three:
//   N rows; this rank's slice is the global columns [vocab_start, vocab_start + Vp_local); V real classes
//   (global indices [0, V), the rest is padding). Requires vocab_start >= 0, V > 0 and Vp_local a positive
//   multiple of x128::size (8 in BF16, 4 in FP32), so each local row starts 16-byte aligned.
//   stats: 4N floats, laid out as above. threads_per_row: as for fused_classifier (0: the device's best).

// the classes among this slice's columns: global index below V, clamped to [0, Vp_local]
inline int vocab_parallel_classes(const char* caller, int vocab_start, int Vp_local, int V) {
    if (V <= 0 || vocab_start < 0 || Vp_local <= 0 || Vp_local % x128::size != 0) {
        fprintf(stderr, "error: %s needs V > 0, vocab_start >= 0 and Vp_local a positive multiple of %d (got V=%d, "
                "vocab_start=%d, Vp_local=%d)\n", caller, x128::size, V, vocab_start, Vp_local);
        exit(EXIT_FAILURE);
    }
    return std::min(std::max(V - vocab_start, 0), Vp_local);
}

// logits (N, Vp_local): this rank's columns (read). stats: written, all 4N floats (the row max twice).
// Next: the caller all-reduces stats[0, N) with Reduction::Max.
inline void vocab_parallel_softmax_partials(float* stats, const floatX* logits, const int* targets, int N,
                                            int vocab_start, int Vp_local, int V, cudaStream_t stream,
                                            int threads_per_row = 0) {
    const int classes_local = vocab_parallel_classes("vocab_parallel_softmax_partials", vocab_start, Vp_local, V);
    if (N <= 0) return;
    launch(vocab_parallel_softmax_partials_kernel, N, classifier_block_size(threads_per_row), 0, stream, stats, logits,
           targets, N, vocab_start, Vp_local, classes_local);
}

// stats[N, 2N) *= exp(stats[3N, 4N) - stats[0, N)), in place. Next: the caller all-reduces stats[N, 3N)
// (2N floats) with Reduction::Sum.
inline void vocab_parallel_rescale_sums(float* stats, int N, cudaStream_t stream) {
    if (N <= 0) return;
    const int block_size = 256;
    launch(vocab_parallel_rescale_sums_kernel, grid_size_for(N, block_size), block_size, 0, stream, stats, N);
}

// logits (N, Vp_local): in: this rank's logits; out: dloss * dL/dlogits on this rank's columns, 0 on columns
// whose global index is >= V (written). losses (N): written, the same values on every rank; NaN for a
// target outside [0, V). stats: read, after both all-reduces.
inline void vocab_parallel_loss_and_gradient(floatX* logits, float* losses, const float* stats, float dloss,
                                             const int* targets, int N, int vocab_start, int Vp_local, int V,
                                             cudaStream_t stream, int threads_per_row = 0) {
    const int classes_local = vocab_parallel_classes("vocab_parallel_loss_and_gradient", vocab_start, Vp_local, V);
    if (N <= 0) return;
    launch(vocab_parallel_loss_and_gradient_kernel, N, classifier_block_size(threads_per_row), 0, stream, logits,
           losses, stats, dloss, targets, N, vocab_start, Vp_local, classes_local, V);
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
