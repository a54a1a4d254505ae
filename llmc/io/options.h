/*
train_gpt's flags: one table (llmc/io/flags.h) that the parser and --help both read, and the Options they
fill. The run's layout (how its ranks split the work, llmc/parallel/layout.h) is one struct inside, the one
the planner takes too.

    const Options options = parse_options(argc, argv);   // --help prints the table and exits
*/
#pragma once

#include <cmath>
#include <string>
#include "flags.h"
#include "../schedulers.h"
#include "../parallel/layout.h"
#include "../optimizer_config.h"
#include "../planning/hardware.h"

// --checkpoint-every auto: the interval from the measured save cost and --mtbf-hours (llmc/io/young_daly.h)
constexpr int kCheckpointEveryAuto = -1;

struct Options {
    // the model: a GPT-2 shape by name, a custom shape, or a model file
    std::string model;
    std::string arch;  // custom: gpt2 or llama
    int layers = 0, heads = 0, channels = 0, vocab_size = 0, max_seq_len = 0, init_seed = 0;
    int kv_heads = 0, ffn_hidden = 0;  // custom Llama (0: as many K/V heads as heads; 4 C)
    float rope_theta = 0.0f;
    int experts = 0, experts_per_token = 0, shared_experts = 0;  // custom mixture of experts (0 experts: dense)
    int moe_every = 1;
    float moe_aux_loss = 0.0f, moe_z_loss = 0.0f;  // training a mixture of experts (its capacity: the layout's)
    // the data
    std::string train_data, val_data, tokenizer;
    bool shuffle = true;
    int data_seed = 0;
    float noise_scale_decay = 0.0f;  // the noise scale's moving averages (llmc/noise_scale.h; on: layout.noise_scale)
    // the batch (B, T, tokens per step) and how the ranks split the work
    Layout layout;
    std::string trace;           // the last step's pipeline timeline as a Chrome trace ("": none)
    std::string nccl_init_file;  // rank 0 hands the NCCL id to the others there (launches without MPI)
    // the optimizer
    int steps = 0;
    LearningRateSchedule schedule;
    AdamWConfig adamw;
    float grad_clip = 0.0f;
    // evaluation, samples, checkpoints
    int val_every = 0, val_batches = 0, sample_every = 0, sample_tokens = 0;
    bool sample_cache = true;
    int checkpoint_every = 0, keep_checkpoints = 0;  // kCheckpointEveryAuto: the Young-Daly interval
    float mtbf_hours = 0.0f;                         // --checkpoint-every auto: the mean time between failures
    bool checkpoint_async = false;  // written by a thread while training goes on (llmc/parallel/reshard.h)
    std::string output_dir;
    bool save_model = true, resume = false;
    // faults: a rank that stops arriving, silent corruption of the replicas, a slow rank
    float collective_timeout = 0.0f;
    int check_replicas = 0;
    float straggler_factor = 0.0f;  // 0: off (llmc/parallel/stragglers.h)
    int straggler_steps = 3;
    // planning instead of training (llmc/planning/planner.h)
    int plan_ranks = 0, search_ranks = 0, plan_top = 0;
    PlanHardware hardware;
    std::string flags_json;      // every flag's value, for the log
};


// --pp-layers: "auto" (empty: balanced by the planner's rule) or comma-separated positive layer counts.
inline std::vector<int> parse_pp_layers(const std::string& text) {
    std::vector<int> layers;
    if (text == "auto") return layers;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        char* end = nullptr;
        const long n = item.empty() ? 0 : strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || n < 1 || n > 1000000)
            fatal("--pp-layers: '%s' is not auto or a comma-separated list of positive layer counts", text.c_str());
        layers.push_back((int)n);
        if (comma == std::string::npos) return layers;
        start = comma + 1;
    }
}

// Declares train_gpt's flags in `flags` (empty), parses argv and returns the Options; `flags` then holds
// the table and its values (dev/test/test_host.cu holds every row's help against the parser).
inline Options parse_options(Flags& flags, int argc, char** argv) {
    flags.heading("Model");
    std::string& model_name = flags.add_string("model", "124M",
        "124M, 350M, 774M or 1558M (GPT-2 shapes), llama3-8B, llama3-70B or llama3-405B (Llama 3 shapes), "
        "mixtral-8x7B-like or deepseek-v3-like (mixtures of experts in the Llama block), all initialised from scratch; custom (the shape flags below); or a model file (README: Model files)");
    std::string& arch = flags.add_string("arch", "gpt2",
        "custom: the block, gpt2 (LayerNorm, learned positions, GELU, tied head) or llama (RMSNorm, RoPE, "
        "SwiGLU, grouped-query attention, no biases, untied head)");
    int& layers = flags.add_int("layers", 4, "custom: transformer blocks", 1, 1024);
    int& heads = flags.add_int("heads", 4, "custom: attention heads", 1, 1024);
    int& channels = flags.add_int("channels", 256, "custom: width of the residual stream", 8, 65536);
    int& vocab_size = flags.add_int("vocab-size", 50257, "custom: vocabulary size (GPT-2's tokenizer: 50257)", 1,
                                    1 << 18);
    int& max_seq_len = flags.add_int("max-seq-len", 1024, "custom: positions the model can see", 1, 1 << 20);
    int& kv_heads = flags.add_int("kv-heads", 0, "custom llama: K/V heads, a divisor of --heads (0: --heads)", 0, 1024);
    int& ffn_hidden = flags.add_int("ffn-hidden", 0, "custom llama: the SwiGLU MLP's hidden units (0: 4 C)", 0,
                                    1 << 20);
    // the model's check refuses a base of 1 (RoPE's angles would not turn), so the least accepted is the next float
    float& rope_theta = flags.add_float("rope-theta", 500000.0f, "custom llama: RoPE's base, above 1",
                                        std::nextafter(1.0f, 2.0f));
    int& experts = flags.add_int("experts", 0,
        "custom: a mixture of experts in every block's MLP (or every --moe-every-th), of this many experts (0: a "
        "dense MLP)", 0, 256);
    int& experts_per_token = flags.add_int("experts-per-token", 2, "custom, with --experts: experts each token goes to "
                                           "(top-K of the router), at most --experts", 1, 16);
    int& shared_experts = flags.add_int("shared-experts", 0, "custom, with --experts: experts every token goes to",
                                        0, 256);
    int& moe_every = flags.add_int("moe-every", 1, "custom, with --experts: every N-th block's MLP is a mixture "
                                   "(blocks N-1, 2N-1, ...), the others dense", 1, 1 << 20);
    int& init_seed = flags.add_int("init-seed", 42, "seed of the initialisation (models trained from scratch)", 0);
    flags.heading("Mixture of experts (a model with experts)");
    float& moe_aux_loss = flags.add_float("moe-aux-loss", 0.01f,
        "weight of the load-balancing loss (per sequence: experts x sum over experts of the share of its tokens "
        "routed there x their mean router probability) in the gradient", 0.0f, 100.0f);
    float& moe_z_loss = flags.add_float("moe-z-loss", 0.001f,
        "weight of the router z-loss (the mean squared log-sum-exp of the router's logits) in the gradient", 0.0f,
        100.0f);
    float& capacity_factor = flags.add_float("capacity-factor", 0.0f,
        "at most ceil(factor x T x experts-per-token / experts) tokens per expert and sequence, the later ones "
        "dropped and counted (0: dropless)", 0.0f, 1000.0f);
    flags.heading("Data");
    std::string& train_data = flags.add_string("train-data", "data/classics_train*.bin", "training token shards (glob)");
    std::string& val_data = flags.add_string("val-data", "data/classics_val*.bin", "validation token shards (glob)");
    std::string& tokenizer_path = flags.add_string("tokenizer", "data/gpt2_tokenizer.bin",
                                                   "tokenizer file, to decode samples");
    bool& shuffle = flags.add_bool("shuffle", true, "visit training rows in a random order each epoch");
    int& data_seed = flags.add_int("data-seed", 1337, "seed of the shuffled order", 0);
    flags.heading("Batch");
    int& batch_size = flags.add_int("batch-size", 4, "sequences per micro-batch and data-parallel rank (B)", 1, 1 << 20);
    int& seq_len = flags.add_int("seq-len", 64, "tokens per sequence (T)", 1, 1 << 20);
    int& total_batch_size = flags.add_int("total-batch-size", 0,
        "tokens per optimizer step, all ranks together; a multiple of B*T*data-parallel ranks, the rest is "
        "gradient accumulation (0: B*T*data-parallel ranks)", 0);
    std::string& batch_ramp = flags.add_string("batch-ramp", "",
        "tokens per step that grow with the tokens seen, phases of TOKENS_SEEN:TOKENS_PER_STEP, e.g. "
        "0:16384,2000000:32768 (the first at 0, thresholds increasing; a phase starts with the first step that "
        "begins at or past its threshold; each batch a multiple of B*T*data-parallel ranks); replaces "
        "--total-batch-size. --steps still counts optimizer steps; the learning-rate schedule is drawn on the "
        "tokens seen: warmup over the tokens of the first --warmup-steps steps, the decay ending at the last "
        "step's (empty: --total-batch-size throughout)");
    bool& noise_scale = flags.add_bool("noise-scale", false,
        "measure the gradient noise scale B_simple = tr(Sigma) / |G|^2 in tokens every step, from the squared "
        "gradient norms of each rank's first microbatch and of the whole step (README: The gradient noise scale); "
        "logged as \"noise_scale\" events");
    float& noise_scale_decay = flags.add_float("noise-scale-decay", 0.95f,
        "--noise-scale: decay of the moving averages of the |G|^2 and tr(Sigma) estimates, whose ratio is B_simple; "
        "one step's estimates are too noisy alone (|G|^2's can come out negative), and 0.95 averages about the "
        "last 20 steps while still following the training's drift", 0.0f, 0.9999f);
    flags.heading("Optimizer");
    int& steps = flags.add_int("steps", 100, "optimizer steps in the whole run (the schedule spans them; under "
                               "--batch-ramp, the tokens they see)", 1);
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
    bool& sample_cache = flags.add_bool("sample-cache", true,
        "sample with a key/value cache (one token's forward pass per token); false: the whole sequence's");
    int& checkpoint_every = flags.add_int_or_word("checkpoint-every", 0, "auto", kCheckpointEveryAuto,
        "checkpoint every N steps and at the end (0: never); auto: after the first step, then every Young-Daly "
        "interval sqrt(2 x that save's seconds x --mtbf-hours) in steps (README: Runs that heal themselves)", 0);
    float& mtbf_hours = flags.add_float("mtbf-hours", 0.0f,
        "--checkpoint-every auto: the job's mean time between failures in hours (0: not given)", 0.0f);
    int& keep_checkpoints = flags.add_int("keep-checkpoints", 2, "checkpoints kept in the output directory", 1);
    bool& checkpoint_async = flags.add_bool("checkpoint-async", false,
        "copy the state to host memory at a checkpoint and write the files in the background while training goes on");
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
        "them, which --ep needs", 0);
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
        "forward one backward (1f1b), 1f1b over --pp-virtual stages per rank (interleaved), or 1f1b with the "
        "backward split into its input-gradient and weight-gradient parts, the latter run in the bubbles (zb-h1), "
        "or that split over two stages per rank in a V, rank r holding stages r and 2 pp - 1 - r (zbv)");
    int& pp_virtual = flags.add_int("pp-virtual", 1,
        "interleaved: stages per pipeline rank (V); zbv always has 2", 1, 1024);
    std::string& pp_layers = flags.add_string("pp-layers", "auto",
        "layers per model stage (pp x V entries, in model-stage order, each >= 1, summing to the layers), "
        "e.g. 3,4,4,1; auto balances the stages' compute, the embedding and LM head included");
    std::string& trace_path = flags.add_string("trace", "",
        "write the last step's timeline of the pipeline's forward and backward passes and waits as a Chrome trace "
        "(chrome://tracing, ui.perfetto.dev; scripts/pipeline_timeline.py draws it)");
    int& ep_size = flags.add_int("ep", 1,
        "expert parallelism: a mixture of experts' experts split over groups of this many consecutive "
        "data-parallel ranks (it divides them and the experts), the routed rows moved to their experts and back "
        "by all-to-alls", 1, 4096);
    int& cp_size = flags.add_int("cp", 1,
        "context parallelism: ranks that split every sequence (each holds T/cp positions); the world is "
        "data-parallel x pp x cp x tp ranks", 1, 4096);
    std::string& cp_mode_flag = flags.add_choice("cp-mode", "ring", cp_mode_names(),
        "how attention sees the other ranks' positions: key/value blocks passed around a ring (ring), or "
        "all-to-alls from a split of the sequence to a split of the heads (ulysses: cp must divide each tp rank's "
        "query heads and K/V heads)");
    std::string& cp_split_flag = flags.add_choice("cp-split", "zigzag", cp_split_names(),
        "which positions a cp rank holds: chunks i and 2cp-1-i of 2cp (zigzag: every rank the same causal "
        "attention work), or chunk i of cp (contiguous)");
    flags.heading("Activation recomputation");
    std::string& recompute_policy = flags.add_choice("recompute", "none", recompute_policy_names(),
        "what the forward pass keeps: everything (none), all but the norms' outputs and the MLP activation's "
        "(selective), only the input of every --recompute-every'th block (full); the backward pass computes the "
        "rest again; auto: the program chooses per block (the letters of --recompute-blocks), the fastest that "
        "fits --gpu-memory (llmc/planning/recompute_choice.h)");
    int& recompute_every = flags.add_int("recompute-every", 1,
        "full: keep the input of every C-th block; the backward pass reruns C blocks at a time (sqrt(layers) "
        "needs the least memory)", 1, 1 << 20);
    std::string& recompute_blocks = flags.add_string("recompute-blocks", "",
        "what each block of a stage keeps, one letter per block: k (keep), s (selective), f (full), o (offload "
        "to host memory); e.g. kkso (--recompute auto prints the letters it chose)");
    flags.heading("Offload to host memory");
    std::string& offload = flags.add_string("offload", "",
        "what lives in pinned host memory: optimizer (the fp32 master weights and AdamW's m and v of this rank's "
        "shard), activations (every block's record, back one block ahead of its backward pass), or both, "
        "comma-separated");
    flags.heading("Launching without MPI");
    std::string& nccl_init_file = flags.add_string("nccl-init-file", "",
        "a path on a file system all ranks share, fresh for every run (put the job id in it): rank 0 hands the "
        "NCCL id to the others there; needed by srun / torchrun launches without MPI (GPU build)");
    flags.heading("Faults");
    float& collective_timeout = flags.add_float("collective-timeout", 600.0f,
        "seconds a rank may wait in one collective, send or receive before the job ends with a line naming the "
        "operation, the group, the step and the ranks that did not arrive (0: wait forever)", 0.0f);
    int& check_replicas = flags.add_int("check-replicas", 0,
        "every N steps, compare a checksum of every parameter chunk across the ranks that hold copies of it "
        "(data-parallel replicas, tp copies of replicated tensors); a mismatch ends the run (0: never)", 0);
    float& straggler_factor = flags.add_float("straggler-factor", 0.0f,
        "name a rank whose compute per step (its step time less its waits in collectives and receives) is above F "
        "times the median of the other ranks' for --straggler-steps steps in a row, in a warning line and "
        "log.jsonl; costs one small collective per step (0: off; otherwise above 1)", 0.0f);
    int& straggler_steps = flags.add_int("straggler-steps", 3, "--straggler-factor: steps in a row", 1, 1000000);
    flags.heading("Planning (arithmetic only, llmc/planning/planner.h: no GPU, no MPI, nothing allocated)");
    int& plan_ranks = flags.add_int("plan", 0,
        "print the memory per rank, the bytes per step on each axis, the pipeline bubble and the estimated step "
        "time of this run on N ranks, and exit (0: train)", 0);
    int& search_ranks = flags.add_int("plan-search", 0,
        "list the layouts of N ranks (tp with or without sequence parallelism, pp and its schedule, cp and its "
        "mode, ZeRO stage, recompute policy) that fit in --gpu-memory, fastest first by the estimated step time, "
        "and exit (0: train)", 0);
    float& gpu_memory_gib = flags.add_float("gpu-memory", 80.0f, "planning and --recompute auto: memory per GPU, GiB",
                                            0.0f);
    std::string& machine = flags.add_string("machine", "h100",
        "planning and --recompute auto: the machine profile, a rank's peak FLOP/s, matmul efficiency by shape, "
        "memory and host-link bandwidths, and each collective's latency and bus bandwidth on the network's tiers "
        "(node, leaf, spine): the built-in h100 (H100 SXM nodes of 8 in Llama 3's network, every number cited in "
        "llmc/planning/h100_profile.h) or a profile file (the format: llmc/planning/hardware.h; "
        "scripts/bench/calibrate.sh writes this machine's)");
    float& reserve_gib = flags.add_float("memory-reserve", 2.0f,
        "planning and --recompute auto: GiB of --gpu-memory kept for what no formula counts (the CUDA context, "
        "cuBLASLt, NCCL); the CPU build's own runs hold none of it, so tiny models there may give 0", 0.0f);
    int& gpus_per_node = flags.add_int("gpus-per-node", 8,
        "planning: when given, replaces the --machine profile's ranks_per_node (the ranks the node tier joins; "
        "the built-in h100's: 8)", 1, 1 << 20);
    float& peak_tflops = flags.add_float("peak-tflops", 989.4f,
        "planning: when given, replaces the --machine profile's peak TFLOP/s per rank (the built-in h100's: H100 SXM "
        "dense BF16, 989.4)", 1e-3f);
    float& hbm_gbps = flags.add_float("hbm-bandwidth", 3350.0f,
        "planning: when given, replaces the --machine profile's GB/s of a rank's own memory (the built-in h100's: "
        "HBM3, 3350)", 1e-3f);
    float& pcie_gbps = flags.add_float("pcie-bandwidth", 50.0f,
        "planning: when given, replaces the --machine profile's GB/s per direction between a rank's device and its "
        "host's pinned memory (the built-in h100's: PCIe 5 x16, 50)", 1e-3f);
    int& plan_top = flags.add_int("plan-top", 10, "--plan-search: layouts listed", 1);
    flags.parse(argc, argv);

    Options o;
    o.model = model_name;
    o.layers = layers, o.heads = heads, o.channels = channels, o.vocab_size = vocab_size;
    o.max_seq_len = max_seq_len, o.init_seed = init_seed;
    o.arch = arch, o.kv_heads = kv_heads, o.ffn_hidden = ffn_hidden, o.rope_theta = rope_theta;
    o.experts = experts, o.experts_per_token = experts_per_token, o.shared_experts = shared_experts;
    o.moe_every = moe_every;
    o.moe_aux_loss = moe_aux_loss, o.moe_z_loss = moe_z_loss;
    o.train_data = train_data, o.val_data = val_data, o.tokenizer = tokenizer_path;
    o.shuffle = shuffle, o.data_seed = data_seed;
    Layout& l = o.layout;
    bool offload_activations = false;
    for (const std::string& what : split_string(offload, ',')) {
        if (what == "optimizer") l.offload_optimizer = true;
        else if (what == "activations") offload_activations = true;
        else fatal("--offload %s: '%s' is not optimizer or activations", offload.c_str(), what.c_str());
    }
    l.recompute = recompute_from_flags(recompute_policy, recompute_every, recompute_blocks, offload_activations);
    l.tp = tp_size, l.pp = pp_size, l.cp = cp_size, l.sequence_parallel = sequence_parallel, l.ep = ep_size;
    l.capacity_factor = capacity_factor;
    l.cp_mode = cp_mode_from_name(cp_mode_flag), l.cp_split = cp_split_from_name(cp_split_flag);
    l.schedule = pipeline_schedule_from_name(pp_schedule), l.pp_virtual = pp_virtual;
    if (l.schedule == PipelineSchedule::ZeroBubbleV && pp_virtual == 1) l.pp_virtual = 2;  // the V's two stages
    l.pp_layers = parse_pp_layers(pp_layers);
    l.zero_stage = zero_stage, l.dp_shard = dp_shard;
    l.batch_size = batch_size, l.seq_len = seq_len, l.total_batch_size = total_batch_size;
    if (!batch_ramp.empty()) {
        if (total_batch_size != 0) fatal("--batch-ramp and --total-batch-size: give one (the ramp's phases are the batch)");
        const std::string error = batch_ramp_parse(batch_ramp, &l.batch_ramp);
        if (!error.empty()) fatal("%s", error.c_str());
    }
    l.noise_scale = noise_scale, o.noise_scale_decay = noise_scale_decay;
    o.trace = trace_path, o.nccl_init_file = nccl_init_file;
    o.steps = steps;
    o.schedule = make_lr_schedule(lr_schedule, learning_rate, warmup_steps, steps, final_lr_fraction);
    if (!l.batch_ramp.phases.empty()) o.schedule.ramp = l.batch_ramp;
    o.adamw.beta1 = beta1, o.adamw.beta2 = beta2, o.adamw.eps = eps, o.adamw.weight_decay = weight_decay;
    o.grad_clip = grad_clip;
    o.val_every = val_every, o.val_batches = val_batches, o.sample_every = sample_every;
    o.sample_tokens = sample_tokens, o.sample_cache = sample_cache, o.checkpoint_every = checkpoint_every, o.keep_checkpoints = keep_checkpoints;
    if ((checkpoint_every == kCheckpointEveryAuto) != (mtbf_hours > 0.0f))
        fatal("--checkpoint-every auto and --mtbf-hours: give both (the interval is sqrt(2 x save cost x MTBF)) or neither");
    o.mtbf_hours = mtbf_hours;
    o.output_dir = output_dir, o.save_model = save_model, o.resume = resume;
    if (checkpoint_async && checkpoint_every == 0) fatal("--checkpoint-async: there is no checkpoint to write without --checkpoint-every N");
    o.checkpoint_async = checkpoint_async;
    o.collective_timeout = collective_timeout, o.check_replicas = check_replicas;
    if (straggler_factor != 0.0f && !(straggler_factor > 1.0f))
        fatal("--straggler-factor %g: 0 (off) or above 1 (at or below 1, a rank as fast as the others is named)",
              straggler_factor);
    o.straggler_factor = straggler_factor, o.straggler_steps = straggler_steps;
    o.plan_ranks = plan_ranks, o.search_ranks = search_ranks, o.plan_top = plan_top;
    // the profile, then the run's memory, then what the flags given replace
    PlanHardware& hw = o.hardware;
    hw = machine_profile_read(machine);
    hw.gpu_memory_bytes = gpu_memory_gib * (double)(1 << 30), hw.reserve_bytes = reserve_gib * (double)(1 << 30);
    if (flags.was_given("gpus-per-node")) hw.ranks_per_node = gpus_per_node;
    if (flags.was_given("peak-tflops")) hw.peak_flops = peak_tflops * 1e12;
    if (flags.was_given("hbm-bandwidth")) hw.hbm_bytes_per_second = hbm_gbps * 1e9;
    if (flags.was_given("pcie-bandwidth")) hw.pcie_bytes_per_second = pcie_gbps * 1e9;
    if (hw.ranks_per_leaf < hw.ranks_per_node)
        fatal("--gpus-per-node %d: more than the --machine profile's ranks_per_leaf %d", hw.ranks_per_node,
              hw.ranks_per_leaf);
    o.flags_json = flags.to_json();
    return o;
}

inline Options parse_options(int argc, char** argv) {
    Flags flags("train_gpt", "Trains a GPT-2 or Llama 3 model, dense or a mixture of experts, on token shards "
                "(llm.c's format), on one GPU, on many, or on the CPU.");
    return parse_options(flags, argc, argv);
}
