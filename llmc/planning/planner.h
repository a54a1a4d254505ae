/*
The planner: what a layout of N ranks will need and cost, by arithmetic only (no GPU, no MPI, nothing
allocated), for any model shape. train_gpt's --plan prints one layout, --plan-search lists the layouts of
N ranks that fit in a GPU's memory, fastest first:

    Layout layout;  layout.ranks = 16384; layout.tp = 8; layout.pp = 16; ...   (the flags)
    const LayoutPlan plan = plan_layout(config, layout, hardware);   // plan.error: why it cannot run
    print_layout_plan(config, layout, hardware, plan);
    print_plan_search(config, plan_search(config, base, hardware), hardware, top);

A layout is world = dp x pp x cp x tp ranks (llmc/parallel/mesh.h's order: tp varies fastest, then cp, pp, dp), a
ZeRO stage (llmc/parallel/zero.h), a recompute policy (llmc/parallel/recompute.h), a pipeline schedule
(llmc/parallel/pipeline.h), a micro-batch B x T per data-parallel rank and a total batch per optimizer step (the rest
is the pipeline's microbatches, m = total / (B T dp)). Each number comes from the formula of the file that does the
work:
    memory per rank     llmc/planning/memory.h plan_training_memory, per pp rank (the stages hold different layers,
                        records in flight and the embedding / LM head); "fits" takes the largest
    bytes per step      dp: the ZeRO stage's collectives (memory.h's communication row), tp: tensor_parallel.h
    on each axis        tp_bytes_per_step, pp: pipeline.h pipeline_bytes_per_step (the busiest pp rank),
                        cp: context_parallel.h cp_bytes_per_step, from a tp rank's heads: the ring carries K
                        and V alone, so a model with grouped K/V heads passes kv_heads HS / tp columns of
                        each (Llama 3 405B: 1/16 of C/tp); Ulysses' all-to-alls carry q, k and v rows;
                        ep: expert_parallel.h ep_bytes_per_step, the routed rows spread evenly over the experts
                        (the real routing is what it is: the run logs it), not hidden by compute
    pipeline bubble     the schedule's lists (pipeline_schedule.h) simulated (pipeline_simulator.h) with each
                        stage's own F, B and W (plan_stage_passes, below); the mean over the pp ranks of the time
                        each is idle. Equal stages give pipeline_bubble_fraction, which --plan prints beside it.
Two corrections to those formulas, which each count a plain step of a whole model: under pp a rank runs
L/pp layers, so the tp bytes are counted for its layers (with the embedding and LM head terms on every
pp rank: an upper bound by 4 (t-1)/t N C s per micro-step); under --recompute full the backward pass runs
every block forward again, tp collectives included: + 4 l (t-1)/t N C s per micro-step (cp's formula
already has its forward-pass count F).

The cost model of the estimated step time (one step, seconds; each term printed beside the result), priced by a
machine profile (llmc/planning/hardware.h: --machine, the built-in h100 by default, whose numbers are cited in
llmc/planning/h100_profile.h; scripts/bench/calibrate.sh measures one). The prices are in
llmc/planning/cost_model.h:
    compute   the mean pp rank's passes, per microbatch and stage (plan_stage_passes), times the microbatches:
              matmuls     every matmul a rank runs, forward (M, N, K) = (rows, out, in) and its backward dX
                          (M, K, N) and dW (N, K, M), each 2 M N K / (peak x matmul_efficiency(M, N, K)), the
                          profile's shape table. Rows: B T/cp (gathered under SP); tp splits qkv and fc by columns,
                          the projections by rows, the LM head by the vocabulary; a mixture's experts take the
                          rank's routed rows (B/tp sequences x K choices, spread evenly over the experts). Their FLOPs
                          add up to pipeline.h's 6 x weights per token (dev/test/test_cost_model.cu checks it)
              attention   what the flash kernel computes: the key tiles a causal row sees (T/2 of T), 2 products of
                          HS per visible score forward, 7 backward (its deterministic two-kernel backward), at
                          attention_efficiency(keys per kernel call: T; a ring step's T/cp, T/(2 cp) zigzag; head size)
              memory      the memory-bound kernels at their bytes read + written over the rate the profile gives
                          their kind at the block's width and rows (memory_bytes_per_second): the norms (LayerNorm's
                          or RMSNorm's; the classifier's softmax over the vocabulary at LayerNorm's), pointwise
                          (residual adds, GELU / SwiGLU, RoPE, attention's preprocessing, the ring's merges, the
                          encoder, GPT-2's biases) and a mixture's routing (router, dispatch, combine), plus launch_seconds per kernel launch (counted per
                          block from forward_backward.cuh); AdamW over the rank's parameter shard once per step
                          (28 + s bytes a parameter) at hbm_bytes_per_second
              F = forward; B = the dX matmuls, attention's backward and the memory-bound backward (+ a block's
              forward again where recomputation reruns it: full, or the f letters); W = the dW matmuls. The LM
              head's backward is F where the schedule does not split the backward (the program runs it after the
              loss). Everything is divided by rank_compute_share (the CPU build's ranks share the host's cores:
              ranks_on_node = min(ranks, ranks_per_node)). Hardware FLOPs (printed) are mfu.h's model FLOPs plus
              the recomputation's; MFU counts the model FLOPs (PaLM's 12 L C T attention included).
    per axis  = the collectives one rank calls per step (cost_model.h tp_collective_calls, cp_collective_calls,
              ep_collective_calls; here dp_collective_calls, pp_collective_calls), each of its op, group size g
              and nccl-tests' n, priced by collective_seconds: steps(op, algorithm, g) x alpha + factor x n / beta
              on the tier the group spans (node: within ranks_per_node consecutive ranks; leaf: within
              ranks_per_leaf; spine beyond), the cheaper of ring and tree where the profile has both. So alpha
              counts once per call. Divided by rank_compute_share too: the CPU build's collectives are copies its
              ranks make on the shared cores (calibrate.sh measures alpha and beta with a core per rank). A ring
              (not an all-to-all) that crosses the spine crosses it once per leaf,
              so the leaf's uplinks pool the spine's per-rank bandwidth over the group's ranks in the leaf, up to
              the leaf's (spine_ring_seconds). Spans (mesh order: tp fastest, then cp, pp, dp): tp g = tp; cp
              tp cp; pp tp cp pp; ep tp cp pp ep; dp all ranks. The calls' bytes sum to the byte formulas above
              (checked)
    cp shown  = the part of the cp axis's time that attention does not hide (ring; below), or all of it (Ulysses)
    recompute = selective's norms and activation again (priced as above) and offload's PCIe transfers that compute
                does not hide (llmc/planning/recompute_choice.h, whose full letter is priced as here: the block's forward
                and its tp calls), for the policies and letters that have them (full's rerun is in compute's B
                and in tp)
    step      = (compute + tp + cp shown + pp + ep + recompute) / (1 - bubble)  +  dp exposed (below)
              where ranks share a node's cores (share < 1), a rank waiting out the bubble leaves its core to the
              others: the longer of that sum x share / (1 - bubble) (the pipeline at a whole core each) and the sum
              itself (the node's work over its cores)
Overlap: dp's reductions (the gradient all-reduce or reduce-scatter) run on their own stream while the blocks
compute (llmc/parallel/zero.h reduces each chunk as soon as its gradient is final), so only the part longer than the
compute they run beside shows: ZeRO 0 and 1 reduce in the step's last microbatch, behind its backward pass alone
(B + W of one microbatch); ZeRO 2 every microbatch, behind every backward pass; ZeRO 3 also gathers each chunk
ahead of its forward and backward passes, behind all of the compute. ZeRO 1 and 2 gather the updated shards after
the optimizer step on the compute stream, before anything else runs: those all-gathers show whole. tp and pp are
counted in full: a tp all-reduce sits between two matmuls that need it (only f's backward overlaps, with the weight
gradient), and a pp send is
the next stage's input; counting them whole makes the estimate an upper bound for those axes. Ring attention
passes the next K/V block on a stream of its own while the compute stream works on the block in hand
(llmc/parallel/context_parallel.h), so only a transfer longer than its step's attention shows
(plan_cp_shown_seconds); Ulysses' all-to-alls sit between the qkv matmul, attention and the output projection,
each waiting for the other, and show whole. Hiding needs something idle to move the bytes: a GPU's copy engines and
NCCL's kernels beside the compute; the CPU build's collectives are copies on the cores its ranks compute on, so where
the ranks outnumber the cores (share < 1) dp's and the cp ring's transfers show whole. The pipeline's idle time
stretches all of a microbatch's work, communication on the critical path included: / (1 - bubble).
Optimizer offload (--offload optimizer, llmc/parallel/zero.h): every step moves the rank's optimizer state (the
memory plan's host bytes, 12 or 8 bytes per parameter of its shard) up to the device and back down once, over
PCIe at the profile's pcie_bytes_per_second, up and down one after the other on one copy stream: offload = 2 x host
bytes / PCIe bandwidth, on the rank with the most. None of it counts as hidden: the update runs after the gradients
are final and the next step's forward pass needs its parameters, so it adds to the step whole (the double buffering
hides the kernels behind the copies, not the copies behind the step):
    step     += offload
Not modelled: collective kernels taking SMs and memory bandwidth from the matmuls they overlap; contention of
several axes for one link; stragglers and clock changes across many devices; the contiguous cp split's unequal
steps; an uneven routing of a mixture's rows (the run logs it); the grad-norm and the loss's host round trips.
Against Llama 3 405B's published MFU (Table 4) the model under the h100 profile is optimistic: the test prints
each term and what the difference points at. The ranking is for comparing layouts, not a promise of seconds.

Memory: "fits" means the plan's total on the fullest pp rank plus --memory-reserve (2 GiB by default: the CUDA context,
cuBLASLt's workspace and NCCL's buffers, which no formula here counts) is at most --gpu-memory.
*/
#pragma once

#include <algorithm>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>
#include "../utils.h"
#include "../parallel/pipeline.h"  // before memory.h: the Pipeline's half without its executor (see pipeline.h)
#include "memory.h"
#include "mfu.h"
#include "../parallel/recompute.h"
#include "../parallel/mesh.h"
#include "../model/parameters.h"
#include "../parallel/tensor_parallel.h"
#include "../parallel/context_parallel.h"
#include "../parallel/expert_parallel.h"
#include "../parallel/layout.h"
#include "hardware.h"
#include "cost_model.h"
#include "../parallel/pipeline_schedule.h"
#include "../parallel/pipeline_simulator.h"
#include "recompute_choice.h"

// ----------------------------------------------------------------------------
// the inputs

// The machine the estimate assumes: PlanHardware (llmc/planning/hardware.h).

// The axes whose bytes the plan counts, in the order they are printed.
enum PlanAxis { PLAN_DP = 0, PLAN_TP, PLAN_PP, PLAN_CP, PLAN_EP };
constexpr int kPlanAxes = 5;
inline const char* plan_axis_name(int axis) {
    static const char* names[kPlanAxes] = {"dp", "tp", "pp", "cp", "ep"};
    return names[axis];
}

// ----------------------------------------------------------------------------
// the results

struct LayoutPlan {
    std::string error;                // not empty: the layout cannot run, and nothing below is set
    int dp = 1, shard = 1, accumulation = 1;
    std::vector<GPT2MemoryShape> shapes;  // per pp rank
    std::vector<MemoryPlan> stages;       // per pp rank: bytes by category
    std::vector<double> pp_bytes;         // per pp rank: bytes sent on the pp axis per step
    std::vector<int> stage_layers;        // per model stage: its layers (pipeline_stage_split)
    std::vector<double> stage_seconds;    // per model stage: compute of one microbatch, forward + backward
    std::vector<PassSeconds> stage_passes;  // per model stage: F, B and W of one microbatch (plan_stage_passes)
    int fullest_stage = 0;                // the pp rank with the most memory
    double peak_bytes = 0;                // its total
    bool fits = false;                    // peak_bytes + the reserve <= the GPU's memory
    double bytes[kPlanAxes] = {};         // per step, sent by one rank (pp: the busiest pp rank)
    Tier tiers[kPlanAxes] = {};           // the tier the axis's group spans (node, leaf, spine)
    std::vector<CollectiveCalls> collectives[kPlanAxes];  // the calls one rank makes per step (pp: the busiest)
    double bubble = 0;          // simulated with each stage's cost
    double bubble_formula = 0;  // the schedule's formula for equal stages
    double pipelined_seconds = 0;  // the pipeline with a whole core a rank, dp aside: (compute + axes) x share / (1 - bubble)
    // the estimate (seconds per step)
    double tokens = 0, model_flops = 0, hardware_flops = 0;  // per step, all ranks
    double compute_seconds = 0, axis_seconds[kPlanAxes] = {}, exposed_dp_seconds = 0, step_seconds = 0;
    ComputeSeconds compute;  // compute_seconds by kind (memory: the memory-bound kernels, launches, AdamW)
    double shown_cp_seconds = 0;  // the part of axis_seconds[PLAN_CP] that attention does not hide
    double mfu = 0;
    double offload_bytes = 0, offload_seconds = 0;  // --offload optimizer: up and down per step, the rank with the most
    double recompute_seconds = 0;  // selective's passes and offload's transfers (full's rerun is in compute and tp)
    bool recompute_auto = false;   // --recompute auto: layout.recompute holds the letters recompute_choice chose
    RecomputeChoice recompute_choice;
    Layout layout;
};

// One line saying why the layout cannot run (empty: it can), the checks the trainer makes, in its order.
inline std::string plan_layout_error(const GPT2Config& config, const Layout& l) {
    std::string error = moe_layout_error(config, l);
    if (!error.empty()) return error;
    error = tp_layout_error(config, l.tp, l.sequence_parallel, l.seq_len);
    if (!error.empty()) return error;
    if (l.ranks % (l.tp * l.pp * l.cp) != 0)
        return plan_format("--plan %d ranks are not a multiple of --pp %d x --cp %d x --tp %d", l.ranks, l.pp, l.cp,
                           l.tp);
    const int dp = l.ranks / (l.tp * l.pp * l.cp);
    const int shard = l.dp_shard == 0 ? dp : l.dp_shard;
    if (dp % shard != 0) return plan_format("--dp-shard %d does not divide the %d data-parallel ranks", shard, dp);
    const long long per_micro_step = (long long)l.batch_size * l.seq_len * dp;
    if (per_micro_step > INT_MAX)
        return plan_format("--batch-size %d x --seq-len %d x %d data-parallel rank(s) = %lld tokens per micro-step, "
                           "more than the %d an int holds", l.batch_size, l.seq_len, dp, per_micro_step, INT_MAX);
    if (l.total_batch_size % per_micro_step != 0)
        return plan_format("--total-batch-size %d is not a multiple of --batch-size x --seq-len x data-parallel "
                           "ranks = %lld", l.total_batch_size, per_micro_step);
    const int accumulation = l.total_batch_size > 0 ? (int)(l.total_batch_size / per_micro_step) : 1;
    error = pipeline_layout_error(l.schedule, l.pp, l.pp_virtual, accumulation, config.num_layers);
    if (!error.empty()) return error;
    error = mesh_model_error(mesh_layout(1, dp, l.pp, l.cp, l.tp), config.num_layers, config.num_heads);
    if (!error.empty()) return error;
    error = ep_layout_error(config.experts, l);
    if (!error.empty()) return error;
    error = cp_layout_error(l.cp, l.cp_mode, l.cp_split, l.seq_len, config.num_heads, l.tp);
    if (!error.empty()) return error;
    if (l.cp > 1 && l.cp_mode == ContextParallelMode::Ulysses) {  // the K/V heads split over cp too
        error = ulysses_heads_error(l.cp, AttentionHeads{config.num_heads / l.tp, config.kv_heads / l.tp,
                                                         config.head_size()});
        if (!error.empty()) return error;
    }
    return tp_context_parallel_rows_error(l.tp, l.sequence_parallel, l.seq_len, l.cp);
}

// ----------------------------------------------------------------------------
// one layout

// Blocks a rank runs again per microbatch under recomputation: every one of its L/pp under full; the 'f'
// positions of each of its stage records under per-block letters.
inline double plan_rerun_blocks(const GPT2Config& config, const Layout& l) {
    if (l.recompute.policy == RecomputePolicy::Full) return config.num_layers / l.pp;
    if (l.recompute.policy == RecomputePolicy::PerBlock)
        return (double)std::count(l.recompute.blocks.begin(), l.recompute.blocks.end(), BlockKeep::Full) * l.pp_virtual;
    return 0.0;
}

// Bytes one rank sends on the tp axis per step, for the layers it runs (see the top of the file).
inline double plan_tp_bytes(const GPT2Config& config, const Layout& l, int accumulation) {
    if (l.tp == 1) return 0.0;
    GPT2Config stage = config;
    stage.num_layers = config.num_layers / l.pp;
    const int T = l.seq_len / l.cp;
    double bytes = tp_bytes_per_step(stage, l.batch_size, T, l.tp, l.sequence_parallel, accumulation, l.zero_stage,
                                     l.bf16, l.ep);
    // the blocks' forward collectives, once more, for the blocks full reruns
    const double rerun = plan_rerun_blocks(config, l);
    if (rerun > 0) bytes += rerun * recompute_rerun_tp_bytes(config, l) * accumulation;
    return bytes;
}

// Each model stage's F, B and W for one microbatch on one of its ranks (llmc/planning/cost_model.h): its blocks',
// the embedding on the first stage, the LM head and loss on the last (whose backward counts as F where the schedule
// does not split the backward: the program runs it right after the loss). A block that recomputation runs again
// (--recompute full, or an f letter of --recompute-blocks at its position in the stage) adds its forward pass to B.
// The pipeline bench compares these with the passes it measures.
inline std::vector<PassSeconds> plan_stage_passes(const GPT2Config& config, const Layout& l, const PlanHardware& hw,
                                                  const std::vector<int>& stage_layers) {
    std::vector<PassSeconds> passes;
    const int S = (int)stage_layers.size();
    for (int stage = 0; stage < S; stage++) {
        PassSeconds p;
        const int first = pipeline_first_layer(stage_layers, stage);
        for (int i = 0; i < stage_layers[stage]; i++) {
            const PassSeconds block = block_pass_seconds(config, first + i, l, hw);
            p += block;
            const bool rerun = l.recompute.policy == RecomputePolicy::Full ||
                               (l.recompute.policy == RecomputePolicy::PerBlock && i < (int)l.recompute.blocks.size() &&
                                l.recompute.blocks[i] == BlockKeep::Full);
            if (rerun) p.input_gradient += block.forward;
        }
        if (stage == 0) p += embedding_pass_seconds(config, l, hw);
        if (stage == S - 1) p += head_pass_seconds(config, l, hw, pipeline_splits_backward(l.schedule));
        passes.push_back(p);
    }
    return passes;
}

// The bubble that the stages' own F, B and W give: every rank's list run by the simulator, placing the work as
// llmc/parallel/pipeline.h does (a backward that is not split takes B + W at once; pipeline_simulator.h's
// pipeline_simulate_stages, which also plans a measured step's bubble from its measured passes). The mean idle
// share over the pp ranks.
inline double plan_simulated_bubble(PipelineSchedule schedule, int p, int m, int V, const std::vector<PassSeconds>& passes) {
    if (p == 1) return 0.0;
    const bool split = pipeline_splits_backward(schedule);
    std::vector<std::array<double, 3>> stage_seconds;
    for (const PassSeconds& stage : passes)
        stage_seconds.push_back({stage.forward.total(),
                                 stage.input_gradient.total() + (split ? 0.0 : stage.weight_gradient.total()),
                                 stage.weight_gradient.total()});
    const PipelineTimeline t = pipeline_simulate_stages(schedule, p, m, V, stage_seconds);
    double idle = 0;
    for (double b : t.bubble_fraction) idle += b;
    return idle / p;
}

/*
The cp axis's time that the ring does not hide. Ring attention (llmc/parallel/context_parallel.h) starts passing
the next K/V block on its own stream before it computes the attention of the block in hand, and waits for it
before the next step, so a step lasts max(transfer, attention) and only the excess shows. In the backward pass
the block's dK/dV buffer sets out after the step's attention has added to it, and the next step adds to the
buffer that arrives: that pass waits whole, as does the last one, which brings the gradient home. Per layer and
microbatch, with t the time of one block's send/receive (N rows of 2 k values, k = kv_heads HS / tp; collective_seconds
on the cp group's tier) and a one step's attention forward (cost_model.h's price of the block's attention forward, of
which the zigzag split gives each of the cp steps the same share: 1/cp of it):
    forward   F (cp - 1) max(0, t - a)          (F = 2 under --recompute full, which reruns the ring)
    backward  (cp - 1) max(0, t - 2a) + cp t    (the backward's attention: more than twice the forward's, 2a taken)
With a = 0 the lines add up to cp_bytes_per_step's ((cp - 1) F + 2 cp - 1) blocks, the axis's seconds. The
contiguous split's steps are not equal (the last cp rank sees every block whole, the first none): not modelled.
Ulysses: nothing to hide behind, all of the axis's seconds show.
*/
inline double plan_cp_shown_seconds(const Layout& l, int layers, int microbatches, double cp_seconds,
                                    double block_seconds, double step_attention_seconds) {
    if (l.cp == 1 || l.cp_mode != ContextParallelMode::Ring) return cp_seconds;
    const double cp = l.cp, F = l.recompute.policy == RecomputePolicy::Full ? 2 : 1;
    const double t = block_seconds, a = step_attention_seconds;
    const double per_layer = F * (cp - 1) * std::max(0.0, t - a) + (cp - 1) * std::max(0.0, t - 2 * a) + cp * t;
    return per_layer * layers * microbatches;
}

// The pp axis's calls per step of pp rank `rank` (llmc/parallel/pipeline.h): a send per microbatch to each
// neighbouring stage on another rank (the activation forward, its gradient backward: B T/cp C values, / tp under
// SP); the tied embedding's gradient between the first and the last stage; the loss's broadcast and all-reduce of
// one fp32 (the broadcast priced as an all-gather: the same bytes per rank, (p-1)/p n).
inline std::vector<CollectiveCalls> pp_collective_calls(const Layout& l, int rank, int m, double activation_elements,
                                                        double embedding_elements) {
    std::vector<CollectiveCalls> calls;
    const int p = l.pp, V = l.pp_virtual, S = p * V, span = l.tp * l.cp * l.pp;
    if (p == 1) return calls;
    const double s = l.bf16 ? 2 : 4;
    int neighbours = 0;
    for (int v = 0; v < V; v++) {
        const int stage = pipeline_model_stage(l.schedule, rank, v, p);
        neighbours += stage < S - 1 && pipeline_stage_rank(l.schedule, stage + 1, p) != rank;
        neighbours += stage > 0 && pipeline_stage_rank(l.schedule, stage - 1, p) != rank;
    }
    calls.push_back({CollectiveOp::SendRecv, p, span, (double)neighbours * m, activation_elements * s});
    const int last_stage_rank = pipeline_stage_rank(l.schedule, S - 1, p);
    if (last_stage_rank != 0 && (rank == 0 || rank == last_stage_rank) && embedding_elements > 0)
        calls.push_back({CollectiveOp::SendRecv, p, span, 1, embedding_elements * s});
    calls.push_back({CollectiveOp::AllGather, p, span, 1, 4});
    calls.push_back({CollectiveOp::AllReduce, p, span, 1, 4});
    return calls;
}

// The dp axis's calls per step (llmc/parallel/zero.h reduces and gathers chunk by chunk: `chunks` of them on the
// rank, each 1/chunks of its P parameters, an estimate for the sizes): ZeRO 0 an all-reduce of each chunk's
// gradient per step; ZeRO 1 a reduce-scatter and an all-gather per chunk and step; ZeRO 2 the reduce-scatter every
// microbatch; ZeRO 3 besides it an all-gather before each chunk's forward and backward pass, every microbatch; the
// replicas of a shard (HSDP, or expert parallelism's dense shards) an all-reduce of each chunk's shard per step. The
// bytes are memory.h's communication row, which splits as these calls do (what is not the shard group's within is
// the replicas' all-reduce; under ZeRO 0 with experts the experts' all-reduce, over fewer ranks, is counted with the
// dense one's ranks).
inline std::vector<CollectiveCalls> dp_collective_calls(const MemoryPlan& rank, int chunks, int span) {
    std::vector<CollectiveCalls> calls;
    const double P = (double)rank.num_parameters, s = rank.bf16 ? 2 : 4, A = rank.accumulation_steps;
    const int D = rank.data_parallel_ranks, N = rank.shard_ranks, M = rank.replica_groups;
    chunks = std::max(chunks, 1);
    if (rank.zero_stage == 0) {
        if (D > 1) calls.push_back({CollectiveOp::AllReduce, D, span, (double)chunks,
                                    rank.communication / collective_bus_factor(CollectiveOp::AllReduce, D) / chunks});
        return calls;
    }
    double within = 0;
    if (N > 1) {
        const double scatters = rank.zero_stage == 1 ? 1 : A, gathers = rank.zero_stage == 3 ? 2 * A : 1;
        calls.push_back({CollectiveOp::ReduceScatter, N, span, scatters * chunks, P * s / chunks});
        calls.push_back({CollectiveOp::AllGather, N, span, gathers * chunks, P * s / chunks});
        within = collective_calls_bytes(calls);
    }
    const double across = rank.communication - within;
    if (M > 1 && across > 0)
        calls.push_back({CollectiveOp::AllReduce, M, span, (double)chunks,
                         across / collective_bus_factor(CollectiveOp::AllReduce, M) / chunks});
    return calls;
}

// Each pp rank's memory and time as functions of the per-block letters (llmc/planning/recompute_choice.h), from a
// plan of the layout: its shapes, and with_memory, its totals (the plan must keep every position: the base).
inline std::vector<RecomputeRank> plan_recompute_ranks(const GPT2Config& config, const Layout& l, const PlanHardware& hw,
                                                       const LayoutPlan& plan, bool with_memory) {
    std::vector<RecomputeRank> ranks;
    for (int r = 0; r < l.pp; r++) {
        std::vector<int> stage_sizes;
        for (int v = 0; v < l.pp_virtual; v++)
            stage_sizes.push_back(plan.stage_layers[pipeline_model_stage(l.schedule, r, v, l.pp)]);
        const BlockKeepCosts costs = block_keep_costs(config, l, hw, gpt2_activation_bytes(plan.shapes[r], l.bf16).block);
        ranks.push_back(recompute_rank(plan.shapes[r], l.bf16, with_memory ? plan.stages[r].total : 0.0, stage_sizes,
                                       plan.accumulation, costs));
        if (config.moe()) ranks.back().kinds_allowed &= ~(1u << (int)BlockKeep::Offload);
    }
    return ranks;
}

inline LayoutPlan plan_layout(const GPT2Config& config, const Layout& l, const PlanHardware& hw);

// --recompute auto: the layout planned with every position kept gives each rank's memory as a function of the letters;
// the fastest letters that fit every rank (recompute_choose); the layout planned again with them, each rank's total
// checked to equal the choice's sum to the byte. No letters fit: the least-memory ones, planned, fits false, and
// recompute_choice.error says why.
inline LayoutPlan plan_layout_recompute_auto(const GPT2Config& config, const Layout& asked, const PlanHardware& hw) {
    LayoutPlan refused;
    refused.layout = asked;
    refused.error = plan_layout_error(config, asked);
    if (!refused.error.empty()) return refused;
    const std::vector<int> stages = pipeline_stage_split(config, asked);
    Layout keep = asked;
    keep.recompute = Recompute{RecomputePolicy::PerBlock, 1,
                               std::vector<BlockKeep>(*std::max_element(stages.begin(), stages.end()), BlockKeep::Keep)};
    const LayoutPlan kept = plan_layout(config, keep, hw);
    if (!kept.error.empty()) return kept;
    RecomputeChoice choice = recompute_choose(plan_recompute_ranks(config, keep, hw, kept, true),
                                              hw.gpu_memory_bytes - hw.reserve_bytes, hw);
    Layout chosen = asked;
    chosen.recompute = Recompute{RecomputePolicy::PerBlock, 1, choice.blocks};
    LayoutPlan plan = plan_layout(config, chosen, hw);
    for (int r = 0; r < asked.pp; r++)
        if (plan.stages[r].total != choice.rank_bytes[r])
            fatal("--recompute auto: pp rank %d's plan holds %.0f bytes under --recompute-blocks %s, the choice's sum "
                  "says %.0f", r, plan.stages[r].total, recompute_blocks_text(choice.blocks).c_str(), choice.rank_bytes[r]);
    if (!choice.error.empty()) plan.fits = false;
    plan.recompute_auto = true;
    plan.recompute_choice = std::move(choice);
    return plan;
}

inline LayoutPlan plan_layout(const GPT2Config& config, const Layout& l, const PlanHardware& hw) {
    if (l.recompute.policy == RecomputePolicy::Auto) return plan_layout_recompute_auto(config, l, hw);
    LayoutPlan plan;
    plan.layout = l;
    plan.error = plan_layout_error(config, l);
    if (!plan.error.empty()) return plan;
    const int L = config.num_layers, p = l.pp, V = l.pp_virtual, T_local = l.seq_len / l.cp;
    plan.dp = l.ranks / (l.tp * l.pp * l.cp);
    plan.shard = l.dp_shard == 0 ? plan.dp : l.dp_shard;
    const int per_micro_step = l.batch_size * l.seq_len * plan.dp;
    const int m = plan.accumulation = l.total_batch_size > 0 ? l.total_batch_size / per_micro_step : 1;
    // the cp ranks of a replica average gradients and share ZeRO shards with the data-parallel ones
    // (under expert parallelism the state is sharded over the ranks holding the same experts: dp/ep of them)
    const int gradient_ranks = plan.dp * l.cp, shard_ranks = (l.ep > 1 ? plan.dp / l.ep : plan.shard) * l.cp;
    const int shards = l.zero_stage == 0 ? 1 : shard_ranks;
    const double s = l.bf16 ? 2 : 4;
    const double activation_elements = (double)l.batch_size * T_local * config.channels /
                                       (l.sequence_parallel ? l.tp : 1);

    // memory and pp bytes, per pp rank
    plan.stage_layers = pipeline_stage_split(config, l);
    const std::vector<std::vector<std::vector<PipelineMessage>>> groups = pipeline_all_groups(l.schedule, p, V, m);
    std::vector<std::vector<CollectiveCalls>> pp_calls;  // per pp rank
    int rank0_chunks = 1;
    for (int r = 0; r < p; r++) {
        const ModelPart part = pipeline_model_part(l.schedule, r, p, V, m, plan.stage_layers, config.tied_head(),
                                                   pipeline_outboxes(groups[r]));
        const GPT2MemoryShape shape = gpt2_memory_shape(config, l, part);
        const ParameterLayout layout(config, shards, l.tp, 0, part.held_chunks, l.ep, 0);
        plan.shapes.push_back(shape);
        plan.stages.push_back(plan_training_memory(layout.total, l.zero_stage, gradient_ranks, shard_ranks, l.bf16, m,
                                                   &shape, l.offload_optimizer));
        plan.offload_bytes = std::max(plan.offload_bytes, 2 * plan.stages.back().host_optimizer_state);
        // the tied embeddings' gradient, summed between the first and the last stage (GPT-2)
        const double embedding = part.held_chunks[0] && config.tied_head() ? (double)layout.chunk_size(0) / shards : 0.0;
        plan.pp_bytes.push_back(pipeline_bytes_per_step(l.schedule, r, p, V, m, activation_elements, s, embedding));
        pp_calls.push_back(pp_collective_calls(l, r, m, activation_elements, embedding));
        if (r == 0) rank0_chunks = (int)std::count(part.held_chunks.begin(), part.held_chunks.end(), 1);
        if (plan.stages[r].total > plan.stages[plan.fullest_stage].total) plan.fullest_stage = r;
    }
    plan.peak_bytes = plan.stages[plan.fullest_stage].total;
    plan.fits = plan.peak_bytes + hw.reserve_bytes <= hw.gpu_memory_bytes;

    // bytes per step on each axis (the formulas of the files that send them)
    plan.bytes[PLAN_DP] = plan.stages[0].communication;
    plan.bytes[PLAN_TP] = plan_tp_bytes(config, l, m);
    const int busiest_pp = (int)(std::max_element(plan.pp_bytes.begin(), plan.pp_bytes.end()) - plan.pp_bytes.begin());
    plan.bytes[PLAN_PP] = plan.pp_bytes[busiest_pp];
    // each stage's F, B and W per microbatch (llmc/planning/cost_model.h), on one of its ranks
    plan.stage_passes = plan_stage_passes(config, l, hw, plan.stage_layers);
    for (const PassSeconds& stage : plan.stage_passes) plan.stage_seconds.push_back(stage.total());
    int most_layers = 0, most_mixtures = 0;  // on one pp rank: blocks, and blocks with a mixture of experts
    for (int r = 0; r < p; r++) {
        int layers = 0, mixtures = 0;
        for (int v = 0; v < V; v++) {
            const int stage = pipeline_model_stage(l.schedule, r, v, p), first = pipeline_first_layer(plan.stage_layers, stage);
            layers += plan.stage_layers[stage];
            for (int layer = first; layer < first + plan.stage_layers[stage]; layer++) mixtures += config.moe_block(layer);
        }
        most_layers = std::max(most_layers, layers);
        most_mixtures = std::max(most_mixtures, mixtures);
    }
    // a tp rank's query and K/V heads
    const AttentionHeads tp_rank_heads{config.num_heads / l.tp, config.kv_heads / l.tp, config.head_size()};
    plan.bytes[PLAN_CP] = cp_bytes_per_step(l.cp_mode, l.cp, l.batch_size, l.seq_len, tp_rank_heads, most_layers,
                                            l.recompute.policy == RecomputePolicy::Full ? 2 : 1, m, (size_t)s);
    // the ep axis: routed rows spread evenly over the experts, a tp rank routing B/tp of the sequences
    const bool full = l.recompute.policy == RecomputePolicy::Full;
    const RoutedSteps routed{config.experts, config.experts_per_token, config.channels, l.batch_size / l.tp, T_local,
                             most_mixtures, m, full ? 2 : 1, (size_t)s};
    plan.bytes[PLAN_EP] = config.moe() ? ep_bytes_per_step(l.ep, routed) : 0.0;
    // the calls that send those bytes (consecutive dp ranks are tp cp pp world ranks apart)
    const int spans[kPlanAxes] = {l.ranks, l.tp, l.tp * l.cp * l.pp, l.tp * l.cp, l.tp * l.cp * l.pp * l.ep};
    plan.collectives[PLAN_DP] = dp_collective_calls(plan.stages[0], rank0_chunks, spans[PLAN_DP]);
    GPT2Config stage_config = config;  // the tp bytes' count of a rank's layers (plan_tp_bytes)
    stage_config.num_layers = config.num_layers / l.pp;
    plan.collectives[PLAN_TP] = tp_collective_calls(stage_config, l, m, plan_rerun_blocks(config, l));
    plan.collectives[PLAN_PP] = pp_calls[busiest_pp];
    plan.collectives[PLAN_CP] = cp_collective_calls(l, tp_rank_heads, most_layers, full ? 2 : 1, m);
    plan.collectives[PLAN_EP] = ep_collective_calls(config, l, most_mixtures, full ? 2 : 1, m);
    plan.bubble_formula = pipeline_bubble_fraction(l.schedule, p, m, V);
    plan.bubble = plan_simulated_bubble(l.schedule, p, m, V, plan.stage_passes);

    // the estimate (the cost model at the top of the file)
    plan.tokens = (double)per_micro_step * m;
    plan.model_flops = model_flops_per_token(config, l.seq_len) * plan.tokens;
    plan.hardware_flops = plan.model_flops + recompute_extra_flops_per_token(l.recompute, active_block_parameters(config),
                                                                             L, config.channels, l.seq_len) * plan.tokens;
    // the mean pp rank's: uneven stages idle the others, which the simulated bubble counts; AdamW on its shard
    for (const PassSeconds& stage : plan.stage_passes) {
        plan.compute += stage.forward.scaled((double)m / p);
        plan.compute += stage.input_gradient.scaled((double)m / p);
        plan.compute += stage.weight_gradient.scaled((double)m / p);
    }
    for (int r = 0; r < p; r++)
        plan.compute.memory += optimizer_seconds((double)plan.stages[r].num_parameters / (l.zero_stage >= 1 ? shard_ranks : 1),
                                                 rank0_chunks, l.bf16, hw, layout_compute_share(hw, l)) / p;
    plan.compute_seconds = plan.compute.total();
    const double share = layout_compute_share(hw, l);
    for (int a = 0; a < kPlanAxes; a++) {
        plan.tiers[a] = group_tier(hw, spans[a]);
        plan.axis_seconds[a] = collective_calls_seconds(hw, plan.collectives[a], share);
    }
    {
        // dp's overlap (the top of the file): what the reductions hide behind, and ZeRO 1-2's gathers after the update
        double backward = 0;  // the mean pp rank's B and W per step
        for (const PassSeconds& stage : plan.stage_passes)
            backward += (stage.input_gradient.total() + stage.weight_gradient.total()) * m / p;
        // ranks that share the cores (share < 1) have no idle core to copy on while they compute: nothing hides
        const double behind = share < 1                ? 0.0
                              : l.zero_stage == 3 ? plan.compute_seconds
                              : l.zero_stage == 2 ? backward
                                                  : backward / m;
        std::vector<CollectiveCalls> during, after;
        for (const CollectiveCalls& c : plan.collectives[PLAN_DP])
            (c.op == CollectiveOp::AllGather && l.zero_stage < 3 ? after : during).push_back(c);
        plan.exposed_dp_seconds = std::max(0.0, collective_calls_seconds(hw, during, share) - behind) +
                                  collective_calls_seconds(hw, after, share);
    }
    {
        double block_attention = 0;  // the mean block's attention forward, per microbatch
        for (int layer = 0; layer < L; layer++) block_attention += block_pass_seconds(config, layer, l, hw).forward.attention / L;
        const double kv_block = 2.0 * l.batch_size * T_local * tp_rank_heads.kv_columns() * s;
        plan.shown_cp_seconds = share < 1 ? plan.axis_seconds[PLAN_CP]  // no idle core to copy on (as dp's)
                                          : plan_cp_shown_seconds(
                                                l, most_layers, m, plan.axis_seconds[PLAN_CP],
                                                collective_seconds(hw, CollectiveOp::SendRecv, l.cp, spans[PLAN_CP], kv_block),
                                                block_attention / l.cp);
    }
    // selective's elementwise passes and offload's transfers (llmc/planning/recompute_choice.h)
    if (l.recompute.policy == RecomputePolicy::Selective || l.recompute.policy == RecomputePolicy::PerBlock) {
        const std::vector<RecomputeRank> ranks = plan_recompute_ranks(config, l, hw, plan, false);
        const std::vector<BlockKeep> letters = l.recompute.policy == RecomputePolicy::PerBlock
                                                   ? l.recompute.blocks
                                                   : std::vector<BlockKeep>(*std::max_element(plan.stage_layers.begin(),
                                                                                              plan.stage_layers.end()),
                                                                            BlockKeep::Selective);
        plan.recompute_seconds = recompute_seconds(ranks, letters, 1u << (int)BlockKeep::Selective |
                                                                       1u << (int)BlockKeep::Offload);
    }
    // ranks that share a node's cores (share < 1) wait out the bubble blocked, and the others run on the core it
    // leaves: the step is the longer of the pipeline with a whole core a rank and the node's work over its cores
    const double busy = plan.compute_seconds + plan.axis_seconds[PLAN_TP] + plan.shown_cp_seconds +
                        plan.axis_seconds[PLAN_PP] + plan.axis_seconds[PLAN_EP] + plan.recompute_seconds;
    plan.pipelined_seconds = busy * share / (1.0 - plan.bubble);
    plan.step_seconds = std::max(plan.pipelined_seconds, share < 1 ? busy : 0.0) + plan.exposed_dp_seconds;
    plan.offload_seconds = plan.offload_bytes / hw.pcie_bytes_per_second;  // none hidden (the top of the file)
    plan.step_seconds += plan.offload_seconds;
    plan.mfu = plan.model_flops / l.ranks / plan.step_seconds / hw.peak_flops;
    return plan;
}

// ----------------------------------------------------------------------------
// printing one layout (--plan)

// "dp 128 x pp 16 x cp 1 x tp 8 (sequence parallel)"
inline std::string plan_layout_name(const LayoutPlan& plan) {
    const Layout& l = plan.layout;
    return plan_format("dp %d x pp %d x cp %d x tp %d%s", plan.dp, l.pp, l.cp, l.tp,
                       l.sequence_parallel ? " (sequence parallel)" : "");
}

// Per model stage: its layers and its compute per microbatch (the embedding on the first, the LM head and loss
// on the last); per pp rank: its records in flight, memory and the bytes it sends on the pp axis per step
// (llmc/parallel/pipeline.h's formula); and the schedule's bubble.
inline void print_pipeline_plan(const LayoutPlan& plan, FILE* out = stdout) {
    const Layout& l = plan.layout;
    const int p = l.pp, V = l.pp_virtual, m = plan.accumulation;
    fprintf(out, "pipeline %s: %d stage(s) per pp rank (%s), %d microbatches; bubble %.3f with these stages' costs "
            "(the schedule's formula for equal stages: %.3f)\n", pipeline_schedule_name(l.schedule), V,
            l.pp_layers.empty() ? "balanced by cost" : "--pp-layers", m, plan.bubble, plan.bubble_formula);
    const double slowest = *std::max_element(plan.stage_seconds.begin(), plan.stage_seconds.end());
    for (size_t stage = 0; stage < plan.stage_layers.size(); stage++)
        fprintf(out, "  stage %zu (pp rank %d): %d layers%s, %.3f ms forward + backward per microbatch (%.2f of the "
                "slowest)\n", stage, pipeline_stage_rank(l.schedule, (int)stage, p), plan.stage_layers[stage],
                stage == 0 ? " + embedding" : stage + 1 == plan.stage_layers.size() ? " + LM head and loss" : "",
                plan.stage_seconds[stage] * 1e3, plan.stage_seconds[stage] / slowest);
    for (int r = 0; r < p; r++) {
        const MemoryPlan& stage = plan.stages[r];
        fprintf(out, "  pp rank %d: %d record(s) in flight%s; model state %s, activations %s, workspace %s, total %s; "
                "sends %s per step on the pp axis\n", r, plan.shapes[r].records,
                plan.shapes[r].weight_records ? plan_format(" and %d weight record(s)", plan.shapes[r].weight_records).c_str()
                                              : "",
                format_bytes(stage.model_state).c_str(), format_bytes(stage.activations).c_str(),
                format_bytes(stage.workspace).c_str(), format_bytes(stage.total).c_str(),
                format_bytes(plan.pp_bytes[r]).c_str());
    }
}

// The communication block: bytes per step on each axis, and the link the estimate puts them on.
inline void print_plan_communication(const LayoutPlan& plan, const PlanHardware& hw, FILE* out = stdout) {
    const Layout& l = plan.layout;
    const char* where[kPlanAxes] = {
        "the ZeRO stage's gradient and parameter collectives (the memory plan's communication row)",
        "the tp axis (llmc/parallel/tensor_parallel.h), for this rank's layers",
        "the pp axis (llmc/parallel/pipeline.h), the busiest pp rank",
        "the cp axis (llmc/parallel/context_parallel.h)",
        "the ep axis's all-to-alls (llmc/parallel/expert_parallel.h), rows spread evenly over the experts"};
    const int sizes[kPlanAxes] = {plan.dp * l.cp, l.tp, l.pp, l.cp, l.ep};
    fprintf(out, "communication per step, bytes one rank sends on each axis, its collective calls and the tier of the "
            "%s profile they cross:\n", hw.name.c_str());
    static const char* tier_names[kTiers] = {"node", "leaf", "spine"};
    for (int a = 0; a < kPlanAxes; a++) {
        std::string link = "-";
        if (sizes[a] > 1)
            link = plan_format("%d calls, %s tier: %.3f s", collective_calls_count(plan.collectives[a]),
                               tier_names[(int)plan.tiers[a]], plan.axis_seconds[a]);
        fprintf(out, "  communication %s %12s  %-32s %s\n", plan_axis_name(a), format_bytes(plan.bytes[a]).c_str(),
                link.c_str(), where[a]);
    }
    fprintf(out, "pipeline bubble %.3f (%s, pp %d, %d microbatch(es)%s)\n", plan.bubble,
            pipeline_schedule_name(l.schedule), l.pp, plan.accumulation,
            l.pp_virtual > 1 ? plan_format(", %d virtual stages", l.pp_virtual).c_str() : "");
}

// The estimate, term by term.
inline void print_plan_estimate(const LayoutPlan& plan, const PlanHardware& hw, FILE* out = stdout) {
    const std::string cp_hidden = plan.axis_seconds[PLAN_CP] > plan.shown_cp_seconds
                                      ? plan_format(" (of %.3f; attention hides the rest)", plan.axis_seconds[PLAN_CP])
                                      : "";
    // ranks sharing cores under a pipeline: the longer of the pipeline at a whole core a rank and the node's work
    const double share = layout_compute_share(hw, plan.layout);
    const bool shared_pipeline = share < 1 && plan.bubble > 0;
    const std::string sum = plan_format(
        "(compute %.3f + tp %.3f + cp %.3f%s + pp %.3f%s%s)", plan.compute_seconds, plan.axis_seconds[PLAN_TP],
        plan.shown_cp_seconds, cp_hidden.c_str(), plan.axis_seconds[PLAN_PP],
        plan.layout.ep > 1 ? plan_format(" + ep %.3f", plan.axis_seconds[PLAN_EP]).c_str() : "",
        plan.recompute_seconds > 0
            ? plan_format(" + recompute %.3f (selective's passes, offload's transfers)", plan.recompute_seconds).c_str()
            : "");
    const std::string critical =
        shared_pipeline ? plan_format("max(%s x share %.3f / (1 - bubble %.3f), the same sum: ranks sharing cores fill "
                                      "each other's bubbles)", sum.c_str(), share, plan.bubble)
                        : plan_format("%s / (1 - bubble %.3f)", sum.c_str(), plan.bubble);
    fprintf(out, "estimated step %.3f s = %s + dp "
            "exposed %.3f (of %.3f: the reductions beyond the compute they overlap, ZeRO 1-2's gathers after the "
            "update); MFU %.1f%% (%.3g tokens per step, %.3g model FLOPs, %.3g with recomputation; "
            "machine profile %s, peak %.4g TFLOP/s; llmc/planning/planner.h's cost model)\n", plan.step_seconds,
            critical.c_str(),
            plan.exposed_dp_seconds, plan.axis_seconds[PLAN_DP], 100 * plan.mfu, plan.tokens,
            plan.model_flops, plan.hardware_flops, hw.name.c_str(), hw.peak_flops / 1e12);
    fprintf(out, "compute %.3f s per step on the mean pp rank = matmuls %.3f (by shape) + attention %.3f + memory-bound "
            "kernels, launches and AdamW %.3f\n", plan.compute_seconds, plan.compute.matmul, plan.compute.attention,
            plan.compute.memory);
    if (plan.layout.offload_optimizer)
        fprintf(out, "optimizer offload: + %.3f s in the step above, not hidden (%s up and down per step over PCIe at "
                "%.0f GB/s); pinned host memory per rank %s (the fullest pp rank's)\n", plan.offload_seconds,
                format_bytes(plan.offload_bytes).c_str(), hw.pcie_bytes_per_second / 1e9,
                format_bytes(plan.stages[plan.fullest_stage].host_total).c_str());
    fprintf(out, "fits in %s per GPU: %s (the fullest pp rank, %d: %s + %s reserved for the CUDA context, cuBLASLt "
            "and NCCL)\n", format_bytes(hw.gpu_memory_bytes).c_str(), plan.fits ? "yes" : "NO", plan.fullest_stage,
            format_bytes(plan.peak_bytes).c_str(), format_bytes(hw.reserve_bytes).c_str());
}

// Everything --plan prints for one layout (which must have no error).
inline void print_layout_plan(const GPT2Config& config, const LayoutPlan& plan, const PlanHardware& hw,
                              FILE* out = stdout) {
    const Layout& l = plan.layout;
    char mlp[200];
    const std::string where = config.moe_every == 1 ? "" : ", in " + config.mixture_blocks();
    if (config.moe())
        snprintf(mlp, sizeof(mlp), "%d experts of %zu hidden (%d per token, %d shared%s; %s parameters active)",
                 config.experts, config.expert_hidden(), config.experts_per_token, config.shared_experts, where.c_str(),
                 format_count(active_parameters(config)).c_str());
    else
        snprintf(mlp, sizeof(mlp), "%zu hidden", config.hidden());
    fprintf(out, "plan: %s, %d layers, %d channels, %d heads (%d K/V), %s, %s parameters (%s on pp rank 0, tp "
            "rank 0%s); %d ranks = %s%s; ZeRO stage %d (shard groups of %d), %d x %d tokens per data-parallel rank and "
            "micro-step, %d micro-step(s); recompute %s; %s\n", arch_name(config.arch), config.num_layers,
            config.channels, config.num_heads, config.kv_heads, mlp,
            format_count((double)ParameterLayout(config).num_parameters).c_str(),
            format_count((double)ParameterLayout(config, 1, l.tp, 0, pipeline_held_chunks(l.schedule, 0, l.pp, l.pp_virtual,
                                                                     plan.stage_layers, config.tied_head()), l.ep, 0)
                .num_parameters).c_str(), l.ep > 1 ? ", ep rank 0" : "", l.ranks, plan_layout_name(plan).c_str(),
            l.ep > 1 ? (", experts over ep " + std::to_string(l.ep) + " of the dp ranks").c_str() : "", l.zero_stage,
            plan.shard * l.cp,
            l.batch_size, l.seq_len, plan.accumulation, recompute_describe(l.recompute).c_str(),
            l.bf16 ? "BF16" : "FP32");
    if (l.cp > 1)
        fprintf(out, "context parallel: %s attention, %s split; each cp rank holds %d of the %d positions\n",
                cp_mode_name(l.cp_mode), cp_split_name(l.cp_split), l.seq_len / l.cp, l.seq_len);
    print_memory_plan(plan.stages[0], out);  // pp rank 0's (the per-rank table below has every pp rank)
    print_plan_communication(plan, hw, out);
    if (l.pp > 1) print_pipeline_plan(plan, out);
    print_plan_estimate(plan, hw, out);
    if (plan.recompute_auto) print_recompute_choice(plan.recompute_choice, hw, out);
    if (config.moe())  // Table 2 counts one dense MLP per layer
        fprintf(out, "per-layer activations: Korthikanti et al.'s Table 2 has no experts; llmc/planning/memory.h counts "
                     "them (the routed rows, K per token, through each expert's fc, activation and projection)\n");
    else
        print_korthikanti_table2(plan.shapes[0], l.bf16, out);  // in 2-byte activations, as the paper counts
}

// A batch ramp (llmc/batch_ramp.h): one plan per phase (the layout with that phase's tokens per step), one line
// each: its microbatches, bubble, step time and the fullest pp rank's memory (gpipe keeps every microbatch's
// records, so its memory grows with m; 1f1b's stays at p - r).
inline void print_batch_ramp_plan(const BatchRamp& ramp, const std::vector<LayoutPlan>& phases, FILE* out = stdout) {
    fprintf(out, "batch ramp: %zu phases, each planned with its tokens per step\n", phases.size());
    for (size_t k = 0; k < phases.size(); k++) {
        const LayoutPlan& plan = phases[k];
        fprintf(out, "  phase %zu from %lld tokens seen: %d tokens per step, %d microbatch(es) per step, bubble %.3f, "
                "estimated step %.3f s (%.0f tokens/s), memory %s on the fullest pp rank (%d)%s\n", k,
                ramp.phases[k].threshold, ramp.phases[k].tokens, plan.accumulation, plan.bubble, plan.step_seconds,
                plan.tokens / plan.step_seconds, format_bytes(plan.peak_bytes).c_str(), plan.fullest_stage,
                plan.fits ? "" : ": does NOT fit");
    }
}

// ----------------------------------------------------------------------------
// the search (--plan-search)

struct PlanSearch {
    std::vector<LayoutPlan> fitting;  // fastest first
    int considered = 0, refused = 0, too_big = 0;
};

// Every layout of base.ranks ranks (base gives B, T, the total batch and the precision; its total batch 0
// means B T ranks, so every layout does the same work per step):
//   tp    divisors of the heads up to the profile's ranks per node (tp_layout_error refuses the rest), with and without
//         sequence parallelism (tp > 1)
//   pp    divisors of the layers; 1f1b, and interleaved with 2 virtual stages where the layers and
//         microbatches allow
//   cp    divisors of the sequence that mesh_model_error accepts (zigzag split), ring and Ulysses
//   ZeRO  0-3 (shards over all dp ranks); recompute none, selective, full (a checkpoint every block); or, when
//         base asks --recompute auto, each layout under auto alone (its letters, chosen for its memory: at least
//         as fast as any of the three that fits, since each of them is a choice of letters, kkk, sss or fff)
//   dp    what is left: ranks / (tp pp cp)
// A layout any check refuses (plan_layout_error) is counted and skipped, as is one that does not fit.
inline PlanSearch plan_search(const GPT2Config& config, Layout base, const PlanHardware& hw) {
    PlanSearch search;
    if (base.total_batch_size == 0) {
        const long long tokens = (long long)base.batch_size * base.seq_len * base.ranks;
        if (tokens > INT_MAX) fatal("--plan-search: B x T x ranks = %lld tokens do not fit an int", tokens);
        base.total_batch_size = (int)tokens;
    }
    std::vector<Recompute> policies = {Recompute{RecomputePolicy::None, 1}, Recompute{RecomputePolicy::Selective, 1},
                                       Recompute{RecomputePolicy::Full, 1}};
    if (base.recompute.policy == RecomputePolicy::Auto) policies = {base.recompute};
    for (int tp = 1; tp <= std::min(hw.ranks_per_node, config.num_heads); tp++) {
        if (config.num_heads % tp != 0 || base.ranks % tp != 0) continue;
        for (int pp = 1; pp <= config.num_layers; pp++) {
            if (base.ranks % (tp * pp) != 0) continue;  // stages of any size: pp need not divide the layers
            for (int cp = 1; cp <= base.seq_len; cp++) {
                if (base.seq_len % cp != 0 || base.ranks % (tp * pp * cp) != 0) continue;
                for (int mode = 0; mode < (cp > 1 ? 2 : 1); mode++)
                    for (int sp = 0; sp < (tp > 1 ? 2 : 1); sp++)
                        for (int schedule = 0; schedule < (pp > 1 ? 4 : 1); schedule++)
                            for (int zero = 0; zero <= 3; zero++)
                                for (const Recompute& recompute : policies) {
                                    Layout l = base;
                                    l.tp = tp, l.pp = pp, l.cp = cp, l.sequence_parallel = sp == 1;
                                    l.cp_mode = mode == 0 ? ContextParallelMode::Ring : ContextParallelMode::Ulysses;
                                    l.cp_split = SequenceSplit::Zigzag;
                                    const PipelineSchedule candidates[4] = {PipelineSchedule::OneFOneB,
                                                                            PipelineSchedule::ZeroBubbleH1,
                                                                            PipelineSchedule::Interleaved,
                                                                            PipelineSchedule::ZeroBubbleV};
                                    l.schedule = candidates[schedule];
                                    l.pp_virtual = l.schedule == PipelineSchedule::Interleaved ||
                                                           l.schedule == PipelineSchedule::ZeroBubbleV ? 2 : 1;
                                    l.pp_layers.clear();  // each candidate's stages balanced by cost
                                    l.zero_stage = zero, l.dp_shard = 0, l.recompute = recompute;
                                    search.considered++;
                                    LayoutPlan plan = plan_layout(config, l, hw);
                                    if (!plan.error.empty()) search.refused++;
                                    else if (!plan.fits) search.too_big++;
                                    else search.fitting.push_back(std::move(plan));
                                }
            }
        }
    }
    // fastest first; of equally fast ones the one with the least memory
    std::stable_sort(search.fitting.begin(), search.fitting.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
        return a.step_seconds != b.step_seconds ? a.step_seconds < b.step_seconds : a.peak_bytes < b.peak_bytes;
    });
    return search;
}

// A short name of the layout's choices: "ZeRO 1, recompute full, 1f1b, ring"
inline std::string plan_choices(const LayoutPlan& plan) {
    const Layout& l = plan.layout;
    std::string text = plan_format("ZeRO %d, recompute %s", l.zero_stage,
                                   plan.recompute_auto ? ("auto " + recompute_blocks_runs(l.recompute.blocks)).c_str()
                                   : l.recompute.policy == RecomputePolicy::None      ? "none"
                                   : l.recompute.policy == RecomputePolicy::Selective ? "selective"
                                                                                      : "full");
    if (l.pp > 1) text += plan_format(", %s%s", pipeline_schedule_name(l.schedule),
                                      l.pp_virtual > 1 ? plan_format(" V %d", l.pp_virtual).c_str() : "");
    if (l.cp > 1) text += plan_format(", %s", cp_mode_name(l.cp_mode));
    return text;
}

inline void print_plan_search(const GPT2Config& config, const PlanSearch& search, const Layout& base,
                              const PlanHardware& hw, int top, FILE* out = stdout) {
    const LayoutPlan* any = search.fitting.empty() ? nullptr : &search.fitting[0];
    fprintf(out, "plan search: %s, %d layers, %d channels, %d heads (%d K/V), %s parameters (%s) on %d ranks "
            "of %s, %d per node; B %d x T %d per data-parallel rank, %.0f tokens per step\n", arch_name(config.arch),
            config.num_layers, config.channels, config.num_heads, config.kv_heads,
            format_count((double)ParameterLayout(config).num_parameters).c_str(), base.bf16 ? "BF16" : "FP32",
            base.ranks, format_bytes(hw.gpu_memory_bytes).c_str(), hw.ranks_per_node, base.batch_size, base.seq_len,
            any ? any->tokens : (double)base.total_batch_size);
    fprintf(out, "%d layouts considered: %d refused by the layout checks, %d too big, %zu fit; the %d fastest by "
            "the estimated step time (memory: the fullest pp rank; bytes: per step and rank; "
            "llmc/planning/planner.h under the machine profile %s: matmuls by shape, collectives by call and tier; "
            "dp hidden behind compute, the cp ring's passes behind attention, tp/pp not; stretched by the bubble):\n",
            search.considered, search.refused, search.too_big, search.fitting.size(),
            std::min(top, (int)search.fitting.size()), hw.name.c_str());
    fprintf(out, "  %3s  %-38s %-50s %10s  %10s %10s %10s %10s  %6s  %8s %6s\n", "#", "layout", "choices", "memory",
            "dp bytes", "tp bytes", "pp bytes", "cp bytes", "bubble", "step s", "MFU");
    for (int i = 0; i < std::min(top, (int)search.fitting.size()); i++) {
        const LayoutPlan& p = search.fitting[i];
        fprintf(out, "  %3d  %-38s %-50s %10s  %10s %10s %10s %10s  %6.3f  %8.4f %5.1f%%\n", i + 1,
                plan_layout_name(p).c_str(), plan_choices(p).c_str(), format_bytes(p.peak_bytes).c_str(),
                format_bytes(p.bytes[PLAN_DP]).c_str(), format_bytes(p.bytes[PLAN_TP]).c_str(),
                format_bytes(p.bytes[PLAN_PP]).c_str(), format_bytes(p.bytes[PLAN_CP]).c_str(), p.bubble,
                p.step_seconds, 100 * p.mfu);
    }
    if (any) {
        fprintf(out, "the fastest, term by term:\n");
        print_plan_estimate(*any, hw, out);
    }
}

// ----------------------------------------------------------------------------
// --recompute auto in a run

// Every rank calls this after parallel_create, before the model is allocated: the run's layout planned under auto
// (the same choice --plan prints; its records sized, as pipeline_create sizes the pools, for the batch phase with
// the most microbatches), the letters kept for this rank's positions, the table printed by the main rank. Every
// rank plans the same numbers (nothing in them depends on the rank), so all choose the same letters. No letters
// fit: the one line why, and the run ends.
inline void recompute_auto_for_run(ParallelContext& par, const GPT2Config& config, const PlanHardware& hw) {
    Layout l = par.layout;
    for (const BatchPhase& phase : par.ramp.phases) l.total_batch_size = std::max(l.total_batch_size, phase.tokens);
    l.batch_ramp = BatchRamp{};
    const LayoutPlan plan = plan_layout(config, l, hw);
    if (!plan.error.empty()) fatal("%s", plan.error.c_str());
    if (!plan.recompute_choice.error.empty()) fatal("%s", plan.recompute_choice.error.c_str());
    const GPT2MemoryShape& mine = plan.shapes[par.pipe.rank];
    if (mine.records != par.pipe.records || mine.weight_records != par.pipe.weight_records ||
        mine.heads != std::max(1, par.pipe.heads) || mine.outboxes != par.pipe.outboxes)
        fatal("--recompute auto: the plan of pp rank %d keeps %d records, %d weight records, %d heads and %d outboxes; "
              "its pipeline %d, %d, %d and %d", par.pipe.rank, mine.records, mine.weight_records, mine.heads,
              mine.outboxes, par.pipe.records, par.pipe.weight_records, std::max(1, par.pipe.heads), par.pipe.outboxes);
    // the letters of the longest stage, as --recompute-blocks gives them (a shorter stage's rank uses the first ones)
    par.layout.recompute = Recompute{RecomputePolicy::PerBlock, 1, plan.layout.recompute.blocks};
    if (par.main_rank) {
        print_recompute_choice(plan.recompute_choice, hw);
        fflush(stdout);  // before any rank may stop the job
    }
}
