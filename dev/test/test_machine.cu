/*
Tests of llmc/planning/hardware.h, the machine profile the planner prices a layout with (no GPU, no MPI):
  (a) the format: the built-in h100 profile parses, and what machine_profile_text writes parses back to the same
      profile, every field equal (a default-constructed PlanHardware is that profile; a file of it reads the same);
  (b) the refusals: every malformed profile is refused with one line naming the source, the line and the problem;
      a bad --machine file ends the program with that line and status 1;
  (c) the alpha-beta costs against values worked by hand on a small profile: ring and tree all-reduce (the tree
      taken where it is cheaper: small messages on many ranks), all-gather, send/receive, on each tier, and a tier
      without rows borrowing the one inside it;
  (d) the tiers: group_tier at the node / leaf / spine boundaries of h100; its spine's bus bandwidth is the
      leaf's / 7 (Llama 3's oversubscription);
  (e) the shape table: matmul_efficiency exact at a row, between two rows' values between them, and along the
      diagonal of growing square shapes in h100 never falling by more than the blending of far rows allows;
      attention_efficiency's interpolation; rank_compute_share;
  (f) train_gpt's flags: --machine reads the profile, and --peak-tflops, --hbm-bandwidth, --pcie-bandwidth and
      --gpus-per-node replace its values only when given.
Prints `N passed, M failed`.
*/
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/io/options.h"
#include "../../llmc/planning/hardware.h"

namespace test_machine {  // one suite of dev/test/host_suites.cu

// The first field in which two profiles differ, or "" when every field is equal.
static std::string profile_difference(const MachineProfile& a, const MachineProfile& b) {
    if (a.name != b.name) return "name";
    if (a.ranks_per_node != b.ranks_per_node) return "ranks_per_node";
    if (a.ranks_per_leaf != b.ranks_per_leaf) return "ranks_per_leaf";
    if (a.cores_per_node != b.cores_per_node) return "cores_per_node";
    if (a.peak_flops != b.peak_flops) return "peak_flops";
    if (a.hbm_bytes_per_second != b.hbm_bytes_per_second) return "hbm_bytes_per_second";
    if (a.pcie_bytes_per_second != b.pcie_bytes_per_second) return "pcie_bytes_per_second";
    if (a.launch_seconds != b.launch_seconds) return "launch_seconds";
    if (a.matmul.size() != b.matmul.size()) return "matmul rows";
    for (size_t i = 0; i < a.matmul.size(); i++)
        if (a.matmul[i].m != b.matmul[i].m || a.matmul[i].n != b.matmul[i].n || a.matmul[i].k != b.matmul[i].k ||
            a.matmul[i].efficiency != b.matmul[i].efficiency)
            return "matmul row " + std::to_string(i);
    if (a.attention.size() != b.attention.size()) return "attention rows";
    for (size_t i = 0; i < a.attention.size(); i++)
        if (a.attention[i].seq_len != b.attention[i].seq_len || a.attention[i].head_size != b.attention[i].head_size ||
            a.attention[i].efficiency != b.attention[i].efficiency)
            return "attention row " + std::to_string(i);
    if (a.memory.size() != b.memory.size()) return "memory rows";
    for (size_t i = 0; i < a.memory.size(); i++)
        if (a.memory[i].kind != b.memory[i].kind || a.memory[i].width != b.memory[i].width ||
            a.memory[i].rows != b.memory[i].rows || a.memory[i].bytes_per_second != b.memory[i].bytes_per_second)
            return "memory row " + std::to_string(i);
    for (int t = 0; t < kTiers; t++)
        for (int op = 0; op < kCollectiveOps; op++)
            for (int al = 0; al < kCollectiveAlgorithms; al++) {
                const CollectiveCost &x = a.collectives[t][op][al], &y = b.collectives[t][op][al];
                if (x.present != y.present || x.alpha_seconds != y.alpha_seconds ||
                    x.bus_bytes_per_second != y.bus_bytes_per_second)
                    return std::string("collective ") + kTierNames[t] + " " + kCollectiveOpNames[op] + " " +
                           kCollectiveAlgorithmNames[al];
            }
    if (a.fits.size() != b.fits.size()) return "fit rows";
    for (size_t i = 0; i < a.fits.size(); i++)
        if (a.fits[i].op != b.fits[i].op || a.fits[i].algorithm != b.fits[i].algorithm || a.fits[i].r2 != b.fits[i].r2 ||
            a.fits[i].points != b.fits[i].points)
            return "fit row " + std::to_string(i);
    return "";
}

// equal to a hand-worked value but for the last bits of double rounding
static bool near(double got, double want) { return std::fabs(got - want) <= 1e-12 * std::fabs(want); }

static std::string parse_error(const std::string& text) {
    MachineProfile profile;
    return machine_profile_parse(text, "test", &profile);
}

static MachineProfile parsed(const std::string& text, const std::string& source = "test") {
    MachineProfile profile;
    const std::string error = machine_profile_parse(text, source, &profile);
    if (!error.empty()) fatal("test profile refused: %s", error.c_str());
    return profile;
}

// (a)
static void test_round_trip() {
    printf("the format: the built-in profile and what machine_profile_text writes parse back the same\n");
    const MachineProfile h100 = machine_profile_read("h100");
    check_true("h100 parses: 11 matmul rows, 6 attention rows, 5 node ops, tree rows on the leaf and spine",
               h100.name == "h100" && h100.matmul.size() == 11 && h100.attention.size() == 6 &&
                   h100.collectives[(int)Tier::Leaf][(int)CollectiveOp::AllReduce][(int)CollectiveAlgorithm::Tree].present &&
                   h100.collectives[(int)Tier::Spine][(int)CollectiveOp::AllReduce][(int)CollectiveAlgorithm::Tree].present);
    const std::string text = machine_profile_text(h100);
    MachineProfile again;
    const std::string error = machine_profile_parse(text, "h100's text", &again);
    const std::string difference = error.empty() ? profile_difference(h100, again) : error;
    check_true("h100: parse(text(profile)) has every field equal", difference.empty(), difference);
    check_true("h100: text(parse(text)) is the same text", error.empty() && machine_profile_text(again) == text);
    const PlanHardware fresh;
    check_true("a default-constructed PlanHardware is the built-in h100", profile_difference(fresh, h100).empty(),
               profile_difference(fresh, h100));

    // the optional parts, and numbers that need all 17 digits
    MachineProfile other = h100;
    other.name = "other", other.cores_per_node = 2, other.launch_seconds = 4.25e-6, other.peak_flops = 1.0 / 3.0 * 1e12;
    other.attention.clear();
    other.collectives[(int)Tier::Spine][(int)CollectiveOp::SendRecv][0] = {};
    other.fits.push_back({CollectiveOp::AllReduce, CollectiveAlgorithm::Ring, 0.998, 24});
    other.fits.push_back({CollectiveOp::SendRecv, CollectiveAlgorithm::Ring, -0.25, 7});
    other.memory.push_back({MemoryBoundKind::LayerNorm, 128, 1024, 1.25e8});
    other.memory.push_back({MemoryBoundKind::Route, 256, 64, 3e8 / 7});
    MachineProfile other_again;
    const std::string other_error = machine_profile_parse(machine_profile_text(other), "other", &other_again);
    const std::string other_difference = other_error.empty() ? profile_difference(other, other_again) : other_error;
    check_true("cores_per_node, launch_seconds, fits, memory rows, no attention rows, a 17-digit number: every field back",
               other_difference.empty(), other_difference);

    const std::string path = "/tmp/llmc_test_machine_" + std::to_string(getpid()) + ".txt";
    write_text_file(path, machine_profile_text(other));
    const PlanHardware from_file = machine_profile_read(path);
    remove(path.c_str());
    check_true("machine_profile_read(a file) reads it, the run's fields left as they were",
               profile_difference(from_file, other).empty() && from_file.gpu_memory_bytes == fresh.gpu_memory_bytes,
               profile_difference(from_file, other));
}

// (b) A small good profile, one line per entry (the line numbers the cases name).
static const std::vector<std::string> kGood = {
    "llmc machine profile 1",                          // 1
    "name test  # a comment after an entry",           // 2
    "peak_flops 1e12",                                 // 3
    "hbm_bytes_per_second 1e11",                       // 4
    "pcie_bytes_per_second 1e10",                      // 5
    "ranks_per_node 4",                                // 6
    "ranks_per_leaf 16",                               // 7
    "matmul 64 64 64 0.5",                             // 8
    "collective node all_reduce ring 1e-6 1e10",       // 9
    "collective node all_gather ring 1e-6 1e10",       // 10
    "collective node reduce_scatter ring 1e-6 1e10",   // 11
    "collective node all_to_all ring 1e-6 1e10",       // 12
    "collective node send_recv ring 1e-6 1e10",        // 13
};
static std::string joined(const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    return text;
}

struct Refusal {
    const char* name;
    std::vector<std::string> lines;
    int line;             // the line the error must name
    const char* problem;  // words the error must hold
};
static std::vector<std::string> replaced(int line, const std::string& with) {
    std::vector<std::string> lines = kGood;
    lines[line - 1] = with;
    return lines;
}
static std::vector<std::string> appended(std::vector<std::string> more) {
    std::vector<std::string> lines = kGood;
    lines.insert(lines.end(), more.begin(), more.end());
    return lines;
}
static std::vector<std::string> without(int line) {
    std::vector<std::string> lines = kGood;
    lines.erase(lines.begin() + (line - 1));
    return lines;
}

static void test_refusals() {
    printf("the refusals: one line naming the source, the line and the problem\n");
    MachineProfile good;
    check_true("the small profile the cases start from is good", machine_profile_parse(joined(kGood), "good", &good).empty());
    const Refusal cases[] = {
        {"another first line", replaced(1, "llmc machine profile 2"), 1, "first line must be 'llmc machine profile 1'"},
        {"an empty file", {}, 1, "first line must be"},
        {"an unknown key", appended({"flops 3"}), 14, "unknown key 'flops'"},
        {"a key given twice", appended({"peak_flops 2e12"}), 14, "peak_flops given twice (first on line 3)"},
        {"a name given twice", appended({"name again"}), 14, "name given twice (first on line 2)"},
        {"a non-numeric number", replaced(3, "peak_flops 1e12x"), 3, "peak_flops: '1e12x' is not a number"},
        {"a zero where a positive number goes", replaced(4, "hbm_bytes_per_second 0"), 4, "is not positive"},
        {"a negative number", replaced(9, "collective node all_reduce ring -1e-6 1e10"), 9, "alpha: -1e-6 is negative"},
        {"a non-positive bus bandwidth", replaced(10, "collective node all_gather ring 1e-6 0"), 10, "is not positive"},
        {"extra words", replaced(5, "pcie_bytes_per_second 1e10 fast"), 5, "extra words after pcie_bytes_per_second"},
        {"a missing value", replaced(6, "ranks_per_node"), 6, "ranks_per_node needs 1 value"},
        {"a fraction where a whole number goes", replaced(6, "ranks_per_node 4.5"), 6, "is not a whole number"},
        {"a missing required key", without(5), 12, "ends without pcie_bytes_per_second (required)"},
        {"no name", without(2), 12, "ends without name"},
        {"no matmul row", without(8), 12, "without a matmul row"},
        {"a node-tier op missing", without(12), 12, "node-tier collective row for all_to_all"},
        {"a tree row for all_gather", appended({"collective leaf all_gather tree 1e-6 1e10"}), 14,
         "a tree row for all_gather (tree is all_reduce's only)"},
        {"an unknown tier", appended({"collective rack all_reduce ring 1e-6 1e10"}), 14, "'rack' is not a tier"},
        {"a collective row given twice", appended({"collective node send_recv ring 2e-6 1e10"}), 14,
         "collective node send_recv ring given twice (first on line 13)"},
        {"ranks_per_leaf below ranks_per_node", replaced(7, "ranks_per_leaf 2"), 7, "ranks_per_leaf 2 is below ranks_per_node 4"},
        {"attention lengths not increasing within a head size", appended({"attention 1024 64 0.5", "attention 512 64 0.6"}),
         15, "attention T 512 does not increase on the rows before's of head size 64"},
        {"an attention row without its head size", appended({"attention 1024 0.5"}), 14, "attention needs 3 values"},
        {"a matmul efficiency above 1", replaced(8, "matmul 64 64 64 1.5"), 8, "1.5 is not a fraction of peak in (0, 1]"},
        {"a matmul shape given twice", appended({"matmul 64 64 64 0.4"}), 14, "matmul 64 64 64 given twice (first on line 8)"},
        {"a fit's R2 above 1", appended({"fit all_reduce ring 1.5 10"}), 14, "R2 is at most 1"},
    };
    for (const Refusal& c : cases) {
        MachineProfile profile;
        const std::string error = machine_profile_parse(joined(c.lines), "bad.txt", &profile);
        const std::string where = "bad.txt:" + std::to_string(c.line) + ": ";
        const bool ok = error.rfind(where, 0) == 0 && error.find(c.problem) != std::string::npos &&
                        error.find('\n') == std::string::npos;
        check_true(std::string("refused: ") + c.name, ok, ok ? "" : "got '" + error + "'");
    }

    // through train_gpt's flags: one line and status 1
    const std::string path = "/tmp/llmc_test_machine_bad_" + std::to_string(getpid()) + ".txt";
    write_text_file(path, joined(replaced(3, "peak_flops fast")));
    auto [status, output] = run_in_child([&] { machine_profile_read(path); });
    remove(path.c_str());
    const std::string expected = "error: " + path + ":3: peak_flops: 'fast' is not a number\n";
    check_true("a bad profile file ends the program: status 1, the one line", status == 1 && output == expected,
               status == 1 && output == expected ? "" : output);
    auto [missing_status, missing_output] = run_in_child([&] { machine_profile_read("/nonexistent/profile.txt"); });
    check_true("a missing profile file: status 1, one line naming it",
               missing_status == 1 && missing_output ==
                   "error: machine profile /nonexistent/profile.txt: not a built-in profile (h100) and no such file\n",
               missing_status == 1 ? "" : missing_output);
}

// (c) A profile whose tiers differ, to tell which one a cost came from.
static const char* kTiered = R"(llmc machine profile 1
name tiered
peak_flops 1e12
hbm_bytes_per_second 1e11
pcie_bytes_per_second 1e10
ranks_per_node 8
ranks_per_leaf 64
cores_per_node 2
matmul 64 64 64 0.5
collective node all_reduce ring 1e-6 100e9
collective node all_gather ring 2e-6 80e9
collective node reduce_scatter ring 2e-6 80e9
collective node all_to_all ring 3e-6 60e9
collective node send_recv ring 4e-6 50e9
collective leaf all_reduce ring 5e-6 10e9
collective leaf all_reduce tree 8e-6 5e9
collective leaf send_recv ring 6e-6 12e9
collective spine all_reduce ring 7e-6 1e9
)";

static void test_alpha_beta() {
    printf("the alpha-beta costs against hand-worked values\n");
    const MachineProfile hw = parsed(kTiered);
    struct Case {
        const char* name;
        double got, want;
    };
    const Case cases[] = {
        // ring all-reduce: 2 (g-1) alpha + 2 (g-1)/g n / beta
        {"node ring all-reduce, 8 ranks, 1 GB: 14 alpha + 2 7/8 n/beta",
         collective_seconds(hw, CollectiveOp::AllReduce, 8, 8, 1e9), 14 * 1e-6 + 2.0 * 7 / 8 * 1e9 / 100e9},
        {"node ring all-reduce, 4 ranks within a span of 8, 3 calls",
         collective_seconds(hw, CollectiveOp::AllReduce, 4, 8, 1e6, 3), 3 * (6 * 1e-6 + 2.0 * 3 / 4 * 1e6 / 100e9)},
        // leaf, 64 ranks: the tree (2 log2 64 = 12 steps of 8 us) beats the ring (126 steps of 5 us) for 1 KB ...
        {"leaf all-reduce, 64 ranks, 1 KB: the tree, 12 alpha + 2 63/64 n/beta",
         collective_seconds(hw, CollectiveOp::AllReduce, 64, 64, 1e3), 12 * 8e-6 + 2.0 * 63 / 64 * 1e3 / 5e9},
        // ... and the ring, with twice the tree's bandwidth, wins for 1 GB
        {"leaf all-reduce, 64 ranks, 1 GB: the ring, 126 alpha + 2 63/64 n/beta",
         collective_seconds(hw, CollectiveOp::AllReduce, 64, 64, 1e9), 126 * 5e-6 + 2.0 * 63 / 64 * 1e9 / 10e9},
        {"spine ring all-reduce, 16 ranks spanning 128",
         collective_seconds(hw, CollectiveOp::AllReduce, 16, 128, 1e8), 30 * 7e-6 + 2.0 * 15 / 16 * 1e8 / 1e9},
        // all-gather: (g-1) alpha + (g-1)/g n / beta
        {"node all-gather, 4 ranks: 3 alpha + 3/4 n/beta", collective_seconds(hw, CollectiveOp::AllGather, 4, 4, 1e8),
         3 * 2e-6 + 3.0 / 4 * 1e8 / 80e9},
        {"node all-to-all, 8 ranks: 7 alpha + 7/8 n/beta", collective_seconds(hw, CollectiveOp::AllToAll, 8, 8, 1e8),
         7 * 3e-6 + 7.0 / 8 * 1e8 / 60e9},
        // send/receive: alpha + n / beta
        {"node send/recv: alpha + n/beta", collective_seconds(hw, CollectiveOp::SendRecv, 2, 2, 1e7), 4e-6 + 1e7 / 50e9},
        {"leaf send/recv (span 9): alpha + n/beta", collective_seconds(hw, CollectiveOp::SendRecv, 2, 9, 1e7),
         6e-6 + 1e7 / 12e9},
        // a tier without rows borrows the next one inside it
        {"spine send/recv, no spine row: the leaf's", collective_seconds(hw, CollectiveOp::SendRecv, 2, 100, 1e7),
         6e-6 + 1e7 / 12e9},
        {"leaf all-gather, no leaf or spine row: the node's",
         collective_seconds(hw, CollectiveOp::AllGather, 16, 200, 1e8), 15 * 2e-6 + 15.0 / 16 * 1e8 / 80e9},
        {"one rank: nothing to send", collective_seconds(hw, CollectiveOp::AllReduce, 1, 1, 1e9), 0},
    };
    for (const Case& c : cases) check_true(c.name, c.want == 0 ? c.got == 0 : near(c.got, c.want), describe(c.got, c.want));
}

// (d) and (e)
static void test_tiers_and_tables() {
    printf("the tiers and the shape tables\n");
    const MachineProfile h100 = machine_profile_read("h100");
    check_true("h100 group_tier: span 8 node, 9 leaf, 3072 leaf, 3073 spine",
               group_tier(h100, 1) == Tier::Node && group_tier(h100, 8) == Tier::Node &&
                   group_tier(h100, 9) == Tier::Leaf && group_tier(h100, 3072) == Tier::Leaf &&
                   group_tier(h100, 3073) == Tier::Spine);
    std::string not_seventh;
    int compared = 0;
    for (int op = 0; op < kCollectiveOps; op++)
        for (int a = 0; a < kCollectiveAlgorithms; a++) {
            const CollectiveCost &leaf = h100.collectives[(int)Tier::Leaf][op][a],
                                 &spine = h100.collectives[(int)Tier::Spine][op][a];
            if (!leaf.present) continue;
            compared++;
            if (!spine.present || !near(spine.bus_bytes_per_second * 7, leaf.bus_bytes_per_second))
                not_seventh += std::string(" ") + kCollectiveOpNames[op] + "/" + kCollectiveAlgorithmNames[a];
        }
    check_true("h100: every leaf row's spine bus bandwidth is the leaf's / 7 (Llama 3's 1:7)",
               compared == 6 && not_seventh.empty(), not_seventh);

    const double at_row = matmul_efficiency(h100, 4096, 4096, 4096);
    check_true("matmul_efficiency at a row of the table: its value", at_row == 0.777, describe(at_row, 0.777));
    const double measured = matmul_efficiency(h100, 6144, 17920, 2816);
    check_true("matmul_efficiency at MAMF's measured shape: 0.801", measured == 0.801, describe(measured, 0.801));
    const double between = matmul_efficiency(h100, 1448, 1448, 1448);  // sqrt(1024 2048)
    check_true("matmul_efficiency between the 1024^3 and 2048^3 rows: between their 0.388 and 0.777",
               between > 0.388 && between < 0.777, "got " + std::to_string(between));
    const double fc_405b = matmul_efficiency(h100, 8192, 13312, 16384);
    check_true("matmul_efficiency at a measured 405B shape (fc at tp 8): 0.734", fc_405b == 0.734, describe(fc_405b, 0.734));
    // the rows are measurements and estimates side by side (the estimated 4096^3 0.777 above the measured 8192^3
    // 0.698), so the diagonal need not rise; the blend must stay within the rows' values all along it
    double lowest = 1, highest = 0;
    for (double s = 512; s <= 8192 * 1.0001; s *= std::pow(2.0, 0.25)) {
        const double e = matmul_efficiency(h100, s, s, s);
        lowest = std::min(lowest, e), highest = std::max(highest, e);
    }
    char range[96];
    snprintf(range, sizeof(range), "from %.4f to %.4f", lowest, highest);
    check_true("h100 matmul_efficiency along the diagonal 512^3 .. 8192^3: within the rows' 0.056 .. 0.833",
               lowest >= 0.056 && highest <= 0.833, range);
    check_true("h100: the small shape far below the large ones (0.056 at 512^3, 0.698 at 8192^3)",
               matmul_efficiency(h100, 512, 512, 512) < 0.1 && matmul_efficiency(h100, 8192, 8192, 8192) > 0.65);

    const double mid = attention_efficiency(h100, std::sqrt(1024.0 * 2048.0), 128);
    check_true("attention_efficiency halfway (in log2) between 1024 and 2048: the mean of 0.551 and 0.658",
               near(mid, 0.6045), describe(mid, 0.6045));
    check_true("attention_efficiency at a row, below the first and above the last: the rows' values; h100's head size "
               "128 for any other",
               attention_efficiency(h100, 4096, 128) == 0.717 && attention_efficiency(h100, 64, 128) == 0.401 &&
                   attention_efficiency(h100, 1 << 20, 128) == 0.748 && attention_efficiency(h100, 4096, 64) == 0.717);
    // two head sizes: at T 64, 0.1 at HS 32 and 0.3 at HS 128 (2 apart in log2); HS 64 is halfway: 0.2; T between
    // rows of one head size is linear in log2 there first (T 128 of HS 32: halfway between 0.1 and 0.2)
    const MachineProfile sizes = parsed(std::string(kTiered) + "attention 64 32 0.1\nattention 256 32 0.2\n"
                                                               "attention 64 128 0.3\n");
    check_true("attention_efficiency across head sizes: linear in log2 of the head size, each size's rows in T first",
               near(attention_efficiency(sizes, 64, 64), 0.2) && near(attention_efficiency(sizes, 128, 32), 0.15) &&
                   near(attention_efficiency(sizes, 128, 64), (0.15 + 0.3) / 2) &&
                   attention_efficiency(sizes, 64, 16) == 0.1 && attention_efficiency(sizes, 64, 256) == 0.3,
               describe(attention_efficiency(sizes, 64, 64), 0.2));

    MachineProfile rows = parsed(kTiered);
    check_true("memory_bytes_per_second without memory rows: hbm_bytes_per_second for every kind, width and rows",
               rows.memory.empty() && memory_bytes_per_second(rows, MemoryBoundKind::LayerNorm, 64, 128) == rows.hbm_bytes_per_second &&
                   memory_bytes_per_second(rows, MemoryBoundKind::Route, 4096, 8) == rows.hbm_bytes_per_second);
    rows = parsed(std::string(kTiered) + "memory layernorm 128 1024 1e8\nmemory layernorm 512 1024 3e8\nmemory pointwise 128 1024 2e9\n");
    const double row_at = memory_bytes_per_second(rows, MemoryBoundKind::LayerNorm, 128, 1024),
                 pointwise_at = memory_bytes_per_second(rows, MemoryBoundKind::Pointwise, 128, 1024),
                 route_none = memory_bytes_per_second(rows, MemoryBoundKind::Route, 128, 1024);
    check_true("memory rows: a row's rate at its (kind, width, rows); a kind without rows: hbm_bytes_per_second",
               row_at == 1e8 && pointwise_at == 2e9 && route_none == rows.hbm_bytes_per_second);
    // two rows 2 apart in log2: the point halfway is as near to each, so the blend is their mean; a point beyond the
    // wider row (4096: 3 and 5 from them) blends 1/3^4 : 1/5^4, mostly the nearer row's
    const double halfway = memory_bytes_per_second(rows, MemoryBoundKind::LayerNorm, 256, 1024),
                 beyond = memory_bytes_per_second(rows, MemoryBoundKind::LayerNorm, 4096, 1024),
                 beyond_expected = (3e8 / 81 + 1e8 / 625) / (1.0 / 81 + 1.0 / 625);
    check_true("memory rows: blended by nearness in log2 of (width, rows): halfway the mean, beyond mostly the nearer",
               near(halfway, 2e8) && near(beyond, beyond_expected),
               describe(halfway, 2e8) + "; " + describe(beyond, beyond_expected));
    const std::string twice = parse_error(std::string(kTiered) + "memory rmsnorm 128 1024 1e8\nmemory rmsnorm 128 1024 3e8\n"),
                      unknown = parse_error(std::string(kTiered) + "memory norm 128 1024 1e8\n"),
                      old_form = parse_error(std::string(kTiered) + "memory 128 1e8\n");
    check_true("memory rows: a (kind, width, rows) given twice is refused with its line",
               twice.find("memory rmsnorm 128 1024 given twice (first on line") != std::string::npos, twice);
    check_true("memory rows: an unknown kind is refused, naming the kinds",
               unknown.find("'norm' is not a kind (pointwise, layernorm, rmsnorm, route)") != std::string::npos, unknown);
    check_true("memory rows: a row without its kind and rows is refused (4 values needed)",
               old_form.find("memory needs 4 values") != std::string::npos, old_form);

    const MachineProfile cpu = parsed(kTiered);  // cores_per_node 2
    check_true("rank_compute_share with 2 cores: 1 rank 1, 2 ranks 1, 4 ranks 0.5; h100 (a device per rank): 1",
               rank_compute_share(cpu, 1) == 1 && rank_compute_share(cpu, 2) == 1 && rank_compute_share(cpu, 4) == 0.5 &&
                   rank_compute_share(h100, 8) == 1);
}

// (f)
static PlanHardware hardware_of_flags(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "train_gpt");
    std::vector<char*> argv;
    for (std::string& a : arguments) argv.push_back(a.data());
    Flags flags("train_gpt", "");
    return parse_options(flags, (int)argv.size(), argv.data()).hardware;
}

static void test_flags() {
    printf("train_gpt's flags: --machine, and the overrides only when given\n");
    const std::string path = "/tmp/llmc_test_machine_flags_" + std::to_string(getpid()) + ".txt";
    write_text_file(path, kTiered);  // peak 1e12, hbm 1e11, pcie 1e10, 8 ranks per node, 64 per leaf
    const PlanHardware plain = hardware_of_flags({"--machine", path});
    check_true("--machine FILE: the file's profile, no flag replacing its values",
               profile_difference(plain, parsed(kTiered)).empty(),
               profile_difference(plain, parsed(kTiered)));
    const PlanHardware given = hardware_of_flags({"--machine", path, "--peak-tflops", "500", "--hbm-bandwidth", "2000",
                                                  "--pcie-bandwidth", "25", "--gpus-per-node", "16"});
    check_true("--peak-tflops, --hbm-bandwidth, --pcie-bandwidth, --gpus-per-node given: they replace the profile's",
               given.peak_flops == 500e12 && given.hbm_bytes_per_second == 2000e9 &&
                   given.pcie_bytes_per_second == 25e9 && given.ranks_per_node == 16 &&
                   given.ranks_per_leaf == 64 && given.matmul.size() == 1);
    auto [status, output] = run_in_child([&] { hardware_of_flags({"--machine", path, "--gpus-per-node", "128"}); });
    check_true("--gpus-per-node above the profile's ranks_per_leaf: refused with one line",
               status == 1 && output == "error: --gpus-per-node 128: more than the --machine profile's ranks_per_leaf 64\n",
               status == 1 ? "" : output);
    remove(path.c_str());
    const PlanHardware standard = hardware_of_flags({"--gpu-memory", "40"});
    check_true("no --machine: the built-in h100, --gpu-memory the run's own",
               profile_difference(standard, *machine_profile_builtin("h100")).empty() &&
                   standard.gpu_memory_bytes == 40.0 * (1 << 30));
}

int run(int, char**) {
    test_round_trip();
    test_refusals();
    test_alpha_beta();
    test_tiers_and_tables();
    test_flags();
    return lab_closing_line();
}
}  // namespace test_machine
