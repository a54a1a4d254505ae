/*
Activation recomputation: store less in the forward pass, compute it again in the backward pass.

The backward pass of a block needs what its forward pass computed (llmc/model/gpt2.cuh's BlockActivations).
Keeping all of it for every layer is the simplest choice and the most memory; the alternative is to keep
some of it and run the missing part of the forward pass again, just before the block's backward pass.
Three policies (--recompute):

  none       every layer keeps its whole record: ln1, its mean and rstd, qkv, the attention output and
             log-sum-exp, residual2, ln2 and its statistics, fch, fch_gelu, the block's output.
  selective  drop what is cheap to compute again and costs the most memory per FLOP: the two layernorm
             outputs (each one pass over N x C, from the kept input or residual2 and the kept mean and
             rstd) and the GELU output (one pass over N x 4C from the kept fch). The matmul inputs that are
             expensive to recompute stay: qkv, the attention output (flash attention already keeps only O
             and the log-sum-exp instead of the T x T probabilities), fch. A layer then keeps 10 N C
             values instead of 16; one shared ln1, ln2 and fch_gelu serve every layer's backward pass.
  full       keep only the residual stream at the start of every C-th block (--recompute-every C, 1 by
             default); the blocks between two such checkpoints form a segment. The backward pass of a
             segment first reruns its blocks' forward passes from the checkpoint, filling C shared
             records, then runs their backward passes. Memory: ceil(L/C) checkpoints of N C plus C whole
             records; C = sqrt(L) gives O(sqrt(L)) records (Chen et al. 2016), C = 1 keeps one input per
             layer and one record.

Per block. A stage record's layers need not all keep the same: --recompute-blocks gives one letter per
position of a stage record (a block of the stage: the layer without pipeline parallelism), and --recompute
auto lets the program choose them for --gpu-memory (llmc/planning/recompute_choice.h):
  k  keep       the whole record, as none
  s  selective  as selective: the norms' and the activation's outputs recomputed
  f  full       only the block's output (the next block's input) kept; the rest is recomputed from the
                block's input in a record every full block shares (full with a checkpoint every block)
  o  offload    the whole record goes to pinned host memory after the block's forward pass, on a copy stream,
                and comes back one block ahead of its backward pass (--offload activations: every block)
The letters name positions of a stage record, not layers: with pipeline parallelism a rank's records have as
many positions as its longest stage has blocks (--pp-layers makes them even), and every record in flight keeps
what its positions say (llmc/model/activation_offload.cuh says why every record in flight is offloaded). A
block's record knows its letter (BlockActivations::keep): gpt2_allocate_records lays the records out,
gpt2_stage_forward and gpt2_stage_backward (llmc/model/forward_backward.cuh) rerun, recompute, copy out and
fetch. Every schedule works, the zero-bubble ones too (B fetches or reruns as the whole pass does; W reads only
its weight record). A mixture of experts' block is not offloaded (refused): its routing counts are read on the
host, which would need the record back before the step's end. Memory: llmc/planning/activation_memory.h's
block_keep_bytes per position (device and host) and block_keep_workspace_bytes (the shared buffers: one set of
selective's outputs, one record for every f position, two staging records for the o positions), held by the
run to the byte (dev/test/test_memory.cu, scripts/test/test_recompute_blocks.sh).

Every policy gives the same bits as none: the forward kernels are deterministic, so a recomputed
activation equals the stored one exactly (at ZeRO-3 the rerun gathers the same parameters again, under
tensor parallelism the rerun's collectives add the same numbers in the same order).

Hardware FLOPs. Model FLOPs utilisation counts the model's work once (llmc/planning/mfu.h); hardware FLOPs
utilisation (HFU) also counts the recomputation. Only matmul and attention FLOPs are counted, as MFU
does, so selective (layernorms and GELU: elementwise) adds none; full reruns every block's forward pass:
2 FLOPs per block parameter and token, and the attention's forward 4 C T per layer and token
(recompute_extra_flops_per_token).
*/
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>
#include "../utils.h"

// PerBlock: `blocks` says, per position of a stage record. Auto: the program is to choose the blocks for a
// memory budget; the layout holds PerBlock once it has (a run never sees Auto).
enum class RecomputePolicy { None, Selective, Full, PerBlock, Auto };

// What one block of a stage record keeps (see the top of the file; the letters of --recompute-blocks).
enum class BlockKeep { Keep, Selective, Full, Offload };
constexpr int kNumBlockKeeps = 4;

struct Recompute {
    RecomputePolicy policy = RecomputePolicy::None;
    int every = 1;                 // full: a checkpoint every this many blocks
    std::vector<BlockKeep> blocks;  // PerBlock: one per position of a stage record
};

inline const std::vector<std::string>& recompute_policy_names() {
    static const std::vector<std::string> names = {"none", "selective", "full", "auto"};
    return names;
}
inline RecomputePolicy recompute_policy_from_name(const std::string& name) {
    if (name == "none") return RecomputePolicy::None;
    if (name == "selective") return RecomputePolicy::Selective;
    if (name == "full") return RecomputePolicy::Full;
    if (name == "auto") return RecomputePolicy::Auto;
    fatal("--recompute %s: not a policy (none, selective, full, auto)", name.c_str());
}

inline char block_keep_letter(BlockKeep keep) { return "ksfo"[(int)keep]; }
inline const char* block_keep_name(BlockKeep keep) {
    static const char* names[kNumBlockKeeps] = {"keep", "selective", "full", "offload"};
    return names[(int)keep];
}

// "kkssfo" -> the blocks; "" and the error line when a letter is not one of k, s, f, o
inline std::string recompute_blocks_parse(const std::string& letters, std::vector<BlockKeep>* blocks) {
    blocks->clear();
    if (letters.empty()) return "--recompute-blocks: empty (one letter per block: k, s, f or o)";
    for (char letter : letters) {
        const char* found = strchr("ksfo", letter);
        if (letter == 0 || found == nullptr)
            return std::string("--recompute-blocks ") + letters + ": '" + letter +
                   "' is not k (keep), s (selective), f (full) or o (offload)";
        blocks->push_back((BlockKeep)(found - "ksfo"));
    }
    return "";
}
inline std::string recompute_blocks_text(const std::vector<BlockKeep>& blocks) {
    std::string text;
    for (BlockKeep keep : blocks) text += block_keep_letter(keep);
    return text;
}

// The letters as runs, for a narrow column: "kkkssf" -> "3k 2s 1f"
inline std::string recompute_blocks_runs(const std::vector<BlockKeep>& blocks) {
    std::string text;
    for (size_t start = 0, end = 0; start < blocks.size(); start = end) {
        while (end < blocks.size() && blocks[end] == blocks[start]) end++;
        text += (text.empty() ? "" : " ") + std::to_string(end - start) + block_keep_letter(blocks[start]);
    }
    return text;
}

// A PerBlock policy for a layout whose longest stage has `slots` blocks: the letters are one per position of that
// stage's records, and a rank whose stages are shorter uses the first ones (uneven stages, llmc/parallel/pipeline.h).
// --offload activations alone leaves the letters to fill (every block offloaded). "" or the error line.
inline std::string recompute_blocks_resolve(Recompute& r, int slots) {
    if (r.policy != RecomputePolicy::PerBlock) return "";
    if (r.blocks.empty()) r.blocks.assign(slots, BlockKeep::Offload);
    if ((int)r.blocks.size() != slots)
        return "--recompute-blocks " + recompute_blocks_text(r.blocks) + ": " + std::to_string(r.blocks.size()) +
               " letters for stage records of " + std::to_string(slots) + " blocks (one letter per block of the "
               "longest stage)";
    return "";
}

// What position `slot` of a stage record keeps, for the policies a block can say alone (full with a checkpoint
// every C > 1 blocks is a segment's, not a block's: that is Full here too, and recompute_segment says more).
inline BlockKeep recompute_block_keep(const Recompute& r, int slot) {
    switch (r.policy) {
        case RecomputePolicy::Selective: return BlockKeep::Selective;
        case RecomputePolicy::Full: return BlockKeep::Full;
        case RecomputePolicy::PerBlock: return r.blocks.at(slot);
        default: return BlockKeep::Keep;
    }
}
// --recompute, --recompute-every, --recompute-blocks and whether --offload names activations (every block offloaded)
inline Recompute recompute_from_flags(const std::string& policy, int every, const std::string& blocks = "",
                                      bool offload_activations = false) {
    Recompute r;
    r.policy = recompute_policy_from_name(policy);
    if (every < 1) fatal("--recompute-every %d: must be at least 1", every);
    if (every != 1 && r.policy != RecomputePolicy::Full)
        fatal("--recompute-every %d applies to --recompute full only (the policy is %s)", every, policy.c_str());
    r.every = every;
    if (!blocks.empty()) {
        if (r.policy != RecomputePolicy::None)
            fatal("--recompute-blocks and --recompute %s: give one (the letters are the policy, block by block)",
                  policy.c_str());
        if (offload_activations)
            fatal("--recompute-blocks and --offload activations: give one (the letter o offloads a block)");
        const std::string error = recompute_blocks_parse(blocks, &r.blocks);
        if (!error.empty()) fatal("%s", error.c_str());
        r.policy = RecomputePolicy::PerBlock;
    } else if (offload_activations) {
        if (r.policy != RecomputePolicy::None && r.policy != RecomputePolicy::Auto)
            fatal("--offload activations and --recompute %s: offloading keeps every block's record (on the host); "
                  "mix the two with --recompute-blocks", policy.c_str());
        if (r.policy == RecomputePolicy::None) r.policy = RecomputePolicy::PerBlock;  // blocks filled per stage
    }
    return r;
}

// Blocks per segment of the backward pass: under full, the blocks a checkpoint covers (the last segment may
// be shorter); one block otherwise.
inline int recompute_segment(const Recompute& r, int num_layers) {
    return r.policy == RecomputePolicy::Full ? std::min(r.every, num_layers) : 1;
}

// Whether block `layer`'s output is stored for the backward pass: always, but under full only at the end of
// a segment (it is the next segment's checkpoint) and at the last block (the final layernorm's input).
inline bool recompute_keeps_output(const Recompute& r, int layer, int num_layers) {
    if (r.policy != RecomputePolicy::Full) return true;
    const int segment = recompute_segment(r, num_layers);
    return layer % segment == segment - 1 || layer == num_layers - 1;
}

// How many outputs that is under full: ceil(L / C).
inline int recompute_kept_outputs(const Recompute& r, int num_layers) {
    const int segment = recompute_segment(r, num_layers);
    return (num_layers + segment - 1) / segment;
}

// One block's forward pass, FLOPs per token, as MFU counts them (see the top of the file): what full reruns.
inline double recompute_block_forward_flops_per_token(double block_parameters, int channels, int seq_len) {
    return 2.0 * block_parameters + 4.0 * channels * seq_len;
}

// FLOPs per token the recomputation adds (see the top of the file); block_parameters: one block's.
// (per block: the share of the blocks that are full)
inline double recompute_extra_flops_per_token(const Recompute& r, double block_parameters, int num_layers,
                                              int channels, int seq_len) {
    double full_share = r.policy == RecomputePolicy::Full ? 1.0 : 0.0;
    if (r.policy == RecomputePolicy::PerBlock && !r.blocks.empty())
        full_share = (double)std::count(r.blocks.begin(), r.blocks.end(), BlockKeep::Full) / r.blocks.size();
    return full_share * num_layers * recompute_block_forward_flops_per_token(block_parameters, channels, seq_len);
}

inline std::string recompute_describe(const Recompute& r) {
    switch (r.policy) {
        case RecomputePolicy::Full: return "full (a checkpoint every " + std::to_string(r.every) + " block(s))";
        case RecomputePolicy::Selective: return "selective";
        case RecomputePolicy::PerBlock: return "per block " + recompute_blocks_text(r.blocks);
        case RecomputePolicy::Auto: return "auto";
        default: return "none";
    }
}
