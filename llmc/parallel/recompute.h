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
#include <string>
#include <vector>
#include "../utils.h"

enum class RecomputePolicy { None, Selective, Full };

struct Recompute {
    RecomputePolicy policy = RecomputePolicy::None;
    int every = 1;  // full: a checkpoint every this many blocks
};

inline const std::vector<std::string>& recompute_policy_names() {
    static const std::vector<std::string> names = {"none", "selective", "full"};
    return names;
}
inline RecomputePolicy recompute_policy_from_name(const std::string& name) {
    if (name == "none") return RecomputePolicy::None;
    if (name == "selective") return RecomputePolicy::Selective;
    if (name == "full") return RecomputePolicy::Full;
    fatal("--recompute %s: not a policy (none, selective, full)", name.c_str());
}
inline Recompute recompute_from_flags(const std::string& policy, int every) {
    Recompute r;
    r.policy = recompute_policy_from_name(policy);
    if (every < 1) fatal("--recompute-every %d: must be at least 1", every);
    if (every != 1 && r.policy != RecomputePolicy::Full)
        fatal("--recompute-every %d applies to --recompute full only (the policy is %s)", every, policy.c_str());
    r.every = every;
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

// FLOPs per token the recomputation adds (see the top of the file); block_parameters: one block's.
inline double recompute_extra_flops_per_token(const Recompute& r, double block_parameters, int num_layers,
                                              int channels, int seq_len) {
    if (r.policy != RecomputePolicy::Full) return 0.0;
    return num_layers * (2.0 * block_parameters + 4.0 * channels * seq_len);
}

inline std::string recompute_describe(const Recompute& r) {
    if (r.policy == RecomputePolicy::Full) return "full (a checkpoint every " + std::to_string(r.every) + " block(s))";
    return r.policy == RecomputePolicy::Selective ? "selective" : "none";
}
