/*
The layout of a run: how its ranks split the work, one struct for the trainer and the planner alike.

    world = dp x pp x cp x tp ranks (llmc/parallel/mesh.h's order: tp varies fastest, then cp, pp, dp)
    dp   data-parallel replicas, each training on its own rows (llmc/parallel/zero.h); dp_shard of them
         share one sharded copy of the optimizer state (ZeRO), the rest replicate it (HSDP)
    pp   pipeline stages of consecutive layers, run in the order of `schedule` (llmc/parallel/pipeline.h)
    cp   ranks that split every sequence (llmc/parallel/context_parallel.h)
    tp   ranks that split every matmul (llmc/parallel/tensor_parallel.h), with sequence_parallel their rows too
    ep   ranks that split a mixture of experts' experts (llmc/parallel/expert_parallel.h): groups of ep
         consecutive dp ranks, so not a factor of the world of its own
plus what a rank keeps (ZeRO stage, recompute policy) and the batch: B x T tokens per data-parallel rank
and micro-step, total_batch_size tokens per optimizer step (or a batch ramp's phases); the micro-steps of a step are the pipeline's
microbatches. train_gpt fills it from the flags (llmc/io/options.h) and builds the parallel context from
it (llmc/parallel/parallel_context.h); --plan hands the same struct to llmc/planning/planner.h, so the
two cannot drift apart.
*/
#pragma once

#include <string>
#include <vector>

#include "../cuda_common.cuh"
#include "../batch_ramp.h"
#include "pipeline_schedule.h"
#include "recompute.h"

// How attention is split over the cp axis (llmc/parallel/context_parallel.h), and which positions each cp rank
// holds: these decide what the sequence and the heads must divide by (cp_layout_error).
enum class ContextParallelMode {
    Ring,     // ring attention: key/value blocks travel around the cp ranks
    Ulysses,  // all-to-all swaps a sequence split for a head split: each tp rank's heads divide over cp
};
enum class SequenceSplit {
    Zigzag,      // 2 cp chunks, rank i holding chunks i and 2cp-1-i, so every rank gets the same share of
                 // the causal mask's work
    Contiguous,  // cp chunks, rank i holding chunk i
};

inline const char* cp_mode_name(ContextParallelMode mode) { return mode == ContextParallelMode::Ring ? "ring" : "ulysses"; }
inline const char* cp_split_name(SequenceSplit split) { return split == SequenceSplit::Zigzag ? "zigzag" : "contiguous"; }
inline const std::vector<std::string>& cp_mode_names() {
    static const std::vector<std::string> names = {"ring", "ulysses"};
    return names;
}
inline const std::vector<std::string>& cp_split_names() {
    static const std::vector<std::string> names = {"zigzag", "contiguous"};
    return names;
}
inline ContextParallelMode cp_mode_from_name(const std::string& name) {
    return name == "ulysses" ? ContextParallelMode::Ulysses : ContextParallelMode::Ring;
}
inline SequenceSplit cp_split_from_name(const std::string& name) {
    return name == "contiguous" ? SequenceSplit::Contiguous : SequenceSplit::Zigzag;
}

struct Layout {
    int ranks = 1;                        // the world (the planner's --plan N; the launcher's, when training)
    int tp = 1, pp = 1, cp = 1;           // dp = ranks / (tp pp cp)
    bool sequence_parallel = false;
    int ep = 1;                           // expert parallelism: dp ranks per expert group
    float capacity_factor = 0.0f;         // a mixture of experts' (0: dropless): at most ceil(cf S K / E) rows
                                          // per expert and sequence of S (moe_capacity), which bounds the rows ep
                                          // brings; the routing and the buffers read it here
    ContextParallelMode cp_mode = ContextParallelMode::Ring;
    SequenceSplit cp_split = SequenceSplit::Zigzag;
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    int pp_virtual = 1;                   // V: stages per pipeline rank (interleaved)
    std::vector<int> pp_layers;           // layers per model stage, in model-stage order; empty: auto
    int zero_stage = 0;
    int dp_shard = 0;                     // data-parallel ranks per shard group (0: all of them)
    Recompute recompute;
    bool offload_optimizer = false;       // master weights and AdamW's moments in pinned host memory (zero.h)
    int batch_size = 1, seq_len = 1024;   // B x T per data-parallel rank and micro-step
    int total_batch_size = 0;             // tokens per step (0: one micro-step, B T dp); under a ramp, the
                                          // current phase's (llmc/parallel/parallel_context.h sets it)
    BatchRamp batch_ramp;                 // --batch-ramp's phases (none: total_batch_size throughout)
    bool bf16 = sizeof(floatX) == 2;      // the build's precision (planning: the one assumed)
    int multiprocessors = 132;            // the device's (planning: H100 SXM's); sizes two scratch buffers
    bool noise_scale = false;             // measured (llmc/noise_scale.h): the step's results hold one more float
};

// data-parallel ranks: what is left of the world after pp, cp and tp
inline int layout_data_parallel(const Layout& l) { return l.ranks / (l.tp * l.pp * l.cp); }
