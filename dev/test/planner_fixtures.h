/*
What the planner's suites (dev/test/test_planner.cu, dev/test/test_cost_model.cu) plan with: Llama 3 405B by name,
one of Table 4's layouts with the choices Dubey et al. 2024 describe, and a machine profile written for checks
worked out by hand.
*/
#pragma once

#include "../../llmc/model/parameters.h"
#include "../../llmc/parallel/layout.h"
#include "../../llmc/planning/hardware.h"

constexpr double kGB = 1e9;  // "80 GB": the smaller reading of an 80 GB H100 (80e9 bytes, 74.5 GiB)

// Llama 3 405B by name, run at `seq_len` positions
inline GPT2Config llama_405b(int seq_len) {
    GPT2Config c;
    if (!llama_config_by_name("llama3-405B", &c)) fatal("llama3-405B is not a model name");
    c.max_seq_len = seq_len;
    gpt2_validate_config(c, "llama3-405B");
    return c;
}

/*
One of Table 4's layouts with the choices section 3.3.2 of the paper describes:
  - tp 8 within a node, sequence parallel (Megatron's, which the paper's TP follows: activations split over tp
    between the matmuls);
  - the interleaved schedule (Narayanan et al. 2021) with V stages per pp rank, and "one Transformer layer each
    [taken] from the first and the last stages": their first chunk holds the embedding alone and the last the
    LM head and loss alone, so the paper's chunks are one layer each (V = 8, 126 = 16 x 8 - 2). A stage here
    holds at least one layer, so the nearest we can run is V = 4, stages of 2 layers with 1 on the first and
    the last (126 = 16 x 4 x 2 - 2), given as --pp-layers 1,2,...,2,1;
  - FSDP that shards the optimizer state and the gradients and does not reshard the parameters after the
    forward pass (each rank keeps its stages' parameters whole through the step): our ZeRO-2;
  - micro-batches of one sequence, 16M tokens per step (32 microbatches per dp rank at DP 64, 16 at DP 128 and
    at 128K); BF16.
*/
inline Layout meta_layout(int gpus, int seq_len, int cp, RecomputePolicy recompute) {
    Layout l;
    l.ranks = gpus;
    l.tp = 8, l.pp = 16, l.cp = cp;
    l.sequence_parallel = true;
    l.schedule = PipelineSchedule::Interleaved;
    l.pp_virtual = 4;
    l.pp_layers.assign(64, 2);
    l.pp_layers.front() = l.pp_layers.back() = 1;
    l.zero_stage = 2;
    l.recompute = Recompute{recompute, 1};
    l.batch_size = 1, l.seq_len = seq_len;
    l.total_batch_size = 16 * 1024 * 1024;
    l.bf16 = true;
    return l;
}

// A machine profile written here for the checks by hand (its numbers are test inputs, round and easy to follow,
// not a machine's): peak 1 PFLOP/s; matmuls at 0.2 of it at 256^3, 0.6 at 4096^3, 0.8 at 16384^3; attention 0.3
// at 1024 keys, 0.5 at 8192; nodes of 8 ranks (alpha 1 us, 400 GB/s for every collective), leaves of 1024 ranks
// (5 us, 50 GB/s; a tree all-reduce of 10 us steps beside the ring), the spine beyond (10 us, 10 GB/s).
inline PlanHardware hand_profile(double gpu_memory_bytes = 80.0 * (1 << 30)) {
    PlanHardware hw;
    hw.name = "by-hand";
    hw.gpu_memory_bytes = gpu_memory_bytes;
    hw.peak_flops = 1e15, hw.hbm_bytes_per_second = 2e12, hw.pcie_bytes_per_second = 50e9, hw.launch_seconds = 0;
    hw.ranks_per_node = 8, hw.ranks_per_leaf = 1024, hw.cores_per_node = 0;
    hw.matmul = {{256, 256, 256, 0.2}, {4096, 4096, 4096, 0.6}, {16384, 16384, 16384, 0.8}};
    hw.attention = {{1024, 128, 0.3}, {8192, 128, 0.5}};
    const double alpha[kTiers] = {1e-6, 5e-6, 10e-6}, beta[kTiers] = {400e9, 50e9, 10e9};
    for (int tier = 0; tier < kTiers; tier++)
        for (int op = 0; op < kCollectiveOps; op++)
            for (int a = 0; a < kCollectiveAlgorithms; a++) hw.collectives[tier][op][a] = CollectiveCost{};
    for (int tier = 0; tier < kTiers; tier++) {
        for (int op = 0; op < kCollectiveOps; op++)
            hw.collectives[tier][op][(int)CollectiveAlgorithm::Ring] = CollectiveCost{true, alpha[tier], beta[tier]};
        if (tier > 0)
            hw.collectives[tier][(int)CollectiveOp::AllReduce][(int)CollectiveAlgorithm::Tree] =
                CollectiveCost{true, 2 * alpha[tier], beta[tier]};
    }
    return hw;
}
