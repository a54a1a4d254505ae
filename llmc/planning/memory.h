/*
Device memory: what a training run will need (the plan), by arithmetic. What the program holds is booked
in llmc/device_memory.h (tracked_alloc), beside which train_gpt's report prints these formulas.

The plan. plan_training_memory is arithmetic only: it allocates nothing and needs no GPU, so it can
answer "does this model fit with this layout?" for any size, and print_memory_plan shows the answer:
    MemoryPlan plan = plan_training_memory(num_parameters, zero_stage, data_parallel_ranks, shard_ranks,
                                           bf16, accumulation_steps, &shape);   // shape may be null
    print_memory_plan(plan);

Model state, bytes per rank, for P parameters (Rajbhandari et al., "ZeRO", 2020), with N = shard_ranks,
the size of the group that splits one copy of the state:
    BF16 (mixed precision): bf16 parameters (2), bf16 gradients (2), fp32 master weights + AdamW m + v (12)
        stage 0:  2P + 2P + 12P          = 16 P
        stage 1:  2P + 2P + 12P/N
        stage 2:  2P + (2P + 12P)/N
        stage 3:  (2P + 2P + 12P)/N      = 16 P / N
    FP32: fp32 parameters (4), gradients (4), m + v (8); the parameters are their own master copy
        stage 0:  16 P;   stage 1: 4P + 4P + 8P/N;   stage 2: 4P + 12P/N;   stage 3: 16 P / N
Stage 0 keeps everything on every rank, so shard_ranks does not matter there (llmc/parallel/zero.h shards over
one rank at stage 0 too). P is whatever the caller passes: the model's parameter count leaves out the
zero padding that makes every chunk a multiple of 128 N elements; ParameterLayout(config, N).total
includes it (every formula is linear in P, so the difference is the padding's share, under 128 N elements
per chunk).
With a model shape the plan also counts the buffers llmc/parallel/zero.h keeps beyond the paper's formula:
  stage 1: the averaged gradient shard, s P/N, that the full gradient is reduce-scattered into;
  stages 2, 3: the working buffers chunk gradients are computed in before they are reduce-scattered (the
           embedding chunk, two block chunks and the final chunk, padded as ParameterLayout pads them; a
           pipeline rank only those of the chunks it holds) and one largest shard that receives a reduce-scatter;
  stage 3: as many again for the gathered parameters of the chunks being worked on.
Optimizer offload (--offload optimizer, llmc/parallel/zero.h): the optimizer state above (12 P or 8 P, / N from
stage 1) moves to pinned host memory, counted apart as host bytes; the device keeps, with a model shape, its two
staging slots of one piece each (offload_piece_elements: one block chunk's shard, at most 16M elements), for the
master weights (BF16 build), m and v:  2 x piece x 12 bytes (BF16) or 2 x piece x 8 bytes (FP32).

Communication, bytes this rank sends per optimizer step under the ring algorithms whose counts
llmc/parallel/comm.h keeps (s = bytes per element of the communicated data: gradients and parameters travel as
floatX, so 2 in BF16 and 4 in FP32; D = data_parallel_ranks; M = D / N replica groups; A = micro-steps
per step, i.e. gradient accumulation):
    stage 0:  2 (D-1)/D * P s                  all-reduce of the gradients once, after the last micro-step
    stage 1:  2 (N-1)/N * P s                  reduce-scatter of the gradients (last micro-step) and
                                               all-gather of the updated parameters
    stage 2:  (A+1) (N-1)/N * P s              a reduce-scatter on EVERY micro-step (there is no full
                                               gradient buffer to accumulate in), then the all-gather
    stage 3:  3 A (N-1)/N * P s                per micro-step: all-gather the parameters for the forward
                                               pass, again for the backward pass, and reduce-scatter the
                                               gradients (an upper bound: llmc/parallel/zero.h skips the gather of
                                               a chunk still held from the forward pass, a few chunks)
  plus, at stages 1-3 with M > 1 groups (HSDP), the all-reduce of this rank's gradient shard between the
  M ranks holding the same shard, once per step:  2 (M-1)/M * (P/N) s.
With A = 1, stages 0-2 send the same 2 (N-1)/N P s and stage 3 half as much again, as the paper says.
comm.h rounds each call down to whole bytes; the plan does not (a few bytes per call).

Activations (optional; GPT-2's block or Llama's): the exact sizes of the buffers gpt2_allocate makes for micro-batches
of B x T (llmc/model/gpt2.cuh), see gpt2_activation_bytes below, split into what the forward pass keeps for the
backward pass ("activations") and the buffers every layer reuses ("workspace"). Two small scratch
buffers are sized by the device's multiprocessor count, which the shape carries so that the plan needs
no device. Not counted: cuBLASLt's 32 MiB workspace (GPU build), NCCL's own buffers, and the CUDA
context (a few hundred MiB that no allocation call sees). korthikanti_table2 sets the per-layer count beside
Table 2 of Korthikanti et al. (2022), or for a Llama shape beside that table adapted to Llama's block, corrected
term by term for these kernels, and print_korthikanti_table2 shows the two side by side (--plan prints it).
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "../cuda_common.cuh"
#include "../device_memory.h"
#include "../model/parameters.h"
#include "../model/gpt2.cuh"
#include "../parallel/recompute.h"
#include "../parallel/layout.h"
#include "../parallel/parallel_context.h"
#include "../io/logger.h"
#include "../utils.h"

// ----------------------------------------------------------------------------
// activations of GPT-2, counted buffer by buffer as gpt2_allocate makes them

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

// ----------------------------------------------------------------------------
// the per-layer activations against Korthikanti et al. 2022, Table 2

/*
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), count the bytes
one transformer layer keeps for the backward pass in 2-byte (fp16) numbers, with s the sequence length, b
the micro-batch, h the hidden size, a the heads and t the tensor-parallel ranks. Their Table 2:
    no parallelism                          sbh (34 + 5as/h)
    tensor parallel                         sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel              sbh/t (34 + 5as/h)
    tensor parallel + selective             sbh (10 + 24/t)
    tensor + sequence parallel + selective  sbh/t 34
    full recomputation                      2 sbh
Their 34 sbh + 5 a s^2 b, term by term, and the buffer of BlockActivations (llmc/model/gpt2.cuh) that holds the
same thing here (N = b s rows, C = h, R = N rows or N/t under sequence parallelism):
    attention  QKV input 2sbh                         ln1 (R, C)          replicated over tp (their 10)
               Q, K (4sbh) + V (2sbh)                 qkv (N, 3C/t)       split over tp (their 24)
               softmax output 2as^2b, its dropout     -- flash attention keeps none of the s x s matrices,
               mask as^2b, the dropout output 2as^2b     only the fp32 log-sum-exp lse, 4asb/t
               output projection input 2sbh           atty (N, C/t)       split
               dropout mask after the projection sbh  -- no dropout here (replicated in their 10)
    MLP        fc input 2sbh                          ln2 (R, C)          replicated
               GELU input 8sbh                        fch (N, 4C/t)       split
               fc projection input 8sbh               fch_gelu (N, 4C/t)  split
               dropout mask after the projection sbh  -- no dropout here (replicated)
    layernorms their inputs 4sbh                      residual2 (ln2's input) and output (the next layer's
                                                      ln1 input), (R, C) each; replicated
               (statistics: not in their count)       ln1 and ln2 mean and rstd, fp32: 16sb (R rows)
Under sequence parallelism their replicated 10 sbh become 10 sbh/t, as our R = N/t rows do. So the value
for our kernels is theirs with three corrections (flash attention's in two parts), each a named term of
Table2Value:
    dropout_masks         - 2 sbh (- 2sbh/t under sequence parallelism): the two masks
    attention_matrix      - 5 as^2b/t: the softmax output, its mask and the dropout output
    log_sum_exp           + 4 asb/t: what flash attention keeps instead (fp32, one per row and head)
    layernorm_statistics  + 16 sb (+ 16 sb/t under sequence parallelism): fp32 mean and rstd of both
Their "selective" recomputes exactly the attention core (the 5 as^2b), which flash attention never stores,
so both selective rows, corrected, are our recompute none (for them attention_matrix is zero). Our
selective goes further and drops ln1, ln2 and fch_gelu (QKV input, fc input, fc projection input): that is
the selective_outputs term of our own two rows, which start from their selective rows. Their full row
keeps the layer's input, 2 sbh, as our full does with --recompute-every 1 (nothing to correct).

Llama's block, counted their way. The same buffers hold the Llama block's activations at other widths
(k = h kv_heads / a the channels of K and of V each, f = ffn_hidden the MLP's hidden units), and the block
has no dropout, so the adapted count, term by term, is:
    attention  QKV input 2sbh                          ln1 (R, C)            replicated
               Q 2sbh, K and V 2sbk each: 2sb(h + 2k)  qkv (N, (h + 2k)/t)   split
               softmax output 2as^2b, which is also    -- not stored (flash attention: lse 4asb/t)
               the input of attention over V
               output projection input 2sbh            atty (N, C/t)         split
    MLP        fc input 2sbh                           ln2 (R, C)            replicated
               gate and up outputs 2 x 2sbf            fch (N, 2f/t)         split (SiLU's input and the
                                                                             other factor of the product)
               their product, the down projection's    fch_gelu (N, f/t)     split
               input 2sbf
    RMSNorms   their inputs 4sbh                       residual2, output     replicated
               (statistics: not in their count)        rstd only, fp32: 8sb
that is 8sbh replicated (GPT-2's 10 less the two dropout masks) and sb(4h + 4k + 6f) split (GPT-2's 24 sbh),
plus the attention matrix 2as^2b (GPT-2's 5as^2b less the mask and the dropout output):
    no parallelism                          sb (12h + 4k + 6f) + 2as^2b
    tensor parallel                         8sbh + sb (4h + 4k + 6f)/t + 2as^2b/t
    tensor + sequence parallel              sb/t (12h + 4k + 6f + 2as)
    tensor parallel + selective             8sbh + sb (4h + 4k + 6f)/t
    tensor + sequence parallel + selective  sb/t (12h + 4k + 6f)
    full recomputation                      2 sbh
The corrections are GPT-2's with Llama's terms: no dropout masks to take away; attention_matrix - 2as^2b/t;
log_sum_exp + 4asb/t (a query heads: every one of them scores the keys); layernorm_statistics + 8sb (+ 8sb/t
under sequence parallelism), the rstd of both RMSNorms; our selective's outputs - 4sbh (ln1, ln2; /t under
sequence parallelism) - 2sbf/t (the product). With k = h and f = 4h, 2sbf/t is GPT-2's 8sbh/t, and the
other terms are GPT-2's less what the block lacks.
*/
enum class Table2Row {
    NoParallelism,
    TensorParallel,
    TensorSequenceParallel,
    TensorParallelSelective,
    TensorSequenceParallelSelective,
    FullRecompute,
    OursSelective,                  // not in Table 2: our selective (ln1, ln2, fch_gelu dropped too)
    OursSelectiveSequenceParallel,  // the same under sequence parallelism
};
constexpr int kNumTable2Rows = 8;

struct Table2Value {
    const char* name = "";               // "tensor + sequence parallel"
    const char* formula = "";            // Table 2's formula (Llama: adapted); our rows: the row they start from
    const char* corrected_formula = "";  // the formula after the corrections
    bool in_table = true;                // false: one of our rows
    double table = 0;                    // Table 2's bytes per layer (our rows: the row they start from)
    // the corrections for this program's kernels, bytes (negative: stored there, not here)
    double dropout_masks = 0, attention_matrix = 0, log_sum_exp = 0, layernorm_statistics = 0;
    double selective_outputs = 0;        // our rows: - (ln1 + ln2 + fch_gelu)
    double corrected = 0;                // table + every correction
    GPT2MemoryShape ours;                // the run of this program the row describes (tp, sequence
                                         // parallelism, recompute policy): gpt2_activation_bytes(ours, true)'s
                                         // per_layer equals corrected
};

// The row's value for the shape's s = seq_len, b = batch, h = channels, a = num_heads, t = tp (t = 1 for the
// no-parallelism row), and for a Llama shape k = kv_heads h / a and f = ffn_hidden, in 2-byte activations
// whatever the build: GPT-2's Table 2, or its adaptation to Llama's block (above). Each product is formed
// before it is divided by t, so with h, a, k and f multiples of t (and s b too under sequence parallelism),
// as a tp layout needs, every value is a whole number and exact in a double.
inline Table2Value korthikanti_table2(Table2Row row, const GPT2MemoryShape& shape) {
    const double s = shape.seq_len, b = shape.batch, h = shape.channels, a = shape.num_heads;
    const bool llama = shape.llama;
    const double k = (shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads) * (h / a);
    const double f = shape.ffn_hidden > 0 ? shape.ffn_hidden : 4 * h;
    const double t = row == Table2Row::NoParallelism ? 1 : shape.tp;
    const double sbh = s * b * h, sbf = s * b * f;
    // what tp replicates (the inputs of the norms and of the matmuls that take the residual stream, and
    // GPT-2's dropout masks), what it splits, and the attention core's s x s matrices
    const double replicated = llama ? 8 * sbh : 10 * sbh;
    const double split = llama ? 4 * sbh + 4 * s * b * k + 6 * sbf : 24 * sbh;
    const double whole = replicated + split, attention = (llama ? 2 : 5) * a * s * s * b;
    Table2Value v;
    v.ours = shape;
    v.ours.tp = (int)t;
    v.ours.recompute = Recompute{};  // none
    bool sequence_parallel = false, selective = false;  // theirs; selective: the attention core recomputed
    switch (row) {
        case Table2Row::NoParallelism:
            v.name = "no parallelism";
            v.formula = llama ? "sb (12h + 4k + 6f) + 2as^2b" : "sbh (34 + 5as/h)";
            v.corrected_formula = llama ? "sb (12h + 4k + 6f + 8 + 4a)" : "32sbh + 16sb + 4asb";
            v.table = whole + attention;
            break;
        case Table2Row::TensorParallel:
            v.name = "tensor parallel";
            v.formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 2as^2b/t" : "sbh (10 + 24/t + 5as/(ht))";
            v.corrected_formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 8sb + 4asb/t"
                                        : "sbh (8 + 24/t) + 16sb + 4asb/t";
            v.table = replicated + split / t + attention / t;
            break;
        case Table2Row::TensorSequenceParallel:
            v.name = "tensor + sequence parallel";
            v.formula = llama ? "sb/t (12h + 4k + 6f + 2as)" : "sbh/t (34 + 5as/h)";
            v.corrected_formula = llama ? "sb/t (12h + 4k + 6f + 8 + 4a)" : "sb/t (32h + 16 + 4a)";
            v.table = (whole + attention) / t;
            sequence_parallel = true;
            break;
        case Table2Row::TensorParallelSelective:
            v.name = "tp + selective";
            v.formula = llama ? "8sbh + sb (4h + 4k + 6f)/t" : "sbh (10 + 24/t)";
            v.corrected_formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 8sb + 4asb/t"
                                        : "sbh (8 + 24/t) + 16sb + 4asb/t";
            v.table = replicated + split / t;
            selective = true;
            break;
        case Table2Row::TensorSequenceParallelSelective:
            v.name = "tp + sp + selective";
            v.formula = llama ? "sb/t (12h + 4k + 6f)" : "sbh/t 34";
            v.corrected_formula = llama ? "sb/t (12h + 4k + 6f + 8 + 4a)" : "sb/t (32h + 16 + 4a)";
            v.table = whole / t;
            sequence_parallel = selective = true;
            break;
        case Table2Row::FullRecompute:
            v.name = "full recompute";
            v.formula = "2 sbh";
            v.corrected_formula = "2 sbh";
            v.table = v.corrected = 2 * sbh;  // the layer's input only: nothing to correct
            v.ours.sequence_parallel = false;
            v.ours.recompute = Recompute{RecomputePolicy::Full, 1};
            return v;
        case Table2Row::OursSelective:
        case Table2Row::OursSelectiveSequenceParallel:
            sequence_parallel = row == Table2Row::OursSelectiveSequenceParallel;
            v.name = sequence_parallel ? "ours: selective + sp" : "ours: selective";
            v.formula = sequence_parallel ? "(from tp + sp + selective)" : "(from tp + selective)";
            v.corrected_formula = llama ? sequence_parallel ? "sb/t (8h + 4k + 4f + 8 + 4a)"
                                                            : "4sbh + sb (4h + 4k + 4f)/t + 8sb + 4asb/t"
                                        : sequence_parallel ? "sb/t (20h + 16 + 4a)" : "sbh (4 + 16/t) + 16sb + 4asb/t";
            v.in_table = false;
            v.table = sequence_parallel ? whole / t : replicated + split / t;
            selective = true;
            // ln1 (QKV input) and ln2 (fc input), 2sbh each, replicated or split by sequence parallelism;
            // fch_gelu (fc projection input: GELU's output, or SwiGLU's product) 2sbf/t, GPT-2's 8sbh/t
            v.selective_outputs = -((sequence_parallel ? 4 * sbh / t : 4 * sbh) + 2 * sbf / t);
            v.ours.recompute = Recompute{RecomputePolicy::Selective, 1};
            break;
    }
    v.ours.sequence_parallel = sequence_parallel;
    v.dropout_masks = llama ? 0 : sequence_parallel ? -2 * sbh / t : -2 * sbh;
    v.attention_matrix = selective ? 0 : -attention / t;
    v.log_sum_exp = 4 * a * s * b / t;
    const double statistics = (llama ? 8 : 16) * s * b;  // fp32: RMSNorm's rstd, or layernorm's mean and rstd
    v.layernorm_statistics = sequence_parallel ? statistics / t : statistics;
    v.corrected = v.table + v.dropout_masks + v.attention_matrix + v.log_sum_exp + v.layernorm_statistics +
                  v.selective_outputs;
    return v;
}

// The table for one shape: each row's Table 2 value (a Llama shape: the adapted count), the corrected value and
// gpt2_activation_bytes' per_layer for the run the row describes, all in 2-byte activations as the paper
// counts (bf16_build false adds what the FP32 build's sizes are). Of our two rows, the one matching
// shape.sequence_parallel is printed.
inline void print_korthikanti_table2(const GPT2MemoryShape& shape, bool bf16_build, FILE* out = stdout) {
    const bool llama = shape.llama;
    std::vector<Table2Value> rows;
    int formula_width = 27, corrected_width = 31;  // GPT-2's longest formulas, and a space
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Row row = (Table2Row)r;
        if ((row == Table2Row::OursSelective && shape.sequence_parallel) ||
            (row == Table2Row::OursSelectiveSequenceParallel && !shape.sequence_parallel))
            continue;
        rows.push_back(korthikanti_table2(row, shape));
        formula_width = std::max(formula_width, (int)strlen(rows.back().formula) + 1);
        corrected_width = std::max(corrected_width, (int)strlen(rows.back().corrected_formula) + 1);
    }
    char widths[64] = "";  // a Llama shape's k and f
    if (llama)
        snprintf(widths, sizeof(widths), " k=%d f=%d",
                 (shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads) * (shape.channels / shape.num_heads),
                 shape.ffn_hidden > 0 ? shape.ffn_hidden : 4 * shape.channels);
    fprintf(out, "per-layer activations, Korthikanti et al. Table 2%s: bytes per layer and rank, 2-byte activations "
            "(s=%d b=%d h=%d a=%d%s t=%d)%s\n", llama ? " adapted to Llama's block (K/V heads, SwiGLU, RMSNorm, no "
            "dropout)" : "", shape.seq_len, shape.batch, shape.channels, shape.num_heads, widths, shape.tp,
            bf16_build ? "" : "; this FP32 build's 4-byte activations double every term but the fp32 log-sum-exp "
                              "and norm statistics");
    fprintf(out, "  %-27s %-*s %10s  %-*s %10s %13s  %s\n", "row", formula_width, llama ? "Table 2 adapted" : "Table 2",
            "bytes", corrected_width, "corrected for our kernels", "bytes", "ours", "(our run)");
    for (const Table2Value& v : rows) {
        const double ours = gpt2_activation_bytes(v.ours, true).per_layer;
        const RecomputePolicy policy = v.ours.recompute.policy;
        const std::string run = std::string(policy == RecomputePolicy::None        ? "none"
                                            : policy == RecomputePolicy::Selective ? "selective"
                                                                                   : "full, every 1") +
                                ", tp " + std::to_string(v.ours.tp) + (v.ours.sequence_parallel && v.ours.tp > 1 ? " + sp" : "");
        fprintf(out, "  %-27s %-*s %10s  %-*s %10s %s %10s  (%s)\n", v.name, formula_width, v.formula,
                v.in_table ? format_bytes(v.table).c_str() : "-", corrected_width, v.corrected_formula,
                format_bytes(v.corrected).c_str(), ours == v.corrected ? "==" : "!=", format_bytes(ours).c_str(),
                run.c_str());
    }
    if (llama)
        fprintf(out, "  corrected = adapted Table 2 - softmax output 2as^2b/t (not under selective) + fp32 log-sum-exp "
                "4asb/t + fp32 RMSNorm rstd 8sb (/t with sp)\n");
    else
        fprintf(out, "  corrected = Table 2 - dropout masks 2sbh (/t with sp) - attention matrices 5as^2b/t (not under "
                "selective) + fp32 log-sum-exp 4asb/t + fp32 layernorm mean, rstd 16sb (/t with sp)\n");
}

// ----------------------------------------------------------------------------
// the plan

struct MemoryPlan {
    // what was planned
    size_t num_parameters = 0;
    int zero_stage = 0, data_parallel_ranks = 1, shard_ranks = 1, replica_groups = 1, accumulation_steps = 1;
    bool bf16 = true;
    bool has_shape = false;
    // bytes per rank (doubles: 12P/N need not be a whole number of bytes)
    double parameters = 0, gradients = 0, optimizer_state = 0;
    double activations = 0, workspace = 0;  // zero without a model shape
    double model_state = 0;                 // parameters + gradients + optimizer state
    double total = 0;                       // everything above
    double communication = 0;               // bytes this rank sends per optimizer step
    // --offload optimizer: the optimizer state in pinned host memory (optimizer_state is then the device's
    // staging slots), and everything on the host
    bool offload_optimizer = false;
    double host_optimizer_state = 0, host_total = 0;
    // each line's formula, with the numbers put in
    std::string parameters_formula, gradients_formula, optimizer_formula, activations_formula, workspace_formula,
        communication_formula;
};

__attribute__((format(printf, 1, 2))) inline std::string plan_format(const char* format, ...) {
    char text[512];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof(text), format, args);
    va_end(args);
    return text;
}

// zero_stage 0-3; data_parallel_ranks D = M groups * shard_ranks N; bf16: the mixed-precision build (false:
// FP32); accumulation_steps A >= 1; shape: a GPT-2 shape for the activations (and llmc/parallel/zero.h's extra
// buffers), or null; offload_optimizer: the optimizer state in host memory. Impossible layouts stop with one
// error line.
inline MemoryPlan plan_training_memory(size_t num_parameters, int zero_stage, int data_parallel_ranks,
                                       int shard_ranks, bool bf16, int accumulation_steps = 1,
                                       const GPT2MemoryShape* shape = nullptr, bool offload_optimizer = false) {
    if (zero_stage < 0 || zero_stage > 3) fatal("memory plan: ZeRO stage %d does not exist (0-3)", zero_stage);
    if (data_parallel_ranks < 1 || shard_ranks < 1 || accumulation_steps < 1)
        fatal("memory plan: data-parallel ranks (%d), shard ranks (%d) and accumulation steps (%d) must be >= 1",
              data_parallel_ranks, shard_ranks, accumulation_steps);
    if (zero_stage == 0) shard_ranks = 1;  // stage 0 keeps everything everywhere
    if (data_parallel_ranks % shard_ranks != 0)
        fatal("memory plan: %d data-parallel ranks do not split into groups of %d shard ranks", data_parallel_ranks,
              shard_ranks);

    MemoryPlan p;
    p.num_parameters = num_parameters;
    p.zero_stage = zero_stage;
    p.data_parallel_ranks = data_parallel_ranks;
    p.shard_ranks = shard_ranks;
    p.replica_groups = data_parallel_ranks / shard_ranks;
    p.accumulation_steps = accumulation_steps;
    p.bf16 = bf16;
    p.has_shape = shape != nullptr;

    const double P = (double)num_parameters, N = shard_ranks, D = data_parallel_ranks, M = p.replica_groups,
                 A = accumulation_steps;
    const double s = bf16 ? 2 : 4;                 // parameters and gradients: floatX
    const double optimizer = bf16 ? 12 : 8;        // fp32 master + m + v, or m + v
    const char* optimizer_parts = bf16 ? "fp32 master + m + v" : "fp32 m + v";
    const int n = shard_ranks;

    // parameters: sharded at stage 3 only
    const double param_share = zero_stage == 3 ? 1 / N : 1;
    p.parameters = s * P * param_share;
    p.parameters_formula = zero_stage == 3 ? plan_format("%.0f P / %d", s, n) : plan_format("%.0f P", s);
    // gradients: sharded from stage 2
    p.gradients = s * P * (zero_stage >= 2 ? 1 / N : 1);
    p.gradients_formula = zero_stage >= 2 ? plan_format("%.0f P / %d", s, n) : plan_format("%.0f P", s);
    // optimizer state: sharded from stage 1
    p.optimizer_state = optimizer * P * (zero_stage >= 1 ? 1 / N : 1);
    p.optimizer_formula = (zero_stage >= 1 ? plan_format("%.0f P / %d", optimizer, n) : plan_format("%.0f P", optimizer)) +
                          "  (" + optimizer_parts + ")";
    p.offload_optimizer = offload_optimizer;
    if (offload_optimizer) {  // to the host; the device keeps the staging slots (with a shape)
        p.host_optimizer_state = p.optimizer_state;
        p.optimizer_state = 0;
        p.optimizer_formula = "offloaded to host memory: " + p.optimizer_formula;
        if (shape) {
            const ParameterLayout chunks_of(gpt2_memory_shape_config(*shape), n, shape->tp, 0, {},
                                            shape->experts > 0 ? shape->ep : 1, 0);
            const double piece = (double)offload_piece_elements(chunks_of);
            p.optimizer_state = 2 * piece * optimizer;
            p.optimizer_formula += plan_format("; on the device 2 staging slots x %.0f elements x %.0f bytes", piece,
                                               optimizer);
        }
    }

    if (zero_stage == 1 && shape) {  // llmc/parallel/zero.h's grad_shard, next to the full gradient
        p.gradients += s * P / N;
        p.gradients_formula += plan_format(" + %.0f P / %d (the averaged shard)", s, n);
    }
    if (zero_stage >= 2 && shape) {  // chunk-sized buffers, padded as ParameterLayout pads them
        // a tp rank's chunks (llmc/model/parameters.h): wte's rows (and Llama's LM head's) and the matmuls split t
        // ways, the rest whole; GPT-2: (Vp/t + max_seq_len) C, 12 C^2/t + 6C + 7C/t and 2C elements
        // A pipeline rank sizes its embedding and final buffers by the chunks it holds (llmc/parallel/zero.h's
        // working_buffer_sizes): the embedding chunk on the first stage (and on the last, where the LM head is
        // wte), the final chunk on the last; none elsewhere.
        const ParameterLayout chunks_of(gpt2_memory_shape_config(*shape), n, shape->tp);
        const bool holds_embedding = shape->first_stage || (shape->last_stage && !shape->llama);
        const double embedding = holds_embedding ? (double)chunks_of.chunk_size(0) : 0.0;
        const double block = (double)chunks_of.largest_block_chunk();
        const double final = shape->last_stage ? (double)chunks_of.chunk_size(chunks_of.num_chunks() - 1) : 0.0;
        const double chunks = (embedding + 2 * block + final) * s;
        const double largest_shard = std::max({embedding, block, final}) / N * s;
        p.gradients += chunks + largest_shard;
        p.gradients_formula += plan_format(" + %s working buffers (%s2 block chunks%s, 1 shard)",
                                           format_bytes(chunks + largest_shard).c_str(),
                                           embedding > 0 ? "embedding chunk, " : "", final > 0 ? ", final chunk" : "");
        if (zero_stage == 3) {
            p.parameters += chunks;
            p.parameters_formula += plan_format(" + %s gathered chunks (%s2 blocks%s)", format_bytes(chunks).c_str(),
                                                embedding > 0 ? "embedding, " : "", final > 0 ? ", final" : "");
        }
    }

    if (shape) {
        const ActivationBytes a = gpt2_activation_bytes(*shape, bf16);
        p.activations = a.activations;
        p.workspace = a.workspace;
        const int layers = shape->stage_layers > 0 ? shape->stage_layers : shape->num_layers;
        p.activations_formula = plan_format("%d record(s) x (%d layers x %s kept (recompute %s) + 2 B T C) + logits "
                                            "(B=%d, T=%d, Vp=%d, tp=%d%s)", shape->records, layers,
                                            format_bytes(a.per_layer).c_str(),
                                            recompute_describe(shape->recompute).c_str(), shape->batch,
                                            shape->seq_len, shape->padded_vocab, shape->tp,
                                            shape->sequence_parallel ? ", sequence parallel" : "");
        if (shape->weight_records > 0)
            p.activations_formula += plan_format(" + %d weight-gradient record(s) x %d layers x %s",
                                                 shape->weight_records, layers, format_bytes(a.weight_record).c_str());
        if (shape->outboxes > 0)
            p.activations_formula += plan_format(" + %d outbox(es) of B T C", shape->outboxes);
        if (shape->last_stage && shape->heads > 1)
            p.activations_formula += plan_format(" (logits: %d head records)", shape->heads);
        p.workspace_formula = shape->tp == 1 ? plan_format("shared buffers, 9 x B T C x %.0f bytes + fp32 scratch", s)
                                             : plan_format("shared buffers of B T C/tp .. B T C elements, tp=%d%s",
                                                           shape->tp, shape->sequence_parallel ? ", SP" : "");
        if (a.recompute > 0)
            p.workspace_formula += plan_format(", + %s of records shared by the recomputation",
                                               format_bytes(a.recompute).c_str());
    }

    // communication per step; under expert parallelism (G = ep) P_e of P are this rank's experts (their
    // padding aside), averaged over their R = D/G replicas alone, and the M = G replica groups of ZeRO's shards
    // average only the rest (llmc/parallel/zero.h)
    const double G = shape && shape->experts > 0 ? shape->ep : 1;
    double P_e = 0;
    if (G > 1) {
        const GPT2Config c = gpt2_memory_shape_config(*shape);
        const ParameterLayout rank(c, 1, 1, 0, {}, shape->ep, 0);
        const int layers = shape->stage_layers > 0 ? shape->stage_layers : shape->num_layers;
        const int mixture = c.moe_every - 1;  // with a mixture every N blocks, about 1/N of a stage's blocks
        P_e = (double)layers / c.moe_every * (double)(rank.elements(EXPERTFCW, mixture) + rank.elements(EXPERTPROJW, mixture));
    }
    if (zero_stage == 0 && G > 1) {
        const double R = D / G;
        p.communication = 2 * (D - 1) / D * (P - P_e) * s + 2 * (R - 1) / R * P_e * s;
        p.communication_formula = plan_format("all-reduce 2 (D-1)/D (P - P_e) s + experts' 2 (R-1)/R P_e s, D=%d, "
                                              "R=%.0f, P_e=%.0f, s=%.0f", data_parallel_ranks, R, P_e, s);
    } else if (zero_stage == 0) {
        p.communication = 2 * (D - 1) / D * P * s;
        p.communication_formula = plan_format("all-reduce 2 (D-1)/D P s, D=%d, s=%.0f", data_parallel_ranks, s);
    } else {
        const double within = (zero_stage == 1 ? 2 : zero_stage == 2 ? A + 1 : 3 * A) * (N - 1) / N * P * s;
        const double across = 2 * (M - 1) / M * ((P - P_e) / N) * s;
        p.communication = within + across;
        p.communication_formula =
            zero_stage == 1 ? plan_format("reduce-scatter + all-gather 2 (N-1)/N P s")
            : zero_stage == 2 ? plan_format("reduce-scatter per micro-step + all-gather (A+1) (N-1)/N P s, A=%d",
                                            accumulation_steps)
                              : plan_format("2 all-gathers + reduce-scatter per micro-step 3 A (N-1)/N P s, A=%d",
                                            accumulation_steps);
        p.communication_formula += plan_format(", N=%d, s=%.0f", n, s);
        if (p.replica_groups > 1 && G > 1)
            p.communication_formula += plan_format(" + the dense shard's all-reduce over ep 2 (M-1)/M ((P - P_e)/N) s, "
                                                   "M=%d, P_e=%.0f", p.replica_groups, P_e);
        else if (p.replica_groups > 1)
            p.communication_formula += plan_format(" + HSDP all-reduce 2 (M-1)/M (P/N) s, M=%d", p.replica_groups);
    }

    p.model_state = p.parameters + p.gradients + p.optimizer_state;
    p.total = p.model_state + p.activations + p.workspace;
    p.host_total = p.host_optimizer_state;
    return p;
}

// One line per category: bytes per rank, then the formula that gave them; then the total.
inline void print_memory_plan(const MemoryPlan& p, FILE* out = stdout) {
    fprintf(out, "memory plan: %zu parameters (P), %s, ZeRO stage %d, %d data-parallel rank(s) = %d group(s) x %d "
            "shard rank(s), %d micro-step(s) per step; bytes per rank:\n", p.num_parameters, p.bf16 ? "BF16" : "FP32",
            p.zero_stage, p.data_parallel_ranks, p.replica_groups, p.shard_ranks, p.accumulation_steps);
    auto row = [&](const char* name, double bytes, const std::string& formula) {
        fprintf(out, "  %-16s %12s  %s\n", name, format_bytes(bytes).c_str(), formula.c_str());
    };
    row("parameters", p.parameters, p.parameters_formula);
    row("gradients", p.gradients, p.gradients_formula);
    row("optimizer state", p.optimizer_state, p.optimizer_formula);
    if (p.has_shape) {
        row("activations", p.activations, p.activations_formula);
        row("workspace", p.workspace, p.workspace_formula);
    } else {
        fprintf(out, "  %-16s %12s  (no model shape given)\n", "activations", "-");
    }
    row("total", p.total, p.has_shape ? "model state + activations + workspace (not counted: cuBLASLt workspace, "
                                        "NCCL buffers, the CUDA context)" : "model state only");
    row("communication", p.communication, p.communication_formula + "  (sent per step)");
    if (p.offload_optimizer)
        row("host memory", p.host_total, "pinned, per rank: the offloaded optimizer state (moves up and down once "
                                         "per step over PCIe)");
}

// ----------------------------------------------------------------------------
// the report at the end of a run: what rank 0 held, beside what the formulas say it should

// Prints, on the main rank, the memory held by category and its peak beside the ZeRO formula and the
// activation and workspace formulas (under a pipeline, each stage's activations beside its own formula: a
// collective over the pp axis), and logs it as a "memory" event.
inline void report_memory(ParallelContext& par, GPT2& model, Logger& logger) {
    const Layout& l = par.layout;
    const MemoryTotals held = memory_totals();
    const size_t model_state = held.peak[(int)MemoryKind::Parameters] + held.peak[(int)MemoryKind::Gradients] +
                               held.peak[(int)MemoryKind::OptimizerState];
    const GPT2MemoryShape shape = gpt2_memory_shape(model.config, l, model_part(par, model.config));
    const MemoryPlan formula = plan_training_memory(model.layout.total, l.zero_stage, par.mesh.gradient.size,
                                                    par.zero.shards, l.bf16, par.microbatches, nullptr,
                                                    l.offload_optimizer);
    const MemoryPlan with_buffers = plan_training_memory(model.layout.total, l.zero_stage, par.mesh.gradient.size,
                                                         par.zero.shards, l.bf16, par.microbatches, &shape,
                                                         l.offload_optimizer);
    const MemoryTotals host = host_memory_totals();
    if (par.main_rank) {
        printf("device memory of rank 0, by category (now and at its peak):\n");
        print_memory_totals(held);
        printf("parameters + gradients + optimizer state: %s held; ZeRO-%d formula %s, with the working buffers "
               "%s\n", format_bytes((double)model_state).c_str(), l.zero_stage, format_bytes(formula.model_state).c_str(),
               format_bytes(with_buffers.model_state).c_str());
        printf("activations (kept for the backward pass): %s held at the peak; formula (llmc/planning/memory.h: "
               "recompute %s, tp %d%s) %s\n", format_bytes((double)held.peak[(int)MemoryKind::Activations]).c_str(),
               recompute_describe(l.recompute).c_str(), l.tp, l.sequence_parallel ? ", sequence parallel" : "",
               format_bytes(with_buffers.activations).c_str());
        printf("workspace (buffers the layers share): %s held at the peak; formula %s\n",
               format_bytes((double)held.peak[(int)MemoryKind::Workspace]).c_str(),
               format_bytes(with_buffers.workspace).c_str());
        if (l.offload_optimizer)
            printf("pinned host memory, optimizer state (offloaded): %s held; formula %s (the device keeps %s of "
                   "staging, counted above)\n", format_bytes((double)host.peak[(int)MemoryKind::OptimizerState]).c_str(),
                   format_bytes(with_buffers.host_optimizer_state).c_str(),
                   format_bytes(with_buffers.optimizer_state).c_str());
    }
    const double host_activations = gpt2_activation_bytes(shape, l.bf16).host;  // offloaded blocks' records
    if (par.main_rank && host_activations > 0)
        printf("offloaded activations (pinned host memory): %s held at the peak; formula %s\n",
               format_bytes((double)host.peak[(int)MemoryKind::Activations]).c_str(),
               format_bytes(host_activations).c_str());
    // under a pipeline, each stage's activations (its records in flight) beside its formula
    const std::vector<float> stage_activations = pipeline_gather_values(
        par.pipe, (float)held.peak[(int)MemoryKind::Activations], model.stream);
    const std::vector<float> stage_formulas = pipeline_gather_values(par.pipe, (float)with_buffers.activations,
                                                                     model.stream);
    // the records are kept for the batch phase of the most microbatches (one phase without a batch ramp)
    int most_microbatches = 0;
    for (const BatchPhase& phase : par.ramp.phases)
        most_microbatches = std::max(most_microbatches, phase.tokens / (l.batch_size * l.seq_len * par.dp_size));
    if (par.main_rank && l.pp > 1)
        for (int r = 0; r < l.pp; r++)
            printf("  pp rank %d: activations %s held at the peak, formula %s (%d record(s) in flight)\n", r,
                   format_bytes(stage_activations[r]).c_str(), format_bytes(stage_formulas[r]).c_str(),
                   pipeline_peak_activations(l.schedule, r, l.pp, most_microbatches, l.pp_virtual));
    logger.write(JsonLine("memory").integer("model_state_bytes", (long long)model_state)
                     .integer("activation_bytes", (long long)held.peak[(int)MemoryKind::Activations])
                     .number("activation_formula_bytes", with_buffers.activations)
                     .integer("workspace_bytes", (long long)held.peak[(int)MemoryKind::Workspace])
                     .number("workspace_formula_bytes", with_buffers.workspace)
                     .number("formula_bytes", formula.model_state)
                     .number("formula_with_buffers_bytes", with_buffers.model_state)
                     .integer("peak_bytes", (long long)held.peak_total)
                     .integer("host_optimizer_bytes", (long long)host.peak[(int)MemoryKind::OptimizerState])
                     .number("host_optimizer_formula_bytes", with_buffers.host_optimizer_state));
    if (host_activations > 0)
        logger.write(JsonLine("host_memory").integer("activation_bytes", (long long)host.peak[(int)MemoryKind::Activations])
                         .number("activation_formula_bytes", host_activations));
}
