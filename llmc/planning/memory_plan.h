/*
The memory plan: what a training run will need per rank, by arithmetic. plan_training_memory allocates nothing
and needs no GPU, so it can answer "does this model fit with this layout?" for any size, and print_memory_plan
shows the answer:
    MemoryPlan plan = plan_training_memory(num_parameters, zero_stage, data_parallel_ranks, shard_ranks,
                                           bf16, accumulation_steps, &shape);   // shape may be null
    print_memory_plan(plan);
It adds up the model state and the communication below and, with a model shape, the activations and workspace
of llmc/planning/activation_memory.h.

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
*/
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>
#include "../device_memory.h"
#include "../model/parameters.h"
#include "../parallel/zero.h"
#include "../utils.h"
#include "activation_memory.h"

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
