/*
Causal multi-head self-attention, fused: forward and backward without ever forming the T x T matrix.

Layouts (the matmuls around attention produce and consume these directly, so there are no permute kernels):
  qkv   (B, T, 3C)   the QKV projection's output: q in columns [0, C), k in [C, 2C), v in [2C, 3C);
                     head h owns columns [h*HS, (h+1)*HS) of each part (C = NH * HS)
  out   (B, T, C)    head h's output in columns [h*HS, (h+1)*HS), ready for the output projection
  lse   (B, NH, T)   fp32 log-sum-exp of each row of scaled, masked scores (natural log); the backward pass
                     needs it, and so does ring attention, which merges partial results from several key blocks
  dout  (B, T, C)    gradient of the loss with respect to out
  dqkv  (B, T, 3C)   gradient with respect to qkv, same layout; OVERWRITTEN (not accumulated): qkv is an
                     activation, not a parameter, so there is nothing to accumulate into

Forward. For one (b, h), with Q, K, V the T x HS slices of that head and scale = 1/sqrt(HS):
    S[i][j] = scale * Q[i] . K[j]            for j <= i (causal); masked entries are -infinity
    P[i][j] = exp(S[i][j] - lse[i]),  lse[i] = log sum_j exp(S[i][j])
    O[i]    = sum_j P[i][j] V[j]
Online softmax (FlashAttention): the keys are visited in tiles, and for each query row we keep a running
maximum m, a running sum l = sum_j exp(S[i][j] - m) and an unnormalised accumulator o = sum_j exp(S[i][j] - m) V[j]
over the keys seen so far. A new tile with scores s_j gives
    m' = max(m, max_j s_j),   c = exp(m - m')
    l' = c * l + sum_j exp(s_j - m'),   o' = c * o + sum_j exp(s_j - m') V[j]
(the rescale c brings the old terms onto the new maximum, so no exp ever overflows). After the last tile
O[i] = o / l and lse[i] = m + log(l).

Backward. With dO the incoming gradient:
    dV[j]    = sum_i P[i][j] dO[i]
    dP[i][j] = dO[i] . V[j]
    dS[i][j] = P[i][j] * (dP[i][j] - D[i]),   D[i] = sum_j P[i][j] dP[i][j] = dO[i] . O[i]
    dQ[i]    = scale * sum_j dS[i][j] K[j]
    dK[j]    = scale * sum_i dS[i][j] Q[i]
P is recomputed tile by tile from Q, K and the saved lse (one exp per entry, no renormalisation needed), and
D is computed up front from dO and O by a small preprocessing kernel. dK and dV are sums over query rows,
dQ is a sum over key rows; writing both from one kernel would need atomics (and atomic float sums change
bits from run to run). So the backward pass is two kernels:
  - dK/dV kernel: one block per key tile; it walks the query tiles from the diagonal to the end;
  - dQ kernel:    one block per query tile; it walks the key tiles from the start to the diagonal.
That computes S, P and dP twice (once per kernel): per score entry 7 products of length HS instead of the
5 an atomic version would need (S, dP, dV, dK, dQ), 1.4x the work; in exchange every gradient element is
summed by one thread in a fixed order, so two runs give the same bits.

Two implementations of these formulas, one per precision, behind the same two launchers below:
  llmc/attention_tensor_cores.cuh   BF16 build: every product of tiles is a tensor-core mma (bf16 operands,
                                    fp32 accumulation), the online softmax works on the accumulator fragments
                                    in registers, tiles stream in through cp.async double buffering.
  llmc/attention_cuda_cores.cuh     FP32 build: plain fp32 multiply-adds over tiles in shared memory; the
                                    exact reference path.
Both run the same schedule: one block per tile of 64 (tensor cores) or 32 (CUDA cores) rows, the longest
blocks first, nothing T x T ever stored (each block holds one tile of scores at a time, and the only per-row
state carried from tile to tile is (m, l, o): memory is O(T * HS) per head, not O(T^2)).

Workspace: the backward pass needs B * NH * T floats (the D values), passed as workspace_D.
Supported head sizes: multiples of 16 from 16 to 128 (the kernels are templates on HS; the launchers
dispatch at run time and refuse anything else). Any T >= 1.
*/
#pragma once

#include <type_traits>
#include "cuda_common.cuh"
#ifdef ENABLE_FP32
#include "attention_cuda_cores.cuh"
#else
#include "attention_tensor_cores.cuh"
#endif

// ----------------------------------------------------------------------------
// backward, first step: D[b][h][t] = dout[b][t][head h] . out[b][t][head h]. One thread per (b, h, t) row,
// grid-stride loop.

__global__ void attention_backward_preprocess_kernel(float* D, const floatX* dout, const floatX* out,
                                                     int B, int T, int NH, int HS) {
    const int C = NH * HS;
    const long long rows = (long long)B * NH * T;
    const GridStride share = grid_stride(rows);
    for (size_t index = share.first; index < share.end; index += share.step) {
        const int t = (int)(index % T);
        const int h = (int)((index / T) % NH);
        const int b = (int)(index / ((long long)T * NH));
        const size_t offset = ((size_t)b * T + t) * C + (size_t)h * HS;
        float sum = 0.0f;
        for (int column = 0; column < HS; column += x128::size) {
            x128 dout_packed = load128(dout + offset + column);
            x128 out_packed = load128(out + offset + column);
            for (int k = 0; k < x128::size; k++) sum += (float)dout_packed[k] * (float)out_packed[k];
        }
        D[index] = sum;
    }
}

// ----------------------------------------------------------------------------
// host launchers

// Calls fn(std::integral_constant<int, HS>{}) for the supported head sizes, refuses the others.
template <class Function>
void dispatch_attention_head_size(int head_size, Function&& fn) {
    switch (head_size) {
        case 16: fn(std::integral_constant<int, 16>{}); break;
        case 32: fn(std::integral_constant<int, 32>{}); break;
        case 48: fn(std::integral_constant<int, 48>{}); break;
        case 64: fn(std::integral_constant<int, 64>{}); break;
        case 80: fn(std::integral_constant<int, 80>{}); break;
        case 96: fn(std::integral_constant<int, 96>{}); break;
        case 112: fn(std::integral_constant<int, 112>{}); break;
        case 128: fn(std::integral_constant<int, 128>{}); break;
        default:
            fprintf(stderr, "error: attention supports head sizes 16, 32, ..., 128 (multiples of 16), got %d\n",
                    head_size);
            exit(EXIT_FAILURE);
    }
}

inline int attention_head_size(int C, int NH) {
    if (NH <= 0 || C % NH != 0) {
        fprintf(stderr, "error: attention needs C (%d) divisible by the number of heads (%d)\n", C, NH);
        exit(EXIT_FAILURE);
    }
    return C / NH;
}

// out (B, T, C) and lse (B, NH, T) are overwritten.
void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                       cudaStream_t stream) {
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        launch_attention_forward<decltype(head_size)::value>(out, lse, qkv, B, T, NH, stream);
    });
}

// dqkv (B, T, 3C) is overwritten (every element written); workspace_D holds B * NH * T floats.
// Two runs with the same inputs give the same bits.
void attention_backward(floatX* dqkv, float* workspace_D, const floatX* dout, const floatX* qkv, const floatX* out,
                        const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    dispatch_attention_head_size(attention_head_size(C, NH), [&](auto head_size) {
        constexpr int hs = decltype(head_size)::value;
        const int block_size = 256;
        launch(attention_backward_preprocess_kernel, grid_size_for((long long)B * NH * T, block_size), block_size, 0,
               stream, workspace_D, dout, out, B, T, NH, hs);
        launch_attention_backward<hs>(dqkv, workspace_D, dout, qkv, lse, B, T, NH, stream);
    });
}
