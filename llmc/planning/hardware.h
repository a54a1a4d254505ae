/*
The machine the planner assumes (llmc/planning/planner.h): a machine profile. Kept apart from the planner so that
reading the flags needs neither the model nor a kernel.

A profile is what one rank's device computes and moves, and what its links cost:
    peak FLOP/s and the fraction of it a matmul of shape (M, N, K) reaches, from a table of measured shapes;
    the attention kernel's fraction of peak by sequence length and head size; the device memory's bandwidth (AdamW), and the
    rate each kind of memory-bound kernel reaches by width and rows (activations, each norm, a mixture's routing);
    the host link's (offload);
    the three tiers of the network a group of ranks may span, and on each tier each collective's cost;
    how many ranks share a node's processors (the CPU build's ranks take turns on its cores; a GPU is one rank's).

    PlanHardware hw = machine_profile_read("h100");         // the built-in H100 cluster, or a file's path
    double s = collective_seconds(hw, CollectiveOp::AllReduce, ranks, span, bytes);
    double e = matmul_efficiency(hw, M, N, K);

The tiers. A group of ranks lies within `span` consecutive world ranks (llmc/parallel/mesh.h's order, tp fastest):
    node   span <= ranks_per_node: the node's own links (NVLink 4 through NVSwitches on an H100 server);
    leaf   span <= ranks_per_leaf: the ranks the first switch layers join at full bisection bandwidth (Llama 3's
           pod of 3,072 GPUs), each rank through its own NIC;
    spine  beyond: through the aggregation layer, oversubscribed (1:7 in Llama 3's network), so each rank gets a
           fraction of its NIC.
A tier without rows for an op borrows the next tier inside it (a leaf without rows: the node's).

The alpha-beta cost. NCCL's performance notes model a collective as "overhead + size / bw"; per algorithm:
    seconds = steps(op, algorithm, g) x alpha + factor(op, g) x n / beta
    g      the group's ranks;
    n      nccl-tests' size: all-reduce the buffer, all-gather the gathered output, reduce-scatter its input,
           all-to-all one rank's send buffer, send/receive the message;
    beta   nccl-tests' bus bandwidth (busbw), which nccl-tests reports as algbw x factor so that it compares with
           a link's speed whatever g is;
    factor nccl-tests' bus factor, the bytes one rank sends per byte of n: 2 (g-1)/g all-reduce (a reduce-scatter,
           then an all-gather), (g-1)/g all-gather, reduce-scatter, all-to-all, 1 send/receive;
    steps  the algorithm's latency steps, each costing alpha: a ring all-reduce 2 (g-1) (the data goes round twice),
           a tree all-reduce 2 ceil(log2 g) (up a tree and down; NCCL's double binary tree keeps the ring's bus
           bandwidth), the others g-1 (one ring pass), send/receive 1.
So a large message costs its bytes over beta whatever the algorithm, and a small one its steps times alpha: the
ring's steps grow with g, the tree's with log g, which is why NCCL switches to trees for small messages across many
ranks. collective_seconds takes the cheapest algorithm the profile gives, as NCCL's tuner does.

The file format (what --machine FILE reads, machine_profile_text writes and scripts/bench/calibrate.sh produces):
    llmc machine profile 1                 the first line, exactly
    # a comment                            from # to the end of a line; blank lines are skipped
    name NAME                              one word
    peak_flops 989.4e12                    per rank; numbers as C's strtod reads them
    hbm_bytes_per_second 3.35e12           the device's own memory
    pcie_bytes_per_second 50e9             one direction, device <-> pinned host memory
    launch_seconds 4e-6                    optional (0): the fixed cost of one kernel launch
    ranks_per_node 8                       whole numbers
    ranks_per_leaf 3072                    at least ranks_per_node
    cores_per_node 0                       optional (0): 0, each rank its own device; else the processors that a
                                           node's ranks share (the CPU build: the host's)
    matmul M N K EFFICIENCY                one or more rows; 0 < efficiency <= 1, of peak_flops
    attention T HEAD_SIZE EFFICIENCY       zero or more rows; among the rows of one HEAD_SIZE, T increasing
    memory KIND WIDTH ROWS BYTES_PER_SECOND
                                           zero or more rows, each (KIND, WIDTH, ROWS) once: the rate a block's
                                           memory-bound kernels of one kind reach on a microbatch of ROWS rows of
                                           WIDTH channels, their bytes read and written over their time. KIND:
                                             pointwise  value by value: the activation (GELU, SwiGLU), residual
                                                        adds, RoPE, the embedding, the cp ring's merge
                                             layernorm  GPT-2's norms forward and backward (and the fused
                                                        residual + norm), reductions along each row; also the
                                                        classifier's softmax (its rows are the vocabulary's:
                                                        WIDTH Vp / tp), whose max and sum are a row's two
                                                        reductions as a LayerNorm's mean and variance are
                                             rmsnorm    Llama's norms, one reduction a row
                                             route      a mixture's routing: the router's softmax and top-K, the
                                                        dispatch (count, place, permute), the combine, and their
                                                        backward passes
                                           A kind without rows: hbm_bytes_per_second (a GPU's kernels stream at
                                           its bandwidth; the CPU build's emulated warps pay per row and per
                                           barrier, so there each kind has its own rate, which grows with WIDTH)
    collective TIER OP ALGORITHM ALPHA BETA
                                           TIER node | leaf | spine; OP all_reduce | all_gather | reduce_scatter |
                                           all_to_all | send_recv; ALGORITHM ring | tree (tree: all_reduce only);
                                           ALPHA seconds per step (0 allowed), BETA bus bytes per second
    fit OP ALGORITHM R2 POINTS             optional, informational: calibrate.sh's fit of alpha + n/beta per
                                           collective, R2 at most 1, POINTS the measurements behind it
Required: the first line, name, peak_flops, hbm_bytes_per_second, pcie_bytes_per_second, ranks_per_node,
ranks_per_leaf, a matmul row, and on the node tier every op with at least one algorithm. Every number is positive
but ALPHA, launch_seconds and cores_per_node (0 allowed) and R2 (any, up to 1). Anything else is refused with one
line naming the file, the line and the problem: an unknown key, a key (or a matmul shape, attention length,
collective row, fit, memory row) given twice, a missing, non-numeric or out-of-range number, extra words, a tree
row for an op other than all_reduce, ranks_per_leaf < ranks_per_node, T not increasing within a head size, an unknown
memory KIND.

The built-in profile "h100", a cluster of H100 SXM GPUs in Llama 3's network, is in this format, each number cited:
llmc/planning/h100_profile.h. A default-constructed PlanHardware is that profile (its constructor reads it).
*/
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "../utils.h"
#include "h100_profile.h"

// what the plan does not count but a GPU needs: the CUDA context (~0.5 GiB), cuBLASLt's 32 MiB workspace,
// NCCL's buffers (a few hundred MiB with several communicators); --memory-reserve sets it
constexpr double kPlanReserveBytes = 2.0 * (1 << 30);

// Where a group's ranks lie: all in one node; in one leaf; or across the spine (the top comment).
enum class Tier { Node = 0, Leaf, Spine };
constexpr int kTiers = 3;
enum class CollectiveOp { AllReduce = 0, AllGather, ReduceScatter, AllToAll, SendRecv };
constexpr int kCollectiveOps = 5;
enum class CollectiveAlgorithm { Ring = 0, Tree };
constexpr int kCollectiveAlgorithms = 2;
// the names the file format uses, in the enums' order
constexpr const char* kTierNames[kTiers] = {"node", "leaf", "spine"};
constexpr const char* kCollectiveOpNames[kCollectiveOps] = {"all_reduce", "all_gather", "reduce_scatter",
                                                            "all_to_all", "send_recv"};
constexpr const char* kCollectiveAlgorithmNames[kCollectiveAlgorithms] = {"ring", "tree"};

struct CollectiveCost {
    bool present = false;              // the profile gives this (tier, op, algorithm)
    double alpha_seconds = 0;          // per step of the algorithm
    double bus_bytes_per_second = 0;   // nccl-tests' bus bandwidth
};

struct MatmulShapeEfficiency {
    double m = 0, n = 0, k = 0;  // C (M x N) = A (M x K) B (K x N)
    double efficiency = 0;       // of peak_flops
};
struct AttentionEfficiency {
    double seq_len = 0;    // keys per query (T / cp for one ring step: the kernel's T)
    double head_size = 0;  // HS of its heads
    double efficiency = 0;
};
// The kinds of memory-bound kernel (the format's memory KIND), in the names' order.
enum class MemoryBoundKind { Pointwise = 0, LayerNorm, RmsNorm, Route };
constexpr int kMemoryKinds = 4;
constexpr const char* kMemoryKindNames[kMemoryKinds] = {"pointwise", "layernorm", "rmsnorm", "route"};
struct MemoryRate {
    MemoryBoundKind kind = MemoryBoundKind::Pointwise;
    double width = 0;             // the rows' values (a block's channels; the classifier's vocabulary)
    double rows = 0;              // the microbatch's rows (B T / cp, a tp rank's under SP)
    double bytes_per_second = 0;
};
// calibrate.sh's fit of alpha + n / beta to one collective's measurements (informational: no cost reads it)
struct CollectiveFit {
    CollectiveOp op = CollectiveOp::AllReduce;
    CollectiveAlgorithm algorithm = CollectiveAlgorithm::Ring;
    double r2 = 0;
    int points = 0;
};

// What a profile file holds (the format above); empty until parsed.
struct MachineProfile {
    std::string name;
    int ranks_per_node = 0;                      // joined by the node tier (NVLink)
    int ranks_per_leaf = 0;                      // joined by the leaf tier at full bandwidth
    int cores_per_node = 0;                      // processors a node's ranks share; 0: each rank has its own device
    double peak_flops = 0;                       // per rank
    double hbm_bytes_per_second = 0;             // the device's own memory
    double pcie_bytes_per_second = 0;            // per direction, device <-> pinned host memory
    double launch_seconds = 0;                   // fixed cost per kernel launch
    std::vector<MatmulShapeEfficiency> matmul;   // measured shapes, at least one
    std::vector<AttentionEfficiency> attention;  // measured (T, HS), T increasing within a head size
    std::vector<MemoryRate> memory;              // measured (kind, width, rows); a kind without: hbm
    CollectiveCost collectives[kTiers][kCollectiveOps][kCollectiveAlgorithms];
    std::vector<CollectiveFit> fits;
};

inline std::string machine_profile_parse(const std::string& text, const std::string& source, MachineProfile* profile);

// The built-in profiles by name ("h100"); nullptr for any other name.
inline const MachineProfile* machine_profile_builtin(const std::string& name) {
    if (name != "h100") return nullptr;
    static const MachineProfile h100 = [] {
        MachineProfile profile;
        const std::string error = machine_profile_parse(kH100Profile, "the built-in profile h100", &profile);
        if (!error.empty()) fatal("%s", error.c_str());
        return profile;
    }();
    return &h100;
}

// The machine the planner assumes: a profile and the run's own choices. Default-constructed: the built-in h100.
struct PlanHardware : MachineProfile {
    PlanHardware() : MachineProfile(*machine_profile_builtin("h100")) {}

    // the run's choices (flags), not the profile's
    double gpu_memory_bytes = 80.0 * (1 << 30);
    double reserve_bytes = kPlanReserveBytes;    // kept free of the plan: "fits" is total + this <= gpu_memory_bytes
};

// A value at `point` from measured ones at `points` (each with its value), weighted by their nearness in log2
// space (1 / d^4; an exact match alone): a point between measured ones gets a blend of them, one outside them the
// nearest ones' values. The matmul table (M, N, K) and the memory rows (width, rows) are read this way.
template <size_t D>
struct Log2Point {
    double at[D];
    double value;
};
template <size_t D>
inline double log2_nearness_blend(const std::vector<Log2Point<D>>& points, const double (&point)[D]) {
    double weights = 0, sum = 0;
    for (const Log2Point<D>& p : points) {
        double d2 = 0;
        for (size_t i = 0; i < D; i++) d2 += std::log2(point[i] / p.at[i]) * std::log2(point[i] / p.at[i]);
        if (d2 < 1e-12) return p.value;
        const double w = 1.0 / (d2 * d2);
        weights += w, sum += w * p.value;
    }
    return sum / weights;
}

// A value at x from points (x_i, y_i), x increasing: linear in log2 x between two points, the end points' values
// outside them.
struct Log2Segment {
    double x, y;
};
inline double log2_piecewise_linear(const std::vector<Log2Segment>& points, double x) {
    if (x <= points.front().x) return points.front().y;
    for (size_t i = 1; i < points.size(); i++)
        if (x <= points[i].x) {
            const double t = std::log2(x / points[i - 1].x) / std::log2(points[i].x / points[i - 1].x);
            return points[i - 1].y + t * (points[i].y - points[i - 1].y);
        }
    return points.back().y;
}

// The fraction of peak_flops a matmul of this shape reaches, blended from the table's measured shapes.
inline double matmul_efficiency(const MachineProfile& hw, double m, double n, double k) {
    if (hw.matmul.empty()) fatal("machine profile %s has no matmul rows", hw.name.c_str());  // the parser's rule
    std::vector<Log2Point<3>> points;
    for (const MatmulShapeEfficiency& row : hw.matmul) points.push_back({{row.m, row.n, row.k}, row.efficiency});
    return log2_nearness_blend(points, {m, n, k});
}
/*
The attention rows' efficiency is a fraction of the causal kernel's work counted one way everywhere (the planner's
cost model, dev/calibrate.cu, the built-in profile's rows): a query meets the keys at or before it, T^2/2 scores
per sequence and head, and each score costs products of two head-size vectors, 2 forward (q.k, then the weighted
sum of V) and 7 backward (llmc/kernels/attention.cuh recomputes the scores and probabilities, then dV, dP, dQ and
dK), 2 FLOPs per element of a product.
*/
constexpr double kAttentionForwardProducts = 2, kAttentionBackwardProducts = 7;
inline double attention_flops(double products, double scores, double head_size) {
    return products * 2 * head_size * scores;
}
// The attention kernel's fraction of peak_flops at this many keys per query and head size: among the rows of one
// head size, linear in log2 of the length between them and the end rows' values outside them; between two head
// sizes, linear in log2 of the head size (the nearest one's outside them). No rows: a (T, T, HS) matmul's.
inline double attention_efficiency(const MachineProfile& hw, double seq_len, double head_size) {
    if (hw.attention.empty()) return matmul_efficiency(hw, seq_len, seq_len, head_size);
    std::vector<double> sizes;  // the head sizes the rows give, increasing
    for (const AttentionEfficiency& row : hw.attention) sizes.push_back(row.head_size);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    auto along_length = [&](double size) {  // the rows of one head size, in T order (the parser's rule)
        std::vector<Log2Segment> rows;
        for (const AttentionEfficiency& row : hw.attention)
            if (row.head_size == size) rows.push_back({row.seq_len, row.efficiency});
        return log2_piecewise_linear(rows, seq_len);
    };
    std::vector<Log2Segment> by_size;
    for (double size : sizes) by_size.push_back({size, along_length(size)});
    return log2_piecewise_linear(by_size, head_size);
}
// The rate memory-bound kernels of `kind` reach on `rows` rows of `width` values, blended from that kind's memory
// rows; a kind without rows: hbm_bytes_per_second.
inline double memory_bytes_per_second(const MachineProfile& hw, MemoryBoundKind kind, double width, double rows) {
    std::vector<Log2Point<2>> points;
    for (const MemoryRate& row : hw.memory)
        if (row.kind == kind) points.push_back({{row.width, row.rows}, row.bytes_per_second});
    if (points.empty()) return hw.hbm_bytes_per_second;
    return log2_nearness_blend(points, {std::max(width, 1.0), std::max(rows, 1.0)});
}
// The share of one device a rank gets when `ranks_on_node` ranks run on one node (1 on a GPU).
inline double rank_compute_share(const MachineProfile& hw, int ranks_on_node) {
    if (hw.cores_per_node <= 0 || ranks_on_node <= hw.cores_per_node) return 1.0;
    return (double)hw.cores_per_node / ranks_on_node;
}
// The tier of a group whose ranks lie within `span` consecutive world ranks (mesh.h's order).
inline Tier group_tier(const MachineProfile& hw, int span) {
    return span <= hw.ranks_per_node ? Tier::Node : span <= hw.ranks_per_leaf ? Tier::Leaf : Tier::Spine;
}
// An algorithm's latency steps and nccl-tests' bus factor (the top comment).
inline double collective_steps(CollectiveOp op, CollectiveAlgorithm algorithm, int g) {
    if (op == CollectiveOp::SendRecv) return 1;
    if (op == CollectiveOp::AllReduce)
        return algorithm == CollectiveAlgorithm::Tree ? 2 * std::ceil(std::log2((double)g)) : 2.0 * (g - 1);
    return g - 1;
}
inline double collective_bus_factor(CollectiveOp op, int g) {
    if (op == CollectiveOp::SendRecv) return 1;
    return (op == CollectiveOp::AllReduce ? 2.0 : 1.0) * (g - 1) / g;
}
// Seconds of `calls` collectives of `bytes` each (nccl-tests' n) over `ranks` ranks lying within `span`
// consecutive world ranks: the cheapest algorithm the profile has for the op on that tier (NCCL's tuner picks
// by size too). A tier the profile lacks borrows the next one inside it (a leaf without rows: the node's); the
// node tier has every op (the parser's rule).
inline double collective_seconds(const MachineProfile& hw, CollectiveOp op, int ranks, int span, double bytes,
                                 double calls = 1) {
    if (ranks <= 1 || calls <= 0) return 0.0;
    for (int tier = (int)group_tier(hw, span); tier >= 0; tier--) {
        double best = -1;
        for (int a = 0; a < kCollectiveAlgorithms; a++) {
            const CollectiveCost& c = hw.collectives[tier][(int)op][a];
            if (!c.present) continue;
            const double seconds = collective_steps(op, (CollectiveAlgorithm)a, ranks) * c.alpha_seconds +
                                   collective_bus_factor(op, ranks) * bytes / c.bus_bytes_per_second;
            if (best < 0 || seconds < best) best = seconds;
        }
        if (best >= 0) return calls * best;
    }
    fatal("machine profile %s has no %s row on the node tier", hw.name.c_str(), kCollectiveOpNames[(int)op]);
}

// ---------------------------------------------------------------------------------------------------------------
// The file format (the top comment): parsing, writing, reading.

constexpr const char* kMachineProfileFirstLine = "llmc machine profile 1";

// A line's words, its comment (from #) left out.
inline std::vector<std::string> machine_profile_words(const std::string& line) {
    std::vector<std::string> words;
    std::string word;
    for (char c : line) {
        if (c == '#') break;
        if (c == ' ' || c == '\t' || c == '\r') {
            if (!word.empty()) words.push_back(word), word.clear();
        } else {
            word += c;
        }
    }
    if (!word.empty()) words.push_back(word);
    return words;
}

// The index of `word` in `names`, or -1.
inline int machine_profile_name_index(const std::string& word, const char* const* names, int count) {
    for (int i = 0; i < count; i++)
        if (word == names[i]) return i;
    return -1;
}

// What a number of the format may be.
enum class ProfileNumber { Positive, NonNegative, Efficiency, R2, WholePositive, WholeNonNegative };

// Reads `word` as `what` under `rule` into *value; returns the problem, or "" when it is good.
inline std::string machine_profile_number(const std::string& word, const std::string& what, ProfileNumber rule,
                                          double* value) {
    char* end = nullptr;
    errno = 0;
    const double v = strtod(word.c_str(), &end);
    if (word.empty() || *end != '\0' || !std::isfinite(v)) return what + ": '" + word + "' is not a number";
    const bool whole = rule == ProfileNumber::WholePositive || rule == ProfileNumber::WholeNonNegative;
    if (whole && (v != std::floor(v) || v > 2147483647.0)) return what + ": " + word + " is not a whole number";
    const bool zero_ok = rule == ProfileNumber::NonNegative || rule == ProfileNumber::WholeNonNegative;
    if (rule == ProfileNumber::R2) {
        if (v > 1) return what + ": " + word + " is above 1 (R2 is at most 1)";
    } else if (rule == ProfileNumber::Efficiency) {
        if (v <= 0 || v > 1) return what + ": " + word + " is not a fraction of peak in (0, 1]";
    } else if (zero_ok ? v < 0 : v <= 0) {
        return what + ": " + word + (zero_ok ? " is negative" : " is not positive");
    }
    *value = v;
    return "";
}

// Parses the format into *profile (left as it was on an error); returns the one-line error, or "" when it is good.
inline std::string machine_profile_parse(const std::string& text, const std::string& source, MachineProfile* profile) {
    MachineProfile p;
    struct Scalar {
        const char* key;
        double* real;  // where its value goes: one of the two
        int* whole;
        bool required;  // the optional ones may be 0 (none), the required ones must be positive
        int line;       // where it was given (0: not yet)
    };
    Scalar scalars[] = {
        {"peak_flops", &p.peak_flops, nullptr, true, 0},
        {"hbm_bytes_per_second", &p.hbm_bytes_per_second, nullptr, true, 0},
        {"pcie_bytes_per_second", &p.pcie_bytes_per_second, nullptr, true, 0},
        {"launch_seconds", &p.launch_seconds, nullptr, false, 0},
        {"ranks_per_node", nullptr, &p.ranks_per_node, true, 0},
        {"ranks_per_leaf", nullptr, &p.ranks_per_leaf, true, 0},
        {"cores_per_node", nullptr, &p.cores_per_node, false, 0},
    };
    Scalar& ranks_per_leaf = scalars[5];
    int name_line = 0;  // where each entry was given, to name the first when one comes again
    std::vector<int> matmul_lines, memory_lines;
    int collective_lines[kTiers][kCollectiveOps][kCollectiveAlgorithms] = {};
    int fit_lines[kCollectiveOps][kCollectiveAlgorithms] = {};

    std::vector<std::string> lines = split_string(text, '\n');
    if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the newline that ends the last line
    int number = 1;  // of the line being read
    auto at = [&](int line, const std::string& problem) { return source + ":" + std::to_string(line) + ": " + problem; };
    std::string problem;
    // the entry's word count: `count` values after the key, as `usage` shows them
    auto values = [&](const std::vector<std::string>& words, size_t count, const char* usage) {
        const size_t given = words.size() - 1;
        if (given < count)
            problem = words[0] + " needs " + std::to_string(count) + (count == 1 ? " value" : " values") + " (" +
                      usage + "), got " + std::to_string(given);
        else if (given > count)
            problem = "extra words after " + words[0] + "'s " + usage + ": '" + words[count + 1] + "'";
        return given == count;
    };
    auto read = [&](const std::string& word, const std::string& what, ProfileNumber rule, double* value) {
        problem = machine_profile_number(word, what, rule, value);
        return problem.empty();
    };
    auto twice = [&](const std::string& what, int first) {
        return at(number, what + " given twice (first on line " + std::to_string(first) + ")");
    };

    std::string first_line = lines.empty() ? "" : lines[0];
    while (!first_line.empty() && (first_line.back() == '\r' || first_line.back() == ' ' || first_line.back() == '\t'))
        first_line.pop_back();
    if (first_line != kMachineProfileFirstLine)
        return at(1, std::string("not a machine profile: the first line must be '") + kMachineProfileFirstLine + "'");
    for (number = 2; number <= (int)lines.size(); number++) {
        const std::vector<std::string> words = machine_profile_words(lines[number - 1]);
        if (words.empty()) continue;
        const std::string& key = words[0];
        double v[4];
        Scalar* scalar = nullptr;
        for (Scalar& s : scalars)
            if (key == s.key) scalar = &s;
        if (key == "name") {
            if (!values(words, 1, "one word")) return at(number, problem);
            if (name_line) return twice("name", name_line);
            p.name = words[1], name_line = number;
        } else if (scalar) {
            if (!values(words, 1, "a number")) return at(number, problem);
            if (scalar->line) return twice(key, scalar->line);
            const ProfileNumber rule =
                scalar->whole ? (scalar->required ? ProfileNumber::WholePositive : ProfileNumber::WholeNonNegative)
                              : (scalar->required ? ProfileNumber::Positive : ProfileNumber::NonNegative);
            if (!read(words[1], key, rule, &v[0])) return at(number, problem);
            if (scalar->whole) *scalar->whole = (int)v[0];
            else *scalar->real = v[0];
            scalar->line = number;
        } else if (key == "matmul") {
            if (!values(words, 4, "M N K EFFICIENCY")) return at(number, problem);
            if (!read(words[1], "matmul M", ProfileNumber::Positive, &v[0]) ||
                !read(words[2], "matmul N", ProfileNumber::Positive, &v[1]) ||
                !read(words[3], "matmul K", ProfileNumber::Positive, &v[2]) ||
                !read(words[4], "matmul efficiency", ProfileNumber::Efficiency, &v[3]))
                return at(number, problem);
            for (size_t r = 0; r < p.matmul.size(); r++)
                if (p.matmul[r].m == v[0] && p.matmul[r].n == v[1] && p.matmul[r].k == v[2])
                    return twice("matmul " + words[1] + " " + words[2] + " " + words[3], matmul_lines[r]);
            p.matmul.push_back({v[0], v[1], v[2], v[3]});
            matmul_lines.push_back(number);
        } else if (key == "attention") {
            if (!values(words, 3, "T HEAD_SIZE EFFICIENCY")) return at(number, problem);
            if (!read(words[1], "attention T", ProfileNumber::Positive, &v[0]) ||
                !read(words[2], "attention head size", ProfileNumber::Positive, &v[1]) ||
                !read(words[3], "attention efficiency", ProfileNumber::Efficiency, &v[2]))
                return at(number, problem);
            for (const AttentionEfficiency& row : p.attention)
                if (row.head_size == v[1] && v[0] <= row.seq_len)
                    return at(number, "attention T " + words[1] + " does not increase on the rows before's of head size " +
                                          words[2]);
            p.attention.push_back({v[0], v[1], v[2]});
        } else if (key == "memory") {
            if (!values(words, 4, "KIND WIDTH ROWS BYTES_PER_SECOND")) return at(number, problem);
            const int kind = machine_profile_name_index(words[1], kMemoryKindNames, kMemoryKinds);
            if (kind < 0) return at(number, "memory: '" + words[1] + "' is not a kind (pointwise, layernorm, rmsnorm, route)");
            if (!read(words[2], "memory WIDTH", ProfileNumber::Positive, &v[0]) ||
                !read(words[3], "memory ROWS", ProfileNumber::Positive, &v[1]) ||
                !read(words[4], "memory bytes per second", ProfileNumber::Positive, &v[2]))
                return at(number, problem);
            for (size_t r = 0; r < p.memory.size(); r++)
                if ((int)p.memory[r].kind == kind && p.memory[r].width == v[0] && p.memory[r].rows == v[1])
                    return twice("memory " + words[1] + " " + words[2] + " " + words[3], memory_lines[r]);
            p.memory.push_back({(MemoryBoundKind)kind, v[0], v[1], v[2]});
            memory_lines.push_back(number);
        } else if (key == "collective") {
            if (!values(words, 5, "TIER OP ALGORITHM ALPHA BETA")) return at(number, problem);
            const int tier = machine_profile_name_index(words[1], kTierNames, kTiers);
            const int op = machine_profile_name_index(words[2], kCollectiveOpNames, kCollectiveOps);
            const int algorithm = machine_profile_name_index(words[3], kCollectiveAlgorithmNames, kCollectiveAlgorithms);
            if (tier < 0) return at(number, "collective: '" + words[1] + "' is not a tier (node, leaf, spine)");
            if (op < 0)
                return at(number, "collective: '" + words[2] + "' is not an op (all_reduce, all_gather, "
                                  "reduce_scatter, all_to_all, send_recv)");
            if (algorithm < 0) return at(number, "collective: '" + words[3] + "' is not an algorithm (ring, tree)");
            if (algorithm == (int)CollectiveAlgorithm::Tree && op != (int)CollectiveOp::AllReduce)
                return at(number, "collective: a tree row for " + words[2] + " (tree is all_reduce's only)");
            int& first = collective_lines[tier][op][algorithm];
            if (first) return twice("collective " + words[1] + " " + words[2] + " " + words[3], first);
            if (!read(words[4], "collective alpha", ProfileNumber::NonNegative, &v[0]) ||
                !read(words[5], "collective bus bandwidth", ProfileNumber::Positive, &v[1]))
                return at(number, problem);
            p.collectives[tier][op][algorithm] = {true, v[0], v[1]};
            first = number;
        } else if (key == "fit") {
            if (!values(words, 4, "OP ALGORITHM R2 POINTS")) return at(number, problem);
            const int op = machine_profile_name_index(words[1], kCollectiveOpNames, kCollectiveOps);
            const int algorithm = machine_profile_name_index(words[2], kCollectiveAlgorithmNames, kCollectiveAlgorithms);
            if (op < 0) return at(number, "fit: '" + words[1] + "' is not an op");
            if (algorithm < 0) return at(number, "fit: '" + words[2] + "' is not an algorithm (ring, tree)");
            int& first = fit_lines[op][algorithm];
            if (first) return twice("fit " + words[1] + " " + words[2], first);
            if (!read(words[3], "fit R2", ProfileNumber::R2, &v[0]) ||
                !read(words[4], "fit points", ProfileNumber::WholePositive, &v[1]))
                return at(number, problem);
            p.fits.push_back({(CollectiveOp)op, (CollectiveAlgorithm)algorithm, v[0], (int)v[1]});
            first = number;
        } else {
            return at(number, "unknown key '" + key + "' (the keys: name, peak_flops, hbm_bytes_per_second, "
                              "pcie_bytes_per_second, launch_seconds, ranks_per_node, ranks_per_leaf, "
                              "cores_per_node, matmul, attention, memory, collective, fit)");
        }
    }

    const int end = std::max(1, (int)lines.size());  // what is missing is missing at the end
    if (!name_line) return at(end, "the profile ends without name (required)");
    for (const Scalar& s : scalars)
        if (s.required && !s.line) return at(end, std::string("the profile ends without ") + s.key + " (required)");
    if (p.matmul.empty()) return at(end, "the profile ends without a matmul row (at least one is required)");
    for (int op = 0; op < kCollectiveOps; op++)
        if (!collective_lines[(int)Tier::Node][op][0] && !collective_lines[(int)Tier::Node][op][1])
            return at(end, std::string("the profile ends without a node-tier collective row for ") +
                               kCollectiveOpNames[op] + " (every op needs one on the node tier)");
    if (p.ranks_per_leaf < p.ranks_per_node)
        return at(ranks_per_leaf.line, "ranks_per_leaf " + std::to_string(p.ranks_per_leaf) +
                                           " is below ranks_per_node " + std::to_string(p.ranks_per_node) +
                                           " (a leaf holds whole nodes)");
    *profile = p;
    return "";
}

// A number as its fewest digits that read back as the same double (989.4e12 -> 9.894e14); whole numbers below a
// million in full (17920).
inline std::string machine_profile_number_text(double value) { return shortest_number_text(value, 1e6); }

inline std::string machine_profile_text(const MachineProfile& p) {
    auto number = machine_profile_number_text;
    std::string text = std::string(kMachineProfileFirstLine) + "\n# the format: llmc/planning/hardware.h\n";
    text += "name " + p.name + "\n";
    text += "peak_flops " + number(p.peak_flops) + "\n";
    text += "hbm_bytes_per_second " + number(p.hbm_bytes_per_second) + "\n";
    text += "pcie_bytes_per_second " + number(p.pcie_bytes_per_second) + "\n";
    text += "launch_seconds " + number(p.launch_seconds) + "\n";
    text += "ranks_per_node " + std::to_string(p.ranks_per_node) + "\n";
    text += "ranks_per_leaf " + std::to_string(p.ranks_per_leaf) + "\n";
    text += "cores_per_node " + std::to_string(p.cores_per_node) + "\n";
    for (const MatmulShapeEfficiency& row : p.matmul)
        text += "matmul " + number(row.m) + " " + number(row.n) + " " + number(row.k) + " " + number(row.efficiency) + "\n";
    for (const AttentionEfficiency& row : p.attention)
        text += "attention " + number(row.seq_len) + " " + number(row.head_size) + " " + number(row.efficiency) + "\n";
    for (const MemoryRate& row : p.memory)
        text += std::string("memory ") + kMemoryKindNames[(int)row.kind] + " " + number(row.width) + " " +
                number(row.rows) + " " + number(row.bytes_per_second) + "\n";
    for (int tier = 0; tier < kTiers; tier++)
        for (int op = 0; op < kCollectiveOps; op++)
            for (int a = 0; a < kCollectiveAlgorithms; a++) {
                const CollectiveCost& c = p.collectives[tier][op][a];
                if (c.present)
                    text += std::string("collective ") + kTierNames[tier] + " " + kCollectiveOpNames[op] + " " +
                            kCollectiveAlgorithmNames[a] + " " + number(c.alpha_seconds) + " " +
                            number(c.bus_bytes_per_second) + "\n";
            }
    for (const CollectiveFit& fit : p.fits)
        text += std::string("fit ") + kCollectiveOpNames[(int)fit.op] + " " +
                kCollectiveAlgorithmNames[(int)fit.algorithm] + " " + number(fit.r2) + " " +
                std::to_string(fit.points) + "\n";
    return text;
}

// The profile named (the built-in "h100") or in the file at this path (./h100 for a file of that name); a missing
// or bad file: one line, and the run ends.
inline PlanHardware machine_profile_read(const std::string& name_or_path) {
    PlanHardware hw;
    if (const MachineProfile* builtin = machine_profile_builtin(name_or_path)) {
        static_cast<MachineProfile&>(hw) = *builtin;
        return hw;
    }
    if (!file_exists(name_or_path))
        fatal("machine profile %s: not a built-in profile (h100) and no such file", name_or_path.c_str());
    std::string text(file_size(name_or_path), '\0');
    FILE* file = open_file(name_or_path, "rb");
    read_exact(&text[0], 1, text.size(), file, name_or_path, "the machine profile");
    close_file(file, name_or_path);
    const std::string error = machine_profile_parse(text, name_or_path, &hw);
    if (!error.empty()) fatal("%s", error.c_str());
    return hw;
}
