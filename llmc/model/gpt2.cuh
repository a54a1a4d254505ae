/*
GPT-2: the model's shape, its tensors and activation records, and its files. What it computes, block by
block, is in llmc/model/forward_backward.cuh.

The network, for a batch of B sequences of T tokens (C channels, NH heads, L layers, vocabulary V padded
to Vp rows of the embedding table):
    x      = wte[tokens] + wpe[positions]                              encoder
    for each of the L blocks:                                          block_forward
        x  = x + attproj(attention(qkv(layernorm1(x))))
        x  = x + fcproj(gelu(fc(layernorm2(x))))
    logits = layernormf(x) @ wte^T                                     the LM head shares wte
    loss   = mean cross-entropy of softmax(logits[:, :V]) against the next tokens

Parameters are laid out layer-major (llmc/model/parameters.h): one contiguous chunk per block holding that
block's twelve tensors, plus an embedding chunk (wte, wpe) before them and a final chunk (lnfw, lnfb)
after them. A chunk is the unit that gets sharded, gathered, owned by a pipeline stage or reduced as one
gradient bucket, so "block l's parameters" is always one pointer and one length. llm.c's model files are
tensor-major (each tensor for all layers, then the next tensor); gpt2_read_parameters and gpt2_save
convert. Under tensor parallelism (llmc/parallel/tensor_parallel.h) a rank's chunks hold its slices of the
tensors. Which part of the model a rank holds, and how, is a ModelPart, which its parallel context decides
(llmc/parallel/parallel_context.h's model_part); the model keeps the sizes that follow from it, not the
parallel state itself.

The block is the unit of work: block_forward(l) reads block l-1's output and writes an activation record
for layer l (everything block_backward needs: the layernorm statistics, qkv, the attention output and its
log-sum-exp, the MLP's hidden activations, the block's output); block_backward(l) takes the gradient of
block l's output and turns it into the gradient of its input, accumulating block l's parameter gradients
on the way. A run of consecutive blocks is a stage: all L of them on one rank, or a share of them under
pipeline parallelism (llmc/parallel/pipeline.h; stages may differ in size), where a rank holds only its
stages' chunks (and the embeddings on the first and last stage, the final layernorm on the last). One
microbatch's pass through a stage keeps its layers' records in a stage record (StageActivations), sized for
the rank's longest stage; a rank keeps as many stage records as its pipeline schedule has microbatches in
flight, one without a pipeline. Schedules that split the backward pass into input gradients (B) and weight
gradients (W) keep, between the two, a weight-gradient record (StageWeightRecord) per (microbatch, stage).

Gradients accumulate (+=) across micro-steps until gpt2_zero_grads. In BF16 the parameters, activations
and gradients are bf16.

Streams. Every kernel, copy and memset of the model runs on model.stream, a non-blocking stream: it
does not wait for the legacy stream, so the parallel techniques' streams (llmc/parallel/) can run beside
it, ordered only by events. The host hands the device a whole step and waits for it once
(gpt2_read_results: the loss and the gradient norm in one copy); the token ids of each micro-batch go up
from pinned buffers through asynchronous copies (StagedUpload).

The optimizer, with its fp32 master weights and moments, and the averaging of gradients over
data-parallel ranks are in llmc/parallel/zero.h.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>
#include "../utils.h"
#include "../cuda_common.cuh"
#include "../kernels/encoder.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/attention.cuh"
#include "../kernels/gelu.cuh"
#include "../kernels/rope.cuh"
#include "../kernels/swiglu.cuh"
#include "../kernels/moe_routing.cuh"
#include "../kernels/fused_classifier.cuh"
#include "../kernels/adamw.cuh"
#include "../kernels/global_norm.cuh"
#include "../device_memory.h"
#include "parameters.h"
#include "../parallel/recompute.h"
#include "activation_offload.cuh"

// ----------------------------------------------------------------------------
// activations

// What block_backward needs from block_forward, for one (layer, micro-batch). N = B*T rows. Under tensor
// parallelism (llmc/parallel/tensor_parallel.h) with tp ranks, a rank holds its heads' share of the attention
// (C/tp channels, NH/tp heads) and its 4C/tp hidden units; under sequence parallelism it also holds only
// its R = N/tp rows of the residual stream and the layernorms (else R = N).
struct BlockActivations {
    const floatX* input;  // (R, C)   the block's input: the stage's input or the previous block's output
    floatX* dresidual;    // (R, C)   the residual stream's gradient, which the backward pass carries down the
                          //          stage's blocks (the stage record's doutput)
    floatX* ln1;        // (R, C)   layernorm1 output
    float* ln1_mean;    // (R)
    float* ln1_rstd;    // (R)
    floatX* qkv;        // (N, 3C/tp)
    floatX* atty;       // (N, C/tp)  attention output, before the projection
    float* lse;         // (B, NH/tp, T) attention log-sum-exp
    floatX* residual2;  // (R, C)   x + attention branch
    floatX* ln2;        // (R, C)
    float* ln2_mean;    // (R)
    float* ln2_rstd;    // (R)
    floatX* fch;        // (N, 4C/tp) fc output, before GELU
    floatX* fch_gelu;   // (N, 4C/tp)
    floatX* output;     // (R, C)   the block's output: the next block's input
    // a mixture of experts (llmc/model/moe.cuh), E experts, K per token, M = N K assignments, He hidden units
    // per expert (fch and fch_gelu above: the shared experts')
    float* router_probs;     // (N, E)   softmax of the router's logits
    float* router_lse;       // (N)      their log-sum-exp (the z-loss)
    int* routed_experts;     // (N, K)   each row's experts, best first
    float* routed_weights;   // (N, K)   their renormalised weights
    int* routed_slots;       // (N, K)   each assignment's row among the expert-sorted rows (-1: dropped)
    int* routed_counts;      // (P B, E) assignments of each sequence to each expert, before drops (under cp,
                             //          each of the P pieces of it a rank holds: its whole sequence's)
    // under expert parallelism (ep ranks; llmc/parallel/expert_parallel.h) this rank's experts run the rows of
    // the whole ep group: up to Mr of them (moe_expert_rows: ep M, or fewer under a capacity; M at ep 1)
    int* expert_rows;        // (ep, E)  host: rows each expert runs (kept assignments), per ep rank
    floatX* expert_input;    // (Mr, C)  the rows this rank's experts run, sorted by expert
    floatX* expert_fch;      // (Mr, He or 2He) the experts' fc outputs
    floatX* expert_act;      // (Mr, He) their activations
    floatX* expert_output;   // (M, C)   this rank's rows' expert outputs, before the weighted sum
    BlockKeep keep = BlockKeep::Keep;  // what the forward pass keeps of this block (llmc/parallel/recompute.h);
                                       // an offloaded block's buffers but its output are a staging record's
};

// One microbatch's pass through one pipeline stage of consecutive layers (without pipeline parallelism:
// one stage of all L layers): everything its backward pass needs. A rank keeps a pool of these records
// (model.records), as many as its pipeline schedule has microbatches in flight (llmc/parallel/pipeline.h).
struct StageActivations {
    floatX* input = nullptr;               // (R, C) the stage's input: the embeddings' output on the first
                                           // stage, the previous stage's output (received) on the others
    std::vector<BlockActivations> blocks;  // the stage's layers in order; the last one's output is the
                                           // stage's output
    floatX* doutput = nullptr;             // (R, C) the gradient of the stage's output (received, or from the
                                           // loss on the last stage); the backward pass carries it down the
                                           // residual stream, block by block, and leaves the gradient of
                                           // the stage's input in it
    std::vector<int> tokens;               // first stage: the token ids, for the embeddings' backward pass
    std::vector<std::vector<void*>> offloaded;  // per layer: an offloaded block's record in pinned host memory
                                                // (its staging record's buffers in order; empty: not offloaded)
    // The stage's output, whatever its number of layers: a record is sized for the rank's longest stage, a
    // shorter stage runs on its first blocks and its last block writes here (stage_block), a buffer every
    // recompute policy keeps.
    floatX* output() const { return blocks.back().output; }
};

// Block i of a stage of `layers` blocks run on `record`: the record's block i, except that the stage's last
// block writes the stage's output (record.output()), which stays valid after the pass, wherever the stage ends.
inline BlockActivations stage_block(const StageActivations& record, int i, int layers) {
    BlockActivations a = record.blocks[i];
    if (i == layers - 1) a.output = record.output();
    return a;
}

// What the weight gradients of one block need, kept by the input-gradient half of its backward pass (B) for
// the weight-gradient half (W) that a zero-bubble schedule runs later (llmc/model/forward_backward.cuh,
// block_input_gradients and block_weight_gradients). Each matmul's weight gradient is dW += dY^T X (and db += the
// column sums of dY): its input X exactly as matmul_backward_weights reads it (gathered from the tp ranks under
// sequence parallelism) and its output gradient dY. Copies, not pointers into the activation record: B frees
// the record for the next microbatch, and recomputation's shared buffers are overwritten by the next block.
// The layernorms' weight and bias gradients need the layernorm's input gradient, which B computes anyway:
// B adds them up here instead of into the chunk gradient.
struct BlockWeightRecord {
    floatX* ln1;         // (N, C)     qkv's input
    floatX* dqkv;        // (N, 3C/tp) qkv's output gradient
    floatX* atty;        // (N, C/tp)  attproj's input
    floatX* dattention;  // (N, C)     attproj's output gradient
    floatX* ln2;         // (N, C)     fc's input
    floatX* dhidden;     // (N, 4C/tp) fc's output gradient (through the GELU)
    floatX* fch_gelu;    // (N, 4C/tp) fcproj's input
    floatX* dmlp;        // (N, C)     fcproj's output gradient
    floatX* dlayernorm;  // (4C)       this microbatch's ln1w, ln1b, ln2w, ln2b gradients (this rank's rows' share
                         //            under sequence parallelism, summed over the tp ranks with the chunk's)
    // a mixture of experts (null in a dense model), the rows of this rank's experts sorted by expert (Mr rows,
    // llmc/model/moe.cuh) and the rows this tp rank routes (N' of N):
    floatX* expert_input;    // (Mr, C)    each expert's fc's input
    floatX* expert_dfch;     // (Mr, fc)   its output gradient (through the activation)
    floatX* expert_act;      // (Mr, He)   each expert's projection's input
    floatX* expert_doutput;  // (Mr, C)    its output gradient
    floatX* router_input;    // (N', C)    the router's input (norm2's output)
    floatX* router_dlogits;  // (N', E)    its output gradient
    int* expert_rows;        // (host, ep x E) the rows per expert of every ep rank, as the forward pass had them
};

// A matmul's weight gradient dW += dY^T X (and db += the column sums of dY) over `rows` rows: now (split false,
// the whole backward pass), or (split, the B of a backward pass split in two) its operands dY and X copied into a
// weight-gradient record, where W finds them; a copy is skipped where the operand is already there (gathered or
// computed into the record).
inline void weight_gradient_now_or_kept(bool split, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                                        floatX* kept_dout, const floatX* inp, floatX* kept_inp, int rows, int IC,
                                        int OC, cudaStream_t stream) {
    if (!split) {
        matmul_backward_weights(dweight, dbias, scratch, dout, inp, rows, IC, OC, stream);
        return;
    }
    auto keep = [&](floatX* kept, const floatX* x, size_t count) {
        if (kept != x) cudaCheck(cudaMemcpyAsync(kept, x, count * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    };
    keep(kept_dout, dout, (size_t)rows * OC);
    keep(kept_inp, inp, (size_t)rows * IC);
}

// One microbatch's weight-gradient work for one stage, between its B and its W: a block record for each of
// the stage's layers (sized, like the stage records, for the rank's longest stage). A rank keeps a pool of
// these (model.weight_records), as many as its schedule has between a B and its W at once.
struct StageWeightRecord {
    std::vector<BlockWeightRecord> blocks;
};

// Buffers every layer reuses in turn.
struct SharedBuffers {
    floatX* projection;     // (N, C)   attproj / fcproj output (each tp rank's term), added to the residual
    floatX* dchannels;      // (N, C)   gradient of a layernorm output or of the attention output
    floatX* dhidden;        // (N, fc/tp) gradient of fc's output (4C GELU inputs, or 2H SwiGLU gates and ups)
    floatX* dactivation;    // (N, H/tp)  gradient of the activation's output (GELU: dhidden itself, in place)
    floatX* dqkv;           // (N, Q/tp)
    floatX* gathered;       // (N, C)   sequence parallelism: rows gathered from the tp ranks (else null)
    float* softmax_stats;   // (4N)     tensor parallelism: the vocabulary-parallel loss's row statistics
    float* attention_D;     // (B, NH/tp, T) attention backward workspace
    float* matmul_scratch;  // bias-gradient partial sums
    float* layernorm_scratch;
    float* norm_scratch;
    float* rope_frequencies;  // (hs/2)  Llama: RoPE's frequencies, computed once (llmc/kernels/rope.cuh; else null)
    EncoderBackwardWorkspace encoder_workspace;
    // a mixture of experts (E experts, M = N K assignments, He hidden units per expert)
    floatX* router_logits;     // (N, E)  the router's logits, then their gradient
    float* router_dprobs;      // (N, E)  the gradient of the router's probabilities
    float* routed_dweights;    // (M)     the gradient of the assignments' weights
    int* expert_rows;          // (E)     device: rows per expert, before they go to the host
    int* capacity_left;        // (k B, E) under cp with a capacity: the room each piece's sequence has left
                               //         for each expert (moe_place_assignments; null otherwise)
    floatX* routed_output;     // (N, C)  the experts' weighted sum; in backward, the routed rows' input gradient
    floatX* expert_doutput;    // (Mr, C) the experts' output gradients, then their input gradients (Mr: the
                               //         rows this rank's experts run, moe_expert_rows)
    floatX* expert_dfch;       // (Mr, He or 2He)
    floatX* expert_dact;       // (Mr, He) SwiGLU's output gradient (GELU works in place: expert_dfch)
    floatX* expert_dispatch;   // (M, C)  expert parallelism: this rank's sorted rows (or their gradients) as
                               //         they leave and come home (null at ep 1)
    floatX* expert_exchange;   // (Mr, C) ... and as they arrive, in source order (null at ep 1)
};

// What a mixture of experts does besides the block's arithmetic: its training settings, and what it measures
// over a step for the log (llmc/model/moe.cuh).
struct MoETraining {
    float aux_coefficient = 0.0f;   // alpha: the load-balancing loss's weight in the total loss
    float z_coefficient = 0.0f;     // beta: the router z-loss's
    float* loss_sums = nullptr;     // device: the aux loss and the z-loss added up since the log read them (the
                                    // first 2 floats of statistics)
    std::vector<long long> tokens;  // host: rows each (layer, expert) ran since then (L x E)
    long long dropped = 0;          // host: assignments dropped by the capacity since then
                                    // (train_gpt.cu's log_expert_routing reads and clears the three)
    // device room for the routing counts' gathers, kept from one layer to the next: every ep rank's rows per
    // expert ((ep, E), ep_gather_counts; made with the model at ep > 1), and under cp each piece's counts gathered
    // over the tp and cp ranks, with their sums (moe_sequence_counts; made by the first step, grown for a larger
    // batch)
    int* gathered_rows = nullptr;
    int* gathered_counts = nullptr;
    size_t gathered_counts_elements = 0;
    long long layer_passes = 0;     // host: moe_forward's calls so far, each one copy of the rows per expert to
                                    // the host (the step's budget of host waits counts them)
    float* statistics = nullptr;    // device: the loss sums, then room for tokens and dropped (3 + L E floats),
                                    // which the log sums over the ranks in one all-reduce
};

// The last stage's LM head for one microbatch: what the loss and the head's backward pass need. The backward
// pass through the head runs right after the loss (one rank; pipeline schedules that keep the backward whole),
// so one record serves every microbatch. A schedule that splits the backward runs it as the other stages do:
// the gradient of the head's input in the stage's B, the head's weight gradient in its W, and each microbatch
// keeps its record from its forward to its W (llmc/parallel/pipeline.h says why).
struct HeadRecord {
    floatX* lnf = nullptr;       // (R, C)  the final layernorm's output: the head's input
    float* lnf_mean = nullptr;   // (R)
    float* lnf_rstd = nullptr;   // (R)
    floatX* logits = nullptr;    // (N, Vp/tp): logits after the forward pass, dlogits after the loss
};

// Sampling with a key/value cache: a token's forward pass at position t needs the keys and values of positions
// 0..t of every layer, and those of 0..t-1 were computed by the earlier tokens' passes. So each pass keeps its
// row's K and V, and a new token costs one row's forward pass (N = 1), its attention one query against t + 1
// cached keys, instead of the whole sequence's. Per layer this rank runs: (capacity, 2 Ckv) rows, each its
// K heads then its V heads (this rank's, under tp), the packed key/value layout of llmc/kernels/attention.cuh,
// so that attention reads the cache as an ordinary key block. While `decoding`, the block appends to it and
// attends over it, at `position` (llmc/model/forward_backward.cuh).
struct KVCache {
    bool decoding = false;
    int position = 0;              // the position of the row being decoded
    int capacity = 0;              // positions the cache holds
    std::vector<floatX*> layers;   // per model layer: its cache, or null for a layer another pp rank runs
};

// What the host reads from the device once per step, in one copy (gpt2_read_results).
struct StepResults {
    float loss;               // the mean loss (gpt2_mean_loss), averaged over ranks by llmc/parallel/zero.h
    float grad_norm_squared;  // the squared global gradient norm (gpt2_grad_norm_squared, zero_gradient_norm)
    // the noise scale's small batch (llmc/noise_scale.h): the squared norm of the step's first microbatch's
    // gradient / microbatches, averaged over the data-parallel ranks (zero_small_batch_norm, gradient_norm);
    // allocated, and so read, only when the noise scale is measured. Next to grad_norm_squared: the two are
    // summed over the tp, ep and pp ranks as one 2-float reduction.
    float small_batch_norm_squared;
};

// Host data for the device through pinned memory, so the copy is asynchronous. Two slots, used in turn:
// the host fills one while the copy out of the other may still be in flight, and before refilling a slot
// it waits for that slot's previous copy, issued a whole micro-step earlier (long done on a busy device).
struct StagedUpload {
    size_t capacity = 0;
    int* pinned[2] = {};
    cudaEvent_t copied[2] = {};
    int next = 0;
};

// ----------------------------------------------------------------------------
// the model

struct GPT2 {
    GPT2Config config;
    ParameterLayout layout;           // the chunks this rank holds (pipeline parallelism: its stages'; tensor
                                      // parallelism: its slices of them)
    int max_batch = 0, max_seq = 0;   // the B and T the activations were sized for
    int stage_layers = 0;             // the most layers of any stage this rank runs (L without pipeline
                                      // parallelism): the records are sized for it
    bool first_stage = true;          // holds layer 0: the embeddings' lookup
    bool last_stage = true;           // holds layer L-1: the final layernorm, the LM head and the loss

    floatX* params = nullptr;         // every chunk's parameters (not allocated under ZeRO-3, which gathers
                                      // them from the ranks' shards when a kernel needs them)
    floatX* grads = nullptr;          // every chunk's gradients (not allocated under ZeRO-2 and 3)

    // the pool of stage records; under recomputation some of their pointers lead to buffers the layers
    // and records share (gpt2_allocate_records), which the backward pass fills again before use
    std::vector<StageActivations> records;
    std::vector<void*> record_buffers;  // every buffer the records point to, each once
    std::vector<void*> host_buffers;    // the records' pinned host buffers
    // the pool of weight-gradient records (a schedule that splits the backward pass; empty otherwise)
    std::vector<StageWeightRecord> weight_records;
    // what one stage record and one weight record hold of their own, as the books count them (device
    // activations; pinned host bytes apart): the memory timeline's units (llmc/parallel/pipeline_timeline.h)
    size_t stage_record_bytes = 0, stage_record_host_bytes = 0, weight_record_bytes = 0;
    std::vector<floatX*> outboxes;  // R x C each: a stage's input gradient, kept for a send held back
    // the last stage's pool of head records (part.heads of them); record 0 is the one a rank without a pipeline,
    // validation and sampling use
    std::vector<HeadRecord> heads;
    float* losses = nullptr;          // (N) per-position loss
    double* loss_sum = nullptr;       // the micro-batches' mean losses added up, until gpt2_mean_loss
    int* inputs = nullptr;            // (N) device copies of the batch (first stage)
    int* targets = nullptr;           // (last stage)
    StagedUpload inputs_upload, targets_upload;
    StepResults* results = nullptr;   // device
    StepResults* results_host = nullptr;  // pinned
    size_t results_bytes = 0;         // of them on the device: without the small batch's slot when it is not measured
    float* small_batch_norm_squared = nullptr;  // &results->small_batch_norm_squared, or null: not measured
    SharedBuffers shared{};
    KVCache cache;                    // sampling's keys and values (kv_cache_reserve; empty before a sample)
    MoETraining moe;                  // a mixture of experts' settings and statistics
    cudaStream_t stream = nullptr;    // non-blocking: created by gpt2_allocate, destroyed by gpt2_free
    ActivationOffload offload;        // the offloaded blocks' staging records and copy stream (llmc/model/activation_offload.cuh)
};

// A cache of at least `capacity` positions for the layers this rank holds (tp: its K/V heads). Made by the first
// sample and kept with the model (gpt2_free releases it), so that later samples allocate nothing: on a GPU every
// cudaFree waits for the device. Booked as "other" memory: not the training step's, which the memory report
// holds against its formulas.
inline void kv_cache_reserve(GPT2& model, int capacity, int tp) {
    const GPT2Config& c = model.config;
    KVCache& cache = model.cache;
    if (cache.capacity >= capacity) return;
    for (floatX* layer : cache.layers) tracked_free(layer);
    cache.capacity = capacity;
    cache.layers.assign(c.num_layers, nullptr);
    const size_t row = 2 * (size_t)c.kv_heads / tp * c.head_size();
    for (int layer = 0; layer < c.num_layers; layer++)
        if (model.layout.holds(layer + 1)) cache.layers[layer] = tracked_alloc<floatX>((size_t)capacity * row, MemoryKind::Other, "kv cache");
}
inline void kv_cache_free(GPT2& model) {
    for (floatX* layer : model.cache.layers) tracked_free(layer);
    model.cache = KVCache{};
}

inline void staged_upload_create(StagedUpload& upload, size_t capacity) {
    upload.capacity = capacity;
    for (int slot = 0; slot < 2; slot++) {
        cudaCheck(cudaMallocHost(&upload.pinned[slot], capacity * sizeof(int)));
        cudaCheck(cudaEventCreateWithFlags(&upload.copied[slot], cudaEventDisableTiming));
    }
}
inline void staged_upload_free(StagedUpload& upload) {
    for (int slot = 0; slot < 2; slot++) {
        cudaCheck(cudaFreeHost(upload.pinned[slot]));
        cudaCheck(cudaEventDestroy(upload.copied[slot]));
    }
    upload = StagedUpload{};
}
// device[0, count) = host[0, count), on `stream`; the host may reuse `host` as soon as this returns
inline void staged_upload(StagedUpload& upload, int* device, const int* host, size_t count, cudaStream_t stream) {
    if (count > upload.capacity) fatal("an upload of %zu ids exceeds the %zu allocated", count, upload.capacity);
    const int slot = upload.next;
    upload.next = 1 - slot;
    cudaCheck(cudaEventSynchronize(upload.copied[slot]));  // an event never recorded counts as complete
    std::copy(host, host + count, upload.pinned[slot]);
    cudaCheck(cudaMemcpyAsync(device, upload.pinned[slot], count * sizeof(int), cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(upload.copied[slot], stream));
}

// The part of the model a rank holds and runs, and how it keeps it: what its place on each parallel axis
// decides (llmc/parallel/parallel_context.h's model_part; the defaults are one rank's whole model).
struct ModelPart {
    // pipeline parallelism (llmc/parallel/pipeline.h's pipeline_model_part): the chunks it holds
    // (empty: all of them), the most layers of any of its stages (0: all L), how many stage records it keeps
    // at once, and how many weight-gradient records (schedules that split the backward pass; 0 otherwise)
    std::vector<char> held_chunks;
    int stage_layers = 0;
    std::vector<int> stage_first_layers, stage_sizes;  // the stages it runs (empty: one stage of all L layers)
    int records = 1;
    int weight_records = 0;
    int outboxes = 0;  // copies of input gradients whose send waits past their record's next forward
    int heads = 1;     // head records (last stage): microbatches between their forward and their W at once
    // tensor parallelism: this rank's slice of every matmul; sequence parallelism: its 1/tp of the rows
    int tp = 1, tp_rank = 0;
    bool sequence_parallel = false;
    // expert parallelism: this rank's experts of a mixture of experts (E/ep), which run the ep group's rows (at
    // most moe_expert_rows of them: a capacity bounds them, the most rows an expert takes from one sequence under
    // the layout's capacity factor, moe_capacity; 0: none)
    int ep = 1, ep_rank = 0;
    int expert_capacity = 0;
    // context parallelism: the ranks each sequence's positions are split over, and the pieces they come in on
    // this rank (zigzag: 2)
    int cp = 1, sequence_pieces = 1;
    // ZeRO: chunks padded for `shards` shards; whole parameters below stage 3, whole gradients below stage 2
    int shards = 1;
    bool full_parameters = true, full_gradients = true;
    Recompute recompute;  // what the forward pass keeps
    bool small_batch_norm = false;  // the step's results hold the noise scale's small batch (llmc/noise_scale.h)
    // rows of the residual stream of N token rows: N, or this rank's N/tp under sequence parallelism
    size_t rows(size_t N) const { return sequence_parallel ? N / tp : N; }
    // Whether layer `slot` of a stage record may run a mixture of experts: block `slot` of one of the stages this
    // rank runs is one (with a mixture every N > 1 blocks, the other slots need none of its buffers).
    bool slot_has_mixture(const GPT2Config& c, int slot) const {
        if (stage_first_layers.empty()) return c.moe_block(slot);
        for (size_t s = 0; s < stage_first_layers.size(); s++)
            if (slot < stage_sizes[s] && c.moe_block(stage_first_layers[s] + slot)) return true;
        return false;
    }
    int mixture_slots(const GPT2Config& c, int slots) const {
        int count = 0;
        for (int slot = 0; slot < slots; slot++) count += slot_has_mixture(c, slot);
        return count;
    }
};

// The pool of part.records stage records of stage_layers layers each, as the recompute policy has them
// (llmc/parallel/recompute.h): every buffer of every layer (none); the layernorm and GELU outputs shared by all
// layers of all records (selective); or only the outputs at the ends of segments kept, every other buffer
// in `segment` records that all layers of all records share (full). Per block, each position of a record as
// its letter says: k as none, s as selective, f its output and one record every f position shares, o its
// output and its record in pinned host memory (one per record), run in one of two staging records
// (llmc/model/activation_offload.cuh). What the forward pass keeps counts as activations (on the host: host
// activations), the shared buffers as workspace (llmc/planning/memory.h counts the same). Then the pool of
// part.weight_records weight-gradient records, each with a BlockWeightRecord per layer (activations too).
inline void gpt2_allocate_records(GPT2& model, const ModelPart& part, int B, int T) {
    const GPT2Config& c = model.config;
    const Recompute& r = part.recompute;
    const size_t N = (size_t)B * T, C = c.channels, layers = model.stage_layers, R = part.rows(N);
    const size_t attention = C / part.tp, qkv = c.qkv_channels() / part.tp, heads = c.num_heads / part.tp;
    // every layer of a record is sized for the widest block (a dense block's MLP and a mixture's shared experts
    // differ under --moe-every), and carries a mixture's buffers where one of the rank's stages has a mixture
    const size_t hidden = c.widest_hidden() / part.tp, fc = c.widest_fc_channels() / part.tp;
    const bool layernorm = !c.llama();  // RMSNorm keeps no mean
    std::vector<std::pair<void*, size_t>>* staging = nullptr;  // while a staging record is made: its buffers
    auto buffer = [&](size_t count, size_t element_bytes, MemoryKind kind) {
        void* pointer = tracked_alloc<char>(count * element_bytes, kind);
        model.record_buffers.push_back(pointer);
        if (staging && pointer) staging->push_back({pointer, count * element_bytes});
        return pointer;
    };
    auto values = [&](size_t count, MemoryKind kind) { return (floatX*)buffer(count, sizeof(floatX), kind); };
    auto floats = [&](size_t count, MemoryKind kind) { return (float*)buffer(count, sizeof(float), kind); };
    auto host_ints = [&](size_t count) {  // pinned, for copies the host waits for
        int* pointer = nullptr;
        cudaCheck(cudaMallocHost(&pointer, count * sizeof(int)));
        model.host_buffers.push_back(pointer);
        return pointer;
    };
    // one layer's whole record; `kind` for every buffer but those the policy shares (selective: the norms' and
    // the activation's outputs)
    auto record = [&](MemoryKind kind, bool with_output, bool mixture, bool selective = false) {
        BlockActivations a{};
        a.ln1 = selective ? nullptr : values(R * C, kind);
        a.ln1_mean = layernorm ? floats(R, kind) : nullptr;
        a.ln1_rstd = floats(R, kind);
        a.qkv = values(N * qkv, kind);
        a.atty = values(N * attention, kind);
        a.lse = floats(N * heads, kind);
        a.residual2 = values(R * C, kind);
        a.ln2 = selective ? nullptr : values(R * C, kind);
        a.ln2_mean = layernorm ? floats(R, kind) : nullptr;
        a.ln2_rstd = floats(R, kind);
        a.fch = values(N * fc, kind);
        a.fch_gelu = selective ? nullptr : values(N * hidden, kind);
        a.output = with_output ? values(R * C, kind) : nullptr;
        if (mixture) {
            const size_t E = c.experts, K = c.experts_per_token, M = N * K;
            const size_t Mr = moe_expert_rows(c, B, T, part.ep, part.expert_capacity);
            a.router_probs = floats(N * E, kind);
            a.router_lse = floats(N, kind);
            a.routed_experts = (int*)buffer(M, sizeof(int), kind);
            a.routed_weights = floats(M, kind);
            a.routed_slots = (int*)buffer(M, sizeof(int), kind);
            a.routed_counts = (int*)buffer((size_t)part.sequence_pieces * B * E, sizeof(int), kind);
            a.expert_rows = host_ints((size_t)part.ep * E);
            a.expert_input = values(Mr * C, kind);
            a.expert_fch = values(Mr * c.expert_fc_channels(), kind);
            a.expert_act = values(Mr * c.expert_hidden(), kind);
            a.expert_output = values(M * C, kind);
        }
        return a;
    };
    std::vector<BlockActivations> shared;  // full: the segment's records
    const int segment = recompute_segment(r, (int)layers);
    if (r.policy == RecomputePolicy::Full)
        for (int i = 0; i < segment; i++)  // (each serves every segment-th layer: a mixture's buffers if any)
            shared.push_back(record(MemoryKind::Workspace, /*with_output=*/i < segment - 1, c.moe()));
    bool used[kNumBlockKeeps] = {};  // which kinds the positions keep
    for (int i = 0; i < (int)layers; i++) used[(int)recompute_block_keep(r, i)] = true;
    const bool per_block = r.policy == RecomputePolicy::PerBlock;
    BlockActivations full_record{};  // per block: the record every f position shares (a mixture's buffers if any)
    if (per_block && used[(int)BlockKeep::Full]) full_record = record(MemoryKind::Workspace, false, c.moe());
    ActivationOffload& offload = model.offload;
    BlockActivations staged[2] = {};  // per block: the two staging records of the o positions
    if (per_block && used[(int)BlockKeep::Offload]) {
        if (c.moe()) fatal("--recompute-blocks %s: a mixture of experts cannot be offloaded (o): its routing counts "
                           "are read on the host", recompute_blocks_text(r.blocks).c_str());
        activation_offload_create(offload);
        for (int k = 0; k < 2; k++) {
            staging = &offload.staging[k].buffers;
            staged[k] = record(MemoryKind::Workspace, false, false);
            staging = nullptr;
        }
        int offloaded = 0;
        for (int i = 0; i < (int)layers; i++)
            offload.staging_of.push_back(r.blocks[i] == BlockKeep::Offload ? offloaded++ % 2 : -1);
    }
    floatX *ln1 = nullptr, *ln2 = nullptr, *fch_gelu = nullptr;  // selective: shared by every layer
    if (used[(int)BlockKeep::Selective]) {
        ln1 = values(R * C, MemoryKind::Workspace);
        ln2 = values(R * C, MemoryKind::Workspace);
        fch_gelu = values(N * hidden, MemoryKind::Workspace);
    }
    const MemoryTotals before_records = memory_totals(), host_before_records = host_memory_totals();
    model.records.resize(part.records);
    for (StageActivations& stage : model.records) {
        stage.input = values(R * C, MemoryKind::Activations);
        stage.doutput = values(R * C, MemoryKind::Activations);
        stage.blocks.resize(layers);
        stage.offloaded.assign(layers, {});
        for (int i = 0; i < (int)layers; i++) {
            BlockActivations& a = stage.blocks[i];
            const BlockKeep keep = recompute_block_keep(r, i);
            if (r.policy == RecomputePolicy::Full) {
                a = shared[i % segment];
                if (recompute_keeps_output(r, i, (int)layers)) a.output = values(R * C, MemoryKind::Activations);
            } else if (keep == BlockKeep::Full) {
                a = full_record;
                a.output = values(R * C, MemoryKind::Activations);
            } else if (keep == BlockKeep::Offload) {
                a = staged[offload.staging_of[i]];
                a.output = values(R * C, MemoryKind::Activations);
                for (const std::pair<void*, size_t>& piece : offload.staging[offload.staging_of[i]].buffers)
                    stage.offloaded[i].push_back(tracked_host_alloc<char>(piece.second, MemoryKind::Activations,
                                                                          "offloaded record"));
                model.record_buffers.insert(model.record_buffers.end(), stage.offloaded[i].begin(),
                                            stage.offloaded[i].end());
            } else {
                a = record(MemoryKind::Activations, true, part.slot_has_mixture(c, i), keep == BlockKeep::Selective);
                if (keep == BlockKeep::Selective) {
                    a.ln1 = ln1;
                    a.ln2 = ln2;
                    a.fch_gelu = fch_gelu;
                }
            }
            a.keep = keep;
        }
        for (int i = 0; i < (int)layers; i++) {
            stage.blocks[i].input = i == 0 ? stage.input : stage.blocks[i - 1].output;
            stage.blocks[i].dresidual = stage.doutput;
        }
    }
    const size_t activations = (size_t)MemoryKind::Activations;
    const size_t records = std::max(1, part.records);
    model.stage_record_bytes = (memory_totals().current[activations] - before_records.current[activations]) / records;
    model.stage_record_host_bytes = (host_memory_totals().current_total - host_before_records.current_total) / records;
    model.outboxes.resize(part.outboxes);
    for (floatX*& outbox : model.outboxes) outbox = values(R * C, MemoryKind::Activations);
    const size_t before_weight_records = memory_totals().current[activations];
    model.weight_records.resize(part.weight_records);
    for (StageWeightRecord& stage : model.weight_records) {
        stage.blocks.resize(layers);
        for (int i = 0; i < (int)layers; i++) {
            BlockWeightRecord& w = stage.blocks[i];
            w.ln1 = values(N * C, MemoryKind::Activations);
            w.dqkv = values(N * qkv, MemoryKind::Activations);
            w.atty = values(N * attention, MemoryKind::Activations);
            w.dattention = values(N * C, MemoryKind::Activations);
            w.ln2 = values(N * C, MemoryKind::Activations);
            w.dhidden = values(N * fc, MemoryKind::Activations);
            w.fch_gelu = values(N * hidden, MemoryKind::Activations);
            w.dmlp = values(N * C, MemoryKind::Activations);
            w.dlayernorm = values(4 * C, MemoryKind::Activations);
            if (part.slot_has_mixture(c, i)) {
                const size_t Mr = moe_expert_rows(c, B, T, part.ep, part.expert_capacity);
                w.expert_input = values(Mr * C, MemoryKind::Activations);
                w.expert_dfch = values(Mr * c.expert_fc_channels(), MemoryKind::Activations);
                w.expert_act = values(Mr * c.expert_hidden(), MemoryKind::Activations);
                w.expert_doutput = values(Mr * C, MemoryKind::Activations);
                w.router_input = values(N * C, MemoryKind::Activations);
                w.router_dlogits = values(N * c.experts, MemoryKind::Activations);
                w.expert_rows = host_ints((size_t)part.ep * c.experts);
            }
        }
    }
    if (part.weight_records > 0)
        model.weight_record_bytes = (memory_totals().current[activations] - before_weight_records) / part.weight_records;
}

// Allocates parameters, gradients and activations for micro-batches of up to B x T, for the part of the
// model `part` says this rank holds. Without full_gradients there is no model.grads (ZeRO-2 keeps gradients
// elsewhere), without full_parameters no model.params (ZeRO-3). llmc/planning/activation_memory.h's
// gpt2_activation_bytes counts the same buffers.
inline void gpt2_allocate(GPT2& model, const GPT2Config& config, int B, int T, const ModelPart& part = ModelPart{}) {
    gpt2_validate_config(config, "model");
    if (T > config.max_seq_len) fatal("sequence length %d exceeds the model's maximum %d", T, config.max_seq_len);
    matmul_setup();  // cuBLASLt's handle and workspace, before any step (llmc/kernels/matmul.cuh says why)
    model.config = config;
    model.layout = ParameterLayout(config, part.shards, part.tp, part.tp_rank, part.held_chunks, part.ep, part.ep_rank);
    model.max_batch = B;
    model.max_seq = T;
    model.stage_layers = part.stage_layers > 0 ? part.stage_layers : config.num_layers;
    model.first_stage = model.layout.holds(1);
    model.last_stage = model.layout.holds(config.num_layers);
    cudaCheck(cudaStreamCreateWithFlags(&model.stream, cudaStreamNonBlocking));
    const size_t P = model.layout.total;
    const size_t N = (size_t)B * T, C = config.channels;
    const size_t R = part.rows(N);                                         // rows of the residual stream
    const size_t qkv = config.qkv_channels() / part.tp, heads = config.num_heads / part.tp;
    const size_t hidden = config.widest_hidden() / part.tp, fc = config.widest_fc_channels() / part.tp;

    if (part.full_parameters) model.params = tracked_alloc<floatX>(P, MemoryKind::Parameters);
    if (part.full_gradients) {
        model.grads = tracked_alloc<floatX>(P, MemoryKind::Gradients);
        cudaCheck(cudaMemsetAsync(model.grads, 0, P * sizeof(floatX), model.stream));
    }

    gpt2_allocate_records(model, part, B, T);
    if (model.last_stage) {
        model.heads.resize(part.heads);
        for (HeadRecord& head : model.heads) {
            head.lnf = tracked_alloc<floatX>(R * C, MemoryKind::Activations);
            head.lnf_mean = tracked_alloc<float>(R, MemoryKind::Activations);
            head.lnf_rstd = tracked_alloc<float>(R, MemoryKind::Activations);
            head.logits = tracked_alloc<floatX>(N * (config.padded_vocab_size / part.tp), MemoryKind::Activations);
        }
        model.losses = tracked_alloc<float>(N, MemoryKind::Activations);
        model.targets = tracked_alloc<int>(N, MemoryKind::Activations);
    }
    if (model.first_stage) model.inputs = tracked_alloc<int>(N, MemoryKind::Activations);
    model.loss_sum = tracked_alloc<double>(1, MemoryKind::Workspace);
    cudaCheck(cudaMemsetAsync(model.loss_sum, 0, sizeof(double), model.stream));
    staged_upload_create(model.inputs_upload, N);
    staged_upload_create(model.targets_upload, N);
    // (floats, so that without the small batch's slot the results are the two floats the memory formula counts)
    static_assert(sizeof(StepResults) == 3 * sizeof(float), "StepResults: three floats");
    model.results_bytes = part.small_batch_norm ? sizeof(StepResults) : offsetof(StepResults, small_batch_norm_squared);
    model.results = (StepResults*)tracked_alloc<float>(model.results_bytes / sizeof(float), MemoryKind::Workspace);
    if (part.small_batch_norm) model.small_batch_norm_squared = &model.results->small_batch_norm_squared;
    cudaCheck(cudaMallocHost(&model.results_host, sizeof(StepResults)));
    *model.results_host = StepResults{};

    SharedBuffers& s = model.shared;
    s.projection = tracked_alloc<floatX>(N * C, MemoryKind::Workspace);
    s.dchannels = tracked_alloc<floatX>(N * C, MemoryKind::Workspace);
    s.dhidden = tracked_alloc<floatX>(N * fc, MemoryKind::Workspace);
    // SwiGLU's output gradient is half as wide as its input's; GELU's backward works in place
    s.dactivation = config.llama() ? tracked_alloc<floatX>(N * hidden, MemoryKind::Workspace) : s.dhidden;
    s.dqkv = tracked_alloc<floatX>(N * qkv, MemoryKind::Workspace);
    s.gathered = part.sequence_parallel ? tracked_alloc<floatX>(N * C, MemoryKind::Workspace) : nullptr;
    s.softmax_stats = part.tp > 1 && model.last_stage ? tracked_alloc<float>(4 * N, MemoryKind::Workspace) : nullptr;
    s.attention_D = tracked_alloc<float>(N * heads, MemoryKind::Workspace);
    // the widest matmul with a bias gradient: qkv (3C/tp), fc (4C/tp) or a row-parallel projection (C); in a
    // mixture of experts fc may be narrower than qkv, or absent
    s.matmul_scratch = tracked_alloc<float>(matmul_backward_scratch_floats((int)N, (int)std::max({C, fc, qkv})),
                                            MemoryKind::Workspace);
    s.layernorm_scratch = tracked_alloc<float>(layernorm_backward_scratch_floats((int)R, (int)C), MemoryKind::Workspace);
    s.norm_scratch = tracked_alloc<float>(global_norm_scratch_count(), MemoryKind::Workspace);
    s.rope_frequencies = nullptr;
    if (config.llama()) {
        s.rope_frequencies = tracked_alloc<float>(config.head_size() / 2, MemoryKind::Workspace);
        rope_frequencies(s.rope_frequencies, (int)config.head_size(), config.rope_theta, model.stream);
    }
    if (model.first_stage) encoder_backward_workspace_create(&s.encoder_workspace, (int)N, (int)C);
    if (config.moe()) {
        const size_t E = config.experts, M = N * config.experts_per_token, G = part.ep;
        const size_t Mr = moe_expert_rows(config, B, T, part.ep, part.expert_capacity);
        s.router_logits = tracked_alloc<floatX>(N * E, MemoryKind::Workspace);
        s.router_dprobs = tracked_alloc<float>(N * E, MemoryKind::Workspace);
        s.routed_dweights = tracked_alloc<float>(M, MemoryKind::Workspace);
        s.expert_rows = tracked_alloc<int>(E, MemoryKind::Workspace);
        s.capacity_left = part.cp > 1 && part.expert_capacity > 0
                              ? tracked_alloc<int>((size_t)part.sequence_pieces * B * E, MemoryKind::Workspace)
                              : nullptr;
        s.routed_output = tracked_alloc<floatX>(N * C, MemoryKind::Workspace);
        s.expert_doutput = tracked_alloc<floatX>(Mr * C, MemoryKind::Workspace);
        s.expert_dfch = tracked_alloc<floatX>(Mr * config.expert_fc_channels(), MemoryKind::Workspace);
        s.expert_dact = config.llama() ? tracked_alloc<floatX>(Mr * config.expert_hidden(), MemoryKind::Workspace)
                                       : s.expert_dfch;
        s.expert_dispatch = G > 1 ? tracked_alloc<floatX>(M * C, MemoryKind::Workspace) : nullptr;
        s.expert_exchange = G > 1 ? tracked_alloc<floatX>(Mr * C, MemoryKind::Workspace) : nullptr;
        model.moe.statistics = tracked_alloc<float>(3 + (size_t)config.num_layers * E, MemoryKind::Workspace);
        model.moe.loss_sums = model.moe.statistics;
        cudaCheck(cudaMemsetAsync(model.moe.loss_sums, 0, 2 * sizeof(float), model.stream));
        model.moe.tokens.assign((size_t)config.num_layers * E, 0);
        model.moe.gathered_rows = G > 1 ? tracked_alloc<int>(G * E, MemoryKind::Communication, "routing counts") : nullptr;
    }
}

inline void gpt2_free(GPT2& model) {
    for (void* p : {(void*)model.params, (void*)model.grads, (void*)model.losses, (void*)model.loss_sum,
                    (void*)model.inputs, (void*)model.targets, (void*)model.results})
        tracked_free(p);
    for (const HeadRecord& head : model.heads)
        for (void* p : {(void*)head.lnf, (void*)head.lnf_mean, (void*)head.lnf_rstd, (void*)head.logits}) tracked_free(p);
    staged_upload_free(model.inputs_upload);
    staged_upload_free(model.targets_upload);
    cudaCheck(cudaFreeHost(model.results_host));
    activation_offload_free(model.offload);  // (its copies read and write the record buffers)
    for (void* p : model.record_buffers) tracked_free(p);
    for (void* p : model.host_buffers) cudaCheck(cudaFreeHost(p));
    SharedBuffers& s = model.shared;
    if (s.dactivation != s.dhidden) tracked_free(s.dactivation);
    if (s.expert_dact != s.expert_dfch) tracked_free(s.expert_dact);
    for (void* p : {(void*)s.router_logits, (void*)s.router_dprobs, (void*)s.routed_dweights, (void*)s.expert_rows,
                    (void*)s.capacity_left, (void*)s.routed_output, (void*)s.expert_doutput, (void*)s.expert_dfch,
                    (void*)s.expert_dispatch, (void*)s.expert_exchange, (void*)model.moe.statistics,
                    (void*)model.moe.gathered_rows, (void*)model.moe.gathered_counts})
        tracked_free(p);
    for (void* p : {(void*)s.projection, (void*)s.dchannels, (void*)s.dhidden, (void*)s.dqkv,
                    (void*)s.gathered, (void*)s.softmax_stats, (void*)s.attention_D, (void*)s.matmul_scratch, (void*)s.layernorm_scratch, (void*)s.norm_scratch,
                    (void*)s.rope_frequencies})
        tracked_free(p);
    if (model.first_stage) encoder_backward_workspace_free(&s.encoder_workspace);
    kv_cache_free(model);
    cudaCheck(cudaStreamDestroy(model.stream));
    model = GPT2{};
}

// Copies fp32 host values (in the layout's order, padding included) into the parameters.
inline void gpt2_set_parameters(GPT2& model, const std::vector<float>& values) {
    const size_t P = model.layout.total;
    std::vector<floatX> converted(P);
    for (size_t i = 0; i < P; i++) converted[i] = (floatX)values[i];
    copy_to_device(model.params, converted.data(), P, model.stream);
}

// The parameters as fp32 host values.
inline std::vector<float> gpt2_get_parameters(const GPT2& model) {
    const size_t P = model.layout.total;
    std::vector<floatX> raw(P);
    copy_to_host(raw.data(), model.params, P, model.stream);
    return std::vector<float>(raw.begin(), raw.end());
}

// ----------------------------------------------------------------------------
// model files: a 256 int32 header, then the tensors, tensor-major (each tensor for every layer, then the next),
// in TensorKind's order, those the architecture and each block have. GPT-2's is llm.c's format; Llama's header
// has its own magic number and four more fields (the README's "Model files" has the table):
//   [0] magic  [1] version (3: fp32 values, 5: bf16)  [2] max_seq_len  [3] vocab  [4] layers  [5] heads
//   [6] channels  [7] padded vocab;  Llama only: [8] K/V heads  [9] hidden units  [10] RoPE theta and
//   [11] norm epsilon, as the bits of fp32 values;  both: [12] experts  [13] experts per token  [14] shared
//   experts (0: a dense MLP)  [15] a mixture every N blocks (0 in a dense model's file, and in files written
//   before it existed: read as 1)

constexpr int kModelMagic = 20240326;
constexpr int kLlamaModelMagic = 20241125;
constexpr int kModelVersionFP32 = 3;
constexpr int kModelVersionBF16 = 5;

inline float float_from_bits(int bits) {
    float value;
    memcpy(&value, &bits, 4);
    return value;
}
inline int bits_of_float(float value) {
    int bits;
    memcpy(&bits, &value, 4);
    return bits;
}

// Reads the header: the shape of the model in a file. The header must agree with the file's size, checked
// here and only here, so that a corrupt or truncated file is refused before anything is allocated for the
// shape it claims (a header saying 1,000,000 layers would otherwise end in "out of memory").
inline GPT2Config gpt2_read_config(const std::string& path, int* version = nullptr) {
    FILE* file = open_file(path, "rb");
    int header[256];
    read_exact(header, sizeof(int), 256, file, path, "the model header");
    close_file(file, path);
    if (header[0] != kModelMagic && header[0] != kLlamaModelMagic)
        fatal("%s is not a model file (magic number %d, expected %d for GPT-2 or %d for Llama)", path.c_str(),
              header[0], kModelMagic, kLlamaModelMagic);
    if (header[1] != kModelVersionFP32 && header[1] != kModelVersionBF16)
        fatal("%s: unsupported model file version %d (3 = fp32, 5 = bf16)", path.c_str(), header[1]);
    if (version) *version = header[1];
    GPT2Config c;
    c.max_seq_len = header[2];
    c.vocab_size = header[3];
    c.num_layers = header[4];
    c.num_heads = header[5];
    c.channels = header[6];
    c.padded_vocab_size = header[7];
    c.experts = header[12];
    c.experts_per_token = header[13];
    c.shared_experts = header[14];
    c.moe_every = c.moe() && header[15] != 0 ? header[15] : 1;  // 0: a file from before --moe-every (every block)
    if (header[0] == kLlamaModelMagic) {
        c.arch = Arch::Llama;
        c.kv_heads = header[8];
        c.ffn_hidden = header[9];
        c.rope_theta = float_from_bits(header[10]);
        c.norm_eps = float_from_bits(header[11]);
    } else {
        c = gpt2_shape(c);
    }
    gpt2_validate_config(c, path);

    // The file is the header and then every parameter (ParameterLayout's num_parameters), counted here in
    // double: a corrupt header can claim a model whose size does not fit in size_t (12 C^2 per layer with C
    // near 2^31, times 2^31 layers), and must still be refused by name. tensor_elements itself cannot
    // overflow for int dimensions (its largest product, 3 C x 2^31 or 2 H x C, stays below 2^64). Exact
    // below 2^53.
    double parameters = 0;
    const double mixtures = c.moe_blocks(), dense = c.num_layers - mixtures;  // blocks of each kind
    for (int kind = 0; kind < NUM_TENSOR_KINDS; kind++)
        parameters += tensor_kind_info(kind).per_layer
                          ? (double)tensor_elements(c, kind) * mixtures + (double)tensor_elements(c.dense_block(), kind) * dense
                          : (double)tensor_elements(c, kind);
    const bool fp32 = header[1] == kModelVersionFP32;
    const double implied = 256 * sizeof(int) + parameters * (fp32 ? 4 : 2);
    const size_t actual = file_size(path);
    if ((double)actual != implied)
        fatal("%s: size %zu bytes (%s) does not match its header, which implies %.0f bytes (%s: %.0f %s parameters "
              "for %d layers, %d heads, %d channels, vocab %d padded to %d, max_seq_len %d)", path.c_str(), actual,
              format_bytes((double)actual).c_str(), implied, format_bytes(implied).c_str(), parameters,
              fp32 ? "fp32" : "bf16", c.num_layers, c.num_heads, c.channels, c.vocab_size, c.padded_vocab_size,
              c.max_seq_len);
    return c;
}

// Host fp32 values of every parameter, in the in-memory (layer-major) layout. The layout must be for the
// file's shape (gpt2_read_config, which also checks the file's size).
inline std::vector<float> gpt2_read_parameters(const std::string& path, const ParameterLayout& layout) {
    int version = 0;
    const GPT2Config c = gpt2_read_config(path, &version);
    const GPT2Config& l = layout.config;
    if (!same_shape(c, l))
        fatal("%s holds a model of another shape (%s, layers %d, heads %d, K/V heads %d, channels %d, hidden %zu, "
              "vocab %d) than the one it is read into (%s, layers %d, heads %d, K/V heads %d, channels %d, hidden %zu, "
              "vocab %d)", path.c_str(), arch_name(c.arch), c.num_layers, c.num_heads, c.kv_heads, c.channels,
              c.hidden(), c.vocab_size, arch_name(l.arch), l.num_layers, l.num_heads, l.kv_heads, l.channels,
              l.hidden(), l.vocab_size);
    FILE* file = open_file(path, "rb");
    if (fseek(file, 256 * sizeof(int), SEEK_SET) != 0) fatal("cannot seek in %s: %s", path.c_str(), strerror(errno));
    std::vector<float> values(layout.total);
    std::vector<uint16_t> half;
    for_each_tensor_in_file_order(layout, [&](int kind, int, size_t offset, size_t count) {
        if (version == kModelVersionFP32) {
            read_exact(values.data() + offset, 4, count, file, path, tensor_kind_info(kind).name);
        } else {
            half.resize(count);
            read_exact(half.data(), 2, count, file, path, tensor_kind_info(kind).name);
            for (size_t i = 0; i < count; i++) {
                uint32_t bits = (uint32_t)half[i] << 16;
                memcpy(&values[offset + i], &bits, 4);
            }
        }
    });
    close_file(file, path);
    for (size_t i = 0; i < values.size(); i++)
        if (!std::isfinite(values[i])) fatal("%s: parameter %zu is not finite (%g)", path.c_str(), i, values[i]);
    return values;
}

// Writes parameters (host values in the layout's order) as an fp32 model file (version 3). Written to a
// temporary name and renamed, so a crash never leaves half a file under the final name.
inline void gpt2_save(const ParameterLayout& layout, const std::vector<float>& values, const std::string& path) {
    const GPT2Config& c = layout.config;
    int header[256] = {0};
    header[0] = c.llama() ? kLlamaModelMagic : kModelMagic;
    header[1] = kModelVersionFP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    if (c.llama()) {
        header[8] = c.kv_heads;
        header[9] = c.ffn_hidden;
        header[10] = bits_of_float(c.rope_theta);
        header[11] = bits_of_float(c.norm_eps);
    }
    header[12] = c.experts;
    header[13] = c.experts_per_token;
    header[14] = c.shared_experts;
    header[15] = c.moe() ? c.moe_every : 0;
    const std::string temporary = path + ".tmp";
    FILE* file = open_file(temporary, "wb");
    write_exact(header, sizeof(int), 256, file, temporary);
    for_each_tensor_in_file_order(layout, [&](int, int, size_t offset, size_t count) {
        write_exact(values.data() + offset, sizeof(float), count, file, temporary);
    });
    close_file(file, temporary);
    if (rename(temporary.c_str(), path.c_str()) != 0) fatal("cannot rename %s to %s", temporary.c_str(), path.c_str());
}

// GPT-2's initialisation, Llama's too: weights ~ normal(0, 0.02), the two projections that write into the
// residual stream scaled down by 1/sqrt(2L) (so the stream's variance does not grow with depth), biases 0,
// norm weights 1. `normal` is a function returning standard normal samples. Padded rows of wte (and of an
// untied LM head) stay 0.
template <class NormalSource>
std::vector<float> gpt2_initial_parameters(const ParameterLayout& layout, NormalSource&& normal) {
    const GPT2Config& c = layout.config;
    std::vector<float> values(layout.total, 0.0f);
    const float residual_std = 0.02f / sqrtf(2.0f * c.num_layers);
    for_each_tensor_in_file_order(layout, [&](int kind, int, size_t offset, size_t count) {
        if (kind == LN1W || kind == LN2W || kind == LNFW) {
            for (size_t i = 0; i < count; i++) values[offset + i] = 1.0f;
        } else if (tensor_kind_info(kind).is_matrix) {
            const float std = (kind == ATTPROJW || kind == FCPROJW || kind == EXPERTPROJW) ? residual_std : 0.02f;
            const size_t used = kind == WTE || kind == LMHEAD ? (size_t)c.vocab_size * c.channels : count;
            for (size_t i = 0; i < used; i++) values[offset + i] = std * normal();
        }
    });
    return values;
}

// ----------------------------------------------------------------------------
// the step's results

// model.results->loss = the mean of the `count` losses gpt2_loss added up since the last call.
inline void gpt2_mean_loss(GPT2& model, int count) {
    finish_mean_loss(&model.results->loss, model.loss_sum, count, model.stream);
}

inline void gpt2_zero_grads(GPT2& model) {
    cudaCheck(cudaMemsetAsync(model.grads, 0, model.layout.total * sizeof(floatX), model.stream));
}

// model.results->grad_norm_squared = the squared L2 norm of all gradients (deterministic).
inline void gpt2_grad_norm_squared(GPT2& model) {
    global_norm_squared(&model.results->grad_norm_squared, model.shared.norm_scratch, model.grads, model.layout.total,
                        model.stream);
}

// Waits for the device and returns what the step computed: the one point per step where the host waits.
inline StepResults gpt2_read_results(GPT2& model) {
    cudaCheck(cudaMemcpyAsync(model.results_host, model.results, model.results_bytes, cudaMemcpyDeviceToHost,
                              model.stream));
    cudaCheck(cudaStreamSynchronize(model.stream));
    return *model.results_host;
}
