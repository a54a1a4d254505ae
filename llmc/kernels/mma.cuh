/*
Tensor-core instructions for bf16 kernels: mma.sync (a 16x8x16 matrix multiply-accumulate done by one warp),
ldmatrix (shared memory -> fragments) and cp.async (global -> shared memory without passing through
registers). Each wrapper is one PTX instruction on the GPU and, on the CPU execution layer, a warp-collective
operation that follows the PTX ISA's documented per-lane layout ("Matrix Fragments for mma.m16n8k16 with
floating point type" and "Warp-level matrix load instruction: ldmatrix"), so a kernel that gets a layout
wrong fails its CPU test too.

mma_bf16_16816(d, a, b):  D (16x8, fp32) += A (16x16, bf16) @ B (16x8, bf16)
The 32 lanes of a warp each hold a few elements of every matrix: its fragment. With
    lane = 4 * group + t,   group = lane >> 2 (0..7),   t = lane & 3 (0..3),
each 32-bit register holds two bf16 of adjacent columns (A, C) or rows (B), the lower index in the low 16
bits. Which lane holds which element (Ln = lane n; the same lane appears in both halves of A and C):

A, 16 x 16 (M x K, row-major), MmaA::x[0..3]:
              cols 0,1  2,3  4,5  6,7         cols 8,9  10,11 12,13 14,15
    row  0        L0   L1   L2   L3               L0    L1    L2    L3
    row  1        L4   L5   L6   L7               L4    L5    L6    L7
     ...          (x[0]: row g, cols 2t,2t+1)      (x[2]: row g, cols 2t+8,2t+9)
    row  7       L28  L29  L30  L31              L28   L29   L30   L31
    row  8        L0   L1   L2   L3               L0    L1    L2    L3
     ...          (x[1]: row g+8, cols 2t,2t+1)    (x[3]: row g+8, cols 2t+8,2t+9)
    row 15       L28  L29  L30  L31              L28   L29   L30   L31

B, 16 x 8 (K x N, "col": each lane holds pairs down a column), MmaB::x[0..1]:
              n=0  n=1  n=2 ... n=7
    k  0,1     L0   L4   L8     L28      x[0]: k 2t,2t+1,   n g
    k  2,3     L1   L5   L9     L29
    k  4,5     L2   L6  L10     L30
    k  6,7     L3   L7  L11     L31
    k  8,9     L0   L4   L8     L28      x[1]: k 2t+8,2t+9, n g
     ...
    k 14,15    L3   L7  L11     L31

C and D, 16 x 8 (fp32), MmaAccumulator::x[0..3]:
              cols 0,1  2,3  4,5  6,7
    row  0        L0   L1   L2   L3      x[0], x[1]: row g,   cols 2t, 2t+1
     ...
    row  7       L28  L29  L30  L31
    row  8        L0   L1   L2   L3      x[2], x[3]: row g+8, cols 2t, 2t+1
     ...
    row 15       L28  L29  L30  L31

Two accumulators side by side (cols 0..7 and 8..15 of a 16x16 block) hold, after rounding to bf16, exactly
the elements an A fragment needs in the same lanes: a product S = Q K^T can feed P V without leaving
registers (mma_a_from_accumulators).

ldmatrix: each lane passes the shared-memory address of one 16-byte row (8 bf16, 16-byte aligned) of an
8x8 matrix; lanes 8i..8i+7 give rows 0..7 of matrix i (.x2: lanes 0..15, the others' addresses are
ignored). Lane L receives in r[i] two elements of matrix i: row L/4, cols 2(L%4) and 2(L%4)+1; with .trans,
rows 2(L%4) and 2(L%4)+1 of column L/4 (the lower index in the low half). That is the C layout of an 8x8
block, so ldmatrix yields fragments directly:
  - A from a row-major 16x16 tile (row stride `ld` elements):  ldmatrix_x4(a.x, tile + (L%16)*ld + (L/16)*8)
  - B from an N x K row-major tile (K^T, as for S = Q K^T), n-tile n0, k-step k0:
        ldmatrix_x2(b.x, tile + (n0 + L%8)*ld + k0 + ((L/8)%2)*8)
  - B from a K x N row-major tile (as V in P V):
        ldmatrix_x2_trans(b.x, tile + (k0 + L%16)*ld + n0)
    and two n-tiles at once, r[0..1] for n0 and r[2..3] for n0 + 8:
        ldmatrix_x4_trans(r, tile + (k0 + L%16)*ld + n0 + (L/16)*8)
Pad each shared row by 8 elements (ld = width + 8): the rows then start 16 bytes apart in the bank
pattern, and the eight rows of one matrix are read without bank conflicts.

cp.async: cp_async_16 starts a 16-byte copy global -> shared (both addresses 16-byte aligned) that lands
some time later; cp_async_commit closes the group of copies issued since the last commit; cp_async_wait<N>
returns once at most the N most recent committed groups are still in flight. Only the wait makes the
thread's own copies visible, and only to itself: a __syncthreads after the wait shares them with the block.
A barrier alone does not complete anything. On the CPU device the copies are performed at the wait and not
before, so a kernel that reads before waiting reads stale shared memory (0xff poison) every time, and a
thread that exits with copies in flight is an error.

On the CPU each wrapper takes two trailing defaulted arguments, the caller's file and line, for messages
about divergent warps and misaligned addresses; call them as if they were not there.
*/
#pragma once

#include "../cuda_common.cuh"

struct MmaA { uint32_t x[4]; };         // 16x16 bf16 A fragment
struct MmaB { uint32_t x[2]; };         // 16x8 bf16 B fragment
struct MmaAccumulator { float x[4]; };  // 16x8 fp32 C/D fragment

#ifdef LLMC_CPU
#define MMA_CALL_SITE , const char* file = __builtin_FILE(), int line = __builtin_LINE()
#else
#define MMA_CALL_SITE
#endif

// two floats rounded to bf16 (nearest, ties to even), `lo` in the low 16 bits
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#ifdef LLMC_CPU
    return (uint32_t)__nv_bfloat16(lo).__x | ((uint32_t)__nv_bfloat16(hi).__x << 16);
#else
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);  // one cvt.rn.bf16x2.f32
    uint32_t bits;
    memcpy(&bits, &pair, sizeof(bits));
    return bits;
#endif
}

// .x from the low 16 bits, .y from the high 16 bits
__device__ __forceinline__ float2 unpack_bf16x2(uint32_t bits) {
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

// The A fragment of the 16x16 block whose columns 0..7 are `left` and 8..15 are `right`, rounded to bf16.
__device__ __forceinline__ MmaA mma_a_from_accumulators(const MmaAccumulator& left, const MmaAccumulator& right) {
    MmaA a;
    a.x[0] = pack_bf16x2(left.x[0], left.x[1]);    // row g,   cols 2t, 2t+1
    a.x[1] = pack_bf16x2(left.x[2], left.x[3]);    // row g+8, cols 2t, 2t+1
    a.x[2] = pack_bf16x2(right.x[0], right.x[1]);  // row g,   cols 2t+8, 2t+9
    a.x[3] = pack_bf16x2(right.x[2], right.x[3]);  // row g+8, cols 2t+8, 2t+9
    return a;
}

// ----------------------------------------------------------------------------
// the CPU side: what one instruction does for the whole warp, from all 32 lanes' arguments

#ifdef LLMC_CPU
namespace mma_cpu {

struct MmaLane {
    MmaAccumulator* d;
    const MmaA* a;
    const MmaB* b;
};

// eight floats as one value (a single AVX register where there is one), so that a row of B @ ... stays in
// registers through the sum over k instead of going through memory for every k (GCC's vector extension)
typedef float EightFloats __attribute__((vector_size(8 * sizeof(float))));

// Gathers A, B and C from the 32 lanes' registers, multiplies in fp32, scatters D. Products of two bf16
// are exact in fp32 (8-bit significands), so only the sums round: each row of A @ B is summed over k in
// increasing order, then added to C.
inline void mma_warp(void* const lanes[cudacpu::kWarpSize]) {
    float A[16][16];
    EightFloats B[16], D[16];  // rows of B and of C/D
    for (int lane = 0; lane < 32; lane++) {
        const MmaLane& args = *static_cast<const MmaLane*>(lanes[lane]);
        const int g = lane >> 2, t = lane & 3;
        const float2 a0 = unpack_bf16x2(args.a->x[0]), a1 = unpack_bf16x2(args.a->x[1]);
        const float2 a2 = unpack_bf16x2(args.a->x[2]), a3 = unpack_bf16x2(args.a->x[3]);
        A[g][2 * t] = a0.x;         A[g][2 * t + 1] = a0.y;
        A[g + 8][2 * t] = a1.x;     A[g + 8][2 * t + 1] = a1.y;
        A[g][2 * t + 8] = a2.x;     A[g][2 * t + 9] = a2.y;
        A[g + 8][2 * t + 8] = a3.x; A[g + 8][2 * t + 9] = a3.y;
        const float2 b0 = unpack_bf16x2(args.b->x[0]), b1 = unpack_bf16x2(args.b->x[1]);
        B[2 * t][g] = b0.x;     B[2 * t + 1][g] = b0.y;
        B[2 * t + 8][g] = b1.x; B[2 * t + 9][g] = b1.y;
        D[g][2 * t] = args.d->x[0];     D[g][2 * t + 1] = args.d->x[1];
        D[g + 8][2 * t] = args.d->x[2]; D[g + 8][2 * t + 1] = args.d->x[3];
    }
    for (int i = 0; i < 16; i++) {
        EightFloats sum = {};
        for (int k = 0; k < 16; k++) sum += A[i][k] * B[k];
        D[i] += sum;
    }
    for (int lane = 0; lane < 32; lane++) {
        MmaAccumulator& d = *static_cast<const MmaLane*>(lanes[lane])->d;
        const int g = lane >> 2, t = lane & 3;
        d.x[0] = D[g][2 * t];     d.x[1] = D[g][2 * t + 1];
        d.x[2] = D[g + 8][2 * t]; d.x[3] = D[g + 8][2 * t + 1];
    }
}

struct LdmatrixLane {
    uint32_t* r;
    const __nv_bfloat16* row;
    const char* file;
    int line;
};

// Reads row r of matrix m from the address lane 8m + r gave, then hands each lane its two elements.
template <int Matrices, bool Transposed>
inline void ldmatrix_warp(void* const lanes[cudacpu::kWarpSize]) {
    uint16_t tile[Matrices][8][8];
    for (int m = 0; m < Matrices; m++)
        for (int r = 0; r < 8; r++) {
            const LdmatrixLane& args = *static_cast<const LdmatrixLane*>(lanes[8 * m + r]);
            if (reinterpret_cast<uintptr_t>(args.row) % 16 != 0) {
                char message[512];
                snprintf(message, sizeof(message), "in kernel %s: lane %d passes ldmatrix (%s:%d) a row address "
                         "that is not 16-byte aligned (%p)",
                         cudacpu::describe_function(cudacpu::current_runner->kernel).c_str(), 8 * m + r, args.file,
                         args.line, static_cast<const void*>(args.row));
                cudacpu::fatal(message);
            }
            memcpy(tile[m][r], args.row, 16);
        }
    for (int lane = 0; lane < 32; lane++) {
        uint32_t* r = static_cast<const LdmatrixLane*>(lanes[lane])->r;
        const int g = lane >> 2, t = lane & 3;
        for (int m = 0; m < Matrices; m++) {
            const uint16_t lo = Transposed ? tile[m][2 * t][g] : tile[m][g][2 * t];
            const uint16_t hi = Transposed ? tile[m][2 * t + 1][g] : tile[m][g][2 * t + 1];
            r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
    }
}

template <int Matrices, bool Transposed>
inline void ldmatrix(uint32_t* r, const __nv_bfloat16* row, const char* name, const char* file, int line) {
    LdmatrixLane args{r, row, file, line};
    cudacpu::warp_collective(name, ldmatrix_warp<Matrices, Transposed>, &args, file, line);
}

}  // namespace mma_cpu
#endif

// ----------------------------------------------------------------------------
// the wrappers

// d += a @ b, accumulated in fp32 (all 32 lanes of the warp together)
__device__ __forceinline__ void mma_bf16_16816(MmaAccumulator& d, const MmaA& a, const MmaB& b MMA_CALL_SITE) {
#ifdef LLMC_CPU
    mma_cpu::MmaLane args{&d, &a, &b};
    cudacpu::warp_collective("mma_bf16_16816", mma_cpu::mma_warp, &args, file, line);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#endif
}

// Four 8x8 matrices; `row` is this lane's row (shared memory, 16-byte aligned).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row MMA_CALL_SITE) {
#ifdef LLMC_CPU
    mma_cpu::ldmatrix<4, false>(r, row, "ldmatrix_x4", file, line);
#else
    const unsigned address = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row MMA_CALL_SITE) {
#ifdef LLMC_CPU
    mma_cpu::ldmatrix<4, true>(r, row, "ldmatrix_x4_trans", file, line);
#else
    const unsigned address = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
#endif
}

// Two 8x8 matrices: lanes 0..15 give the row addresses (every lane still takes part).
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const __nv_bfloat16* row MMA_CALL_SITE) {
#ifdef LLMC_CPU
    mma_cpu::ldmatrix<2, false>(r, row, "ldmatrix_x2", file, line);
#else
    const unsigned address = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(address));
#endif
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const __nv_bfloat16* row MMA_CALL_SITE) {
#ifdef LLMC_CPU
    mma_cpu::ldmatrix<2, true>(r, row, "ldmatrix_x2_trans", file, line);
#else
    const unsigned address = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(address));
#endif
}

// 16 bytes global -> shared, completed by a later cp_async_wait (both addresses 16-byte aligned)
__device__ __forceinline__ void cp_async_16(void* shared_target, const void* global_source MMA_CALL_SITE) {
#ifdef LLMC_CPU
    cudacpu::async_copy_16(shared_target, global_source, true, file, line);
#else
    const unsigned target = (unsigned)__cvta_generic_to_shared(shared_target);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(target), "l"(global_source) : "memory");
#endif
}

// as cp_async_16 when `valid`; otherwise the target gets 16 zero bytes and the source (which may then
// point anywhere, e.g. past the end of an array) is not read
__device__ __forceinline__ void cp_async_16_zero_fill(void* shared_target, const void* global_source,
                                                      bool valid MMA_CALL_SITE) {
#ifdef LLMC_CPU
    cudacpu::async_copy_16(shared_target, global_source, valid, file, line);
#else
    const unsigned target = (unsigned)__cvta_generic_to_shared(shared_target);
    const int source_bytes = valid ? 16 : 0;  // bytes beyond the source size are filled with zeros
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(target), "l"(global_source),
                 "r"(source_bytes) : "memory");
#endif
}

// closes the group of this thread's copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() {
#ifdef LLMC_CPU
    cudacpu::async_copy_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// waits until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    static_assert(N >= 0, "cp_async_wait<N> needs N >= 0");
#ifdef LLMC_CPU
    cudacpu::async_copy_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#undef MMA_CALL_SITE
