/*
--recompute auto: the program chooses, per position of a stage record, what the forward pass keeps (keep,
selective, full or offload: llmc/parallel/recompute.h's BlockKeep, the letters k, s, f, o of --recompute-blocks),
the fastest choice whose memory fits --gpu-memory on every pp rank. The same letters apply to every stage record
of every pp rank (a rank whose stages are shorter takes the first letters). llmc/planning/planner.h calls it for
--plan and --plan-search, train_gpt before the model is allocated.

Memory. For one pp rank holding K stage records of l positions, the plan's total (llmc/planning/memory_plan.h,
plan_training_memory with a PerBlock policy) is, for letters x_0 .. x_{l-1}:
    total(x) = base + K sum_i d(i, x_i) + w(U)
    d(i, k)  device bytes position i keeps under kind k: block_keep_bytes (and h(i, k), its host bytes)
    U        the kinds the rank's positions use; w(U) the workspace they add: block_keep_workspace_bytes
             (selective's shared ln1, ln2, fch_gelu; full's shared record; offload's two staging records)
    base     everything else: model state, the records' inputs and gradients, the head, the workspace every
             policy has. Taken from the plan with every position kept: base = total(k...k) - K sum_i d(i, k)
             - w({k}); the plan with the chosen letters is then checked to equal the sum, to the byte.
The choice fits when total(x) <= --gpu-memory - --memory-reserve on every pp rank.

Time. Seconds one position adds per microbatch on a rank, under kind k (N = B T/cp rows of the rank, s the bytes
of an activation, R C s the block's output, D what selective drops, X = record + mixture - output what offload
moves):
    keep       0
    selective  the norms and the activation run again, at the rates cost_model.h prices them: each norm reads
               its input and writes its output (2 R C s each, at the block's norm's rate), the activation reads fch (N H s,
               SwiGLU's gate and up 2 N H s) and writes fch_gelu (N H s, pointwise), 3 launches:
                   4 R C s / norm rate + (2 or 3) N H s / pointwise rate + 3 launches,  N H s = D - 2 R C s
               (the rank's share of the device: rank_compute_share)
    full       the block's forward pass again and its tp collectives again (llmc/planning/planner.h counts the
               same: the forward pass in B, and f and g once more on the tp axis):
                   f + the rerun's tp calls (2 all-reduces, or 2 all-gathers + 2 reduce-scatters under SP, of
                   N C s each, by collective_seconds)
               f: the mean block's forward pass as llmc/planning/cost_model.h prices it (its matmuls at their
               shapes, attention, the memory-bound kernels)
    offload    X goes down after the block's forward pass and comes back before its backward pass, on a copy
               stream; the next block's forward pass (f) hides the first transfer,
               the backward pass of the block after it (2 f) the second:
                   max(0, X / pcie - f) + max(0, X / pcie - 2 f)
A position's seconds per step are that times the microbatches and times the stages of the rank that have the
position; the time added is summed over positions with, for each position, the most any pp rank adds (equal
stages: every rank the same). Not counted: the cp ring's and the ep all-to-alls' rerun under full, and the
selective or offload time under the bubble's stretch (the planner's step adds the sum to compute before it).

The method: exact. The letters' total time is a sum over positions; each rank's memory is a sum over positions
plus w of the kinds used; both sums only grow as positions are added (d, w >= 0, w grows with U). A dynamic
programme over positions keeps, for each state (the set of kinds used so far: one set per distinct record length
l of the ranks, since a rank's w counts its own l positions), the Pareto front of labels (time, and per class of
ranks with the same d the sum of d), and drops a label that some other label of the same state matches or beats
in time and in every class's bytes: any letters that complete the dropped one complete the other with no more
time and no more memory on any rank, so an optimum survives. A label is also dropped when a rank cannot fit even
with the least-memory kind at every later position (bytes only grow). At the end every label's memory is exact
(base + K sum d + w(U) per rank): the fastest that fits every rank is the optimum, the least fullest memory among
equally fast ones. dev/test/test_planner.cu compares it with an exhaustive search over all 4^l letters. With no
choice that fits, the same programme without time finds the least memory possible, which the error line names.
*/
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>
#include "../utils.h"
#include "../parallel/recompute.h"
#include "../parallel/layout.h"
#include "hardware.h"
#include "cost_model.h"
#include "memory.h"
#include "mfu.h"

// Bytes one rank sends on the tp axis when a block's forward pass runs again, per microbatch: the forward
// pass's f and g, 4 (t-1)/t N C s (llmc/parallel/tensor_parallel.h's count for one block's forward pass).
inline double recompute_rerun_tp_bytes(const GPT2Config& config, const Layout& l) {
    if (l.tp == 1) return 0.0;
    return 4.0 * (l.tp - 1.0) / l.tp * (double)l.batch_size * (l.seq_len / l.cp) * config.channels * (l.bf16 ? 2 : 4);
}

// What the seconds of one position need on one rank (the top of the file), per microbatch.
struct BlockKeepCosts {
    BlockKeepTerms terms;
    bool swiglu = false;           // the activation reads two inputs (Llama)
    double forward_seconds = 0;    // f: the mean block's forward pass (llmc/planning/cost_model.h)
    double tp_seconds = 0;         // the rerun's tp collectives (collective_seconds)
    double selective_seconds = 0;  // the norms and the activation again
    double pcie_bytes_per_second = 0;
};

inline BlockKeepCosts block_keep_costs(const GPT2Config& config, const Layout& l, const PlanHardware& hw,
                                       const BlockKeepTerms& terms) {
    BlockKeepCosts c;
    c.terms = terms;
    c.swiglu = config.llama();
    for (int layer = 0; layer < config.num_layers; layer++)  // the mean block's forward pass, at its matmuls' shapes
        c.forward_seconds += block_pass_seconds(config, layer, l, hw).forward.total() / config.num_layers;
    const double share = layout_compute_share(hw, l);
    if (l.tp > 1) {  // the forward pass's f and g once more: N C s each (recompute_rerun_tp_bytes)
        const double n = (double)l.batch_size * (l.seq_len / l.cp) * config.channels * (l.bf16 ? 2 : 4);
        const CollectiveOp ops[2][2] = {{CollectiveOp::AllReduce, CollectiveOp::AllReduce},
                                        {CollectiveOp::AllGather, CollectiveOp::ReduceScatter}};
        std::vector<CollectiveCalls> rerun;
        for (CollectiveOp op : ops[l.sequence_parallel]) rerun.push_back(CollectiveCalls{op, l.tp, l.tp, 1, n});
        c.tp_seconds = collective_calls_seconds(hw, rerun, share);
    }
    const double N = (double)l.batch_size * l.seq_len / l.cp, R = l.sequence_parallel ? N / l.tp : N;
    const double activation_output = terms.dropped - 2 * terms.output;  // fch_gelu, N H s
    const MemoryBoundKind norm = config.llama() ? MemoryBoundKind::RmsNorm : MemoryBoundKind::LayerNorm;
    c.selective_seconds = (memory_seconds(hw, norm, 4 * terms.output, config.channels, R) +
                           memory_seconds(hw, MemoryBoundKind::Pointwise, (c.swiglu ? 3 : 2) * activation_output,
                                          config.channels, N) +
                           3 * hw.launch_seconds) / share;
    c.pcie_bytes_per_second = hw.pcie_bytes_per_second;
    return c;
}

// Seconds per microbatch `keep` adds at a position (has_mixture: it carries a mixture's buffers).
inline double block_keep_seconds(BlockKeep keep, const BlockKeepCosts& c, bool has_mixture) {
    const BlockKeepTerms& t = c.terms;
    switch (keep) {
        case BlockKeep::Keep: return 0.0;
        case BlockKeep::Selective: return c.selective_seconds;
        case BlockKeep::Full: return c.forward_seconds + c.tp_seconds;
        case BlockKeep::Offload: {
            const BlockKeepBytes moved = block_keep_bytes(keep, t.record, has_mixture ? t.mixture : 0, t.dropped, t.output);
            const double transfer = moved.host / c.pcie_bytes_per_second;
            return std::max(0.0, transfer - c.forward_seconds) + std::max(0.0, transfer - 2 * c.forward_seconds);
        }
    }
    return 0.0;
}

// One pp rank's memory and time as functions of the letters (the top of the file).
struct RecomputeRank {
    int positions = 0;       // l: its stage records' positions (the first l letters apply)
    double records = 1;      // K
    double base = 0;
    BlockKeepTerms terms;
    std::vector<std::array<BlockKeepBytes, kNumBlockKeeps>> bytes;  // per position: d and h of each kind
    std::vector<std::array<double, kNumBlockKeeps>> seconds;        // per position: seconds per step of each kind
    unsigned kinds_allowed = 15;  // bit k: BlockKeep k may be chosen (a mixture of experts is not offloaded: the
                                  // model refuses o there, llmc/model/gpt2.cuh)
};

// used[k] from a set of kinds (bit k: BlockKeep k)
inline double recompute_workspace_bytes(const BlockKeepTerms& t, unsigned kinds) {
    bool used[kNumBlockKeeps];
    for (int k = 0; k < kNumBlockKeeps; k++) used[k] = (kinds >> k) & 1;
    return block_keep_workspace_bytes(used, t.record, t.mixture, t.dropped, t.output);
}

// shape: the rank's (any policy; its stage records' positions and mixture slots); keep_total: the plan's total with
// every position kept (0: only the seconds are wanted); stage_sizes: the layers of each of the rank's stages;
// microbatches: per step.
inline RecomputeRank recompute_rank(const GPT2MemoryShape& shape, bool bf16, double keep_total,
                                    const std::vector<int>& stage_sizes, int microbatches, const BlockKeepCosts& costs) {
    RecomputeRank r;
    r.positions = shape.stage_layers > 0 ? shape.stage_layers : shape.num_layers;
    r.records = shape.records;
    r.terms = gpt2_activation_bytes(shape, bf16).block;
    double kept = 0;
    for (int slot = 0; slot < r.positions; slot++) {
        const bool mixture = gpt2_slot_has_mixture(shape, slot);
        int uses = 0;  // the rank's stages that have this position, each run once per microbatch
        for (int size : stage_sizes) uses += slot < size;
        std::array<BlockKeepBytes, kNumBlockKeeps> bytes;
        std::array<double, kNumBlockKeeps> seconds;
        for (int k = 0; k < kNumBlockKeeps; k++) {
            bytes[k] = block_keep_bytes((BlockKeep)k, r.terms.record, mixture ? r.terms.mixture : 0, r.terms.dropped,
                                        r.terms.output);
            seconds[k] = (double)uses * microbatches * block_keep_seconds((BlockKeep)k, costs, mixture);
        }
        kept += bytes[(int)BlockKeep::Keep].device;
        r.bytes.push_back(bytes);
        r.seconds.push_back(seconds);
    }
    r.base = keep_total - r.records * kept - recompute_workspace_bytes(r.terms, 1u << (int)BlockKeep::Keep);
    return r;
}

// The rank's total under the letters (its first `positions` of them), and its host bytes.
inline double recompute_rank_bytes(const RecomputeRank& r, const std::vector<BlockKeep>& blocks, double* host = nullptr) {
    double kept = 0, held = 0;
    unsigned kinds = 0;
    for (int slot = 0; slot < r.positions; slot++) {
        kept += r.bytes[slot][(int)blocks.at(slot)].device;
        held += r.bytes[slot][(int)blocks.at(slot)].host;
        kinds |= 1u << (int)blocks[slot];
    }
    if (host) *host = r.records * held;
    return r.base + r.records * kept + recompute_workspace_bytes(r.terms, kinds);
}

// Seconds per step the letters add: position by position the most any rank adds. only: the kinds counted (bits).
inline double recompute_seconds(const std::vector<RecomputeRank>& ranks, const std::vector<BlockKeep>& blocks,
                                unsigned only = ~0u) {
    double total = 0;
    for (size_t slot = 0; slot < blocks.size(); slot++) {
        double most = 0;
        for (const RecomputeRank& r : ranks)
            if ((int)slot < r.positions && ((only >> (int)blocks[slot]) & 1))
                most = std::max(most, r.seconds[slot][(int)blocks[slot]]);
        total += most;
    }
    return total;
}

struct RecomputeChoice {
    std::string error;               // not empty: no letters fit; blocks are then the least-memory ones
    std::vector<BlockKeep> blocks;   // one per position of the longest stage record
    double budget = 0;               // bytes the plan's total may reach on every rank
    double seconds = 0;              // added per step
    std::vector<double> rank_bytes;  // per pp rank: the plan's total under the letters
    std::vector<double> rank_host;   // ... and its pinned host bytes
    int fullest = 0;                 // the pp rank with the most
    std::vector<RecomputeRank> ranks;
    size_t labels = 0;               // the most labels one position's front held (the programme's size)
};

// The dynamic programme (the top of the file). With use_seconds false: the least fullest memory, any time, no budget.
// Returns false when no letters fit.
inline bool recompute_search(const std::vector<RecomputeRank>& ranks, double budget, bool use_seconds,
                             std::vector<BlockKeep>* best_blocks, size_t* most_labels) {
    const int R = (int)ranks.size();
    int positions = 0;
    for (const RecomputeRank& r : ranks) positions = std::max(positions, r.positions);
    // the distinct record lengths (each keeps its own set of kinds) and the classes of ranks with the same bytes
    std::vector<int> lengths;
    for (const RecomputeRank& r : ranks) lengths.push_back(r.positions);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    if (lengths.size() > 16) fatal("--recompute auto: %zu different stage-record lengths (at most 16)", lengths.size());
    std::vector<int> length_of(R), class_of(R), class_rank;  // class_rank: a rank of each class
    for (int r = 0; r < R; r++) {
        length_of[r] = (int)(std::find(lengths.begin(), lengths.end(), ranks[r].positions) - lengths.begin());
        class_of[r] = -1;
        for (int c = 0; c < (int)class_rank.size() && class_of[r] < 0; c++) {
            const RecomputeRank& o = ranks[class_rank[c]];
            bool same = o.positions == ranks[r].positions;
            for (int slot = 0; same && slot < o.positions; slot++)
                for (int k = 0; k < kNumBlockKeeps; k++) same = same && o.bytes[slot][k].device == ranks[r].bytes[slot][k].device;
            if (same) class_of[r] = c;
        }
        if (class_of[r] < 0) class_of[r] = (int)class_rank.size(), class_rank.push_back(r);
    }
    const int classes = (int)class_rank.size();
    unsigned allowed = 15;  // the kinds every rank may choose (keep always)
    for (const RecomputeRank& r : ranks) allowed &= r.kinds_allowed | 1u;
    // per class, the least bytes positions i.. can still add; per rank, the workspace of each set of kinds
    std::vector<std::vector<double>> least_after(classes, std::vector<double>(positions + 1, 0.0));
    for (int c = 0; c < classes; c++) {
        const RecomputeRank& o = ranks[class_rank[c]];
        for (int slot = o.positions - 1; slot >= 0; slot--) {
            double least = o.bytes[slot][(int)BlockKeep::Keep].device;
            for (int k = 1; k < kNumBlockKeeps; k++)
                if ((allowed >> k) & 1) least = std::min(least, o.bytes[slot][k].device);
            least_after[c][slot] = least_after[c][slot + 1] + least;
        }
    }
    std::vector<std::array<double, 16>> workspace(R);
    for (int r = 0; r < R; r++)
        for (unsigned kinds = 0; kinds < 16; kinds++) workspace[r][kinds] = recompute_workspace_bytes(ranks[r].terms, kinds);
    std::vector<std::array<double, kNumBlockKeeps>> slot_seconds(positions);
    for (int slot = 0; slot < positions; slot++)
        for (int k = 0; k < kNumBlockKeeps; k++) {
            double most = 0;
            for (const RecomputeRank& r : ranks)
                if (slot < r.positions) most = std::max(most, r.seconds[slot][k]);
            slot_seconds[slot][k] = use_seconds ? most : 0.0;
        }
    auto kinds_of = [&](uint64_t key, int r) { return (unsigned)(key >> (4 * length_of[r])) & 15u; };

    // the fronts, position by position: a label's state (key), time, bytes per class, and how it was reached
    struct Front {
        std::vector<uint64_t> key;
        std::vector<double> seconds, bytes;  // bytes: `classes` per label
        std::vector<int> parent;
        std::vector<char> kind;
    };
    std::vector<Front> fronts(positions + 1);
    fronts[0].key.push_back(0), fronts[0].seconds.push_back(0), fronts[0].bytes.assign(classes, 0.0);
    fronts[0].parent.push_back(-1), fronts[0].kind.push_back(0);
    *most_labels = 1;
    for (int i = 0; i < positions; i++) {
        const Front& from = fronts[i];
        Front next;
        std::vector<double> bytes(classes);
        for (size_t a = 0; a < from.key.size(); a++)
            for (int k = 0; k < kNumBlockKeeps; k++) {
                if (!((allowed >> k) & 1)) continue;
                uint64_t key = from.key[a];
                for (size_t j = 0; j < lengths.size(); j++)
                    if (i < lengths[j]) key |= (uint64_t)1 << (4 * j + k);
                bool fits = true;
                for (int c = 0; c < classes; c++) {
                    const RecomputeRank& o = ranks[class_rank[c]];
                    bytes[c] = from.bytes[a * classes + c] + (i < o.positions ? o.bytes[i][k].device : 0.0);
                }
                for (int r = 0; r < R && fits && use_seconds; r++) {
                    const int c = class_of[r];
                    fits = ranks[r].base + ranks[r].records * (bytes[c] + least_after[c][i + 1]) +
                           workspace[r][kinds_of(key, r)] <= budget;
                }
                if (!fits) continue;
                next.key.push_back(key);
                next.seconds.push_back(from.seconds[a] + slot_seconds[i][k]);
                next.bytes.insert(next.bytes.end(), bytes.begin(), bytes.end());
                next.parent.push_back((int)a);
                next.kind.push_back((char)k);
            }
        // keep each state's Pareto front of (seconds, bytes of every class)
        std::vector<int> order(next.key.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
            if (next.key[x] != next.key[y]) return next.key[x] < next.key[y];
            if (next.seconds[x] != next.seconds[y]) return next.seconds[x] < next.seconds[y];
            for (int c = 0; c < classes; c++)
                if (next.bytes[x * classes + c] != next.bytes[y * classes + c])
                    return next.bytes[x * classes + c] < next.bytes[y * classes + c];
            return false;
        });
        Front& kept = fronts[i + 1];
        size_t group_start = 0;  // where the current state's labels begin in `kept`
        for (size_t n = 0; n < order.size(); n++) {
            const int x = order[n];
            if (n == 0 || next.key[x] != next.key[order[n - 1]]) group_start = kept.key.size();
            bool dominated = false;
            // sorted by time: an earlier label of the state is as fast; it dominates if no class holds more
            for (size_t y = classes == 1 && kept.key.size() > group_start ? kept.key.size() - 1 : group_start;
                 y < kept.key.size() && !dominated; y++) {
                bool no_more = true;
                for (int c = 0; c < classes && no_more; c++) no_more = kept.bytes[y * classes + c] <= next.bytes[x * classes + c];
                dominated = no_more;
            }
            if (dominated) continue;
            kept.key.push_back(next.key[x]);
            kept.seconds.push_back(next.seconds[x]);
            kept.bytes.insert(kept.bytes.end(), next.bytes.begin() + x * classes, next.bytes.begin() + (x + 1) * classes);
            kept.parent.push_back(next.parent[x]);
            kept.kind.push_back(next.kind[x]);
        }
        *most_labels = std::max(*most_labels, kept.key.size());
        if (kept.key.empty()) return false;
    }
    // every label's memory, exact: the fastest that fits, of those the least fullest memory
    const Front& last = fronts[positions];
    int best = -1;
    double best_seconds = 0, best_fullest = 0;
    for (size_t a = 0; a < last.key.size(); a++) {
        double fullest = 0;
        for (int r = 0; r < R; r++)
            fullest = std::max(fullest, ranks[r].base + ranks[r].records * last.bytes[a * classes + class_of[r]] +
                                            workspace[r][kinds_of(last.key[a], r)]);
        if (use_seconds && fullest > budget) continue;
        if (best < 0 || last.seconds[a] < best_seconds || (last.seconds[a] == best_seconds && fullest < best_fullest))
            best = (int)a, best_seconds = last.seconds[a], best_fullest = fullest;
    }
    if (best < 0) return false;
    best_blocks->assign(positions, BlockKeep::Keep);
    for (int i = positions, a = best; i > 0; a = fronts[i].parent[a], i--) (*best_blocks)[i - 1] = (BlockKeep)fronts[i].kind[a];
    return true;
}

// The fastest letters that fit `budget` bytes (the plan's total, the reserve taken off) on every rank; or the error
// line, naming the budget and the least memory possible, with the least-memory letters.
inline RecomputeChoice recompute_choose(const std::vector<RecomputeRank>& ranks, double budget, const PlanHardware& hw) {
    RecomputeChoice choice;
    choice.ranks = ranks;
    choice.budget = budget;
    if (!recompute_search(ranks, budget, true, &choice.blocks, &choice.labels)) {
        size_t labels = 0;
        recompute_search(ranks, std::numeric_limits<double>::infinity(), false, &choice.blocks, &labels);
        double least = 0;
        for (const RecomputeRank& r : ranks) least = std::max(least, recompute_rank_bytes(r, choice.blocks));
        choice.error = plan_format("--recompute auto: no choice of k, s, f, o per block fits --gpu-memory %s (%s for the "
                                   "plan after --memory-reserve %s); the least memory possible is %s (%.0f B; + %s "
                                   "reserved = %s), with --recompute-blocks %s", format_bytes(hw.gpu_memory_bytes).c_str(),
                                   format_bytes(budget).c_str(), format_bytes(hw.reserve_bytes).c_str(),
                                   format_bytes(least).c_str(), least, format_bytes(hw.reserve_bytes).c_str(),
                                   format_bytes(least + hw.reserve_bytes).c_str(),
                                   recompute_blocks_text(choice.blocks).c_str());
    }
    // positions that differ in nothing (no mixture slots, equal records) make the order of the letters arbitrary:
    // keep, selective, full, offload from the first position, so that equal choices print alike
    bool interchangeable = true;
    for (const RecomputeRank& r : ranks)
        for (int slot = 0; slot < r.positions && interchangeable; slot++)
            for (int k = 0; k < kNumBlockKeeps; k++)
                interchangeable = interchangeable && r.positions == ranks[0].positions &&
                                  r.bytes[slot][k].device == r.bytes[0][k].device &&
                                  r.bytes[slot][k].host == r.bytes[0][k].host && r.seconds[slot][k] == r.seconds[0][k];
    if (interchangeable) std::sort(choice.blocks.begin(), choice.blocks.end());
    choice.seconds = recompute_seconds(ranks, choice.blocks);
    for (size_t r = 0; r < ranks.size(); r++) {
        double host = 0;
        choice.rank_bytes.push_back(recompute_rank_bytes(ranks[r], choice.blocks, &host));
        choice.rank_host.push_back(host);
        if (choice.rank_bytes[r] > choice.rank_bytes[choice.fullest]) choice.fullest = (int)r;
    }
    return choice;
}

// The choice as a table: runs of positions with the same kind, the bytes the fullest rank keeps for them on the
// device and in host memory (all its records), the seconds they add per step; then the letters.
inline void print_recompute_choice(const RecomputeChoice& choice, const PlanHardware& hw, FILE* out = stdout) {
    const RecomputeRank& fullest = choice.ranks[choice.fullest];
    fprintf(out, "recompute auto (llmc/planning/recompute_choice.h): the fastest letters that fit --gpu-memory %s less "
            "%s reserved on every pp rank; per position of a stage record, on the fullest pp rank (%d, %.0f record(s) "
            "in flight):\n", format_bytes(hw.gpu_memory_bytes).c_str(), format_bytes(hw.reserve_bytes).c_str(),
            choice.fullest, fullest.records);
    fprintf(out, "  %-12s %-11s %14s %14s %16s\n", "positions", "kind", "device each", "host each", "seconds added");
    const std::vector<BlockKeep>& b = choice.blocks;
    for (size_t start = 0; start < b.size();) {
        size_t end = start;
        while (end + 1 < b.size() && b[end + 1] == b[start] && (int)end + 1 < fullest.positions &&
               fullest.bytes[end + 1][(int)b[start]].device == fullest.bytes[start][(int)b[start]].device)
            end++;
        std::vector<BlockKeep> run(b.size(), BlockKeep::Keep);
        std::fill(run.begin() + start, run.begin() + end + 1, b[start]);
        const bool held = (int)start < fullest.positions;
        const std::string where = start == end ? std::to_string(start) : std::to_string(start) + "-" + std::to_string(end);
        fprintf(out, "  %-12s %c %-9s %14s %14s %16.4g\n", where.c_str(), block_keep_letter(b[start]),
                block_keep_name(b[start]),
                held ? format_bytes(fullest.records * fullest.bytes[start][(int)b[start]].device).c_str() : "-",
                held ? format_bytes(fullest.records * fullest.bytes[start][(int)b[start]].host).c_str() : "-",
                recompute_seconds(choice.ranks, run));
        start = end + 1;
    }
    unsigned kinds = 0;
    for (int slot = 0; slot < fullest.positions; slot++) kinds |= 1u << (int)b[slot];
    fprintf(out, "  workspace the kinds add %s; the fullest pp rank %s (%.0f B) of %s (%.0f B) (host %s); %.4g s added per "
            "step\n", format_bytes(recompute_workspace_bytes(fullest.terms, kinds)).c_str(),
            format_bytes(choice.rank_bytes[choice.fullest]).c_str(), choice.rank_bytes[choice.fullest],
            format_bytes(choice.budget).c_str(), choice.budget, format_bytes(choice.rank_host[choice.fullest]).c_str(),
            choice.seconds);
    fprintf(out, "  letters: --recompute-blocks %s\n", recompute_blocks_text(b).c_str());
}
