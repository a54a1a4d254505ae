/*
Pipeline parallelism behind one door: the Pipeline a rank holds, how it is made (its stages' layers, its actions,
records and messages), its links to its neighbours, and the executor that runs its actions on the model's stages.

The pp ranks of the mesh (llmc/parallel/mesh.h) each hold V runs of consecutive layers, the model stages of
llmc/parallel/pipeline_schedule.h (which stage sits on which rank) and the stage split below (how many layers
each stage holds: balanced by cost, or as --pp-layers lists them). The first stage also holds the
embeddings, the last one the final norm and the LM head. GPT-2's head is tied to wte: its last stage keeps its
own copy of the embedding chunk (llmc/model/parameters.h's ParameterLayout holds only a rank's chunks); Llama's
is a tensor of its own in the final chunk, and wte stays on the first stage alone. A step's
batch is cut into m microbatches, the gradient-accumulation micro-steps (a batch ramp, llmc/batch_ramp.h,
changes m between steps: pipeline_create plays the schedule once for each m of the run, the pools of records
sized for the most any play needs, and pipeline_use_microbatches picks the play of the next steps). The
schedule says in which order a rank runs the passes of (microbatch, virtual stage); pipeline_step runs any such
list:

    F(j, s)   the input activations (B x T x C): received from stage s-1, handed over in memory when s-1 is on
              this rank too (zbv's turn at the bottom of its V), or looked up (stage 0: the embeddings)
              run the stage's blocks
              the output goes to stage s+1 (stage S-1: the final layernorm, the LM head and the loss, into a
              head record; where the backward is whole, at once the loss's backward pass through the head and
              the final layernorm too: the stage record keeps the gradient of the output, not the logits)
    B(j, s)   the gradient of the output from stage s+1 (stage S-1: computed in F, or under zb-h1 and zbv here,
              from the head record's dlogits)
              run the stage's blocks backwards: all of it, or under zb-h1 and zbv only the input gradients,
              keeping in a weight record what the weight gradients need
              the gradient of the input goes to stage s-1 (in memory when it is on this rank; stage 0: the
              embeddings' gradients)
    W(j, s)   (zb-h1, zbv) the weight gradients of the stage's blocks from the weight record, accumulated
              (stage S-1: the head's share of dwte too, from its head record, which is then free)
Why the head splits with the blocks: the LM head costs as much as several blocks (2 V C FLOPs per token each
way against a block's 24 C^2), and the stage split (below) counts it as that many
layer-equivalents. Each of the head's three matmuls (logits, their input gradient, dwte) then lands in F, B and
W as a block's do, and the last stage's F, B and W each match the other stages'. Left whole in the last stage's
F, the head makes that F several blocks long, and every other stage waits for it once per microbatch.
Before each action the rank exchanges, as one group, the receives this action needs and the sends of earlier
results whose receiver is waiting for them by then (below, "Point to point", says why,
pipeline_simulator.h's pipeline_message_groups which).

Everything a backward pass needs from its forward pass is one stage record (llmc/model/gpt2.cuh's
StageActivations). A rank keeps a pool of them, as many as its schedule has microbatches in flight:
m under gpipe, p - r under 1f1b (pipeline_record_assignment says which record each action uses), and a pool
of weight records for the B passes whose W has not run yet (pipeline_weight_record_assignment).
A stage's pieces of the model (embed, blocks, head and loss, and their backward passes) are
llmc/model/forward_backward.cuh's.

The tied embeddings (GPT-2). wte gets a gradient on the first stage (the lookup) and on the last (the LM head).
Under zbv both are on rank 0, which adds the two into its one copy. Otherwise, after the step's data-parallel
reductions, the two are added up over a two-rank group
(pipeline_sum_tied_embedding); both copies then take the same AdamW step and stay equal, and the training matches one rank
(the sum is the same, up to the order of the additions). wpe goes along (the chunk is the unit of
sharding): its gradient on the last stage is 0. The gradient norm counts the first stage's copy only.

Data parallelism and ZeRO work within a stage: each stage's chunks are sharded and reduced over that
stage's gradient group, exactly as without a pipeline (llmc/parallel/zero.h is unchanged but for the chunks it
skips). Tensor parallelism composes too: the pp axis joins the ranks of equal tp rank, each sending its
R = N (N/tp under sequence parallelism) rows.

Point to point, as NCCL guarantees it. NCCL's send and receive block the GPU until the peer arrives, and
operations that must progress together must be in one group: under 1F1B neighbours send to each other at
the same moment (one the activations, the other a gradient), and two lone operations would wait for each
other. So before each action the rank issues one group (llmc/parallel/comm.h's send_and_receive): the receives
this action needs and the sends of earlier results whose receiver is ready for them (pipeline_message_groups in
llmc/parallel/pipeline_simulator.h finds them by playing all ranks' lists, once, in pipeline_create; its checker
proves every schedule's groups free of deadlock under these semantics, and shows that lone operations deadlock
1F1B). The group
completes before the action starts. The CPU build's sends are synchronous (MPI_Issend) so the tests see
NCCL's semantics at every message size.

One communicator for every message: the pp axis. NCCL runs a group that spans several communicators as one
kernel per communicator, one after another on the stream, in an order it chooses (its user guide, "Using
multiple NCCL communicators concurrently"; NVIDIA/nccl #1347 is such a deadlock), and the CPU build does the
same (llmc/parallel/cpu_nccl_rules.h, LLMC_CPU_GROUP_ORDER). With a communicator per neighbour link, as this project once
had, a middle rank's group holds operations on two links, and which link's kernel runs first decides whether
the ranks' groups meet. dev/test/test_pipeline.cu plays every schedule's groups with each message on its old
link (pipeline_check_message_groups, p = 2..8) under three orders: interleaved deadlocks under an order both
ends agree on (28 of its 104 layouts, the wrap-around link closing a cycle), interleaved and zbv under orders
each rank picks for itself (54 and all 56); gpipe, 1f1b and zb-h1 survive these three. The CPU build showed
it too: interleaved at pp 3, m 3, V 2 on per-link communicators (LLMC_FAULT_PER_LINK_P2P) hung under
LLMC_CPU_GROUP_ORDER=hash and ran under reverse (the communicators' identities decide which order is which). On the one communicator each group is one kernel and the order
question does not arise. NCCL's point to point works on
any communicator; the price is that messages between two ranks now share one channel per direction, paired
in the order they are posted. zbv's two chunks both cross each neighbour pair, both ways: rank r sends r+1
chunk 0's activations and chunk 1's gradients, which r+1 receives in its own action order. So
pipeline_message_groups posts a rank's sends to each peer in the order the peer receives them (holding a send
back, if need be, to the group of the one the peer takes before it), and pipeline_match_messages checks, for
every schedule, that the k-th message posted from a to b is the k-th that b receives from a.
For the watchdog each neighbour pair is still a named group ("pp link r-(r+1)", the axis' members), so a
stalled exchange is reported as a wait on that link for that peer, and the axis' own arrival counts stay those
of its collectives (the loss's broadcast, the norm's sum).

Bytes this rank sends per step on the pp axis, for a = B T C activation elements per message (B T C / tp
under sequence parallelism), s bytes per element, and this rank's V stages:
    activations   m a s for each of its stages whose next stage is on another rank (not the last, S-1)
    gradients     m a s for each of its stages whose previous stage is on another rank (not the first, 0)
    tied wte      e s on the first and the last stage's ranks, when they differ, e = the embedding chunk's
                  gradient this rank holds: the whole chunk at ZeRO-0, its shard at ZeRO >= 1 (a two-rank
                  all-reduce sends half of it twice)
    loss, norm    4 (p-1)/p and 8 (p-1)/p bytes (rounded down): the loss broadcast from the last stage and
                  the all-reduce of the squared gradient norm
(pipeline_bytes_per_step)

Measuring a step and writing its Chrome trace: llmc/parallel/pipeline_timeline.h.

This file is read top to bottom, and compiled in two halves. The first (the Pipeline, the stage split, creation,
the links) is what llmc/parallel/parallel_context.h needs to hold a Pipeline; the second (the executor) runs the
model's stage passes (llmc/model/forward_backward.cuh), which take that parallel context. C++ needs the struct
before the context and the context before the executor, so the second half compiles where this file is
included after parallel_context.h has been read to its end (train_gpt.cu includes both).
*/
#ifndef LLMC_PARALLEL_PIPELINE_H
#define LLMC_PARALLEL_PIPELINE_H

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>
#include "../utils.h"
#include "../cpu/faults.h"
#include "comm.h"
#include "mesh.h"
#include "layout.h"
#include "../model/gpt2.cuh"
#include "pipeline_schedule.h"
#include "pipeline_simulator.h"

// One play of the schedule for m microbatches (pipeline_create plays every rank's lists once per m): this rank's
// actions, the group of messages before each, and the records, outboxes and head records each action uses.
struct PipelinePlay {
    int microbatches = 1;                   // m
    std::vector<PipelineAction> actions;    // this rank's, in order
    std::vector<std::vector<PipelineMessage>> messages;  // per action, and one more after the last: the group
                                                         // of sends and receives issued before it
    std::vector<int> record_of;             // per action: the stage record it uses
    std::vector<int> weight_record_of;      // per action: the weight record it uses (-1: none)
    std::vector<int> outbox_of;             // per action: the outbox its gradient is copied to (-1: none)
    std::vector<int> head_of;               // per action: the head record it uses (-1: none)
    int records = 1, weight_records = 0, heads = 0, outboxes = 0;  // what it needs of each pool
};

struct Pipeline {
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;
    int size = 1, rank = 0;                 // p, and this rank's place on the pp axis
    int virtual_stages = 1;                 // V
    int microbatches = 1;                   // m of the step being run (a batch ramp changes it between steps)
    std::vector<int> stage_layers;          // layers of each of the p V model stages
    int last_stage_rank = 0;                // the rank of the last model stage: the loss
    std::vector<PipelinePlay> plays;        // one per microbatch count of the run (one without a batch ramp)
    size_t play = 0;                        // the one of `microbatches`
    int records = 1, weight_records = 0;    // the pools' sizes: the most any play needs
    int heads = 0;
    int outboxes = 0;
    // validation's and sampling's pass: one microbatch forward through this rank's stages, on record 0
    std::vector<PipelineAction> forward_only_actions;
    std::vector<std::vector<PipelineMessage>> forward_only_messages;
    Communicator* group = nullptr;          // the pp axis: the messages, the loss's broadcast, the norm's sum
    std::vector<int> link_watch;            // per neighbour pair (q, q+1 mod p): its name for the watchdog
    std::vector<Communicator> fault_links;  // LLMC_FAULT_PER_LINK_P2P only: per (chunk, pair), this rank's pairs
    bool tied_head = true;                  // the LM head is wte (GPT-2): the last stage holds a copy of it
    Communicator tied;                      // the first and the last stage's ranks, if two: wte's gradient
    // the step being measured
    bool measuring = false;
    std::chrono::steady_clock::time_point origin;
    std::vector<PipelineEvent> events;      // this rank's actions and waits
    // every pp rank's books as the step holds them and when its timeline is collected (pipeline_timeline.h)
    std::vector<uint64_t> memory, memory_collected;
    double collected_ms = 0;
};

inline int pipeline_stage_count(const Pipeline& pipe) { return pipe.size * pipe.virtual_stages; }

// The watchdog's group for a message to or from neighbour `peer`: the link of the pair.
inline int pipeline_link_watch(const Pipeline& pipe, int peer) {
    const int p = pipe.size, r = pipe.rank;
    if (peer == (r + 1) % p) return pipe.link_watch.at(p == 2 ? 0 : r);
    if (peer == (r + p - 1) % p) return pipe.link_watch.at(p == 2 ? 0 : (r + p - 1) % p);
    fatal("pipeline: rank %d has no link to rank %d", r, peer);
}

// The send or receive of a message, `count` elements at `data`: on the pp axis, or under LLMC_FAULT_PER_LINK_P2P
// on the communicator of its pair and chunk (the old structure, which the fault's test sees deadlock).
inline PointToPoint pipeline_point_to_point(Pipeline& pipe, const PipelineMessage& message, floatX* data,
                                            size_t count) {
    const PointToPoint::Kind kind = message.send ? PointToPoint::Send : PointToPoint::Receive;
    const int watch = pipeline_link_watch(pipe, message.peer);
    if (pipe.fault_links.empty()) return PointToPoint{kind, pipe.group, data, count, message.peer, watch};
    const int p = pipe.size, pairs = (int)pipe.link_watch.size();
    const int pair = p == 2 ? 0 : message.peer == (pipe.rank + 1) % p ? pipe.rank : message.peer;
    const int chunk = pipe.schedule == PipelineSchedule::ZeroBubbleV && message.from_stage >= p ? 1 : 0;
    Communicator& link = pipe.fault_links.at(chunk * pairs + pair);
    return PointToPoint{kind, &link, data, count, 1 - link.rank, link.watch};
}

// ----------------------------------------------------------------------------
// the stage split: how many consecutive layers each model stage holds

/*
The balanced split of L layers over S model stages. Stages are contiguous runs of layers, each >= 1. A stage's
cost is its layer count, plus first_stage_extra on stage 0 (the embedding) and last_stage_extra on stage S-1
(the LM head and loss), both in layer-equivalents of cost. The split minimises the most expensive stage:
  M = the least bound for which the capacities c_s = floor(M - extra_s) are all >= 1 and sum to at least L
  (M is some k + 0, k + first or k + last (+ both when S = 1), so the candidates are searched in order);
  every stage starts at its capacity, and the surplus is then taken away one layer at a time from the stage
  of the highest cost that still has more than one layer (ties: the highest stage index), which spreads the
  rest evenly and is deterministic.
Example: L = 8, S = 4, last extra 3: M = 4 (capacities 4, 4, 4, 1 sum to 13), the 5 surplus layers leave
stages 2, 1, 0, 2, 1 in turn: {3, 2, 2, 1}, costs 3, 2, 2, 4.
*/
inline std::vector<int> pipeline_balanced_layers(int L, int S, double first_stage_extra, double last_stage_extra) {
    std::vector<double> extra(S, 0.0);
    extra[0] += first_stage_extra;
    extra[S - 1] += last_stage_extra;
    std::vector<double> candidates;
    for (int k = 1; k <= L; k++)
        for (double e : {0.0, first_stage_extra, last_stage_extra, first_stage_extra + last_stage_extra})
            candidates.push_back(k + e);
    std::sort(candidates.begin(), candidates.end());
    constexpr double kSlack = 1e-9;  // a bound equal to k + extra must admit k layers despite rounding
    std::vector<int> layers(S, 0);
    for (double bound : candidates) {
        long long total = 0;
        bool every_stage_fits = true;
        for (int s = 0; s < S; s++) {
            layers[s] = (int)std::floor(bound - extra[s] + kSlack);
            if (layers[s] < 1) every_stage_fits = false;
            total += layers[s];
        }
        if (every_stage_fits && total >= L) break;
    }
    long long surplus = -(long long)L;
    for (int n : layers) surplus += n;
    for (; surplus > 0; surplus--) {
        int take = -1;
        for (int s = 0; s < S; s++)
            if (layers[s] > 1 && (take < 0 || layers[s] + extra[s] >= layers[take] + extra[take])) take = s;
        layers[take]--;
    }
    return layers;
}

/*
The balanced split for zbv's V, where rank r runs stages r and 2p - 1 - r, and rank 0 holds the LM head (stage
2p - 1) as well as the embedding (stage 0). What a rank costs is the sum of its two stages, so the ranks are
balanced, not the stages: balancing the 2p stages one by one would give rank 0 a full first stage on top of the
head. The ranks' layer counts are the balanced split of L over p with rank 0's extra the head's (each rank
holds at least two layers: one layer of each is set aside, which shifts every rank's cost alike and leaves the
balance unchanged). A rank's layers then go to its two stages as evenly as their costs allow: the stage
coming back up (the head's, on rank 0) gets floor((n - extra) / 2), at least 1, the stage going down the rest.
Example: L = 32, p = 4, head 8.2: ranks {2, 10, 10, 10} (rank 0: 2 + 8.2), stages {1, 5, 5, 5, 5, 5, 5, 1}.
*/
inline std::vector<int> pipeline_balanced_v_layers(int L, int p, double head_extra) {
    if (L < 2 * p) fatal("%d layers cannot be cut into the %d stages of zbv at pp %d", L, 2 * p, p);
    std::vector<int> rank_layers = pipeline_balanced_layers(L - p, p, head_extra, 0.0);
    std::vector<int> stages(2 * p, 0);
    for (int r = 0; r < p; r++) {
        const int n = rank_layers[r] + 1;
        const double extra = r == 0 ? head_extra : 0.0;
        const int up = std::min(n - 1, std::max(1, (int)std::floor((n - extra) / 2)));
        stages[2 * p - 1 - r] = up;
        stages[r] = n - up;
    }
    return stages;
}

/*
The layers of each of the S = pp V model stages. A given --pp-layers list is checked (count S, each >= 1, sum L).
Auto balances the compute: FLOPs per token, forward + backward (the backward twice the forward):
  one block:        6 W for the four matmuls' W weights (GPT-2: 12 C^2, so 72 C^2; Llama: C (C + 2k) + C^2 + 3 C H
                    with k = C kv_heads / heads the channels of K and of V, H the SwiGLU's hidden units)
                    + 12 C T (attention's scores and mixing)
  LM head + loss:   6 C Vp (the LM head's matmul, tied or not) + 10 Vp (softmax, loss and their gradient, a few
                    per logit)
  embedding lookup: ~0 (a gather and a scatter-add of C values per token)
so the first stage's extra is 0 and the last's is head / block in layer-equivalents (zbv: the ranks' totals
balanced, pipeline_balanced_v_layers). Memory is not balanced:
the planner reports each stage's (the first stage holds the most activation records under 1f1b).
*/
// The FLOP counts above, per token of a sequence of T. A mixture of experts' MLP weighs as much as what a token
// meets: the shared experts, its K routed ones and the router (E x C). With a mixture every N blocks, a block
// weighs the blocks' mean (the split counts blocks as equals).
inline double pipeline_block_flops_per_token(const GPT2Config& config, int T) {
    const double C = config.channels;
    double weights = 0;
    for (int layer = 0; layer < config.num_layers; layer++) {
        const GPT2Config b = config.block(layer);
        weights += C * b.qkv_channels() + C * C + C * b.fc_channels() + (double)b.hidden() * C;
        if (b.moe())
            weights += (double)b.experts_per_token * C * (b.expert_fc_channels() + b.expert_hidden()) + (double)b.experts * C;
    }
    return 6 * weights / config.num_layers + 12 * C * T;
}
inline double pipeline_head_flops_per_token(const GPT2Config& config) {
    const double C = config.channels, Vp = config.padded_vocab_size;
    return 6 * C * Vp + 10 * Vp;
}

// Why a list of layers per stage cannot be the split of L layers into S stages ("": it can).
inline std::string pipeline_split_error(const std::vector<int>& stage_layers, int L, int S) {
    if ((int)stage_layers.size() != S)
        return "--pp-layers lists " + std::to_string(stage_layers.size()) + " stages, the pipeline has " +
               std::to_string(S) + " (pp x virtual stages per rank)";
    int sum = 0;
    for (size_t s = 0; s < stage_layers.size(); s++) {
        if (stage_layers[s] < 1) return "--pp-layers gives stage " + std::to_string(s) + " no layers";
        sum += stage_layers[s];
    }
    if (sum != L) return "--pp-layers adds up to " + std::to_string(sum) + " layers, the model has " + std::to_string(L);
    return "";
}

inline std::vector<int> pipeline_stage_split(const GPT2Config& config, const Layout& l) {
    const int L = config.num_layers, S = l.pp * l.pp_virtual;
    if (L < S) fatal("%d layers cannot be cut into %d stages (pp %d x %d per rank) of at least one layer", L, S, l.pp,
                     l.pp_virtual);
    if (l.pp_layers.empty()) {
        const double head = pipeline_head_flops_per_token(config) / pipeline_block_flops_per_token(config, l.seq_len);
        if (l.schedule == PipelineSchedule::ZeroBubbleV) return pipeline_balanced_v_layers(L, l.pp, head);
        return pipeline_balanced_layers(L, S, 0.0, head);
    }
    const std::string error = pipeline_split_error(l.pp_layers, L, S);
    if (!error.empty()) fatal("%s", error.c_str());
    return l.pp_layers;
}

// The part of the model pipeline rank `rank` runs (llmc/model/gpt2.cuh): its chunks, the most layers of any of
// its stages (its records are sized for that stage), as many stage, weight and head records as its schedule
// has passes in flight, and `outboxes`, as many as its sends hold at once (pipeline_outboxes of its groups, from
// the one play of every rank's lists: pipeline_all_groups).
inline ModelPart pipeline_model_part(PipelineSchedule schedule, int rank, int p, int V, int m,
                                     const std::vector<int>& stage_layers, bool tied_head, int outboxes) {
    ModelPart part;
    part.outboxes = outboxes;
    part.held_chunks = pipeline_held_chunks(schedule, rank, p, V, stage_layers, tied_head);
    for (int v = 0; v < V; v++) {
        const int stage = pipeline_model_stage(schedule, rank, v, p);
        part.stage_layers = std::max(part.stage_layers, stage_layers[stage]);
        part.stage_first_layers.push_back(pipeline_first_layer(stage_layers, stage));
        part.stage_sizes.push_back(stage_layers[stage]);
    }
    part.records = pipeline_peak_activations(schedule, rank, p, m, V);
    part.weight_records = pipeline_peak_weight_records(schedule, rank, p, m, V);
    part.heads = std::max(1, pipeline_peak_head_records(schedule, rank, p, m, V));  // 1: unused off the last stage
    return part;
}

// This rank's play of the schedule for m microbatches, every rank's lists played once: the message groups
// (checked free of deadlock), the records, weight records, head records and outboxes each action uses (checked
// against the formulas, which size the model's pools).
inline PipelinePlay pipeline_play(PipelineSchedule schedule, int r, int p, int V, int m) {
    PipelinePlay play;
    play.microbatches = m;
    play.actions = pipeline_actions(schedule, r, p, m, V);
    const std::vector<std::vector<std::vector<PipelineMessage>>> groups = pipeline_all_groups(schedule, p, V, m);
    const std::string stuck = pipeline_check_message_groups(groups);
    if (!stuck.empty()) fatal("pipeline %s: its sends and receives cannot run: %s", pipeline_schedule_name(schedule),
                              stuck.c_str());
    play.messages = groups[r];
    play.outboxes = pipeline_outboxes(play.messages);
    play.outbox_of.assign(play.actions.size(), -1);
    for (const std::vector<PipelineMessage>& group : play.messages)
        for (const PipelineMessage& message : group)
            if (message.send && message.outbox >= 0) play.outbox_of[message.action] = message.outbox;
    play.record_of = pipeline_record_assignment(play.actions, &play.records);
    const std::string late = pipeline_check_send_buffers(play.actions, play.messages, play.record_of, schedule, r, p, V);
    if (!late.empty()) fatal("pipeline %s: %s", pipeline_schedule_name(schedule), late.c_str());
    play.weight_record_of = pipeline_weight_record_assignment(play.actions, &play.weight_records);
    play.head_of = pipeline_head_assignment(play.actions, schedule, r, p, V, &play.heads);
    if (play.records != pipeline_peak_activations(schedule, r, p, m, V) ||
        play.weight_records != pipeline_peak_weight_records(schedule, r, p, m, V) ||
        play.heads != pipeline_peak_head_records(schedule, r, p, m, V))
        fatal("pipeline %s: the actions need %d records, %d weight records and %d head records, the formulas say "
              "%d, %d and %d", pipeline_schedule_name(schedule), play.records, play.weight_records, play.heads,
              pipeline_peak_activations(schedule, r, p, m, V), pipeline_peak_weight_records(schedule, r, p, m, V),
              pipeline_peak_head_records(schedule, r, p, m, V));
    return play;
}

// The steps that follow run m microbatches: the play of m (pipeline_create made one for every m of the run).
inline void pipeline_use_microbatches(Pipeline& pipe, int m) {
    for (size_t i = 0; i < pipe.plays.size(); i++)
        if (pipe.plays[i].microbatches == m) {
            pipe.play = i;
            pipe.microbatches = m;
            return;
        }
    fatal("pipeline: no schedule was played for %d microbatches", m);
}

// Every rank calls this together (the tied embeddings' group is a split of the pp axis). `microbatch_counts`:
// every m the run's steps use (a batch ramp's phases), the first the one the run starts with; the pools are
// sized for the most any of them needs.
inline void pipeline_create(Pipeline& pipe, Mesh& mesh, PipelineSchedule schedule, int V,
                            const std::vector<int>& microbatch_counts, const std::vector<int>& stage_layers,
                            bool tied_head) {
    pipe.schedule = schedule;
    pipe.tied_head = tied_head;
    pipe.size = mesh.layout.sizes[PP];
    pipe.rank = mesh.coords[PP];
    pipe.virtual_stages = V;
    pipe.stage_layers = stage_layers;
    const int p = pipe.size, r = pipe.rank, S = p * V;
    pipe.last_stage_rank = pipeline_stage_rank(schedule, S - 1, p);
    for (int m : microbatch_counts) {
        bool played = false;
        for (const PipelinePlay& play : pipe.plays) played = played || play.microbatches == m;
        if (played) continue;
        pipe.plays.push_back(pipeline_play(schedule, r, p, V, m));
        const PipelinePlay& play = pipe.plays.back();
        pipe.records = std::max(pipe.records, play.records);
        pipe.weight_records = std::max(pipe.weight_records, play.weight_records);
        pipe.heads = std::max(pipe.heads, play.heads);
        pipe.outboxes = std::max(pipe.outboxes, play.outboxes);
    }
    pipeline_use_microbatches(pipe, microbatch_counts.at(0));
    // the forward-only pass's lists, played once too
    for (int v = 0; v < V; v++) pipe.forward_only_actions.push_back({PipelineAction::Forward, 0, v});
    const std::vector<std::vector<PipelineAction>> forward_only_lists(p, pipe.forward_only_actions);  // every rank's
    pipe.forward_only_messages = pipeline_message_groups(forward_only_lists, schedule, V)[r];
    // every stage runs on record 0: each output must leave before the next stage here overwrites it
    for (size_t g = 0; g < pipe.forward_only_messages.size(); g++)
        for (const PipelineMessage& message : pipe.forward_only_messages[g])
            if (message.send && g != (size_t)message.action + 1)
                fatal("pipeline: the forward-only pass would send stage %d's output late", message.from_stage);
    pipe.group = &mesh.axis[PP];
    if (p > 1) {
        // the watchdog's name for each neighbour pair (q, q+1), the wrap-around (p-1, 0) only where a schedule
        // sends across it (interleaved); with p = 2 it is the pair (0, 1) again. Every rank registers them
        // in the same order, so equal links get equal indices.
        const int pairs = p == 2 ? 1 : schedule == PipelineSchedule::Interleaved ? p : p - 1;
        const std::vector<int> members = watched_members(mesh.axis[PP].watch);
        for (int q = 0; q < pairs; q++)
            pipe.link_watch.push_back(
                watched_group("pp link " + std::to_string(q) + "-" + std::to_string((q + 1) % p), members));
        if (fault_per_link_point_to_point()) {
            const int chunks = schedule == PipelineSchedule::ZeroBubbleV ? 2 : 1;
            pipe.fault_links.resize(chunks * pairs);
            for (int c = 0; c < chunks; c++)
                for (int q = 0; q < pairs; q++) {
                    const bool member = r == q || r == (q + 1) % p;
                    pipe.fault_links[c * pairs + q] =
                        comm_split(mesh.axis[PP], member ? 0 : kNotInGroup, r,
                                   "pp link " + std::to_string(q) + "-" + std::to_string((q + 1) % p) + " chunk " +
                                       std::to_string(c));
                }
        }
        // zbv holds the first and the last stage on rank 0: one copy of wte, nothing to add up; an untied head
        // leaves wte on the first stage alone
        const bool holds_wte = tied_head && pipe.last_stage_rank != 0 && (r == 0 || r == pipe.last_stage_rank);
        pipe.tied = comm_split(mesh.axis[PP], holds_wte ? 0 : kNotInGroup, r, "pp first and last stage");
    }
}

inline void pipeline_free(Pipeline& pipe) {
    for (Communicator& link : pipe.fault_links) comm_destroy(link);
    comm_destroy(pipe.tied);
    pipe = Pipeline{};
}

// bytes sent over the pipeline's own group, the tied embeddings' (the messages travel on the pp axis, which
// counts with the mesh's groups)
inline uint64_t pipeline_link_bytes(const Pipeline& pipe) { return pipe.tied.bytes_sent; }
inline void pipeline_reset_bytes(Pipeline& pipe) { pipe.tied.bytes_sent = 0; }

// The loss (or anything in a device float) from the last stage's rank to the others of the pp axis.
inline void pipeline_share_from_last_stage(Pipeline& pipe, float* value, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast(*pipe.group, value, count, pipe.last_stage_rank, stream);
}

// Host values on the last stage's rank become the same on every rank of the pp axis (a collective).
template <typename T>
void pipeline_share_host_from_last_stage(Pipeline& pipe, T* values, size_t count, cudaStream_t stream) {
    if (pipe.size > 1) broadcast_host(*pipe.group, values, count, pipe.last_stage_rank, stream);
}

// One number from every rank of the pp axis, on all of them (a collective): for reports per stage.
inline std::vector<float> pipeline_gather_values(Pipeline& pipe, float value, cudaStream_t stream) {
    return pipe.size == 1 ? std::vector<float>{value} : gather_values(*pipe.group, value, stream);
}

// ----------------------------------------------------------------------------
// the bytes formula (see the top of the file)

inline double pipeline_bytes_per_step(PipelineSchedule schedule, int rank, int p, int V, int m,
                                      double activation_elements, double element_bytes,
                                      double embedding_gradient_elements) {
    if (p == 1) return 0.0;
    const int S = p * V, last_stage_rank = pipeline_stage_rank(schedule, S - 1, p);
    const double message = m * activation_elements * element_bytes;
    double bytes = 0;
    for (int v = 0; v < V; v++) {
        const int s = pipeline_model_stage(schedule, rank, v, p);
        if (s < S - 1 && pipeline_stage_rank(schedule, s + 1, p) != rank) bytes += message;
        if (s > 0 && pipeline_stage_rank(schedule, s - 1, p) != rank) bytes += message;
    }
    if (last_stage_rank != 0 && (rank == 0 || rank == last_stage_rank))
        bytes += embedding_gradient_elements * element_bytes;
    bytes += (double)ring_share(sizeof(float), p) + (double)ring_share(sizeof(float), p, 2);
    return bytes;
}

#endif  // the first half

// ----------------------------------------------------------------------------
// running a schedule

// (the second half: see the top of the file)

#if defined(LLMC_PARALLEL_CONTEXT_READ) && !defined(LLMC_PARALLEL_PIPELINE_EXECUTOR)
#define LLMC_PARALLEL_PIPELINE_EXECUTOR

#include "parallel_context.h"
#include "../model/forward_backward.cuh"
#include "pipeline_timeline.h"

inline int pipeline_model_stage(const Pipeline& pipe, const PipelineAction& a) {
    return pipeline_model_stage(pipe.schedule, pipe.rank, a.virtual_stage, pipe.size);
}
// Whether model stage s's neighbour s - 1 is on this rank too: then activations and gradients pass between the
// two in memory.
inline bool pipeline_previous_stage_here(const Pipeline& pipe, int s) {
    return s > 0 && pipeline_stage_rank(pipe.schedule, s - 1, pipe.size) == pipe.rank;
}

// The actions a list runs and the records and messages that go with them: a training step's schedule, or
// the forward passes of one microbatch through this rank's stages (validation, sampling).
struct PipelineRun {
    const std::vector<PipelineAction>& actions;
    const std::vector<std::vector<PipelineMessage>>& messages;
    const std::vector<int>& record_of;
    const std::vector<int>& weight_record_of;
    const std::vector<int>& outbox_of;  // the outbox a backward copies its input gradient to (-1: none)
    const std::vector<int>& head_of;    // the head record an action of the last stage uses (-1: none)
};

// Whether action i is the last action of its microbatch, in its list, to add to wte's gradient: stage 0's B
// (the lookup), or on the last stage the action that runs a tied LM head's weight gradient (its F, or its W
// under a split backward). Under zbv one rank holds both stages and either may come last; the embedding
// chunk's gradient for that microbatch is done after it (ZeRO-2 and 3 reduce it every microbatch).
inline bool pipeline_adds_last_to_embeddings(const Pipeline& pipe, const PipelineRun& run, size_t i) {
    const int S = pipeline_stage_count(pipe);
    const PipelineAction::Kind head_weights =
        pipeline_splits_backward(pipe.schedule) ? PipelineAction::Weights : PipelineAction::Forward;
    for (size_t j = run.actions.size(); j-- > 0;) {
        const PipelineAction& a = run.actions[j];
        const int s = pipeline_model_stage(pipe, a);
        if (a.microbatch != run.actions[i].microbatch) continue;
        if ((s == 0 && a.kind == PipelineAction::Backward) || (s == S - 1 && a.kind == head_weights && pipe.tied_head))
            return j == i;
    }
    return false;
}

// The record that the forward of (microbatch, model stage) uses in a run: where a stage on this rank hands its
// output over to the next stage here, and takes that stage's input gradient back. That forward ran before the
// next stage's, and its record lives until its own backward, after the next stage's.
inline StageActivations& pipeline_record_of_forward(const Pipeline& pipe, GPT2& model, const PipelineRun& run,
                                                    int microbatch, int stage) {
    for (size_t i = 0; i < run.actions.size(); i++) {
        const PipelineAction& a = run.actions[i];
        if (a.kind == PipelineAction::Forward && a.microbatch == microbatch && pipeline_model_stage(pipe, a) == stage)
            return model.records[run.record_of[i]];
    }
    fatal("pipeline: no forward of microbatch %d on stage %d here", microbatch, stage);
}

// The group of sends and receives before action i (i = the list's length: after the last action). A send
// carries a result of an earlier action (a stage's output from its record, or the gradient of its input, which
// the backward pass leaves in the record's doutput, or in an outbox when the send waits past the record's next
// use); a receive fills what action i needs (its record's input, or the gradient of its output into doutput).
inline void pipeline_exchange(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
    auto operation = [&](const PipelineMessage& message) {
        StageActivations& record = model.records[run.record_of[message.action]];
        floatX* data = message.outbox >= 0 ? model.outboxes[message.outbox]
                       : message.gradient  ? record.doutput
                       : message.send      ? record.output()
                                           : record.input;
        return pipeline_point_to_point(pipe, message, data, rows);
    };
    if (!run.messages[i].empty()) fault_stall("before-first-p2p", par.world.rank);  // the tests' stalled rank
    if (!fault_ungrouped_point_to_point()) {
        std::vector<PointToPoint> operations;
        for (const PipelineMessage& message : run.messages[i]) operations.push_back(operation(message));
        send_and_receive(operations, model.stream);
        return;
    }
    // the faulty structure: action i-1's results sent at once, then action i's inputs received, one at a time
    for (const std::vector<PipelineMessage>& group : run.messages)
        for (const PipelineMessage& message : group)
            if (message.send && (size_t)message.action + 1 == i) send_and_receive({operation(message)}, model.stream);
    for (const PipelineMessage& message : run.messages[i])
        if (!message.send) send_and_receive({operation(message)}, model.stream);
}

// One forward pass of microbatch `a` through one of this rank's stages, into its record: the embeddings looked
// up (first stage), the input handed over in memory (the previous stage is here too; received before
// otherwise), the blocks, and on the last stage the head and the loss, into the action's head record. With
// `targets`, when `training`, the loss's gradient replaces the logits, and where the backward is whole the
// head's backward pass follows at once; with targets only the loss is added up (validation); without, the
// logits stay (sampling).
inline void pipeline_forward(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, const int* tokens,
                             const int* targets, float dloss, bool training, int B, int T) {
    Pipeline& pipe = par.pipe;
    const PipelineAction& a = run.actions[i];
    StageActivations& record = model.records[run.record_of[i]];
    const int s = pipeline_model_stage(pipe, a), S = pipeline_stage_count(pipe);
    if (s == 0) {
        gpt2_embed(model, par, record, tokens, B, T);
    } else if (pipeline_previous_stage_here(pipe, s)) {
        const StageActivations& from = pipeline_record_of_forward(pipe, model, run, a.microbatch, s - 1);
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(record.input, from.output(), rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
    }
    gpt2_stage_forward(model, par, record, pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T,
                       /*for_backward=*/training);
    if (s < S - 1) return;
    HeadRecord& head = model.heads[run.head_of[i]];
    gpt2_head_forward(model, par, record, head, B, T);
    if (targets) gpt2_loss(model, par, head, targets, B, T, dloss);
    if (targets && training && !pipeline_splits_backward(pipe.schedule)) {
        gpt2_head_backward(model, par, record, head, B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    }
}

// The backward pass of microbatch `a` through one of this rank's stages, from its record: the whole of it, or
// under a schedule that splits it only the input gradients (B), leaving in the action's weight record what
// the weight gradients (W, pipeline_weights) need; on the last stage under the split, the head's input
// gradient first. The gradient of the stage's input stays in the record's doutput, to be sent, or handed over
// in memory to the previous stage when that is here too.
inline void pipeline_backward(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const PipelineAction& a = run.actions[i];
    StageActivations& record = model.records[run.record_of[i]];
    const int s = pipeline_model_stage(pipe, a), S = pipeline_stage_count(pipe);
    StageWeightRecord* weights = run.weight_record_of[i] >= 0 ? &model.weight_records[run.weight_record_of[i]] : nullptr;
    if (s == S - 1 && pipeline_splits_backward(pipe.schedule))
        gpt2_head_backward(model, par, record, model.heads[run.head_of[i]], B, T, /*weights_later=*/true);
    gpt2_stage_backward(model, par, record, pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T,
                        weights);
    if (s == 0) {
        gpt2_embed_backward(model, par, record, B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    } else if (pipeline_previous_stage_here(pipe, s)) {
        StageActivations& to = pipeline_record_of_forward(pipe, model, run, a.microbatch, s - 1);
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(to.doutput, record.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
    } else if (run.outbox_of[i] >= 0) {  // its send waits past the record's next forward: send a copy
        const size_t rows = tp_rows(par.tp, B * T) * (size_t)model.config.channels;
        cudaCheck(cudaMemcpyAsync(model.outboxes[run.outbox_of[i]], record.doutput, rows * sizeof(floatX),
                                  cudaMemcpyDeviceToDevice, model.stream));
    }
}

// W: the weight gradients of microbatch `a` on one of this rank's stages, from the weight record its B filled
// (on the last stage, the head's share of dwte first, from its head record).
inline void pipeline_weights(ParallelContext& par, GPT2& model, const PipelineRun& run, size_t i, int B, int T) {
    Pipeline& pipe = par.pipe;
    const int s = pipeline_model_stage(pipe, run.actions[i]);
    if (s == pipeline_stage_count(pipe) - 1) {
        gpt2_head_weights(model, par, model.heads[run.head_of[i]], B, T);
        if (pipeline_adds_last_to_embeddings(pipe, run, i)) chunk_gradient_done(model, par, 0);
    }
    gpt2_stage_weights(model, par, model.weight_records[run.weight_record_of[i]],
                       pipeline_first_layer(pipe.stage_layers, s), pipe.stage_layers[s], B, T);
}

// Runs a list: before each action the group of messages it needs (timed as the action's wait), then the action
// (timed as work); after the last, the last sends. tokens and targets: m B T host ids, microbatch after
// microbatch; each microbatch's loss gradient is scaled by dloss.
inline void pipeline_run(ParallelContext& par, GPT2& model, const PipelineRun& run, const int* tokens,
                         const int* targets, float dloss, bool training, int B, int T) {
    Pipeline& pipe = par.pipe;
    const size_t N = (size_t)B * T;
    for (size_t i = 0; i < run.actions.size(); i++) {
        const PipelineAction& a = run.actions[i];
        const double waiting = pipeline_clock(pipe, model);
        pipeline_exchange(par, model, run, i, B, T);
        const double start = pipeline_clock(pipe, model), work_start = pipeline_work_clock(pipe);
        pipeline_note(pipe, a, true, waiting, start);
        zero_begin_microbatch(par.zero, a.microbatch == 0, a.microbatch == pipe.microbatches - 1);
        const int* microbatch_targets = targets ? targets + a.microbatch * N : nullptr;
        switch (a.kind) {
            case PipelineAction::Forward:
                pipeline_forward(par, model, run, i, tokens + a.microbatch * N, microbatch_targets, dloss, training, B, T);
                break;
            case PipelineAction::Backward: pipeline_backward(par, model, run, i, B, T); break;
            case PipelineAction::Weights: pipeline_weights(par, model, run, i, B, T); break;
        }
        const double end = pipeline_clock(pipe, model);
        pipeline_note(pipe, a, false, start, end, work_start < 0 ? -1.0 : pipeline_work_clock(pipe) - work_start);
    }
    pipeline_exchange(par, model, run, run.actions.size(), B, T);
}

// One training step's forward and backward passes: this rank's schedule over m microbatches of B x T tokens
// (the first stage reads the tokens, the last the targets). Gradients accumulate, and llmc/parallel/zero.h
// reduces each chunk's as soon as microbatch m-1 has finished it.
inline void pipeline_step(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B, int T,
                          float dloss) {
    const PipelinePlay& play = par.pipe.plays.at(par.pipe.play);
    pipeline_run(par, model,
                 {play.actions, play.messages, play.record_of, play.weight_record_of, play.outbox_of, play.head_of},
                 tokens, targets, dloss, /*training=*/true, B, T);
}

// The forward pass of one microbatch through every stage, in stage order (validation, sampling), on record 0
// (its actions and messages made in pipeline_create): on the last stage, the loss added up (targets given) or the
// logits left in head record 0.
inline void pipeline_forward_only(ParallelContext& par, GPT2& model, const int* tokens, const int* targets, int B,
                                  int T) {
    const Pipeline& pipe = par.pipe;
    const std::vector<PipelineAction>& actions = pipe.forward_only_actions;
    const std::vector<int> record_of(actions.size(), 0), none(actions.size(), -1);
    pipeline_run(par, model, {actions, pipe.forward_only_messages, record_of, none, none, record_of}, tokens, targets,
                 0.0f, /*training=*/false, B, T);
}

// After the step's gradient reductions (zero_wait_for_gradients): wte's (and wpe's) gradient on the first
// and on the last stage becomes the sum of the two.
inline void pipeline_sum_tied_embedding(ParallelContext& par, GPT2& model) {
    if (par.pipe.tied.size < 2) return;  // one pipeline rank, one rank holding both stages (zbv), or neither
    size_t count = 0;
    floatX* gradient = zero_chunk_gradient(par.zero, model, 0, &count);
    all_reduce(par.pipe.tied, gradient, count, Reduction::Sum, model.stream);
}

#endif  // the second half
