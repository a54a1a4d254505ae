/*
Tests of llmc/planning/planner.h, the arithmetic behind --plan and --plan-search, against published layouts and
hand-worked numbers (no GPU, no MPI ranks: the planner allocates nothing):
  (a) Llama 3 405B's parallel layout (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: 16,384
      GPUs, TP 8, PP 16, CP 1 at 8K positions and CP 16 at 128K, DP filling the rest, micro-batch 1, 16M
      tokens per step, BF16, the optimizer state sharded over dp as ZeRO-1 does) must fit in 80 GB per GPU.
      Our model is GPT-2's architecture (learned positions, GELU MLP, tied embeddings, GPT-2's vocabulary)
      at a 405B-class shape: 128 layers (Llama's 126 do not cut into 16 equal stages), 16384 channels, 128
      heads: 413B parameters. With --recompute full it fits at both lengths; without recomputation the
      128K layout does not (the check can fail both ways). The per-category memory is printed.
  (b) the cost model by hand: compute time, links, bubble, and the shape's parameter count in 64 bits.
  (c) --plan-search for GPT-2 1558M on 64 ranks of 80 GB: at least one layout, each of them fits, re-plans
      to the same numbers, fastest first; at 16 GB some layouts are left out for their size.
Korthikanti et al.'s Table 2 and the ZeRO paper's Figure 1 are checked in dev/test/test_memory.cu (test_paper,
test_korthikanti_by_hand, test_korthikanti_shapes; scripts/test/run_tests.sh runs both suites); here Table 2's
rows are checked once more at the 405B shape. Prints `N passed, M failed`.
*/
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/planning/planner.h"
#include "../../llmc/parallel/pipeline_split.h"

static std::string describe(double got, double want) {
    char text[128];
    snprintf(text, sizeof(text), "got %.12g, expected %.12g", got, want);
    return text;
}

constexpr double kGB = 1e9;  // "80 GB": the smaller reading of an 80 GB H100 (80e9 bytes, 74.5 GiB)

// GPT-2's architecture at Llama 3 405B's width and (rounded up) depth, seeing `seq_len` positions
static GPT2Config llama_class_config(int seq_len) {
    GPT2Config c;
    c.num_layers = 128;
    c.num_heads = 128;
    c.channels = 16384;
    c.vocab_size = 50257;
    c.padded_vocab_size = padded_vocab(c.vocab_size);
    c.max_seq_len = seq_len;
    c = gpt2_shape(c);
    gpt2_validate_config(c, "the 405B-class shape");
    return c;
}

// Table 4 of the Llama 3 paper, 16,384 GPUs: 16M tokens per step, micro-batch 1
static Layout llama_layout(int seq_len, int cp, RecomputePolicy recompute, bool sequence_parallel) {
    Layout l;
    l.ranks = 16384;
    l.tp = 8, l.pp = 16, l.cp = cp;
    l.sequence_parallel = sequence_parallel;
    l.schedule = PipelineSchedule::OneFOneB;
    l.zero_stage = 1;  // the optimizer state sharded over the data-parallel (and cp) ranks
    l.recompute = Recompute{recompute, 1};
    l.batch_size = 1, l.seq_len = seq_len;
    l.total_batch_size = 16 * 1024 * 1024;
    l.bf16 = true;
    return l;
}

static PlanHardware hardware_of(double gpu_memory_bytes) {
    PlanHardware hw;
    hw.gpu_memory_bytes = gpu_memory_bytes;
    return hw;
}

// ----------------------------------------------------------------------------
// (a) Llama 3 405B's layouts

static void check_llama(const char* name, int seq_len, int cp, RecomputePolicy recompute, bool sequence_parallel,
                        int want_dp, bool want_fit) {
    printf("Llama 3 405B layout, %s (%d positions, tp 8 x pp 16 x cp %d, ZeRO-1, recompute %s%s)\n", name, seq_len,
           cp, recompute_policy_names()[(int)recompute].c_str(), sequence_parallel ? ", sequence parallel" : "");
    const GPT2Config config = llama_class_config(seq_len);
    const PlanHardware hw = hardware_of(80 * kGB);
    const LayoutPlan plan = plan_layout(config, llama_layout(seq_len, cp, recompute, sequence_parallel), hw);
    if (!check_true(std::string(name) + ": the layout checks accept it", plan.error.empty(), plan.error)) return;
    check_true(std::string(name) + ": dp fills the 16,384 GPUs", plan.dp == want_dp && plan.dp * 8 * 16 * cp == 16384,
               describe(plan.dp, want_dp));
    check_true(std::string(name) + ": 16 microbatches of 1 sequence per dp rank", plan.accumulation == 16,
               describe(plan.accumulation, 16));
    print_memory_plan(plan.stages[plan.fullest_stage]);
    print_plan_communication(plan, hw);
    print_plan_estimate(plan, hw);
    const double needed = plan.peak_bytes + kPlanReserveBytes;
    check_true(std::string(name) + (want_fit ? ": fits in 80 GB per GPU" : ": does not fit in 80 GB per GPU"),
               plan.fits == want_fit && (needed <= 80 * kGB) == want_fit,
               format_bytes(needed) + " needed on pp rank " + std::to_string(plan.fullest_stage));
    // the fullest rank is the first stage (the most records in flight, the embeddings)
    check_true(std::string(name) + ": pp rank 0 is the fullest", plan.fullest_stage == 0,
               describe(plan.fullest_stage, 0));
}

// Table 2's rows at the 405B shape (8K, tp 8): the corrected count equals the bytes our kernels keep
static void check_table2_at_405b() {
    printf("Korthikanti et al. Table 2 at the 405B-class shape (s 8192, b 1, h 16384, a 128, t 8)\n");
    const GPT2Config config = llama_class_config(8192);
    const LayoutPlan plan = plan_layout(config, llama_layout(8192, 1, RecomputePolicy::Full, true),
                                        hardware_of(80 * kGB));
    int equal = 0;
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Value v = korthikanti_table2((Table2Row)r, plan.shapes[0]);
        if (v.corrected == gpt2_activation_bytes(v.ours, true).per_layer) equal++;
    }
    check_true("405B shape: corrected Table 2 == ours, every row", equal == kNumTable2Rows,
               describe(equal, kNumTable2Rows));
    // full recomputation keeps the layer's input, 2sbh bytes (Table 2's last row), on each of 8 layers
    const double sbh = 8192.0 * 16384;
    check_true("405B shape, full: 2 sbh per layer", gpt2_activation_bytes(plan.shapes[0], true).per_layer == 2 * sbh / 8,
               describe(gpt2_activation_bytes(plan.shapes[0], true).per_layer, 2 * sbh / 8) + " (sequence parallel: /t)");
}

// ----------------------------------------------------------------------------
// (b) the cost model and the checks, by hand

static void test_by_hand() {
    printf("the cost model by hand\n");
    // the 405B-class shape's parameters, counted in 64 bits: L (12 C^2 + 13 C) + Vp C + T C + 2 C
    const GPT2Config big = llama_class_config(131072);
    const long long C = 16384, L = 128;
    const long long want = L * (12 * C * C + 13 * C) + 50304 * C + 131072 * C + 2 * C;
    check_true("405B-class shape: parameter count exact in 64 bits",
               (long long)ParameterLayout(big).num_parameters == want && want > 405000000000LL,
               describe((double)ParameterLayout(big).num_parameters, (double)want));

    // one rank, 124M: the step is the compute, 6 P + 12 L C T FLOPs per token at peak x efficiency
    GPT2Config small;
    gpt2_config_by_name("124M", &small);
    Layout one;
    one.ranks = 1, one.batch_size = 4, one.seq_len = 1024, one.total_batch_size = 4 * 1024 * 8, one.bf16 = true;
    PlanHardware hw = hardware_of(80 * kGB);
    hw.peak_flops = 1e15, hw.efficiency = 0.25;
    LayoutPlan plan = plan_layout(small, one, hw);
    const double P = 124475904.0, tokens = 32768;  // GPT-2 124M with wte padded to 50304 rows
    const double seconds = (6 * P + 12.0 * 12 * 768 * 1024) * tokens / (1e15 * 0.25);
    check_true("one rank: step == compute == FLOPs / (peak x efficiency)",
               std::fabs(plan.step_seconds - seconds) <= 1e-12 * seconds && plan.compute_seconds == plan.step_seconds,
               describe(plan.step_seconds, seconds));
    check_true("one rank: MFU == efficiency", std::fabs(plan.mfu - 0.25) < 1e-12, describe(plan.mfu, 0.25));
    check_true("one rank: 8 micro-steps", plan.accumulation == 8, describe(plan.accumulation, 8));

    // full recomputation: + one forward pass of the blocks (2 P_block + 4 C T per layer and token)
    one.recompute = Recompute{RecomputePolicy::Full, 1};
    const LayoutPlan full = plan_layout(small, one, hw);
    const double block = 12.0 * 768 * 768 + 13 * 768;
    const double extra = 12 * (2 * block + 4.0 * 768 * 1024) * tokens;
    check_true("full recompute: hardware FLOPs + one forward of the blocks",
               std::fabs(full.hardware_flops - plan.model_flops - extra) <= 1e-9 * extra,
               describe(full.hardware_flops - plan.model_flops, extra));

    // links: tp 8 stays in a node of 8 (NVLink), cp 2 on top of it crosses (InfiniBand)
    Layout l = llama_layout(131072, 16, RecomputePolicy::Full, false);
    plan = plan_layout(llama_class_config(131072), l, hw);
    check_true("tp 8 on 8 GPUs per node: NVLink; cp, pp, dp: InfiniBand",
               !plan.crosses_nodes[PLAN_TP] && plan.crosses_nodes[PLAN_CP] && plan.crosses_nodes[PLAN_PP] &&
                   plan.crosses_nodes[PLAN_DP]);
    check_true("tp axis time == bytes / NVLink", plan.axis_seconds[PLAN_TP] == plan.bytes[PLAN_TP] / 450e9);
    check_true("1f1b bubble formula (p-1)/(m+p-1), p 16, m 16", std::fabs(plan.bubble_formula - 15.0 / 31) < 1e-15,
               describe(plan.bubble_formula, 15.0 / 31));
    {
        // simulated with the stages' costs t_s (the last adds the LM head): the busiest rank works m t_max, so
        // T >= m t_max; slowing every stage to t_max gives 1f1b's (m + p - 1) t_max, and slower actions never
        // shorten the step, so T <= (m + p - 1) t_max. The bubble 1 - m mean(t) / T lies between the two.
        const double t_max = *std::max_element(plan.stage_seconds.begin(), plan.stage_seconds.end());
        double t_mean = 0;
        for (double t : plan.stage_seconds) t_mean += t / plan.stage_seconds.size();
        const double low = 1 - t_mean / t_max, high = 1 - 16 * t_mean / (31 * t_max);
        check_true("1f1b bubble simulated with the stages' costs: between 1 - mean/max and 1 - m mean / ((m+p-1) max)",
                   plan.bubble >= low - 1e-12 && plan.bubble <= high + 1e-12 && plan.bubble >= plan.bubble_formula,
                   std::to_string(low) + " <= " + std::to_string(plan.bubble) + " <= " + std::to_string(high));
    }
    const double stretched = (plan.compute_seconds + plan.axis_seconds[PLAN_TP] + plan.shown_cp_seconds +
                              plan.axis_seconds[PLAN_PP]) / (1 - plan.bubble) + plan.exposed_dp_seconds;
    check_true("step == (compute + tp + cp shown + pp) / (1 - bubble) + exposed dp",
               std::fabs(plan.step_seconds - stretched) <= 1e-12 * stretched, describe(plan.step_seconds, stretched));

    // Llama 3 405B's 126 layers over Meta's 16 stages: balanced by cost, each stage's share printed
    l = llama_layout(8192, 1, RecomputePolicy::Full, true);
    GPT2Config llama_depth = llama_class_config(8192);
    llama_depth.num_layers = 126;
    plan = plan_layout(llama_depth, l, hw);
    int layers_planned = 0;
    for (int n : plan.stage_layers) layers_planned += n;
    check_true("126 layers on pp 16: planned, 16 stages of 126 layers in all",
               plan.error.empty() && plan.stage_layers.size() == 16 && layers_planned == 126, plan.error);
    {
        char* text = nullptr;
        size_t size = 0;
        FILE* out = open_memstream(&text, &size);
        print_layout_plan(llama_depth, plan, hw, out);
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
        const LayoutPlan zbv = plan_layout(llama_depth, v_shape, hw);
        char* text = nullptr;
        size_t size = 0;
        FILE* out = open_memstream(&text, &size);
        if (zbv.error.empty()) print_layout_plan(llama_depth, zbv, hw, out);
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
    plan = plan_layout(llama_class_config(8192), l, hw);
    check_true("sequence parallel with cp 2 at 8K: 4096 positions per cp rank split over tp 8", plan.error.empty(),
               plan.error);
    l.seq_len = 8200, l.total_batch_size = 0;  // 4100 positions per cp rank do not split over tp 8
    plan = plan_layout(llama_class_config(8200), l, hw);
    check_true("sequence parallel with cp 2 at T 8200: refused", plan.error.find("--sequence-parallel with --cp 2") == 0,
               plan.error);
    l = llama_layout(8192, 1, RecomputePolicy::Full, true);
    l.total_batch_size = 3 * 8192 * 128;
    plan = plan_layout(llama_class_config(8192), l, hw);
    check_true("1f1b takes 3 microbatches on pp 16", plan.error.empty(), plan.error);
    l.schedule = PipelineSchedule::Interleaved, l.pp_virtual = 2;
    plan = plan_layout(llama_class_config(8192), l, hw);
    check_true("interleaved with m 3 on pp 16: refused", plan.error.find("multiple of --pp 16") != std::string::npos,
               plan.error);
    l.total_batch_size = 8192 * 128 + 1;
    plan = plan_layout(llama_class_config(8192), l, hw);
    check_true("a total batch not a multiple of B T dp: refused", plan.error.find("not a multiple") != std::string::npos,
               plan.error);
}

// ----------------------------------------------------------------------------
// (c) the search

static void check_search(double gpu_memory_bytes, bool expect_some_too_big) {
    GPT2Config config;
    gpt2_config_by_name("1558M", &config);
    Layout base;
    base.ranks = 64, base.batch_size = 4, base.seq_len = 1024, base.total_batch_size = 524288, base.bf16 = true;
    const PlanHardware hw = hardware_of(gpu_memory_bytes);
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

int main() {
    test_balanced_layers();
    check_llama("8K", 8192, 1, RecomputePolicy::Full, true, 128, true);
    check_llama("8K, no sequence parallelism", 8192, 1, RecomputePolicy::Full, false, 128, true);
    check_llama("128K", 131072, 16, RecomputePolicy::Full, false, 8, true);
    check_llama("128K without recomputation", 131072, 16, RecomputePolicy::None, false, 8, false);
    check_table2_at_405b();
    test_by_hand();
    check_search(80 * kGB, false);
    check_search(16 * kGB, true);
    printf("Korthikanti et al. Table 2 (every row, several shapes) and the ZeRO paper's Figure 1 (7.5B parameters, "
           "64 ranks, stages 0-3 within 5%%): checked by build/test_memory, which scripts/test/run_tests.sh runs "
           "beside this suite\n");
    printf("%d passed, %d failed\n", lab.passed, lab.failed);
    return lab.failed != 0;
}
