/*
Tests of llmc/planning/planner.h, the arithmetic behind --plan and --plan-search, against published layouts and
hand-worked numbers (no GPU, no MPI ranks: the planner allocates nothing):
  (a) Llama 3 405B (llama_config_by_name: 126 layers, 16384 channels, 128 heads, 8 K/V heads, 53248 hidden units,
      128,256 tokens, an untied LM head; 405,853,388,800 parameters) on the three layouts of Table 4 of Dubey et
      al. 2024, "The Llama 3 Herd of Models": 8K positions on 8,192 GPUs (TP 8, PP 16, DP 64) and on 16,384 (DP
      128), 128K positions on 16,384 (TP 8, CP 16, PP 16, DP 8); 16M tokens per step in micro-batches of one
      sequence, BF16. With the choices the paper describes (section 3.3.2, see meta_layout) each must fit in
      80 GB per GPU, and the estimated MFU, under the built-in h100 machine profile (no number in it picked to
      fit), must be at or above the paper's 43%, 41% and 38% (the model leaves out what a step over thousands of
      GPUs adds); whether it is within 15% is printed, not checked (it is not: +19% to +53%, the efficiencies are
      one GPU's); each term's seconds are printed, and where the model and the paper differ. The paper trains
      at 8K without activation checkpointing; in our accounting none of the three fits without any
      recomputation (the reason is printed: check_llama), so they are planned with the least that fits,
      selective, which recomputes only elementwise work.
  (b) the cost model by hand is a suite of its own, dev/test/test_cost_model.cu (what the two plan with:
      dev/test/planner_fixtures.h).
  (c) --plan-search for GPT-2 1558M on 64 ranks of 80 GB: at least one layout, each of them fits, re-plans
      to the same numbers, fastest first; at 16 GB some layouts are left out for their size.
  (d) mixtures of experts by name (test_experts): Mixtral 8x7B's counts, total and active, a plan that fits,
      MFU from the active FLOPs; DeepSeek-V3's shape needs expert parallelism.
Korthikanti et al.'s Table 2 (and its adaptation to Llama's block) and the ZeRO paper's Figure 1 are checked in
dev/test/test_memory.cu (test_paper, test_korthikanti_by_hand, test_korthikanti_shapes, test_korthikanti_llama;
scripts/test/run_tests.sh runs both suites); here the adapted Table 2's rows are checked once more at the 405B
layouts' shape. Prints `N passed, M failed`.
*/
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/parallel/pipeline.h"  // before planner.h: the Pipeline without its executor
#include "../../llmc/planning/planner.h"
#include "planner_fixtures.h"

namespace test_planner {  // one suite of dev/test/host_suites.cu

// The built-in H100 cluster profile (llmc/planning/hardware.h cites each of its numbers): Table 4 is planned under it
static PlanHardware h100_profile() {
    PlanHardware hw = machine_profile_read("h100");
    hw.gpu_memory_bytes = 80 * kGB;
    return hw;
}

// ----------------------------------------------------------------------------
// (a) Llama 3 405B's layouts

struct Table4Layout {
    const char* name;
    int gpus, seq_len, cp, dp, microbatches;
    double tflops, mfu;  // the paper's: TFLOP/s per GPU and BF16 MFU
};
static const Table4Layout kTable4[3] = {
    {"8K on 8,192 GPUs", 8192, 8192, 1, 64, 32, 430, 0.43},
    {"8K on 16,384 GPUs", 16384, 8192, 1, 128, 16, 400, 0.41},
    {"128K on 16,384 GPUs", 16384, 131072, 16, 8, 16, 380, 0.38},
};

struct Table4Result {
    double peak_bytes = 0, none_bytes = 0, mfu = 0, step_seconds = 0;
    LayoutPlan plan;
};

static Table4Result check_llama(const Table4Layout& t) {
    printf("Llama 3 405B, %s (tp 8 x pp 16 x cp %d x dp %d, interleaved V 4, ZeRO-2, recompute selective, "
           "sequence parallel)\n", t.name, t.cp, t.dp);
    Table4Result result;
    const std::string name = std::string("405B ") + t.name;
    const GPT2Config config = llama_405b(t.seq_len);
    const PlanHardware hw = h100_profile();
    const LayoutPlan plan = plan_layout(config, meta_layout(t.gpus, t.seq_len, t.cp, RecomputePolicy::Selective), hw);
    if (!check_true(name + ": the layout checks accept it", plan.error.empty(), plan.error)) return result;
    check_true(name + ": dp fills the GPUs", plan.dp == t.dp && plan.dp * 8 * 16 * t.cp == t.gpus,
               describe(plan.dp, t.dp));
    check_true(name + ": microbatches of 1 sequence per dp rank", plan.accumulation == t.microbatches,
               describe(plan.accumulation, t.microbatches));
    check_true(name + ": 64 stages, 1 layer on the first and the last, 126 in all",
               plan.stage_layers.size() == 64 && plan.stage_layers.front() == 1 && plan.stage_layers.back() == 1 &&
                   pipeline_first_layer(plan.stage_layers, 64) == 126);
    print_memory_plan(plan.stages[plan.fullest_stage]);
    print_plan_communication(plan, hw);
    print_plan_estimate(plan, hw);
    const double needed = plan.peak_bytes + kPlanReserveBytes;
    check_true(name + ": fits in 80 GB per GPU", plan.fits && needed <= 80 * kGB,
               format_bytes(needed) + " needed on pp rank " + std::to_string(plan.fullest_stage));

    // Without recomputation. A layer keeps sb/t (12h + 4k + 6f + 8 + 4a) = 508.5 MiB at s = 8192 rows (the 128K
    // layout's T/cp too), tp 8 with sequence parallelism (the adapted Table 2; SwiGLU's gate, up and product are
    // 6sbf/t = 312 MiB of it). The fullest rank holds its schedule's records in flight, each sized for 2 layers
    // (its largest stage): 64 at 16 microbatches (128 layer-records, 63.6 GiB), 79 at 32 (158, 78.5 GiB), and
    // with each record the stage's input and output gradient (2 sbh/t, 64 MiB). With the model state (ZeRO-2:
    // 2P whole, 14P/dp), the workspace and the 2 GiB reserve that is 78.7 GiB at 16 microbatches and 94.9 GiB at
    // 32: more than 80 GB (74.5 GiB) in every layout. (The paper frees each stage's input and output tensors as
    // soon as it can; without our 4 GiB of them the 16-microbatch layouts would need 74.7 and 74.9 GiB, within
    // an 80 GiB H100 but not within 80 GB; at 32 microbatches 89.9 GiB, in neither.)
    const LayoutPlan none = plan_layout(config, meta_layout(t.gpus, t.seq_len, t.cp, RecomputePolicy::None), hw);
    const MemoryPlan& fullest = none.stages[none.fullest_stage];
    printf("  without recomputation: pp rank %d holds %d record(s) of its %d stages: activations %s (%s per layer "
           "kept), model state %s, workspace %s, + %s reserved = %s\n", none.fullest_stage,
           none.shapes[none.fullest_stage].records, none.layout.pp_virtual, format_bytes(fullest.activations).c_str(),
           format_bytes(gpt2_activation_bytes(none.shapes[none.fullest_stage], true).per_layer).c_str(),
           format_bytes(fullest.model_state).c_str(), format_bytes(fullest.workspace).c_str(),
           format_bytes(kPlanReserveBytes).c_str(), format_bytes(none.peak_bytes + kPlanReserveBytes).c_str());
    check_true(name + ", recompute none: does not fit in 80 GB per GPU",
               none.error.empty() && !none.fits && none.peak_bytes + kPlanReserveBytes > 80 * kGB,
               format_bytes(none.peak_bytes + kPlanReserveBytes));
    // The estimate beside the paper's. The profile's efficiencies are one GPU's, measured or bounded, and the model
    // leaves out what a step over thousands of GPUs adds to them (print_table4 lists it), so it must not fall below
    // what the paper achieved: an estimate under it would charge a term more than the hardware costs.
    check_true(name + ": estimated MFU at or above the paper's (the model leaves overheads out)", plan.mfu >= t.mfu,
               describe(plan.mfu, t.mfu));
    // Within 15% of the paper is the aim, not met with these efficiencies and not forced by picking one: printed,
    // neither passed nor failed.
    printf("  %s   %s: estimated MFU within 15%% of the paper's: %s (%+.0f%%)\n",
           std::fabs(plan.mfu - t.mfu) <= 0.15 * t.mfu ? "met" : "NOT MET", name.c_str(),
           describe(plan.mfu, t.mfu).c_str(), 100 * (plan.mfu / t.mfu - 1));
    result.peak_bytes = needed;
    result.none_bytes = none.peak_bytes + kPlanReserveBytes;
    result.mfu = plan.mfu;
    result.step_seconds = plan.step_seconds;
    result.plan = plan;
    return result;
}

// Each term of the estimate in seconds per step: compute by kind, the exposed communication, the bubble's stretch
// of the terms it stretches; then where the model and the paper differ.
static void print_table4(const Table4Result results[3]) {
    printf("Llama 3 405B, Table 4's layouts (interleaved V 4, ZeRO-2, selective) under the built-in h100 profile:\n");
    printf("  %-22s %12s %16s %9s %14s %10s %9s\n", "layout", "memory", "recompute none", "step s", "TFLOP/s ours",
           "MFU ours", "paper");
    for (int i = 0; i < 3; i++)
        printf("  %-22s %12s %16s %9.2f %14.0f %9.1f%% %4.0f%% (%3.0f)\n", kTable4[i].name,
               format_bytes(results[i].peak_bytes).c_str(), format_bytes(results[i].none_bytes).c_str(),
               results[i].step_seconds, results[i].mfu * 989.4, 100 * results[i].mfu, 100 * kTable4[i].mfu,
               kTable4[i].tflops);
    printf("  seconds per step, term by term (step = (matmuls + attention + memory-bound + tp + cp + pp + recompute) "
           "/ (1 - bubble) + dp exposed):\n");
    printf("  %-22s %8s %9s %13s %7s %7s %7s %9s %14s %11s %8s\n", "layout", "matmuls", "attention", "memory-bound",
           "tp", "cp", "pp", "recompute", "bubble (share)", "dp exposed", "step");
    for (int i = 0; i < 3; i++) {
        const LayoutPlan& p = results[i].plan;
        const double stretched = p.compute_seconds + p.axis_seconds[PLAN_TP] + p.shown_cp_seconds +
                                 p.axis_seconds[PLAN_PP] + p.recompute_seconds;
        printf("  %-22s %8.3f %9.3f %13.3f %7.3f %7.3f %7.3f %9.3f %7.3f (%.3f) %11.3f %8.3f\n", kTable4[i].name,
               p.compute.matmul, p.compute.attention, p.compute.memory, p.axis_seconds[PLAN_TP], p.shown_cp_seconds,
               p.axis_seconds[PLAN_PP], p.recompute_seconds, stretched * p.bubble / (1 - p.bubble), p.bubble,
               p.exposed_dp_seconds, p.step_seconds);
    }
    for (int i = 0; i < 3; i++) {
        const LayoutPlan& p = results[i].plan;
        const GPT2Config config = llama_405b(kTable4[i].seq_len);
        // the model FLOPs with causal attention (6 L C T: the half of the T x T our kernel computes) in place of
        // PaLM's 12 L C T
        const double causal = (model_flops_per_token(config, kTable4[i].seq_len) -
                               6.0 * config.num_layers * config.channels * kTable4[i].seq_len) /
                              model_flops_per_token(config, kTable4[i].seq_len);
        printf("  %s: ours %.1f%%, the paper's %.0f%% (%+.0f%%). The matmuls run at the profile's single-GPU "
               "efficiencies (%.2f of peak on average here), which a synchronous step over %d GPUs does not reach in "
               "the paper (stragglers, clocks under power limits, collective kernels taking SMs and memory bandwidth "
               "from the overlapped matmuls: none modelled); MFU counts PaLM's full T x T attention, of which the "
               "kernel computes the causal half: counted causally ours is %.1f%%.\n",
               kTable4[i].name, 100 * p.mfu, 100 * kTable4[i].mfu, 100 * (p.mfu / kTable4[i].mfu - 1),
               (p.hardware_flops - 12.0 * config.num_layers * config.channels * kTable4[i].seq_len * p.tokens) /
                   p.layout.ranks / p.compute.matmul / 989.4e12,
               kTable4[i].gpus, 100 * p.mfu * causal);
    }
}

// The adapted Table 2's rows at the 405B layouts' shape (8K, tp 8): the corrected count equals the bytes our
// kernels keep
static void check_table2_at_405b() {
    printf("Korthikanti et al. Table 2 adapted to Llama, at Llama 3 405B (s 8192, b 1, h 16384, a 128, k 1024, "
           "f 53248, t 8)\n");
    const LayoutPlan plan = plan_layout(llama_405b(8192), meta_layout(16384, 8192, 1, RecomputePolicy::Full),
                                        hand_profile(80 * kGB));
    int equal = 0;
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Value v = korthikanti_table2((Table2Row)r, plan.shapes[0]);
        if (v.corrected == gpt2_activation_bytes(v.ours, true).per_layer) equal++;
    }
    check_true("405B: corrected adapted Table 2 == ours, every row", equal == kNumTable2Rows,
               describe(equal, kNumTable2Rows));
    // full recomputation keeps the layer's input, 2sbh bytes (Table 2's last row), split over tp 8 by sp
    const double sbh = 8192.0 * 16384;
    check_true("405B, full: 2 sbh/t per layer", gpt2_activation_bytes(plan.shapes[0], true).per_layer == 2 * sbh / 8,
               describe(gpt2_activation_bytes(plan.shapes[0], true).per_layer, 2 * sbh / 8) + " (sequence parallel: /t)");
    // --plan prints the adapted table
    char* text = nullptr;
    size_t size = 0;
    FILE* out = open_memstream(&text, &size);
    print_korthikanti_table2(plan.shapes[0], true, out);
    fclose(out);
    const std::string printed(text, size);
    free(text);
    printf("%s", printed.c_str());
    check_true("405B: the printed table is the adapted one, every row ==",
               printed.find("adapted to Llama's block") != std::string::npos &&
                   printed.find(" != ") == std::string::npos &&
                   printed.find("sb/t (12h + 4k + 6f + 8 + 4a)") != std::string::npos,
               printed.substr(0, 600));
}

// ----------------------------------------------------------------------------
// (c) the search

static void check_search(double gpu_memory_bytes, bool expect_some_too_big) {
    GPT2Config config;
    gpt2_config_by_name("1558M", &config);
    Layout base;
    base.ranks = 64, base.batch_size = 4, base.seq_len = 1024, base.total_batch_size = 524288, base.bf16 = true;
    const PlanHardware hw = hand_profile(gpu_memory_bytes);
    const PlanSearch search = plan_search(config, base, hw);
    print_plan_search(config, search, base, hw, 10);
    const std::string where = "GPT-2 1558M, 64 ranks of " + format_bytes(gpu_memory_bytes);
    check_true(where + ": at least one layout", !search.fitting.empty(), std::to_string(search.fitting.size()));
    int fitting = 0, same = 0, ordered = 0;
    for (size_t i = 0; i < search.fitting.size(); i++) {
        const LayoutPlan& p = search.fitting[i];
        const LayoutPlan again = plan_layout(config, p.layout, hw);
        fitting += p.fits && p.peak_bytes + kPlanReserveBytes <= gpu_memory_bytes && p.error.empty();
        same += again.error.empty() && again.step_seconds == p.step_seconds && again.peak_bytes == p.peak_bytes;
        ordered += i == 0 || search.fitting[i - 1].step_seconds <= p.step_seconds;
    }
    const int n = (int)search.fitting.size();
    check_true(where + ": every listed layout fits", fitting == n, describe(fitting, n));
    check_true(where + ": each re-plans to the same numbers", same == n, describe(same, n));
    check_true(where + ": fastest first", ordered == n, describe(ordered, n));
    check_true(where + ": every layout accounted for",
               search.considered == search.refused + search.too_big + n && search.refused > 0,
               describe(search.considered, search.refused + search.too_big + n));
    check_true(where + (expect_some_too_big ? ": some layouts too big" : ": none too big"),
               (search.too_big > 0) == expect_some_too_big, describe(search.too_big, expect_some_too_big));
}


// The most expensive stage of a split, in layer-equivalents.
static double split_max_cost(const std::vector<int>& layers, double first_extra, double last_extra) {
    double most = 0;
    for (size_t s = 0; s < layers.size(); s++)
        most = std::max(most, layers[s] + (s == 0 ? first_extra : 0.0) + (s + 1 == layers.size() ? last_extra : 0.0));
    return most;
}

// The least max stage cost over every split of L layers into S stages of >= 1 layer, by enumeration.
static double brute_force_max_cost(int L, int S, double first_extra, double last_extra) {
    double best = 1e300;
    std::vector<int> layers(S, 1);
    auto visit = [&](auto&& self, int stage, int left) -> void {
        if (stage == S - 1) {
            layers[stage] = left;
            best = std::min(best, split_max_cost(layers, first_extra, last_extra));
            return;
        }
        for (int n = 1; n <= left - (S - 1 - stage); n++) {
            layers[stage] = n;
            self(self, stage + 1, left - n);
        }
    };
    visit(visit, 0, L);
    return best;
}

static void test_balanced_layers() {
    printf("balanced stage split\n");
    // L = 8, S = 4, last extra 3: the least bound is 4 (the last stage holds 1 layer + 3); the five layers the
    // capacities 4, 4, 4, 1 have too many leave stages 2, 1, 0, 2, 1 in turn.
    check_true("L=8 S=4 last extra 3 -> {3,2,2,1}", pipeline_balanced_layers(8, 4, 0, 3) == std::vector<int>({3, 2, 2, 1}),
               "");
    check_true("L=8 S=4 no extras -> {2,2,2,2}", pipeline_balanced_layers(8, 4, 0, 0) == std::vector<int>({2, 2, 2, 2}), "");
    // first 1, last 2: bound 4 gives capacities 3, 4, 4, 2 (13); the one surplus layer leaves the highest of the
    // equal-cost stages that has more than one layer, stage 3.
    check_true("L=12 S=4 first 1 last 2 -> {3,4,4,1}",
               pipeline_balanced_layers(12, 4, 1, 2) == std::vector<int>({3, 4, 4, 1}), "");
    check_true("L=5 S=1 -> {5}", pipeline_balanced_layers(5, 1, 0.5, 2) == std::vector<int>({5}), "");
    int grid_failures = 0;
    for (int S = 1; S <= 5; S++)
        for (int L = S; L <= 11; L++)
            for (double first_extra : {0.0, 0.3, 1.0, 2.5})
                for (double last_extra : {0.0, 0.7, 1.0, 3.0, 6.2}) {
                    const std::vector<int> layers = pipeline_balanced_layers(L, S, first_extra, last_extra);
                    int sum = 0;
                    bool each_positive = (int)layers.size() == S;
                    for (int n : layers) sum += n, each_positive = each_positive && n >= 1;
                    const bool minimal = std::fabs(split_max_cost(layers, first_extra, last_extra) -
                                                   brute_force_max_cost(L, S, first_extra, last_extra)) < 1e-9;
                    if (sum != L || !each_positive || !minimal || pipeline_first_layer(layers, S - 1) != L - layers[S - 1])
                        grid_failures++;
                }
    // zbv: the ranks' totals balanced (rank r: stages r and 2p - 1 - r; rank 0 holds the head)
    check_true("zbv L=32 p=4 head 8.2 -> {1,5,5,5,5,5,5,1}",
               pipeline_balanced_v_layers(32, 4, 8.2) == std::vector<int>({1, 5, 5, 5, 5, 5, 5, 1}), "");
    check_true("zbv L=32 p=2 head 8.2 -> {11,10,10,1}",
               pipeline_balanced_v_layers(32, 2, 8.2) == std::vector<int>({11, 10, 10, 1}), "");
    int v_failures = 0;
    for (int p = 1; p <= 4; p++)
        for (int L = 2 * p; L <= 12; L++)
            for (double head : {0.0, 0.7, 3.0, 6.2}) {
                const std::vector<int> stages = pipeline_balanced_v_layers(L, p, head);
                int sum = 0;
                bool each_positive = (int)stages.size() == 2 * p;
                double most = 0;
                for (int n : stages) sum += n, each_positive = each_positive && n >= 1;
                for (int r = 0; r < p && each_positive; r++)
                    most = std::max(most, stages[r] + stages[2 * p - 1 - r] + (r == 0 ? head : 0.0));
                // the ranks' problem with two layers each set aside: one layer per rank less, the same balance
                const bool minimal = std::fabs(most - (brute_force_max_cost(L - p, p, head, 0) + 1)) < 1e-9;
                if (sum != L || !each_positive || !minimal) v_failures++;
            }
    check_true("zbv grid p<=4, L<=12: sums to L, each stage >= 1, max rank cost minimal (brute force)", v_failures == 0,
               std::to_string(v_failures) + " splits wrong");
    // auto: the LM head + loss against one block, 6 C Vp + 10 Vp over 72 C^2 + 12 C T FLOPs per token
    GPT2Config wide;
    wide.num_layers = 126, wide.channels = 16384, wide.num_heads = 128, wide.vocab_size = 50257;
    wide.padded_vocab_size = 50304, wide.max_seq_len = 8192;
    wide = gpt2_shape(wide);
    Layout sixteen;
    sixteen.pp = 16, sixteen.seq_len = 8192;  // head = 0.236 layers: the last two stages give up one layer each
    check_true("126 layers over pp 16 at T 8192: fourteen 8s then 7, 7",
               pipeline_stage_split(wide, sixteen) == std::vector<int>({8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7, 7}), "");
    GPT2Config narrow;
    narrow.num_layers = 12, narrow.channels = 512, narrow.num_heads = 8, narrow.vocab_size = 50257;
    narrow.padded_vocab_size = 50304, narrow.max_seq_len = 256;
    narrow = gpt2_shape(narrow);
    Layout four;
    four.pp = 4, four.seq_len = 256;  // head = 7.58 layers: the last stage holds one block and costs 8.58
    check_true("12 layers, C 512 over pp 4 at T 256: {4, 4, 3, 1}",
               pipeline_stage_split(narrow, four) == std::vector<int>({4, 4, 3, 1}), "");
    four.pp_layers = {2, 4, 4, 2};
    check_true("a valid --pp-layers list is taken as given", pipeline_stage_split(narrow, four) == four.pp_layers, "");
    check_true("grid S<=5, L<=11: sums to L, each >= 1, max stage cost minimal (brute force)", grid_failures == 0,
               std::to_string(grid_failures) + " splits wrong");
}

// (d) Mixtures of experts by name: Mixtral 8x7B's shape in our block has exactly its published 46.7B
// parameters and 12.9B active; planned on 64 GPUs (dp 8 x pp 8, ZeRO-1, selective) it fits in 80 GB and its MFU
// counts the active FLOPs. The DeepSeek-V3-like shape does not fit on 2048 GPUs at ZeRO-3 without expert
// parallelism: a block's 256 experts (11.3B parameters) are gathered whole. Under tp each tp rank routes whole
// sequences, so tp must divide the batch.
static void test_experts() {
    GPT2Config mixtral, deepseek;
    if (!moe_config_by_name("mixtral-8x7B-like", &mixtral) || !moe_config_by_name("deepseek-v3-like", &deepseek))
        fatal("the mixture-of-experts names are missing");
    const double total = (double)ParameterLayout(mixtral).num_parameters, active = active_parameters(mixtral);
    check_true("mixtral-8x7B-like: 46,702,792,704 parameters", total == 46702792704.0, describe(total, 46702792704.0));
    check_true("mixtral-8x7B-like: 12,879,925,248 active (2 of 8 experts)", active == 12879925248.0,
               describe(active, 12879925248.0));
    Layout l;
    l.ranks = 64, l.pp = 8, l.zero_stage = 1, l.batch_size = 1, l.seq_len = 4096, l.total_batch_size = 1 << 20;
    l.recompute.policy = RecomputePolicy::Selective;
    l.bf16 = true;
    const LayoutPlan plan = plan_layout(mixtral, l, hand_profile());
    check_true("mixtral-8x7B-like on dp 8 x pp 8, ZeRO-1, selective: fits in 80 GiB", plan.error.empty() && plan.fits,
               plan.error);
    const double flops = 6 * (active - (double)ParameterLayout(mixtral).elements(WTE, 0)) + 12.0 * 32 * 4096 * 4096;
    check_true("mixtral-8x7B-like: model FLOPs per token from the active parameters (6 N + 12 L C T, N without wte)",
               plan.model_flops == flops * plan.tokens, describe(plan.model_flops, flops * plan.tokens));
    Layout big = l;
    big.ranks = 2048, big.pp = 16, big.zero_stage = 3, big.total_batch_size = 1 << 24;
    big.recompute.policy = RecomputePolicy::Full;
    const LayoutPlan deep = plan_layout(deepseek, big, hand_profile());
    check_true("deepseek-v3-like on dp 128 x pp 16, ZeRO-3, full recompute: does not fit without expert parallelism",
               deep.error.empty() && !deep.fits, deep.error);
    Layout tp = l;
    tp.tp = 2, tp.pp = 4;
    check_true("a mixture of experts at tp 2 with B 1: refused (each tp rank routes whole sequences)",
               plan_layout_error(mixtral, tp).find("tp must divide the batch") != std::string::npos,
               plan_layout_error(mixtral, tp));
    tp.batch_size = 2;
    check_true("a mixture of experts at tp 2 with B 2: planned", plan_layout_error(mixtral, tp).empty(),
               plan_layout_error(mixtral, tp));
    // a mixture every 2nd block (GShard's, Switch's): 16 of the 32 blocks keep one dense SwiGLU MLP of 3 F C
    // parameters (F = 14,336) instead of 8 experts of 3 F C each and the router's 8 C; a token meets 2 experts
    // in the other 16, so each of those has 6 experts idle
    GPT2Config every2 = mixtral;
    every2.moe_every = 2;
    const double mlp = 3.0 * 14336 * 4096, every2_total = total - 16 * (7 * mlp + 8 * 4096);
    const double every2_total_counted = (double)ParameterLayout(every2).num_parameters;
    check_true("mixtral-8x7B-like, a mixture every 2nd block: 16 dense MLPs in place of 16 mixtures",
               every2_total_counted == every2_total, describe(every2_total_counted, every2_total));
    check_true("... and 6 idle experts in each of the 16 mixtures", active_parameters(every2) == every2_total - 16 * 6 * mlp,
               describe(active_parameters(every2), every2_total - 16 * 6 * mlp));
    check_true("... whose plan on dp 8 x pp 8 has no error", plan_layout_error(every2, l).empty(),
               plan_layout_error(every2, l));
}

// ----------------------------------------------------------------------------
// (e) --recompute auto (llmc/planning/recompute_choice.h): the dynamic programme against every one of the 4^l
// letter strings, on small cases and many budgets

struct AutoCase {
    const char* name;
    GPT2Config config;
    Layout layout;
    PlanHardware hw;
};

// What the exhaustive search found over every budget of one case, for the closing checks.
struct AutoCoverage {
    bool kind_won[kNumBlockKeeps] = {};
    int workspace_mattered = 0;  // budgets where a faster string fits without its kinds' workspace, not with it
    int mixed = 0;               // budgets whose optimum uses two or more kinds
    int none_fit = 0;            // budgets below the least memory (the error line)
};

static void check_auto_case(const AutoCase& c, AutoCoverage& coverage) {
    printf("recompute auto against every letter string: %s\n", c.name);
    const std::vector<int> stages = pipeline_stage_split(c.config, c.layout);
    const int positions = *std::max_element(stages.begin(), stages.end());
    Layout keep = c.layout;
    keep.recompute = Recompute{RecomputePolicy::PerBlock, 1, std::vector<BlockKeep>(positions, BlockKeep::Keep)};
    const LayoutPlan kept = plan_layout(c.config, keep, c.hw);
    if (!check_true(std::string(c.name) + ": planned", kept.error.empty(), kept.error)) return;
    const std::vector<RecomputeRank> ranks = plan_recompute_ranks(c.config, keep, c.hw, kept, true);
    // every string: each rank's total from plan_training_memory with that PerBlock policy (the formula, not the
    // programme's sum), the workspace its kinds add, and the seconds the programme minimises
    const int strings = 1 << (2 * positions), R = (int)ranks.size();
    std::vector<double> fullest(strings), fullest_without_workspace(strings), seconds(strings);
    int sums_equal = 0;
    std::vector<BlockKeep> letters(positions);
    int allowed_strings = 0;
    for (int code = 0; code < strings; code++) {
        bool allowed = true;
        for (int i = 0; i < positions; i++) {
            letters[i] = (BlockKeep)((code >> (2 * i)) & 3);
            allowed = allowed && ((ranks[0].kinds_allowed >> (int)letters[i]) & 1);
        }
        if (!allowed) {  // a kind the model refuses (o under a mixture of experts): never a candidate
            fullest[code] = fullest_without_workspace[code] = INFINITY;
            seconds[code] = INFINITY;
            continue;
        }
        allowed_strings++;
        fullest[code] = fullest_without_workspace[code] = 0;
        for (int r = 0; r < R; r++) {
            GPT2MemoryShape shape = kept.shapes[r];
            shape.recompute = Recompute{RecomputePolicy::PerBlock, 1, letters};
            const MemoryPlan& k = kept.stages[r];
            const double total = plan_training_memory(k.num_parameters, k.zero_stage, k.data_parallel_ranks,
                                                      k.shard_ranks, k.bf16, k.accumulation_steps, &shape).total;
            unsigned kinds = 0;
            for (int i = 0; i < ranks[r].positions; i++) kinds |= 1u << (int)letters[i];
            fullest[code] = std::max(fullest[code], total);
            fullest_without_workspace[code] = std::max(fullest_without_workspace[code],
                                                       total - recompute_workspace_bytes(ranks[r].terms, kinds));
            sums_equal += total == recompute_rank_bytes(ranks[r], letters);
        }
        seconds[code] = recompute_seconds(ranks, letters);
    }
    check_true(std::string(c.name) + ": base + K sum d + w == plan_training_memory, every string and rank, to the byte",
               sums_equal == allowed_strings * R, describe(sums_equal, allowed_strings * R));
    const double least = *std::min_element(fullest.begin(), fullest.end());
    double most = least;
    for (double f : fullest)
        if (std::isfinite(f)) most = std::max(most, f);
    // budgets from below the least memory to above the most, and each string's own memory near the optimum's
    std::vector<double> budgets;
    for (int b = 0; b <= 40; b++) budgets.push_back(least - 1 + (most - least + 2) * b / 40.0);
    for (int code = 0; code < strings; code += std::max(1, strings / 40))
        if (std::isfinite(fullest[code])) budgets.push_back(fullest[code]);
    int agree = 0;
    std::vector<std::string> optima;  // the distinct optima, from the least budget up
    std::sort(budgets.begin(), budgets.end());
    for (double budget : budgets) {
        int best = -1;
        for (int code = 0; code < strings; code++)
            if (fullest[code] <= budget && (best < 0 || seconds[code] < seconds[best])) best = code;
        const RecomputeChoice choice = recompute_choose(ranks, budget, c.hw);
        double chosen_fullest = 0;
        int chosen_code = 0;
        for (int i = 0; i < positions; i++) chosen_code |= (int)choice.blocks[i] << (2 * i);
        chosen_fullest = fullest[chosen_code];
        bool same;
        if (best < 0) {  // nothing fits: the error names the least memory, and the least-memory letters have it
            same = !choice.error.empty() && chosen_fullest == least &&
                   choice.error.find(format_bytes(least)) != std::string::npos;
            coverage.none_fit++;
        } else {
            // the same optimum time (sums of the same few terms in another order: within 1e-12 relative), the
            // chosen letters fit by the formula
            same = choice.error.empty() && chosen_fullest <= budget &&
                   std::fabs(seconds[chosen_code] - seconds[best]) <= 1e-12 * std::max(seconds[best], 1e-300) &&
                   std::fabs(choice.seconds - seconds[best]) <= 1e-12 * std::max(seconds[best], 1e-300);
            unsigned kinds = 0;
            for (BlockKeep k : choice.blocks) kinds |= 1u << (int)k, coverage.kind_won[(int)k] = true;
            coverage.mixed += __builtin_popcount(kinds) > 1;
            if (std::find(optima.begin(), optima.end(), recompute_blocks_text(choice.blocks)) == optima.end())
                optima.push_back(recompute_blocks_text(choice.blocks));
            bool mattered = false;
            for (int code = 0; code < strings && !mattered; code++)
                mattered = seconds[code] < seconds[best] && fullest[code] > budget &&
                           fullest_without_workspace[code] <= budget;
            coverage.workspace_mattered += mattered;
        }
        if (!same)
            printf("  budget %.0f: exhaustive %s (%.6g s, %.0f bytes), programme %s (%.6g s, %.0f bytes) %s\n", budget,
                   best < 0 ? "none" : std::to_string(best).c_str(), best < 0 ? 0.0 : seconds[best],
                   best < 0 ? 0.0 : fullest[best], recompute_blocks_text(choice.blocks).c_str(), choice.seconds,
                   chosen_fullest, choice.error.c_str());
        agree += same;
    }
    std::string listed;
    for (const std::string& o : optima) listed += " " + o;
    printf("  %d strings, memory %s .. %s; the optima from the least budget up:%s\n", strings,
           format_bytes(least).c_str(), format_bytes(most).c_str(), listed.c_str());
    check_true(std::string(c.name) + ": the programme's optimum == the exhaustive search's, " +
                   std::to_string(budgets.size()) + " budgets over " + std::to_string(strings) + " strings",
               agree == (int)budgets.size(), describe(agree, (double)budgets.size()));
    // --plan under auto: the programme's letters, planned, fitting --gpu-memory (budget + the reserve)
    PlanHardware hw = c.hw;
    hw.gpu_memory_bytes = (least + most) / 2 + hw.reserve_bytes;
    Layout auto_layout = c.layout;
    auto_layout.recompute.policy = RecomputePolicy::Auto;
    const LayoutPlan plan = plan_layout(c.config, auto_layout, hw);
    const RecomputeChoice direct = recompute_choose(ranks, (least + most) / 2, hw);
    check_true(std::string(c.name) + ": --plan under auto plans the programme's letters, and they fit",
               plan.error.empty() && plan.recompute_auto && plan.fits &&
                   plan.layout.recompute.blocks == direct.blocks && plan.peak_bytes <= (least + most) / 2,
               plan.error + " " + recompute_blocks_text(plan.layout.recompute.blocks) + " vs " +
                   recompute_blocks_text(direct.blocks));
}

static void test_recompute_auto() {
    AutoCoverage coverage;
    // GPT-2, one rank, 6 blocks. The hardware (the default h100 profile slowed to 1 TFLOP/s, PCIe at 5.5 GB/s) is
    // chosen so that each kind has budgets where it is the best (the closing check confirms every kind wins some):
    // a record (250 KB) moves in about 45 us, near a block's forward pass f at these small shapes' efficiency, so
    // offload can show less than full's f for the same device bytes but twice full's workspace; selective's passes
    // (200 KB at 3.35 TB/s) cost next to nothing but keep the most after keep
    AutoCase gpt2{"GPT-2 6 layers C 64, one rank", {}, {}, {}};
    gpt2.config.num_layers = 6, gpt2.config.channels = 64, gpt2.config.num_heads = 4, gpt2.config.vocab_size = 256;
    gpt2.config.padded_vocab_size = 256, gpt2.config.max_seq_len = 64;
    gpt2.config = gpt2_shape(gpt2.config);
    gpt2.layout.ranks = 1, gpt2.layout.batch_size = 2, gpt2.layout.seq_len = 64, gpt2.layout.bf16 = true;
    gpt2.layout.total_batch_size = 2 * 64 * 2;
    gpt2.hw.pcie_bytes_per_second = 5.5e9, gpt2.hw.peak_flops = 1e12;
    check_auto_case(gpt2, coverage);
    // Llama, pp 2 under 1f1b with 4 microbatches: the first rank keeps 2 records, the last 1 and the LM head; 7
    // blocks per stage record
    AutoCase llama{"Llama 14 layers C 64 (2 K/V heads, SwiGLU 160), pp 2 1f1b, ZeRO-1", {}, {}, {}};
    llama.config = gpt2.config;
    llama.config.arch = Arch::Llama, llama.config.num_layers = 14, llama.config.kv_heads = 2;
    llama.config.ffn_hidden = 160, llama.config.rope_theta = 10000;
    llama.layout = gpt2.layout;
    llama.layout.ranks = 4, llama.layout.pp = 2, llama.layout.zero_stage = 1;
    llama.layout.schedule = PipelineSchedule::OneFOneB, llama.layout.pp_layers = {7, 7};
    llama.layout.total_batch_size = 2 * 64 * 2 * 4;
    llama.hw = gpt2.hw;
    check_auto_case(llama, coverage);
    // a mixture of experts in every 2nd block over uneven stages of 7 and 5: the ranks' positions differ in length
    // and in which carry a mixture's buffers (two classes of ranks, two lengths)
    AutoCase moe{"GPT-2 12 layers with 4 experts (2 per token) every 2nd block, pp 2 gpipe, stages 7 + 5", {}, {}, {}};
    moe.config = gpt2.config;
    moe.config.num_layers = 12, moe.config.experts = 4, moe.config.experts_per_token = 2;
    moe.config.shared_experts = 1, moe.config.moe_every = 2;
    moe.layout = gpt2.layout;
    moe.layout.ranks = 2, moe.layout.pp = 2, moe.layout.schedule = PipelineSchedule::GPipe;
    moe.layout.pp_layers = {7, 5};
    moe.hw = gpt2.hw;
    check_auto_case(moe, coverage);
    // --plan-search under auto: every layout planned under auto, each listed one re-planned to the same letters, and
    // none slower than the fastest of none, selective and full (a full-every-block plan is the letters fff..)
    {
        Layout base = gpt2.layout;
        base.ranks = 4, base.total_batch_size = 2 * 64 * 4 * 2;
        PlanHardware hw = gpt2.hw;
        hw.reserve_bytes = 0, hw.gpu_memory_bytes = 5.8 * (1 << 20);
        const PlanSearch uniform = plan_search(gpt2.config, base, hw);
        base.recompute.policy = RecomputePolicy::Auto;
        const PlanSearch chosen = plan_search(gpt2.config, base, hw);
        int same = 0;
        for (const LayoutPlan& p : chosen.fitting) {
            Layout again = p.layout;
            again.recompute = base.recompute;
            same += p.recompute_auto && plan_layout(gpt2.config, again, hw).layout.recompute.blocks == p.layout.recompute.blocks;
        }
        const bool faster = !chosen.fitting.empty() && !uniform.fitting.empty() &&
                            chosen.fitting[0].step_seconds <= uniform.fitting[0].step_seconds;
        check_true("--plan-search under auto: every layout re-plans to its letters, the fastest no slower than none, "
                   "selective or full's",
                   same == (int)chosen.fitting.size() && same > 0 && faster && chosen.fitting.size() >= uniform.fitting.size() / 3,
                   describe(same, (double)chosen.fitting.size()) + (faster ? "" : ", slower than a uniform policy"));
    }
    std::string won;
    for (int k = 0; k < kNumBlockKeeps; k++)
        if (coverage.kind_won[k]) won += block_keep_letter((BlockKeep)k);
    printf("  kinds in some optimum: %s; budgets with a mix %d, where the workspace decided %d, where none fit %d\n",
           won.c_str(), coverage.mixed, coverage.workspace_mattered, coverage.none_fit);
    check_true("recompute auto: every kind wins some budget, some optima mix kinds, the workspace decides some, and "
               "some budgets fit nothing (the cases test what they claim)",
               won == "ksfo" && coverage.mixed > 0 && coverage.workspace_mattered > 0 && coverage.none_fit > 0, won);
}

int run(int, char**) {
    test_recompute_auto();
    test_experts();
    test_balanced_layers();
    Table4Result results[3];
    for (int i = 0; i < 3; i++) results[i] = check_llama(kTable4[i]);
    print_table4(results);
    check_table2_at_405b();
    check_search(80 * kGB, false);
    check_search(16 * kGB, true);
    printf("Korthikanti et al. Table 2 (every row, several shapes) and the ZeRO paper's Figure 1 (7.5B parameters, "
           "64 ranks, stages 0-3 within 5%%): checked by build/test_memory, which scripts/test/run_tests.sh runs "
           "beside this suite\n");
    return lab_closing_line();
}
}  // namespace test_planner
