/*
What the model computes (llmc/model/gpt2.cuh has the shapes): one block's forward and backward pass, and the
pieces of a step around the blocks, on this rank's part of the model.

The network, for a batch of B sequences of T tokens, GPT-2's and, where it differs, Llama 3's:
    x      = wte[tokens] + wpe[positions]          (Llama: wte[tokens])                gpt2_embed
    for each of the L blocks:                                                          block_forward
        x  = x + attproj(attention(qkv(norm1(x))))         (Llama: RoPE on q and k)
        x  = x + fcproj(act(fc(norm2(x))))
    logits = normf(x) @ wte^T                              (Llama: @ lmhead^T)         gpt2_head_forward
    loss   = mean cross-entropy of softmax(logits[:, :V]) against the next tokens      gpt2_loss
One block function serves both; the architecture chooses the op at four points (llmc/model/architecture.cuh):
    norm       LayerNorm (GPT-2)                 | RMSNorm, x / sqrt(mean(x^2) + eps) * w (Llama)
    positions  a learned table wpe, in the embeddings | RoPE: q and k turned by their position
    act        GELU on 4C hidden units           | SwiGLU: silu(gate) * up, fc giving gate and up
    K/V heads  as many as query heads            | fewer: grouped-query attention (attention_heads)
and Llama has no biases (its BlockParams hold null there, which every kernel takes as "none").

Every function takes the model and the parallel context (llmc/parallel/parallel_context.h), and the ranks
talk only where the math puts them, each at a named call:
    tp_enter, tp_leave            Megatron's f and g around the split matmuls  llmc/parallel/tensor_parallel.h
    cp_attention_forward/backward attention over the cp ranks' positions       llmc/parallel/context_parallel.h
    zero_parameters_of            a chunk's parameters (ZeRO-3 gathers them)   llmc/parallel/zero.h
    zero_gradients_of             where a chunk's gradient accumulates
    chunk_gradient_done           a chunk's gradient is complete: reduce it over the data-parallel ranks
With one rank each of them does nothing but hand back the model's own buffers.
*/
#pragma once

#include <string>
#include <vector>
#include "gpt2.cuh"
#include "architecture.cuh"
#include "moe.cuh"
#include "../parallel/parallel_context.h"

// ----------------------------------------------------------------------------
// where the passes find parameters and gradients (chunk 0: embeddings, 1..L: blocks, L+1: final layernorm)

inline BlockParams block_parameters(GPT2& model, ParallelContext& par, int layer) {
    return block_params_in_chunk(zero_parameters_of(par.zero, model, layer + 1), model.layout, layer);
}
inline BlockParams block_gradients(GPT2& model, ParallelContext& par, int layer) {
    return block_params_in_chunk(zero_gradients_of(par.zero, model, layer + 1), model.layout, layer);
}

// Chunk c's gradient is complete for this microbatch: the final layernorm after the LM head's backward pass,
// each block after its own, the embeddings after the last of the lookup's and the LM head's shares (on one
// rank: final layernorm, blocks L-1 .. 0, embeddings). When ZeRO reduces it now (the step's last
// microbatch; every microbatch at stages 2 and 3), the tp ranks' shares of its partial gradients are added up
// first (SP's layernorms, a mixture of experts' router and experts), on the compute stream, the only stream
// that talks to the tp group. On the step's first microbatch the noise scale, when measured, squares the
// chunk's gradient before it is reduced (zero_small_batch_norm).
inline void chunk_gradient_done(GPT2& model, ParallelContext& par, int chunk) {
    const bool reduce = zero_reduces_now(par.zero);
    if (reduce)
        tp_sum_partial_gradients(par.tp, zero_unreduced_gradient(par.zero, model, chunk), model.layout, chunk,
                                 model.stream);
    zero_small_batch_norm(par.zero, model, chunk);
    if (reduce) zero_reduce_chunk(par.zero, model, chunk);
}

// ----------------------------------------------------------------------------
// one block, forward and backward (N = B*T rows)
//
// Under tensor parallelism each rank runs the block on its heads and hidden units; tp_enter (f) and
// tp_leave (g) are where the ranks talk: all-reduces, or with sequence parallelism all-gathers and
// reduce-scatters. With one rank they do nothing and R = N.

// Block `layer` on a.input, writing its activation record a.
inline void block_forward(GPT2& model, ParallelContext& par, int layer, const BlockActivations& a, int B, int T) {
    const GPT2Config c = model.config.block(layer);  // a dense block's, or a mixture's
    const TensorParallel& tp = par.tp;
    SharedBuffers& s = model.shared;
    cudaStream_t stream = model.stream;
    const BlockParams p = block_parameters(model, par, layer);
    const int N = B * T, C = c.channels, R = tp_rows(tp, N);
    const int attention = C / tp.size, qkv = c.qkv_channels() / tp.size;
    const int hidden = c.hidden() / tp.size, fc = c.fc_channels() / tp.size;
    const AttentionHeads heads = rank_attention_heads(c, tp);
    // x + attproj(attention(qkv(norm1(x)))): qkv column-parallel (this rank's heads), attproj row-parallel
    norm_forward(c, a.ln1, a.ln1_mean, a.ln1_rstd, a.input, p.ln1w, p.ln1b, R, stream);
    const floatX* ln1 = tp_enter(tp, a.ln1, s.gathered, N, C, stream);
    matmul_forward(a.qkv, ln1, p.qkvw, p.qkvb, N, C, qkv, stream);
    positions_in_attention(model, par, a.qkv, B, T, /*backward=*/false, stream);
    if (model.cache.decoding) cached_attention(model, layer, a, heads);  // sampling, one row
    else cp_attention_forward(par.cp, a.atty, a.lse, a.qkv, B, T, heads, stream);  // [cp ring or Ulysses]
    matmul_forward(s.projection, a.atty, p.attprojw, tp_row_parallel_bias(tp, p.attprojb), N, attention, C, stream);
    const floatX* attention_branch = tp_leave(tp, s.projection, N, C, stream);
    fused_residual_norm_forward(c, a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, a.input, attention_branch, p.ln2w,
                                p.ln2b, R, stream);
    // + fcproj(act(fc(norm2(.)))): fc column-parallel (this rank's hidden units), fcproj row-parallel; in a
    // mixture of experts that is the shared experts' (if any), and the routed experts' weighted sum is added
    const floatX* ln2 = tp_enter(tp, a.ln2, s.gathered, N, C, stream);
    if (hidden > 0) {
        matmul_forward(a.fch, ln2, p.fcw, p.fcb, N, C, fc, stream);
        activation_forward(c, a.fch_gelu, a.fch, N, hidden, stream);
        matmul_forward(s.projection, a.fch_gelu, p.fcprojw, tp_row_parallel_bias(tp, p.fcprojb), N, hidden, C, stream);
    }
    if (c.moe()) moe_add_routed_output(moe_pass(model, par, layer, a, B, T), p, s.projection, /*shared=*/hidden > 0, ln2);
    const floatX* mlp_branch = tp_leave(tp, s.projection, N, C, stream);
    residual_forward(a.output, a.residual2, mlp_branch, (size_t)R * C, stream);
}

// Selective recomputation (llmc/parallel/recompute.h): the norm and activation outputs block_backward needs,
// which the layer did not keep, computed again from what it kept: the same kernels on the same inputs, so
// the same bits (the statistics are written again with the values they had).
inline void block_recompute_selective(GPT2& model, const TensorParallel& tp, const ExpertParallel& ep, int layer,
                                      const BlockParams& p, const BlockActivations& a, int B, int T) {
    const GPT2Config c = model.config.block(layer);
    cudaStream_t stream = model.stream;
    const int N = B * T, R = tp_rows(tp, N), hidden = c.hidden() / tp.size;
    norm_forward(c, a.ln1, a.ln1_mean, a.ln1_rstd, a.input, p.ln1w, p.ln1b, R, stream);
    norm_forward(c, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, R, stream);
    if (hidden > 0) activation_forward(c, a.fch_gelu, a.fch, N, hidden, stream);
    if (c.moe()) moe_recompute_selective(model, ep, a);
}

// The backward pass in two halves (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"). Every matmul
// Y = X W^T + b of the block has an input gradient dX = dY W, which the layer below needs next, and weight
// gradients dW += dY^T X, db += the column sums of dY, which nothing in the backward pass needs. So the
// backward pass of a microbatch can be cut in two: B, the input gradients all the way down (what the previous
// pipeline stage waits for), and W, the weight gradients, run later where the pipeline would otherwise idle.
// W needs, per matmul, X and dY: B keeps them in a weight-gradient record (BlockWeightRecord, llmc/model/gpt2.cuh).
// A layernorm's weight and bias gradients come out of the same kernel as its input gradient (dweight +=
// sum dout * norm, dbias += sum dout), so B computes them, into the record, and W adds them to the chunk.
// B touches no gradient of the block's chunk: under ZeRO-2 and 3 the chunks share working buffers by parity
// (llmc/parallel/zero.h), and a chunk's buffer is handed out and reduced within one W.
//
// Same numbers as the fused pass: the kept X and dY are copies of what the fused pass reads, and
// matmul_backward_weights adds dY^T X onto the old gradient the same way; a layernorm gradient is summed
// from 0 in B and the sum added in W, where the fused pass adds the same sum to the gradient: the same fp32
// addition, so the same bits in FP32 (in BF16 the sum is rounded to bf16 once more before it is added).
// Under tensor parallelism f's backward sum (tp_enter_backward) has no weight matmul beside it in B; the
// copies into the record take its place.

// Where one block's backward pass puts what it computes besides the gradient of the block's input. The whole
// pass adds each matmul's weight gradients and the norms' into the block's chunk at once, and works in the
// shared buffers, which the next block reuses. B adds nothing to the chunk: it works in its weight-gradient
// record, so that W's operands are gathered or computed where W reads them (the others are copied there), and
// sums the norms' gradients there, from 0.
struct BlockBackwardTargets {
    BlockParams gradients;       // the whole pass: the chunk's parameter gradients (B: none)
    BlockWeightRecord operands;  // where the weight gradients' operands are gathered (under SP) or computed:
                                 // the shared buffers (the whole pass), or B's record, which W reads
    floatX* dln1w;               // the norms' weight and bias gradients: the chunk's, or (B) the record's
    floatX* dln1b;
    floatX* dln2w;
    floatX* dln2b;
    bool weights_later;          // B: each matmul's operands are kept in `operands`, not multiplied now
};

// Block `layer`'s parameters for its backward pass; where the block was recomputed selectively the outputs it did
// not keep are computed first.
inline BlockParams block_parameters_for_backward(GPT2& model, ParallelContext& par, int layer,
                                                 const BlockActivations& a, int B, int T) {
    const BlockParams p = block_parameters(model, par, layer);
    if (a.keep == BlockKeep::Selective)
        block_recompute_selective(model, par.tp, par.ep, layer, p, a, B, T);
    return p;
}

// The block's steps backwards, the forward pass's in reverse order, for both the whole pass and B: a.dresidual,
// the gradient of the block's output, becomes the gradient of its input (this rank's R rows); what else the
// steps compute goes where t says.
inline void block_backward_steps(GPT2& model, ParallelContext& par, int layer, const BlockParams& p,
                                 const BlockActivations& a, int B, int T, const BlockBackwardTargets& t) {
    const GPT2Config c = model.config.block(layer);
    const TensorParallel& tp = par.tp;
    SharedBuffers& s = model.shared;
    cudaStream_t stream = model.stream;
    const BlockParams& g = t.gradients;
    const BlockWeightRecord& at = t.operands;
    const int N = B * T, C = c.channels, R = tp_rows(tp, N);
    const int attention = C / tp.size, qkv = c.qkv_channels() / tp.size;
    const int hidden = c.hidden() / tp.size, fc = c.fc_channels() / tp.size;
    // output = residual2 + fcproj(act(fc(ln2))): dresidual is the gradient of both terms
    const floatX* dmlp = tp_leave_backward(tp, a.dresidual, at.dmlp, N, C, stream);
    // a mixture of experts: the routed experts' and the router's share of ln2's gradient on this tp rank's
    // sequences, into dchannels, before ln2 is gathered again where dmlp may be (under SP this rank's sequences
    // are its own rows of ln2); (B) their weight gradients' operands kept
    if (c.moe())
        moe_backward(moe_pass(model, par, layer, a, B, T), p, g, s.dchannels, dmlp, t.weights_later ? &at : nullptr);
    floatX* dactivation = c.llama() ? s.dactivation : at.dhidden;  // GELU's backward runs in place
    if (hidden > 0) {
        matmul_backward_input(dactivation, dmlp, p.fcprojw, N, hidden, C, stream);
        weight_gradient_now_or_kept(t.weights_later, g.fcprojw, g.fcprojb, s.matmul_scratch, dmlp, at.dmlp,
                                    a.fch_gelu, at.fch_gelu, N, hidden, C, stream);
        activation_backward(c, at.dhidden, a.fch, dactivation, N, hidden, stream);
    }
    const floatX* ln2 = tp_enter(tp, a.ln2, at.ln2, N, C, stream);  // gathered again under SP
    if (hidden > 0 && c.moe()) {  // the shared experts' share added to the routed one
        matmul_backward_input(s.routed_output, at.dhidden, p.fcw, N, C, fc, stream);
        residual_forward(s.dchannels, s.dchannels, s.routed_output, (size_t)N * C, stream);
    } else if (hidden > 0) {
        matmul_backward_input(s.dchannels, at.dhidden, p.fcw, N, C, fc, stream);
    }
    const floatX* dln2 = tp_enter_backward(tp, s.dchannels, N, C, stream);  // summed beside the next line
    if (hidden > 0)
        weight_gradient_now_or_kept(t.weights_later, g.fcw, g.fcb, s.matmul_scratch, at.dhidden, at.dhidden, ln2,
                                    at.ln2, N, C, fc, stream);
    tp_join(tp, stream);
    norm_backward(c, a.dresidual, t.dln2w, t.dln2b, s.layernorm_scratch, dln2, a.residual2, p.ln2w, a.ln2_mean,
                  a.ln2_rstd, R, stream);
    // residual2 = input + attproj(attention(qkv(ln1))): dresidual is now the gradient of residual2
    const floatX* dattention = tp_leave_backward(tp, a.dresidual, at.dattention, N, C, stream);
    matmul_backward_input(s.dchannels, dattention, p.attprojw, N, attention, C, stream);
    weight_gradient_now_or_kept(t.weights_later, g.attprojw, g.attprojb, s.matmul_scratch, dattention, at.dattention,
                                a.atty, at.atty, N, attention, C, stream);
    cp_attention_backward(par.cp, at.dqkv, s.attention_D, s.dchannels, a.qkv, a.atty, a.lse, B, T,
                          rank_attention_heads(c, tp), stream);  // [cp ring or Ulysses]
    positions_in_attention(model, par, at.dqkv, B, T, /*backward=*/true, stream);
    const floatX* ln1 = tp_enter(tp, a.ln1, at.ln1, N, C, stream);  // gathered again under SP
    matmul_backward_input(s.dchannels, at.dqkv, p.qkvw, N, C, qkv, stream);
    const floatX* dln1 = tp_enter_backward(tp, s.dchannels, N, C, stream);  // summed beside the next line
    weight_gradient_now_or_kept(t.weights_later, g.qkvw, g.qkvb, s.matmul_scratch, at.dqkv, at.dqkv, ln1, at.ln1, N,
                                C, qkv, stream);
    tp_join(tp, stream);
    norm_backward(c, a.dresidual, t.dln1w, t.dln1b, s.layernorm_scratch, dln1, a.input, p.ln1w, a.ln1_mean,
                  a.ln1_rstd, R, stream);
}

// The whole backward pass of block `layer`: a.dresidual, the gradient of the block's output, becomes the
// gradient of its input (this rank's R rows), and the block's parameter gradients accumulate in its chunk.
inline void block_backward(GPT2& model, ParallelContext& par, int layer, const BlockActivations& a, int B, int T) {
    const BlockParams p = block_parameters_for_backward(model, par, layer, a, B, T);
    const BlockParams g = block_gradients(model, par, layer);
    const SharedBuffers& s = model.shared;
    BlockWeightRecord shared{};  // the operands W would read, in the shared buffers
    shared.ln1 = shared.dattention = shared.ln2 = shared.dmlp = s.gathered;  // gathered under SP
    shared.dqkv = s.dqkv;
    shared.dhidden = s.dhidden;
    const BlockBackwardTargets into_chunk{g, shared, g.ln1w, g.ln1b, g.ln2w, g.ln2b, /*weights_later=*/false};
    block_backward_steps(model, par, layer, p, a, B, T, into_chunk);
}

// B: the same steps with the block's chunk untouched: a.dresidual becomes the gradient of the block's input, and
// the weight gradients' operands and this microbatch's norm gradients are kept in w, for block_weight_gradients.
inline void block_input_gradients(GPT2& model, ParallelContext& par, int layer, const BlockActivations& a, int B,
                                  int T, const BlockWeightRecord& w) {
    const BlockParams p = block_parameters_for_backward(model, par, layer, a, B, T);
    const int C = model.config.channels;
    cudaCheck(cudaMemsetAsync(w.dlayernorm, 0, (size_t)4 * C * sizeof(floatX), model.stream));
    const BlockBackwardTargets into_record{BlockParams{}, w, w.dlayernorm, w.dlayernorm + C, w.dlayernorm + 2 * C,
                                           w.dlayernorm + 3 * C, /*weights_later=*/true};
    block_backward_steps(model, par, layer, p, a, B, T, into_record);
}

// W: block `layer`'s parameter gradients from what its B kept in w: the four matmuls' dW += dY^T X and
// db += sum dY (last matmul first, as the fused pass computes them), then this microbatch's layernorm
// gradients added. The block's chunk gradient is asked for here, and only here.
inline void block_weight_gradients(GPT2& model, ParallelContext& par, int layer, const BlockWeightRecord& w, int B,
                                   int T) {
    const GPT2Config c = model.config.block(layer);
    const int N = B * T, C = c.channels;
    const int attention = C / par.tp.size, qkv = c.qkv_channels() / par.tp.size;
    const int hidden = c.hidden() / par.tp.size, fc = c.fc_channels() / par.tp.size;
    float* scratch = model.shared.matmul_scratch;
    cudaStream_t stream = model.stream;
    const BlockParams g = block_gradients(model, par, layer);
    if (c.moe()) {  // the routed experts and the router, on this tp rank's sequences
        const MoERows rows = moe_rows(par.tp, B, T, C);
        if (rows.sequences > 0) moe_weight_gradients(model, par.ep, g, w, rows.sequences, T);
    }
    if (hidden > 0) {  // (a mixture of experts without shared experts has no fc and fcproj)
        matmul_backward_weights(g.fcprojw, g.fcprojb, scratch, w.dmlp, w.fch_gelu, N, hidden, C, stream);
        matmul_backward_weights(g.fcw, g.fcb, scratch, w.dhidden, w.ln2, N, C, fc, stream);
    }
    matmul_backward_weights(g.attprojw, g.attprojb, scratch, w.dattention, w.atty, N, attention, C, stream);
    matmul_backward_weights(g.qkvw, g.qkvb, scratch, w.dqkv, w.ln1, N, C, qkv, stream);
    residual_forward(g.ln2w, g.ln2w, w.dlayernorm + 2 * C, C, stream);
    if (g.ln2b) residual_forward(g.ln2b, g.ln2b, w.dlayernorm + 3 * C, C, stream);
    residual_forward(g.ln1w, g.ln1w, w.dlayernorm, C, stream);
    if (g.ln1b) residual_forward(g.ln1b, g.ln1b, w.dlayernorm + C, C, stream);
}

// ----------------------------------------------------------------------------
// the pieces of a step
//
// A step of the model, in the pieces pipeline parallelism runs on different ranks (llmc/parallel/pipeline.h),
// each for one microbatch of B sequences of T tokens and one stage record:
//   first stage   gpt2_embed                    token ids -> record.input
//   every stage   gpt2_stage_forward            record.input -> the stage's blocks -> record.output()
//   last stage    gpt2_head_forward, gpt2_loss  -> a head record's logits -> loss, the logits replaced by dlogits
//                 gpt2_head_backward            -> record.doutput, the gradient of the last block's output
//   every stage   gpt2_stage_backward           record.doutput -> the gradient of record.input, in place
//                 gpt2_stage_weights            schedules that split the backward pass: its B above kept the
//                 (last stage: gpt2_head_weights) weight gradients' operands, this W computes them later
//   first stage   gpt2_embed_backward           -> the embeddings' gradients
// Where the backward pass is whole, the head's runs right after the loss, in the forward part of the step: the
// logits are used at once, one head record serves every microbatch, and a stage record in flight keeps only
// doutput (R x C), not the logits (N x Vp). Where it is split, the head's is split too, so that the last stage's
// F, B and W each carry a third of the head as they carry a third of each block: its record (N x Vp) then
// lives from the microbatch's F to its W. gpt2_forward and gpt2_backward put the pieces together for one rank
// that holds every layer.

// Checks a batch's token ids before they index any table.
inline void check_token_ids(const int* tokens, size_t count, int vocab_size, const char* what) {
    for (size_t i = 0; i < count; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab_size)
            fatal("%s: token id %d at position %zu is outside the vocabulary [0, %d)", what, tokens[i], i, vocab_size);
}

// First stage: x = wte[tokens] + wpe[positions] (Llama: wte[tokens]) into record.input (tokens: host ids).
inline void gpt2_embed(GPT2& model, ParallelContext& par, StageActivations& record, const int* tokens, int B, int T) {
    const GPT2Config& c = model.config;
    const TensorParallel& tp = par.tp;
    const int N = B * T, C = c.channels;
    if (B > model.max_batch || T > model.max_seq)
        fatal("batch %d x %d exceeds the allocated %d x %d", B, T, model.max_batch, model.max_seq);
    if (tp.sequence_parallel && N % tp.size != 0)
        fatal("sequence parallelism: %d x %d rows do not split over tp %d", B, T, tp.size);
    check_token_ids(tokens, N, c.vocab_size, "input batch");
    record.tokens.assign(tokens, tokens + N);
    staged_upload(model.inputs_upload, model.inputs, tokens, N, model.stream);
    floatX* embeddings = zero_parameters_of(par.zero, model, 0);  // wte (this rank's rows under tp), then wpe
    const floatX* wpe = tensor_in_chunk(embeddings, model.layout, WPE);  // null: Llama, no position table
    // the positions of the rows: one chunk of all T without context parallelism (llmc/parallel/context_parallel.h)
    const std::vector<SequenceChunk> chunks = row_positions(model, par, B, T);
    if (tp.size > 1) {  // all rows at once: under SP a tp slice of the rows may cut across the chunks
        vocab_parallel_embedding_forward(tp, record.input, model.shared.projection, model.inputs, embeddings, wpe,
                                         chunks, B, T, C, c.padded_vocab_size, model.stream);
        return;
    }
    for (const SequenceChunk& chunk : chunks)
        encoder_forward(record.input + (size_t)chunk.first_row * C, model.inputs + chunk.first_row, embeddings,
                        wpe ? wpe + (size_t)chunk.position * C : nullptr, B, chunk.T, C, model.stream);
}

// A stage of `layers` blocks runs on a record sized for the rank's longest stage (model.stage_layers).
inline void check_stage_layers(const GPT2& model, int layers) {
    if (layers < 1 || layers > model.stage_layers)
        fatal("a stage of %d layer(s) on records sized for at most %d", layers, model.stage_layers);
}

// The blocks first_layer .. first_layer + layers - 1 on record.input; the last one's output is record.output().
// An offloaded block runs in its staging record, once that is free, and its record is then copied to the host
// (llmc/model/activation_offload.cuh), unless no backward pass follows (validation, sampling: `for_backward` false).
inline void gpt2_stage_forward(GPT2& model, ParallelContext& par, StageActivations& record, int first_layer,
                               int layers, int B, int T, bool for_backward = true) {
    check_stage_layers(model, layers);
    for (int i = 0; i < layers; i++) {
        const BlockActivations a = stage_block(record, i, layers);
        if (a.keep == BlockKeep::Offload) activation_offload_wait(model.offload, i, model.stream);
        block_forward(model, par, first_layer + i, a, B, T);
        if (a.keep == BlockKeep::Offload && for_backward)
            activation_offload_copy_out(model.offload, i, record.offloaded[i], model.stream);
    }
}

// The LM head's weights (Vp x C, this rank's Vp/tp rows under tp): wte for GPT-2, lmhead in the final chunk for
// Llama; `chunk_of_head` gets a chunk's parameters or gradients.
template <class ChunkBuffer>
inline floatX* lm_head_in(const GPT2& model, ChunkBuffer&& chunk_of_head) {
    if (model.config.tied_head()) return chunk_of_head(0);
    return tensor_in_chunk(chunk_of_head(model.layout.num_chunks() - 1), model.layout, LMHEAD);
}

// Last stage: the final norm of the stage's output, then the logits (head.logits: N x Vp, or this rank's Vp/tp
// columns under tensor parallelism).
inline void gpt2_head_forward(GPT2& model, ParallelContext& par, const StageActivations& record, HeadRecord& head,
                              int B, int T) {
    const GPT2Config& c = model.config;
    const int N = B * T, C = c.channels, final_chunk = model.layout.num_chunks() - 1;
    floatX* final_norm = zero_parameters_of(par.zero, model, final_chunk);  // lnfw, then lnfb (GPT-2)
    norm_forward(c, head.lnf, head.lnf_mean, head.lnf_rstd, record.output(), final_norm,
                 tensor_in_chunk(final_norm, model.layout, LNFB), tp_rows(par.tp, N), model.stream);
    // the LM head: column-parallel over the vocabulary (its rows), so f comes before it
    const floatX* lnf = tp_enter(par.tp, head.lnf, model.shared.gathered, N, C, model.stream);
    const floatX* lm_head = lm_head_in(model, [&](int chunk) { return zero_parameters_of(par.zero, model, chunk); });
    matmul_forward(head.logits, lnf, lm_head, nullptr, N, C, c.padded_vocab_size / par.tp.size, model.stream);
}

// Cross-entropy of head.logits against `targets` (host ids). Adds the mean loss over the N positions to
// model.loss_sum on the device (gpt2_mean_loss, then gpt2_read_results, bring it to the host). Replaces
// the logits by dloss * dloss_i/dlogits, ready for gpt2_head_backward: dloss = 1 / (N * micro-steps) makes the
// accumulated gradient that of the mean loss over the whole batch.
inline void gpt2_loss(GPT2& model, ParallelContext& par, HeadRecord& head, const int* targets, int B, int T,
                      float dloss) {
    const GPT2Config& c = model.config;
    const int N = B * T;
    check_token_ids(targets, N, c.vocab_size, "target batch");
    staged_upload(model.targets_upload, model.targets, targets, N, model.stream);
    if (par.tp.size == 1) {
        fused_classifier(head.logits, model.losses, dloss, model.targets, N, c.vocab_size, c.padded_vocab_size,
                         model.stream);
    } else {
        vocab_parallel_cross_entropy(par.tp, head.logits, model.losses, model.shared.softmax_stats, dloss,
                                     model.targets, N, c.vocab_size, c.padded_vocab_size, model.stream);
    }
    accumulate_mean_loss(model.loss_sum, model.losses, N, model.stream);
}

// logits = lnf @ head^T: the LM head's weight gradient, dhead += dlogits^T lnf (GPT-2: its share of dwte), lnf
// as the head read it (`lnf`: gathered from the tp ranks under sequence parallelism).
inline void head_weight_gradient(GPT2& model, ParallelContext& par, const HeadRecord& head, const floatX* lnf,
                                 int N) {
    const GPT2Config& c = model.config;
    floatX* head_grads = lm_head_in(model, [&](int chunk) { return zero_gradients_of(par.zero, model, chunk); });
    matmul_backward_weights(head_grads, nullptr, model.shared.matmul_scratch, head.logits, lnf, N, c.channels,
                            c.padded_vocab_size / par.tp.size, model.stream);
}

// Last stage, after gpt2_loss: the loss's gradient through the LM head and the final norm into record.doutput,
// and the head's weight gradient (GPT-2: its share of dwte), unless `weights_later` (a split backward:
// gpt2_head_weights adds it in the stage's W). The final chunk's gradient is then complete for this
// microbatch, unless it holds an untied head whose gradient comes in W.
inline void gpt2_head_backward(GPT2& model, ParallelContext& par, StageActivations& record, const HeadRecord& head,
                               int B, int T, bool weights_later = false) {
    const GPT2Config& c = model.config;
    const TensorParallel& tp = par.tp;
    const int N = B * T, C = c.channels, R = tp_rows(tp, N), final_chunk = model.layout.num_chunks() - 1;
    SharedBuffers& s = model.shared;
    // the gradient of lnf (f's backward sums the tp ranks' shares of it); lnf gathered first, as no tp
    // collective may start while that sum runs
    const floatX* lnf = weights_later ? nullptr : tp_enter(tp, head.lnf, s.gathered, N, C, model.stream);
    const floatX* lm_head = lm_head_in(model, [&](int chunk) { return zero_parameters_of(par.zero, model, chunk); });
    matmul_backward_input(s.dchannels, head.logits, lm_head, N, C, c.padded_vocab_size / tp.size, model.stream);
    const floatX* dlnf = tp_enter_backward(tp, s.dchannels, N, C, model.stream);  // summed beside the next line
    if (!weights_later) head_weight_gradient(model, par, head, lnf, N);
    tp_join(tp, model.stream);
    // lnf = norm(x_L): the residual stream's gradient starts here
    floatX* final_grads = zero_gradients_of(par.zero, model, final_chunk);  // lnfw, then lnfb (GPT-2)
    cudaCheck(cudaMemsetAsync(record.doutput, 0, (size_t)R * C * sizeof(floatX), model.stream));
    norm_backward(c, record.doutput, final_grads, tensor_in_chunk(final_grads, model.layout, LNFB),
                  s.layernorm_scratch, dlnf, record.output(), zero_parameters_of(par.zero, model, final_chunk),
                  head.lnf_mean, head.lnf_rstd, R, model.stream);
    if (!weights_later || c.tied_head()) chunk_gradient_done(model, par, final_chunk);
}

// W of the last stage under a split backward: the head's weight gradient (GPT-2: its share of dwte), from the
// record its F and the loss filled and its B left as it was. An untied head's chunk is then done.
inline void gpt2_head_weights(GPT2& model, ParallelContext& par, const HeadRecord& head, int B, int T) {
    const int N = B * T;
    head_weight_gradient(model, par, head, tp_enter(par.tp, head.lnf, model.shared.gathered, N,
                                                    model.config.channels, model.stream), N);
    if (!model.config.tied_head()) chunk_gradient_done(model, par, model.layout.num_chunks() - 1);
}

// The stage's blocks backwards: record.doutput, the gradient of the stage's output, becomes the gradient of
// its input. Last block first, in segments (llmc/parallel/recompute.h): under full recomputation a segment's
// forward passes run again from its checkpoint (the output kept before it, or the stage's input) to refill the
// shared records; otherwise a segment is a block (under selective, its backward pass recomputes its layernorm and
// GELU outputs first). A stage shorter than the records segments its own layers: a segment of at most
// min(C, layers) consecutive blocks uses as many distinct shared records, and its checkpoint is kept. Per block,
// a full block's forward pass runs again from its input first, and an offloaded block's record comes back from
// the host one block ahead: block i-1's is fetched while block i's backward pass runs, the last block's at
// the start (llmc/model/activation_offload.cuh).
// Without `w` each block's parameter gradients accumulate and its chunk's gradient is then done; with `w`
// this is B only, and gpt2_stage_weights later does the rest from w.
inline void gpt2_stage_backward(GPT2& model, ParallelContext& par, StageActivations& record, int first_layer,
                                int layers, int B, int T, StageWeightRecord* w = nullptr) {
    check_stage_layers(model, layers);
    const Recompute& recompute = par.layout.recompute;
    const int segment = recompute_segment(recompute, layers);
    auto fetch = [&](int i) {
        if (i >= 0 && record.blocks[i].keep == BlockKeep::Offload)
            activation_offload_fetch(model.offload, i, record.offloaded[i]);
    };
    fetch(layers - 1);
    for (int start = (layers - 1) / segment * segment; start >= 0; start -= segment) {
        const int end = std::min(start + segment, layers);
        if (recompute.policy == RecomputePolicy::Full)
            for (int i = start; i < end; i++)
                block_forward(model, par, first_layer + i, stage_block(record, i, layers), B, T);
        for (int i = end - 1; i >= start; i--) {
            const BlockActivations a = stage_block(record, i, layers);
            fetch(i - 1);
            if (recompute.policy == RecomputePolicy::PerBlock && a.keep == BlockKeep::Full)
                block_forward(model, par, first_layer + i, a, B, T);
            if (a.keep == BlockKeep::Offload) activation_offload_wait(model.offload, i, model.stream);
            if (w) {
                block_input_gradients(model, par, first_layer + i, a, B, T, w->blocks[i]);
            } else {
                block_backward(model, par, first_layer + i, a, B, T);
                chunk_gradient_done(model, par, first_layer + i + 1);
            }
            if (a.keep == BlockKeep::Offload) activation_offload_release(model.offload, i, model.stream);
        }
    }
}

// W for a stage whose B (gpt2_stage_backward with w) has run: each block's weight gradients from w, in the
// fused pass's order (last block first), each block's chunk then done.
inline void gpt2_stage_weights(GPT2& model, ParallelContext& par, StageWeightRecord& w, int first_layer, int layers,
                               int B, int T) {
    check_stage_layers(model, layers);
    for (int i = layers - 1; i >= 0; i--) {
        block_weight_gradients(model, par, first_layer + i, w.blocks[i], B, T);
        chunk_gradient_done(model, par, first_layer + i + 1);
    }
}

// First stage: the embeddings' gradients from record.doutput (the gradient of block 0's input). Whether
// the embedding chunk is then done depends on the LM head's share, so the caller says when it is.
inline void gpt2_embed_backward(GPT2& model, ParallelContext& par, const StageActivations& record, int B, int T) {
    const GPT2Config& c = model.config;
    const int C = c.channels;
    SharedBuffers& s = model.shared;
    floatX* embedding_grads = zero_gradients_of(par.zero, model, 0);  // wte, then wpe
    floatX* dwpe = tensor_in_chunk(embedding_grads, model.layout, WPE);  // null: Llama
    const std::vector<SequenceChunk> chunks = row_positions(model, par, B, T);
    if (par.tp.size > 1) {  // every row's gradient first (gathered under SP), then chunk by chunk
        vocab_parallel_embedding_backward(par.tp, embedding_grads, dwpe, &s.encoder_workspace, record.doutput,
                                          s.gathered, record.tokens.data(), chunks, B, T, C, c.padded_vocab_size,
                                          model.stream);
        return;
    }
    for (const SequenceChunk& chunk : chunks)
        encoder_backward(embedding_grads, dwpe ? dwpe + (size_t)chunk.position * C : nullptr, &s.encoder_workspace,
                         record.doutput + (size_t)chunk.first_row * C, record.tokens.data() + chunk.first_row, B,
                         chunk.T, C, model.stream);
}

// ----------------------------------------------------------------------------
// one rank that holds every layer (no pipeline): the pieces in order, on stage record 0

// Forward pass of B sequences of T tokens (host ids) up to the logits.
inline void gpt2_forward(GPT2& model, ParallelContext& par, const int* inputs, int B, int T) {
    const int L = model.config.num_layers;
    if (!model.first_stage || !model.last_stage || model.stage_layers != L)
        fatal("gpt2_forward needs every layer on this rank, in one stage");
    StageActivations& record = model.records[0];
    gpt2_embed(model, par, record, inputs, B, T);
    gpt2_stage_forward(model, par, record, 0, L, B, T);
    gpt2_head_forward(model, par, record, model.heads[0], B, T);
}

// Backward pass after gpt2_forward + gpt2_loss on the same batch; gradients accumulate (+=). With a
// weight-gradient record the head's and the blocks' backward passes run as B, then W: the same gradients.
inline void gpt2_backward(GPT2& model, ParallelContext& par, int B, int T, StageWeightRecord* w = nullptr) {
    const int L = model.config.num_layers;
    StageActivations& record = model.records[0];
    gpt2_head_backward(model, par, record, model.heads[0], B, T, /*weights_later=*/w != nullptr);
    gpt2_stage_backward(model, par, record, 0, L, B, T, w);
    if (w) {
        gpt2_head_weights(model, par, model.heads[0], B, T);
        gpt2_stage_weights(model, par, *w, 0, L, B, T);
    }
    gpt2_embed_backward(model, par, record, B, T);
    chunk_gradient_done(model, par, 0);
}
