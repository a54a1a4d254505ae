/*
Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) and sequence parallelism (Korthikanti et al. 2022):
the tp ranks of a group split every block's matmuls between them and work on the same tokens.

A block's two matmul pairs are split so that each pair needs one collective per pass:
    column-parallel  Y_r = X W_r^T            W_r: rank r's slice of the OUTPUT features (rows of W). Every
                                              rank needs all of X; each gets a slice of Y's columns.
                     qkv: rank r owns heads [r NH/tp, (r+1) NH/tp) of q, k and v, so attention runs on its
                     own heads with no communication; fc: rank r owns 4C/tp hidden units, and GELU acts on
                     each unit alone.
    row-parallel     Z = sum_r Y_r W'_r^T     W'_r: rank r's slice of the INPUT features (columns of W'),
                                              matching the slice of Y it holds. Each rank computes a full
                                              sized partial product; their SUM is the output.
                     attproj after attention, fcproj after GELU; the bias is added once (by rank 0).
The two conjugate operators around them (Megatron's f and g) are the only places the block talks:
    f = tp_enter  before a column-parallel matmul:  forward identity      backward all-reduce (sum) of dX
    g = tp_leave  after a row-parallel matmul:      forward all-reduce    backward identity
(the backward of "every rank uses X" is "add up every rank's dX"; the backward of a sum is a copy). So a
block sends two all-reduces of N x C forward (g twice) and two backward (f twice), N = B*T rows. f's
backward sum runs on a stream of its own while the compute stream computes the same matmul's weight
gradients, which do not need it (Megatron's overlap); tp_join waits for it before the layernorm needs it.

Sequence parallelism. Between f and g the ranks hold replicated N x C activations (the layernorms, the
residual stream, dropout in other models), computed tp times over. SP cuts those rows into tp slices:
rank r keeps rows [r N/tp, (r+1) N/tp) of the (B*T) token rows (with T divisible by tp, a whole number of
positions per rank and sequence on average; exactly T/tp for B = 1). Then
    f forward   all-gather the N/tp-row slices into N rows          backward  reduce-scatter dX into slices
    g forward   reduce-scatter the partial sums into N/tp rows      backward  all-gather dZ
An all-reduce IS a reduce-scatter then an all-gather, so SP sends the same bytes for f and g but stores
1/tp of the layernorm inputs and outputs and the residual stream. Like Megatron, the backward pass
gathers a layernorm's output again for the weight gradient instead of keeping the gathered copy: two
more all-gathers per block. The layernorm parameters (and lnf's) then see only their rank's rows: their
gradients are partial sums, added over the tp group before the data-parallel reduction
(tp_sum_partial_gradients). Under context parallelism the N rows are the cp rank's B T/cp (T/cp
divisible by tp), kept in chunks of positions (llmc/parallel/context_parallel.h): a slice may start inside a chunk
or straddle two, which only the embedding's position rows notice.

A mixture of experts (llmc/model/moe.cuh). The router and the experts are not split: every tp rank holds them
whole and routes its own B/tp of the sequences, the rows [r N/tp, (r+1) N/tp) (the rows SP gives it), through
them, adding their outputs to its partial sum before g (the shared experts split like fc); g's sum then
holds every row's routed output once. Their gradients are partial sums over the ranks' sequences, added
over the tp group before the data-parallel reduction, as SP's layernorm gradients are
(tp_sum_partial_gradients). No extra collective runs in the passes.

Vocabulary parallelism. wte is split by rows: rank r owns tokens [r Vp/tp, (r+1) Vp/tp).
    embedding  each rank looks up the tokens it owns and writes 0 for the others; the sum over ranks (an
               all-reduce, or a reduce-scatter into slices under SP) is the embedding; then + wpe
    LM head    logits_r = lnf wte_r^T: a column-parallel matmul (f before it); each rank holds the logits
               of its vocabulary slice, N x Vp/tp, and the full N x Vp logits never exist anywhere
    loss       softmax over a row split across ranks (llmc/kernels/fused_classifier.cuh's vocabulary-parallel
               kernels): local max and sum of exp -> all-reduce MAX of the maxima -> rescale the local sums
               -> all-reduce SUM of the sums and of the target logit (owned by one rank, 0 elsewhere) ->
               every rank has the loss of every row and writes dlogits for its own columns
Every rank computes the same loss for the same rows.

Bytes per rank and micro-step on the tp axis (s = sizeof(floatX), t = tp, L layers, ring collectives as
llmc/parallel/comm.h counts them: an all-reduce of n elements sends 2(t-1)/t n s, a reduce-scatter or all-gather
of an n-element whole (t-1)/t n s):
  without SP   blocks   4 all-reduces of N C per block                   8 L (t-1)/t N C s
               embedding all-reduce of N C; LM head backward's dX      + 4 (t-1)/t N C s
               loss: all-reduce of N fp32 maxima, of 2N fp32 sums      + 2 (t-1)/t 3N 4
  with SP      blocks   forward 2 all-gathers + 2 reduce-scatters,
                        backward 4 all-gathers + 2 reduce-scatters      10 L (t-1)/t N C s
               embedding reduce-scatter, its backward's all-gather,
               LM head f: all-gather forward and backward,
               reduce-scatter of its dX                                + 5 (t-1)/t N C s
               loss (as above)                                         + 2 (t-1)/t 3N 4
               per optimizer step (per micro-step at ZeRO 2-3, which reduces the gradients every
               micro-step): all-reduce of the layernorm gradients       + 2 (t-1)/t (4 C L + 2 C) s
  experts      per optimizer step (per micro-step at ZeRO 2-3): all-reduce of the router's and the experts'
               gradients (E experts of fc and He units: E C (1 + fc + He) per mixture block, Lm = L/N
               of them with a mixture every N blocks; a rank holds E/ep of the experts under expert
               parallelism)                                          + 2 (t-1)/t E C (1 + (fc + He)/ep) Lm s
tp_bytes_per_step below is this formula; the layout test compares it with the bytes counted.
*/
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>
#include "../cuda_common.cuh"
#include "comm.h"
#include "../device_memory.h"
#include "../model/parameters.h"
#include "../kernels/encoder.cuh"
#include "context_parallel.h"
#include "../kernels/fused_classifier.cuh"

// ----------------------------------------------------------------------------
// the group

struct TensorParallel {
    int size = 1;                   // tp: ranks that split every matmul
    int rank = 0;                   // this rank's slice
    bool sequence_parallel = false;
    Communicator* group = nullptr;  // the tp axis of the mesh; null with one rank
    // f backward runs here, beside the weight gradients on the compute stream (tp_streams_create)
    cudaStream_t stream = nullptr;
    cudaEvent_t input_gradient_ready = nullptr, input_gradient_summed = nullptr;
};

// The stream and events of f's backward pass (tp > 1); the model creates them and destroys them.
inline void tp_streams_create(TensorParallel& tp) {
    if (tp.size == 1) return;
    cudaCheck(cudaStreamCreateWithFlags(&tp.stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&tp.input_gradient_ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&tp.input_gradient_summed, cudaEventDisableTiming));
}
inline void tp_streams_destroy(TensorParallel& tp) {
    if (tp.stream == nullptr) return;
    cudaCheck(cudaStreamDestroy(tp.stream));
    cudaCheck(cudaEventDestroy(tp.input_gradient_ready));
    cudaCheck(cudaEventDestroy(tp.input_gradient_summed));
    tp.stream = nullptr;
}

// The one line that says why a model cannot be split over tp ranks ("" when it can). Heads divide (each
// rank runs whole heads; then so do C and GPT-2's 4C hidden units, C being heads x head size), and so do the
// K/V heads: each rank keeps the K/V heads of its query heads' groups. (Megatron also runs tp larger than the
// K/V heads, each K/V head replicated on tp / kv_heads ranks and its gradient summed over them; that is
// refused here.) Llama's hidden units and the padded vocabulary split into slices of a whole number of 16-byte
// vectors (8 bf16) for the SwiGLU and classifier kernels; under SP, so does the sequence.
inline std::string tp_layout_error(const GPT2Config& c, int tp, bool sequence_parallel, int seq_len) {
    char text[256] = "";
    if (tp < 1) {
        snprintf(text, sizeof(text), "--tp %d: the tensor-parallel size must be at least 1", tp);
    } else if (sequence_parallel && tp == 1) {
        snprintf(text, sizeof(text), "--sequence-parallel needs --tp 2 or more (it splits the sequence over the tp "
                 "ranks)");
    } else if (c.num_heads % tp != 0) {
        snprintf(text, sizeof(text), "%d attention heads cannot be split over tp %d: heads must be a multiple of tp",
                 c.num_heads, tp);
    } else if (c.kv_heads % tp != 0) {
        snprintf(text, sizeof(text), "%d K/V heads cannot be split over tp %d: tp must divide the K/V heads "
                 "(replicating K/V heads over ranks is not supported)", c.kv_heads, tp);
    } else if (c.llama() && c.ffn_hidden % (8 * tp) != 0) {
        snprintf(text, sizeof(text), "%d hidden units cannot be split over tp %d: each rank's share must be a "
                 "multiple of 8", c.ffn_hidden, tp);
    } else if (c.padded_vocab_size % (8 * tp) != 0) {
        snprintf(text, sizeof(text), "the padded vocabulary of %d rows cannot be split over tp %d: each rank's slice "
                 "must be a multiple of 8 rows", c.padded_vocab_size, tp);
    } else if (sequence_parallel && seq_len % tp != 0) {
        snprintf(text, sizeof(text), "sequence length %d cannot be split over tp %d for sequence parallelism: it must "
                 "be a multiple of tp", seq_len, tp);
    }
    return text;
}

// Stops with that line if the model cannot be split.
inline void tp_check_layout(const GPT2Config& c, int tp, bool sequence_parallel, int seq_len) {
    const std::string error = tp_layout_error(c, tp, sequence_parallel, seq_len);
    if (!error.empty()) fatal("%s", error.c_str());
}

// Under context parallelism a rank holds T/cp positions of each sequence, and sequence parallelism splits
// those rows: T/cp must divide by tp as T does without cp (checked after the cp split, so T divides by cp).
inline std::string tp_context_parallel_rows_error(int tp, bool sequence_parallel, int seq_len, int cp) {
    char text[256] = "";
    if (sequence_parallel && cp > 1 && (seq_len / cp) % tp != 0)
        snprintf(text, sizeof(text), "--sequence-parallel with --cp %d: the %d positions of a sequence each cp rank "
                 "holds (--seq-len %d / cp) cannot be split over --tp %d: seq-len / cp must be a multiple of tp", cp,
                 seq_len / cp, seq_len, tp);
    return text;
}
inline void tp_check_context_parallel_rows(int tp, bool sequence_parallel, int seq_len, int cp) {
    const std::string error = tp_context_parallel_rows_error(tp, sequence_parallel, seq_len, cp);
    if (!error.empty()) fatal("%s", error.c_str());
}

// rows of the residual stream this rank holds: N, or its N/tp slice under sequence parallelism
inline int tp_rows(const TensorParallel& tp, int N) { return tp.sequence_parallel ? N / tp.size : N; }

// the bias of a row-parallel matmul, added by rank 0 only (the ranks' outputs are summed)
inline const floatX* tp_row_parallel_bias(const TensorParallel& tp, const floatX* bias) {
    return tp.rank == 0 ? bias : nullptr;
}

// ----------------------------------------------------------------------------
// the conjugate operators: f (tp_enter) and g (tp_leave), forward and backward. N = B*T rows of C.

// f forward: the N-row input of a column-parallel matmul. Without SP every rank holds it already; with SP
// the ranks' slices (`mine`, N/tp rows) are gathered into `gathered` (N rows).
inline const floatX* tp_enter(const TensorParallel& tp, const floatX* mine, floatX* gathered, int N, int C,
                              cudaStream_t stream) {
    if (!tp.sequence_parallel) return mine;
    all_gather(*tp.group, gathered, mine, (size_t)tp_rows(tp, N) * C, stream);
    return gathered;
}

// The sum over ranks of their N-row `partial`s, on `stream`; returns this rank's rows of it: all of them
// (all-reduce, in place) or, with SP, its slice (reduce-scatter, in place: the slice's place in `partial`).
inline floatX* tp_sum_partials(const TensorParallel& tp, floatX* partial, int N, int C, cudaStream_t stream) {
    if (tp.size == 1) return partial;
    if (!tp.sequence_parallel) {
        all_reduce(*tp.group, partial, (size_t)N * C, Reduction::Sum, stream);
        return partial;
    }
    const size_t slice = (size_t)tp_rows(tp, N) * C;
    floatX* mine = partial + tp.rank * slice;
    reduce_scatter(*tp.group, mine, partial, slice, Reduction::Sum, stream);
    return mine;
}

// f backward: `partial` (N rows) is this rank's share of dX, just computed on `stream` (the first half of
// the column-parallel matmul's backward pass, matmul_backward_input); returns where this rank's rows of the
// sum will be. The sum runs on the tp stream, so the caller computes the weight gradients meanwhile
// (matmul_backward_weights, which do not touch `partial`) and then calls tp_join before reading the result:
// Megatron's overlap of the input-gradient all-reduce with the weight-gradient matmul.
inline floatX* tp_enter_backward(const TensorParallel& tp, floatX* partial, int N, int C, cudaStream_t stream) {
    if (tp.size == 1) return partial;
    cudaCheck(cudaEventRecord(tp.input_gradient_ready, stream));
    cudaCheck(cudaStreamWaitEvent(tp.stream, tp.input_gradient_ready, 0));
    floatX* mine = tp_sum_partials(tp, partial, N, C, tp.stream);
    cudaCheck(cudaEventRecord(tp.input_gradient_summed, tp.stream));
    return mine;
}
// `stream` waits for the last tp_enter_backward's sum. Until then no other tp collective may be issued:
// the ranks' collectives on the tp group must keep one order.
inline void tp_join(const TensorParallel& tp, cudaStream_t stream) {
    if (tp.size > 1) cudaCheck(cudaStreamWaitEvent(stream, tp.input_gradient_summed, 0));
}

// g forward: `partial` (N rows) is this rank's term of a row-parallel matmul; returns this rank's rows of
// the sum (nothing to overlap with: the next kernel needs it).
inline floatX* tp_leave(const TensorParallel& tp, floatX* partial, int N, int C, cudaStream_t stream) {
    return tp_sum_partials(tp, partial, N, C, stream);
}

// g backward: every rank needs the whole N-row gradient of the sum: its own rows already, or, with SP,
// all-gathered from the slices.
inline const floatX* tp_leave_backward(const TensorParallel& tp, const floatX* mine, floatX* gathered, int N,
                                       int C, cudaStream_t stream) {
    return tp_enter(tp, mine, gathered, N, C, stream);
}

// ----------------------------------------------------------------------------
// vocabulary-parallel embedding and loss

// encoded (this rank's rows) = wte[tokens] + wpe[positions]. tokens: the N = B T ids of the batch's rows
// (device), whose positions `chunks` give (llmc/parallel/context_parallel.h's SequenceChunk: one chunk {0, 0, T} of
// whole sequences, or a context-parallel rank's one or two). `scratch`: N x C, used under SP. The lookup and the sum
// over ranks see all N rows at once, so under SP the reduce-scatter hands this rank its slice of the N rows, the same
// slice the blocks work on; the slice may start or end inside a chunk, or straddle two, so the positions are added
// chunk by chunk on the part of the slice each chunk holds.
inline void vocab_parallel_embedding_forward(const TensorParallel& tp, floatX* encoded, floatX* scratch,
                                             const int* tokens, const floatX* wte_slice, const floatX* wpe,
                                             const std::vector<SequenceChunk>& chunks, int B, int T, int C, int Vp,
                                             cudaStream_t stream) {
    const int N = B * T, rows = tp_rows(tp, N), vocab_rows = Vp / tp.size;
    floatX* lookups = tp.sequence_parallel ? scratch : encoded;
    embedding_lookup_forward(lookups, tokens, wte_slice, tp.rank * vocab_rows, vocab_rows, N, C, stream);
    floatX* mine = tp_leave(tp, lookups, N, C, stream);  // the sum over ranks: each token's row comes from one
    if (mine != encoded)
        cudaCheck(cudaMemcpyAsync(encoded, mine, (size_t)rows * C * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    if (wpe == nullptr) return;  // no position table (Llama: RoPE)
    const int first_row = tp.sequence_parallel ? tp.rank * rows : 0;  // encoded holds [first_row, first_row + rows)
    for (const SequenceChunk& chunk : chunks) {
        const int begin = std::max(first_row, chunk.first_row);
        const int end = std::min(first_row + rows, chunk.first_row + B * chunk.T);
        if (begin >= end) continue;
        // row begin is row begin - chunk.first_row of the chunk, an ordinary (B, chunk.T) batch at chunk.position
        position_embedding_forward(encoded + (size_t)(begin - first_row) * C, wpe + (size_t)chunk.position * C,
                                   begin - chunk.first_row, end - begin, chunk.T, C, stream);
    }
}

// dwte (this rank's slice) and dwpe += the gradient of the encoder output (this rank's rows: `dencoded`),
// tokens_host and chunks as the forward pass had them. Every rank needs every row's gradient (gathered under
// SP), then each chunk's rows go to their own positions of dwpe.
inline void vocab_parallel_embedding_backward(const TensorParallel& tp, floatX* dwte_slice, floatX* dwpe,
                                              EncoderBackwardWorkspace* workspace, const floatX* dencoded,
                                              floatX* gathered, const int* tokens_host,
                                              const std::vector<SequenceChunk>& chunks, int B, int T, int C, int Vp,
                                              cudaStream_t stream) {
    const floatX* dout = tp_leave_backward(tp, dencoded, gathered, B * T, C, stream);  // every row
    const int vocab_rows = Vp / tp.size;
    for (const SequenceChunk& chunk : chunks)
        encoder_backward(dwte_slice, dwpe ? dwpe + (size_t)chunk.position * C : nullptr, workspace,
                         dout + (size_t)chunk.first_row * C,
                         tokens_host + chunk.first_row, B, chunk.T, C, stream, tp.rank * vocab_rows, vocab_rows);
}

// The loss of N rows whose logits are split by columns over the tp ranks (`logits`: N x Vp/tp, replaced
// by dloss * dL/dlogits of this rank's columns). losses: N (every rank the same); stats: 4N floats.
inline void vocab_parallel_cross_entropy(const TensorParallel& tp, floatX* logits, float* losses, float* stats,
                                         float dloss, const int* targets, int N, int V, int Vp, cudaStream_t stream) {
    const int columns = Vp / tp.size, first_column = tp.rank * columns;
    vocab_parallel_softmax_partials(stats, logits, targets, N, first_column, columns, V, stream);
    all_reduce(*tp.group, stats, (size_t)N, Reduction::Max, stream);              // the row maxima
    vocab_parallel_rescale_sums(stats, N, stream);
    all_reduce(*tp.group, stats + N, (size_t)2 * N, Reduction::Sum, stream);      // the sums, the target logits
    vocab_parallel_loss_and_gradient(logits, losses, stats, dloss, targets, N, first_column, columns, V, stream);
}

// Row `row` of the logits, all Vp columns, to the host (`out`: Vp values), from the ranks' column slices
// (`logits`: N x Vp/tp). For sampling, once per token: the row is gathered in comm.h's device room for host
// exchanges, which is made once, so a token allocates nothing.
inline void tp_gather_logits_row(const TensorParallel& tp, floatX* out, const floatX* logits, int row, int Vp,
                                 cudaStream_t stream) {
    const size_t columns = Vp / tp.size;
    if (tp.size == 1) {
        copy_to_host(out, logits + row * columns, columns, stream);
        return;
    }
    floatX* whole = host_exchange_room<floatX>(Vp);
    all_gather(*tp.group, whole, logits + row * columns, columns, stream);
    copy_to_host(out, whole, Vp, stream);
}

// ----------------------------------------------------------------------------
// gradients and parameters of replicated tensors

// The gradients in a chunk's gradient that are each tp rank's share, replaced by their sum over the tp group:
// under SP the layernorms' weights and biases (ln1 and ln2 of a block, lnf), and a mixture of experts' router
// and experts (each rank's sequences). Call once per reduction of the chunk.
inline void tp_sum_partial_gradients(const TensorParallel& tp, floatX* chunk_grads, const ParameterLayout& layout,
                                     int chunk, cudaStream_t stream) {
    if (tp.size == 1) return;
    const size_t start = layout.chunk_start(chunk);
    const bool block = chunk > 0 && chunk < layout.num_chunks() - 1;
    if (block && layout.config.moe_block(chunk - 1)) {  // routerw, expertfcw, expertprojw: adjacent at the end
        const int layer = chunk - 1;
        const size_t first = layout.offset(ROUTERW, layer) - start;
        const size_t count = layout.elements(ROUTERW, layer) + layout.elements(EXPERTFCW, layer) +
                             layout.elements(EXPERTPROJW, layer);
        all_reduce(*tp.group, chunk_grads + first, count, Reduction::Sum, stream);
    }
    if (!tp.sequence_parallel) return;
    auto sum = [&](int weight_kind, int layer) {  // a weight and its bias (if any), adjacent in the chunk
        all_reduce(*tp.group, chunk_grads + (layout.offset(weight_kind, layer) - start),
                   layout.elements(weight_kind, layer) + layout.elements(weight_kind + 1, layer), Reduction::Sum, stream);
    };
    if (chunk == layout.num_chunks() - 1) {
        sum(LNFW, 0);
    } else if (chunk > 0) {
        sum(LN1W, chunk - 1);
        sum(LN2W, chunk - 1);
    }
}

// ----------------------------------------------------------------------------
// the formula for the bytes counted on the tp axis (see the top of the file)

inline double tp_bytes_per_step(const GPT2Config& c, int B, int T, int tp, bool sequence_parallel,
                                int accumulation_steps, int zero_stage, bool bf16, int ep = 1) {
    if (tp == 1) return 0.0;
    const double s = bf16 ? 2 : 4, share = (tp - 1.0) / tp, N = (double)B * T, C = c.channels, L = c.num_layers;
    const double loss = 2 * share * 3 * N * 4;
    double per_micro_step, layernorm_gradients = 0;
    if (!sequence_parallel) {
        per_micro_step = (8 * L + 4) * share * N * C * s + loss;
    } else {
        per_micro_step = (10 * L + 5) * share * N * C * s + loss;
        const double per_norm = c.llama() ? C : 2 * C;  // a weight and a bias (RMSNorm: a weight)
        layernorm_gradients = 2 * share * per_norm * (2 * L + 1) * s * (zero_stage >= 2 ? accumulation_steps : 1);
    }
    const double reductions = zero_stage >= 2 ? accumulation_steps : 1;
    const double expert_gradients = c.moe() ? 2 * share * (double)c.experts * C *
                                                  (1.0 + (double)(c.expert_fc_channels() + c.expert_hidden()) / ep) *
                                                  c.moe_blocks() * s * reductions
                                            : 0.0;
    return per_micro_step * accumulation_steps + layernorm_gradients + expert_gradients;
}
