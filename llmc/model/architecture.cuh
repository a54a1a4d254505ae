/*
Where the two architectures differ, and where a row sits: the four points at which the one block function
(llmc/model/forward_backward.cuh) chooses its op by the architecture, and the positions of this rank's rows,
which RoPE and the embeddings need.
    norm       LayerNorm (GPT-2)                 | RMSNorm (Llama)                       norm_forward
    positions  a learned table wpe, in the embeddings | RoPE: q and k turned by position    positions_in_attention
    MLP        GELU on 4C hidden units           | SwiGLU; either as experts (moe.cuh)    activation_forward
    K/V heads  as many as query heads            | fewer: grouped-query attention          rank_attention_heads
*/
#pragma once

#include <vector>
#include "gpt2.cuh"
#include "../parallel/parallel_context.h"

// ----------------------------------------------------------------------------
// where this rank's rows sit in their sequences

// The positions of this rank's N = B*T rows, as chunks of rows (llmc/parallel/context_parallel.h): one chunk of
// whole sequences, a cp rank's one or two, or, while sampling with the key/value cache, the one row being
// decoded, at the cache's position (every cp rank runs it whole: one row does not split).
inline std::vector<SequenceChunk> row_positions(const GPT2& model, const ParallelContext& par, int B, int T) {
    if (model.cache.decoding) return {SequenceChunk{0, model.cache.position, T}};
    return cp_sequence_chunks(par.cp, B, T);
}

// ----------------------------------------------------------------------------
// the four points

// LayerNorm or RMSNorm of N rows (RMSNorm keeps no mean and has no bias).
inline void norm_forward(const GPT2Config& c, floatX* out, float* mean, float* rstd, const floatX* inp,
                         const floatX* weight, const floatX* bias, int N, cudaStream_t stream) {
    if (c.llama()) rmsnorm_forward(out, rstd, inp, weight, N, c.channels, c.norm_eps, stream);
    else layernorm_forward(out, mean, rstd, inp, weight, bias, N, c.channels, stream);
}
// residual = inp1 + inp2, out = norm(residual)
inline void fused_residual_norm_forward(const GPT2Config& c, floatX* residual, floatX* out, float* mean, float* rstd,
                                        const floatX* inp1, const floatX* inp2, const floatX* weight,
                                        const floatX* bias, int N, cudaStream_t stream) {
    if (c.llama()) fused_residual_rmsnorm_forward(residual, out, rstd, inp1, inp2, weight, N, c.channels, c.norm_eps, stream);
    else fused_residual_layernorm_forward(residual, out, mean, rstd, inp1, inp2, weight, bias, N, c.channels, stream);
}
// dinp, dweight (and dbias) += the norm's gradients
inline void norm_backward(const GPT2Config& c, floatX* dinp, floatX* dweight, floatX* dbias, float* scratch,
                          const floatX* dout, const floatX* inp, const floatX* weight, const float* mean,
                          const float* rstd, int N, cudaStream_t stream) {
    if (c.llama()) rmsnorm_backward(dinp, dweight, scratch, dout, inp, weight, rstd, N, c.channels, stream);
    else layernorm_backward(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, c.channels, stream);
}

// Llama's positions: RoPE turns the query and key heads of qkv (this rank's, N rows) in place, forward or
// (the transposed rotation) backward. Each cp chunk of rows sits at its own positions; GPT-2 took its
// positions in with the embeddings and does nothing here.
inline void positions_in_attention(const GPT2& model, const ParallelContext& par, floatX* qkv, int B, int T,
                                   bool backward, cudaStream_t stream) {
    const GPT2Config& c = model.config;
    if (!c.llama()) return;
    const int q_heads = c.num_heads / par.tp.size, kv_heads = c.kv_heads / par.tp.size;
    const size_t width = (size_t)(q_heads + 2 * kv_heads) * c.head_size();
    for (const SequenceChunk& chunk : row_positions(model, par, B, T)) {
        floatX* rows = qkv + (size_t)chunk.first_row * width;
        const float* frequencies = model.shared.rope_frequencies;
        if (backward) rope_backward(rows, B, chunk.T, chunk.position, q_heads, kv_heads, c.head_size(), frequencies, stream);
        else rope_forward(rows, B, chunk.T, chunk.position, q_heads, kv_heads, c.head_size(), frequencies, stream);
    }
}

// The MLP's activation on N rows of this rank's H hidden units: GELU of fc's H outputs, or SwiGLU of its 2H
// (silu(gate) * up; llmc/kernels/swiglu.cuh).
inline void activation_forward(const GPT2Config& c, floatX* out, const floatX* fc_out, int N, int H,
                               cudaStream_t stream) {
    if (c.llama()) swiglu_forward(out, fc_out, N, H, stream);
    else gelu_forward(out, fc_out, (size_t)N * H, stream);
}
// dfc_out (N x H or 2H) = the gradient of fc's output from dout (N x H); GELU's may work in place
inline void activation_backward(const GPT2Config& c, floatX* dfc_out, const floatX* fc_out, const floatX* dout, int N,
                                int H, cudaStream_t stream) {
    if (c.llama()) swiglu_backward(dfc_out, fc_out, dout, N, H, stream);
    else gelu_backward(dfc_out, fc_out, dout, (size_t)N * H, stream);
}

// This rank's heads: its tp share of the query heads and of the K/V heads (llmc/kernels/attention.cuh).
inline AttentionHeads rank_attention_heads(const GPT2Config& c, const TensorParallel& tp) {
    return attention_heads(c.num_heads / tp.size, c.kv_heads / tp.size, c.head_size());
}

// Sampling with the key/value cache (llmc/model/gpt2.cuh's KVCache), one row: its K and V heads (the qkv row's
// columns after its query heads, already in the cache's packed layout) go into the cache at its position, then
// its query heads attend over positions 0 .. position there: one query block against one key block, as ring
// attention runs a pair.
inline void cached_attention(GPT2& model, int layer, const BlockActivations& a, const AttentionHeads& heads) {
    KVCache& cache = model.cache;
    if (cache.position < 0 || cache.position >= cache.capacity)
        fatal("the key/value cache holds %d positions, asked for position %d", cache.capacity, cache.position);
    floatX* keys = cache.layers[layer];
    const size_t row = 2 * (size_t)heads.kv_columns();
    cudaCheck(cudaMemcpyAsync(keys + (size_t)cache.position * row, a.qkv + heads.q_columns(), row * sizeof(floatX),
                              cudaMemcpyDeviceToDevice, model.stream));
    attention_forward_pair(a.atty, a.lse, AttentionBlock{a.qkv, 1, cache.position},
                           packed_key_values(keys, cache.position + 1, 0, heads), /*B=*/1, heads, model.stream);
}
