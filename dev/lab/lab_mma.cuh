/*
Kernel lab: the tensor-core wrappers of llmc/kernels/mma.cuh (mma.sync, ldmatrix, cp.async).

The test kernels build fragments straight from the PTX ISA's per-lane formulas (row g or g+8, columns 2t
and 2t+1, ...), written out here a second time, and check:
  - one mma on fragments read element by element from global memory, against a plain matrix product;
  - that every ldmatrix variant, given the row addresses of mma.cuh's recipes, yields bit for bit the
    fragments of those formulas (two independent descriptions of the layout must agree);
  - whole-tile products chained over k-steps and n-tiles from padded shared-memory tiles, with B loaded
    from an N x K tile (as K in S = Q K^T) and from a K x N tile (as V in P V);
  - the accumulators of S = Q K^T re-packed as the A operand of P V, as in FlashAttention;
  - cp.async with zero fill and two commit groups;
  - on the CPU device only: a kernel that reads shared memory before cp_async_wait sees the poison, a
    thread that exits with a copy in flight, a divergent mma and a misaligned ldmatrix are reported.
These are bf16 instructions whatever floatX is, so the FP32 build runs the same checks.
*/
#pragma once

#include <cfloat>
#include "lab.h"
#include "../../llmc/kernels/mma.cuh"

namespace mma_lab {

// ----------------------------------------------------------------------------
// fragments from the documented layout (lane = 4 g + t), element by element

__device__ __forceinline__ int lane_group() { return (threadIdx.x % 32) >> 2; }
__device__ __forceinline__ int lane_in_group() { return threadIdx.x & 3; }

__device__ __forceinline__ uint32_t pair(const __nv_bfloat16* m, int i0, int i1) {
    return pack_bf16x2((float)m[i0], (float)m[i1]);  // bf16 -> float -> bf16 is exact
}
// A: M x K row-major, `ld` elements per row
__device__ MmaA a_fragment(const __nv_bfloat16* A, int ld) {
    const int g = lane_group(), t = lane_in_group();
    MmaA a;
    a.x[0] = pair(A, g * ld + 2 * t, g * ld + 2 * t + 1);
    a.x[1] = pair(A, (g + 8) * ld + 2 * t, (g + 8) * ld + 2 * t + 1);
    a.x[2] = pair(A, g * ld + 2 * t + 8, g * ld + 2 * t + 9);
    a.x[3] = pair(A, (g + 8) * ld + 2 * t + 8, (g + 8) * ld + 2 * t + 9);
    return a;
}
// B: K x N row-major
__device__ MmaB b_fragment(const __nv_bfloat16* B, int ld) {
    const int g = lane_group(), t = lane_in_group();
    MmaB b;
    b.x[0] = pair(B, (2 * t) * ld + g, (2 * t + 1) * ld + g);
    b.x[1] = pair(B, (2 * t + 8) * ld + g, (2 * t + 9) * ld + g);
    return b;
}
// B given as its transpose: N x K row-major (B[k][n] = Bt[n][k])
__device__ MmaB b_fragment_from_transpose(const __nv_bfloat16* Bt, int ld) {
    const int g = lane_group(), t = lane_in_group();
    MmaB b;
    b.x[0] = pair(Bt, g * ld + 2 * t, g * ld + 2 * t + 1);
    b.x[1] = pair(Bt, g * ld + 2 * t + 8, g * ld + 2 * t + 9);
    return b;
}
// C/D: 16 x 8 fp32 row-major
__device__ MmaAccumulator c_fragment(const float* C, int ld) {
    const int g = lane_group(), t = lane_in_group();
    MmaAccumulator c;
    c.x[0] = C[g * ld + 2 * t];
    c.x[1] = C[g * ld + 2 * t + 1];
    c.x[2] = C[(g + 8) * ld + 2 * t];
    c.x[3] = C[(g + 8) * ld + 2 * t + 1];
    return c;
}
__device__ void store_d_fragment(float* D, int ld, const MmaAccumulator& d) {
    const int g = lane_group(), t = lane_in_group();
    D[g * ld + 2 * t] = d.x[0];
    D[g * ld + 2 * t + 1] = d.x[1];
    D[(g + 8) * ld + 2 * t] = d.x[2];
    D[(g + 8) * ld + 2 * t + 1] = d.x[3];
}

// ----------------------------------------------------------------------------
// (a) one mma, fragments read from global memory: D = C + A (16x16) @ B (16x8)

__global__ void mma_from_global_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, float* D) {
    MmaAccumulator d = c_fragment(C, 8);
    mma_bf16_16816(d, a_fragment(A, 16), b_fragment(B, 8));
    store_d_fragment(D, 8, d);
}

// ----------------------------------------------------------------------------
// ldmatrix against the formulas: each lane writes 12 registers from ldmatrix (got) and 12 from the formulas
// (want): A via x4 (4), B via x2 from N x K (2), B via x2.trans from K x N (2), two B via x4.trans (4)

constexpr int kLayoutRegisters = 12;
constexpr int kLdSmall = 16 + 8;  // padded row of a 16-wide tile

__global__ void ldmatrix_layout_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B_nk, const __nv_bfloat16* B_kn,
                                       uint32_t* got, uint32_t* want) {
    __shared__ __align__(16) __nv_bfloat16 a_tile[16 * kLdSmall];
    __shared__ __align__(16) __nv_bfloat16 nk_tile[8 * kLdSmall];
    __shared__ __align__(16) __nv_bfloat16 kn_tile[16 * kLdSmall];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) {
        a_tile[(i / 16) * kLdSmall + i % 16] = A[i];
        kn_tile[(i / 16) * kLdSmall + i % 16] = B_kn[i];
        if (i < 128) nk_tile[(i / 16) * kLdSmall + i % 16] = B_nk[i];
    }
    __syncwarp();
    uint32_t* g = got + lane * kLayoutRegisters;
    uint32_t* w = want + lane * kLayoutRegisters;

    uint32_t a[4];
    ldmatrix_x4(a, a_tile + (lane % 16) * kLdSmall + (lane / 16) * 8);
    const MmaA a_want = a_fragment(A, 16);
    for (int r = 0; r < 4; r++) { g[r] = a[r]; w[r] = a_want.x[r]; }

    uint32_t b[2];
    ldmatrix_x2(b, nk_tile + (lane % 8) * kLdSmall + ((lane / 8) % 2) * 8);
    const MmaB b_nk_want = b_fragment_from_transpose(B_nk, 16);
    for (int r = 0; r < 2; r++) { g[4 + r] = b[r]; w[4 + r] = b_nk_want.x[r]; }

    ldmatrix_x2_trans(b, kn_tile + (lane % 16) * kLdSmall);
    const MmaB b_kn_want = b_fragment(B_kn, 16);
    for (int r = 0; r < 2; r++) { g[6 + r] = b[r]; w[6 + r] = b_kn_want.x[r]; }

    uint32_t two_b[4];
    ldmatrix_x4_trans(two_b, kn_tile + (lane % 16) * kLdSmall + (lane / 16) * 8);
    const MmaB right_want = b_fragment(B_kn + 8, 16);
    for (int r = 0; r < 2; r++) {
        g[8 + r] = two_b[r];
        w[8 + r] = b_kn_want.x[r];
        g[10 + r] = two_b[2 + r];
        w[10 + r] = right_want.x[r];
    }
}

// ----------------------------------------------------------------------------
// (b) C (M x N) = A (M x K) @ B from padded shared tiles, one warp per 16 rows

constexpr int kTileM = 32, kTileK = 64, kTileN = 32;
constexpr int kLdA = kTileK + 8;   // A and an N x K B: rows of K elements, padded
constexpr int kLdKN = kTileN + 8;  // a K x N B: rows of N elements, padded
enum BLoad { kB_NxK_x2, kB_KxN_x2_trans, kB_KxN_x4_trans };

template <int Load>
__global__ void mma_tiles_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
    __shared__ __align__(16) __nv_bfloat16 a_tile[kTileM * kLdA];
    __shared__ __align__(16) __nv_bfloat16 b_tile[kTileK * kLdKN > kTileN * kLdA ? kTileK * kLdKN : kTileN * kLdA];
    for (int i = threadIdx.x; i < kTileM * kTileK; i += blockDim.x) a_tile[(i / kTileK) * kLdA + i % kTileK] = A[i];
    for (int i = threadIdx.x; i < kTileK * kTileN; i += blockDim.x) {
        if (Load == kB_NxK_x2) b_tile[(i / kTileK) * kLdA + i % kTileK] = B[i];
        else b_tile[(i / kTileN) * kLdKN + i % kTileN] = B[i];
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const __nv_bfloat16* a_rows = a_tile + warp * 16 * kLdA;
    MmaAccumulator acc[kTileN / 8] = {};
    for (int k0 = 0; k0 < kTileK; k0 += 16) {
        MmaA a;
        ldmatrix_x4(a.x, a_rows + (lane % 16) * kLdA + k0 + (lane / 16) * 8);
        for (int n0 = 0; n0 < kTileN; n0 += 16) {  // two n-tiles of 8 per step
            MmaB left, right;
            if (Load == kB_NxK_x2) {
                ldmatrix_x2(left.x, b_tile + (n0 + lane % 8) * kLdA + k0 + ((lane / 8) % 2) * 8);
                ldmatrix_x2(right.x, b_tile + (n0 + 8 + lane % 8) * kLdA + k0 + ((lane / 8) % 2) * 8);
            } else if (Load == kB_KxN_x2_trans) {
                ldmatrix_x2_trans(left.x, b_tile + (k0 + lane % 16) * kLdKN + n0);
                ldmatrix_x2_trans(right.x, b_tile + (k0 + lane % 16) * kLdKN + n0 + 8);
            } else {
                uint32_t both[4];
                ldmatrix_x4_trans(both, b_tile + (k0 + lane % 16) * kLdKN + n0 + (lane / 16) * 8);
                left = MmaB{{both[0], both[1]}};
                right = MmaB{{both[2], both[3]}};
            }
            mma_bf16_16816(acc[n0 / 8], a, left);
            mma_bf16_16816(acc[n0 / 8 + 1], a, right);
        }
    }
    for (int j = 0; j < kTileN / 8; j++) store_d_fragment(C + warp * 16 * kTileN + j * 8, kTileN, acc[j]);
}

// ----------------------------------------------------------------------------
// (c) S = Q K^T (16 x 32, k = 64), then O = P V (16 x 32, k = 32) with P = bf16(S) taken straight from the
// accumulators of S as A fragments. S is written out too, so the reference can form the same P.

constexpr int kQueries = 16, kKeys = 32, kHead = 64, kValueWidth = 32;

__global__ void accumulator_as_a_kernel(const __nv_bfloat16* Q, const __nv_bfloat16* K, const __nv_bfloat16* V,
                                        float* S, float* O) {
    __shared__ __align__(16) __nv_bfloat16 q_tile[kQueries * (kHead + 8)];
    __shared__ __align__(16) __nv_bfloat16 k_tile[kKeys * (kHead + 8)];
    __shared__ __align__(16) __nv_bfloat16 v_tile[kKeys * (kValueWidth + 8)];
    const int lane = threadIdx.x, ld = kHead + 8, ldv = kValueWidth + 8;
    for (int i = lane; i < kQueries * kHead; i += 32) q_tile[(i / kHead) * ld + i % kHead] = Q[i];
    for (int i = lane; i < kKeys * kHead; i += 32) k_tile[(i / kHead) * ld + i % kHead] = K[i];
    for (int i = lane; i < kKeys * kValueWidth; i += 32) v_tile[(i / kValueWidth) * ldv + i % kValueWidth] = V[i];
    __syncwarp();
    MmaAccumulator s[kKeys / 8] = {};
    for (int k0 = 0; k0 < kHead; k0 += 16) {
        MmaA q;
        ldmatrix_x4(q.x, q_tile + (lane % 16) * ld + k0 + (lane / 16) * 8);
        for (int n = 0; n < kKeys / 8; n++) {
            MmaB k;
            ldmatrix_x2(k.x, k_tile + (8 * n + lane % 8) * ld + k0 + ((lane / 8) % 2) * 8);
            mma_bf16_16816(s[n], q, k);
        }
    }
    for (int n = 0; n < kKeys / 8; n++) store_d_fragment(S + 8 * n, kKeys, s[n]);
    MmaAccumulator o[kValueWidth / 8] = {};
    for (int step = 0; step < kKeys / 16; step++) {
        const MmaA p = mma_a_from_accumulators(s[2 * step], s[2 * step + 1]);
        for (int n0 = 0; n0 < kValueWidth; n0 += 16) {
            uint32_t v[4];
            ldmatrix_x4_trans(v, v_tile + (16 * step + lane % 16) * ldv + n0 + (lane / 16) * 8);
            mma_bf16_16816(o[n0 / 8], p, MmaB{{v[0], v[1]}});
            mma_bf16_16816(o[n0 / 8 + 1], p, MmaB{{v[2], v[3]}});
        }
    }
    for (int n = 0; n < kValueWidth / 8; n++) store_d_fragment(O + 8 * n, kValueWidth, o[n]);
}

// ----------------------------------------------------------------------------
// (d) cp.async: a 16 x 64 tile of which only the first `valid_rows` rows exist in global memory (the rest
// zero-filled, their source addresses past the end of the array), in two groups: rows 0..7, rows 8..15.

constexpr int kCopyRows = 16, kCopyCols = 64, kLdCopy = kCopyCols + 8;

__global__ void cp_async_kernel(const __nv_bfloat16* source, int valid_rows, __nv_bfloat16* after_first_wait,
                                __nv_bfloat16* after_last_wait, __nv_bfloat16* still_in_flight) {
    DYNAMIC_SHARED(__nv_bfloat16, tile);
    const int chunks_per_row = kCopyCols / 8;
    for (int group = 0; group < 2; group++) {
        for (int c = threadIdx.x; c < 8 * chunks_per_row; c += blockDim.x) {
            const int row = 8 * group + c / chunks_per_row, col = (c % chunks_per_row) * 8;
            cp_async_16_zero_fill(tile + row * kLdCopy + col, source + row * kCopyCols + col, row < valid_rows);
        }
        cp_async_commit();
    }
    cp_async_wait<1>();  // the first group has landed
    __syncthreads();
    for (int i = threadIdx.x; i < 8 * kCopyCols; i += blockDim.x)
        after_first_wait[i] = tile[(i / kCopyCols) * kLdCopy + i % kCopyCols];
#ifdef LLMC_CPU
    // the CPU device performs the second group only at the next wait (on a GPU it may be landing now)
    for (int i = threadIdx.x; i < 8 * kCopyCols; i += blockDim.x)
        still_in_flight[i] = tile[(8 + i / kCopyCols) * kLdCopy + i % kCopyCols];
    __syncthreads();  // before any thread's wait below lands its copies in the rows just read
#endif
    cp_async_wait<0>();
    __syncthreads();
    for (int i = threadIdx.x; i < kCopyRows * kCopyCols; i += blockDim.x)
        after_last_wait[i] = tile[(i / kCopyCols) * kLdCopy + i % kCopyCols];
}

// ----------------------------------------------------------------------------
// (e) mistakes the CPU device must expose

// reads the copy's target before waiting (then waits, so that the thread does not exit with it in flight)
__global__ void read_before_wait_kernel(const __nv_bfloat16* source, __nv_bfloat16* out) {
    DYNAMIC_SHARED(__nv_bfloat16, tile);
    cp_async_16(tile + 8 * threadIdx.x, source + 8 * threadIdx.x);
    cp_async_commit();
    __syncthreads();  // a barrier does not complete a cp.async
    for (int k = 0; k < 8; k++) out[8 * threadIdx.x + k] = tile[8 * threadIdx.x + k];
    cp_async_wait<0>();
}

constexpr int kForgottenWaitLine = __LINE__ + 3;
__global__ void forgotten_wait_kernel(const __nv_bfloat16* source, __nv_bfloat16* out) {
    DYNAMIC_SHARED(__nv_bfloat16, tile);
    cp_async_16(tile + 8 * threadIdx.x, source + 8 * threadIdx.x);
    cp_async_commit();
    out[threadIdx.x] = source[threadIdx.x];
}

constexpr int kDivergentMmaLine = __LINE__ + 5;
__global__ void divergent_mma_kernel(float* out) {
    MmaAccumulator d = {};
    const MmaA a = {};
    const MmaB b = {};
    if (threadIdx.x % 32 < 16) mma_bf16_16816(d, a, b);  // lanes 16..31 never join
    __syncthreads();
    out[threadIdx.x] = d.x[0];
}

constexpr int kMisalignedLine = __LINE__ + 4;
__global__ void misaligned_ldmatrix_kernel(uint32_t* out) {
    __shared__ __align__(16) __nv_bfloat16 tile[16 * 24];
    uint32_t r[4];
    ldmatrix_x4(r, tile + (threadIdx.x % 16) * 20 + 8 * (threadIdx.x / 16));  // rows 40 bytes apart
    out[threadIdx.x] = r[0];
}

// ----------------------------------------------------------------------------
// host side

inline std::vector<float> random_bf16(size_t count) {
    std::vector<float> values = random_floats(count);
    for (float& v : values) v = (float)__nv_bfloat16(v);
    return values;
}

inline std::vector<uint16_t> download_bits(const DeviceBuffer<__nv_bfloat16>& buffer) {
    std::vector<uint16_t> bits(buffer.count);
    cudaCheck(cudaMemcpy(bits.data(), buffer.ptr, bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return bits;
}

// C0 + A (M x K) @ B, in double, with B stored K x N or, when `b_is_n_by_k`, N x K. Also returns the
// largest sum of magnitudes |C0| + sum_k |A_ik B_kj| over the outputs, which bounds every partial sum.
inline std::vector<double> reference_product(const std::vector<float>& A, const std::vector<float>& B, int M, int K,
                                             int N, bool b_is_n_by_k, const std::vector<float>* C0,
                                             double* largest_partial) {
    std::vector<double> out((size_t)M * N);
    *largest_partial = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = C0 ? (*C0)[(size_t)i * N + j] : 0.0;
            double magnitude = std::fabs(sum);
            for (int k = 0; k < K; k++) {
                const double b = b_is_n_by_k ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                sum += (double)A[(size_t)i * K + k] * b;
                magnitude += std::fabs((double)A[(size_t)i * K + k] * b);
            }
            out[(size_t)i * N + j] = sum;
            *largest_partial = std::max(*largest_partial, magnitude);
        }
    return out;
}

// Products of bf16 values are exact in fp32, so only additions round: for k products summed in mma steps
// of 16, about k + k/16 + 1 additions per output, each off by at most one ulp of a partial sum (a whole ulp,
// not half: tensor cores may truncate), and no partial sum exceeds `largest_partial`.
inline double accumulation_tolerance(int k, double largest_partial) {
    return (k + k / 16 + 1) * largest_partial * FLT_EPSILON;
}

inline void check_single_mma() {
    const std::vector<float> A = random_bf16(16 * 16), B = random_bf16(16 * 8), C = random_floats(16 * 8);
    double largest = 0.0;
    const std::vector<double> ref = reference_product(A, B, 16, 16, 8, false, &C, &largest);
    DeviceBuffer<__nv_bfloat16> d_A(A.size()), d_B(B.size());
    DeviceBuffer<float> d_C(C.size()), d_D(16 * 8);
    d_A.upload(A);
    d_B.upload(B);
    d_C.upload(C);
    d_D.poison();
    launch(mma_from_global_kernel, 1, 32, 0, nullptr, d_A.ptr, d_B.ptr, d_C.ptr, d_D.ptr);
    cudaCheck(cudaDeviceSynchronize());
    check_close("mma_bf16_16816: D = C + A @ B, fragments from global", d_D.download(), ref,
                accumulation_tolerance(16, largest), 0.0);
}

inline void check_ldmatrix_layouts() {
    const std::vector<float> A = random_bf16(16 * 16), B_nk = random_bf16(8 * 16), B_kn = random_bf16(16 * 16);
    DeviceBuffer<__nv_bfloat16> d_A(A.size()), d_nk(B_nk.size()), d_kn(B_kn.size());
    DeviceBuffer<uint32_t> d_got(32 * kLayoutRegisters), d_want(32 * kLayoutRegisters);
    d_A.upload(A);
    d_nk.upload(B_nk);
    d_kn.upload(B_kn);
    d_got.poison();
    d_want.zero();
    launch(ldmatrix_layout_kernel, 1, 32, 0, nullptr, d_A.ptr, d_nk.ptr, d_kn.ptr, d_got.ptr, d_want.ptr);
    std::vector<uint32_t> got(32 * kLayoutRegisters), want(32 * kLayoutRegisters);
    cudaCheck(cudaMemcpy(got.data(), d_got.ptr, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(want.data(), d_want.ptr, want.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    struct Path { const char* name; int first, count; };
    const Path paths[] = {{"ldmatrix_x4 of a 16x16 tile = A fragment", 0, 4},
                          {"ldmatrix_x2 of an N x K tile = B fragment", 4, 2},
                          {"ldmatrix_x2_trans of a K x N tile = B fragment", 6, 2},
                          {"ldmatrix_x4_trans of a K x N tile = two B fragments", 8, 4}};
    for (const Path& path : paths) {
        int wrong = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int r = path.first; r < path.first + path.count; r++)
                wrong += got[lane * kLayoutRegisters + r] != want[lane * kLayoutRegisters + r];
        check_true(path.name, wrong == 0, std::to_string(32 * path.count) + " registers, " + std::to_string(wrong) +
                   " differ");
    }
}

template <int Load>
inline void check_tiles(const char* name) {
    const bool n_by_k = Load == kB_NxK_x2;
    const std::vector<float> A = random_bf16(kTileM * kTileK), B = random_bf16(kTileK * kTileN);
    double largest = 0.0;
    const std::vector<double> ref = reference_product(A, B, kTileM, kTileK, kTileN, n_by_k, nullptr, &largest);
    DeviceBuffer<__nv_bfloat16> d_A(A.size()), d_B(B.size());
    DeviceBuffer<float> d_C(kTileM * kTileN);
    d_A.upload(A);
    d_B.upload(B);
    d_C.poison();
    launch(mma_tiles_kernel<Load>, 1, 32 * kTileM / 16, 0, nullptr, d_A.ptr, d_B.ptr, d_C.ptr);
    cudaCheck(cudaDeviceSynchronize());
    check_close(name, d_C.download(), ref, accumulation_tolerance(kTileK, largest), 0.0);
}

inline void check_accumulator_as_a() {
    const std::vector<float> Q = random_bf16(kQueries * kHead), K = random_bf16(kKeys * kHead);
    const std::vector<float> V = random_bf16(kKeys * kValueWidth);
    DeviceBuffer<__nv_bfloat16> d_Q(Q.size()), d_K(K.size()), d_V(V.size());
    DeviceBuffer<float> d_S(kQueries * kKeys), d_O(kQueries * kValueWidth);
    d_Q.upload(Q);
    d_K.upload(K);
    d_V.upload(V);
    d_S.poison();
    d_O.poison();
    launch(accumulator_as_a_kernel, 1, 32, 0, nullptr, d_Q.ptr, d_K.ptr, d_V.ptr, d_S.ptr, d_O.ptr);
    cudaCheck(cudaDeviceSynchronize());
    double largest = 0.0;
    const std::vector<double> S_ref = reference_product(Q, K, kQueries, kHead, kKeys, true, nullptr, &largest);
    const std::vector<float> S = d_S.download();
    check_close("S = Q K^T (B via ldmatrix_x2 from K)", S, S_ref, accumulation_tolerance(kHead, largest), 0.0);
    // the reference rounds the kernel's own S, so a rounding that tips the other way cannot differ
    std::vector<float> P(S.size());
    for (size_t i = 0; i < S.size(); i++) P[i] = (float)__nv_bfloat16(S[i]);
    const std::vector<double> O_ref = reference_product(P, V, kQueries, kKeys, kValueWidth, false, nullptr, &largest);
    check_close("O = bf16(S) V, S's accumulators re-packed as A", d_O.download(), O_ref,
                accumulation_tolerance(kKeys, largest), 0.0);
}

inline void check_cp_async(int valid_rows) {
    const std::vector<float> source = random_bf16((size_t)valid_rows * kCopyCols);  // exactly the rows that exist
    DeviceBuffer<__nv_bfloat16> d_source(source.size()), first(8 * kCopyCols), last(kCopyRows * kCopyCols),
        in_flight(8 * kCopyCols);
    d_source.upload(source);
    first.poison();
    last.poison();
    in_flight.zero();
    launch(cp_async_kernel, 1, 64, kCopyRows * kLdCopy * sizeof(__nv_bfloat16), nullptr, d_source.ptr, valid_rows,
           first.ptr, last.ptr, in_flight.ptr);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<double> expected(kCopyRows * kCopyCols, 0.0);
    for (size_t i = 0; i < source.size(); i++) expected[i] = source[i];
    const std::string rows = " (" + std::to_string(valid_rows) + " of 16 rows exist)";
    // copies are exact: no tolerance
    check_close("cp.async zero fill: rows 0..7 after wait<1>" + rows, first.download(),
                std::vector<double>(expected.begin(), expected.begin() + 8 * kCopyCols), 0.0, 0.0);
    check_close("cp.async zero fill: all rows after wait<0>" + rows, last.download(), expected, 0.0, 0.0);
#ifdef LLMC_CPU
    // (in reverse lane order copies land at issue, the other extreme; see llmc/cpu/device.h)
    const std::vector<uint16_t> bits = download_bits(in_flight);
    const bool poison = std::all_of(bits.begin(), bits.end(), [](uint16_t b) { return b == 0xffff; });
    if (cudacpu::reverse_lanes())
        check_true("CPU device, reverse order: copies land at issue" + rows, !poison);
    else
        check_true("CPU device: wait<1> leaves the newest group in flight" + rows, poison);
#endif
}

#ifdef LLMC_CPU
inline void check_reported_mistakes() {
    DeviceBuffer<__nv_bfloat16> source(32 * 8), out(32 * 8);
    source.upload(random_bf16(32 * 8));
    out.zero();
    launch(read_before_wait_kernel, 1, 32, 32 * 8 * sizeof(__nv_bfloat16), nullptr, source.ptr, out.ptr);
    const std::vector<uint16_t> bits = download_bits(out);
    const bool poison = std::all_of(bits.begin(), bits.end(), [](uint16_t b) { return b == 0xffff; });
    if (!cudacpu::reverse_lanes()) {  // (in reverse lane order copies land at issue: nothing is ever pending)
        check_true("CPU device: reading before cp_async_wait sees poison", poison);
        expect_failure("a thread exiting with cp.async in flight aborts", [] {
            DeviceBuffer<__nv_bfloat16> source(32 * 8), out(32);
            launch(forgotten_wait_kernel, 1, 32, 32 * 8 * sizeof(__nv_bfloat16), nullptr, source.ptr, out.ptr);
        }, "exits with cp.async pending (issued at dev/lab/lab_mma.cuh:" + std::to_string(kForgottenWaitLine));
    } else {
        check_true("CPU device, reverse order: a read before cp_async_wait sees the copy", !poison);
    }
    expect_failure("a divergent mma aborts naming its line", [] {
        DeviceBuffer<float> out(32);
        launch(divergent_mma_kernel, 1, 32, 0, nullptr, out.ptr);
    }, "mma_bf16_16816 (dev/lab/lab_mma.cuh:" + std::to_string(kDivergentMmaLine) + ")");
    expect_failure("ldmatrix with a misaligned row aborts", [] {
        DeviceBuffer<uint32_t> out(32);
        launch(misaligned_ldmatrix_kernel, 1, 32, 0, nullptr, out.ptr);
    }, "ldmatrix (dev/lab/lab_mma.cuh:" + std::to_string(kMisalignedLine) +
           ") a row address that is not 16-byte aligned");
}
#endif

// ----------------------------------------------------------------------------
// timing: a chain of dependent mma per warp

__global__ void mma_chain_kernel(float* out, int count) {
    const MmaA a = {{0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u}};  // all ones
    const MmaB b = {{0x3c003c00u, 0x3c003c00u}};                            // all 2^-7
    MmaAccumulator d = {};
    for (int i = 0; i < count; i++) mma_bf16_16816(d, a, b);
    out[blockIdx.x * blockDim.x + threadIdx.x] = d.x[0] + d.x[1] + d.x[2] + d.x[3];
}

inline void bench() {
#ifdef LLMC_CPU
    const int blocks = 1, count = 100000;
#else
    const int blocks = device_properties().multiProcessorCount * 4, count = 100000;
#endif
    const int threads = 128;
    DeviceBuffer<float> out(blocks * threads);
    const double ms = time_ms([&] { launch(mma_chain_kernel, blocks, threads, 0, nullptr, out.ptr, count); }, 3);
    const double mmas = (double)blocks * (threads / 32) * count;
    report_bench("mma_bf16_16816 chains, " + std::to_string((long long)mmas) + " mma", ms, 0,
                 mmas * 2.0 * 16 * 8 * 16);
    printf("  bench %-44s %9.1f ns per warp-wide mma\n", "mma_bf16_16816", ms * 1e6 / mmas);
}

}  // namespace mma_lab

void lab_mma() {
    if (!family_selected("mma")) return;
    mma_lab::check_single_mma();
    mma_lab::check_ldmatrix_layouts();
    mma_lab::check_tiles<mma_lab::kB_NxK_x2>("32x64 @ (32x64)^T: A ldmatrix_x4, B ldmatrix_x2");
    mma_lab::check_tiles<mma_lab::kB_KxN_x2_trans>("32x64 @ 64x32: A ldmatrix_x4, B ldmatrix_x2_trans");
    mma_lab::check_tiles<mma_lab::kB_KxN_x4_trans>("32x64 @ 64x32: A ldmatrix_x4, B ldmatrix_x4_trans");
    mma_lab::check_accumulator_as_a();
    for (int valid_rows : {16, 11, 5}) mma_lab::check_cp_async(valid_rows);
#ifdef LLMC_CPU
    mma_lab::check_reported_mistakes();
#endif
    if (lab.bench) mma_lab::bench();
}
