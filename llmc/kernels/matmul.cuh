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

Setup: the GPU build uses one cuBLASLt handle, one workspace (sized for the GPU) and a cache of plans
for all matmuls, created by matmul_setup() at start-up (gpt2_allocate calls it) and released by
matmul_teardown(); see "Plans" below for the cache and the operands' alignment. Not on first use: a cudaMalloc
during the first step would wait for the device to idle, while NCCL kernels already running wait for peers.
*/
#pragma once

#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>
#include "../cuda_common.cuh"

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

/*
Plans. cuBLASLt separates choosing how to run a product (a descriptor, three layouts, a preference and a
heuristic query, all host work) from running it. A training step runs the same few shapes about 150 times,
so the choice is made once per plan key and kept in a cache: every call computes its key, and only a key
never seen before builds a plan. Both builds compute the key and look it up the same way (the CPU build's
plan is empty: OpenBLAS needs none), so the CPU tests exercise the cache and the alignment logic.

Alignment is part of the key. cuBLASLt's heuristic assumes every operand starts on a 256-byte boundary
unless the preference CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES says less (its default is 256),
and the algorithm it then picks may refuse a less aligned pointer (CUBLAS_STATUS_NOT_SUPPORTED) at run
time. cudaMalloc returns 256-byte aligned memory, but the weights sit at offsets inside the layer-major
parameter buffer (llmc/model/gpt2.cuh): in GPT-2 1558M every other block, and every attention projection, is
only 128-byte aligned, and with chunks padded for 3 ZeRO shards the weights of 350M and 1558M can be only
16 (dev/test/test_parameter_layout.cu prints the table). So each operand's alignment is the largest power of two <= 256
that divides its address, and the preference is told exactly that. Leading dimensions need nothing here:
they are in the layouts the heuristic sees (the cuBLAS guide's "Tensor Core Usage" lists them, with
16-byte pointers, among the conditions for the fastest paths, not as something the preference covers).
The bias has no alignment preference in cuBLASLt; its alignment is in the key anyway, so a plan is never
reused for a bias that sits differently, and the trace prints it. The layouts keep every weight and bias
at least 16-byte aligned (dev/test/test_parameter_layout.cu checks it).

Set LLMC_MATMUL_TRACE=1 to print one line per new plan on stderr: the shape, the alignments and, on the
GPU, the algorithm and its workspace. A shape's plans are few: one per distinct alignment of its operands.

The cache is bounded. A mixture of experts runs each expert's matmuls on the rows routed to it, a number
that changes every step, so the keys never stop coming. The row count cannot be rounded into a bucket: the
plan's layouts hold the exact shape, and an algorithm the heuristic chose for one m is not promised to run
another. So the cache keeps the MATMUL_PLAN_CACHE_CAPACITY plans used most recently and destroys the least
recently used one when a new plan would pass that. A dense model's step uses a few dozen keys, which stay;
the experts' plans come and go.
*/

// the largest power of two <= 256 that divides `address` (256 for address 0)
constexpr int MATMUL_MAX_ALIGNMENT = 256;
inline int address_alignment(uintptr_t address) {
    const uintptr_t lowest_set_bit = address & (~address + 1);
    return address == 0 || lowest_set_bit >= MATMUL_MAX_ALIGNMENT ? MATMUL_MAX_ALIGNMENT : (int)lowest_set_bit;
}

// Everything a plan depends on. Alignments in bytes, named by our operands (a, b, d: see the swap above
// for how they become cuBLAS's A, B, C, D); bias_alignment is 0 without a bias.
struct MatmulPlanKey {
    int m, n, k;
    bool transpose_a, transpose_b, has_bias, accumulate;
    int a_alignment, b_alignment, d_alignment, bias_alignment;
    int element_bytes;  // the operands' type: 2 (bf16) or 4 (fp32); one per build, in the key for completeness
    bool operator<(const MatmulPlanKey& o) const {
        auto fields = [](const MatmulPlanKey& x) {
            return std::make_tuple(x.m, x.n, x.k, x.transpose_a, x.transpose_b, x.has_bias, x.accumulate,
                                   x.a_alignment, x.b_alignment, x.d_alignment, x.bias_alignment, x.element_bytes);
        };
        return fields(*this) < fields(o);
    }
};

inline MatmulPlanKey matmul_plan_key(const floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m,
                                     int n, int k, bool transpose_a, bool transpose_b, bool accumulate) {
    return MatmulPlanKey{m, n, k, transpose_a, transpose_b, bias != nullptr, accumulate,
                         address_alignment((uintptr_t)a), address_alignment((uintptr_t)b),
                         address_alignment((uintptr_t)d), bias ? address_alignment((uintptr_t)bias) : 0,
                         (int)sizeof(floatX)};
}

// The plans of the keys used most recently, at most `capacity` of them (see "Plans" above). Plan is the build's
// plan (cuBLASLt's descriptors, or nothing for OpenBLAS); the cache only orders and drops them.
constexpr size_t MATMUL_PLAN_CACHE_CAPACITY = 1024;
template <class Plan>
struct MatmulPlanCache {
    struct Entry {
        Plan plan;
        std::list<MatmulPlanKey>::iterator recency_position;
    };
    std::map<MatmulPlanKey, Entry> entries;
    std::list<MatmulPlanKey> recency;  // most recently used first
    size_t capacity = MATMUL_PLAN_CACHE_CAPACITY;
    long evicted = 0;

    size_t size() const { return entries.size(); }
    bool empty() const { return entries.empty(); }
    // The plan of `key`, now the most recently used; null when the cache does not hold it.
    Plan* find(const MatmulPlanKey& key) {
        auto found = entries.find(key);
        if (found == entries.end()) return nullptr;
        recency.splice(recency.begin(), recency, found->second.recency_position);
        return &found->second.plan;
    }
    // Adds the plan of a key the cache does not hold, first handing the least recently used plans to
    // destroy(plan) until there is room. The new plan is never the one dropped.
    template <class Destroy>
    Plan& insert(const MatmulPlanKey& key, Plan plan, Destroy&& destroy) {
        while (capacity > 0 && entries.size() >= capacity) {
            auto oldest = entries.find(recency.back());
            destroy(oldest->second.plan);
            entries.erase(oldest);
            recency.pop_back();
            evicted++;
        }
        recency.push_front(key);
        return entries.emplace(key, Entry{plan, recency.begin()}).first->second.plan;
    }
};

// The minimum alignments cuBLASLt's preference gets: its A is our b and its B our a (the operand swap
// above); C and D are both our d (we accumulate in place).
struct CublasAlignments { int A, B, C, D; };
inline CublasAlignments matmul_cublas_alignments(const MatmulPlanKey& key) {
    return CublasAlignments{key.b_alignment, key.a_alignment, key.d_alignment, key.d_alignment};
}

// The workspace cuBLASLt may use, by compute capability. The cuBLAS guide (cublasSetWorkspace) recommends
// its own default pool size: 32 MiB on Hopper (sm_90) and Blackwell (sm_10x, sm_12x), 4 MiB on every
// other GPU. Newer architectures are given 32 MiB too. The same size goes to the heuristic (as the most
// an algorithm may ask for) and to every call, so a chosen algorithm always gets what it asked for.
inline size_t matmul_workspace_bytes(int compute_capability_major) {
    return compute_capability_major >= 9 ? (32ull << 20) : (4ull << 20);
}

inline bool matmul_trace_enabled() {
    const char* value = getenv("LLMC_MATMUL_TRACE");
    return value != nullptr && strcmp(value, "1") == 0;
}

inline std::string matmul_plan_key_text(const MatmulPlanKey& key) {
    const CublasAlignments c = matmul_cublas_alignments(key);
    char text[256];
    snprintf(text, sizeof(text),
             "m=%d n=%d k=%d transpose_a=%d transpose_b=%d bias=%s accumulate=%d floatX=%dB "
             "alignment A/B/C/D=%d/%d/%d/%d bias=%d",
             key.m, key.n, key.k, key.transpose_a, key.transpose_b, key.has_bias ? "yes" : "no", key.accumulate,
             key.element_bytes, c.A, c.B, c.C, c.D, key.bias_alignment);
    return text;
}

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

// what cuBLASLt chose for one key: reused by every call with that key
struct MatmulPlan {
    cublasLtMatmulDesc_t description = nullptr;
    cublasLtMatrixLayout_t first_layout = nullptr, second_layout = nullptr, d_layout = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t algo_workspace_bytes = 0;  // what the algorithm needs of the workspace
};

// The one cuBLASLt handle, its workspace and the plans, shared by every matmul. Plans hold no pointers
// but the bias (set again by each call), so one thread must issue all matmuls: the training program does.
struct MatmulContext {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    MatmulPlanCache<MatmulPlan> plans;
    long plans_built = 0, cache_hits = 0;
};
inline MatmulContext matmul_context;

inline void matmul_setup() {
    if (matmul_context.handle != nullptr) return;
    int device = 0, major = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    matmul_context.workspace_bytes = matmul_workspace_bytes(major);
    cublasCheck(cublasLtCreate(&matmul_context.handle));
    cudaCheck(cudaMalloc(&matmul_context.workspace, matmul_context.workspace_bytes));
}

inline void matmul_destroy_plan(MatmulPlan& plan) {
    cublasCheck(cublasLtMatrixLayoutDestroy(plan.d_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan.second_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(plan.first_layout));
    cublasCheck(cublasLtMatmulDescDestroy(plan.description));
}

inline void matmul_teardown() {
    if (matmul_context.handle == nullptr) return;
    for (auto& [key, entry] : matmul_context.plans.entries) matmul_destroy_plan(entry.plan);
    cudaCheck(cudaFree(matmul_context.workspace));
    cublasCheck(cublasLtDestroy(matmul_context.handle));
    matmul_context = MatmulContext{};
}

// Asks cuBLASLt's heuristic for the best algorithm for the key's shape and alignments.
inline MatmulPlan matmul_build_plan(const MatmulPlanKey& key, const floatX* bias) {
    MatmulPlan plan;
    // cuBLAS computes, column-major, D^T (n, m) = op(B)^T (n, k) @ op(A)^T (k, m). Read column-major, B's
    // bytes are B^T: that is op(B)^T as it stands when B is not transposed, and needs a transpose otherwise.
    // The same holds for A.
    const cublasOperation_t first_op = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second_op = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&plan.description, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.description, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan.description, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)));
    if (key.has_bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.description, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }

    // memory layouts as cuBLAS sees them: (rows, columns, leading dimension), column-major
    const int m = key.m, n = key.n, k = key.k;
    if (key.transpose_b) cublasCheck(cublasLtMatrixLayoutCreate(&plan.first_layout, CUBLAS_FLOATX, k, n, k));
    else                 cublasCheck(cublasLtMatrixLayoutCreate(&plan.first_layout, CUBLAS_FLOATX, n, k, n));
    if (key.transpose_a) cublasCheck(cublasLtMatrixLayoutCreate(&plan.second_layout, CUBLAS_FLOATX, m, k, m));
    else                 cublasCheck(cublasLtMatrixLayoutCreate(&plan.second_layout, CUBLAS_FLOATX, k, m, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan.d_layout, CUBLAS_FLOATX, n, m, n));

    cublasLtMatmulPreference_t preference;
    cublasCheck(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = matmul_context.workspace_bytes;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace_bytes, sizeof(workspace_bytes)));
    const CublasAlignments alignment = matmul_cublas_alignments(key);
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> minimum_alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, (uint32_t)alignment.A},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (uint32_t)alignment.B},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, (uint32_t)alignment.C},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, (uint32_t)alignment.D},
    };
    for (const auto& [attribute, bytes] : minimum_alignments)
        cublasCheck(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(matmul_context.handle, plan.description, plan.first_layout,
                                               plan.second_layout, plan.d_layout, plan.d_layout, preference, 1,
                                               &heuristic, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(preference));
    if (found == 0) {
        fprintf(stderr, "error: cuBLASLt has no algorithm for the matmul %s\n", matmul_plan_key_text(key).c_str());
        exit(EXIT_FAILURE);
    }
    plan.algo = heuristic.algo;
    plan.algo_workspace_bytes = heuristic.workspaceSize;
    return plan;
}

// the GPU part of a plan's trace line
inline std::string matmul_plan_text(const MatmulPlan& plan) {
    int algo_id = -1;
    size_t written = 0;
    cublasCheck(cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof(algo_id),
                                                     &written));
    char text[128];
    snprintf(text, sizeof(text), " algo=%d workspace=%zu of %zu bytes", algo_id, plan.algo_workspace_bytes,
             matmul_context.workspace_bytes);
    return text;
}

#else  // LLMC_CPU: OpenBLAS

struct MatmulPlan {};  // OpenBLAS chooses nothing ahead; the key is still computed and cached

// fp32 copies of bf16 operands and result, reused from call to call (they only ever grow), and the plans
struct MatmulContext {
    std::vector<float> a, b, d;
    MatmulPlanCache<MatmulPlan> plans;
    long plans_built = 0, cache_hits = 0;
};
inline MatmulContext matmul_context;

inline void matmul_setup() {}
inline void matmul_teardown() { matmul_context = MatmulContext{}; }

inline MatmulPlan matmul_build_plan(const MatmulPlanKey&, const floatX*) { return MatmulPlan{}; }
inline void matmul_destroy_plan(MatmulPlan&) {}
inline std::string matmul_plan_text(const MatmulPlan&) { return ""; }

#endif

// The plan for `key`: from the cache, or built, counted and (LLMC_MATMUL_TRACE=1) printed.
inline const MatmulPlan& matmul_find_plan(const MatmulPlanKey& key, const floatX* bias) {
    if (const MatmulPlan* cached = matmul_context.plans.find(key)) {
        matmul_context.cache_hits++;
        return *cached;
    }
    const MatmulPlan& plan = matmul_context.plans.insert(key, matmul_build_plan(key, bias), matmul_destroy_plan);
    matmul_context.plans_built++;
    if (matmul_trace_enabled())
        fprintf(stderr, "matmul plan %ld: %s%s\n", matmul_context.plans_built, matmul_plan_key_text(key).c_str(),
                matmul_plan_text(plan).c_str());
    return plan;
}

#ifndef LLMC_CPU

inline void matmul_row_major(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m, int n, int k,
                             bool transpose_a, bool transpose_b, bool accumulate, cudaStream_t stream) {
    if (matmul_context.handle == nullptr) fatal("matmul: matmul_setup() has not run (it belongs to start-up)");
    const MatmulPlanKey key = matmul_plan_key(d, a, b, bias, m, n, k, transpose_a, transpose_b, accumulate);
    const MatmulPlan& plan = matmul_find_plan(key, bias);
    // The bias pointer is the one operand the descriptor holds. cublasLtMatmul reads the descriptor when
    // the call is enqueued, and all calls come from one host thread in order, so setting it on the shared
    // descriptor just before each call is safe.
    if (bias != nullptr)
        cublasCheck(cublasLtMatmulDescSetAttribute(plan.description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof(bias)));

    // alpha and beta are fp32 because the scale type (the matmul description's second type) is fp32
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(matmul_context.handle, plan.description, &alpha, b, plan.first_layout, a,
                               plan.second_layout, &beta, d, plan.d_layout, d, plan.d_layout, &plan.algo,
                               matmul_context.workspace, matmul_context.workspace_bytes, stream));
}

#else  // LLMC_CPU: OpenBLAS

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
    matmul_find_plan(matmul_plan_key(d, a, b, bias, m, n, k, transpose_a, transpose_b, accumulate), bias);
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

// The backward pass in two halves, so that a caller can start sending dinp before the weight gradients
// (llmc/parallel/tensor_parallel.h overlaps its all-reduce with them):
// dinp = dout @ weight (overwrites)
inline void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC,
                                  cudaStream_t stream) {
    matmul_row_major(dinp, dout, weight, nullptr, N, C, OC, false, false, false, stream);
}
// dweight += dout^T @ inp (accumulates); dbias += column sums of dout (accumulates, deterministic; skipped
// when dbias is null). scratch: matmul_backward_scratch_floats(N, OC) floats, used only for dbias.
inline void matmul_backward_weights(floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                                    const floatX* inp, int N, int C, int OC, cudaStream_t stream) {
    matmul_row_major(dweight, dout, inp, nullptr, OC, C, N, true, false, true, stream);
    if (dbias != nullptr) matmul_bias_backward(dbias, scratch, dout, N, OC, stream);
}

// Both halves: dinp, then dweight and dbias.
inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int N, int C, int OC, cudaStream_t stream) {
    matmul_backward_input(dinp, dout, weight, N, C, OC, stream);
    matmul_backward_weights(dweight, dbias, scratch, dout, inp, N, C, OC, stream);
}
