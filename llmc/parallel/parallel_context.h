/*
The parallel context: this rank's place on every axis of the mesh, built once from the layout.

    Layout (llmc/parallel/layout.h: what the flags asked for)
      -> the world's ranks (llmc/parallel/comm.h) cut into the mesh's groups (llmc/parallel/mesh.h)
      -> tp   this rank's slice of every matmul and the stream f's backward runs on   tensor_parallel.h
         cp   its positions of every sequence, the ring's buffers and stream          context_parallel.h
         pipe its pipeline stages, schedule, records and links                        pipeline.h
         ep   its experts, and the group its routed rows travel in                    expert_parallel.h
         zero its shards of the parameters, gradients and optimizer state             zero.h
              (set up once the model is allocated: zero_init)
The model (llmc/model/gpt2.cuh) holds tensors and activations only; every pass that needs to talk to other
ranks takes the context (llmc/model/forward_backward.cuh, llmc/parallel/pipeline.h). With one rank every
group has one member and every collective does nothing: a default ParallelContext is one rank's.

Below: making and freeing it, the part of the model a rank holds (model_part), and the few steps that
combine several axes: the step's loss on every rank, the gradient norm, the logits row for sampling, and
the bytes sent per axis.
*/
#pragma once

#include <algorithm>
#include <climits>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "mesh.h"
#include "layout.h"
#include "tensor_parallel.h"
#include "context_parallel.h"
#include "pipeline.h"  // its first half, the Pipeline (the executor, its second, needs this file)
#include "expert_parallel.h"
#include "zero.h"
#include "../noise_scale.h"
#include "../model/gpt2.cuh"
#include "../io/logger.h"

struct ParallelContext {
    Layout layout;          // what was asked, dp_shard resolved
    Communicator world;
    Mesh mesh;              // the groups of every axis
    bool main_rank = true;  // world rank 0: prints, logs, samples and writes files
    int dp_rank = 0, dp_size = 1;  // this rank's data-parallel replica: which rows the data loader gives it
    int microbatches = 1;   // micro-steps per optimizer step: gradient accumulation, the pipeline's microbatches
                            // (the current batch phase's: parallel_set_step_tokens)
    BatchRamp ramp;         // tokens per step by tokens seen: --batch-ramp's phases, or one of total_batch_size
    int T_local = 0;        // the positions of each sequence this rank holds: T / cp
    TensorParallel tp;
    ContextParallel cp;
    Pipeline pipe;
    ExpertParallel ep;
    Zero zero;

    ParallelContext() = default;
    ParallelContext(const ParallelContext&) = delete;  // the axes' groups point into `mesh`: one copy only
    ParallelContext& operator=(const ParallelContext&) = delete;
};

// B*T*ranks, the tokens of one micro-step on all ranks. It and the row counts derived from it (B*T, passed
// to gpt2_allocate, the kernels and the data loader) are ints: a combination of flags whose product does
// not fit is refused here, before anything is allocated, instead of wrapping around to a wrong size.
inline int micro_step_tokens(int batch_size, int seq_len, int ranks) {
    const long long tokens = (long long)batch_size * seq_len * ranks;
    if (tokens > INT_MAX)
        fatal("--batch-size %d x --seq-len %d x %d rank(s) = %lld tokens per micro-step, more than the %d an int "
              "holds: lower --batch-size or --seq-len", batch_size, seq_len, ranks, tokens, INT_MAX);
    return (int)tokens;
}

// How much each of this rank's rows weighs in the step's loss (dloss = d loss / d a row's loss): the loss is the
// mean over the step's rows, B T of them per microbatch here (T of each sequence's positions under cp), in
// `microbatches` microbatches (the ranks' gradients are averaged after that: llmc/parallel/zero.h). The
// cross-entropy's gradient and a mixture of experts' own losses (llmc/model/moe.cuh) both weigh rows by it.
inline float step_loss_scale(const ParallelContext& par) {
    return 1.0f / (par.layout.batch_size * par.T_local * par.microbatches);
}

// Every rank of the launcher (mpirun, srun, torchrun; one rank without) calls this together. Stops with one
// line naming the flag if the layout cannot run this model on these ranks. From here on a rank that waits
// longer than `collective_timeout` seconds in one collective ends the job (llmc/parallel/watchdog.h).
// A mixture of experts (llmc/model/moe.cuh): under tp each tp rank takes B/tp of the sequences (so tp must divide
// B) ("": it runs).
inline std::string moe_layout_error(const GPT2Config& c, const Layout& l) {
    if (!c.moe()) return "";
    if (l.batch_size % l.tp != 0)
        return "--batch-size " + std::to_string(l.batch_size) + " with --tp " + std::to_string(l.tp) +
               ": each tp rank routes whole sequences through the experts, so tp must divide the batch";
    return "";
}

// Why a phase of the batch cannot run on this layout ("": it can): its tokens must be whole micro-steps of
// B x T x data-parallel ranks, and their count m must suit the pipeline's schedule. Under a ramp the line names
// the phase.
inline std::string batch_phase_error(const BatchPhase& phase, const Layout& l, const GPT2Config& config,
                                     int tokens_per_micro_step) {
    const std::string which = l.batch_ramp.phases.empty()
                                  ? ""
                                  : "--batch-ramp phase " + std::to_string(phase.threshold) + ":" +
                                        std::to_string(phase.tokens) + ": ";
    if (phase.tokens % tokens_per_micro_step != 0)
        return which + std::to_string(phase.tokens) + " tokens per step are not a multiple of --batch-size x --seq-len" +
               " x data-parallel ranks = " + std::to_string(tokens_per_micro_step);
    const std::string error = pipeline_layout_error(l.schedule, l.pp, l.pp_virtual, phase.tokens / tokens_per_micro_step,
                                                    config.num_layers);
    return error.empty() ? "" : which + error;
}

// The next steps train on `tokens` per step (a phase of the batch, checked in parallel_create): the micro-steps,
// and the pipeline's play, of that many.
inline void parallel_set_step_tokens(ParallelContext& par, int tokens) {
    par.layout.total_batch_size = tokens;
    par.microbatches = tokens / micro_step_tokens(par.layout.batch_size, par.layout.seq_len, par.dp_size);
    pipeline_use_microbatches(par.pipe, par.microbatches);
}

inline void parallel_create(ParallelContext& par, const Layout& asked, const GPT2Config& config,
                            const std::string& nccl_init_file, double collective_timeout) {
    par.layout = asked;
    Layout& l = par.layout;
    // watched from before MPI or NCCL starts, by the rank the launcher named (an inconsistent environment
    // is refused by comm_init_world, with its line)
    watchdog_start(collective_timeout, detect_launcher().rank);
    par.world = comm_init_world(nccl_init_file);
    watchdog_attach(par.world.rank, par.world.mpi, par.world.watch);
    l.ranks = par.world.size;
    l.multiprocessors = device_properties().multiProcessorCount;
    if (l.ranks % (l.tp * l.pp * l.cp) != 0)
        fatal("the %d ranks are not a multiple of --pp %d x --cp %d x --tp %d", l.ranks, l.pp, l.cp, l.tp);
    // the optimizer state (ZeRO-1, and the gradients with ZeRO-2) is sharded over groups of --dp-shard ranks,
    // replicated across the groups
    const int data_parallel_ranks = layout_data_parallel(l);
    if (l.dp_shard == 0) l.dp_shard = data_parallel_ranks;
    if (data_parallel_ranks % l.dp_shard != 0)
        fatal("--dp-shard %d does not divide the %d data-parallel ranks", l.dp_shard, data_parallel_ranks);
    par.mesh = mesh_create(par.world, mesh_layout(data_parallel_ranks / l.dp_shard, l.dp_shard, l.pp, l.cp, l.tp));
    par.main_rank = par.world.rank == 0;
    par.dp_rank = mesh_data_parallel_rank(par.mesh);
    par.dp_size = mesh_data_parallel_size(par.mesh);
    if (par.main_rank) mesh_print(par.mesh);

    const int B = l.batch_size, T = l.seq_len;
    if (T > config.max_seq_len) fatal("--seq-len %d exceeds the model's %d positions", T, config.max_seq_len);
    const std::string moe_error = moe_layout_error(config, l);
    if (!moe_error.empty()) fatal("%s", moe_error.c_str());
    const std::string ep_error = ep_layout_error(config.experts, l);
    if (!ep_error.empty()) fatal("%s", ep_error.c_str());
    if (l.ep > 1) ep_create(par.ep, par.world, par.mesh, l.ep);
    tp_check_layout(config, l.tp, l.sequence_parallel, T);
    par.cp.size = l.cp;
    par.cp.rank = par.mesh.coords[CP];
    par.cp.mode = l.cp_mode;
    par.cp.split = l.cp_split;
    par.cp.group = l.cp > 1 ? &par.mesh.axis[CP] : nullptr;
    par.T_local = T / l.cp;
    par.tp.size = l.tp;
    par.tp.rank = par.mesh.coords[TP];
    par.tp.sequence_parallel = l.sequence_parallel;
    par.tp.group = l.tp > 1 ? &par.mesh.axis[TP] : nullptr;
    // every phase of the batch (one without a ramp) must split into micro-steps and into the pipeline's schedule
    const int tokens_per_micro_step = micro_step_tokens(B, T, par.dp_size);
    if (l.batch_ramp.phases.empty()) {
        if (l.total_batch_size == 0) l.total_batch_size = tokens_per_micro_step;
        if (l.total_batch_size % tokens_per_micro_step != 0)
            fatal("--total-batch-size %d is not a multiple of --batch-size x --seq-len x data-parallel ranks = %d",
                  l.total_batch_size, tokens_per_micro_step);
        par.ramp = batch_ramp_fixed(l.total_batch_size);
    } else {
        par.ramp = l.batch_ramp;
    }
    std::vector<int> microbatch_counts;
    for (const BatchPhase& phase : par.ramp.phases) {
        const std::string error = batch_phase_error(phase, l, config, tokens_per_micro_step);
        if (!error.empty()) fatal("%s", error.c_str());
        microbatch_counts.push_back(phase.tokens / tokens_per_micro_step);
    }
    pipeline_create(par.pipe, par.mesh, l.schedule, l.pp_virtual, microbatch_counts, pipeline_stage_split(config, l),
                    config.tied_head());
    parallel_set_step_tokens(par, par.ramp.phases[0].tokens);
    // per-block recomputation: a letter per position of the longest stage's records (a shorter stage's rank uses
    // the first ones)
    const int positions = *std::max_element(par.pipe.stage_layers.begin(), par.pipe.stage_layers.end());
    const std::string blocks_error = recompute_blocks_resolve(l.recompute, positions);
    if (!blocks_error.empty()) fatal("%s", blocks_error.c_str());
    const std::string noise_error = l.noise_scale ? noise_scale_layout_error(l, config.tied_head(), config.moe(),
                                                                             par.dp_size,
                                                                             *std::max_element(microbatch_counts.begin(), microbatch_counts.end())) : "";
    if (!noise_error.empty()) fatal("%s", noise_error.c_str());
    // (after the tp and pipeline checks, which name their flags; these add the cp axis's)
    mesh_check_model(par.mesh, config.num_layers, config.num_heads);
    cp_check_layout(l.cp, l.cp_mode, l.cp_split, T, config.num_heads, l.tp);
    tp_check_context_parallel_rows(l.tp, l.sequence_parallel, T, l.cp);

    tp_streams_create(par.tp);
    cp_create(par.cp, B, par.T_local,
              attention_heads(config.num_heads / l.tp, config.kv_heads / l.tp, config.head_size()));
}

// The part of the model this rank holds and how it keeps it (llmc/model/gpt2.cuh's gpt2_allocate takes it).
inline ModelPart model_part(const ParallelContext& par, const GPT2Config& config) {
    const Layout& l = par.layout;
    const Pipeline& pipe = par.pipe;
    ModelPart part = pipeline_model_part(l.schedule, pipe.rank, pipe.size, pipe.virtual_stages, pipe.microbatches,
                                         pipe.stage_layers, pipe.tied_head, pipe.outboxes);
    // the pools as the pipeline's plays need them: the most of any microbatch count of the run
    part.records = pipe.records, part.weight_records = pipe.weight_records, part.heads = std::max(1, pipe.heads);
    part.tp = l.tp;
    part.tp_rank = par.tp.rank;
    part.sequence_parallel = l.sequence_parallel;
    part.ep = par.ep.size;
    part.cp = l.cp;
    part.sequence_pieces = l.cp > 1 ? cp_chunks_per_rank(l.cp_split) : 1;
    part.ep_rank = par.ep.rank;
    // a capacity counts a whole sequence's positions, T cp
    part.expert_capacity = config.moe() ? moe_capacity(config, l.capacity_factor, par.T_local * l.cp) : 0;
    part.shards = zero_shard_count(l.zero_stage, &par.mesh, &par.ep);
    part.full_parameters = l.zero_stage < 3;
    part.full_gradients = l.zero_stage < 2;
    part.recompute = l.recompute;
    part.small_batch_norm = l.noise_scale;
    return part;
}

inline void parallel_destroy(ParallelContext& par) {
    zero_free(par.zero);
    ep_destroy(par.ep);
    tp_streams_destroy(par.tp);
    cp_destroy(par.cp);
    pipeline_free(par.pipe);
    mesh_destroy(par.mesh);  // watched: NCCL's finalize of a communicator waits for every member
    comm_destroy(par.world);
    watchdog_stop();  // before MPI ends: the thread may call MPI_Abort, and the board is an MPI window
    comm_finalize();
}

// ----------------------------------------------------------------------------
// steps that span several axes

// model.results->loss on every rank: the mean of the `count` microbatch losses the last pipeline stage added
// up (gpt2_loss), averaged over the data-parallel ranks (and the cp ranks, which hold equal shares of the
// rows), then sent from the last stage to the pipeline's other ranks.
inline void mean_loss_on_every_rank(ParallelContext& par, GPT2& model, int count) {
    gpt2_mean_loss(model, count);
    if (par.zero.data_parallel && par.zero.data_parallel->size > 1)
        all_reduce(*par.zero.data_parallel, &model.results->loss, 1, Reduction::Average, model.stream);
    pipeline_share_from_last_stage(par.pipe, &model.results->loss, 1, model.stream);
}

// model.results->grad_norm_squared = the squared norm of the whole model's averaged gradient, the same on
// every rank: each rank's part (llmc/parallel/zero.h: the gradient it holds, each tensor counted once over
// its copies) summed over the ranks that hold different parts: the shard group (in zero_gradient_norm), the
// tp slices, the ep ranks' experts and the pipeline's stages. When the noise scale is measured, the step's first
// microbatch's squared norm (llmc/noise_scale.h; each data-parallel rank's own, averaged over them first) rides
// in the same sums: it sits next to grad_norm_squared, so each is a reduction of 2 floats.
inline void gradient_norm(ParallelContext& par, GPT2& model) {
    zero_gradient_norm(par.zero, model);
    float* squared = &model.results->grad_norm_squared;
    int count = 1;
    if (model.small_batch_norm_squared) {
        count = 2;
        if (par.zero.data_parallel && par.zero.data_parallel->size > 1)
            all_reduce(*par.zero.data_parallel, model.small_batch_norm_squared, 1, Reduction::Average, model.stream);
    }
    if (par.tp.size > 1) all_reduce(*par.tp.group, squared, count, Reduction::Sum, model.stream);
    if (par.ep.size > 1) all_reduce(par.ep.group, squared, count, Reduction::Sum, model.stream);
    if (par.pipe.size > 1) all_reduce(*par.pipe.group, squared, count, Reduction::Sum, model.stream);
}

// The logits of position `position` (of a sequence of `rows` positions after the last forward pass of one
// sequence), all Vp of them, on every rank's host: the last stage holds them, in tp column slices, on the
// cp rank that holds the position; it hands them to its cp group, which hands them down the pipeline. (A
// pass decoding one row with the key/value cache ran whole on every cp rank: each has the row.)
inline void logits_row_on_every_rank(ParallelContext& par, GPT2& model, int position, int rows, floatX* out) {
    const int Vp = model.config.padded_vocab_size;
    const bool every_cp_rank = par.cp.size == 1 || model.cache.decoding;
    int row = position;
    const int holder = every_cp_rank ? par.cp.rank : cp_owner_of_position(par.cp, position, rows, &row);
    if (model.last_stage && par.cp.rank == holder) tp_gather_logits_row(par.tp, out, model.heads[0].logits, row, Vp, model.stream);
    if (!every_cp_rank) broadcast_host(*par.cp.group, out, (size_t)Vp, holder, model.stream);
    pipeline_share_host_from_last_stage(par.pipe, out, (size_t)Vp, model.stream);
}

// Bytes this rank sent in the step so far, all groups and per axis (the pp axis with the pipeline's links).
inline StepTraffic parallel_traffic(const ParallelContext& par) {
    StepTraffic t;
    t.total = (long long)(mesh_bytes_sent(par.mesh) + pipeline_link_bytes(par.pipe) + ep_bytes_sent(par.ep));
    t.tp = (long long)par.mesh.axis[TP].bytes_sent;
    t.pp = (long long)(par.mesh.axis[PP].bytes_sent + pipeline_link_bytes(par.pipe));
    t.cp = (long long)par.mesh.axis[CP].bytes_sent;
    t.ep = (long long)par.ep.group.bytes_sent;
    return t;
}
inline void parallel_reset_traffic(ParallelContext& par) {
    mesh_reset_bytes(par.mesh);
    ep_reset_bytes(par.ep);
    pipeline_reset_bytes(par.pipe);
}

// This file has been read to its end: llmc/parallel/pipeline.h's executor, which takes the context, may compile.
#define LLMC_PARALLEL_CONTEXT_READ
