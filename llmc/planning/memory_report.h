/*
The memory report at the end of a run: what rank 0 held, by category and at its peak (the books of
llmc/device_memory.h), beside what the plan's formulas (llmc/planning/memory_plan.h) say it should hold; under a
pipeline, each stage's activations beside its own formula.
*/
#pragma once

#include <algorithm>
#include <cstdio>
#include <vector>
#include "../device_memory.h"
#include "../io/logger.h"
#include "../model/gpt2.cuh"
#include "../parallel/parallel_context.h"
#include "memory_plan.h"

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
