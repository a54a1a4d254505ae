/*
Tests of the planner's cost model (llmc/planning/cost_model.h, priced by llmc/planning/planner.h) against numbers
worked out by hand, under a profile written for it (hand_profile, dev/test/planner_fixtures.h; no GPU, no MPI):
  (a) the plan by hand: the parameter counts of Llama 3 8B, 70B and 405B, exact in 64 bits; one rank's step and
      FLOPs, --offload optimizer's bytes and PCIe time, full recomputation's extra forward; the tiers, the bubble,
      the cp ring's bytes and the part attention hides, Ulysses' heads; 405B's stages under 1f1b and zbv, and
      the layouts the planner refuses;
  (b) the prices: the matmuls' FLOPs at their shapes == pipeline.h's counts, the shape table (a tiny model's
      compute == its FLOPs at the small rows' efficiency), ranks sharing cores, a tp axis's calls x (alpha + n /
      beta), a dp group's cost as it crosses from node to leaf to spine, and every axis's calls x bytes == the
      byte formulas.
The planner against published layouts is dev/test/test_planner.cu. Prints `N passed, M failed`.
*/
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/parallel/pipeline.h"  // before planner.h: the Pipeline without its executor
#include "../../llmc/planning/planner.h"
#include "planner_fixtures.h"

namespace test_cost_model {  // one suite of dev/test/host_suites.cu

// ----------------------------------------------------------------------------
// (a) the plan by hand

static void test_by_hand() {
    printf("the cost model by hand\n");
    // Llama 3's parameters, counted in 64 bits: L (C (C + 2k) + C^2 + 3 C H + 2C) + 2 Vp C + C (wte and the untied
    // head, the final RMSNorm), k = 8 K/V heads x 128 channels
    const struct { const char* name; long long want, L, C, H; } family[3] = {
        {"llama3-8B", 8030261248LL, 32, 4096, 14336},
        {"llama3-70B", 70553706496LL, 80, 8192, 28672},
        {"llama3-405B", 405853388800LL, 126, 16384, 53248},
    };
    for (const auto& f : family) {
        GPT2Config c;
        llama_config_by_name(f.name, &c);
        const long long k = 8 * 128, Vp = 128256;
        const long long by_hand =
            f.L * (f.C * (f.C + 2 * k) + f.C * f.C + 3 * f.C * f.H + 2 * f.C) + 2 * Vp * f.C + f.C;
        const long long counted = (long long)ParameterLayout(c).num_parameters;
        check_true(std::string(f.name) + ": parameters exact in 64 bits, " + format_count((double)f.want),
                   counted == f.want && by_hand == f.want, describe((double)counted, (double)f.want));
    }

    // one rank, 124M: the step is the compute and AdamW; the plan's hardware FLOPs are 6 P + 12 L C T per token
    GPT2Config small;
    gpt2_config_by_name("124M", &small);
    Layout one;
    one.ranks = 1, one.batch_size = 4, one.seq_len = 1024, one.total_batch_size = 4 * 1024 * 8, one.bf16 = true;
    PlanHardware hw = hand_profile(80 * kGB);
    LayoutPlan plan = plan_layout(small, one, hw);
    const double P = 124475904.0, tokens = 32768;  // GPT-2 124M with wte padded to 50304 rows
    check_true("one rank: step == compute (matmuls + attention + memory-bound), nothing else",
               plan.compute_seconds == plan.step_seconds &&
                   plan.compute_seconds == plan.compute.matmul + plan.compute.attention + plan.compute.memory,
               describe(plan.step_seconds, plan.compute_seconds));
    check_true("one rank: hardware FLOPs 6 P + 12 L C T per token",
               plan.hardware_flops == (6 * P + 12.0 * 12 * 768 * 1024) * tokens,
               describe(plan.hardware_flops, (6 * P + 12.0 * 12 * 768 * 1024) * tokens));
    check_true("one rank: 8 micro-steps", plan.accumulation == 8, describe(plan.accumulation, 8));

    // --offload optimizer: the state, 12 bytes per parameter of the padded layout, in host memory; the device keeps
    // two staging slots of one block chunk (12 C^2 + 13 C = 7,087,872 elements, a multiple of 128) x 12 bytes; the
    // step moves the state up and down once over PCIe, none of it hidden
    Layout offloaded = one;
    offloaded.offload_optimizer = true;
    const LayoutPlan off = plan_layout(small, offloaded, hw);
    const double host = 12.0 * (double)ParameterLayout(small).total, pcie = 2 * host / hw.pcie_bytes_per_second;
    check_true("offload: host bytes 12 P", off.stages[0].host_total == host, describe(off.stages[0].host_total, host));
    check_true("offload: device optimizer state == 2 staging slots x 7087872 x 12 bytes",
               off.stages[0].optimizer_state == 2 * 7087872.0 * 12, describe(off.stages[0].optimizer_state, 2 * 7087872.0 * 12));
    check_true("offload: device total == without offload - 12 P + staging",
               off.stages[0].total == plan.stages[0].total - host + 2 * 7087872.0 * 12,
               describe(off.stages[0].total, plan.stages[0].total - host + 2 * 7087872.0 * 12));
    check_true("offload: step == without + 2 x host bytes / PCIe 50 GB/s",
               std::fabs(off.step_seconds - plan.step_seconds - pcie) <= 1e-12 * off.step_seconds &&
                   off.offload_seconds == pcie, describe(off.step_seconds - plan.step_seconds, pcie));

    // full recomputation: + one forward pass of the blocks (2 P_block + 4 C T per layer and token)
    one.recompute = Recompute{RecomputePolicy::Full, 1};
    const LayoutPlan full = plan_layout(small, one, hw);
    const double block = 12.0 * 768 * 768 + 13 * 768;
    const double extra = 12 * (2 * block + 4.0 * 768 * 1024) * tokens;
    check_true("full recompute: hardware FLOPs + one forward of the blocks",
               std::fabs(full.hardware_flops - plan.model_flops - extra) <= 1e-9 * extra,
               describe(full.hardware_flops - plan.model_flops, extra));

    // tiers: tp 8 stays in a node of 8, cp 16 on top of it (128 ranks) in a leaf of 1024, pp (2048) and dp (all
    // 16384) cross the spine; under 1f1b here, for the bubble's bounds
    Layout l = meta_layout(16384, 131072, 16, RecomputePolicy::Full);
    l.schedule = PipelineSchedule::OneFOneB, l.pp_virtual = 1, l.pp_layers.clear();
    const GPT2Config long_config = llama_405b(131072);
    plan = plan_layout(long_config, l, hw);
    check_true("tp 8 in a node of 8, cp 16 (128 ranks) in a leaf of 1024, pp and dp across the spine",
               plan.tiers[PLAN_TP] == Tier::Node && plan.tiers[PLAN_CP] == Tier::Leaf &&
                   plan.tiers[PLAN_PP] == Tier::Spine && plan.tiers[PLAN_DP] == Tier::Spine);
    check_true("1f1b bubble formula (p-1)/(m+p-1), p 16, m 16", std::fabs(plan.bubble_formula - 15.0 / 31) < 1e-15,
               describe(plan.bubble_formula, 15.0 / 31));
    {
        // simulated with the stages' costs t_s (the last adds the LM head): the busiest rank works m t_max, so
        // T >= m t_max; slowing every stage to t_max gives 1f1b's (m + p - 1) t_max, and slower actions never
        // shorten the step, so T <= (m + p - 1) t_max. The bubble 1 - m mean(t) / T lies between the two. (It
        // may fall below the formula's for equal stages: here the two lighter last stages, 7 layers and 7 + the
        // head's 0.6, shorten the drain.)
        const double t_max = *std::max_element(plan.stage_seconds.begin(), plan.stage_seconds.end());
        double t_mean = 0;
        for (double t : plan.stage_seconds) t_mean += t / plan.stage_seconds.size();
        const double low = 1 - t_mean / t_max, high = 1 - 16 * t_mean / (31 * t_max);
        check_true("1f1b bubble simulated with the stages' costs: between 1 - mean/max and 1 - m mean / ((m+p-1) max)",
                   plan.bubble >= low - 1e-12 && plan.bubble <= high + 1e-12,
                   std::to_string(low) + " <= " + std::to_string(plan.bubble) + " <= " + std::to_string(high));
    }
    const double stretched = (plan.compute_seconds + plan.axis_seconds[PLAN_TP] + plan.shown_cp_seconds +
                              plan.axis_seconds[PLAN_PP]) / (1 - plan.bubble) + plan.exposed_dp_seconds;
    check_true("step == (compute + tp + cp shown + pp) / (1 - bubble) + exposed dp",
               std::fabs(plan.step_seconds - stretched) <= 1e-12 * stretched, describe(plan.step_seconds, stretched));

    // ranks sharing cores: 124M on pp 4 with 4 ranks on a node of 2 cores gets half a core a rank, every price
    // doubled; a rank waiting out the bubble leaves its core to the others, so the step is the longer of the
    // pipeline at a whole core each (the sum x 0.5 / (1 - bubble)) and the sum itself (all the node's work over its
    // 2 cores). With 4 microbatches 1f1b's bubble is about 3/7: 0.5 / (1 - 3/7) = 0.875 < 1, the node's work is
    // longer; on 4 cores (share 1) the step is the pipeline.
    {
        PlanHardware shared = hand_profile(80 * kGB);
        shared.cores_per_node = 2;
        Layout piped = one;
        piped.ranks = 4, piped.pp = 4, piped.schedule = PipelineSchedule::OneFOneB, piped.total_batch_size = 4 * 1024 * 4;
        const LayoutPlan two_cores = plan_layout(small, piped, shared);
        shared.cores_per_node = 4;
        const LayoutPlan four_cores = plan_layout(small, piped, shared);
        const auto sum_of = [](const LayoutPlan& p) {
            return p.compute_seconds + p.axis_seconds[PLAN_TP] + p.shown_cp_seconds + p.axis_seconds[PLAN_PP];
        };
        const double node_work = sum_of(two_cores) + two_cores.exposed_dp_seconds,
                     pipeline = sum_of(four_cores) / (1 - four_cores.bubble) + four_cores.exposed_dp_seconds;
        check_true("pp 4 on 4 ranks over 2 cores: the step is the node's work (the sum at half a core), not / (1 - bubble)",
                   two_cores.bubble > 0.3 && std::fabs(two_cores.step_seconds - node_work) <= 1e-12 * node_work &&
                       two_cores.step_seconds > two_cores.pipelined_seconds + two_cores.exposed_dp_seconds,
                   describe(two_cores.step_seconds, node_work));
        check_true("... and over 4 cores (a core each): the pipeline, (sum) / (1 - bubble), at half the compute",
                   std::fabs(four_cores.step_seconds - pipeline) <= 1e-12 * pipeline &&
                       std::fabs(two_cores.compute_seconds - 2 * four_cores.compute_seconds) <= 1e-12 * two_cores.compute_seconds,
                   describe(four_cores.step_seconds, pipeline));
    }

    // The cp ring carries K and V of the 8 K/V heads: per layer and microbatch ((cp-1) F + 2cp - 1) blocks of
    // N rows x 2 x 128 values (N = 8192 rows, kv_heads HS / tp = 8 x 128 / 8), F = 2 under full: 61 blocks of
    // 4 MiB; l = 8 layers (the busiest pp rank of {7, 8 x 14, 7}) x m = 16 microbatches. Ulysses' all-to-alls
    // are counted with C/tp = 2048 channels.
    {
        const double N = 8192, block_bytes = N * 2 * 128 * 2, layers = 8, m = 16;
        const double want = (15 * 2 + 31) * block_bytes * layers * m;
        check_true("cp ring bytes: K/V heads only, 61 blocks of N x 256 values per layer and microbatch",
                   plan.bytes[PLAN_CP] == want, describe(plan.bytes[PLAN_CP], want));
        const double every_head = cp_bytes_per_step(ContextParallelMode::Ring, 16, 1, 131072, AttentionHeads{16, 16, 128},
                                                    8, 2, 16, 2);
        check_true("cp ring bytes: 1/16 of what every head's K and V would send",
                   plan.bytes[PLAN_CP] * 16 == every_head, describe(plan.bytes[PLAN_CP] * 16, every_head));
        // the part attention does not hide: a block's send takes t = 5 us + 4 MiB / 50 GB/s = 89 us (the leaf's
        // alpha and beta), one step's attention forward a = 2 products of HS = 128 per visible score, N x T/2 scores
        // for each of the rank's 16 heads, over cp 16 steps, at the profile's efficiency for the zigzag's kernel
        // calls of T/(2 cp) = 4096 keys: linear in log2 between 1024 (0.3) and 8192 (0.5), 0.3 + 2/3 x 0.2:
        // 4 x 128 x 8192 x 65536 x 16 / 16 / (1e15 x 0.4333) = 0.63 ms: every pass hides but the backward's
        // gradient passes, cp t per layer and microbatch
        const double efficiency = 0.3 + 2.0 / 3 * 0.2;
        const double t = 5e-6 + block_bytes / 50e9, a = 4 * 128 * N * 65536.0 * 16 / 16 / (1e15 * efficiency);
        check_true("cp shown: only the dK/dV passes, cp t per layer and microbatch, when attention outlasts a block",
                   t < a && std::fabs(plan.shown_cp_seconds - 16 * t * layers * m) <= 1e-12 * plan.shown_cp_seconds,
                   describe(plan.shown_cp_seconds, 16 * t * layers * m));
        // on a slow link (the leaf's send at 0.1 GB/s: t = 42 ms, more than a and 2a) each pass shows what attention
        // leaves
        PlanHardware slow = hw;
        slow.collectives[(int)Tier::Leaf][(int)CollectiveOp::SendRecv][0].bus_bytes_per_second = 0.1e9;
        const LayoutPlan slow_plan = plan_layout(long_config, l, slow);
        const double ts = 5e-6 + block_bytes / 0.1e9;
        const double shown = (2 * 15 * (ts - a) + 15 * (ts - 2 * a) + 16 * ts) * layers * m;
        check_true("cp shown on a slow link: F (cp-1)(t - a) + (cp-1)(t - 2a) + cp t per layer and microbatch",
                   ts > 2 * a && std::fabs(slow_plan.shown_cp_seconds - shown) <= 1e-12 * shown,
                   describe(slow_plan.shown_cp_seconds, shown));
        // with no time for attention nothing hides: all of the cp axis's time shows
        PlanHardware instant = slow;
        instant.peak_flops = 1e300;
        const LayoutPlan instant_plan = plan_layout(long_config, l, instant);
        check_true("cp shown with attention free: the whole link time",
                   std::fabs(instant_plan.shown_cp_seconds - instant_plan.axis_seconds[PLAN_CP]) <=
                       1e-12 * instant_plan.axis_seconds[PLAN_CP],
                   describe(instant_plan.shown_cp_seconds, instant_plan.axis_seconds[PLAN_CP]));
        // Ulysses splits a tp rank's heads over cp: 128 query heads / tp 8 = 16 split over cp 8, but the 8 K/V heads
        // leave one per tp rank, which cp 8 cannot split: refused, with the line the trainer prints
        Layout ulysses = meta_layout(16384, 131072, 8, RecomputePolicy::Full);
        ulysses.cp_mode = ContextParallelMode::Ulysses;
        ulysses.total_batch_size *= 2;  // dp 16
        const LayoutPlan u = plan_layout(long_config, ulysses, hw);
        check_true("Ulysses cp 8 on a tp rank's one K/V head: refused",
                   u.error == ulysses_heads_error(8, AttentionHeads{16, 1, 128}) && !u.error.empty(), u.error);
        // at tp 1 each rank holds the 8 K/V heads, which cp 8 splits: counted from the heads, all of it shown
        Layout wide = ulysses;
        wide.tp = 1, wide.sequence_parallel = false;
        wide.total_batch_size *= 8;  // 16 microbatches of dp 128, as the interleaved schedule needs
        const LayoutPlan w = plan_layout(long_config, wide, hw);
        check_true("Ulysses cp 8 at tp 1: counted from the query and K/V heads, all of it shown",
                   w.error.empty() &&
                       w.bytes[PLAN_CP] == cp_bytes_per_step(ContextParallelMode::Ulysses, 8, 1, 131072,
                                                             AttentionHeads{128, 8, 128}, 8, 2, w.accumulation, 2) &&
                       w.shown_cp_seconds == w.axis_seconds[PLAN_CP],
                   w.error.empty() ? describe(w.shown_cp_seconds, w.axis_seconds[PLAN_CP]) : w.error);
    }

    // Llama 3 405B's 126 layers over 16 stages of 1f1b, balanced by cost (the LM head ~0.6 of a layer): each
    // stage's share printed
    l = meta_layout(16384, 8192, 1, RecomputePolicy::Full);
    l.schedule = PipelineSchedule::OneFOneB, l.pp_virtual = 1, l.pp_layers.clear();
    const GPT2Config llama = llama_405b(8192);
    plan = plan_layout(llama, l, hw);
    int layers_planned = 0;
    for (int n : plan.stage_layers) layers_planned += n;
    check_true("126 layers on pp 16: planned, 16 stages of 126 layers in all",
               plan.error.empty() && plan.stage_layers.size() == 16 && layers_planned == 126, plan.error);
    {
        char* text = nullptr;
        size_t size = 0;
        FILE* out = open_memstream(&text, &size);
        print_layout_plan(llama, plan, hw, out);
        fclose(out);
        const std::string printed(text, size);
        free(text);
        check_true("126 layers on pp 16: --plan prints every stage's layers and time",
                   printed.find("stage 0 (pp rank 0): 8 layers + embedding") != std::string::npos &&
                       printed.find("stage 15 (pp rank 15): 7 layers + LM head and loss") != std::string::npos,
                   printed.substr(0, 2000));
    }
    // the same under zbv: 32 stages in a V, rank 0 holding the first and the last (embedding, LM head and loss)
    {
        Layout v_shape = l;
        v_shape.schedule = PipelineSchedule::ZeroBubbleV, v_shape.pp_virtual = 2;
        v_shape.total_batch_size *= 2;  // 32 microbatches: zbv needs 2 pp - 1
        const LayoutPlan zbv = plan_layout(llama, v_shape, hw);
        char* text = nullptr;
        size_t size = 0;
        FILE* out = open_memstream(&text, &size);
        if (zbv.error.empty()) print_layout_plan(llama, zbv, hw, out);
        fclose(out);
        const std::string printed(text, size);
        free(text);
        check_true("126 layers in zbv's V over pp 16: 32 stages, stage 31 on pp rank 0 with the LM head",
                   zbv.error.empty() && zbv.stage_layers.size() == 32 &&
                       printed.find("stage 31 (pp rank 0): ") != std::string::npos &&
                       printed.find("layers + LM head and loss") != std::string::npos &&
                       std::fabs(zbv.bubble_formula - pipeline_bubble_fraction(PipelineSchedule::ZeroBubbleV, 16,
                                                                       zbv.accumulation, 2)) < 1e-15,
                   zbv.error.empty() ? printed.substr(0, 1500) : zbv.error);
    }
    l.cp = 2;
    plan = plan_layout(llama, l, hw);
    check_true("sequence parallel with cp 2 at 8K: 4096 positions per cp rank split over tp 8", plan.error.empty(),
               plan.error);
    l.seq_len = 8200, l.total_batch_size = 0;  // 4100 positions per cp rank do not split over tp 8
    plan = plan_layout(llama_405b(8200), l, hw);
    check_true("sequence parallel with cp 2 at T 8200: refused", plan.error.find("--sequence-parallel with --cp 2") == 0,
               plan.error);
    l = meta_layout(16384, 8192, 1, RecomputePolicy::Full);
    l.schedule = PipelineSchedule::OneFOneB, l.pp_virtual = 1, l.pp_layers.clear();
    l.total_batch_size = 3 * 8192 * 128;
    plan = plan_layout(llama, l, hw);
    check_true("1f1b takes 3 microbatches on pp 16", plan.error.empty(), plan.error);
    l.schedule = PipelineSchedule::Interleaved, l.pp_virtual = 2;
    plan = plan_layout(llama, l, hw);
    check_true("interleaved with m 3 on pp 16: refused", plan.error.find("multiple of --pp 16") != std::string::npos,
               plan.error);
    l.total_batch_size = 8192 * 128 + 1;
    plan = plan_layout(llama, l, hw);
    check_true("a total batch not a multiple of B T dp: refused", plan.error.find("not a multiple") != std::string::npos,
               plan.error);
}

// ----------------------------------------------------------------------------
// (b) the cost model's prices (llmc/planning/cost_model.h), by hand

// A tiny GPT-2 (2 layers, C 64, 4 heads, 256 tokens) on B 2 x T 64 per rank
static GPT2Config tiny_gpt2() {
    GPT2Config c;
    c.num_layers = 2, c.channels = 64, c.num_heads = 4, c.vocab_size = 256, c.padded_vocab_size = 256, c.max_seq_len = 64;
    return gpt2_shape(c);
}

static void test_prices() {
    printf("the cost model's prices by hand\n");
    // the matmuls' FLOPs per token, forward + dX + dW at the shapes the blocks and the head run, times tp, equal
    // pipeline.h's counts (6 x the weights per token; the blocks' 12 C T is attention's, the head's 10 Vp the
    // softmax's: neither is a matmul here)
    {
        struct Case { const char* name; GPT2Config config; int tp, ep, B, T; };
        std::vector<Case> cases;
        GPT2Config c;
        gpt2_config_by_name("124M", &c), cases.push_back({"GPT-2 124M, tp 1", c, 1, 1, 4, 1024});
        cases.push_back({"Llama 3 405B, tp 8", llama_405b(8192), 8, 1, 1, 8192});
        moe_config_by_name("mixtral-8x7B-like", &c), cases.push_back({"mixtral-8x7B-like, tp 2, ep 4", c, 2, 4, 2, 4096});
        for (const Case& k : cases) {
            const double rows = (double)k.B * k.T;
            double block = 0;
            for (int layer = 0; layer < k.config.num_layers; layer++)
                for (const MatmulShape& f : block_forward_matmuls(k.config.block(layer), rows, k.tp, k.ep))
                    block += matmul_flops(f) + matmul_flops(input_gradient_shape(f)) + matmul_flops(weight_gradient_shape(f));
            block = block / rows * k.tp / k.config.num_layers;
            const double want = pipeline_block_flops_per_token(k.config, k.T) - 12.0 * k.config.channels * k.T;
            check_true(std::string(k.name) + ": the blocks' matmul FLOPs per token == pipeline.h's 6 x weights",
                       std::fabs(block - want) <= 1e-12 * want, describe(block, want));
            const MatmulShape head = head_forward_matmul(k.config, rows, k.tp);
            const double head_flops = 3 * matmul_flops(head) / rows * k.tp;
            const double head_want = pipeline_head_flops_per_token(k.config) - 10.0 * k.config.padded_vocab_size;
            check_true(std::string(k.name) + ": the LM head's matmul FLOPs per token == pipeline.h's 6 C Vp",
                       std::fabs(head_flops - head_want) <= 1e-12 * head_want, describe(head_flops, head_want));
        }
    }
    // the shape table: a tiny model's matmuls (128 rows of 64 to 256 columns) priced at a profile's one small row,
    // its attention at the one attention row, memory free: compute == the FLOPs by hand at those efficiencies.
    // Matmuls per token: 6 x (3C C + C C + 4C C + 4C C) = 72 C^2 per layer, the head 6 C Vp; attention 2 + 7
    // products of HS per visible score (T/2 per row) for each of the 4 heads: 9 C T per token and layer.
    const GPT2Config tiny = tiny_gpt2();
    Layout one;
    one.ranks = 1, one.batch_size = 2, one.seq_len = 64, one.total_batch_size = 2 * 64 * 3, one.bf16 = true;
    PlanHardware small_rows = hand_profile();
    small_rows.hbm_bytes_per_second = 1e300;
    small_rows.matmul = {{128, 128, 128, 0.05}};
    small_rows.attention = {{64, 16, 0.02}};  // the tiny model's head size: 64 channels / 4 heads
    const double tokens = 2 * 64 * 3, C = 64;
    const double matmul_flops_by_hand = (2 * 72 * C * C + 6 * C * 256) * tokens;
    const double attention_flops_by_hand = 2 * 9 * C * 64 * tokens;
    const LayoutPlan tiny_plan = plan_layout(tiny, one, small_rows);
    check_true("shape table, one row: compute == matmul FLOPs / (peak x 0.05) + attention's / (peak x 0.02)",
               std::fabs(tiny_plan.compute.matmul - matmul_flops_by_hand / (1e15 * 0.05)) <= 1e-12 * tiny_plan.compute.matmul &&
                   std::fabs(tiny_plan.compute.attention - attention_flops_by_hand / (1e15 * 0.02)) <=
                       1e-12 * tiny_plan.compute.attention &&
                   tiny_plan.compute.memory < 1e-200,
               describe(tiny_plan.compute.matmul, matmul_flops_by_hand / (1e15 * 0.05)));
    // the same shapes under a table with a large row too: the nearest rows weigh most, so the small shapes stay near
    // the small row's efficiency (within 2%: the large row is log2-distance >= 7 x sqrt 3 away, 1/d^4 gives it
    // < 1e-4 of the weight), far from the large row's 0.8
    PlanHardware two_rows = small_rows;
    two_rows.matmul.push_back({16384, 16384, 16384, 0.8});
    const LayoutPlan two_plan = plan_layout(tiny, one, two_rows);
    check_true("shape table, a small and a large row: small matmuls priced near the small row's efficiency",
               std::fabs(two_plan.compute.matmul / tiny_plan.compute.matmul - 1) < 0.02,
               describe(two_plan.compute.matmul, tiny_plan.compute.matmul));
    // the CPU build's ranks share the host's cores: 4 ranks on 2 cores take twice the time each
    PlanHardware host = small_rows;
    host.cores_per_node = 2, host.ranks_per_node = host.ranks_per_leaf = 1024;
    Layout four = one;
    four.ranks = 4, four.total_batch_size *= 4;
    const LayoutPlan shared = plan_layout(tiny, four, host);
    check_true("4 ranks on 2 cores: each rank's compute twice one rank's", std::fabs(shared.compute_seconds / tiny_plan.compute_seconds - 2) < 1e-12,
               describe(shared.compute_seconds / tiny_plan.compute_seconds, 2));

    // alpha-beta pricing of the tp axis: tp 4 in a node, no SP, one microbatch of N = 2 x 64 rows: per block 4
    // all-reduces of N C s (s = 2), the embedding's and the head's dX's 2 more, the softmax's all-reduces of 4N and
    // 8N bytes; a ring all-reduce over 4 ranks costs 2 (4-1) alpha + 2 (4-1)/4 n / beta (node: 1 us, 400 GB/s)
    {
        GPT2Config c = tiny;
        c.num_heads = 4;
        Layout tp = one;
        tp.ranks = 4, tp.tp = 4, tp.total_batch_size = 2 * 64, tp.zero_stage = 0;
        const LayoutPlan p = plan_layout(c, tp, hand_profile());
        const double n = 2 * 64 * 64 * 2.0;
        auto all_reduce = [](double bytes) { return 6 * 1e-6 + 1.5 * bytes / 400e9; };
        const double by_hand = (4 * 2 + 2) * all_reduce(n) + all_reduce(4 * 128) + all_reduce(8 * 128);
        check_true("tp 4 in a node: tp seconds == 10 all-reduces of N C s + the softmax's two, alpha + n / beta each",
                   p.error.empty() && std::fabs(p.axis_seconds[PLAN_TP] - by_hand) <= 1e-12 * by_hand,
                   p.error.empty() ? describe(p.axis_seconds[PLAN_TP], by_hand) : p.error);
        check_true("tp 4: 12 calls", collective_calls_count(p.collectives[PLAN_TP]) == 12,
                   describe(collective_calls_count(p.collectives[PLAN_TP]), 12));
    }
    // a tier change: GPT-2 124M's dp group under ZeRO 0, one all-reduce per chunk (14: the embeddings, 12 blocks,
    // the final norm) of its 1/14 of P s bytes: in a node (8 ranks) ring 1 us and 400 GB/s; 16 ranks cross into the
    // leaf (50 GB/s; the tree's 2 ceil(log2 16) = 8 steps of 10 us against the ring's 30 of 5 us); 2048 ranks in 2
    // leaves cross the spine (its alpha: tree 22 steps of 20 us, ring 4094 of 10 us) with 1024 ranks a leaf pooling
    // the spine's 10 GB/s: the leaf's 50 caps it; with leaves of 2 ranks (and nodes of 1) 8 ranks cross 4 leaves with
    // 2 a leaf: 2 x 10 = 20 GB/s
    {
        GPT2Config c;
        gpt2_config_by_name("124M", &c);
        struct Case { int ranks, per_node, per_leaf; Tier tier; double alpha, tree_alpha, beta; };
        const Case cases[4] = {{8, 8, 1024, Tier::Node, 1e-6, 1e300, 400e9}, {16, 8, 1024, Tier::Leaf, 5e-6, 10e-6, 50e9},
                               {2048, 8, 1024, Tier::Spine, 10e-6, 20e-6, 50e9}, {8, 1, 2, Tier::Spine, 10e-6, 20e-6, 20e9}};
        for (const Case& k : cases) {
            Layout dp;
            dp.ranks = k.ranks, dp.batch_size = 1, dp.seq_len = 64, dp.total_batch_size = 64 * k.ranks, dp.bf16 = true;
            PlanHardware hw = hand_profile();
            hw.ranks_per_node = k.per_node, hw.ranks_per_leaf = k.per_leaf;
            const LayoutPlan p = plan_layout(c, dp, hw);
            const double g = k.ranks, n = (double)p.stages[0].num_parameters * 2 / 14;
            const double ring = 2 * (g - 1) * k.alpha, tree = 2 * std::ceil(std::log2(g)) * k.tree_alpha;
            const double by_hand = 14 * (std::min(ring, tree) + 2 * (g - 1) / g * n / k.beta);
            check_true("dp " + std::to_string(k.ranks) + " in leaves of " + std::to_string(k.per_leaf) +
                           ": the tier's alpha and beta, 14 all-reduces",
                       p.tiers[PLAN_DP] == k.tier && std::fabs(p.axis_seconds[PLAN_DP] - by_hand) <= 1e-12 * by_hand,
                       describe(p.axis_seconds[PLAN_DP], by_hand));
        }
    }
    // ZeRO 1's overlap: with compute slow enough to hide every reduction, what shows is the all-gather of the
    // updated shards after the optimizer step (on the compute stream): 14 chunks x (7 alpha + 7/8 n / beta) in a
    // node of 8, n = a chunk's P s / 14
    {
        GPT2Config c;
        gpt2_config_by_name("124M", &c);
        Layout z1;
        z1.ranks = 8, z1.zero_stage = 1, z1.batch_size = 1, z1.seq_len = 64, z1.total_batch_size = 64 * 8 * 4, z1.bf16 = true;
        PlanHardware slow = hand_profile();
        slow.peak_flops = 1e9;  // seconds of compute per microbatch
        const LayoutPlan p = plan_layout(c, z1, slow);
        const double n = (double)p.stages[0].num_parameters * 2 / 14, gather = 14 * (7 * 1e-6 + 7.0 / 8 * n / 400e9);
        check_true("ZeRO 1 under slow compute: the exposed dp is the post-update all-gathers alone",
                   p.error.empty() && std::fabs(p.exposed_dp_seconds - gather) <= 1e-12 * gather,
                   describe(p.exposed_dp_seconds, gather));
    }
    // the calls' bytes (factor x n, summed) == the byte formulas of the files that send them, on every axis, over
    // layouts that use every kind of call (the pp axis's loss broadcast is counted by comm.h in whole bytes: 1 byte)
    {
        struct Case { const char* name; GPT2Config config; Layout layout; };
        std::vector<Case> cases;
        Layout sp = one;
        sp.ranks = 16, sp.tp = 2, sp.sequence_parallel = true, sp.pp = 2, sp.schedule = PipelineSchedule::Interleaved;
        sp.pp_virtual = 1, sp.schedule = PipelineSchedule::OneFOneB, sp.zero_stage = 2, sp.total_batch_size = 2 * 64 * 4 * 4;
        cases.push_back({"tp 2 SP x pp 2 1f1b x dp 4, ZeRO-2", tiny, sp});
        Layout full = sp;
        full.recompute = Recompute{RecomputePolicy::Full, 1}, full.zero_stage = 3, full.sequence_parallel = false;
        cases.push_back({"tp 2 x pp 2 x dp 4, ZeRO-3, full recompute", tiny, full});
        Layout ring = one;
        ring.ranks = 8, ring.cp = 2, ring.tp = 2, ring.zero_stage = 1, ring.total_batch_size = 2 * 64 * 2;
        cases.push_back({"cp 2 ring x tp 2 x dp 2, ZeRO-1", tiny, ring});
        Layout ulysses = ring;
        ulysses.cp_mode = ContextParallelMode::Ulysses, ulysses.tp = 1, ulysses.ranks = 4;
        cases.push_back({"cp 2 Ulysses x dp 2", tiny, ulysses});
        GPT2Config moe = tiny;
        moe.experts = 4, moe.experts_per_token = 2, moe.shared_experts = 1, moe.moe_every = 2;
        Layout ep = one;
        ep.ranks = 4, ep.ep = 2, ep.total_batch_size = 2 * 64 * 4;
        cases.push_back({"4 experts over ep 2 x dp 4", moe, ep});
        for (const Case& k : cases) {
            const LayoutPlan p = plan_layout(k.config, k.layout, hand_profile());
            if (!check_true(std::string(k.name) + ": planned", p.error.empty(), p.error)) continue;
            int equal = 0;
            std::string detail;
            for (int a = 0; a < kPlanAxes; a++) {
                const double calls = collective_calls_bytes(p.collectives[a]);
                const bool same = std::fabs(calls - p.bytes[a]) <= 1.0;
                equal += same;
                if (!same) detail += std::string(plan_axis_name(a)) + " " + describe(calls, p.bytes[a]) + "; ";
            }
            check_true(std::string(k.name) + ": calls x bytes == the byte formulas, every axis", equal == kPlanAxes, detail);
        }
    }
}

int run(int, char**) {
    test_by_hand();
    test_prices();
    return lab_closing_line();
}
}  // namespace test_cost_model
