/*
Matmul: the linear layers of the transformer (qkv, attention projection, fc, fc projection, lm head).

Layouts (all row-major, as in llm.c):
    inp    (N, C)     N = B*T rows of activations
    weight (OC, C)    one row of C input weights per output channel
    bias   (OC)       may be absent
    out    (N, OC)

Forward:
    out[n][o] = bias[o] + sum_c inp[n][c] * weight[o][c]          i.e. out = inp @ weight^T + bias

Backward, given dout = dLoss/dout (N, OC):
    dinp[n][c]    = sum_o dout[n][o] * weight[o][c]                i.e. dinp = dout @ weight         OVERWRITES
    dweight[o][c] += sum_n dout[n][o] * inp[n][c]                  i.e. dweight += dout^T @ inp      ACCUMULATES
    dbias[o]      += sum_n dout[n][o]                              column sums of dout               ACCUMULATES
dinp is overwritten because it is a fresh activation gradient for this microbatch (the caller adds it into
the residual stream where needed). The parameter gradients accumulate, so that several microbatches can
add into the same gradient buffer before the optimizer step.

All three products are one general operation, row-major D = op(A) @ op(B) (+ bias) (+ D if accumulating),
where op() optionally transposes; matmul_row_major() below does it, and forward and backward only choose
the operands:
    forward  out     (N, OC) = inp (N, C)     @ weight^T (C, OC)      + bias
    backward dinp    (N, C)  = dout (N, OC)   @ weight (OC, C)
    backward dweight (OC, C) = dout^T (OC, N) @ inp (N, C)            + dweight

Why the operands are swapped for cuBLAS: cuBLAS(Lt) is column-major. A row-major (r, c) matrix in memory is
the very same bytes as a column-major (c, r) matrix, i.e. its transpose. So instead of D = op(A) @ op(B)
we ask cuBLAS for the transpose, D^T = op(B)^T @ op(A)^T, which it writes column-major, which is D
row-major. Nothing is copied: B becomes the first operand, A the second, and each keeps or flips its
transpose flag according to how its bytes read column-major. The bias is added per output column of the
row-major D, which is per row of the column-major D^T: exactly what cuBLASLt's bias epilogue does.

Precision: BF16 operands (CUDA_R_16BF) or FP32 (CUDA_R_32F), always with fp32 accumulation
(CUBLAS_COMPUTE_32F; no TF32, so the FP32 build is a true fp32 reference), and the result rounded to floatX
once at the end. The CPU build does the same with OpenBLAS's sgemm: bf16 operands are widened to fp32,
multiplied in fp32, and the result is rounded back once.

The bias gradient is a hand-written kernel instead of another cuBLAS call, so that it is deterministic and
needs no ones-vector: blocks own a slice of columns and a chunk of rows, sum in fp32, write one partial row
per row-chunk into `scratch`, and add_column_partials() adds the partials to dbias in a fixed order.
scratch must hold matmul_backward_scratch_floats(N, OC) floats (it may be null when dbias is null).

Setup: the GPU build uses one cuBLASLt handle and one 32 MiB workspace for all matmuls, created by
matmul_setup() (or on first use) and released by matmul_teardown().
*/
#pragma once

#include <cstdint>
#include <vector>
#include "cuda_common.cuh"

#ifdef LLMC_CPU
#include <cblas.h>
#else
#include <cublasLt.h>
#endif

// ----------------------------------------------------------------------------
// the bias gradient kernel

// Block shape: one warp spans the columns (each lane takes x128::size adjacent columns, so a warp reads
// 512 contiguous bytes of a row), and BIAS_GRAD_ROW_LANES warps take turns over the rows of the chunk.
constexpr int BIAS_GRAD_COLUMN_LANES = 32;
constexpr int BIAS_GRAD_ROW_LANES = 8;
constexpr int BIAS_GRAD_COLUMNS_PER_BLOCK = BIAS_GRAD_COLUMN_LANES * x128::size;
// Rows per block: small enough that a GPT-2 shape (N = 8192) gives a few hundred blocks to fill the GPU,
// large enough that the partials (N / 64 rows of OC floats) stay a small fraction of dout.
constexpr int BIAS_GRAD_ROWS_PER_BLOCK = 64;

/*
Partial column sums of dout over one chunk of rows:
    partials[chunk][o] = sum_{n in rows of chunk} dout[n][o]          chunk = blockIdx.y
Thread (x, y) of the block sums, in fp32, the rows y, y + ROW_LANES, ... of the chunk for its x128::size
columns; the ROW_LANES per-thread sums of each column are then added in shared memory in the order
y = 0, 1, ..., so every bit of the result is fixed by the shape alone.
`vectorized`: every row starts on a 16-byte boundary (OC % x128::size == 0), so a thread reads its columns
with one 128-bit load; otherwise (any OC, e.g. 50) it reads them one by one with a bounds check.
*/
__global__ void bias_gradient_partials_kernel(float* partials, const floatX* dout, int N, int OC, bool vectorized) {
    __shared__ float lane_sums[BIAS_GRAD_ROW_LANES][BIAS_GRAD_COLUMNS_PER_BLOCK];
    const int block_first_column = blockIdx.x * BIAS_GRAD_COLUMNS_PER_BLOCK;
    const int first_column = block_first_column + threadIdx.x * x128::size;
    const int first_row = blockIdx.y * BIAS_GRAD_ROWS_PER_BLOCK;
    const int end_row = min(first_row + BIAS_GRAD_ROWS_PER_BLOCK, N);

    float sums[x128::size];
    for (int k = 0; k < x128::size; k++) sums[k] = 0.0f;
    for (int row = first_row + threadIdx.y; row < end_row; row += BIAS_GRAD_ROW_LANES) {
        const floatX* row_start = dout + (size_t)row * OC;
        if (vectorized) {
            if (first_column < OC) {
                x128 packed = load128cs(row_start + first_column);  // read once, no need to keep it in cache
                for (int k = 0; k < x128::size; k++) sums[k] += (float)packed[k];
            }
        } else {
            for (int k = 0; k < x128::size; k++) {
                if (first_column + k < OC) sums[k] += (float)row_start[first_column + k];
            }
        }
    }
    for (int k = 0; k < x128::size; k++) lane_sums[threadIdx.y][threadIdx.x * x128::size + k] = sums[k];
    __syncthreads();

    // Now the block's threads share out its columns one each (consecutive threads, consecutive columns, so
    // the write to partials is coalesced) and add up the ROW_LANES sums of that column in a fixed order.
    const int thread_index = threadIdx.y * blockDim.x + threadIdx.x;
    for (int c = thread_index; c < BIAS_GRAD_COLUMNS_PER_BLOCK; c += blockDim.x * blockDim.y) {
        const int column = block_first_column + c;
        if (column >= OC) break;
        float sum = 0.0f;
        for (int y = 0; y < BIAS_GRAD_ROW_LANES; y++) sum += lane_sums[y][c];
        partials[(size_t)blockIdx.y * OC + column] = sum;
    }
}

// ----------------------------------------------------------------------------
// host side: the bias gradient

inline int bias_gradient_row_chunks(int N) { return ceil_div(N, BIAS_GRAD_ROWS_PER_BLOCK); }

// Size of the scratch buffer matmul_backward() needs for the bias gradient, in floats:
// one row of OC partial sums per chunk of BIAS_GRAD_ROWS_PER_BLOCK rows.
inline size_t matmul_backward_scratch_floats(int N, int OC) { return (size_t)bias_gradient_row_chunks(N) * OC; }

// dbias[o] += sum_n dout[n][o], deterministic. scratch: matmul_backward_scratch_floats(N, OC) floats.
inline void matmul_bias_backward(floatX* dbias, float* scratch, const floatX* dout, int N, int OC,
                                 cudaStream_t stream) {
    const int row_chunks = bias_gradient_row_chunks(N);
    if (row_chunks > 65535) {  // the largest grid.y
        fprintf(stderr, "error: matmul_bias_backward: N = %d rows is more than %d supported\n", N,
                65535 * BIAS_GRAD_ROWS_PER_BLOCK);
        exit(EXIT_FAILURE);
    }
    const bool vectorized = OC % x128::size == 0 && (uintptr_t)dout % sizeof(x128) == 0;
    dim3 grid(ceil_div(OC, BIAS_GRAD_COLUMNS_PER_BLOCK), row_chunks);
    dim3 block(BIAS_GRAD_COLUMN_LANES, BIAS_GRAD_ROW_LANES);
    launch(bias_gradient_partials_kernel, grid, block, 0, stream, scratch, dout, N, OC, vectorized);
    add_column_partials(dbias, scratch, row_chunks, OC, stream);
}

// ----------------------------------------------------------------------------
// the general product D = op(A) @ op(B) (+ bias) (+ D), row-major
//     D (m, n);  op(A) (m, k): A is stored (m, k), or (k, m) if transpose_a;
//                op(B) (k, n): B is stored (k, n), or (n, k) if transpose_b;
//     bias (n) or null: added to every row of D;  accumulate: add onto the old D instead of overwriting it.

#ifndef LLMC_CPU

inline void cublas_check_impl(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cuBLAS call failed at %s:%d: %s\n", file, line, cublasLtGetStatusString(status));
        exit(EXIT_FAILURE);
    }
}
#define cublasCheck(call) cublas_check_impl((call), __FILE__, __LINE__)

#ifdef ENABLE_FP32
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
#else
constexpr cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
#endif

constexpr size_t MATMUL_WORKSPACE_BYTES = 32ull << 20;

// the one cuBLASLt handle and its workspace, shared by every matmul
struct MatmulContext {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
};
inline MatmulContext matmul_context;

inline void matmul_setup() {
    if (matmul_context.handle != nullptr) return;
    cublasCheck(cublasLtCreate(&matmul_context.handle));
    cudaCheck(cudaMalloc(&matmul_context.workspace, MATMUL_WORKSPACE_BYTES));
}

inline void matmul_teardown() {
    if (matmul_context.handle == nullptr) return;
    cudaCheck(cudaFree(matmul_context.workspace));
    cublasCheck(cublasLtDestroy(matmul_context.handle));
    matmul_context = MatmulContext{};
}

inline void matmul_row_major(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                             bool transpose_a, bool transpose_b, bool accumulate, cudaStream_t stream) {
    matmul_setup();

    // cuBLAS computes, column-major, D^T (n, m) = op(B)^T (n, k) @ op(A)^T (k, m). Read column-major, B's
    // bytes are B^T: that is op(B)^T as it stands when B is not transposed, and needs a transpose otherwise.
    // The same holds for A.
    const cublasOperation_t first_op = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second_op = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;

    cublasLtMatmulDesc_t description;
    cublasCheck(cublasLtMatmulDescCreate(&description, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(description, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)));
    cublasCheck(cublasLtMatmulDescSetAttribute(description, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)));
    if (bias != nullptr) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(description, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        cublasCheck(cublasLtMatmulDescSetAttribute(description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }

    // memory layouts as cuBLAS sees them: (rows, columns, leading dimension), column-major
    cublasLtMatrixLayout_t first_layout, second_layout, d_layout;
    if (transpose_b) cublasCheck(cublasLtMatrixLayoutCreate(&first_layout, CUBLAS_FLOATX, k, n, k));
    else             cublasCheck(cublasLtMatrixLayoutCreate(&first_layout, CUBLAS_FLOATX, n, k, n));
    if (transpose_a) cublasCheck(cublasLtMatrixLayoutCreate(&second_layout, CUBLAS_FLOATX, m, k, m));
    else             cublasCheck(cublasLtMatrixLayoutCreate(&second_layout, CUBLAS_FLOATX, k, m, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&d_layout, CUBLAS_FLOATX, n, m, n));

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = MATMUL_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(matmul_context.handle, description, first_layout, second_layout,
                                               d_layout, d_layout, preference, 1, &heuristic, &found));
    if (found == 0) {
        fprintf(stderr, "error: cuBLASLt has no algorithm for the matmul m=%d n=%d k=%d transpose_a=%d "
                        "transpose_b=%d bias=%d\n", m, n, k, transpose_a, transpose_b, bias != nullptr);
        exit(EXIT_FAILURE);
    }

    // alpha and beta are fp32 because the scale type (the matmul description's second type) is fp32
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(matmul_context.handle, description, &alpha, b, first_layout, a, second_layout, &beta,
                               d, d_layout, d, d_layout, &heuristic.algo, matmul_context.workspace,
                               MATMUL_WORKSPACE_BYTES, stream));

    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    cublasCheck(cublasLtMatrixLayoutDestroy(d_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(second_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(first_layout));
    cublasCheck(cublasLtMatmulDescDestroy(description));
}

#else  // LLMC_CPU: OpenBLAS

// fp32 copies of bf16 operands and result, reused from call to call (they only ever grow)
struct MatmulContext {
    std::vector<float> a, b, d;
};
inline MatmulContext matmul_context;

inline void matmul_setup() {}
inline void matmul_teardown() { matmul_context = MatmulContext{}; }

// the operand as fp32: itself in the FP32 build, a widened copy in the BF16 build
inline const float* fp32_operand(const floatX* x, size_t count, std::vector<float>& copy) {
#ifdef ENABLE_FP32
    (void)count, (void)copy;
    return x;
#else
    if (copy.size() < count) copy.resize(count);
    float* widened = copy.data();
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; i++) widened[i] = (float)x[i];
    return widened;
#endif
}
// where sgemm writes the fp32 result: the output itself in the FP32 build, a buffer in the BF16 build
inline float* fp32_result(floatX* x, size_t count, std::vector<float>& buffer) {
#ifdef ENABLE_FP32
    (void)count, (void)buffer;
    return x;
#else
    (void)x;
    if (buffer.size() < count) buffer.resize(count);
    return buffer.data();
#endif
}

inline void matmul_row_major(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                             bool transpose_a, bool transpose_b, bool accumulate, cudaStream_t stream) {
    if (cudacpu::is_late(stream)) {  // like a kernel: runs when its stream gets there (llmc/cpu/runtime.h)
        cudacpu::on_stream(stream, [=] {
            matmul_row_major(d, a, b, bias, m, n, k, transpose_a, transpose_b, accumulate, nullptr);
        });
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    const float* a32 = fp32_operand(a, (size_t)m * k, matmul_context.a);
    const float* b32 = fp32_operand(b, (size_t)k * n, matmul_context.b);
    float* d32 = fp32_result(d, (size_t)m * n, matmul_context.d);

    // sgemm computes D = A @ B + beta * D. The bias and the old D (when accumulating) go into the fp32
    // starting value, so that beta = 1 adds them in fp32 before the one rounding to floatX, as cuBLASLt's
    // bias epilogue and beta do.
    const bool has_start = accumulate || bias != nullptr;
    // (in the FP32 build d32 is d itself: accumulating without a bias needs no copy at all)
    const bool build_start = bias != nullptr || (accumulate && (void*)d32 != (void*)d);
    if (build_start) {
        #pragma omp parallel for schedule(static)
        for (int row = 0; row < m; row++) {
            for (int col = 0; col < n; col++) {
                const size_t i = (size_t)row * n + col;
                d32[i] = (accumulate ? (float)d[i] : 0.0f) + (bias != nullptr ? (float)bias[col] : 0.0f);
            }
        }
    }
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                m, n, k, 1.0f, a32, transpose_a ? m : k, b32, transpose_b ? k : n, has_start ? 1.0f : 0.0f, d32, n);
#ifndef ENABLE_FP32
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < (size_t)m * n; i++) d[i] = (floatX)d32[i];  // the one rounding to bf16
#endif
    cudacpu::profile_add((const void*)&matmul_row_major, start);
}

#endif

// ----------------------------------------------------------------------------
// the layer's forward and backward

// out (N, OC) = inp (N, C) @ weight^T + bias; bias may be null. Overwrites out.
inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                           int N, int C, int OC, cudaStream_t stream) {
    matmul_row_major(out, inp, weight, bias, N, OC, C, false, true, false, stream);
}

// dinp = dout @ weight (overwrites); dweight += dout^T @ inp (accumulates); dbias += column sums of dout
// (accumulates, deterministic; skipped when dbias is null). scratch: matmul_backward_scratch_floats(N, OC)
// floats, used only for dbias.
inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int N, int C, int OC, cudaStream_t stream) {
    matmul_row_major(dinp, dout, weight, nullptr, N, C, OC, false, false, false, stream);
    matmul_row_major(dweight, dout, inp, nullptr, OC, C, N, true, false, true, stream);
    if (dbias != nullptr) matmul_bias_backward(dbias, scratch, dout, N, OC, stream);
}
