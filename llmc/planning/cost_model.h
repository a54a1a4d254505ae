/*
The planner's prices (llmc/planning/planner.h has the model they make up; its top comment lists every term):
what one rank's passes and collectives cost on a machine profile (llmc/planning/hardware.h).

Compute, per microbatch and pass of one rank, split as a pipeline runs it: F (the forward pass), B (the input
gradients: every matmul's dX, attention's backward, the memory-bound backward kernels) and W (the weight
gradients dW). Each is the sum of three parts:
    matmuls       each matmul the rank runs (llmc/model/forward_backward.cuh, moe.cuh), of shape C (M x N) =
                  A (M x K) B (K x N), costs 2 M N K / (peak_flops x matmul_efficiency(M, N, K)); its
                  backward dX = dY W is (M, K, N) and dW = dY^T X is (N, K, M), each priced at its own shape
    attention     the flash kernel (llmc/kernels/attention.cuh) visits only the key tiles a query sees, so a
                  causal row of T keys costs its T/2 visible keys: forward 2 products of HS per visible score
                  (S = QK, O = PV), backward 7 (S and dP twice, dV, dK, dQ: the deterministic two-kernel
                  backward); at attention_efficiency(keys per query of one kernel call: T, or T/cp per ring step; the
                  head size)
    memory-bound  the kernels' bytes read and written, by kind (pointwise, the norms, a mixture's routing),
                  over the rate the profile gives that kind at the microbatch's width and rows
                  (memory_bytes_per_second: its memory rows, or hbm_bytes_per_second), and launch_seconds
                  per kernel launch (the counts below, from the code)
and everything a rank computes is divided by rank_compute_share (the CPU build's ranks share the host's cores).

Collectives, per step and axis: the calls the code makes (each with its op, group size and nccl-tests' n),
priced by collective_seconds (alpha per call, the bytes over the tier's bus bandwidth). Their bytes, factor x n
summed over the calls, equal the per-axis byte formulas the planner always used (dev/test/test_cost_model.cu
checks it).
*/
#pragma once

#include <algorithm>
#include <string>
#include <vector>
#include "../utils.h"
#include "../parallel/layout.h"
#include "../parallel/recompute.h"
#include "../model/parameters.h"
#include "hardware.h"

// ----------------------------------------------------------------------------
// compute

// One matmul of a pass: `count` of them of shape (m, n, k) (a mixture's experts: one per expert).
struct MatmulShape {
    double m = 0, n = 0, k = 0, count = 1;
};

// The matmuls of one block's forward pass on one rank, for `rows` = B T/cp rows (gathered under SP) split over
// tp: qkv and fc column-parallel (this rank's heads and hidden units), the two projections row-parallel; a
// mixture's router and routed experts on the rank's B/tp sequences, each expert taking its share of the K
// choices per row (the routing spread evenly; under ep a rank runs E/ep experts on the rows of ep ranks).
inline std::vector<MatmulShape> block_forward_matmuls(const GPT2Config& block, double rows, int tp, int ep) {
    const double C = block.channels, t = tp;
    std::vector<MatmulShape> shapes = {{rows, block.qkv_channels() / t, C}, {rows, C, C / t}};
    if (block.hidden() > 0) {
        shapes.push_back({rows, block.fc_channels() / t, C});
        shapes.push_back({rows, C, block.hidden() / t});
    }
    if (block.moe()) {
        const double routed = rows / t, E = block.experts, per_expert = routed * block.experts_per_token * ep / E;
        shapes.push_back({routed, E, C});
        shapes.push_back({per_expert, (double)block.expert_fc_channels(), C, E / ep});
        shapes.push_back({per_expert, C, (double)block.expert_hidden(), E / ep});
    }
    return shapes;
}
// The LM head's, for `rows` rows: the vocabulary split over tp.
inline MatmulShape head_forward_matmul(const GPT2Config& c, double rows, int tp) {
    return {rows, (double)c.padded_vocab_size / tp, (double)c.channels};
}
inline double matmul_flops(const MatmulShape& s) { return 2 * s.m * s.n * s.k * s.count; }
// the backward's two matmuls of a forward one
inline MatmulShape input_gradient_shape(const MatmulShape& s) { return {s.m, s.k, s.n, s.count}; }
inline MatmulShape weight_gradient_shape(const MatmulShape& s) { return {s.n, s.k, s.m, s.count}; }
inline double matmul_seconds(const PlanHardware& hw, const MatmulShape& s) {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0) return 0.0;
    return matmul_flops(s) / (hw.peak_flops * matmul_efficiency(hw, s.m, s.n, s.k));
}

// Seconds of one pass, by kind of work.
struct ComputeSeconds {
    double matmul = 0, attention = 0, memory = 0;
    double total() const { return matmul + attention + memory; }
    ComputeSeconds& operator+=(const ComputeSeconds& o) {
        matmul += o.matmul, attention += o.attention, memory += o.memory;
        return *this;
    }
    ComputeSeconds scaled(double x) const { return {matmul * x, attention * x, memory * x}; }
};
// F, B and W of one microbatch through a piece of the model (a block, a stage).
struct PassSeconds {
    ComputeSeconds forward, input_gradient, weight_gradient;
    double total() const { return forward.total() + input_gradient.total() + weight_gradient.total(); }
    PassSeconds& operator+=(const PassSeconds& o) {
        forward += o.forward, input_gradient += o.input_gradient, weight_gradient += o.weight_gradient;
        return *this;
    }
};

// The share of its node's device one rank of the layout gets (the CPU build: ranks_on_node ranks on the cores).
inline double layout_compute_share(const PlanHardware& hw, const Layout& l) {
    return rank_compute_share(hw, std::min(l.ranks, hw.ranks_per_node));
}

// Seconds of `bytes` moved by memory-bound kernels of `kind` on `rows` rows of `width` values.
inline double memory_seconds(const PlanHardware& hw, MemoryBoundKind kind, double bytes, double width, double rows) {
    return bytes / memory_bytes_per_second(hw, kind, width, rows);
}

/*
A mixture's routing of N rows of C values, K choices a row among E experts (llmc/kernels/moe_routing.cuh), in bytes
of s-byte values (dev/calibrate.cu measures the route kind's rate with these same counts):
    forward   the router's softmax and top-K read N E logits and write N E fp32 probabilities, the log-sum-exp and
              N K choices and weights (N (E (s + 4) + 4 + 8K)); counting and placing them read and write the N K
              choices (16 N K); the permute reads a row per choice and writes it (2 N K C s); the combine reads
              the N K expert outputs and writes N rows (N K C s + N C s); the auxiliary loss reads the
              probabilities (4 N E)
    backward  the combine's backward reads the gradient once a choice, the expert outputs, and writes their
              gradients (3 N K C s) and the weights' (4 N K); the permute's backward reads the N K rows' gradients
              and writes N (N K C s + N C s); the router's backward reads the probabilities, their gradient and
              the log-sum-exp and writes the logits' gradient (N (E (8 + s) + 4 + 8K))
*/
inline double route_forward_bytes(double N, double C, double E, double K, double s) {
    return N * (E * (s + 4) + 4 + 8 * K) + 16 * N * K + 2 * N * K * C * s + (N * K * C + N * C) * s + 4 * N * E;
}
inline double route_backward_bytes(double N, double C, double E, double K, double s) {
    return 3 * N * K * C * s + 4 * N * K + (N * K * C + N * C) * s + N * (E * (8 + s) + 4 + 8 * K);
}

/*
Block `layer` for one microbatch on one rank (B sequences of T/cp rows, a tp rank's heads). The memory-bound
kernels' bytes (s bytes a value, R = the rank's rows of the residual stream: B T/cp, / tp under SP; N = B T/cp
the gathered rows; h = hidden/tp; q, k = the rank's query and K/V columns), by kind:
    forward   norm (the block's: layernorm or rmsnorm): norm1 2 R C, the fused residual + norm2 4 R C;
              pointwise: the last residual add 3 R C; GELU reads fch and writes its output (2 N h; SwiGLU reads
              gate and up: 3 N h, and so do a mixture's experts on their N K routed rows of expert_hidden units);
              RoPE rewrites q and k (2 N (q + k)); under the cp ring each step after the first merges its partial
              output into the running one (3 N q); GPT-2's biases start each biased matmul's output (the N rows of
              qkv, attproj, fc and fcproj's outputs written once more); route: a mixture's routing
              (route_forward_bytes, on the rank's N / tp rows)
    B         norm: the two norms' backward (each reads its input, the gradient in and the one it adds to, writes
              it: 4 R C); pointwise: the activation's (GELU 3 N h: fch, the gradient in, the gradient out; SwiGLU
              5 N h), RoPE's (2 N (q + k)), attention's preprocessing D = dO . O (2 N q), the bias gradients' column
              sums (those outputs' gradients read once); route: the routing's backward (route_backward_bytes)
    W         the norms' weight gradients, added to the chunk (C values: nothing)
Each kind at its rate for the block's width C and rows (R for the norms, N for the rest).
Launches counted from forward_backward.cuh: forward norm1, qkv, attention, attproj, residual+norm2, fc,
activation, fcproj, residual (9; + RoPE), B: fcproj dX, activation, fc dX, norm2, attproj dX, the attention
preprocessing and its two kernels, qkv dX, norm1 (10; + RoPE), W: 4 dW and 2 norm-gradient adds (4 with
LayerNorm's biases); a ring step's pair kernel and merge (2 per extra step forward, 3 backward: an estimate); a
mixture's router, per-expert fc, activation and projection (about 3 E/ep + 4 per pass).
*/
inline PassSeconds block_pass_seconds(const GPT2Config& config, int layer, const Layout& l, const PlanHardware& hw) {
    const GPT2Config block = config.block(layer);
    const double share = layout_compute_share(hw, l), s = l.bf16 ? 2 : 4, C = block.channels, t = l.tp;
    const double N = (double)l.batch_size * l.seq_len / l.cp, R = l.sequence_parallel ? N / t : N;
    const double h = block.hidden() / t, q = (double)block.num_heads * block.head_size() / t,
                 k = (double)block.kv_heads * block.head_size() / t;
    PassSeconds p;
    for (const MatmulShape& f : block_forward_matmuls(block, N, l.tp, l.ep)) {
        p.forward.matmul += matmul_seconds(hw, f);
        p.input_gradient.matmul += matmul_seconds(hw, input_gradient_shape(f));
        p.weight_gradient.matmul += matmul_seconds(hw, weight_gradient_shape(f));
    }
    // attention: a causal row sees half of the sequence's T keys; 2 (forward) and 7 (backward) products of HS
    const double scores = N * l.seq_len / 2.0 * block.num_heads / t, HS = block.head_size();
    // the kernel's keys per call: the whole sequence; a ring step's block (T/cp; the zigzag split's pairs of chunks
    // of T/(2 cp) are separate calls); Ulysses' whole sequence for cp's share of the heads
    const bool ring = l.cp > 1 && l.cp_mode == ContextParallelMode::Ring;
    const double keys = !ring ? l.seq_len : (double)l.seq_len / l.cp / (l.cp_split == SequenceSplit::Zigzag ? 2 : 1);
    const double attention_rate = hw.peak_flops * attention_efficiency(hw, keys, HS);
    p.forward.attention = attention_flops(kAttentionForwardProducts, scores, HS) / attention_rate;
    p.input_gradient.attention = attention_flops(kAttentionBackwardProducts, scores, HS) / attention_rate;
    // memory-bound kernels and launches
    const bool rope = block.llama(), swiglu = block.llama();
    const MemoryBoundKind norm = block.llama() ? MemoryBoundKind::RmsNorm : MemoryBoundKind::LayerNorm;
    const double ring_steps = ring ? l.cp - 1 : 0;
    // the experts' activation on their routed rows (N K over the rank's experts, ep's share of every rank's rows)
    const double expert_units = block.moe() ? (double)block.experts_per_token * block.expert_hidden() / t : 0.0;
    // GPT-2's matmul biases: N rows of each biased output (qkv and fc split over tp; a mixture has no MLP biases)
    const double biased =
        block.llama() ? 0.0 : N * (block.qkv_channels() / t + C + (block.moe() ? 0.0 : block.fc_channels() / t + C));
    const double forward_pointwise = (3 * R * C + (swiglu ? 3 : 2) * N * (h + expert_units) +
                                      (rope ? 2 * N * (q + k) : 0.0) + ring_steps * 3 * N * q + biased) * s;
    const double backward_pointwise = ((swiglu ? 5 : 3) * N * (h + expert_units) + (rope ? 2 * N * (q + k) : 0.0) +
                                       2 * N * q + biased) * s;
    p.forward.memory = memory_seconds(hw, norm, 6 * R * C * s, C, R) +
                       memory_seconds(hw, MemoryBoundKind::Pointwise, forward_pointwise, C, N);
    p.input_gradient.memory = memory_seconds(hw, norm, 8 * R * C * s, C, R) +
                              memory_seconds(hw, MemoryBoundKind::Pointwise, backward_pointwise, C, N);
    if (block.moe()) {
        const double routed = N / t, E = block.experts, K = block.experts_per_token;
        p.forward.memory += memory_seconds(hw, MemoryBoundKind::Route, route_forward_bytes(routed, C, E, K, s), C, routed);
        p.input_gradient.memory +=
            memory_seconds(hw, MemoryBoundKind::Route, route_backward_bytes(routed, C, E, K, s), C, routed);
    }
    const double experts = block.moe() ? 3.0 * block.experts / l.ep + 4 : 0;
    const double forward_launches = 9 + rope + 2 * ring_steps + experts;
    const double input_launches = 10 + rope + 3 * ring_steps + experts;
    const double weight_launches = 4 + (block.llama() ? 2 : 4) + (block.moe() ? 2.0 * block.experts / l.ep + 1 : 0);
    p.forward.memory += forward_launches * hw.launch_seconds;
    p.input_gradient.memory += input_launches * hw.launch_seconds;
    p.weight_gradient.memory = weight_launches * hw.launch_seconds;
    p.forward = p.forward.scaled(1 / share);
    p.input_gradient = p.input_gradient.scaled(1 / share);
    p.weight_gradient = p.weight_gradient.scaled(1 / share);
    return p;
}

/*
The last stage's final norm, LM head and loss for one microbatch: the norm (2 R C forward, 4 R C backward, at the
model's norm's rate for width C), the head's matmul (N rows x Vp/tp) and its dX and dW, and the classifier: the
softmax reads this rank's N x Vp/tp logits and writes the gradient over them (2 N Vp/tp s; under tp one more read
for the split softmax's max and sums), at the layernorm rate for width Vp/tp (two reductions a row, max and sum).
Launches: norm, matmul, classifier (3 + 2 under tp) | dX, norm backward (2) | dW (1). Where the schedule
does not split the backward (split false) the head's whole backward runs with its forward (forward_backward.cuh),
so all of it is F.
*/
inline PassSeconds head_pass_seconds(const GPT2Config& config, const Layout& l, const PlanHardware& hw, bool split) {
    const double share = layout_compute_share(hw, l), s = l.bf16 ? 2 : 4, C = config.channels;
    const double N = (double)l.batch_size * l.seq_len / l.cp, R = l.sequence_parallel ? N / l.tp : N;
    const MatmulShape head = head_forward_matmul(config, N, l.tp);
    PassSeconds p;
    p.forward.matmul = matmul_seconds(hw, head);
    const MemoryBoundKind norm = config.llama() ? MemoryBoundKind::RmsNorm : MemoryBoundKind::LayerNorm;
    p.forward.memory = memory_seconds(hw, norm, 2 * R * C * s, C, R) +
                       memory_seconds(hw, MemoryBoundKind::LayerNorm, (l.tp > 1 ? 3 : 2) * N * head.n * s, head.n, N) +
                       (l.tp > 1 ? 5 : 3) * hw.launch_seconds;
    p.input_gradient.matmul = matmul_seconds(hw, input_gradient_shape(head));
    p.input_gradient.memory = memory_seconds(hw, norm, 4 * R * C * s, C, R) + 2 * hw.launch_seconds;
    p.weight_gradient.matmul = matmul_seconds(hw, weight_gradient_shape(head));
    p.weight_gradient.memory = hw.launch_seconds;
    if (!split) {
        p.forward += p.input_gradient, p.forward += p.weight_gradient;
        p.input_gradient = p.weight_gradient = ComputeSeconds{};
    }
    p.forward = p.forward.scaled(1 / share);
    p.input_gradient = p.input_gradient.scaled(1 / share);
    p.weight_gradient = p.weight_gradient.scaled(1 / share);
    return p;
}

// The first stage's embedding for one microbatch: the lookup reads a row of wte (and wpe) per token and writes
// it (2 or 3 N C s), its backward reads the gradient and adds it to the table's rows (3 N C s), pointwise; 1
// launch each.
inline PassSeconds embedding_pass_seconds(const GPT2Config& config, const Layout& l, const PlanHardware& hw) {
    const double share = layout_compute_share(hw, l), s = l.bf16 ? 2 : 4, C = config.channels;
    const double N = (double)l.batch_size * l.seq_len / l.cp;
    PassSeconds p;
    p.forward.memory =
        (memory_seconds(hw, MemoryBoundKind::Pointwise, (config.llama() ? 2 : 3) * N * C * s, C, N) + hw.launch_seconds) / share;
    p.input_gradient.memory = (memory_seconds(hw, MemoryBoundKind::Pointwise, 3 * N * C * s, C, N) + hw.launch_seconds) / share;
    return p;
}

// AdamW over `parameters` (the rank's shard) once per step: it reads the gradient (s bytes), m, v and the fp32
// weights (or master weights), writes m, v and the weights (and in BF16 the rounded copy): 24 + (1 or 2) s ... = 28
// bytes a parameter in both builds; the global norm reads the gradient once more (s). Launches: a few per chunk.
inline double optimizer_seconds(double parameters, int chunks, bool bf16, const PlanHardware& hw, double share) {
    const double s = bf16 ? 2 : 4;
    return (parameters * (28 + s) / hw.hbm_bytes_per_second + 2.0 * chunks * hw.launch_seconds) / share;
}

// ----------------------------------------------------------------------------
// collectives

// `calls` collectives `op` of nccl-tests' n = `bytes` each, over `ranks` ranks within `span` consecutive ranks.
struct CollectiveCalls {
    CollectiveOp op = CollectiveOp::AllReduce;
    int ranks = 1, span = 1;
    double calls = 0, bytes = 0;
};
inline double collective_calls_bytes(const std::vector<CollectiveCalls>& calls) {  // what one rank sends
    double sent = 0;
    for (const CollectiveCalls& c : calls)
        if (c.ranks > 1) sent += c.calls * collective_bus_factor(c.op, c.ranks) * c.bytes;
    return sent;
}
/*
A group whose ranks lie in several leaves. The profile's spine bandwidth is a rank's share of the oversubscribed
layer above the leaves when every rank of a leaf sends across it at once (an all-to-all's pattern: each rank's
bytes leave its leaf). A ring (all-reduce, all-gather, reduce-scatter; send/receive between neighbours) over ranks
in mesh order visits a leaf's ranks one after the other and crosses the spine once per leaf: the leaf's uplinks
carry one crossing per group, not one per rank. With the world's groups all busy at once (every dp group reduces
its chunk at the same point of the step) a leaf holds ranks / leaves ranks of each group, so its uplinks, sized
for all of its ranks at the spine's per-rank bandwidth, give each crossing that bandwidth times the group's ranks in
the leaf, up to the leaf's own bandwidth (a crossing is also a rank's link). So a ring priced on the spine gets
    beta = min(leaf's beta, spine's beta x ranks / leaves spanned)      (alpha: the spine's)
and an all-to-all the spine's beta. (Llama 3's network, 1:7 above its pods of 3,072 GPUs: a dp group of 128 ranks
over 6 pods crosses with 21 ranks a pod, more than 7: the leaf's bandwidth.) A tree all-reduce is priced the same
way: its links, too, join ranks near each other in the order.
*/
inline double spine_ring_seconds(const PlanHardware& hw, const CollectiveCalls& c) {
    const int leaves = (c.span + hw.ranks_per_leaf - 1) / hw.ranks_per_leaf;
    const double ranks_per_leaf = std::max(1.0, (double)c.ranks / leaves);
    double best = -1;
    for (int a = 0; a < kCollectiveAlgorithms; a++) {
        const CollectiveCost& spine = hw.collectives[(int)Tier::Spine][(int)c.op][a];
        if (!spine.present) continue;
        double beta = spine.bus_bytes_per_second * ranks_per_leaf;
        const CollectiveCost& leaf = hw.collectives[(int)Tier::Leaf][(int)c.op][a];
        if (leaf.present) beta = std::min(beta, leaf.bus_bytes_per_second);
        const double seconds = collective_steps(c.op, (CollectiveAlgorithm)a, c.ranks) * spine.alpha_seconds +
                               collective_bus_factor(c.op, c.ranks) * c.bytes / beta;
        if (best < 0 || seconds < best) best = seconds;
    }
    if (best < 0) return collective_seconds(hw, c.op, c.ranks, c.span, c.bytes, c.calls);  // no spine rows: the leaf's
    return c.calls * best;
}
// The calls' seconds on a rank that gets `share` of its node's processors (layout_compute_share): a GPU's
// collectives run on its own engines (share 1); the CPU build's are copies its ranks make in turn on the host's
// cores, and calibrate.sh measured the profile's alpha and beta with one core per rank, so fewer stretch them.
inline double collective_calls_seconds(const PlanHardware& hw, const std::vector<CollectiveCalls>& calls,
                                       double share) {
    double seconds = 0;
    for (const CollectiveCalls& c : calls) {
        if (c.ranks <= 1 || c.calls <= 0) continue;
        const bool ring = c.op != CollectiveOp::AllToAll;
        seconds += ring && group_tier(hw, c.span) == Tier::Spine ? spine_ring_seconds(hw, c)
                                                                 : collective_seconds(hw, c.op, c.ranks, c.span, c.bytes, c.calls);
    }
    return seconds / share;
}
inline int collective_calls_count(const std::vector<CollectiveCalls>& calls) {
    double n = 0;
    for (const CollectiveCalls& c : calls) n += c.ranks > 1 ? c.calls : 0;
    return (int)n;
}

/*
The tp axis's calls per step for `layers` blocks (llmc/parallel/tensor_parallel.h: f and g; N = B T/cp rows
of C values):
    without SP  per block 4 all-reduces of N C (g after each projection, f's backward before each norm's);
                the embedding's all-reduce, the LM head's dX all-reduce; the split softmax's all-reduces of
                N fp32 maxima and 2N fp32 sums; all per microbatch
    with SP     per block forward 2 all-gathers + 2 reduce-scatters, backward 4 all-gathers (the norms'
                outputs again for dW) + 2 reduce-scatters; the embedding's reduce-scatter and its backward's
                all-gather, the head's all-gathers forward and backward and its dX's reduce-scatter; the
                softmax's two; per reduction (per step, per microbatch at ZeRO 2-3) an all-reduce of each
                norm's weight gradient (2 per block + the final norm)
    experts     per reduction an all-reduce of each mixture block's router and experts' gradients
    reruns      per block run again by recomputation (per microbatch): its forward's f and g once more
*/
inline std::vector<CollectiveCalls> tp_collective_calls(const GPT2Config& stage, const Layout& l, int microbatches,
                                                        double reruns_per_microbatch) {
    std::vector<CollectiveCalls> calls;
    if (l.tp == 1) return calls;
    const double s = l.bf16 ? 2 : 4, N = (double)l.batch_size * l.seq_len / l.cp, C = stage.channels,
                 L = stage.num_layers, m = microbatches;
    const double reductions = l.zero_stage >= 2 ? m : 1;
    auto add = [&](CollectiveOp op, double count, double bytes) { calls.push_back({op, l.tp, l.tp, count, bytes}); };
    if (!l.sequence_parallel) {
        add(CollectiveOp::AllReduce, (4 * L + 2 + 2 * reruns_per_microbatch) * m, N * C * s);
    } else {
        add(CollectiveOp::AllGather, (6 * L + 3 + 2 * reruns_per_microbatch) * m, N * C * s);
        add(CollectiveOp::ReduceScatter, (4 * L + 2 + 2 * reruns_per_microbatch) * m, N * C * s);
        add(CollectiveOp::AllReduce, (2 * L + 1) * reductions, (stage.llama() ? C : 2 * C) * s);
    }
    add(CollectiveOp::AllReduce, m, N * 4);      // the softmax's maxima
    add(CollectiveOp::AllReduce, m, 2 * N * 4);  // its sums and the target logits
    if (stage.moe())
        add(CollectiveOp::AllReduce, stage.moe_blocks() * reductions,
            (double)stage.experts * C * (1.0 + (double)(stage.expert_fc_channels() + stage.expert_hidden()) / l.ep) * s);
    return calls;
}

// The cp axis's calls per step for `layers` blocks (llmc/parallel/context_parallel.h; N = B T/cp rows, `heads` a
// tp rank's): the ring passes a packed K/V block (N rows x 2 kv columns) to the next rank (cp - 1) times per
// forward pass, and in the backward pass cp - 1 K/V blocks and cp dK/dV blocks (send/receive each); Ulysses
// turns q, k, v from rows to heads and the output back (2 all-to-alls per forward pass) and in the backward
// the output's gradient and q, k, v's (and the output again): 3. F forward passes per block (2 under full).
inline std::vector<CollectiveCalls> cp_collective_calls(const Layout& l, const AttentionHeads& heads, int layers,
                                                        int forward_passes, int microbatches) {
    std::vector<CollectiveCalls> calls;
    if (l.cp == 1) return calls;
    const double s = l.bf16 ? 2 : 4, N = (double)l.batch_size * l.seq_len / l.cp, F = forward_passes,
                 per_step = (double)layers * microbatches;
    const int span = l.tp * l.cp;
    if (l.cp_mode == ContextParallelMode::Ring) {
        calls.push_back({CollectiveOp::SendRecv, l.cp, span, ((l.cp - 1) * F + 2 * l.cp - 1) * per_step,
                         2 * N * heads.kv_columns() * s});
    } else {
        calls.push_back({CollectiveOp::AllToAll, l.cp, span, (F + 1) * per_step, N * heads.qkv_columns() * s});
        calls.push_back({CollectiveOp::AllToAll, l.cp, span, (F + 2) * per_step, N * heads.q_columns() * s});
    }
    return calls;
}

// The ep axis's calls per step (llmc/parallel/expert_parallel.h): per mixture block and forward pass the routed
// counts (E fp32 to each rank), the dispatch and the combine of the rank's rows x K choices (C values each); in
// the backward the two again; once per step the gradient norm's all-reduce of one fp32.
inline std::vector<CollectiveCalls> ep_collective_calls(const GPT2Config& config, const Layout& l, int mixtures,
                                                        int forward_passes, int microbatches) {
    std::vector<CollectiveCalls> calls;
    if (l.ep == 1 || !config.moe()) return calls;
    const double s = l.bf16 ? 2 : 4, rows = (double)l.batch_size / l.tp * l.seq_len / l.cp * config.experts_per_token;
    const double per_step = (double)mixtures * microbatches;
    const int span = l.tp * l.cp * l.pp * l.ep;
    calls.push_back({CollectiveOp::AllToAll, l.ep, span, forward_passes * per_step, (double)l.ep * config.experts * 4});
    calls.push_back({CollectiveOp::AllToAll, l.ep, span, (2.0 * forward_passes + 2) * per_step, rows * config.channels * s});
    calls.push_back({CollectiveOp::AllReduce, l.ep, span, 1, 4});
    return calls;
}
