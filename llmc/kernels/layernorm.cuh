/*
Layer normalization, forward and backward, and the residual addition that comes before it (fused).

For one row x of C values (the activation of one token):
    mean   = (1/C) sum_i x_i
    var    = (1/C) sum_i (x_i - mean)^2            biased: the row is the whole population
    rstd   = 1 / sqrt(var + 1e-5)
    norm_i = (x_i - mean) * rstd
    out_i  = norm_i * weight_i + bias_i
mean and rstd (fp32, one of each per row) are kept for the backward pass.

Backward, for one row, with dnorm_i = dout_i * weight_i:
    dbias_i   += dout_i                                   (summed over all rows)
    dweight_i += dout_i * norm_i                          (summed over all rows)
    dinp_i    += rstd * (dnorm_i - mean_j(dnorm_j) - norm_i * mean_j(dnorm_j * norm_j))
The last line is the chain rule through mean and rstd: moving one x_i moves the mean, which shifts every
norm_j equally (the first correction), and changes the spread, which scales every norm_j in proportion
to itself (the second correction).

RMSNorm (Llama's norm) is layernorm without the centering and without the bias, for an epsilon the model
chooses:
    rstd   = 1 / sqrt((1/C) sum_i x_i^2 + epsilon)
    norm_i = x_i * rstd,   out_i = norm_i * weight_i
    dweight_i += dout_i * norm_i                          (summed over all rows)
    dinp_i    += rstd * (dnorm_i - norm_i * mean_j(dnorm_j * norm_j))
The mean is no longer a function of x, so its correction drops out; rstd's remains. The same kernels run
both norms (a template parameter, Norm), so only rstd is kept per row and there is no dbias.

The residual addition on its own (out = inp1 + inp2, the end of a transformer block, where no layernorm
follows inside the block) is residual_forward.

What each launcher does with its outputs:
    residual_forward                  out: overwritten
    layernorm_forward                 out, mean, rstd: overwritten (mean/rstd may be null: not kept)
    fused_residual_layernorm_forward  residual, normed, mean, rstd: overwritten
    layernorm_backward                dinp, dweight, dbias: ACCUMULATED (+=). dinp is the gradient of the
                                      residual stream, which already holds the gradient of the skip
                                      connection; dweight/dbias accumulate over micro-steps.
    rmsnorm_forward, fused_residual_rmsnorm_forward, rmsnorm_backward: the same, without mean and bias.

Work split: one warp per row. The 32 lanes stride across the row in 16-byte chunks, so a row needs two
warp reductions and no block-wide synchronisation. All statistics are fp32, whatever floatX is.

The backward pass sums dweight/dbias over all N rows without atomics, so that it gives the same bits on
every run: each warp adds its rows into a private fp32 slice of shared memory, the block adds its warps'
slices in warp order and writes one partial sum per block to `scratch`, and add_column_partials() adds
the blocks' partials in a fixed order (llmc/cuda_common.cuh).

Width. The warps' slices take 8 warps x 2C floats (layernorm; C for RMSNorm): 64 C bytes, 48 KiB at
C = 768 and 112 KiB at 1600, but 512 KiB at Llama 3 405B's C = 16384, far above a block's 227 KiB on an
H100 (163 KiB on an A100). So the backward grid splits the columns over blockIdx.y into as few bands as
fit (norm_backward_bands): each block keeps the slices of its band only and writes dinp for its band,
while still reading its rows whole in the first pass for the two row means. A band's block adds exactly
what the whole row's would, in the same order, so the split changes no bit; every GPT-2 width is one band
on both GPUs, where the kernel is the one-band kernel it always was. The price of more bands is the first
pass's reads, repeated per band (at C = 16384 in BF16 on an H100: 5 bands).
Constraints: C % x128::size == 0 (8 in BF16, 4 in FP32), which every named model's width meets.
Scratch for the backward pass: layernorm_backward_scratch_floats(N, C) floats (2*C per block along x; the
number of blocks depends on the device's multiprocessor count, not on the bands). RMSNorm's needs half of
each (one sum per column).
*/
#pragma once

#include "../cuda_common.cuh"

constexpr float LAYERNORM_EPSILON = 1e-5f;
constexpr int LAYERNORM_WARPS_PER_BLOCK = 8;
constexpr int LAYERNORM_BLOCK_SIZE = LAYERNORM_WARPS_PER_BLOCK * 32;
// backward blocks resident per multiprocessor: 48 KiB of shared memory each at C=768 lets three fit on an
// A100 (164 KiB) and an H100 (227 KiB); more blocks would only add partial sums to combine
constexpr int LAYERNORM_BACKWARD_BLOCKS_PER_SM = 3;

// ----------------------------------------------------------------------------
// kernels

// Which norm a kernel runs: layernorm (GPT-2) or RMSNorm (Llama).
enum class Norm { Layer, RMS };

// One warp normalizes one row: for layernorm two passes for the statistics (the second subtracts the mean
// before squaring, which keeps the variance accurate when the mean is large), for RMSNorm one; then a pass
// writes the output. The row is re-read from memory each pass; 1.5 KiB per row stays in L1. RMSNorm reads
// no bias and writes no mean.
template <Norm norm>
__device__ void norm_row(floatX* out_row, float* mean_out, float* rstd_out, const floatX* x_row, const floatX* weight,
                         const floatX* bias, int C, int lane, float epsilon) {
    float mean = 0.0f;
    if (norm == Norm::Layer) {
        float sum = 0.0f;
        for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
            const x128 x = load128(x_row + c);
            for (int k = 0; k < x128::size; k++) sum += (float)x[k];
        }
        mean = warp_reduce_sum(sum) / (float)C;
    }

    float squares = 0.0f;
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        const x128 x = load128(x_row + c);
        for (int k = 0; k < x128::size; k++) {
            const float centered = (float)x[k] - mean;
            squares += centered * centered;
        }
    }
    const float rstd = rsqrtf(warp_reduce_sum(squares) / (float)C + epsilon);

    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
        const x128 x = load128cs(x_row + c);  // last use of the row
        const x128 w = load128(weight + c);
        x128 result;
        if (norm == Norm::Layer) {
            const x128 b = load128(bias + c);
            for (int k = 0; k < x128::size; k++) result[k] = (floatX)(((float)x[k] - mean) * rstd * (float)w[k] + (float)b[k]);
        } else {
            for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)x[k] * rstd * (float)w[k]);
        }
        store128(out_row + c, result);
    }
    if (norm == Norm::Layer && lane == 0 && mean_out != nullptr) *mean_out = mean;
    if (lane == 0 && rstd_out != nullptr) *rstd_out = rstd;
}

// out[row] = norm(inp[row]); a grid-stride loop over rows, one warp per row.
template <Norm norm>
__device__ void norm_forward_rows(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, float epsilon) {
    const int warps_per_block = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    // `row` is the same for all lanes of a warp, so whole warps leave the loop together and the
    // shuffles inside norm_row always see all 32 lanes
    for (int row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < N; row += gridDim.x * warps_per_block) {
        norm_row<norm>(out + (size_t)row * C, mean ? mean + row : nullptr, rstd ? rstd + row : nullptr,
                       inp + (size_t)row * C, weight, bias, C, lane, epsilon);
    }
}

__global__ void layernorm_forward_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C) {
    norm_forward_rows<Norm::Layer>(out, mean, rstd, inp, weight, bias, N, C, LAYERNORM_EPSILON);
}
__global__ void rmsnorm_forward_kernel(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C,
                                       float epsilon) {
    norm_forward_rows<Norm::RMS>(out, nullptr, rstd, inp, weight, nullptr, N, C, epsilon);
}

// residual = inp1 + inp2 (rounded to floatX, as it is stored), normed = norm(residual).
// The statistics are taken from the rounded residual, so that the backward pass, which only sees the
// stored residual, differentiates exactly the function that was computed.
template <Norm norm>
__device__ void residual_norm_rows(floatX* residual, floatX* normed, float* mean, float* rstd, const floatX* inp1,
                                   const floatX* inp2, const floatX* weight, const floatX* bias, int N, int C,
                                   float epsilon) {
    const int warps_per_block = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < N; row += gridDim.x * warps_per_block) {
        const size_t offset = (size_t)row * C;
        // Each lane writes the chunks that it alone reads back in norm_row (same lane-to-chunk mapping), so no
        // synchronisation is needed between the two.
        for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
            const x128 a = load128cs(inp1 + offset + c);
            const x128 b = load128cs(inp2 + offset + c);
            x128 sum;
            for (int k = 0; k < x128::size; k++) sum[k] = (floatX)((float)a[k] + (float)b[k]);
            store128(residual + offset + c, sum);
        }
        norm_row<norm>(normed + offset, mean ? mean + row : nullptr, rstd + row, residual + offset, weight, bias, C,
                       lane, epsilon);
    }
}

__global__ void fused_residual_layernorm_forward_kernel(floatX* residual, floatX* normed, float* mean, float* rstd,
                                                        const floatX* inp1, const floatX* inp2,
                                                        const floatX* weight, const floatX* bias, int N, int C) {
    residual_norm_rows<Norm::Layer>(residual, normed, mean, rstd, inp1, inp2, weight, bias, N, C, LAYERNORM_EPSILON);
}
__global__ void fused_residual_rmsnorm_forward_kernel(floatX* residual, floatX* normed, float* rstd,
                                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                                      int N, int C, float epsilon) {
    residual_norm_rows<Norm::RMS>(residual, normed, nullptr, rstd, inp1, inp2, weight, nullptr, N, C, epsilon);
}

// out = inp1 + inp2, a grid-stride loop over 16-byte chunks
__global__ void residual_forward_kernel(floatX* out, const floatX* inp1, const floatX* inp2, size_t N) {
    const GridStride chunks = grid_stride(N / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const x128 a = load128cs(inp1 + i);
        const x128 b = load128cs(inp2 + i);
        x128 sum;
        for (int k = 0; k < x128::size; k++) sum[k] = (floatX)((float)a[k] + (float)b[k]);
        store128(out + i, sum);
    }
}

// Each warp keeps its running sums of dout*norm (dweight) and dout (dbias) in its own slice of shared
// memory: [dweight sums | dbias sums], each `slice_width` floats (C rounded up to whole 32-lane passes).
// Within a slice, column c sits at layernorm_slice_index(c): lane-minor, so that when all 32 lanes add
// element k of their chunks they touch 32 consecutive floats, one per shared memory bank (stored by
// column, lanes 8 floats apart would collide 8 ways on the same banks).
__host__ __device__ inline int layernorm_slice_width(int C) { return ceil_div(C, 32 * x128::size) * 32 * x128::size; }

__device__ inline int layernorm_slice_index(int c) {
    const int chunk = c / x128::size;  // chunk `chunk` belongs to lane chunk % 32, in pass chunk / 32
    const int pass = chunk / 32;
    const int lane = chunk % 32;
    const int k = c % x128::size;
    return (pass * x128::size + k) * 32 + lane;
}

// The column sums a norm's backward pass adds up: dweight and dbias (layernorm), dweight (RMSNorm).
__host__ __device__ constexpr int norm_column_sums(Norm norm) { return norm == Norm::Layer ? 2 : 1; }

// dinp += the norm's backward pass (see the top of the file) for the columns of this block's band,
// [blockIdx.y * band_width, + band_width) (band_width a multiple of 32 chunks, so that a lane takes the same
// chunks of the band as of the whole row); this block's sums of dout*norm (dweight) and, for layernorm, dout
// (dbias) over its rows go to partials[0][blockIdx.x][band] and partials[1][blockIdx.x][band].
// The row means the chain rule needs are sums over the whole row, so every band's block reads whole rows in
// the first pass, in the same order: the band a column falls in changes none of its bits.
// Dynamic shared memory: warps_per_block * norm_column_sums(norm) * layernorm_slice_width(band_width) floats.
template <Norm norm>
__device__ void norm_backward_rows(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                   const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                   int band_width) {
    DYNAMIC_SHARED(float, warp_sums);
    constexpr int sums = norm_column_sums(norm);
    const int warps_per_block = blockDim.x / 32;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int band_begin = blockIdx.y * band_width;
    const int band_end = min(band_begin + band_width, C);
    const int slice_width = layernorm_slice_width(band_end - band_begin);

    for (int i = threadIdx.x; i < warps_per_block * sums * slice_width; i += blockDim.x) warp_sums[i] = 0.0f;
    __syncthreads();  // the zeroing above crosses warp slices; no warp may add into a slice before it is clear

    float* dweight_sum = warp_sums + (size_t)warp * sums * slice_width;
    float* dbias_sum = dweight_sum + slice_width;  // layernorm only
    for (int row = blockIdx.x * warps_per_block + warp; row < N; row += gridDim.x * warps_per_block) {
        const floatX* dout_row = dout + (size_t)row * C;
        const floatX* inp_row = inp + (size_t)row * C;
        floatX* dinp_row = dinp + (size_t)row * C;
        const float row_mean = norm == Norm::Layer ? mean[row] : 0.0f;
        const float row_rstd = rstd[row];

        // first pass, over the whole row: the row means the chain rule needs, and the band's share of dweight
        // (and dbias). The two products that are summed are fused with their sums (fmaf) by hand, so that the
        // bits do not depend on whether the compiler contracts them, which changes with the shape of the code.
        float sum_dnorm = 0.0f;
        float sum_dnorm_norm = 0.0f;
        for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
            const bool in_band = c >= band_begin && c < band_end;  // a chunk never straddles a band's edge
            const x128 g = load128(dout_row + c);
            const x128 x = load128(inp_row + c);
            const x128 w = load128(weight + c);
            for (int k = 0; k < x128::size; k++) {
                const float normed = ((float)x[k] - row_mean) * row_rstd;
                const float dnorm = (float)g[k] * (float)w[k];
                sum_dnorm += dnorm;
                sum_dnorm_norm = fmaf(dnorm, normed, sum_dnorm_norm);
                if (in_band) {
                    const int slot = layernorm_slice_index(c + k - band_begin);
                    dweight_sum[slot] = fmaf((float)g[k], normed, dweight_sum[slot]);
                    if (norm == Norm::Layer) dbias_sum[slot] += (float)g[k];
                }
            }
        }
        // RMSNorm's mean is not a function of x: no correction for it
        const float mean_dnorm = norm == Norm::Layer ? warp_reduce_sum(sum_dnorm) / (float)C : 0.0f;
        const float mean_dnorm_norm = warp_reduce_sum(sum_dnorm_norm) / (float)C;

        // second pass, over the band: accumulate the input gradient
        for (int c = band_begin + lane * x128::size; c < band_end; c += 32 * x128::size) {
            const x128 g = load128cs(dout_row + c);
            const x128 x = load128cs(inp_row + c);
            const x128 w = load128(weight + c);
            const x128 previous = load128(dinp_row + c);
            x128 result;
            for (int k = 0; k < x128::size; k++) {
                const float normed = ((float)x[k] - row_mean) * row_rstd;
                const float dnorm = (float)g[k] * (float)w[k];
                const float grad = row_rstd * (dnorm - mean_dnorm - normed * mean_dnorm_norm);
                result[k] = (floatX)((float)previous[k] + grad);
            }
            store128(dinp_row + c, result);
        }
    }
    __syncthreads();  // every warp's slice is complete before the block adds them up

    // add the warps' slices in warp order (fixed, hence deterministic); i < width is dweight, the rest dbias
    const int width = band_end - band_begin;
    for (int i = threadIdx.x; i < sums * width; i += blockDim.x) {
        const int which = i / width;
        const int column = band_begin + i % width;
        const int slot = which * slice_width + layernorm_slice_index(column - band_begin);
        float sum = 0.0f;
        for (int w = 0; w < warps_per_block; w++) sum += warp_sums[(size_t)w * sums * slice_width + slot];
        partials[((size_t)which * gridDim.x + blockIdx.x) * C + column] = sum;
    }
}

__global__ void layernorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                          const floatX* weight, const float* mean, const float* rstd, int N, int C,
                                          int band_width) {
    norm_backward_rows<Norm::Layer>(dinp, partials, dout, inp, weight, mean, rstd, N, C, band_width);
}
__global__ void rmsnorm_backward_kernel(floatX* dinp, float* partials, const floatX* dout, const floatX* inp,
                                        const floatX* weight, const float* rstd, int N, int C, int band_width) {
    norm_backward_rows<Norm::RMS>(dinp, partials, dout, inp, weight, nullptr, rstd, N, C, band_width);
}

// ----------------------------------------------------------------------------
// launchers

inline void layernorm_check_width(const char* caller, int C) {
    if (C <= 0 || C % x128::size != 0) {
        fprintf(stderr, "error: %s: C = %d must be a positive multiple of %d (16 bytes of %s)\n", caller, C,
                x128::size, PRECISION_NAME);
        exit(EXIT_FAILURE);
    }
}

// N elements; N % x128::size == 0 (true for any B*T*C here, since C is)
void residual_forward(floatX* out, const floatX* inp1, const floatX* inp2, size_t N, cudaStream_t stream) {
    if (N % x128::size != 0) {
        fprintf(stderr, "error: residual_forward: N = %zu must be a multiple of %d\n", N, x128::size);
        exit(EXIT_FAILURE);
    }
    const int block_size = 256;
    launch(residual_forward_kernel, grid_size_for((long long)(N / x128::size), block_size), block_size, 0, stream,
           out, inp1, inp2, N);
}

void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                       const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_width("layernorm_forward", C);
    const int grid = grid_size_for(N, LAYERNORM_WARPS_PER_BLOCK);
    launch(layernorm_forward_kernel, grid, LAYERNORM_BLOCK_SIZE, 0, stream, out, mean, rstd, inp, weight, bias, N, C);
}

// RMSNorm: out = x * rstd * weight, rstd kept (may be null)
void rmsnorm_forward(floatX* out, float* rstd, const floatX* inp, const floatX* weight, int N, int C, float epsilon,
                     cudaStream_t stream) {
    layernorm_check_width("rmsnorm_forward", C);
    const int grid = grid_size_for(N, LAYERNORM_WARPS_PER_BLOCK);
    launch(rmsnorm_forward_kernel, grid, LAYERNORM_BLOCK_SIZE, 0, stream, out, rstd, inp, weight, N, C, epsilon);
}

void fused_residual_rmsnorm_forward(floatX* residual, floatX* normed, float* rstd, const floatX* inp1,
                                    const floatX* inp2, const floatX* weight, int N, int C, float epsilon,
                                    cudaStream_t stream) {
    layernorm_check_width("fused_residual_rmsnorm_forward", C);
    const int grid = grid_size_for(N, LAYERNORM_WARPS_PER_BLOCK);
    launch(fused_residual_rmsnorm_forward_kernel, grid, LAYERNORM_BLOCK_SIZE, 0, stream, residual, normed, rstd, inp1,
           inp2, weight, N, C, epsilon);
}

void fused_residual_layernorm_forward(floatX* residual, floatX* normed, float* mean, float* rstd,
                                      const floatX* inp1, const floatX* inp2, const floatX* weight,
                                      const floatX* bias, int N, int C, cudaStream_t stream) {
    layernorm_check_width("fused_residual_layernorm_forward", C);
    const int grid = grid_size_for(N, LAYERNORM_WARPS_PER_BLOCK);
    launch(fused_residual_layernorm_forward_kernel, grid, LAYERNORM_BLOCK_SIZE, 0, stream, residual, normed, mean,
           rstd, inp1, inp2, weight, bias, N, C);
}

// Blocks of the backward kernel: enough to fill the device, each looping over several rows. The count
// fixes which rows each block adds up, so it must be the same for the kernel and the scratch layout.
inline int layernorm_backward_blocks(int N) {
    const int enough = device_properties().multiProcessorCount * LAYERNORM_BACKWARD_BLOCKS_PER_SM;
    const int needed = ceil_div(N, LAYERNORM_WARPS_PER_BLOCK);
    return needed < enough ? needed : enough;
}

// floats of scratch that layernorm_backward (and rmsnorm_backward, which uses half) needs for N rows of C
inline size_t layernorm_backward_scratch_floats(int N, int C) {
    return (size_t)norm_column_sums(Norm::Layer) * C * layernorm_backward_blocks(N);
}

// How the backward pass splits the columns over blockIdx.y: into the fewest bands of whole 32-lane passes
// whose warp sums fit the device's shared memory per block, as even as whole passes allow. One band, the
// whole row, up to C = 3584 for layernorm and 7168 for RMSNorm on an H100; 2560 and 5120 on an A100 (in
// both precisions: FP32's passes are half as wide and hold the same bytes).
struct NormBackwardBands {
    int count;          // blocks along y
    int width;          // columns per band (the last may have fewer): a multiple of 32 chunks
    size_t shared_bytes;
};
inline NormBackwardBands norm_backward_bands(int C, Norm norm) {
    const int pass = 32 * x128::size;  // the columns one pass of a warp covers
    const int passes = ceil_div(C, pass);
    const size_t bytes_per_pass = (size_t)LAYERNORM_WARPS_PER_BLOCK * norm_column_sums(norm) * pass * sizeof(float);
    const int passes_that_fit = (int)(device_properties().sharedMemPerBlockOptin / bytes_per_pass);
    const int count = ceil_div(passes, passes_that_fit);
    const int width = ceil_div(passes, count) * pass;
    return NormBackwardBands{ceil_div(C, width), width,
                             (size_t)LAYERNORM_WARPS_PER_BLOCK * norm_column_sums(norm) *
                                 layernorm_slice_width(width < C ? width : C) * sizeof(float)};
}

// The backward kernel's launch: shared memory opted into, the block count that the scratch layout assumes
// (along x; the bands along y write disjoint columns of the same partial rows); returns that count.
template <typename Kernel, typename... Args>
inline int launch_norm_backward(const char* caller, Norm norm, Kernel kernel, int N, int C, cudaStream_t stream,
                                Args... args) {
    layernorm_check_width(caller, C);
    const int blocks = layernorm_backward_blocks(N);
    const NormBackwardBands bands = norm_backward_bands(C, norm);
    // at C=768 layernorm's is exactly the 48 KiB a kernel gets without asking: opt in whatever the size
    opt_in_shared_memory(kernel, bands.shared_bytes);
    launch(kernel, dim3(blocks, bands.count), LAYERNORM_BLOCK_SIZE, bands.shared_bytes, stream, args..., bands.width);
    return blocks;
}

// scratch: layernorm_backward_scratch_floats(N, C) floats, contents on entry do not matter
void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                        const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N, int C,
                        cudaStream_t stream) {
    const int blocks = launch_norm_backward("layernorm_backward", Norm::Layer, layernorm_backward_kernel, N, C, stream,
                                            dinp, scratch, dout, inp, weight, mean, rstd, N, C);
    add_column_partials(dweight, scratch, blocks, C, stream);
    add_column_partials(dbias, scratch + (size_t)blocks * C, blocks, C, stream);
}

// RMSNorm's: dinp and dweight accumulated; scratch as layernorm_backward's
void rmsnorm_backward(floatX* dinp, floatX* dweight, float* scratch, const floatX* dout, const floatX* inp,
                      const floatX* weight, const float* rstd, int N, int C, cudaStream_t stream) {
    const int blocks = launch_norm_backward("rmsnorm_backward", Norm::RMS, rmsnorm_backward_kernel, N, C, stream, dinp,
                                            scratch, dout, inp, weight, rstd, N, C);
    add_column_partials(dweight, scratch, blocks, C, stream);
}
