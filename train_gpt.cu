/*
Trains GPT-2. Read main() as the story of a training run:

    flags -> mesh (which rank does what) -> model (from scratch or a model file) -> data -> [resume]
    -> for each step:
        micro-batches: forward -> loss -> backward, in the order of the pipeline schedule (one rank: one
                       micro-batch after the other; gradients accumulate; on the last micro-step each
                       layer's gradient is averaged over the data-parallel ranks as soon as it is final)
        -> tied embeddings summed over the first and last stage -> gradient norm -> clip -> AdamW -> log
        (every N steps: validation loss, a text sample, a checkpoint)

The model and one layer's forward/backward are in llmc/model/gpt2.cuh, the kernels in the other llmc/
headers, the schedule's executor in llmc/parallel/pipeline.h. This file only decides what happens when.

    ./train_gpt_cpu --help
    mpirun -np 4 ./train_gpt_cpu --model custom --batch-size 1 ...   (data parallel: 4 ranks, 1 row each)
    mpirun -np 4 ./train_gpt_cpu ... --cp 2 --zero 1   (2 ranks split each sequence, 2 replicas share ZeRO-1)
    ./train_gpt_cpu --model custom --layers 4 --heads 4 --channels 256 --seq-len 64 --steps 300
    ./train_gpt --model 124M --batch-size 16 --seq-len 1024 --total-batch-size 524288      (a GPU)
    ./train_gpt_cpu --model 1558M --seq-len 1024 --plan-search 64 --gpu-memory 80   (llmc/planning/planner.h: no GPU, no MPI)
*/
#include <chrono>
#include <climits>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>
#include "llmc/utils.h"
#include "llmc/io/flags.h"
#include "llmc/rand.h"
#include "llmc/model/gpt2.cuh"
#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "llmc/schedulers.h"
#include "llmc/io/checkpoint.h"
#include "llmc/io/logger.h"
#include "llmc/planning/mfu.h"
#include "llmc/parallel/comm.h"
#include "llmc/parallel/mesh.h"
#include "llmc/parallel/zero.h"
#include "llmc/parallel/tensor_parallel.h"
#include "llmc/parallel/pipeline.h"
#include "llmc/parallel/context_parallel.h"
#include "llmc/planning/memory.h"
#include "llmc/planning/planner.h"

// ----------------------------------------------------------------------------
// the model's shape, from --model

static GPT2Config config_from_flags(const std::string& model, int layers, int heads, int channels, int vocab_size,
                                    int max_seq_len) {
    GPT2Config config;
    if (model == "custom") {
        config.num_layers = layers;
        config.num_heads = heads;
        config.channels = channels;
        config.vocab_size = vocab_size;
        config.padded_vocab_size = padded_vocab(vocab_size);
        config.max_seq_len = max_seq_len;
        gpt2_validate_config(config, "--model custom");
    } else if (gpt2_config_by_name(model, &config)) {
        gpt2_validate_config(config, "--model " + model);
    } else if (file_exists(model)) {
        config = gpt2_read_config(model);
    } else {
        fatal("--model %s: not a model name (124M, 350M, 774M, 1558M, custom) nor an existing model file",
              model.c_str());
    }
    return config;
}

// B*T*ranks, the tokens of one micro-step on all ranks. It and the row counts derived from it (B*T, passed
// to gpt2_allocate, the kernels and the data loader) are ints: a combination of flags whose product does
// not fit is refused here, before anything is allocated, instead of wrapping around to a wrong size.
static int micro_step_tokens(int batch_size, int seq_len, int ranks) {
    const long long tokens = (long long)batch_size * seq_len * ranks;
    if (tokens > INT_MAX)
        fatal("--batch-size %d x --seq-len %d x %d rank(s) = %lld tokens per micro-step, more than the %d an int "
              "holds: lower --batch-size or --seq-len", batch_size, seq_len, ranks, tokens, INT_MAX);
    return (int)tokens;
}

// ----------------------------------------------------------------------------
// validation loss and text samples

// each data-parallel rank measures its rows of the validation batches, through the pipeline's stages; the
// mean over ranks is the loss
static float validation_loss(Pipeline& pipe, GPT2& model, DataLoader& val_loader, int batches, Zero& zero) {
    val_loader.reset();  // the same batches every time, so successive values are comparable
    const int B = val_loader.B, T = val_loader.T;
    for (int i = 0; i < batches; i++) {
        val_loader.next_batch();
        // each cp rank its positions of the rows (all of them without context parallelism)
        const std::vector<int> inputs = cp_local_tokens(model.cp, val_loader.inputs.data(), B, T);
        const std::vector<int> targets = cp_local_tokens(model.cp, val_loader.targets.data(), B, T);
        pipeline_forward_only(pipe, model, inputs.data(), targets.data(), B, T / model.cp.size);
    }
    gpt2_mean_loss(model, batches);
    average_over_ranks(zero, &model.results->loss, model.stream);
    pipeline_share_from_last_stage(pipe, &model.results->loss, 1, model.stream);
    return gpt2_read_results(model).loss;
}

// Samples `count` tokens after an end-of-text token, one full forward pass per token (simple, not fast:
// there is no key/value cache). Each token is drawn from softmax(logits) with a random number from rng.
// Every rank runs this together: the pipeline's stages pass the tokens through, and the last stage hands
// the logits to the others, so every rank draws the same token (and its rng stays the same).
static std::string sample_text(Pipeline& pipe, GPT2& model, const Tokenizer& tokenizer, Rng& rng, int count) {
    const GPT2Config& c = model.config;
    std::vector<int> tokens = {(int)tokenizer.end_of_text};
    std::vector<floatX> logits_raw(c.padded_vocab_size);
    std::vector<double> probabilities(c.vocab_size);
    const ContextParallel& cp = model.cp;
    while ((int)tokens.size() <= count && (int)tokens.size() <= model.max_seq * cp.size) {
        const int T = (int)tokens.size();
        // context parallelism splits the positions into cp x chunks-per-rank chunks, and sequence parallelism
        // each cp rank's rows over the tp ranks: pad to what they split with end-of-text tokens after the last
        // one, which the causal mask keeps from changing row T-1's logits. A cp rank's rows must divide into
        // its chunks and into tp slices: a multiple of cp x lcm(chunks, tp). The allocated max_seq (T/cp) is a
        // multiple of both, so the padding never passes max_seq x cp.
        const int chunks = cp.size > 1 ? cp_chunks_per_rank(cp.split) : 1;
        const int split = cp.size * std::lcm(chunks, model.tp.sequence_parallel ? model.tp.size : 1);
        const int rows = (T + split - 1) / split * split;
        std::vector<int> padded(tokens);
        padded.resize(rows, (int)tokenizer.end_of_text);
        const std::vector<int> mine = cp_local_tokens(cp, padded.data(), 1, rows);
        pipeline_forward_only(pipe, model, mine.data(), nullptr, 1, rows / cp.size);
        int row = 0;
        const int holder = cp_owner_of_position(cp, T - 1, rows, &row);  // the cp rank with position T-1
        if (model.last_stage && cp.rank == holder)
            tp_gather_logits_row(model.tp, logits_raw.data(), model.logits, row, c.padded_vocab_size, model.stream);
        if (cp.size > 1) broadcast_host(*cp.group, logits_raw.data(), logits_raw.size(), holder, model.stream);
        pipeline_share_host_from_last_stage(pipe, logits_raw.data(), logits_raw.size(), model.stream);
        double max_logit = -INFINITY, total = 0.0;
        for (int v = 0; v < c.vocab_size; v++) max_logit = std::max(max_logit, (double)(float)logits_raw[v]);
        for (int v = 0; v < c.vocab_size; v++) total += probabilities[v] = exp((float)logits_raw[v] - max_logit);
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

// ----------------------------------------------------------------------------
// checkpoints: everything needed to continue bit for bit

// Every rank that holds a shard of the first replica group writes it (llmc/parallel/zero.h); rank 0 then writes the
// main file, which completes the checkpoint. Old checkpoints beyond the newest keep_last are removed.
static void save_checkpoint(const std::string& output_dir, int step, int keep_last, GPT2& model, Zero& optimizer,
                            const Pipeline& pipe, Communicator& world, const DataLoaderState& data,
                            const Rng& sample_rng) {
    const std::string path = checkpoint_path(output_dir, step);
    std::vector<long long> steps = list_checkpoint_steps(output_dir);
    steps.push_back(step);
    std::sort(steps.begin(), steps.end());
    steps.resize(steps.size() > (size_t)keep_last ? steps.size() - keep_last : 0);  // the ones to remove
    const int file = zero_checkpoint_file(optimizer, model);
    if (world.rank != 0 && zero_writes_shard(optimizer) && file > 0) {
        CheckpointWriter writer(shard_path(path, file));
        zero_write_shard(optimizer, model, writer);
        writer.commit();
        for (long long old : steps) remove(shard_path(checkpoint_path(output_dir, old), file).c_str());
    }
    barrier(world, model.stream);  // every shard file is complete before the main file appears
    if (world.rank != 0) return;
    CheckpointWriter writer(path);
    writer.add_value("config", model.config);
    writer.add_value("precision_bytes", (int)sizeof(floatX));
    writer.add_value("step", step);
    writer.add_value("train_data", data);
    writer.add_value("sample_rng", sample_rng);
    writer.add_value("shards", optimizer.shards);
    writer.add_value("tensor_parallel", model.tp.size);
    writer.add_value("pipeline", pipe.size);
    writer.add_value("pipeline_virtual", pipe.virtual_stages);
    zero_write_shard(optimizer, model, writer);
    writer.commit();
    remove_old_checkpoints(output_dir, keep_last);
}

// Restores the model and optimizer, whatever layout the checkpoint was written with; returns its step.
static int load_checkpoint(const std::string& path, GPT2& model, Zero& optimizer, DataLoaderState* data,
                           Rng* sample_rng) {
    CheckpointReader reader(path);
    const GPT2Config saved = reader.read_value<GPT2Config>("config");
    if (memcmp(&saved, &model.config, sizeof(saved)) != 0)
        fatal("%s holds a model of another shape (layers %d, heads %d, channels %d, vocab %d) than --model asks for",
              path.c_str(), saved.num_layers, saved.num_heads, saved.channels, saved.vocab_size);
    if (reader.read_value<int>("precision_bytes") != (int)sizeof(floatX))
        fatal("%s was written by a build of another precision than this %s build", path.c_str(), PRECISION_NAME);
    const int shards = reader.read_value<int>("shards");
    if (shards < 1 || shards > 1 << 20) fatal("%s: implausible shard count %d", path.c_str(), shards);
    const int saved_tp = reader.read_value<int>("tensor_parallel");
    if (saved_tp < 1 || saved_tp > 1 << 12) fatal("%s: implausible tensor-parallel size %d", path.c_str(), saved_tp);
    const int saved_pp = reader.read_value<int>("pipeline"), saved_virtual = reader.read_value<int>("pipeline_virtual");
    if (saved_pp < 1 || saved_virtual < 1 || saved.num_layers % (saved_pp * saved_virtual) != 0)
        fatal("%s: implausible pipeline of %d ranks x %d virtual stages for %d layers", path.c_str(), saved_pp,
              saved_virtual, saved.num_layers);
    zero_read_shards(optimizer, model, path, shards, saved_tp, saved_pp, saved_virtual);
    *data = reader.read_value<DataLoaderState>("train_data");
    *sample_rng = reader.read_value<Rng>("sample_rng");
    return reader.read_value<int>("step");
}

// ----------------------------------------------------------------------------
// pipeline reports

// After the measured step: rank 0 prints each stage's bubble and records in flight beside the formulas, logs
// them, and writes the timeline as a Chrome trace if asked (the gathering is a collective over the pp axis).
static void report_pipeline_timeline(Pipeline& pipe, GPT2& model, Logger& logger, bool main_rank,
                                     const std::string& trace_path) {
    const PipelineTimeline timeline = pipeline_collect_timeline(pipe, model);
    if (!main_rank) return;
    pipeline_print_timeline(timeline, pipe.schedule);
    std::string bubbles, peaks;
    for (int r = 0; r < pipe.size; r++) {
        bubbles += (r ? ", " : "") + std::to_string(timeline.bubble_fraction[r]);
        peaks += (r ? ", " : "") + std::to_string(timeline.peak_activations[r]);
    }
    logger.write(JsonLine("pipeline").text("schedule", timeline.schedule).integer("pp", pipe.size)
                     .integer("microbatches", pipe.microbatches).integer("virtual_stages", pipe.virtual_stages)
                     .number("step_ms", timeline.step_ms).raw("bubble", "[" + bubbles + "]")
                     .number("bubble_formula", pipeline_bubble_fraction(pipe.schedule, pipe.size, pipe.microbatches,
                                                                        pipe.virtual_stages))
                     .raw("peak_records", "[" + peaks + "]"));
    if (!trace_path.empty()) {
        write_text_file(trace_path, pipeline_chrome_trace(timeline));
        printf("wrote %s\n", trace_path.c_str());
    }
}

// After the last step under context parallelism: each cp rank's time in its attention kernels (the ring's
// waits left out), gathered over the cp axis and printed by rank 0 with max/min, the split's load balance.
static void report_attention_balance(GPT2& model, Logger& logger, bool main_rank) {
    ContextParallel& cp = model.cp;
    const std::vector<float> times = gather_values(*cp.group, cp_attention_milliseconds(cp), model.stream);
    if (!main_rank) return;
    const float slowest = *std::max_element(times.begin(), times.end());
    const float fastest = *std::min_element(times.begin(), times.end());
    std::string list;
    for (int r = 0; r < cp.size; r++) list += (r ? ", " : "") + std::to_string(times[r]);
    printf("attention time per cp rank (%s split, %s), last step: %s ms; max/min %.3f\n", cp_split_name(cp.split),
           cp_mode_name(cp.mode), list.c_str(), fastest > 0 ? slowest / fastest : 0.0f);
    logger.write(JsonLine("attention_balance").text("split", cp_split_name(cp.split)).text("mode", cp_mode_name(cp.mode))
                     .raw("milliseconds", "[" + list + "]").number("max_over_min", fastest > 0 ? slowest / fastest : 0));
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    Flags flags("train_gpt", "Trains GPT-2 on token shards (llm.c's format), on one GPU or on the CPU.");
    flags.heading("Model");
    std::string& model_name = flags.add_string("model", "124M",
        "124M, 350M, 774M or 1558M (GPT-2 shapes, initialised from scratch), custom (the shape flags below), "
        "or a model file in llm.c's format to start from");
    int& layers = flags.add_int("layers", 4, "custom: transformer blocks", 1, 1024);
    int& heads = flags.add_int("heads", 4, "custom: attention heads", 1, 1024);
    int& channels = flags.add_int("channels", 256, "custom: width of the residual stream", 8, 65536);
    int& vocab_size = flags.add_int("vocab-size", 50257, "custom: vocabulary size (GPT-2's tokenizer: 50257)", 1,
                                    65536);
    int& max_seq_len = flags.add_int("max-seq-len", 1024, "custom: positions the model can see", 1, 1 << 20);
    int& init_seed = flags.add_int("init-seed", 42, "seed of the GPT-2 initialisation (from-scratch models)", 0);
    flags.heading("Data");
    std::string& train_data = flags.add_string("train-data", "data/classics_train*.bin", "training token shards (glob)");
    std::string& val_data = flags.add_string("val-data", "data/classics_val*.bin", "validation token shards (glob)");
    std::string& tokenizer_path = flags.add_string("tokenizer", "data/gpt2_tokenizer.bin",
                                                   "tokenizer file, to decode samples");
    bool& shuffle = flags.add_bool("shuffle", true, "visit training rows in a random order each epoch");
    int& data_seed = flags.add_int("data-seed", 1337, "seed of the shuffled order", 0);
    flags.heading("Batch");
    int& batch_size = flags.add_int("batch-size", 4, "sequences per micro-batch and rank (B)", 1, 1 << 20);
    int& seq_len = flags.add_int("seq-len", 64, "tokens per sequence (T)", 1, 1 << 20);
    int& total_batch_size = flags.add_int("total-batch-size", 0,
        "tokens per optimizer step, all ranks together; a multiple of B*T*ranks, the rest is gradient "
        "accumulation (0: B*T*ranks)", 0);
    flags.heading("Optimizer");
    int& steps = flags.add_int("steps", 100, "optimizer steps in the whole run (the schedule spans them)", 1);
    float& learning_rate = flags.add_float("learning-rate", 3e-4f, "peak learning rate", 0.0f, 10.0f);
    std::string& lr_schedule = flags.add_choice("lr-schedule", "cosine", lr_schedule_names(),
                                                "warmup then cosine decay, or warmup then constant");
    int& warmup_steps = flags.add_int("warmup-steps", 0, "linear warmup steps", 0);
    float& final_lr_fraction = flags.add_float("final-lr-fraction", 0.0f, "cosine: last step's lr / peak", 0.0f, 1.0f);
    float& weight_decay = flags.add_float("weight-decay", 0.1f, "AdamW weight decay (matrices only)", 0.0f, 10.0f);
    float& beta1 = flags.add_float("beta1", 0.9f, "AdamW beta1", 0.0f, 0.999999f);
    float& beta2 = flags.add_float("beta2", 0.95f, "AdamW beta2", 0.0f, 0.999999f);
    float& eps = flags.add_float("eps", 1e-8f, "AdamW epsilon", 0.0f, 1.0f);
    float& grad_clip = flags.add_float("grad-clip", 1.0f, "clip the global gradient norm to this (0: off)", 0.0f);
    flags.heading("Evaluation, samples, checkpoints");
    int& val_every = flags.add_int("val-every", 20, "validation loss every N steps (0: never)", 0);
    int& val_batches = flags.add_int("val-batches", 10, "batches per validation loss", 1);
    int& sample_every = flags.add_int("sample-every", 0, "print a text sample every N steps (0: only at the end)", 0);
    int& sample_tokens = flags.add_int("sample-tokens", 48, "tokens per sample (0: no samples)", 0);
    int& checkpoint_every = flags.add_int("checkpoint-every", 0, "checkpoint every N steps and at the end (0: never)",
                                          0);
    int& keep_checkpoints = flags.add_int("keep-checkpoints", 2, "checkpoints kept in the output directory", 1);
    std::string& output_dir = flags.add_string("output-dir", "out", "log.jsonl, checkpoints and model.bin go here");
    bool& save_model = flags.add_bool("save-model", true,
                                      "at the end, write the model to <output-dir>/model.bin in llm.c's format (fp32)");
    bool& resume = flags.add_bool("resume", false, "continue from the latest checkpoint in --output-dir");
    flags.heading("Parallelism (ranks come from the launcher: mpirun, srun or torchrun)");
    int& zero_stage = flags.add_int("zero", 0,
        "ZeRO stage: 0 = plain data parallelism, 1 = optimizer state sharded, 2 = gradients too, 3 = parameters "
        "too (FSDP)", 0, 3);
    int& dp_shard = flags.add_int("dp-shard", 0,
        "data-parallel ranks that share one sharded copy of the state (HSDP: the rest replicate it); 0: all of "
        "them", 0);
    int& tp_size = flags.add_int("tp", 1,
        "tensor parallelism: ranks that split every matmul (Megatron), neighbours in rank order; the world is "
        "data-parallel x pp x cp x tp ranks", 1, 4096);
    bool& sequence_parallel = flags.add_bool("sequence-parallel", false,
        "with --tp: each tp rank keeps 1/tp of the rows of the layernorms and the residual stream");
    int& pp_size = flags.add_int("pp", 1,
        "pipeline parallelism: stages of consecutive layers on different ranks; the micro-steps of a step are "
        "the pipeline's microbatches", 1, 4096);
    std::string& pp_schedule = flags.add_choice("pp-schedule", "1f1b", pipeline_schedule_names(),
        "the order of each rank's forward and backward passes: all forwards then all backwards (gpipe), one "
        "forward one backward (1f1b), or 1f1b over --pp-virtual stages per rank (interleaved)");
    int& pp_virtual = flags.add_int("pp-virtual", 1,
        "interleaved: stages per pipeline rank (V); layers must be a multiple of pp x V", 1, 1024);
    std::string& trace_path = flags.add_string("trace", "",
        "write the last step's timeline of the pipeline's forward and backward passes and waits as a Chrome trace "
        "(chrome://tracing, ui.perfetto.dev; scripts/pipeline_timeline.py draws it)");
    int& cp_size = flags.add_int("cp", 1,
        "context parallelism: ranks that split every sequence (each holds T/cp positions); the world is "
        "data-parallel x pp x cp x tp ranks", 1, 4096);
    std::string& cp_mode_flag = flags.add_choice("cp-mode", "ring", cp_mode_names(),
        "how attention sees the other ranks' positions: key/value blocks passed around a ring (ring), or "
        "all-to-alls from a split of the sequence to a split of the heads (ulysses: heads / tp must divide by cp)");
    std::string& cp_split_flag = flags.add_choice("cp-split", "zigzag", cp_split_names(),
        "which positions a cp rank holds: chunks i and 2cp-1-i of 2cp (zigzag: every rank the same causal "
        "attention work), or chunk i of cp (contiguous)");
    flags.heading("Activation recomputation");
    std::string& recompute_policy = flags.add_choice("recompute", "none", recompute_policy_names(),
        "what the forward pass keeps: everything (none), all but the layernorm and GELU outputs (selective), "
        "only the input of every --recompute-every'th block (full); the backward pass computes the rest again");
    int& recompute_every = flags.add_int("recompute-every", 1,
        "full: keep the input of every C-th block; the backward pass reruns C blocks at a time (sqrt(layers) "
        "needs the least memory)", 1, 1 << 20);
    std::string& nccl_init_file = flags.add_string("nccl-init-file", "",
        "a path on a file system all ranks share, fresh for every run (put the job id in it): rank 0 hands the "
        "NCCL id to the others there; needed by srun / torchrun launches without MPI (GPU build)");
    flags.heading("Planning (arithmetic only, llmc/planning/planner.h: no GPU, no MPI, nothing allocated)");
    int& plan_ranks = flags.add_int("plan", 0,
        "print the memory per rank, the bytes per step on each axis, the pipeline bubble and the estimated step "
        "time of this run on N ranks, and exit (0: train)", 0);
    int& search_ranks = flags.add_int("plan-search", 0,
        "list the layouts of N ranks (tp, pp, cp, ZeRO stage, recompute policy) that fit in --gpu-memory, fastest "
        "first by the estimated step time, and exit (0: train)", 0);
    float& gpu_memory_gib = flags.add_float("gpu-memory", 80.0f, "planning: memory per GPU, GiB", 0.0f);
    int& gpus_per_node = flags.add_int("gpus-per-node", 8,
        "planning: GPUs joined by NVLink; groups spanning more use InfiniBand", 1, 1 << 20);
    float& nvlink_gbps = flags.add_float("nvlink-bandwidth", 450.0f,
        "planning: GB/s per direction per GPU within a node (H100 SXM, NVLink 4: 450)", 1e-3f);
    float& infiniband_gbps = flags.add_float("infiniband-bandwidth", 50.0f,
        "planning: GB/s per GPU across nodes (NDR InfiniBand, 400 Gb/s: 50)", 1e-3f);
    float& peak_tflops = flags.add_float("peak-tflops", 989.4f,
        "planning: peak TFLOP/s per GPU (H100 SXM dense BF16: 989)", 1e-3f);
    float& efficiency = flags.add_float("efficiency", 0.5f, "planning: fraction of the peak the matmuls reach",
                                        1e-3f, 1.0f);
    int& plan_top = flags.add_int("plan-top", 10, "--plan-search: layouts listed", 1);
    flags.parse(argc, argv);

    const Recompute recompute = recompute_from_flags(recompute_policy, recompute_every);
    if (plan_ranks > 0 || search_ranks > 0) {  // arithmetic only (llmc/planning/planner.h): any model, any machine
        PlanLayout layout;
        layout.ranks = plan_ranks > 0 ? plan_ranks : search_ranks;
        layout.tp = tp_size, layout.pp = pp_size, layout.cp = cp_size, layout.sequence_parallel = sequence_parallel;
        layout.cp_mode = cp_mode_from_name(cp_mode_flag), layout.cp_split = cp_split_from_name(cp_split_flag);
        layout.schedule = pipeline_schedule_from_name(pp_schedule), layout.pp_virtual = pp_virtual;
        layout.zero_stage = zero_stage, layout.dp_shard = dp_shard, layout.recompute = recompute;
        layout.batch_size = batch_size, layout.seq_len = seq_len, layout.total_batch_size = total_batch_size;
        PlanHardware hardware;
        hardware.gpu_memory_bytes = gpu_memory_gib * (double)(1 << 30), hardware.gpus_per_node = gpus_per_node;
        hardware.nvlink_bytes_per_second = nvlink_gbps * 1e9, hardware.infiniband_bytes_per_second = infiniband_gbps * 1e9;
        hardware.peak_flops = peak_tflops * 1e12, hardware.efficiency = efficiency;
        const GPT2Config config = config_from_flags(model_name, layers, heads, channels, vocab_size, max_seq_len);
        if (search_ranks > 0) {
            print_plan_search(config, plan_search(config, layout, hardware), layout, hardware, plan_top);
            return EXIT_SUCCESS;
        }
        const LayoutPlan plan = plan_layout(config, layout, hardware);
        if (!plan.error.empty()) fatal("%s", plan.error.c_str());
        print_layout_plan(config, plan, hardware);
        return EXIT_SUCCESS;
    }

    // ---- mesh: every rank of the launcher (mpirun, srun, torchrun; one rank without) trains on its own rows; the
    // optimizer state (ZeRO-1, and the gradients with ZeRO-2) is sharded over groups of --dp-shard ranks,
    // replicated across the groups
    Communicator world = comm_init_world(nccl_init_file);
    if (world.size % (tp_size * pp_size * cp_size) != 0)
        fatal("the %d ranks are not a multiple of --pp %d x --cp %d x --tp %d", world.size, pp_size, cp_size, tp_size);
    const int data_parallel_ranks = world.size / (tp_size * pp_size * cp_size);
    if (dp_shard == 0) dp_shard = data_parallel_ranks;
    if (data_parallel_ranks % dp_shard != 0)
        fatal("--dp-shard %d does not divide the %d data-parallel ranks", dp_shard, data_parallel_ranks);
    Mesh mesh = mesh_create(world, mesh_layout(data_parallel_ranks / dp_shard, dp_shard, pp_size, cp_size, tp_size));
    const bool main_rank = world.rank == 0;  // prints, logs, samples and writes files
    const int dp_rank = mesh_data_parallel_rank(mesh), dp_size = mesh_data_parallel_size(mesh);
    if (main_rank) mesh_print(mesh);

    // ---- model
    const GPT2Config config = config_from_flags(model_name, layers, heads, channels, vocab_size, max_seq_len);
    const int B = batch_size, T = seq_len;
    if (T > config.max_seq_len) fatal("--seq-len %d exceeds the model's %d positions", T, config.max_seq_len);
    tp_check_layout(config, tp_size, sequence_parallel, T);
    const ContextParallelMode cp_mode = cp_mode_from_name(cp_mode_flag);
    const SequenceSplit cp_split = cp_split_from_name(cp_split_flag);
    ContextParallel cp;  // this rank's positions of every sequence (llmc/parallel/context_parallel.h)
    cp.size = cp_size;
    cp.rank = mesh.coords[CP];
    cp.mode = cp_mode;
    cp.split = cp_split;
    cp.group = cp_size > 1 ? &mesh.axis[CP] : nullptr;
    const int T_local = T / cp_size;  // the positions of each sequence this rank holds
    TensorParallel tp;  // this rank's slice of every matmul (llmc/parallel/tensor_parallel.h)
    tp.size = tp_size;
    tp.rank = mesh.coords[TP];
    tp.sequence_parallel = sequence_parallel;
    tp.group = tp_size > 1 ? &mesh.axis[TP] : nullptr;
    const int tokens_per_micro_step = micro_step_tokens(B, T, dp_size);
    if (total_batch_size == 0) total_batch_size = tokens_per_micro_step;
    if (total_batch_size % tokens_per_micro_step != 0)
        fatal("--total-batch-size %d is not a multiple of --batch-size x --seq-len x ranks = %d", total_batch_size,
              tokens_per_micro_step);
    const int accumulation_steps = total_batch_size / tokens_per_micro_step;
    Pipeline pipe;  // this rank's stages and schedule (llmc/parallel/pipeline.h): the micro-steps are its microbatches
    pipeline_create(pipe, mesh, pipeline_schedule_from_name(pp_schedule), pp_virtual, accumulation_steps,
                    config.num_layers, (size_t)tp_rows(tp, B * T_local) * config.channels);
    // (after the tp and pipeline checks, which name their flags; this one adds the cp axis's)
    mesh_check_model(mesh, config.num_layers, config.num_heads, T, cp_mode, cp_split);
    tp_check_context_parallel_rows(tp_size, sequence_parallel, T, cp_size);

    GPT2 model;
    gpt2_allocate(model, config, B, T_local, zero_shard_count(zero_stage, &mesh), /*full_gradients=*/zero_stage < 2,
                  /*full_parameters=*/zero_stage < 3, tp, recompute, pipeline_model_part(pipe), cp);
    // the whole model (from the file, or GPT-2's initialisation), then this rank's part of it: its pipeline
    // stages' chunks, its tp slices of them
    const ParameterLayout whole_model(config);
    std::vector<float> initial_values;
    if (file_exists(model_name) && model_name != "custom") {
        initial_values = gpt2_read_parameters(model_name, whole_model);
    } else {
        Rng init_rng = rng_from_seed((uint64_t)init_seed);
        initial_values = gpt2_initial_parameters(whole_model, [&] { return init_rng.next_normal(); });
    }
    initial_values = parameters_in_layout(whole_model, initial_values, model.layout);
    Zero optimizer;  // this rank's parameters and AdamW state, and the averaging of gradients over ranks
    zero_init(optimizer, zero_stage, &mesh, model, initial_values);
    initial_values = std::vector<float>();
    if (main_rank) {
        printf("train_gpt: %s build on %s\n", PRECISION_NAME, device_properties().name);
        printf("model: %d layers, %d heads, %d channels, vocabulary %d (padded %d), %zu parameters",
               config.num_layers, config.num_heads, config.channels, config.vocab_size, config.padded_vocab_size,
               whole_model.num_parameters);
        if (tp_size > 1 || pp_size > 1) printf(", %zu on this rank", model.layout.num_parameters);
        printf("\n");
        if (pp_size > 1)
            printf("pipeline: %s over %d ranks x %d stage(s) of %d layers, %d microbatches; %d record(s) in flight on "
                   "this rank\n", pp_schedule.c_str(), pp_size, pp_virtual, model.stage_layers, accumulation_steps,
                   pipe.records);
        printf("batch: %d x %d tokens on each of %d rank(s), %d micro-step(s) per step: %d tokens per step\n", B, T,
               dp_size, accumulation_steps, total_batch_size);
        printf("recompute: %s\n", recompute_describe(recompute).c_str());
    }

    // ---- data: each data-parallel rank reads its own rows of every global batch
    DataLoader train_loader, val_loader;
    train_loader.init(train_data, B, T, dp_rank, dp_size, shuffle, (uint64_t)data_seed, config.vocab_size);
    if (val_every > 0) val_loader.init(val_data, B, T, dp_rank, dp_size, false, 0, config.vocab_size);
    if (val_every > 0 && val_loader.batches_per_epoch() < (size_t)val_batches)
        fatal("--val-batches %d: the validation data holds only %zu batches of %d x %d x %d ranks", val_batches,
              val_loader.batches_per_epoch(), B, T, dp_size);
    Tokenizer tokenizer;
    if (sample_tokens > 0) tokenizer_init(&tokenizer, tokenizer_path);
    if (main_rank)
        printf("data: %zu training tokens in %zu shard(s)\n", train_loader.total_tokens, train_loader.files.size());

    // ---- optimizer and its schedule
    AdamWConfig adamw;
    adamw.beta1 = beta1;
    adamw.beta2 = beta2;
    adamw.eps = eps;
    adamw.weight_decay = weight_decay;
    const LearningRateSchedule schedule = make_lr_schedule(lr_schedule, learning_rate, warmup_steps, steps,
                                                           final_lr_fraction);
    Rng sample_rng = rng_from_seed(1234);

    // ---- resume
    int first_step = 0;
    if (resume) {
        const long long latest = latest_checkpoint_step(output_dir);
        if (latest < 0) fatal("--resume: no checkpoint in %s", output_dir.c_str());
        DataLoaderState data_state;
        first_step = load_checkpoint(checkpoint_path(output_dir, latest), model, optimizer, &data_state, &sample_rng);
        train_loader.restore(data_state);
        if (main_rank) printf("resumed from %s at step %d\n", checkpoint_path(output_dir, latest).c_str(), first_step);
    }
    Logger logger(output_dir, resume, main_rank);
    logger.config(flags);
    // model FLOPs (llmc/planning/mfu.h) and hardware FLOPs, which count the recomputed forward passes too
    const double flops_per_step = gpt2_flops_per_token((long long)whole_model.num_parameters, config.num_layers,
                                                       config.channels, T) * total_batch_size;
    const double hardware_flops_per_step = flops_per_step + recompute_extra_flops_per_token(
        recompute, (double)whole_model.block_elements(), config.num_layers, config.channels, T) * total_batch_size;
    const double peak_flops = peak_flops_per_second(device_properties().name, PRECISION_NAME);

    // ---- training
    std::vector<int> step_inputs((size_t)accumulation_steps * B * T_local), step_targets(step_inputs.size());
    for (int step = first_step; step < steps; step++) {
        if (val_every > 0 && step % val_every == 0) {
            const float val_loss = validation_loss(pipe, model, val_loader, val_batches, optimizer);
            logger.val_loss(step, val_loss);
        }
        // every rank computes the sample (at ZeRO-3 the forward pass gathers parameters from all ranks);
        // only the main rank's logger prints it
        if (sample_tokens > 0 && sample_every > 0 && step > first_step && step % sample_every == 0) {
            const std::string text = sample_text(pipe, model, tokenizer, sample_rng, sample_tokens);
            logger.sample(step, text);
        }

        const auto start = std::chrono::steady_clock::now();
        mesh_reset_bytes(mesh);
        pipeline_reset_bytes(pipe);
        zero_begin_step(optimizer, model);
        // the step's micro-batches, the pipeline's microbatches
        for (int micro_step = 0; micro_step < accumulation_steps; micro_step++) {
            train_loader.next_batch();
            // this cp rank's positions of the batch (all of them without context parallelism)
            const std::vector<int> inputs = cp_local_tokens(model.cp, train_loader.inputs.data(), B, T);
            const std::vector<int> targets = cp_local_tokens(model.cp, train_loader.targets.data(), B, T);
            std::copy(inputs.begin(), inputs.end(), step_inputs.begin() + (size_t)micro_step * B * T_local);
            std::copy(targets.begin(), targets.end(), step_targets.begin() + (size_t)micro_step * B * T_local);
        }
        // the last step's timeline is measured (the pipeline's bubble)
        const bool measured = step + 1 == steps && (pp_size > 1 || !trace_path.empty());
        if (measured) pipeline_begin_measuring(pipe, model);
        if (step + 1 == steps && cp_size > 1) cp_begin_measuring(model.cp);  // each rank's attention time
        // the host issues the whole step without waiting: the losses stay on the device until the one
        // read below, which also brings the gradient norm that clipping needs before AdamW
        pipeline_step(pipe, model, optimizer, step_inputs.data(), step_targets.data(), B, T_local,
                      1.0f / (B * T_local * accumulation_steps));
        zero_wait_for_gradients(optimizer, model);
        pipeline_sum_tied_embedding(pipe, optimizer, model);
        gpt2_mean_loss(model, accumulation_steps);  // on the last stage; the others learn it below
        average_over_ranks(optimizer, &model.results->loss, model.stream);
        pipeline_share_from_last_stage(pipe, &model.results->loss, 1, model.stream);
        zero_gradient_norm(optimizer, model);
        const StepResults results = gpt2_read_results(model);
        const float loss = results.loss;
        if (!std::isfinite(loss)) fatal("the loss is not finite (%g) at step %d", loss, step + 1);
        const float norm = sqrtf(results.grad_norm_squared);
        const float clip_scale = (grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f;
        const float lr = schedule.at(step);
        zero_optimizer_step(optimizer, model, adamw, lr, step + 1, clip_scale, (uint32_t)mix64((uint64_t)step + 1));
        cudaCheck(cudaDeviceSynchronize());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

        StepStats stats;
        stats.step = step + 1;
        stats.total_steps = steps;
        stats.loss = loss;
        stats.learning_rate = lr;
        stats.grad_norm = norm;
        stats.seconds = seconds;
        stats.tokens = total_batch_size;
        stats.memory_bytes = device_memory_in_use_bytes();
        stats.mfu = model_flops_utilization(flops_per_step / world.size, seconds, peak_flops);  // this GPU's share
        stats.hfu = model_flops_utilization(hardware_flops_per_step / world.size, seconds, peak_flops);
        stats.model_flops = flops_per_step / world.size;
        stats.hardware_flops = hardware_flops_per_step / world.size;
        stats.comm_bytes = (long long)(mesh_bytes_sent(mesh) + pipeline_link_bytes(pipe));
        stats.tp_comm_bytes = (long long)mesh.axis[TP].bytes_sent;
        stats.pp_comm_bytes = (long long)(mesh.axis[PP].bytes_sent + pipeline_link_bytes(pipe));
        stats.cp_comm_bytes = (long long)mesh.axis[CP].bytes_sent;
        logger.step(stats);
        if (step + 1 == steps && cp_size > 1) report_attention_balance(model, logger, main_rank);
        if (measured) report_pipeline_timeline(pipe, model, logger, main_rank, trace_path);

        const bool last = step + 1 == steps;
        if (checkpoint_every > 0 && ((step + 1) % checkpoint_every == 0 || last)) {
            save_checkpoint(output_dir, step + 1, keep_checkpoints, model, optimizer, pipe, world,
                            train_loader.state(), sample_rng);
            logger.checkpoint(step + 1, checkpoint_path(output_dir, step + 1));
        }
    }

    // ---- the end: a last validation loss and a sample
    if (val_every > 0 && first_step < steps) {
        const float val_loss = validation_loss(pipe, model, val_loader, val_batches, optimizer);
        logger.val_loss(steps, val_loss);
    }
    if (sample_tokens > 0) {
        const std::string text = sample_text(pipe, model, tokenizer, sample_rng, sample_tokens);
        logger.sample(steps, text);
        tokenizer_free(&tokenizer);
    }
    if (save_model) {
        // collectives: the ZeRO-3 gathers, and the stages' and tp ranks' parts put together into the whole model
        const std::vector<float> values = gather_whole_model(mesh.model, pipe, model.layout,
                                                             zero_parameters(optimizer, model), model.stream);
        const std::string path = output_dir + "/model.bin";
        if (main_rank) {
            gpt2_save(whole_model, values, path);
            printf("wrote %s\n", path.c_str());
        }
    }
    // ---- memory: what rank 0 held, beside what the ZeRO formulas say it should (llmc/planning/memory.h)
    const MemoryTotals held = memory_totals();
    const size_t model_state = held.peak[(int)MemoryKind::Parameters] + held.peak[(int)MemoryKind::Gradients] +
                               held.peak[(int)MemoryKind::OptimizerState];
    const GPT2MemoryShape shape = gpt2_memory_shape(config, B, T_local, device_properties().multiProcessorCount, tp_size,
                                                    sequence_parallel, recompute, pipeline_model_part(pipe), model.cp.size,
                                                    model.cp.mode, model.cp.split);
    const MemoryPlan formula = plan_training_memory(model.layout.total, zero_stage, mesh.gradient.size, optimizer.shards,
                                                    sizeof(floatX) == 2, accumulation_steps);
    const MemoryPlan with_buffers = plan_training_memory(model.layout.total, zero_stage, mesh.gradient.size, optimizer.shards,
                                                         sizeof(floatX) == 2, accumulation_steps, &shape);
    if (main_rank) {
        printf("device memory of rank 0, by category (now and at its peak):\n");
        print_memory_totals(held);
        printf("parameters + gradients + optimizer state: %s held; ZeRO-%d formula %s, with the working buffers "
               "%s\n", format_bytes((double)model_state).c_str(), zero_stage, format_bytes(formula.model_state).c_str(),
               format_bytes(with_buffers.model_state).c_str());
        printf("activations (kept for the backward pass): %s held at the peak; formula (llmc/planning/memory.h: recompute %s, "
               "tp %d%s) %s\n", format_bytes((double)held.peak[(int)MemoryKind::Activations]).c_str(),
               recompute_describe(recompute).c_str(), tp_size, sequence_parallel ? ", sequence parallel" : "",
               format_bytes(with_buffers.activations).c_str());
        printf("workspace (buffers the layers share): %s held at the peak; formula %s\n",
               format_bytes((double)held.peak[(int)MemoryKind::Workspace]).c_str(),
               format_bytes(with_buffers.workspace).c_str());
    }
    // under a pipeline, each stage's activations (its records in flight) beside its formula
    const std::vector<float> stage_activations = pipeline_gather_values(
        pipe, (float)held.peak[(int)MemoryKind::Activations], model.stream);
    const std::vector<float> stage_formulas = pipeline_gather_values(pipe, (float)with_buffers.activations,
                                                                     model.stream);
    if (main_rank && pp_size > 1)
        for (int r = 0; r < pp_size; r++)
            printf("  pp rank %d: activations %s held at the peak, formula %s (%d record(s) in flight)\n", r,
                   format_bytes(stage_activations[r]).c_str(), format_bytes(stage_formulas[r]).c_str(),
                   pipeline_model_part(pipe.schedule, r, pp_size, pp_virtual, accumulation_steps,
                                       config.num_layers).records);
    logger.write(JsonLine("memory").integer("model_state_bytes", (long long)model_state)
                     .integer("activation_bytes", (long long)held.peak[(int)MemoryKind::Activations])
                     .number("activation_formula_bytes", with_buffers.activations)
                     .integer("workspace_bytes", (long long)held.peak[(int)MemoryKind::Workspace])
                     .number("workspace_formula_bytes", with_buffers.workspace)
                     .number("formula_bytes", formula.model_state)
                     .number("formula_with_buffers_bytes", with_buffers.model_state)
                     .integer("peak_bytes", (long long)held.peak_total));
    train_loader.free();
    if (val_every > 0) val_loader.free();
    gpt2_free(model);
    matmul_teardown();
    zero_free(optimizer);
    pipeline_free(pipe);
    mesh_destroy(mesh);
    comm_destroy(world);
    comm_finalize();
    return EXIT_SUCCESS;
}
