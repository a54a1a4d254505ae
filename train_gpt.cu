/*
Trains GPT-2 or Llama 3 (--arch llama) on one GPU, on many, or on the CPU. Read train_step, then main, as the
story of a run:

    train_step   the step's microbatches forward and backward, in the order of the pipeline schedule (one
                 rank: one after the other; gradients accumulate, and each chunk's gradient is averaged over
                 the data-parallel ranks as soon as the last microbatch has finished it) -> GPT-2's tied
                 embeddings' gradients summed over the first and last stage -> gradient norm -> clip -> AdamW
    main         options -> parallel context (which rank holds which slice on every axis) -> model (this
                 rank's part) -> data -> [resume] -> for each step: [validation loss, sample] train_step, log,
                 [stragglers named], [checkpoint] -> validation, sample, model.bin, memory report

Where each part lives (llmc/):
    io/options.h                   the flags                       parallel/parallel_context.h  every axis
    model/gpt2.cuh                 the model's tensors, files      model/forward_backward.cuh   the passes
    parallel/pipeline.h            the schedule's executor          parallel/zero.h              ZeRO, AdamW
    parallel/reshard.h             checkpoints across layouts       planning/memory.h            memory report

    ./train_gpt_cpu --help
    mpirun -np 4 ./train_gpt_cpu --model custom --batch-size 1 ...   (data parallel: 4 ranks, 1 row each)
    mpirun -np 4 ./train_gpt_cpu ... --cp 2 --zero 1   (2 ranks split each sequence, 2 replicas share ZeRO-1)
    ./train_gpt_cpu --model custom --layers 4 --heads 4 --channels 256 --seq-len 64 --steps 300
    ./train_gpt --model 124M --batch-size 16 --seq-len 1024 --total-batch-size 524288      (a GPU)
    ./train_gpt_cpu --model custom --arch llama --heads 4 --kv-heads 2 --channels 64 ...  (a grouped-query Llama)
    ./train_gpt_cpu --model 1558M --seq-len 1024 --plan-search 64 --gpu-memory 80   (planning: no GPU, no MPI)
*/
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>
#include "llmc/utils.h"
#include "llmc/rand.h"
#include "llmc/io/options.h"
#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/logger.h"
#include "llmc/io/young_daly.h"
#include "llmc/model/gpt2.cuh"
#include "llmc/model/forward_backward.cuh"
#include "llmc/parallel/parallel_context.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/reshard.h"
#include "llmc/parallel/replica_check.h"
#include "llmc/parallel/stragglers.h"
#include "llmc/planning/memory.h"
#include "llmc/planning/mfu.h"
#include "llmc/planning/planner.h"

// The token ids of a step: m microbatches of B x T/cp (this rank's positions of B sequences), one after the
// other, the inputs and the targets (the inputs shifted by one).
struct StepBatch {
    std::vector<int> inputs, targets;
};

// ----------------------------------------------------------------------------
// one training step

// Forward and backward over the step's microbatches, the gradients reduced, clipped, and one AdamW step.
// The host issues the whole step without waiting: the loss and the gradient norm stay on the device until
// the one read, which clipping needs before AdamW.
static StepResults train_step(ParallelContext& par, GPT2& model, const StepBatch& batch, const Options& options,
                              int step, const ComputeClock& clock) {
    const int B = par.layout.batch_size, T = par.T_local, m = par.microbatches;
    zero_begin_step(par.zero, model);                     // no gradient yet
    pipeline_step(par, model, batch.inputs.data(), batch.targets.data(), B, T, step_loss_scale(par));
    fault_point("mid-step", par.world.rank, step + 1);    // the tests' killed rank (llmc/cpu/faults.h)
    straggle_if_injected(par.world.rank, clock);          // the tests' straggler (llmc/cpu/faults.h)
    zero_wait_for_gradients(par.zero, model);             // the data-parallel reductions (which overlapped the
                                                          // backward passes) are done
    pipeline_sum_tied_embedding(par, model);              // wte's gradient on the first and last stage, summed
    mean_loss_on_every_rank(par, model, m);
    gradient_norm(par, model);
    const StepResults results = gpt2_read_results(model);  // the host waits for the device, once
    if (!std::isfinite(results.loss)) fatal("the loss is not finite (%g) at step %d", results.loss, step + 1);
    const float norm = sqrtf(results.grad_norm_squared);
    const float clip_scale = (options.grad_clip > 0.0f && norm > options.grad_clip) ? options.grad_clip / norm : 1.0f;
    zero_optimizer_step(par.zero, model, options.adamw, options.schedule.at(step), step + 1, clip_scale,
                        (uint32_t)mix64((uint64_t)step + 1));
    return results;
}

// The next m batches of the training data, this rank's positions of them (all of them without cp).
static StepBatch next_step_batch(DataLoader& loader, const ParallelContext& par) {
    StepBatch batch;
    for (int micro_step = 0; micro_step < par.microbatches; micro_step++) {
        loader.next_batch();
        const std::vector<int> inputs = cp_local_tokens(par.cp, loader.inputs.data(), loader.B, loader.T);
        const std::vector<int> targets = cp_local_tokens(par.cp, loader.targets.data(), loader.B, loader.T);
        batch.inputs.insert(batch.inputs.end(), inputs.begin(), inputs.end());
        batch.targets.insert(batch.targets.end(), targets.begin(), targets.end());
    }
    return batch;
}

// ----------------------------------------------------------------------------
// validation loss and text samples

// Each data-parallel rank measures its rows of the validation batches, through the pipeline's stages; the
// mean over ranks is the loss.
static float validation_loss(ParallelContext& par, GPT2& model, DataLoader& val_loader, int batches) {
    val_loader.reset();  // the same batches every time, so successive values are comparable
    const int B = val_loader.B, T = val_loader.T;
    for (int i = 0; i < batches; i++) {
        val_loader.next_batch();
        // each cp rank its positions of the rows (all of them without context parallelism)
        const std::vector<int> inputs = cp_local_tokens(par.cp, val_loader.inputs.data(), B, T);
        const std::vector<int> targets = cp_local_tokens(par.cp, val_loader.targets.data(), B, T);
        pipeline_forward_only(par, model, inputs.data(), targets.data(), B, par.T_local);
    }
    mean_loss_on_every_rank(par, model, batches);
    return gpt2_read_results(model).loss;
}

// The logits of the token after `tokens`, all Vp of them, on every rank's host, from one forward pass of the
// whole sequence. Every rank runs it together: the pipeline's stages pass the rows through, and the last stage
// hands the logits to the others. Context parallelism splits the positions into cp x chunks-per-rank chunks,
// and sequence parallelism each cp rank's rows over the tp ranks: the sequence is padded to what they split
// with end-of-text tokens after the last one, which the causal mask keeps from changing its last row's logits.
// A cp rank's rows must divide into its chunks and into tp slices: a multiple of cp x lcm(chunks, tp). The
// allocated max_seq (T/cp) is a multiple of both, so the padding never passes max_seq x cp.
static void logits_of_whole_sequence(ParallelContext& par, GPT2& model, const std::vector<int>& tokens,
                                     int end_of_text, floatX* logits) {
    const ContextParallel& cp = par.cp;
    const int T = (int)tokens.size();
    const int chunks = cp.size > 1 ? cp_chunks_per_rank(cp.split) : 1;
    const int split = cp.size * std::lcm(chunks, par.tp.sequence_parallel ? par.tp.size : 1);
    const int rows = (T + split - 1) / split * split;
    std::vector<int> padded(tokens);
    padded.resize(rows, end_of_text);
    const std::vector<int> mine = cp_local_tokens(cp, padded.data(), 1, rows);
    pipeline_forward_only(par, model, mine.data(), nullptr, 1, rows / cp.size);
    logits_row_on_every_rank(par, model, T - 1, rows, logits);
}

// The same logits from one row's forward pass: the last token at its position, attending over the keys and
// values the earlier tokens' passes left in the cache (llmc/model/gpt2.cuh's KVCache). One row runs whole on
// every cp rank, and without sequence parallelism on the tp ranks (a row does not split); both are set back
// after the pass.
static void logits_from_cache(ParallelContext& par, GPT2& model, const std::vector<int>& tokens, floatX* logits) {
    const bool sequence_parallel = par.tp.sequence_parallel;
    par.tp.sequence_parallel = false;
    model.cache.decoding = true;
    model.cache.position = (int)tokens.size() - 1;
    pipeline_forward_only(par, model, &tokens.back(), nullptr, 1, 1);
    logits_row_on_every_rank(par, model, 0, 1, logits);
    model.cache.decoding = false;
    par.tp.sequence_parallel = sequence_parallel;
}

// Samples `count` tokens after an end-of-text token. Each token is drawn from softmax(logits) with a random
// number from rng, the same on every rank (every rank has the logits), so the ranks' rngs stay the same. With
// `cached`, each token costs one row's forward pass (its keys and values kept for the next ones); without,
// the whole sequence's: the same logits up to the order of the additions, and the same text.
static std::string sample_text(ParallelContext& par, GPT2& model, const Tokenizer& tokenizer, Rng& rng, int count,
                               bool cached) {
    const GPT2Config& c = model.config;
    const int end_of_text = (int)tokenizer.end_of_text, longest = model.max_seq * par.cp.size;
    std::vector<int> tokens = {end_of_text};
    std::vector<floatX> logits(c.padded_vocab_size);
    std::vector<double> probabilities(c.vocab_size);
    if (cached) kv_cache_reserve(model, std::min(count + 1, longest), par.tp.size);
    while ((int)tokens.size() <= count && (int)tokens.size() <= longest) {
        if (cached) logits_from_cache(par, model, tokens, logits.data());
        else logits_of_whole_sequence(par, model, tokens, end_of_text, logits.data());
        double max_logit = -INFINITY, total = 0.0;
        for (int v = 0; v < c.vocab_size; v++) max_logit = std::max(max_logit, (double)(float)logits[v]);
        for (int v = 0; v < c.vocab_size; v++) total += probabilities[v] = exp((float)logits[v] - max_logit);
        double threshold = rng.next_float() * total, cumulative = 0.0;
        int next = c.vocab_size - 1;
        for (int v = 0; v < c.vocab_size; v++) {
            cumulative += probabilities[v];
            if (cumulative > threshold) { next = v; break; }
        }
        tokens.push_back(next);
    }
    return tokenizer_printable(&tokenizer, tokens.data() + 1, tokens.size() - 1);
}

// A mixture of experts' routing over the step just run, on the main rank's log: the losses and the rows per
// (layer, expert) summed over every rank (each rank routed its own rows, each layer on one pipeline stage;
// counts travel as floats, exact below 2^24 per step), the losses then divided by the step's sequences and
// rows. Then the counts start again.
static void log_expert_routing(ParallelContext& par, GPT2& model, Logger& logger, int step) {
    MoETraining& moe = model.moe;
    const Layout& l = par.layout;
    std::vector<float> totals(2);  // the loss sums are already in moe.statistics; the counts join them there
    for (long long count : moe.tokens) totals.push_back((float)count);
    totals.push_back((float)moe.dropped);
    copy_to_device(moe.statistics + 2, totals.data() + 2, totals.size() - 2, model.stream);
    all_reduce(par.world, moe.statistics, totals.size(), Reduction::Sum, model.stream);
    copy_to_host(totals.data(), moe.statistics, totals.size(), model.stream);
    const double sequences = (double)l.batch_size * par.microbatches * par.dp_size, rows = sequences * l.seq_len;
    std::vector<long long> tokens(totals.begin() + 2, totals.end() - 1);
    logger.experts(step, (float)(totals[0] / sequences), (float)(totals[1] / rows), tokens, model.config.experts,
                   (long long)totals.back());
    cudaCheck(cudaMemsetAsync(moe.loss_sums, 0, 2 * sizeof(float), model.stream));
    std::fill(moe.tokens.begin(), moe.tokens.end(), 0);
    moe.dropped = 0;
}

// Every rank's host calls of a step (llmc/io/logger.h's HostCalls), in rank order, for the main rank's log;
// none where the build does not count them. Gathered after the step, so the gather is not in its counts.
static std::vector<HostCalls> host_calls_of_every_rank(ParallelContext& par, const HostCalls& mine, cudaStream_t stream) {
    if (!host_calls_counted) return {};
    std::vector<uint64_t> counts = {(uint64_t)mine.allocations, (uint64_t)mine.frees,
        (uint64_t)mine.device_to_host_copies, (uint64_t)mine.synchronizations, (uint64_t)mine.event_waits,
        (uint64_t)mine.moe_layer_passes};
    // the offloaded optimizer's downloads travel only when there are any (without, the exchange is as it was)
    const bool offload = par.layout.offload_optimizer;
    if (offload) counts.push_back((uint64_t)mine.offload_downloads);
    const std::vector<uint64_t> words = all_gather_words(par.world, counts, stream);
    std::vector<HostCalls> ranks(par.world.size);
    for (int r = 0; r < par.world.size; r++) {
        const uint64_t* w = &words[(size_t)r * counts.size()];
        ranks[r] = HostCalls{(long long)w[0], (long long)w[1], (long long)w[2], (long long)w[3], (long long)w[4],
                             (long long)w[5], offload ? (long long)w[6] : 0};
    }
    return ranks;
}

// ----------------------------------------------------------------------------
// setting up

// The model's shape, from --model: a GPT-2 or Llama 3 size, the custom shape flags, or a model file's header.
static GPT2Config model_config(const Options& o) {
    GPT2Config config;
    if (o.model == "custom") {
        if (o.arch != "gpt2" && o.arch != "llama") fatal("--arch %s: not gpt2 or llama", o.arch.c_str());
        config.num_layers = o.layers;
        config.num_heads = o.heads;
        config.channels = o.channels;
        config.vocab_size = o.vocab_size;
        config.padded_vocab_size = padded_vocab(o.vocab_size);
        config.max_seq_len = o.max_seq_len;
        config = gpt2_shape(config);
        if (o.arch == "llama") {
            config.arch = Arch::Llama;
            if (o.kv_heads > 0) config.kv_heads = o.kv_heads;
            config.ffn_hidden = o.ffn_hidden > 0 ? o.ffn_hidden : 4 * o.channels;
            config.rope_theta = o.rope_theta;
        } else if (o.kv_heads > 0 || o.ffn_hidden > 0) {
            fatal("--kv-heads and --ffn-hidden shape a Llama block: add --arch llama");
        }
        if (o.experts > 0) {
            config.experts = o.experts;
            config.experts_per_token = o.experts_per_token;
            config.shared_experts = o.shared_experts;
            config.moe_every = o.moe_every;
        } else if (o.shared_experts > 0 || o.moe_every != 1) {
            fatal("--shared-experts and --moe-every shape a mixture of experts: add --experts");
        }
        gpt2_validate_config(config, "--model custom");
    } else if (gpt2_config_by_name(o.model, &config) || llama_config_by_name(o.model, &config) ||
               moe_config_by_name(o.model, &config)) {
        gpt2_validate_config(config, "--model " + o.model);
    } else if (file_exists(o.model)) {
        config = gpt2_read_config(o.model);
    } else {
        fatal("--model %s: not a model name (124M, 350M, 774M, 1558M, llama3-8B, llama3-70B, llama3-405B, "
              "mixtral-8x7B-like, deepseek-v3-like, custom) nor an existing model file",
              o.model.c_str());
    }
    return config;
}

// --plan and --plan-search (llmc/planning/planner.h): arithmetic only, any model, any machine.
static int run_planner(const Options& options) {
    const GPT2Config config = model_config(options);
    Layout layout = options.layout;
    layout.ranks = options.plan_ranks > 0 ? options.plan_ranks : options.search_ranks;
    if (options.search_ranks > 0) {
        if (!layout.batch_ramp.phases.empty())
            fatal("--plan-search ranks layouts for one batch: give --total-batch-size (--plan takes a --batch-ramp)");
        print_plan_search(config, plan_search(config, layout, options.hardware), layout, options.hardware,
                          options.plan_top);
        return EXIT_SUCCESS;
    }
    if (layout.batch_ramp.phases.empty()) {
        const LayoutPlan plan = plan_layout(config, layout, options.hardware);
        if (!plan.error.empty()) fatal("%s", plan.error.c_str());
        if (!plan.recompute_choice.error.empty()) fatal("%s", plan.recompute_choice.error.c_str());
        print_layout_plan(config, plan, options.hardware);
        return EXIT_SUCCESS;
    }
    // a batch ramp: the first phase in full, then every phase's line
    std::vector<LayoutPlan> phases;
    for (const BatchPhase& phase : layout.batch_ramp.phases) {
        layout.total_batch_size = phase.tokens;
        phases.push_back(plan_layout(config, layout, options.hardware));
        if (!phases.back().error.empty())
            fatal("--batch-ramp phase %lld:%d: %s", phase.threshold, phase.tokens, phases.back().error.c_str());
    }
    print_layout_plan(config, phases[0], options.hardware);
    print_batch_ramp_plan(layout.batch_ramp, phases);
    return EXIT_SUCCESS;
}

// The whole model's initial parameters (from the model file, or GPT-2's initialisation), as this rank's part
// of them: its pipeline stages' chunks, its tp slices of them.
static std::vector<float> initial_parameters(const Options& options, const GPT2& model) {
    const ParameterLayout whole_model(model.config);
    std::vector<float> values;
    if (file_exists(options.model) && options.model != "custom") {
        values = gpt2_read_parameters(options.model, whole_model);
    } else {
        Rng init_rng = rng_from_seed((uint64_t)options.init_seed);
        values = gpt2_initial_parameters(whole_model, [&] { return init_rng.next_normal(); });
    }
    return parameters_in_layout(whole_model, values, model.layout);
}

static void print_run(const ParallelContext& par, const GPT2& model) {
    const GPT2Config& config = model.config;
    const Layout& l = par.layout;
    printf("train_gpt: %s build on %s\n", PRECISION_NAME, device_properties().name);
    printf("model: %d layers, %d heads, %d channels, vocabulary %d (padded %d), %zu parameters", config.num_layers,
           config.num_heads, config.channels, config.vocab_size, config.padded_vocab_size,
           ParameterLayout(config).num_parameters);
    if (l.tp > 1 || l.pp > 1) printf(", %zu on this rank", model.layout.num_parameters);
    if (config.moe())
        printf("; %d experts (%d per token, %d shared) in %s, %.0f parameters active per token", config.experts,
               config.experts_per_token, config.shared_experts, config.mixture_blocks().c_str(),
               active_parameters(config));
    printf("\n");
    if (l.pp > 1) {
        std::string layers;
        for (int n : par.pipe.stage_layers) layers += (layers.empty() ? "" : ",") + std::to_string(n);
        const std::string weights = par.pipe.weight_records
                                        ? ", " + std::to_string(par.pipe.weight_records) + " weight record(s)" : "";
        const std::string outboxes = par.pipe.outboxes ? ", " + std::to_string(par.pipe.outboxes) + " outbox(es)" : "";
        const std::string heads = par.pipe.heads > 1 ? ", " + std::to_string(par.pipe.heads) + " head records" : "";
        printf("pipeline: %s over %d ranks x %d stage(s), layers per stage %s%s, %d microbatches; %d record(s)%s%s%s "
               "in flight on this rank\n", pipeline_schedule_name(l.schedule), l.pp, par.pipe.virtual_stages,
               layers.c_str(), l.pp_layers.empty() ? " (balanced by cost)" : "", par.microbatches, par.pipe.records,
               weights.c_str(), outboxes.c_str(), heads.c_str());
    }
    printf("batch: %d x %d tokens on each of %d rank(s), %d micro-step(s) per step: %d tokens per step\n",
           l.batch_size, l.seq_len, par.dp_size, par.microbatches, l.total_batch_size);
    if (!batch_ramp_is_fixed(par.ramp)) {
        const int micro_step = l.batch_size * l.seq_len * par.dp_size;
        printf("batch ramp (the learning-rate schedule on the tokens seen):");
        for (size_t k = 0; k < par.ramp.phases.size(); k++)
            printf("%s from %lld tokens seen, %d per step (%d micro-steps)", k ? ";" : "", par.ramp.phases[k].threshold,
                   par.ramp.phases[k].tokens, par.ramp.phases[k].tokens / micro_step);
        printf("\n");
    }
    printf("recompute: %s\n", recompute_describe(l.recompute).c_str());
}

// --checkpoint-every auto: the Young-Daly interval in steps from the first save's seconds and the step after it
// (the first step holds the warm-up), rank 0's measurement told to every rank (each must save at the same steps);
// printed and logged.
int agreed_checkpoint_interval(ParallelContext& par, Logger& logger, double save_seconds, double step_seconds,
                               float mtbf_hours, cudaStream_t stream) {
    const CheckpointInterval interval = young_daly_interval(save_seconds, mtbf_hours, step_seconds);
    uint64_t steps = (uint64_t)interval.steps;
    broadcast_word(par.world, &steps, 0, stream);
    if (par.main_rank) {
        printf("checkpoint interval: Young-Daly sqrt(2 x save %.3f s x MTBF %.0f s) = %.2f s = %d steps of %.3f s\n",
               interval.save_seconds, interval.mtbf_seconds, interval.interval_seconds, interval.steps,
               interval.step_seconds);
        logger.write(JsonLine("checkpoint_interval").number("save_s", interval.save_seconds)
                         .number("mtbf_hours", mtbf_hours).number("step_s", interval.step_seconds)
                         .number("interval_s", interval.interval_seconds).integer("steps", interval.steps));
    }
    return (int)steps;
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    const Options options = parse_options(argc, argv);
    if (options.plan_ranks > 0 || options.search_ranks > 0) return run_planner(options);

    // ---- every rank's place on every axis, and its part of the model
    const GPT2Config config = model_config(options);
    ParallelContext par;
    parallel_create(par, options.layout, config, options.nccl_init_file, options.collective_timeout);
    if (par.layout.recompute.policy == RecomputePolicy::Auto)  // the letters chosen for --gpu-memory
        recompute_auto_for_run(par, config, options.hardware);
    const int B = par.layout.batch_size, T = par.layout.seq_len;
    GPT2 model;
    gpt2_allocate(model, config, B, par.T_local, model_part(par, config));
    model.moe.aux_coefficient = options.moe_aux_loss;
    model.moe.z_coefficient = options.moe_z_loss;
    zero_init(par.zero, par.layout.zero_stage, &par.mesh, model, initial_parameters(options, model), &par.ep,
              par.layout.offload_optimizer);
    if (par.main_rank) print_run(par, model);

    // ---- data: each data-parallel rank reads its own rows of every global batch
    DataLoader train_loader, val_loader;
    train_loader.init(options.train_data, B, T, par.dp_rank, par.dp_size, options.shuffle,
                      (uint64_t)options.data_seed, config.vocab_size);
    if (options.val_every > 0) {
        val_loader.init(options.val_data, B, T, par.dp_rank, par.dp_size, false, 0, config.vocab_size);
        if (val_loader.batches_per_epoch() < (size_t)options.val_batches)
            fatal("--val-batches %d: the validation data holds only %zu batches of %d x %d x %d ranks",
                  options.val_batches, val_loader.batches_per_epoch(), B, T, par.dp_size);
    }
    Tokenizer tokenizer;
    if (options.sample_tokens > 0) tokenizer_init(&tokenizer, options.tokenizer);
    if (par.main_rank)
        printf("data: %zu training tokens in %zu shard(s)\n", train_loader.total_tokens, train_loader.files.size());
    Rng sample_rng = rng_from_seed(1234);

    // ---- resume
    int first_step = 0;
    NoiseScaleState noise;  // the gradient noise scale's moving averages (llmc/noise_scale.h), when measured
    NoiseScaleState* measured_noise = par.layout.noise_scale ? &noise : nullptr;
    if (options.resume) {
        // the newest complete one: a save that a crash interrupted is skipped, with a line that says so
        const long long latest = agreed_latest_checkpoint(par, options.output_dir, model.stream);
        if (latest < 0) fatal("--resume: no complete checkpoint in %s", options.output_dir.c_str());
        const std::string path = checkpoint_path(options.output_dir, latest);
        DataLoaderState data_state;
        first_step = load_checkpoint(path, latest, model, par, &data_state, &sample_rng, measured_noise);
        train_loader.restore(data_state);
        if (par.main_rank) printf("resumed from %s at step %d\n", path.c_str(), first_step);
    }
    Logger logger(options.output_dir, options.resume, par.main_rank);
    auto sample = [&](int step) {
        logger.sample(step, sample_text(par, model, tokenizer, sample_rng, options.sample_tokens, options.sample_cache));
    };
    logger.config(options.flags_json);
    // model FLOPs (llmc/planning/mfu.h) and hardware FLOPs, which count the recomputed forward passes too, per
    // token: each step's are its tokens' (a batch ramp changes them), this rank's share
    logger.run(options.steps, model_flops_per_token(config, T), recompute_extra_flops_per_token(
                   par.layout.recompute, active_block_parameters(config), config.num_layers, config.channels, T),
               par.world.size, peak_flops_per_second(device_properties().name, PRECISION_NAME),
               !batch_ramp_is_fixed(par.ramp));

    // ---- training
    AsyncCheckpoint async_checkpoint;  // --checkpoint-async's save in flight
    int checkpoint_every = options.checkpoint_every, checkpoints_from = 0;  // auto: set after the first save
    double first_save_seconds = -1.0;                                         // auto: measured at the first step
    StragglerWatch stragglers = straggler_watch(options.straggler_factor, options.straggler_steps, par.world.size);
    for (int step = first_step; step < options.steps; step++) {
        watchdog_phase("step", step + 1);  // named by a rank that waits too long (--collective-timeout)
        if (options.val_every > 0 && step % options.val_every == 0)
            logger.val_loss(step, validation_loss(par, model, val_loader, options.val_batches));
        // every rank computes the sample (at ZeRO-3 the forward pass gathers parameters from all ranks); only
        // the main rank's logger prints it
        if (options.sample_tokens > 0 && options.sample_every > 0 && step > first_step && step % options.sample_every == 0)
            sample(step);

        // the batch of this step's phase (llmc/batch_ramp.h): its micro-steps and the pipeline's play
        const int step_tokens = batch_ramp_step_tokens(par.ramp, step);
        parallel_set_step_tokens(par, step_tokens);
        logger.step_tokens(step_tokens);

        const auto start = std::chrono::steady_clock::now();
        const ComputeClock compute;  // the step less its waits (llmc/parallel/stragglers.h)
        parallel_reset_traffic(par);
        const StepBatch batch = next_step_batch(train_loader, par);
        const bool last = step + 1 == options.steps;
        const bool measured = last && (par.pipe.size > 1 || !options.trace.empty());  // the pipeline's bubble
        if (measured) pipeline_begin_measuring(par.pipe, model);
        if (last && par.cp.size > 1) cp_begin_measuring(par.cp);  // each cp rank's attention time
        const HostCalls calls_before = host_calls_so_far();
        const long long moe_passes_before = model.moe.layer_passes, downloads_before = par.zero.offload_downloads;
        const StepResults results = train_step(par, model, batch, options, step, compute);
        HostCalls step_calls = host_calls_since(calls_before);
        step_calls.moe_layer_passes = model.moe.layer_passes - moe_passes_before;
        step_calls.offload_downloads = par.zero.offload_downloads - downloads_before;
        inject_planned_bit_flip(par, model, step + 1);  // the tests' silent corruption (llmc/cpu/faults.h)
        if (options.check_replicas > 0 && (step + 1) % options.check_replicas == 0) check_replicas(par, model, step + 1);
        cudaCheck(cudaDeviceSynchronize());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double compute_seconds = compute.seconds();
        const StepTraffic traffic = parallel_traffic(par);  // (before the counts' gather, which is not the step's)
        logger.step(step + 1, results.loss, options.schedule.at(step), sqrtf(results.grad_norm_squared), seconds,
                    traffic,  // (a measured pipeline timeline waits on its events: not counted)
                    measured ? std::vector<HostCalls>{} : host_calls_of_every_rank(par, step_calls, model.stream));
        if (measured_noise)  // the first microbatch's gradient was the step's / microbatches: squared, x m^2
            logger.noise_scale(noise_scale_update(noise, options.noise_scale_decay, step + 1, (double)B * T,
                                                  par.layout.total_batch_size, results.small_batch_norm_squared *
                                                  (double)par.microbatches * par.microbatches, results.grad_norm_squared));
        straggler_step(stragglers, par.world, compute_seconds, step + 1, logger, model.stream);  // when on
        if (config.moe()) log_expert_routing(par, model, logger, step + 1);
        if (last && par.cp.size > 1) cp_report_attention_balance(par.cp, logger, par.main_rank, model.stream);
        if (measured) pipeline_report_timeline(par, model, logger, options.trace);

        if (checkpoint_every == kCheckpointEveryAuto && first_save_seconds >= 0.0)  // the step after that save
            checkpoint_every = agreed_checkpoint_interval(par, logger, first_save_seconds, seconds, options.mtbf_hours,
                                                          model.stream);
        const bool measure_save = checkpoint_every == kCheckpointEveryAuto;  // (the run's first step)
        if (measure_save || (checkpoint_every > 0 && ((step + 1 - checkpoints_from) % checkpoint_every == 0 || last))) {
            const auto save_start = std::chrono::steady_clock::now();
            if (options.checkpoint_async)
                save_checkpoint_async(async_checkpoint, options.output_dir, step + 1, options.keep_checkpoints, model,
                                      par, train_loader.state(), sample_rng, measured_noise);
            else
                save_checkpoint(options.output_dir, step + 1, options.keep_checkpoints, model, par,
                                train_loader.state(), sample_rng, measured_noise);
            // how long the loop was held (asynchronous: the copy to host memory): the C of the Young-Daly interval
            const double save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
            logger.checkpoint(step + 1, checkpoint_path(options.output_dir, step + 1), 1e3 * save_seconds,
                              options.checkpoint_async);
            if (measure_save) first_save_seconds = save_seconds, checkpoints_from = step + 1;
        }
    }
    async_checkpoint_free(async_checkpoint);  // the last save's files are complete

    // ---- the end: a last validation loss and a sample, the model, the memory held against the formulas
    watchdog_phase("the end of the run");
    if (options.val_every > 0 && first_step < options.steps)
        logger.val_loss(options.steps, validation_loss(par, model, val_loader, options.val_batches));
    if (options.sample_tokens > 0) {
        sample(options.steps);
        tokenizer_free(&tokenizer);
    }
    if (options.save_model) {
        // collectives: the ZeRO-3 gathers, and the stages' and tp ranks' parts put together into the whole model
        const std::vector<float> values = gather_whole_model(whole_model_group(par), par.layout, model.layout,
                                                             zero_parameters(par.zero, model), model.stream);
        const std::string path = options.output_dir + "/model.bin";
        if (par.main_rank) {
            gpt2_save(ParameterLayout(config), values, path);
            printf("wrote %s\n", path.c_str());
        }
    }
    report_memory(par, model, logger);
    train_loader.free();
    if (options.val_every > 0) val_loader.free();
    gpt2_free(model);
    matmul_teardown();
    parallel_destroy(par);
    return EXIT_SUCCESS;
}
