/*
The machine the planner assumes (llmc/planning/planner.h): a machine profile. Kept apart from the planner so that
reading the flags needs neither the model nor a kernel.

A profile is what one rank's device computes and moves, and what its links cost:
    peak FLOP/s and the fraction of it a matmul of shape (M, N, K) reaches, from a table of measured shapes;
    the attention kernel's fraction of peak by sequence length; the device memory's bandwidth (the memory-bound
    kernels: norms, activations, AdamW); the host link's (offload);
    the three tiers of the network a group of ranks may span (inside a node; inside a leaf, the ranks one
    switch layer joins at full bandwidth; across the spine, with its oversubscription), and on each tier each
    collective's cost as NCCL's performance notes put it, a latency and a bandwidth:
        seconds = steps(op, algorithm, g) x alpha + factor(op, g) x n / beta
    n the collective's buffer in nccl-tests' convention, beta its bus bandwidth (nccl-tests' busbw), g the ranks;
    how many ranks share a node's processors (the CPU build's ranks take turns on its cores; a GPU is one rank's).

    PlanHardware hw = machine_profile_read("h100");         // the built-in H100 cluster, or a file's path
    double s = collective_seconds(hw, CollectiveOp::AllReduce, ranks, span, bytes);
    double e = matmul_efficiency(hw, M, N, K);

The file format and the built-in profile's sources: machine_profile_parse below.
*/
#pragma once

#include <cmath>
#include <string>
#include <vector>

// what the plan does not count but a GPU needs: the CUDA context (~0.5 GiB), cuBLASLt's 32 MiB workspace,
// NCCL's buffers (a few hundred MiB with several communicators); --memory-reserve sets it
constexpr double kPlanReserveBytes = 2.0 * (1 << 30);

// Where a group's ranks lie: all in one node; in one leaf (the ranks the first switch layers join at full
// bisection bandwidth: Llama 3's pod of 3072 GPUs); or across the spine.
enum class Tier { Node = 0, Leaf, Spine };
constexpr int kTiers = 3;
enum class CollectiveOp { AllReduce = 0, AllGather, ReduceScatter, AllToAll, SendRecv };
constexpr int kCollectiveOps = 5;
enum class CollectiveAlgorithm { Ring = 0, Tree };
constexpr int kCollectiveAlgorithms = 2;

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
    double seq_len = 0;   // keys per query (T / cp for one ring step: the kernel's T)
    double efficiency = 0;
};

struct PlanHardware {
    std::string name = "h100";
    // the run's choices (flags), not the profile's
    double gpu_memory_bytes = 80.0 * (1 << 30);
    double reserve_bytes = kPlanReserveBytes;    // kept free of the plan: "fits" is total + this <= gpu_memory_bytes
    // the profile
    int ranks_per_node = 8;                      // joined by the node tier (NVLink)
    int ranks_per_leaf = 3072;                   // joined by the leaf tier at full bandwidth
    int cores_per_node = 0;                      // processors a node's ranks share; 0: each rank has its own device
    double peak_flops = 989.4e12;                // per rank, dense BF16 (H100 SXM, llmc/planning/mfu.h)
    double hbm_bytes_per_second = 3.35e12;       // the device's own memory (H100 SXM, HBM3)
    double pcie_bytes_per_second = 50e9;         // per direction, device <-> pinned host memory (PCIe 5 x16)
    double launch_seconds = 0;                   // fixed cost per kernel launch
    std::vector<MatmulShapeEfficiency> matmul;   // measured shapes
    std::vector<AttentionEfficiency> attention;  // measured sequence lengths
    CollectiveCost collectives[kTiers][kCollectiveOps][kCollectiveAlgorithms];

    // until the planner reads the profile: the two-tier, one-efficiency model
    int gpus_per_node = 8;
    double nvlink_bytes_per_second = 450e9;      // per direction per GPU (H100 SXM, NVLink 4)
    double infiniband_bytes_per_second = 50e9;   // per GPU (NDR, 400 Gb/s)
    double efficiency = 0.5;                     // fraction of peak the matmuls reach
};

// The fraction of peak_flops a matmul of this shape reaches: the table's rows weighted by their nearness in
// log2 space (1 / d^4, an exact match alone), so a shape between measured ones gets a blend of them and one
// outside the table the nearest rows' values.
inline double matmul_efficiency(const PlanHardware& hw, double m, double n, double k) {
    if (hw.matmul.empty()) return hw.efficiency;
    double weights = 0, sum = 0;
    for (const MatmulShapeEfficiency& row : hw.matmul) {
        const double dm = std::log2(m / row.m), dn = std::log2(n / row.n), dk = std::log2(k / row.k);
        const double d2 = dm * dm + dn * dn + dk * dk;
        if (d2 < 1e-12) return row.efficiency;
        const double w = 1.0 / (d2 * d2);
        weights += w, sum += w * row.efficiency;
    }
    return sum / weights;
}
// The attention kernel's fraction of peak_flops at this many keys per query: linear in log2 of the length
// between the table's rows, the end rows' values outside them.
inline double attention_efficiency(const PlanHardware& hw, double seq_len) {
    if (hw.attention.empty()) return matmul_efficiency(hw, seq_len, seq_len, 128);
    const std::vector<AttentionEfficiency>& rows = hw.attention;  // sorted by seq_len (the parser's rule)
    if (seq_len <= rows.front().seq_len) return rows.front().efficiency;
    for (size_t i = 1; i < rows.size(); i++)
        if (seq_len <= rows[i].seq_len) {
            const double x = std::log2(seq_len / rows[i - 1].seq_len) / std::log2(rows[i].seq_len / rows[i - 1].seq_len);
            return rows[i - 1].efficiency + x * (rows[i].efficiency - rows[i - 1].efficiency);
        }
    return rows.back().efficiency;
}
// The share of one device a rank gets when `ranks_on_node` ranks run on one node (1 on a GPU).
inline double rank_compute_share(const PlanHardware& hw, int ranks_on_node) {
    if (hw.cores_per_node <= 0 || ranks_on_node <= hw.cores_per_node) return 1.0;
    return (double)hw.cores_per_node / ranks_on_node;
}
// The tier of a group whose ranks lie within `span` consecutive world ranks (mesh.h's order).
inline Tier group_tier(const PlanHardware& hw, int span) {
    return span <= hw.ranks_per_node ? Tier::Node : span <= hw.ranks_per_leaf ? Tier::Leaf : Tier::Spine;
}
// An algorithm's latency steps and nccl-tests' bus factor (the bytes one rank sends per byte of n):
//   ring all-reduce      2 (g-1) steps, 2 (g-1)/g       (a reduce-scatter, then an all-gather)
//   tree all-reduce      2 ceil(log2 g) steps, 2 (g-1)/g (up the tree and down; NCCL's double binary tree keeps
//                        the ring's bus bandwidth)
//   all-gather, reduce-scatter, all-to-all   g-1 steps, (g-1)/g (tree: the ring's, NCCL has no tree for them)
//   send/receive         1 step, 1
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
// by size too). A tier the profile lacks borrows the next one inside it (a leaf without rows: the node's).
inline double collective_seconds(const PlanHardware& hw, CollectiveOp op, int ranks, int span, double bytes,
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
    // no rows at all: the two-tier bandwidth model
    const double link = span <= hw.gpus_per_node ? hw.nvlink_bytes_per_second : hw.infiniband_bytes_per_second;
    return calls * collective_bus_factor(op, ranks) * bytes / link;
}
// The profile named (the built-in "h100") or in the file at this path; a bad file: one line, and the run ends.
inline PlanHardware machine_profile_read(const std::string& name_or_path);
// Parses the format into *hw; returns the one-line error, or "" when it is good.
inline std::string machine_profile_parse(const std::string& text, const std::string& source, PlanHardware* hw);
// The format, written back (calibrate.sh's output; parse(text(hw)) == hw).
inline std::string machine_profile_text(const PlanHardware& hw);
