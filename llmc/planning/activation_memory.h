/*
Activation memory, by arithmetic: the exact sizes of the buffers gpt2_allocate makes for micro-batches of B x T
(llmc/model/gpt2.cuh), for GPT-2's block or Llama's, split into what the forward pass keeps for the backward pass
("activations") and the buffers every layer reuses ("workspace"); gpt2_activation_bytes below sets out the count
term by term. Two small scratch buffers are sized by the device's multiprocessor count, which the shape
(GPT2MemoryShape) carries so that the plan needs no device. Not counted: cuBLASLt's 32 MiB workspace (GPU build),
NCCL's own buffers, and the CUDA context (a few hundred MiB that no allocation call sees).

The memory plan (llmc/planning/memory_plan.h) adds these to the model state; the per-layer count is set beside
Table 2 of Korthikanti et al. (2022) in llmc/planning/korthikanti_table2.h.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "../cuda_common.cuh"
#include "../model/parameters.h"
#include "../model/gpt2.cuh"
#include "../parallel/recompute.h"
#include "../parallel/layout.h"
#include "../parallel/context_parallel.h"
#include "../utils.h"

// ----------------------------------------------------------------------------
// the shape of a run: what the formulas need to know of it

struct GPT2MemoryShape {
    int num_layers = 0;        // L
    int channels = 0;          // C
    int num_heads = 0;         // NH
    int padded_vocab = 0;      // Vp
    int max_seq_len = 0;       // rows of wpe (only stage 2-3 working buffers need it)
    int batch = 0;             // B: the micro-batch
    int seq_len = 0;           // T
    int multiprocessors = 132; // sizes two scratch buffers; 132 = H100 SXM (device_properties() at run time)
    int step_results = 2;      // floats of the step's results: 3 with the noise scale's small batch
    int tp = 1;                // tensor-parallel ranks (llmc/parallel/tensor_parallel.h)
    bool sequence_parallel = false;
    Recompute recompute;       // what the forward pass keeps (llmc/parallel/recompute.h)
    // pipeline parallelism (llmc/parallel/pipeline.h): this rank's stages and records in flight
    int stage_layers = 0;      // the most layers of any of this rank's stages (0: all L, one stage)
    int records = 1;           // stage records kept at once (the schedule's microbatches in flight)
    int weight_records = 0;    // weight-gradient records kept at once (schedules that split the backward pass)
    int outboxes = 0;          // input gradients kept for sends held back (llmc/parallel/pipeline_simulator.h)
    int heads = 1;             // head records kept at once on the last stage (schedules that split the backward)
    bool first_stage = true;   // holds the embeddings' lookup
    bool last_stage = true;    // holds the final layernorm, the LM head and the loss
    // context parallelism (llmc/parallel/context_parallel.h): seq_len is then the T/cp positions a rank holds
    int cp = 1;                // ranks that split every sequence
    bool cp_ring = true;       // ring attention (else Ulysses)
    int cp_chunks = 2;         // chunks of the sequence per cp rank: 2 zigzag, 1 contiguous
    // the block (llmc/model/forward_backward.cuh): GPT-2's, or Llama's RMSNorm (no mean kept), SwiGLU (fc gives
    // 2 H values per row) and grouped-query attention (kv_heads K and V heads)
    bool llama = false;
    int kv_heads = 0;          // 0: num_heads
    int ffn_hidden = 0;        // H, the MLP's hidden units; 0: 4 C (a mixture of experts: the shared experts')
    // a mixture of experts (llmc/model/moe.cuh): E experts of He hidden units each, K per token
    int experts = 0, experts_per_token = 0, expert_hidden = 0;
    int moe_every = 1;         // ... in every moe_every-th block (the others dense, of expert_hidden units)
    int mixture_slots = -1;    // layers of a stage record with a mixture's buffers (ModelPart's; -1: all)
    std::vector<char> mixture_slot;  // per position of a stage record, whether it has them (empty: as mixture_slots
                                     // says, all or none; only per-block recomputation needs to know which)
    int ep = 1;                // expert parallelism: this rank's experts run the rows of ep ranks
    float capacity_factor = 0; // ... at most moe_expert_rows of them (llmc/model/parameters.h)
};

// What the formulas need to know of a run, from its layout (for the plan, and beside the memory a run
// held): the micro-batch of B x T/cp rows a rank holds, and `part`, a pipeline rank's part of the model.
inline GPT2MemoryShape gpt2_memory_shape(const GPT2Config& config, const Layout& layout, const ModelPart& part) {
    GPT2MemoryShape shape{config.num_layers, config.channels, config.num_heads, config.padded_vocab_size,
                          config.max_seq_len, layout.batch_size, layout.seq_len / layout.cp, layout.multiprocessors};
    shape.tp = layout.tp;
    shape.sequence_parallel = layout.sequence_parallel;
    shape.recompute = layout.recompute;
    shape.step_results = layout.noise_scale ? 3 : 2;
    shape.stage_layers = part.stage_layers;
    shape.records = part.records;
    shape.weight_records = part.weight_records;
    shape.outboxes = part.outboxes;
    shape.heads = part.heads;
    shape.first_stage = part.held_chunks[1];
    shape.last_stage = part.held_chunks[config.num_layers];
    shape.cp = layout.cp;
    shape.cp_ring = layout.cp_mode == ContextParallelMode::Ring;
    shape.cp_chunks = cp_chunks_per_rank(layout.cp_split);
    shape.llama = config.llama();
    shape.kv_heads = config.kv_heads;
    shape.ffn_hidden = (int)config.hidden();
    shape.experts = config.experts;
    shape.ep = layout.ep;
    shape.capacity_factor = layout.capacity_factor;
    shape.experts_per_token = config.experts_per_token;
    shape.expert_hidden = config.moe() ? (int)config.expert_hidden() : 0;
    shape.moe_every = config.moe_every;
    const int positions = part.stage_layers > 0 ? part.stage_layers : config.num_layers;
    shape.mixture_slots = part.mixture_slots(config, positions);
    if (shape.recompute.policy == RecomputePolicy::PerBlock && config.moe())
        for (int slot = 0; slot < positions; slot++) shape.mixture_slot.push_back(part.slot_has_mixture(config, slot));
    // --offload activations' letters (the layout's, checked against the longest stage where it was made, hold at
    // least this rank's positions)
    if (shape.recompute.policy == RecomputePolicy::PerBlock && shape.recompute.blocks.empty())
        shape.recompute.blocks.assign(positions, BlockKeep::Offload);
    if (shape.recompute.policy == RecomputePolicy::PerBlock && (int)shape.recompute.blocks.size() < positions)
        fatal("--recompute-blocks %s: %zu letters for stage records of %d blocks", recompute_blocks_text(shape.recompute.blocks).c_str(),
              shape.recompute.blocks.size(), positions);
    return shape;
}

// The model shape a memory shape describes (for the parameter chunks' sizes; the vocabulary is its padded size).
inline GPT2Config gpt2_memory_shape_config(const GPT2MemoryShape& shape) {
    GPT2Config c;
    c.arch = shape.llama ? Arch::Llama : Arch::GPT2;
    c.num_layers = shape.num_layers;
    c.channels = shape.channels;
    c.num_heads = shape.num_heads;
    c.kv_heads = shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads;
    c.experts = shape.experts;
    c.experts_per_token = shape.experts_per_token;
    if (c.moe() && c.llama()) c.ffn_hidden = shape.expert_hidden;
    else c.ffn_hidden = shape.llama ? shape.ffn_hidden : 0;
    if (c.moe()) c.shared_experts = shape.ffn_hidden / shape.expert_hidden, c.moe_every = shape.moe_every;
    c.vocab_size = c.padded_vocab_size = shape.padded_vocab;
    c.max_seq_len = shape.max_seq_len;
    return c;
}

// ----------------------------------------------------------------------------
// the bytes, buffer by buffer as gpt2_allocate makes them

// One layer's terms that per-block recomputation's bytes are made of (block_keep_bytes below): its whole record
// without a mixture's buffers, those buffers (0 without experts), what selective recomputes (ln1, ln2, fch_gelu)
// and the block's output R C s.
struct BlockKeepTerms { double record = 0, mixture = 0, dropped = 0, output = 0; };

struct ActivationBytes {
    BlockKeepTerms block;    // the terms of block_keep_bytes (whatever the policy; llmc/planning/recompute_choice.h)
    double record = 0;       // one block's whole activation record (what recompute none keeps per layer; a
                             // mixture's buffers included, where the model has experts)
    double per_layer = 0;    // what the forward pass keeps per layer under the recompute policy (full: per
                             // layer on average, ceil(l/C) checkpoints / l for l layers per stage)
    double kept_layers = 0;  // one stage record's layers' kept activations
    double recompute = 0;    // the records the layers share under recomputation (part of the workspace)
    double weight_record = 0;  // one block's weight-gradient record (schedules that split the backward pass; on
                               // average over a record's layers, where only some carry a mixture's buffers)
    double activations = 0;  // the stage records (kept_layers, input, doutput each), the weight-gradient
                             // records (l blocks each) + the final layernorm, logits, losses, token ids
    double workspace = 0;    // the buffers every layer reuses, gradients of activations included
    double host = 0;         // pinned host memory: the offloaded blocks' records (per-block recomputation)
};

// Whether position `slot` of the shape's stage records carries a mixture's buffers.
inline bool gpt2_slot_has_mixture(const GPT2MemoryShape& shape, int slot) {
    return shape.experts > 0 && (shape.mixture_slot.empty() || shape.mixture_slot[slot]);
}

// Per-block recomputation (llmc/parallel/recompute.h's BlockKeep), one position of a stage record: what it keeps on
// the device and in pinned host memory, and the workspace the kinds in use add (their shared buffers). Terms of
// gpt2_activation_bytes below: `record` one layer's whole record without a mixture's buffers, `mixture` those,
// `dropped` what selective recomputes, `output` the block's output R C s.
struct BlockKeepBytes { double device = 0, host = 0; };
inline BlockKeepBytes block_keep_bytes(BlockKeep keep, double record, double mixture, double dropped, double output) {
    switch (keep) {
        case BlockKeep::Keep: return {record + mixture, 0};
        case BlockKeep::Selective: return {record - dropped + mixture, 0};
        case BlockKeep::Full: return {output, 0};
        case BlockKeep::Offload: return {output, record - output + mixture};
    }
    return {};
}
// used[k]: whether some position keeps BlockKeep k; `mixture` a mixture's buffers if the model has experts
// (full's shared record and offload's staging carry them whenever the model has experts)
inline double block_keep_workspace_bytes(const bool used[kNumBlockKeeps], double record, double mixture,
                                         double dropped, double output) {
    double bytes = 0;
    if (used[(int)BlockKeep::Selective]) bytes += dropped;                            // shared ln1, ln2, fch_gelu
    if (used[(int)BlockKeep::Full]) bytes += record + mixture - output;               // one shared record
    if (used[(int)BlockKeep::Offload]) bytes += 2 * (record + mixture - output);      // two staging records
    return bytes;
}

// With N = B*T rows, s = sizeof(floatX), f = 4 (fp32 statistics), i = 4 (int), and under tensor
// parallelism over t ranks (t = 1 without): a rank's attention channels c = C/t, heads h = NH/t, qkv columns
// q = (NH + 2 KV) HS / t for KV K/V heads of HS channels (GPT-2: KV = NH, q = 3c), hidden units H = 4C/t
// (Llama: its ffn_hidden / t), fc's output columns F = H (GELU) or 2H (SwiGLU: gate and up), vocabulary
// columns v = Vp/t, and rows of the residual stream R = N/t under sequence parallelism (else R = N); n = 4
// norm statistics per row (LayerNorm's mean and rstd, twice) or 2 (RMSNorm keeps rstd only); l layers per
// stage (L without pipeline parallelism), K stage records:
//   per layer: floatX ln1, residual2, ln2, output 4RC; qkv Nq, atty Nc; fch NF, fch_gelu NH
//              (GPT-2, t = 1: 16 NC s);  fp32 norm statistics nR, attention lse N h
//              selective recomputation keeps all but ln1, ln2 (RC each) and fch_gelu (NH), which one
//              shared copy serves; full recomputation with a checkpoint every C blocks keeps ceil(l/C)
//              outputs (RC) and shares min(C, l) whole records less one output (llmc/parallel/recompute.h)
//   a record:  its l layers, and floatX input, doutput 2RC
//   a weight-gradient record (W of them, schedules that split the backward pass into B and W), per layer:
//              the four matmuls' inputs as the weight gradient reads them (gathered: N rows) and their output
//              gradients, floatX ln1, ln2, dattention, dmlp 4NC, atty Nc, dqkv Nq, fch_gelu NH, dhidden NF, and
//              the norm gradients 4C (GPT-2, t = 1: (16 NC + 4C) s), whatever the recompute policy (copies)
//   model:     K records, W weight-gradient records of l layers; the last stage's E head records (floatX lnf
//              RC, logits N v, fp32 lnf mean/rstd 2R each: one, or under a split backward as many as its
//              microbatches between F and W), fp32 losses N, int targets N; the first stage's int inputs N
//   workspace: floatX projection NC, dchannels NC, dhidden NF, SwiGLU's dactivation NH (GELU's is dhidden),
//              dqkv Nq, and under sequence parallelism the gathered rows NC (GPT-2, t = 1: 9 NC s);
//              fp32 attention_D N h, the vocabulary-parallel loss's statistics 4N (t > 1, last stage),
//              matmul bias scratch ceil(N/64) max(C, F, q), layernorm scratch 2C min(ceil(R/8), 3 SMs), norm
//              scratch 4 SMs, the step's results 2 (loss, squared norm; 3 with the noise scale's small batch), Llama's RoPE frequencies hs/2, the first stage's encoder partial
//              rows (floor(N/64) + floor(N/65)) C and int encoder workspace 4N + 3 floor(N/65); the running
//              loss sum, one double;
//              under context parallelism (cp > 1): ring attention's K/V blocks and their gradients, two of
//              each, of the K/V heads only, 8 N kv (kv = KV HS / t, GPT-2: c), and one chunk's partial output
//              (N/k) c and lse (N/k) h, k the chunks per rank; or Ulysses' two messages 2 N q and the
//              head-sharded output and its gradient 2 N c
//   a mixture of experts (E experts, K per token, M = N K assignments, He hidden units per expert, Fe = He
//   or 2 He; H and F above are then the shared experts'; the experts are whole on every tp rank, which routes
//   N/t of the rows, but the records are sized for all N; with a mixture every N > 1 blocks, every layer of a
//   record is sized for either block's MLP, H = max(S He, He), and only the layers where one of the rank's
//   stages has a mixture carry the buffers below, `mixture_slots` of the l, each of the full recomputation's
//   shared records too):
//   per layer: floatX expert_input, expert_output 2 MC, expert_fch M Fe, expert_act M He; fp32 router_probs
//              NE, router_lse N, routed_weights M; int routed_experts, routed_slots 2M, routed_counts kBE (k the
//              pieces of a sequence a cp rank holds, below; 1 without cp)
//              (whatever the recompute policy keeps of a layer, it keeps these whole or not at all)
//   workspace: floatX router_logits NE, routed_output NC, expert_doutput MC, expert_dfch M Fe, SwiGLU's
//              expert_dact M He; fp32 router_dprobs NE, routed_dweights M, statistics 3 + L E (the loss sums
//              and the log's counts, L the model's layers); int expert_rows E, and under cp with a capacity
//              capacity_left kBE
//   under expert parallelism (G = ep ranks; llmc/parallel/expert_parallel.h) this rank's experts may run
//   the rows of its whole group, Mr = G M, or with a capacity of c rows per sequence and expert at most
//   G B (E/G) c of them (moe_expert_rows): expert_input, expert_fch, expert_act, expert_doutput, expert_dfch
//   and expert_dact hold Mr rows (expert_output stays M: this rank's own rows); a weight-gradient record's
//   layer adds floatX expert_input, expert_doutput 2 Mr C, expert_dfch Mr Fe, expert_act Mr He, router_input
//   NC and router_dlogits NE (host: expert_rows G E, not counted); and the rows in transit take
//   expert_dispatch MC and expert_exchange Mr C of workspace (host: expert_rows G E, not counted)
// (the constants 64, 8, 3 and 4 are those of llmc/kernels/matmul.cuh, layernorm.cuh and cuda_common.cuh's
// grid_size_for, 64 and 65 = 64 + 1 those of llmc/kernels/encoder.cuh; pinned host staging and read-back buffers
// are host memory and not counted)
inline ActivationBytes gpt2_activation_bytes(const GPT2MemoryShape& shape, bool bf16) {
    const double s = bf16 ? 2 : 4, f = 4, i = 4;
    const double t = shape.tp, N = (double)shape.batch * shape.seq_len, C = shape.channels;
    const double c = C / t, h = shape.num_heads / t, R = shape.sequence_parallel ? N / t : N;
    const double KV = shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads;
    const double q = (shape.num_heads + 2 * KV) * (C / shape.num_heads) / t;
    const bool moe = shape.experts > 0;
    // a record's layers are sized for the widest MLP: with a mixture every N > 1 blocks, a dense block's He too
    const double H = (moe && shape.moe_every > 1 ? std::max(shape.ffn_hidden, shape.expert_hidden)
                      : shape.ffn_hidden > 0 || moe ? shape.ffn_hidden : 4 * C) / t;
    const double F = shape.llama ? 2 * H : H;
    const double E = shape.experts, M = N * shape.experts_per_token, He = shape.expert_hidden, G = shape.ep;
    const double pieces = shape.cp > 1 ? shape.cp_chunks : 1;
    const GPT2Config shape_config = gpt2_memory_shape_config(shape);
    const double Mr = moe ? (double)moe_expert_rows(shape_config, shape.batch, shape.seq_len, shape.ep,
                                                    moe_capacity(shape_config, shape.capacity_factor,
                                                                 shape.seq_len * shape.cp)) : 0;
    const double Fe = shape.llama ? 2 * He : He;
    const double n = shape.llama ? 2 : 4;
    const double l = shape.stage_layers > 0 ? shape.stage_layers : shape.num_layers, K = shape.records;
    const double v = shape.padded_vocab / t, SMs = shape.multiprocessors;
    ActivationBytes a;
    a.record = (4 * R * C + N * q + N * c + N * F + N * H) * s + (n * R + N * h) * f;
    // a mixture's buffers, on the layers of a record that may run one (all of them, or with a mixture every N > 1
    // blocks those where one of the rank's stages has one: `mixture_slots` of the l)
    const double mixture = moe ? (Mr * C + M * C + Mr * Fe + Mr * He) * s + (N * E + N + M) * f +
                                     (2 * M + pieces * shape.batch * E) * i : 0;
    const double mixtures = shape.mixture_slots >= 0 ? shape.mixture_slots : l;
    const double dropped = (2 * R * C + N * H) * s;  // selective: ln1, ln2, fch_gelu
    a.block = {a.record, mixture, dropped, R * C * s};
    switch (shape.recompute.policy) {
        case RecomputePolicy::None:
            a.kept_layers = l * a.record + mixtures * mixture;
            break;
        case RecomputePolicy::Selective:
            a.kept_layers = l * (a.record - dropped) + mixtures * mixture;
            a.recompute = dropped;
            break;
        case RecomputePolicy::Full: {  // the shared records serve every layer: a mixture's buffers in each
            const double segment = std::min((double)shape.recompute.every, l);
            a.kept_layers = std::ceil(l / segment) * R * C * s;
            a.recompute = segment * (a.record + mixture) - R * C * s;
            break;
        }
        case RecomputePolicy::PerBlock: {
            bool used[kNumBlockKeeps] = {};
            for (int slot = 0; slot < (int)l; slot++) {
                const BlockKeep keep = shape.recompute.blocks.at(slot);
                const bool has_mixture = gpt2_slot_has_mixture(shape, slot);
                const BlockKeepBytes bytes = block_keep_bytes(keep, a.record, has_mixture ? mixture : 0, dropped, R * C * s);
                a.kept_layers += bytes.device;
                a.host += K * bytes.host;
                used[(int)keep] = true;
            }
            a.recompute = block_keep_workspace_bytes(used, a.record, mixture, dropped, R * C * s);
            break;
        }
        default: fatal("gpt2_activation_bytes: recompute %s: choose the blocks first", recompute_describe(shape.recompute).c_str());
    }
    a.record += mixture;
    a.per_layer = a.kept_layers / l;
    const double weight_mixture = moe ? (2 * Mr * C + Mr * Fe + Mr * He + N * C + N * E) * s : 0;
    a.weight_record = (4 * N * C + N * c + N * q + N * H + N * F + 4 * C) * s + mixtures / l * weight_mixture;
    const double head = shape.last_stage ? shape.heads * ((R * C + N * v) * s + 2 * R * f) + N * f + N * i : 0;
    a.activations = K * (a.kept_layers + 2 * R * C * s) +
                    shape.weight_records * l * a.weight_record + head +
                    shape.outboxes * R * C * s + (shape.first_stage ? N * i : 0);
    const double bias_rows = std::ceil(N / 64), layernorm_blocks = std::min(std::ceil(R / 8), 3 * SMs);
    const double encoder_heavy_tokens = std::floor(N / 65);
    const double encoder_partial_rows = std::floor(N / 64) + encoder_heavy_tokens;
    const double gathered = shape.sequence_parallel ? N * C : 0;
    const double softmax_stats = t > 1 && shape.last_stage ? 4 * N : 0;
    const double encoder = shape.first_stage ? encoder_partial_rows * C * f + (4 * N + 3 * encoder_heavy_tokens) * i : 0;
    const double k = shape.cp_chunks;
    const double kv = KV * (C / shape.num_heads) / t;  // a tp rank's K (or V) columns
    const double context = shape.cp == 1 ? 0 : shape.cp_ring ? 8 * N * kv * s + N / k * (c * s + h * f)
                                                             : 2 * N * q * s + 2 * N * c * s;
    const double dactivation = shape.llama ? N * H : 0;
    const double rope_frequencies = shape.llama ? C / shape.num_heads / 2 : 0;  // hs/2 fp32, once per model
    const double in_transit = G > 1 ? M * C + Mr * C : 0;
    const double capacity_left = shape.cp > 1 && shape.capacity_factor > 0 ? pieces * shape.batch * E : 0;
    const double experts = moe ? (N * E + N * C + Mr * C + Mr * Fe + (shape.llama ? Mr * He : 0) + in_transit) * s +
                                 (N * E + M + 3 + shape.num_layers * E) * f + (E + capacity_left) * i : 0;
    a.workspace = experts + (2 * N * C + N * F + dactivation + N * q + gathered) * s +
                  (N * h + rope_frequencies + softmax_stats + bias_rows * std::max({C, F, q}) + 2 * C * layernorm_blocks + 4 * SMs + shape.step_results) * f +
                  encoder + sizeof(double) + a.recompute + context;
    return a;
}
