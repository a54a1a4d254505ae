/*
GPT-2: the model, its parameters, and one layer's forward and backward pass.

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
tensors, and the passes below call the tp collectives between the matmuls; with one rank they do nothing.

The block is the unit of work: block_forward(l) reads block l-1's output and writes an activation record
for layer l (everything block_backward needs: the layernorm statistics, qkv, the attention output and its
log-sum-exp, the MLP's hidden activations, the block's output); block_backward(l) takes the gradient of
block l's output and turns it into the gradient of its input, accumulating block l's parameter gradients
on the way. A run of consecutive blocks is a stage: all L of them on one rank, or L/(p V) under pipeline
parallelism (llmc/parallel/pipeline.h), where a rank holds only its stages' chunks (and the embeddings on the
first and last stage, the final layernorm on the last). One microbatch's pass through a stage keeps its
layers' records in a stage record (StageActivations); a rank keeps as many stage records as its pipeline
schedule has microbatches in flight, one without a pipeline.

Gradients accumulate (+=) across micro-steps until gpt2_zero_grads. In BF16 the parameters, activations
and gradients are bf16.

Streams. Every kernel, copy and memset of the model runs on model.stream, a non-blocking stream: it
does not wait for the legacy stream, so llmc/parallel/zero.h's communication stream can run beside it, ordered
only by events. The host hands the device a whole step and waits for it once (gpt2_read_results: the
loss and the gradient norm in one copy); the token ids of each micro-batch go up from pinned buffers
through asynchronous copies (StagedUpload).

The optimizer, with its fp32 master weights and moments, and the averaging of gradients over
data-parallel ranks are in llmc/parallel/zero.h.
*/
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include "../utils.h"
#include "../cuda_common.cuh"
#include "../kernels/encoder.cuh"
#include "../kernels/layernorm.cuh"
#include "../kernels/matmul.cuh"
#include "../kernels/attention.cuh"
#include "../kernels/gelu.cuh"
#include "../kernels/fused_classifier.cuh"
#include "../kernels/adamw.cuh"
#include "../kernels/global_norm.cuh"
#include "../planning/memory.h"
#include "parameters.h"
#include "../parallel/tensor_parallel.h"
#include "../parallel/context_parallel.h"
#include "../parallel/recompute.h"

// ----------------------------------------------------------------------------
// activations

// What block_backward needs from block_forward, for one (layer, micro-batch). N = B*T rows. Under tensor
// parallelism (llmc/parallel/tensor_parallel.h) with tp ranks, a rank holds its heads' share of the attention
// (C/tp channels, NH/tp heads) and its 4C/tp hidden units; under sequence parallelism it also holds only
// its R = N/tp rows of the residual stream and the layernorms (else R = N).
struct BlockActivations {
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
};

// Buffers every layer reuses in turn.
struct SharedBuffers {
    floatX* projection;     // (N, C)   attproj / fcproj output (each tp rank's term), added to the residual
    floatX* dchannels;      // (N, C)   gradient of a layernorm output or of the attention output
    floatX* dhidden;        // (N, 4C/tp) gradient of the MLP's hidden activations
    floatX* dqkv;           // (N, 3C/tp)
    floatX* gathered;       // (N, C)   sequence parallelism: rows gathered from the tp ranks (else null)
    float* softmax_stats;   // (4N)     tensor parallelism: the vocabulary-parallel loss's row statistics
    float* attention_D;     // (B, NH/tp, T) attention backward workspace
    float* matmul_scratch;  // bias-gradient partial sums
    float* layernorm_scratch;
    float* norm_scratch;
    EncoderBackwardWorkspace encoder_workspace;
};

// What the host reads from the device once per step, in one copy (gpt2_read_results).
struct StepResults {
    float loss;               // the mean loss (gpt2_mean_loss), averaged over ranks by llmc/parallel/zero.h
    float grad_norm_squared;  // the squared global gradient norm (gpt2_grad_norm_squared, zero_gradient_norm)
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
    TensorParallel tp;                // this rank's slice of every matmul (one rank: the whole model)
    ContextParallel cp;               // this rank's positions of every sequence (one rank: all of them)
    Recompute recompute;              // what the forward pass keeps, what the backward pass computes again
    ParameterLayout layout;           // the chunks this rank holds (pipeline parallelism: its stages')
    int max_batch = 0, max_seq = 0;   // the B and T the activations were sized for
    int stage_layers = 0;             // layers per pipeline stage (L without pipeline parallelism)
    bool first_stage = true;          // holds layer 0: the embeddings' lookup
    bool last_stage = true;           // holds layer L-1: the final layernorm, the LM head and the loss

    floatX* params = nullptr;         // every chunk's parameters (not allocated under ZeRO-3)
    floatX* grads = nullptr;          // every chunk's gradients (not allocated under ZeRO-2 and 3)
    // Where chunk c's parameters are when a kernel needs them: unset, in `params`; ZeRO-3 (llmc/parallel/zero.h)
    // gathers them from the ranks' shards on demand.
    std::function<floatX*(int chunk)> parameters_of;

    // the pool of stage records; under recomputation some of their pointers lead to buffers the layers
    // and records share (gpt2_allocate_records), which the backward pass fills again before use
    std::vector<StageActivations> records;
    std::vector<void*> record_buffers;  // every buffer the records point to, each once
    // the last stage's head: used at once by the loss and its backward pass, so one copy serves every record
    floatX* lnf = nullptr;            // (R, C)
    float* lnf_mean = nullptr;
    float* lnf_rstd = nullptr;
    floatX* logits = nullptr;         // (N, Vp/tp): logits after forward, dlogits after the loss
    float* losses = nullptr;          // (N) per-position loss
    double* loss_sum = nullptr;       // the micro-batches' mean losses added up, until gpt2_mean_loss
    int* inputs = nullptr;            // (N) device copies of the batch (first stage)
    int* targets = nullptr;           // (last stage)
    StagedUpload inputs_upload, targets_upload;
    StepResults* results = nullptr;   // device
    StepResults* results_host = nullptr;  // pinned
    SharedBuffers shared{};
    cudaStream_t stream = nullptr;    // non-blocking: created by gpt2_allocate, destroyed by gpt2_free
};

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

// The pool of `count` stage records of stage_layers layers each, as the recompute policy has them
// (llmc/parallel/recompute.h): every buffer of every layer (none); the layernorm and GELU outputs shared by all
// layers of all records (selective); or only the outputs at the ends of segments kept, every other buffer
// in `segment` records that all layers of all records share (full). What the forward pass keeps counts as
// activations, the shared buffers as workspace (llmc/planning/memory.h counts the same).
inline void gpt2_allocate_records(GPT2& model, int count, int B, int T) {
    const GPT2Config& c = model.config;
    const TensorParallel& tp = model.tp;
    const Recompute& r = model.recompute;
    const size_t N = (size_t)B * T, C = c.channels, layers = model.stage_layers, R = tp_rows(tp, (int)N);
    const size_t attention = C / tp.size, hidden = 4 * C / tp.size, heads = c.num_heads / tp.size;
    auto buffer = [&](size_t count, size_t element_bytes, MemoryKind kind) {
        void* pointer = tracked_alloc<char>(count * element_bytes, kind);
        model.record_buffers.push_back(pointer);
        return pointer;
    };
    auto values = [&](size_t count, MemoryKind kind) { return (floatX*)buffer(count, sizeof(floatX), kind); };
    auto floats = [&](size_t count, MemoryKind kind) { return (float*)buffer(count, sizeof(float), kind); };
    // one layer's whole record; `kind` for every buffer but those the policy shares
    auto record = [&](MemoryKind kind, bool with_output) {
        BlockActivations a{};
        const bool selective = r.policy == RecomputePolicy::Selective;
        a.ln1 = selective ? nullptr : values(R * C, kind);
        a.ln1_mean = floats(R, kind);
        a.ln1_rstd = floats(R, kind);
        a.qkv = values(N * 3 * attention, kind);
        a.atty = values(N * attention, kind);
        a.lse = floats(N * heads, kind);
        a.residual2 = values(R * C, kind);
        a.ln2 = selective ? nullptr : values(R * C, kind);
        a.ln2_mean = floats(R, kind);
        a.ln2_rstd = floats(R, kind);
        a.fch = values(N * hidden, kind);
        a.fch_gelu = selective ? nullptr : values(N * hidden, kind);
        a.output = with_output ? values(R * C, kind) : nullptr;
        return a;
    };
    std::vector<BlockActivations> shared;  // full: the segment's records
    const int segment = recompute_segment(r, (int)layers);
    if (r.policy == RecomputePolicy::Full)
        for (int i = 0; i < segment; i++) shared.push_back(record(MemoryKind::Workspace, /*with_output=*/i < segment - 1));
    floatX *ln1 = nullptr, *ln2 = nullptr, *fch_gelu = nullptr;  // selective: shared by every layer
    if (r.policy == RecomputePolicy::Selective) {
        ln1 = values(R * C, MemoryKind::Workspace);
        ln2 = values(R * C, MemoryKind::Workspace);
        fch_gelu = values(N * hidden, MemoryKind::Workspace);
    }
    model.records.resize(count);
    for (StageActivations& stage : model.records) {
        stage.input = values(R * C, MemoryKind::Activations);
        stage.doutput = values(R * C, MemoryKind::Activations);
        stage.blocks.resize(layers);
        for (int i = 0; i < (int)layers; i++) {
            BlockActivations& a = stage.blocks[i];
            if (r.policy == RecomputePolicy::Full) {
                a = shared[i % segment];
                if (recompute_keeps_output(r, i, (int)layers)) a.output = values(R * C, MemoryKind::Activations);
                continue;
            }
            a = record(MemoryKind::Activations, true);
            if (r.policy == RecomputePolicy::Selective) {
                a.ln1 = ln1;
                a.ln2 = ln2;
                a.fch_gelu = fch_gelu;
            }
        }
    }
}

// The part of the model a rank runs (llmc/parallel/pipeline.h fills it in under pipeline parallelism): the
// chunks it holds (empty: all of them), the layers per stage (0: all L) and how many stage records it
// keeps at once.
struct ModelPart {
    std::vector<char> held_chunks;
    int stage_layers = 0;
    int records = 1;
};

// Allocates parameters, gradients and activations for micro-batches of up to B x T; chunks padded for
// `shards` ZeRO shards; `tp` says which tensor-parallel slice this rank holds, `recompute` what the
// forward pass keeps, `part` which layers it runs. Without full_gradients there is no model.grads (ZeRO-2
// keeps gradients elsewhere), without full_parameters no model.params (ZeRO-3). llmc/planning/memory.h's
// gpt2_activation_bytes counts the same buffers.
inline void gpt2_allocate(GPT2& model, const GPT2Config& config, int B, int T, int shards = 1,
                          bool full_gradients = true, bool full_parameters = true,
                          const TensorParallel& tp = TensorParallel{}, const Recompute& recompute = Recompute{},
                          const ModelPart& part = ModelPart{}, const ContextParallel& cp = ContextParallel{}) {
    gpt2_validate_config(config, "model");
    if (T > config.max_seq_len) fatal("sequence length %d exceeds the model's maximum %d", T, config.max_seq_len);
    model.config = config;
    model.tp = tp;
    tp_streams_create(model.tp);
    model.recompute = recompute;
    model.cp = cp;
    model.layout = ParameterLayout(config, shards, tp.size, tp.rank, part.held_chunks);
    model.max_batch = B;
    model.max_seq = T;
    model.stage_layers = part.stage_layers > 0 ? part.stage_layers : config.num_layers;
    model.first_stage = model.layout.holds(1);
    model.last_stage = model.layout.holds(config.num_layers);
    cudaCheck(cudaStreamCreateWithFlags(&model.stream, cudaStreamNonBlocking));
    const size_t P = model.layout.total;
    const size_t N = (size_t)B * T, C = config.channels;
    const size_t R = tp_rows(tp, (int)N);                                  // rows of the residual stream
    const size_t attention = C / tp.size, hidden = 4 * C / tp.size, heads = config.num_heads / tp.size;

    if (full_parameters) model.params = tracked_alloc<floatX>(P, MemoryKind::Parameters);
    if (full_gradients) {
        model.grads = tracked_alloc<floatX>(P, MemoryKind::Gradients);
        cudaCheck(cudaMemsetAsync(model.grads, 0, P * sizeof(floatX), model.stream));
    }

    gpt2_allocate_records(model, part.records, B, T);
    if (model.last_stage) {
        model.lnf = tracked_alloc<floatX>(R * C, MemoryKind::Activations);
        model.lnf_mean = tracked_alloc<float>(R, MemoryKind::Activations);
        model.lnf_rstd = tracked_alloc<float>(R, MemoryKind::Activations);
        model.logits = tracked_alloc<floatX>(N * (config.padded_vocab_size / tp.size), MemoryKind::Activations);
        model.losses = tracked_alloc<float>(N, MemoryKind::Activations);
        model.targets = tracked_alloc<int>(N, MemoryKind::Activations);
    }
    if (model.first_stage) model.inputs = tracked_alloc<int>(N, MemoryKind::Activations);
    model.loss_sum = tracked_alloc<double>(1, MemoryKind::Workspace);
    cudaCheck(cudaMemsetAsync(model.loss_sum, 0, sizeof(double), model.stream));
    staged_upload_create(model.inputs_upload, N);
    staged_upload_create(model.targets_upload, N);
    model.results = tracked_alloc<StepResults>(1, MemoryKind::Workspace);
    cudaCheck(cudaMallocHost(&model.results_host, sizeof(StepResults)));

    SharedBuffers& s = model.shared;
    s.projection = tracked_alloc<floatX>(N * C, MemoryKind::Workspace);
    s.dchannels = tracked_alloc<floatX>(N * C, MemoryKind::Workspace);
    s.dhidden = tracked_alloc<floatX>(N * hidden, MemoryKind::Workspace);
    s.dqkv = tracked_alloc<floatX>(N * 3 * attention, MemoryKind::Workspace);
    s.gathered = tp.sequence_parallel ? tracked_alloc<floatX>(N * C, MemoryKind::Workspace) : nullptr;
    s.softmax_stats = tp.size > 1 && model.last_stage ? tracked_alloc<float>(4 * N, MemoryKind::Workspace) : nullptr;
    s.attention_D = tracked_alloc<float>(N * heads, MemoryKind::Workspace);
    // the widest matmul with a bias gradient: fc (4C/tp) or a row-parallel projection (C)
    s.matmul_scratch = tracked_alloc<float>(matmul_backward_scratch_floats((int)N, (int)std::max(C, hidden)),
                                            MemoryKind::Workspace);
    s.layernorm_scratch = tracked_alloc<float>(layernorm_backward_scratch_floats((int)R, (int)C), MemoryKind::Workspace);
    s.norm_scratch = tracked_alloc<float>(global_norm_scratch_count(), MemoryKind::Workspace);
    if (model.first_stage) encoder_backward_workspace_create(&s.encoder_workspace, (int)N, (int)C);
    cp_create(model.cp, B, T, (int)attention, (int)heads);
}

inline void gpt2_free(GPT2& model) {
    for (void* p : {(void*)model.params, (void*)model.grads, (void*)model.lnf, (void*)model.lnf_mean,
                    (void*)model.lnf_rstd, (void*)model.logits, (void*)model.losses, (void*)model.loss_sum,
                    (void*)model.inputs, (void*)model.targets, (void*)model.results})
        tracked_free(p);
    staged_upload_free(model.inputs_upload);
    staged_upload_free(model.targets_upload);
    cudaCheck(cudaFreeHost(model.results_host));
    for (void* p : model.record_buffers) tracked_free(p);
    SharedBuffers& s = model.shared;
    for (void* p : {(void*)s.projection, (void*)s.dchannels, (void*)s.dhidden, (void*)s.dqkv,
                    (void*)s.gathered, (void*)s.softmax_stats, (void*)s.attention_D, (void*)s.matmul_scratch, (void*)s.layernorm_scratch, (void*)s.norm_scratch})
        tracked_free(p);
    if (model.first_stage) encoder_backward_workspace_free(&s.encoder_workspace);
    tp_streams_destroy(model.tp);
    cp_destroy(model.cp);
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
// model files (llm.c's format: 256 int32 header, then the tensors, tensor-major)

constexpr int kModelMagic = 20240326;
constexpr int kModelVersionFP32 = 3;
constexpr int kModelVersionBF16 = 5;

// Reads the header: the shape of the model in a file. The header must agree with the file's size, checked
// here and only here, so that a corrupt or truncated file is refused before anything is allocated for the
// shape it claims (a header saying 1,000,000 layers would otherwise end in "out of memory").
inline GPT2Config gpt2_read_config(const std::string& path, int* version = nullptr) {
    FILE* file = open_file(path, "rb");
    int header[256];
    read_exact(header, sizeof(int), 256, file, path, "the model header");
    close_file(file, path);
    if (header[0] != kModelMagic)
        fatal("%s is not a model file (magic number %d, expected %d)", path.c_str(), header[0], kModelMagic);
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
    gpt2_validate_config(c, path);

    // The file is the header and then every parameter (ParameterLayout's num_parameters), counted here in
    // double: a corrupt header can claim a model whose size does not fit in size_t (12 C^2 per layer with C
    // near 2^31, times 2^31 layers), and must still be refused by name. tensor_elements itself cannot
    // overflow for int dimensions (its largest product, 4 C^2, stays below 2^64). Exact below 2^53.
    double parameters = 0;
    for (int kind = 0; kind < NUM_TENSOR_KINDS; kind++)
        parameters += (double)tensor_elements(c, kind) * (tensor_kind_info(kind).per_layer ? c.num_layers : 1);
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
    if (c.num_layers != l.num_layers || c.num_heads != l.num_heads || c.channels != l.channels ||
        c.vocab_size != l.vocab_size || c.padded_vocab_size != l.padded_vocab_size || c.max_seq_len != l.max_seq_len)
        fatal("%s holds a model of another shape (layers %d, heads %d, channels %d, vocab %d) than the one it is "
              "read into (layers %d, heads %d, channels %d, vocab %d)", path.c_str(), c.num_layers, c.num_heads,
              c.channels, c.vocab_size, l.num_layers, l.num_heads, l.channels, l.vocab_size);
    FILE* file = open_file(path, "rb");
    fseek(file, 256 * sizeof(int), SEEK_SET);
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
    header[0] = kModelMagic;
    header[1] = kModelVersionFP32;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    const std::string temporary = path + ".tmp";
    FILE* file = open_file(temporary, "wb");
    write_exact(header, sizeof(int), 256, file, temporary);
    for_each_tensor_in_file_order(layout, [&](int, int, size_t offset, size_t count) {
        write_exact(values.data() + offset, sizeof(float), count, file, temporary);
    });
    close_file(file, temporary);
    if (rename(temporary.c_str(), path.c_str()) != 0) fatal("cannot rename %s to %s", temporary.c_str(), path.c_str());
}

// GPT-2's initialisation: weights ~ normal(0, 0.02), the two projections that write into the residual
// stream scaled down by 1/sqrt(2L) (so the stream's variance does not grow with depth), biases 0,
// layernorm weights 1. `normal` is a function returning standard normal samples. Padded wte rows stay 0.
template <class NormalSource>
std::vector<float> gpt2_initial_parameters(const ParameterLayout& layout, NormalSource&& normal) {
    const GPT2Config& c = layout.config;
    std::vector<float> values(layout.total, 0.0f);
    const float residual_std = 0.02f / sqrtf(2.0f * c.num_layers);
    for_each_tensor_in_file_order(layout, [&](int kind, int, size_t offset, size_t count) {
        if (kind == LN1W || kind == LN2W || kind == LNFW) {
            for (size_t i = 0; i < count; i++) values[offset + i] = 1.0f;
        } else if (tensor_kind_info(kind).is_matrix) {
            const float std = (kind == ATTPROJW || kind == FCPROJW) ? residual_std : 0.02f;
            const size_t used = kind == WTE ? (size_t)c.vocab_size * c.channels : count;
            for (size_t i = 0; i < used; i++) values[offset + i] = std * normal();
        }
    });
    return values;
}

// ----------------------------------------------------------------------------
// one block, forward and backward (N = B*T rows)
//
// Under tensor parallelism each rank runs the block on its heads and hidden units; tp_enter (f) and
// tp_leave (g) are where the ranks talk: all-reduces, or with sequence parallelism all-gathers and
// reduce-scatters (llmc/parallel/tensor_parallel.h). With one rank they do nothing and R = N.

inline void block_forward(const GPT2Config& c, const TensorParallel& tp, const ContextParallel& cp,
                          const BlockParams& p, const BlockActivations& a, SharedBuffers& s, const floatX* input,
                          int B, int T, cudaStream_t stream) {
    const int N = B * T, C = c.channels, R = tp_rows(tp, N);
    const int heads = c.num_heads / tp.size, attention = C / tp.size, hidden = 4 * C / tp.size;
    // x + attproj(attention(qkv(layernorm1(x)))): qkv column-parallel (this rank's heads), attproj row-parallel
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, input, p.ln1w, p.ln1b, R, C, stream);
    const floatX* ln1 = tp_enter(tp, a.ln1, s.gathered, N, C, stream);
    matmul_forward(a.qkv, ln1, p.qkvw, p.qkvb, N, C, 3 * attention, stream);
    cp_attention_forward(cp, a.atty, a.lse, a.qkv, B, T, attention, heads, stream);  // [cp ring or Ulysses]
    matmul_forward(s.projection, a.atty, p.attprojw, tp_row_parallel_bias(tp, p.attprojb), N, attention, C, stream);
    const floatX* attention_branch = tp_leave(tp, s.projection, N, C, stream);
    fused_residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, input, attention_branch, p.ln2w,
                                     p.ln2b, R, C, stream);
    // + fcproj(gelu(fc(layernorm2(.)))): fc column-parallel (this rank's hidden units), fcproj row-parallel
    const floatX* ln2 = tp_enter(tp, a.ln2, s.gathered, N, C, stream);
    matmul_forward(a.fch, ln2, p.fcw, p.fcb, N, C, hidden, stream);
    gelu_forward(a.fch_gelu, a.fch, (size_t)N * hidden, stream);
    matmul_forward(s.projection, a.fch_gelu, p.fcprojw, tp_row_parallel_bias(tp, p.fcprojb), N, hidden, C, stream);
    const floatX* mlp_branch = tp_leave(tp, s.projection, N, C, stream);
    residual_forward(a.output, a.residual2, mlp_branch, (size_t)R * C, stream);
}

// dresidual: in, the gradient of the block's output; out, the gradient of its input (this rank's R rows).
// The block's parameter gradients accumulate into g. The steps run the forward pass backwards.
inline void block_backward(const GPT2Config& c, const TensorParallel& tp, const ContextParallel& cp,
                           const BlockParams& p, const BlockParams& g, const BlockActivations& a, const floatX* input,
                           floatX* dresidual, SharedBuffers& s, int B, int T, cudaStream_t stream) {
    const int N = B * T, C = c.channels, R = tp_rows(tp, N);
    const int heads = c.num_heads / tp.size, attention = C / tp.size, hidden = 4 * C / tp.size;
    // output = residual2 + fcproj(gelu(fc(ln2))): dresidual is the gradient of both terms
    const floatX* dmlp = tp_leave_backward(tp, dresidual, s.gathered, N, C, stream);
    matmul_backward(s.dhidden, g.fcprojw, g.fcprojb, s.matmul_scratch, dmlp, a.fch_gelu, p.fcprojw, N, hidden, C,
                    stream);
    gelu_backward(s.dhidden, a.fch, s.dhidden, (size_t)N * hidden, stream);
    const floatX* ln2 = tp_enter(tp, a.ln2, s.gathered, N, C, stream);  // gathered again under SP
    matmul_backward_input(s.dchannels, s.dhidden, p.fcw, N, C, hidden, stream);
    const floatX* dln2 = tp_enter_backward(tp, s.dchannels, N, C, stream);  // summed beside the next line
    matmul_backward_weights(g.fcw, g.fcb, s.matmul_scratch, s.dhidden, ln2, N, C, hidden, stream);
    tp_join(tp, stream);
    layernorm_backward(dresidual, g.ln2w, g.ln2b, s.layernorm_scratch, dln2, a.residual2, p.ln2w, a.ln2_mean,
                       a.ln2_rstd, R, C, stream);
    // residual2 = input + attproj(attention(qkv(ln1))): dresidual is now the gradient of residual2
    const floatX* dattention = tp_leave_backward(tp, dresidual, s.gathered, N, C, stream);
    matmul_backward(s.dchannels, g.attprojw, g.attprojb, s.matmul_scratch, dattention, a.atty, p.attprojw, N,
                    attention, C, stream);
    cp_attention_backward(cp, s.dqkv, s.attention_D, s.dchannels, a.qkv, a.atty, a.lse, B, T, attention, heads,
                          stream);  // [cp ring or Ulysses]
    const floatX* ln1 = tp_enter(tp, a.ln1, s.gathered, N, C, stream);
    matmul_backward_input(s.dchannels, s.dqkv, p.qkvw, N, C, 3 * attention, stream);
    const floatX* dln1 = tp_enter_backward(tp, s.dchannels, N, C, stream);  // summed beside the next line
    matmul_backward_weights(g.qkvw, g.qkvb, s.matmul_scratch, s.dqkv, ln1, N, C, 3 * attention, stream);
    tp_join(tp, stream);
    layernorm_backward(dresidual, g.ln1w, g.ln1b, s.layernorm_scratch, dln1, input, p.ln1w, a.ln1_mean, a.ln1_rstd,
                       R, C, stream);
}

// Selective recomputation (llmc/parallel/recompute.h): the layernorm and GELU outputs block_backward needs, which
// the layer did not keep, computed again from what it kept: the same kernels on the same inputs, so the
// same bits (the statistics are written again with the values they had).
inline void block_recompute_selective(const GPT2Config& c, const TensorParallel& tp, const BlockParams& p,
                                      const BlockActivations& a, const floatX* input, int B, int T,
                                      cudaStream_t stream) {
    const int N = B * T, C = c.channels, R = tp_rows(tp, N), hidden = 4 * C / tp.size;
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, input, p.ln1w, p.ln1b, R, C, stream);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, R, C, stream);
    gelu_forward(a.fch_gelu, a.fch, (size_t)N * hidden, stream);
}

// ----------------------------------------------------------------------------
// the whole model

// Checks a batch's token ids before they index any table.
inline void check_token_ids(const int* tokens, size_t count, int vocab_size, const char* what) {
    for (size_t i = 0; i < count; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab_size)
            fatal("%s: token id %d at position %zu is outside the vocabulary [0, %d)", what, tokens[i], i, vocab_size);
}

// chunk c's parameters (0: embeddings, 1..L: blocks, L+1: final layernorm)
inline floatX* chunk_parameters(GPT2& model, int chunk) {
    return model.parameters_of ? model.parameters_of(chunk) : model.params + model.layout.chunk_start(chunk);
}

// What the backward pass does with each parameter chunk's gradient (chunk 0: embeddings, 1..L: blocks,
// L+1: final layernorm), for data parallelism and ZeRO (llmc/parallel/zero.h):
//   gradient_buffer(chunk)  where the chunk's gradient accumulates; asked just before the first write to
//                           it. Unset: its place in model.grads.
//   chunk_final(chunk)      called as soon as the chunk's gradient (of this microbatch) is complete: the
//                           final layernorm after the LM head's backward pass, each block after its own,
//                           the embeddings after the last of the lookup's and the LM head's shares (on
//                           one rank: in the order final layernorm, blocks L-1 .. 0, embeddings).
struct BackwardHooks {
    std::function<floatX*(int chunk)> gradient_buffer;
    std::function<void(int chunk)> chunk_final;
};

// A step of the model, in the pieces pipeline parallelism runs on different ranks (llmc/parallel/pipeline.h), each
// for one microbatch of B sequences of T tokens and one stage record:
//   first stage   gpt2_embed                    token ids -> record.input
//   every stage   gpt2_stage_forward            record.input -> the stage's blocks -> the last block's output
//   last stage    gpt2_head_forward, gpt2_loss  -> logits -> loss, and the logits replaced by dlogits
//                 gpt2_head_backward            -> record.doutput, the gradient of the last block's output
//   every stage   gpt2_stage_backward           record.doutput -> the gradient of record.input, in place
//   first stage   gpt2_embed_backward           -> the embeddings' gradients
// The loss's backward pass through the LM head runs right after the loss, in the forward part of the step:
// the logits are then used at once, and a record in flight keeps only doutput (R x C), not the logits
// (N x Vp). gpt2_forward and gpt2_backward put the pieces together for one rank that holds every layer.

// chunk c's gradient, where the hooks (llmc/parallel/zero.h) want it accumulated
inline floatX* gradients_of_chunk(GPT2& model, const BackwardHooks& hooks, int chunk) {
    return hooks.gradient_buffer ? hooks.gradient_buffer(chunk) : model.grads + model.layout.chunk_start(chunk);
}
inline void chunk_final(const BackwardHooks& hooks, int chunk) {
    if (hooks.chunk_final) hooks.chunk_final(chunk);
}

// First stage: x = wte[tokens] + wpe[positions] into record.input (tokens: host ids).
inline void gpt2_embed(GPT2& model, StageActivations& record, const int* tokens, int B, int T) {
    const GPT2Config& c = model.config;
    const int N = B * T, C = c.channels;
    if (B > model.max_batch || T > model.max_seq)
        fatal("batch %d x %d exceeds the allocated %d x %d", B, T, model.max_batch, model.max_seq);
    if (model.tp.sequence_parallel && N % model.tp.size != 0)
        fatal("sequence parallelism: %d x %d rows do not split over tp %d", B, T, model.tp.size);
    check_token_ids(tokens, N, c.vocab_size, "input batch");
    record.tokens.assign(tokens, tokens + N);
    staged_upload(model.inputs_upload, model.inputs, tokens, N, model.stream);
    floatX* embeddings = chunk_parameters(model, 0);  // wte (this rank's rows under tp), then wpe
    const floatX* wpe = embeddings + model.layout.offset(WPE);
    // the positions of the rows: one chunk of all T without context parallelism (llmc/parallel/context_parallel.h)
    const std::vector<SequenceChunk> chunks = cp_sequence_chunks(model.cp, B, T);
    if (model.tp.size > 1) {  // all rows at once: under SP a tp slice of the rows may cut across the chunks
        vocab_parallel_embedding_forward(model.tp, record.input, model.shared.projection, model.inputs, embeddings,
                                         wpe, chunks, B, T, C, c.padded_vocab_size, model.stream);
        return;
    }
    for (const SequenceChunk& chunk : chunks)
        encoder_forward(record.input + (size_t)chunk.first_row * C, model.inputs + chunk.first_row, embeddings,
                        wpe + (size_t)chunk.position * C, B, chunk.T, C, model.stream);
}

// The blocks first .. first + stage_layers - 1 on record.input.
inline void gpt2_stage_forward(GPT2& model, StageActivations& record, int first, int B, int T) {
    for (int i = 0; i < model.stage_layers; i++) {
        const floatX* input = i == 0 ? record.input : record.blocks[i - 1].output;
        block_forward(model.config, model.tp, model.cp,
                      block_params_in_chunk(chunk_parameters(model, first + i + 1), model.layout), record.blocks[i],
                      model.shared, input, B, T, model.stream);
    }
}

// Last stage: the final layernorm of the stage's output, then the logits (model.logits: N x Vp, or this
// tensor-parallel rank's N x Vp/tp columns).
inline void gpt2_head_forward(GPT2& model, const StageActivations& record, int B, int T) {
    const GPT2Config& c = model.config;
    const int N = B * T, C = c.channels, L = c.num_layers;
    floatX* final_layernorm = chunk_parameters(model, L + 1);  // lnfw, then lnfb
    layernorm_forward(model.lnf, model.lnf_mean, model.lnf_rstd, record.blocks.back().output, final_layernorm,
                      final_layernorm + C, tp_rows(model.tp, N), C, model.stream);
    // the LM head: column-parallel over the vocabulary (wte's rows), so f comes before it
    const floatX* lnf = tp_enter(model.tp, model.lnf, model.shared.gathered, N, C, model.stream);
    matmul_forward(model.logits, lnf, chunk_parameters(model, 0), nullptr, N, C, c.padded_vocab_size / model.tp.size,
                   model.stream);
}

// Forward pass of B sequences of T tokens (host ids) up to the logits, on a rank that holds every layer
// (record 0).
inline void gpt2_forward(GPT2& model, const int* inputs, int B, int T) {
    if (!model.first_stage || !model.last_stage) fatal("gpt2_forward needs every layer on this rank");
    StageActivations& record = model.records[0];
    gpt2_embed(model, record, inputs, B, T);
    gpt2_stage_forward(model, record, 0, B, T);
    gpt2_head_forward(model, record, B, T);
}

// Cross-entropy of the logits against `targets` (host ids). Adds the mean loss over the N positions to
// model.loss_sum on the device (gpt2_mean_loss, then gpt2_read_results, bring it to the host). Replaces
// the logits by dloss * dloss_i/dlogits, ready for gpt2_head_backward: dloss = 1 / (N * micro-steps) makes the
// accumulated gradient that of the mean loss over the whole batch.
inline void gpt2_loss(GPT2& model, const int* targets, int B, int T, float dloss) {
    const GPT2Config& c = model.config;
    const int N = B * T;
    check_token_ids(targets, N, c.vocab_size, "target batch");
    staged_upload(model.targets_upload, model.targets, targets, N, model.stream);
    if (model.tp.size == 1) {
        fused_classifier(model.logits, model.losses, dloss, model.targets, N, c.vocab_size, c.padded_vocab_size,
                         model.stream);
    } else {
        vocab_parallel_cross_entropy(model.tp, model.logits, model.losses, model.shared.softmax_stats, dloss,
                                     model.targets, N, c.vocab_size, c.padded_vocab_size, model.stream);
    }
    accumulate_mean_loss(model.loss_sum, model.losses, N, model.stream);
}

// model.results->loss = the mean of the `count` losses gpt2_loss added up since the last call.
inline void gpt2_mean_loss(GPT2& model, int count) {
    finish_mean_loss(&model.results->loss, model.loss_sum, count, model.stream);
}

// Last stage, after gpt2_loss: the loss's gradient through the LM head (its share of dwte) and the final
// layernorm into record.doutput. The final layernorm's gradient is then complete for this microbatch.
inline void gpt2_head_backward(GPT2& model, StageActivations& record, int B, int T, const BackwardHooks& hooks) {
    const GPT2Config& c = model.config;
    const TensorParallel& tp = model.tp;
    const int N = B * T, C = c.channels, R = tp_rows(tp, N), final_chunk = model.layout.num_chunks() - 1;
    SharedBuffers& s = model.shared;
    // logits = lnf @ wte^T: the LM head's share of dwte, and the gradient of lnf (f's backward sums the
    // tp ranks' shares of it)
    floatX* embedding_grads = gradients_of_chunk(model, hooks, 0);  // wte, then wpe
    const floatX* lnf = tp_enter(tp, model.lnf, s.gathered, N, C, model.stream);
    const int vocab_columns = c.padded_vocab_size / tp.size;
    matmul_backward_input(s.dchannels, model.logits, chunk_parameters(model, 0), N, C, vocab_columns, model.stream);
    const floatX* dlnf = tp_enter_backward(tp, s.dchannels, N, C, model.stream);  // summed beside the next line
    matmul_backward_weights(embedding_grads, nullptr, s.matmul_scratch, model.logits, lnf, N, C, vocab_columns,
                            model.stream);
    tp_join(tp, model.stream);
    // lnf = layernorm(x_L): the residual stream's gradient starts here
    floatX* final_grads = gradients_of_chunk(model, hooks, final_chunk);  // lnfw, then lnfb
    cudaCheck(cudaMemsetAsync(record.doutput, 0, (size_t)R * C * sizeof(floatX), model.stream));
    layernorm_backward(record.doutput, final_grads, final_grads + C, s.layernorm_scratch, dlnf,
                       record.blocks.back().output, chunk_parameters(model, final_chunk), model.lnf_mean,
                       model.lnf_rstd, R, C, model.stream);
    chunk_final(hooks, final_chunk);
}

// The stage's blocks backwards: record.doutput, the gradient of the stage's output, becomes the gradient of
// its input; each block's parameter gradients accumulate and its chunk is reported final. Last block first,
// in segments (llmc/parallel/recompute.h): under full recomputation a segment's forward passes run again from its
// checkpoint (the output kept before it, or the stage's input) to refill the shared records; under
// selective each block first recomputes its layernorm and GELU outputs; otherwise a segment is a block.
inline void gpt2_stage_backward(GPT2& model, StageActivations& record, int first, int B, int T,
                                const BackwardHooks& hooks) {
    const GPT2Config& c = model.config;
    const ParameterLayout& layout = model.layout;
    const Recompute& recompute = model.recompute;
    const int layers = model.stage_layers, segment = recompute_segment(recompute, layers);
    auto input_of = [&](int i) -> const floatX* { return i == 0 ? record.input : record.blocks[i - 1].output; };
    auto params_of = [&](int i) { return block_params_in_chunk(chunk_parameters(model, first + i + 1), layout); };
    for (int start = (layers - 1) / segment * segment; start >= 0; start -= segment) {
        const int end = std::min(start + segment, layers);
        if (recompute.policy == RecomputePolicy::Full)
            for (int i = start; i < end; i++)
                block_forward(c, model.tp, model.cp, params_of(i), record.blocks[i], model.shared, input_of(i), B, T,
                              model.stream);
        for (int i = end - 1; i >= start; i--) {
            const BlockParams params = params_of(i);
            if (recompute.policy == RecomputePolicy::Selective)
                block_recompute_selective(c, model.tp, params, record.blocks[i], input_of(i), B, T, model.stream);
            const int chunk = first + i + 1;
            block_backward(c, model.tp, model.cp, params,
                           block_params_in_chunk(gradients_of_chunk(model, hooks, chunk), layout), record.blocks[i],
                           input_of(i), record.doutput, model.shared, B, T, model.stream);
            chunk_final(hooks, chunk);
        }
    }
}

// First stage: the embeddings' gradients from record.doutput (the gradient of block 0's input). Whether
// the embedding chunk is then final depends on the LM head's share, so the caller reports it.
inline void gpt2_embed_backward(GPT2& model, const StageActivations& record, int B, int T,
                                const BackwardHooks& hooks) {
    const GPT2Config& c = model.config;
    const int C = c.channels;
    SharedBuffers& s = model.shared;
    floatX* embedding_grads = gradients_of_chunk(model, hooks, 0);  // wte, then wpe
    floatX* dwpe = embedding_grads + model.layout.offset(WPE);
    const std::vector<SequenceChunk> chunks = cp_sequence_chunks(model.cp, B, T);
    if (model.tp.size > 1) {  // every row's gradient first (gathered under SP), then chunk by chunk
        vocab_parallel_embedding_backward(model.tp, embedding_grads, dwpe, &s.encoder_workspace, record.doutput,
                                          s.gathered, record.tokens.data(), chunks, B, T, C, c.padded_vocab_size,
                                          model.stream);
        return;
    }
    for (const SequenceChunk& chunk : chunks)
        encoder_backward(embedding_grads, dwpe + (size_t)chunk.position * C, &s.encoder_workspace,
                         record.doutput + (size_t)chunk.first_row * C, record.tokens.data() + chunk.first_row, B,
                         chunk.T, C, model.stream);
}

// Backward pass after gpt2_forward + gpt2_loss on the same batch, on a rank that holds every layer;
// gradients accumulate (+=).
inline void gpt2_backward(GPT2& model, int B, int T, const BackwardHooks& hooks = {}) {
    StageActivations& record = model.records[0];
    gpt2_head_backward(model, record, B, T, hooks);
    gpt2_stage_backward(model, record, 0, B, T, hooks);
    gpt2_embed_backward(model, record, B, T, hooks);
    chunk_final(hooks, 0);
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
    cudaCheck(cudaMemcpyAsync(model.results_host, model.results, sizeof(StepResults), cudaMemcpyDeviceToHost,
                              model.stream));
    cudaCheck(cudaStreamSynchronize(model.stream));
    return *model.results_host;
}
