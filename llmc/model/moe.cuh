/*
The mixture-of-experts MLP: the block's MLP (llmc/model/forward_backward.cuh) as experts, where a dense block
runs one MLP on every row. E experts, each an MLP of He hidden units like the dense one (GELU, or
SwiGLU for Llama; no biases), and S shared experts that every row goes through. A router sends each row
to K of the experts:

    z      = h @ routerw^T                  h = norm2(x), N rows; z: N x E logits
    p      = softmax(z)                     (fp32)
    e_1..K = the K experts of largest p     (ties: the smaller index; best first)
    w_k    = p[e_k] / sum_j p[e_j]          (renormalised over the chosen)
    mlp(h) = shared(h) + sum_k w_k expert_{e_k}(h)

Each expert runs on the rows sent to it, gathered into one block of consecutive rows (permute), with two
ordinary matmuls; the weighted sum takes each row's K results back (unpermute). Everything is in a fixed
order (the rows sorted by expert, then by row and k; the sum in k order), so the result does not depend
on how many rows a rank holds, and a layout equals one rank.

Under context parallelism (llmc/parallel/context_parallel.h) a rank holds T/cp of each sequence's positions, in
one piece or (zigzag) two, stored piece-major: routing is per row, so only the balance loss and the capacity
see the split. The kernels take each piece of each sequence as a sequence of its own (B pieces x B rows of
T/pieces). The ranks gather every piece's counts of assignments per expert (moe_sequence_counts); a capacity
then gives each piece what its sequence's pieces before it in position order left of it, and once the plan
is made a piece's counts are replaced by its whole sequence's, for the balance loss, to which each piece adds
its rows' part (llmc/kernels/moe_routing.cuh).

Two losses keep the router healthy, both added to the cross-entropy's gradient (the reported loss is the
cross-entropy alone; the log shows them apart):
  - load balancing (Switch Transformer, GShard), per sequence of T rows: with f_e the share of the
    sequence's T K assignments that went to e (a count: no gradient) and P_e the mean of p_e over its rows,
    aux = E sum_e f_e P_e, which is 1 when routing is uniform and grows as it concentrates. Per sequence
    (not per batch, as in DeepSeek-V3's sequence-wise loss) so that it is the same whatever the batch split.
  - the router z-loss (ST-MoE): the mean over rows of logsumexp(z)^2, which keeps the logits small.
  total = cross-entropy + alpha sum_layers mean_sequences aux + beta sum_layers mean_rows lse^2

A capacity factor cf > 0 bounds the rows an expert takes from a sequence at ceil(cf S K / E) (S positions): the
assignments beyond it, visiting the sequence's rows in order, are dropped (they add nothing; the row keeps
its other experts and its residual). Without it (the default) nothing is dropped.

Where the numbers live: the router's and the experts' weights in the block's chunk (llmc/model/parameters.h:
routerw, expertfcw, expertprojw; the shared experts are fcw and fcprojw); the routing and the experts'
activations in the block's record (llmc/model/gpt2.cuh's BlockActivations); the kernels in
llmc/kernels/moe_routing.cuh, the expert matmuls through llmc/kernels/matmul.cuh, one per expert on its rows. Under
expert parallelism (llmc/parallel/expert_parallel.h) a rank holds E/ep of the experts, and the sorted rows
travel to the rank of their expert and back between the permute and the unpermute. The settings, each in one
place: the capacity factor in the layout (llmc/parallel/layout.h), the two losses' weights and the routing
counts' room in model.moe (MoETraining), a row's weight in the step's loss in step_loss_scale
(llmc/parallel/parallel_context.h). Every function below reaches them, and the groups, through one MoEPass.
*/
#pragma once

#include <cmath>
#include <vector>
#include "gpt2.cuh"
#include "architecture.cuh"
#include "../parallel/expert_parallel.h"
#include "../parallel/context_parallel.h"

// The sequences a tp rank routes (llmc/parallel/tensor_parallel.h): B/tp of them, from sequence rank x B/tp, at
// `offset` values into an N x C buffer (under cp, whose rows are chunk-major, B/tp sequences' worth of pieces:
// moe_sequence_counts); while sampling (one sequence) tp rank 0 routes it alone.
struct MoERows {
    int sequences;
    size_t offset;
};
inline MoERows moe_rows(const TensorParallel& tp, int B, int T, int C) {
    if (B % tp.size != 0) return MoERows{tp.rank == 0 ? B : 0, 0};
    const int sequences = B / tp.size;
    return MoERows{sequences, (size_t)tp.rank * sequences * T * C};
}

// A pass through one block's mixture of experts: what every function below needs besides the tensors it reads and
// writes, each read where it lives. The model: its shape, shared buffers and stream, and model.moe (the losses'
// weights, the routing counts' room, what the log counts). The parallel context: the groups the routing talks in,
// the capacity factor (its layout's) and the weight of a row in the step's loss (step_loss_scale). The block: its
// layer, its record and its rows.
struct MoEPass {
    GPT2& model;
    ParallelContext& par;
    const BlockActivations& a;  // the block's record: the routing's arrays and the experts' activations
    int layer;
    int B, T;                   // the block's rows: B sequences of T
    MoERows routed;             // those this tp rank routes
};
inline MoEPass moe_pass(GPT2& model, ParallelContext& par, int layer, const BlockActivations& a, int B, int T) {
    return MoEPass{model, par, a, layer, B, T, moe_rows(par.tp, B, T, model.config.channels)};
}

// The rows per expert of every ep rank of the group (a.expert_rows, on the host, gathered by moe_forward).
inline ExpertCounts expert_counts(const GPT2Config& c, const ExpertParallel& ep, const BlockActivations& a) {
    return ExpertCounts{a.expert_rows, c.experts, ep.size, ep.rank, (size_t)c.channels};
}

// One expert's weights in the block's chunk (parameters or gradients): its fc (He or 2He rows of C) and its
// projection (C rows of He). e counts this rank's experts (all of them without expert parallelism).
inline floatX* expert_fc(const GPT2Config& c, floatX* expertfcw, int e) {
    return expertfcw + (size_t)e * c.expert_fc_channels() * c.channels;
}
inline floatX* expert_projection(const GPT2Config& c, floatX* expertprojw, int e) {
    return expertprojw + (size_t)e * c.channels * c.expert_hidden();
}

// The pieces each of this rank's sequences comes in, each routed as a sequence of its own: cp's chunks per rank
// (llmc/parallel/context_parallel.h), or 1 (no cp; decoding one row, which every cp rank runs whole).
inline int moe_sequence_pieces(const GPT2& model, const ContextParallel& cp) {
    return cp.size > 1 && !model.cache.decoding ? cp_chunks_per_rank(cp.split) : 1;
}

// The routing's arrays (llmc/kernels/moe_routing.cuh): the block record's, and the gradients' shared room.
inline MoeRouting moe_routing(const MoEPass& pass) {
    const BlockActivations& a = pass.a;
    const SharedBuffers& s = pass.model.shared;
    MoeRouting r;
    r.probs = a.router_probs, r.lse = a.router_lse, r.experts = a.routed_experts, r.weights = a.routed_weights;
    r.slots = a.routed_slots, r.routed_counts = a.routed_counts;
    r.dprobs = s.router_dprobs, r.dweights = s.routed_dweights;
    return r;
}

// The routing's sizes: this tp rank's sequences, each piece of one as a sequence of its own (moe_sequence_pieces),
// of a whole sequence's S = T cp positions.
inline MoeShape moe_shape(const MoEPass& pass) {
    const GPT2Config& c = pass.model.config;
    const int pieces = moe_sequence_pieces(pass.model, pass.par.cp);
    return MoeShape{pass.routed.sequences * pieces, pass.T / pieces, pass.T * pass.par.cp.size, c.experts,
                    c.experts_per_token, c.channels};
}

// Under context parallelism, from routed_counts (each piece's assignments per expert, for the B x pieces pieces
// this rank routes, chunk-major as the rows are): each piece's whole sequence's counts, summed over the pieces
// and the cp ranks, which hold the other positions of the same sequences; and, with a capacity, the room each
// piece has left for each expert: the capacity less its sequence's assignments to that expert in the pieces
// before it in position order (cp_chunk_index), since the capacity keeps a sequence's first ones. Under tp as
// well, a tp rank routes a 1/tp slice of the rank's chunk-major rows (moe_rows): B' = B/tp sequences' worth of
// pieces, which may belong to any of the cp rank's tp B' sequences, so the tp ranks' counts are gathered first,
// in rank order (rank r's are pieces [r B' pieces, (r+1) B' pieces) of the cp rank's chunk-major list). All of
// it on the device: the counts are gathered there (ints moved as pairs of bf16, bit for bit) and a kernel sums
// them, so the layer's one copy to the host stays the rows per expert (moe_forward).
//
// In `everyone`, cp rank r's piece q (q = k sequences + b: its chunk k of sequence b) is piece r per_rank + q,
// per_rank = pieces x sequences, sequences = tp B (on a cp rank). One thread per (piece of mine, expert):
//     whole[piece, e]         = sum over the pieces o of my sequence of everyone[o, e]
//     capacity_left[piece, e] = max(0, capacity - sum over those o before mine in position of everyone[o, e])
// (integers: any order of the sums gives the same bits; the pieces of my sequence are me % sequences, then every
// sequences-th piece after it)
__global__ void moe_sequence_counts_kernel(int* whole, int* capacity_left, const int* everyone, int first, int mine,
                                           int sequences, int per_rank, int all, int E, int capacity, SequenceSplit split,
                                           int cp) {
    const int index = blockIdx.x * blockDim.x + threadIdx.x;
    if (index >= mine * E) return;
    const int piece = index / E, e = index % E, me = first + piece;
    auto position = [&](int p) { return cp_chunk_index(split, cp, p / per_rank, p % per_rank / sequences); };
    int total = 0, before = 0;
    for (int other = me % sequences; other < all; other += sequences) {
        const int assigned = everyone[(size_t)other * E + e];
        total += assigned;
        if (position(other) < position(me)) before += assigned;
    }
    whole[index] = total;
    if (capacity_left) capacity_left[index] = max(0, capacity - before);
}

// From the block record's routed_counts, and with a capacity (> 0) into the shared capacity_left, (B pieces, E) on
// the device as the kernel above fills it. Returns the whole sequences' counts, (B pieces, E) on the device, in
// model.moe's room, which stays the caller's until the next call.
inline const int* moe_sequence_counts(const MoEPass& pass, int capacity) {
    MoETraining& moe = pass.model.moe;
    const TensorParallel& tp = pass.par.tp;
    const ContextParallel& cp = pass.par.cp;
    const int pieces = moe_sequence_pieces(pass.model, cp), B = pass.routed.sequences, E = pass.model.config.experts;
    int* capacity_left = capacity > 0 ? pass.model.shared.capacity_left : nullptr;
    const int* routed_counts = pass.a.routed_counts;
    cudaStream_t stream = pass.model.stream;
    const size_t mine = (size_t)pieces * B * E, sequences = (size_t)tp.size * B;  // sequences on this cp rank
    const size_t room = mine * (tp.size * (1 + cp.size) + 1);  // the tp gather's ints, the cp gather's, the sums
    if (moe.gathered_counts_elements < room) {  // made on the first step (and grown for a larger batch), then kept
        tracked_free(moe.gathered_counts);
        moe.gathered_counts = tracked_alloc<int>(room, MemoryKind::Communication, "routing counts");
        moe.gathered_counts_elements = room;
    }
    static_assert(sizeof(int) == 2 * sizeof(__nv_bfloat16), "an int travels as two bf16 elements");
    auto as_bf16 = [](const int* ints) { return reinterpret_cast<__nv_bfloat16*>(const_cast<int*>(ints)); };
    const int* cp_rank_counts = routed_counts;  // the cp rank's pieces, every tp rank's
    int* tp_gathered = moe.gathered_counts;
    int* everyone = moe.gathered_counts + mine * tp.size;
    int* whole = everyone + mine * tp.size * cp.size;
    if (tp.size > 1) {
        all_gather(*tp.group, as_bf16(tp_gathered), as_bf16(routed_counts), 2 * mine, stream);
        cp_rank_counts = tp_gathered;
    }
    all_gather(*cp.group, as_bf16(everyone), as_bf16(cp_rank_counts), 2 * mine * tp.size, stream);
    const int per_rank = (int)(pieces * sequences), all = cp.size * per_rank;
    const int first = cp.rank * per_rank + tp.rank * pieces * B;  // this tp rank's first piece
    const int block_size = 256, threads = (int)mine;
    launch(moe_sequence_counts_kernel, ceil_div(threads, block_size), block_size, 0, stream, whole, capacity_left,
           (const int*)everyone, first, pieces * B, (int)sequences, per_rank, all, E, capacity, cp.split, cp.size);
    return whole;
}

// The routed half of the MLP on h (this tp rank's routed rows) into `out` (as many rows, C wide): routing, the
// experts, and their weighted sum. The experts' row counts come to the host, which launches each expert's
// matmuls: the one point in a step where the host waits for the device mid-pass. Under expert parallelism the
// sorted rows go to their experts' ranks (ep_dispatch) and their outputs come back (ep_combine); this rank's
// experts run the rows of the whole ep group.
inline void moe_forward(const MoEPass& pass, const BlockParams& p, floatX* out, const floatX* h) {
    GPT2& model = pass.model;
    const GPT2Config& c = model.config;
    const BlockActivations& a = pass.a;
    SharedBuffers& s = model.shared;
    ExpertParallel& ep = pass.par.ep;
    const ContextParallel& cp = pass.par.cp;
    cudaStream_t stream = model.stream;
    const int T = pass.T, N = pass.routed.sequences * T, C = c.channels, E = c.experts;
    const int He = (int)c.expert_hidden(), fc = (int)c.expert_fc_channels();
    const MoeRouting routing = moe_routing(pass);
    const MoeShape shape = moe_shape(pass);
    // sampling decodes one row at a time: it keeps every assignment (a capacity counts a whole sequence, of T cp
    // positions under context parallelism)
    const float capacity_factor = pass.par.layout.capacity_factor;
    const int capacity = model.cache.decoding ? 0 : moe_capacity(c, capacity_factor, T * cp.size);
    model.moe.layer_passes++;
    matmul_forward(s.router_logits, h, p.routerw, nullptr, N, C, E, stream);
    moe_router_forward(routing, s.router_logits, shape, stream);
    if (cp.size == 1 || model.cache.decoding) {  // whole sequences
        moe_dispatch_plan(routing, s.expert_rows, shape, capacity, stream);
    } else {  // pieces of sequences
        moe_count_routed(routing, shape, stream);
        const int* whole = moe_sequence_counts(pass, capacity);
        moe_place_assignments(routing, s.expert_rows, shape, capacity, capacity > 0 ? s.capacity_left : nullptr,
                              stream);
        cudaCheck(cudaMemcpyAsync(a.routed_counts, whole, (size_t)shape.B * E * sizeof(int), cudaMemcpyDeviceToDevice,
                                  stream));  // for the balance loss
    }
    // every ep rank's rows per expert, gathered on the device and copied to the host in one piece
    const int* gathered_rows = ep_gather_counts(ep, model.moe.gathered_rows, s.expert_rows, E, stream);
    cudaCheck(cudaMemcpyAsync(a.expert_rows, gathered_rows, (size_t)ep.size * E * sizeof(int), cudaMemcpyDeviceToHost,
                              stream));
    // this rank's rows sorted by expert: where its experts run them (one rank), or ready to travel
    floatX* sorted = ep.size > 1 ? s.expert_dispatch : a.expert_input;
    moe_permute_forward(sorted, h, routing, shape, stream);
    cudaCheck(cudaStreamSynchronize(stream));  // the rows per expert, on the host
    const ExpertCounts counts = expert_counts(c, ep, a);
    size_t arriving = 0;  // what the buffers were sized for (moe_expert_rows) bounds this by construction
    for (int s = 0; s < ep.size; s++) arriving += counts.block(s, ep.rank);
    const int buffers_capacity = moe_capacity(c, capacity_factor, model.max_seq * cp.size);
    if (arriving > moe_expert_rows(c, model.max_batch, model.max_seq, ep.size, buffers_capacity))
        fatal("moe_forward: %zu rows for this rank's experts, more than its buffers hold", arriving);
    if (ep.size > 1) ep_dispatch(ep, counts, a.expert_input, sorted, s.expert_exchange, stream);
    floatX* expert_output = ep.size > 1 ? s.expert_doutput : a.expert_output;  // (the rows' own rank's, at ep 1)
    for_each_local_expert(counts, [&](int e, size_t first, int rows) {
        floatX* fch = a.expert_fch + first * fc;
        floatX* act = a.expert_act + first * He;
        matmul_forward(fch, a.expert_input + first * C, expert_fc(c, p.expertfcw, e), nullptr, rows, C, fc, stream);
        activation_forward(c, act, fch, rows, He, stream);
        matmul_forward(expert_output + first * C, act, expert_projection(c, p.expertprojw, e), nullptr, rows, He, C,
                       stream);
    });
    if (ep.size > 1) ep_combine(ep, counts, a.expert_output, expert_output, s.expert_exchange, stream);
    moe_unpermute_forward(out, a.expert_output, routing, shape, stream);
}

// The routed experts' output for this tp rank's sequences of h (the block's N x C) into out (N x C): added to the
// shared experts' partial sum there, or (no shared experts) written, with 0 for the rows of the other tp ranks, so
// that g's sum over the ranks holds each row's output once.
inline void moe_add_routed_output(const MoEPass& pass, const BlockParams& p, floatX* out, bool shared,
                                  const floatX* h) {
    GPT2& model = pass.model;
    const int C = model.config.channels;
    const size_t N = (size_t)pass.B * pass.T;
    const MoERows& rows = pass.routed;
    const size_t count = (size_t)rows.sequences * pass.T * C;
    if (!shared && count < N * C) cudaCheck(cudaMemsetAsync(out, 0, N * C * sizeof(floatX), model.stream));
    if (rows.sequences == 0) return;
    floatX* routed = shared ? model.shared.routed_output : out + rows.offset;
    moe_forward(pass, p, routed, h + rows.offset);
    if (shared) residual_forward(out + rows.offset, out + rows.offset, routed, count, model.stream);
}

// Selective recomputation: the experts' activations again from their fc outputs, which the record kept.
inline void moe_recompute_selective(const GPT2& model, const ExpertParallel& ep, const BlockActivations& a) {
    const GPT2Config& c = model.config;
    for_each_local_expert(expert_counts(c, ep, a), [&](int, size_t first, int rows) {
        activation_forward(c, a.expert_act + first * c.expert_hidden(), a.expert_fch + first * c.expert_fc_channels(),
                           rows, (int)c.expert_hidden(), model.stream);
    });
}

// The routed half's backward pass, on this tp rank's sequences: from dout (the block's N x C, the gradient of the
// MLP's output) the gradient of its input h (the record's ln2) written into dh (N x C; 0 for the rows of the other
// tp ranks), the experts' and the router's weight gradients (+=) into g, and the two losses' values added to
// model.moe.loss_sums. A row's h gradient is its K experts' input gradients plus the router's, in that order. Under
// expert parallelism the output gradients travel to the experts and the input gradients back, as the rows did in
// the forward pass. With `kept` this is B of a backward pass split in two (llmc/model/forward_backward.cuh): the
// weight gradients' operands go into kept, g is not touched, and moe_weight_gradients is the W that computes them.
inline void moe_backward(const MoEPass& pass, const BlockParams& p, const BlockParams& g, floatX* dh,
                         const floatX* dout, const BlockWeightRecord* kept) {
    GPT2& model = pass.model;
    const GPT2Config& c = model.config;
    const BlockActivations& a = pass.a;
    SharedBuffers& s = model.shared;
    MoETraining& moe = model.moe;
    ExpertParallel& ep = pass.par.ep;
    cudaStream_t stream = model.stream;
    const MoERows& rows = pass.routed;
    const int T = pass.T, N = rows.sequences * T, C = c.channels, E = c.experts, K = c.experts_per_token;
    const int He = (int)c.expert_hidden(), fc = (int)c.expert_fc_channels();
    cudaCheck(cudaMemsetAsync(dh, 0, (size_t)pass.B * T * C * sizeof(floatX), stream));
    if (rows.sequences == 0) return;
    dh += rows.offset;
    dout += rows.offset;
    // (under sequence parallelism the record's ln2 holds this rank's rows, which are the sequences it routes)
    const floatX* h = a.ln2 + (pass.par.tp.sequence_parallel ? 0 : rows.offset);
    const MoeRouting routing = moe_routing(pass);
    const MoeShape shape = moe_shape(pass);
    // a matmul's weight gradient from its output gradient dout and input inp (`rows` rows): now, or its operands
    // copied into kept at the same rows
    auto weight_gradient = [&](floatX* dweight, const floatX* dout, floatX* kept_dout, const floatX* inp,
                               floatX* kept_inp, int rows, int IC, int OC) {
        weight_gradient_now_or_kept(kept != nullptr, dweight, nullptr, s.matmul_scratch, dout, kept_dout, inp, kept_inp,
                                    rows, IC, OC, stream);
    };
    // the weighted sum: each expert output's gradient (this rank's rows, sorted by expert), and each weight's
    floatX* sorted = ep.size > 1 ? s.expert_dispatch : s.expert_doutput;
    moe_unpermute_backward(sorted, dout, a.expert_output, routing, shape, stream);
    const ExpertCounts counts = expert_counts(c, ep, a);
    if (kept) std::copy(a.expert_rows, a.expert_rows + (size_t)ep.size * E, kept->expert_rows);
    if (ep.size > 1) ep_dispatch(ep, counts, s.expert_doutput, sorted, s.expert_exchange, stream);
    // each expert, on its rows: the two matmuls and the activation backwards; its rows' input gradients
    // overwrite their output gradients, which nothing reads after (a weight gradient's copy is taken first)
    for_each_local_expert(counts, [&](int e, size_t first, int rows) {
        floatX* doutput = s.expert_doutput + first * C;
        matmul_backward_input(s.expert_dact, doutput, expert_projection(c, p.expertprojw, e), rows, He, C, stream);
        weight_gradient(expert_projection(c, g.expertprojw, e), doutput, kept ? kept->expert_doutput + first * C : nullptr,
                        a.expert_act + first * He, kept ? kept->expert_act + first * He : nullptr, rows, He, C);
        activation_backward(c, s.expert_dfch, a.expert_fch + first * fc, s.expert_dact, rows, He, stream);
        matmul_backward_input(doutput, s.expert_dfch, expert_fc(c, p.expertfcw, e), rows, C, fc, stream);
        weight_gradient(expert_fc(c, g.expertfcw, e), s.expert_dfch, kept ? kept->expert_dfch + first * fc : nullptr,
                        a.expert_input + first * C, kept ? kept->expert_input + first * C : nullptr, rows, C, fc);
    });
    if (ep.size > 1) ep_combine(ep, counts, sorted, s.expert_doutput, s.expert_exchange, stream);
    moe_permute_backward(s.routed_output, sorted, routing, shape, stream);
    residual_forward(dh, dh, s.routed_output, (size_t)N * C, stream);
    // the router: the losses' gradients on p, with the weights' through the renormalisation and the softmax.
    // The loss scale weighs a row's loss (1 / rows of the step on this rank): a sequence's aux loss weighs S times
    // it, S = T cp the sequence's positions, of which this rank holds T (in pieces of shape.T rows).
    const float loss_scale = step_loss_scale(pass.par);
    const float aux_scale = moe.aux_coefficient * loss_scale * shape.S, z_scale = moe.z_coefficient * loss_scale;
    moe_aux_loss_forward(moe.loss_sums, moe.loss_sums + 1, routing, shape, stream);
    moe_aux_loss_backward(routing, shape, aux_scale, stream);
    moe_router_backward(s.router_logits, routing, shape, z_scale, stream);
    matmul_backward_input(s.routed_output, s.router_logits, p.routerw, N, C, E, stream);
    weight_gradient(g.routerw, s.router_logits, kept ? kept->router_dlogits : nullptr, h,
                    kept ? kept->router_input : nullptr, N, C, E);
    residual_forward(dh, dh, s.routed_output, (size_t)N * C, stream);
    // what the log reports: the rows each expert ran, and the assignments dropped
    long long routed = 0;
    for (int e = 0; e < E; e++) {
        const int expert_rows = a.expert_rows[(size_t)ep.rank * E + e];  // this rank's rows, wherever they ran
        moe.tokens[(size_t)pass.layer * E + e] += expert_rows;
        routed += expert_rows;
    }
    moe.dropped += (long long)N * K - routed;
}

// W of a backward pass split in two: the experts' and the router's weight gradients (+=) into g from what
// moe_backward's B kept, in the order the whole pass adds them (an expert's projection, then its fc; the router
// last), so the same bits. B x T: the rows this tp rank routed.
inline void moe_weight_gradients(GPT2& model, const ExpertParallel& ep, const BlockParams& g,
                                 const BlockWeightRecord& kept, int B, int T) {
    const GPT2Config& c = model.config;
    float* scratch = model.shared.matmul_scratch;
    cudaStream_t stream = model.stream;
    const int C = c.channels, He = (int)c.expert_hidden(), fc = (int)c.expert_fc_channels();
    const ExpertCounts counts{kept.expert_rows, c.experts, ep.size, ep.rank, (size_t)C};
    for_each_local_expert(counts, [&](int e, size_t first, int rows) {
        matmul_backward_weights(expert_projection(c, g.expertprojw, e), nullptr, scratch, kept.expert_doutput + first * C,
                                kept.expert_act + first * He, rows, He, C, stream);
        matmul_backward_weights(expert_fc(c, g.expertfcw, e), nullptr, scratch, kept.expert_dfch + first * fc,
                                kept.expert_input + first * C, rows, C, fc, stream);
    });
    matmul_backward_weights(g.routerw, nullptr, scratch, kept.router_dlogits, kept.router_input, B * T, C, c.experts,
                            stream);
}
