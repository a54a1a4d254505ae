/*
Logging: one human-readable line per training step on the console, and the same numbers as
machine-readable JSON lines (one JSON object per line) in <output_dir>/log.jsonl, for plots and tests.

    Logger logger(output_dir, resuming, rank == 0);  // append to the log when resuming; only rank 0 logs
    logger.config(flags);                         // {"event": "config", "flags": {...}}
    StepStats stats;                              // fill in after each optimizer step
    stats.step = step + 1; stats.total_steps = steps; stats.loss = loss; stats.learning_rate = lr;
    stats.grad_norm = norm; stats.seconds = seconds; stats.tokens = B * T * accumulation * data_parallel;
    stats.memory_bytes = device_memory_in_use_bytes(); stats.mfu = mfu;   // mfu < 0: unknown, not shown
    logger.step(stats);
    logger.val_loss(step + 1, val_loss);
    logger.sample(step + 1, text);
    logger.checkpoint(step + 1, path, save_ms, async);
    logger.straggler(step + 1, rank, ratio, steps, compute_seconds, median_seconds);  // llmc/parallel/stragglers.h
    logger.write(JsonLine("my_event").integer("step", s).number("value", v));   // anything else

Step numbers everywhere are the number of optimizer steps completed: the line after the first step says
step 1, a validation loss measured before training is at step 0, and checkpoint_<step>.bin holds the state
after that many steps, so the three agree.

Console line:
    step   12/5000 | loss 5.214573 | lr 3.00e-04 | norm 1.1234 | 312.5 ms | 104858 tok/s | 2341 MiB | MFU 41.3% | ETA 25m59s
Under a batch ramp (llmc/batch_ramp.h) the line shows the step's tokens too, "| batch 32768" after the memory;
the JSON line always has them ("batch_tokens").
The ETA is the steps still to run times the mean step time of this run (StepTimer below): the first step
is left out of the mean once there are others, because it pays for warm-up (cuBLAS heuristics, first-touch
allocations) that later steps do not. Validation, samples and checkpoints are not counted in it.
Where the build counts them (the CPU build: HostCalls below), the step's line in log.jsonl adds each rank's
allocations, frees, device-to-host copies, synchronisations and event waits inside train_step, one list per kind in rank
order, the mixture-of-experts layer passes they ran, and of the copies those of the offloaded optimizer state:
"host_calls": {"allocations": [0, 0], "frees": [0, 0], "d2h_copies": [1, 1], "syncs": [1, 1], "event_waits": [6, 6],
"moe_layer_passes": [0, 0], "offload_downloads": [0, 0]} (the README's budget; the console line
leaves them out). A step whose pipeline timeline the trainer measures (the last, under pp or --trace) has none.
JSON line (same numbers; "time_s", seconds since the logger was created, ends every line; a non-finite
number such as a NaN loss becomes null, because JSON has no NaN and a diverged run is exactly the one whose
log must still parse; so does an unknown MFU):
    {"event": "step", "step": 12, "total_steps": 5000, "loss": 5.2145729, "lr": 0.000300000014,
     "grad_norm": 1.12339997, "ms": 312.5, "batch_tokens": 32768, "tokens_per_s": 104857.6, "memory_mib": 2341, "mfu": 0.413, ..., "eta_s": 1558.75, "time_s": 12.5}

Each line is flushed as it is written, so a killed run keeps its log up to the last step. With append =
true (resuming) the file is continued instead of started over. A disabled logger (ranks other than 0)
does nothing at all.

device_memory_in_use_bytes(): the GPU's memory in use, total minus free from cudaMemGetInfo (this counts
the CUDA context and any other process on the GPU too: it is what nvidia-smi shows). The CPU build counts
the bytes the program holds through cudaMalloc.
*/
#pragma once

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <vector>
#include "../cuda_common.cuh"
#include "flags.h"
#include "../planning/mfu.h"
#include "../noise_scale.h"
#include "../utils.h"

inline size_t device_memory_in_use_bytes() {
#ifdef LLMC_CPU
    cudacpu::Allocations& allocations = cudacpu::allocations();
    std::lock_guard<std::mutex> guard(allocations.lock);
    return allocations.in_use;
#else
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
#endif
}

// What takes the host's lead over the device, counted over a stretch of the program: allocations and frees
// (cudaMalloc, cudaMallocHost, cudaFree, cudaFreeHost), device-to-host copies, synchronisations (of a
// stream, the device, or a synchronous copy) and event waits (cudaEventSynchronize: a staging slot's reuse,
// llmc/cpu/runtime.h says why apart). The CPU build counts them (llmc/cpu/runtime.h); the
// GPU build does not, and reports none (host_calls_counted). moe_layer_passes is not a call: the mixture-of-
// experts layers' forward passes in the stretch, each of which copies its rows per expert to the host once.
// offload_downloads, of the device-to-host copies, are those of the offloaded optimizer state (--offload
// optimizer, llmc/parallel/zero.h): ordered by events, never read by the host in the step, so they take no lead.
struct HostCalls {
    long long allocations = 0, frees = 0, device_to_host_copies = 0, synchronizations = 0, event_waits = 0;
    long long moe_layer_passes = 0, offload_downloads = 0;
};
#ifdef LLMC_CPU
constexpr bool host_calls_counted = true;
inline HostCalls host_calls_so_far() {
    const cudacpu::HostCallCounts c = cudacpu::host_call_counts();
    return HostCalls{c.allocations, c.frees, c.device_to_host_copies, c.synchronizations, c.event_waits, 0};
}
#else
constexpr bool host_calls_counted = false;
inline HostCalls host_calls_so_far() { return HostCalls{}; }
#endif
inline HostCalls host_calls_since(const HostCalls& start) {
    const HostCalls now = host_calls_so_far();
    return HostCalls{now.allocations - start.allocations, now.frees - start.frees,
                     now.device_to_host_copies - start.device_to_host_copies,
                     now.synchronizations - start.synchronizations, now.event_waits - start.event_waits, 0};
}

// mkdir -p: creates the directory and any missing parents; an existing directory is fine.
inline void make_directories(const std::string& path) {
    if (path.empty()) fatal("cannot create a directory with an empty name");
    for (size_t end = 1; end <= path.size(); end++) {
        if (end != path.size() && path[end] != '/') continue;
        std::string prefix = path.substr(0, end);
        if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
            fatal("cannot create directory %s: %s", prefix.c_str(), strerror(errno));
    }
    struct stat info;
    if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
        fatal("cannot create directory %s: a file with that name is in the way", path.c_str());
}

// One JSON object, built member by member: JsonLine("step").integer("step", 3).number("loss", 2.5).str()
// gives {"event": "step", "step": 3, "loss": 2.5}.
class JsonLine {
public:
    explicit JsonLine(const std::string& event) { text_ = "{\"event\": " + json_quote(event); }
    JsonLine& number(const std::string& key, double value) {
        char formatted[64];
        snprintf(formatted, sizeof(formatted), "%.9g", value);  // 9 digits give back every float exactly
        return raw(key, std::isfinite(value) ? formatted : "null");
    }
    JsonLine& integer(const std::string& key, long long value) { return raw(key, std::to_string(value)); }
    JsonLine& text(const std::string& key, const std::string& value) { return raw(key, json_quote(value)); }
    JsonLine& raw(const std::string& key, const std::string& json_value) {
        text_ += ", " + json_quote(key) + ": " + json_value;
        return *this;
    }
    std::string str() const { return text_ + "}"; }

private:
    std::string text_;
};

// A duration for people: "0s", "59s", "1m01s", "4m12s", "1h03m" (whole seconds, rounded; minutes when an
// hour or more, where the seconds no longer matter). Unknown (negative or not finite): "?".
inline std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    long long total = std::llround(seconds);
    char text[48];
    if (total < 60) snprintf(text, sizeof(text), "%llds", total);
    else if (total < 3600) snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
    else snprintf(text, sizeof(text), "%lldh%02lldm", total / 3600, (total % 3600) / 60);
    return text;
}

// The mean step time of this run, for the ETA: the first step is excluded as soon as a second one has run,
// since it carries one-time warm-up costs that would otherwise inflate the estimate for the whole run.
class StepTimer {
public:
    void add(double seconds) {
        if (count_ == 0) first_ = seconds;
        else later_total_ += seconds;
        count_++;
    }
    double mean_seconds() const {
        if (count_ == 0) return 0.0;
        return count_ == 1 ? first_ : later_total_ / (double)(count_ - 1);
    }
    double remaining_seconds(long long remaining_steps) const {
        return remaining_steps > 0 ? (double)remaining_steps * mean_seconds() : 0.0;
    }

private:
    long long count_ = 0;
    double first_ = 0.0;
    double later_total_ = 0.0;
};

// Bytes a rank sent to other ranks during a step: all of them, and those to its tp group, to the other
// pipeline stages (activations, gradients, tied embeddings) and to its cp group (key/value blocks, all-to-alls).
struct StepTraffic {
    long long total = 0, tp = 0, pp = 0, cp = 0, ep = 0;
};

struct StepStats {
    long long step = 0;         // optimizer steps completed, counting this one
    long long total_steps = 0;
    float loss = 0.0f;
    float learning_rate = 0.0f;
    float grad_norm = 0.0f;
    double seconds = 0.0;       // wall time of this step
    long long tokens = 0;       // tokens trained on in this step, all ranks together (the batch)
    bool show_batch = false;    // on the console line too (a batch ramp: it changes)
    size_t memory_bytes = 0;    // device_memory_in_use_bytes()
    double mfu = -1.0;          // fraction of peak (0.41 = 41%); negative when the GPU's peak is unknown
    double hfu = -1.0;          // the same for the hardware FLOPs, recomputation included (llmc/parallel/recompute.h)
    double model_flops = 0;     // this rank's share of the model's FLOPs in this step
    double hardware_flops = 0;  // ... and of the FLOPs it ran, recomputation included
    long long comm_bytes = 0;   // bytes this rank sent to other ranks during the step (0: one rank)
    long long tp_comm_bytes = 0;  // ... of them, to its tensor-parallel group
    long long pp_comm_bytes = 0;  // ... to the other pipeline stages (activations, gradients, tied embeddings)
    long long cp_comm_bytes = 0;  // ... to its context-parallel group (key/value blocks, all-to-alls)
    long long ep_comm_bytes = 0;  // ... to its expert-parallel group (routing counts, routed rows)
    std::vector<HostCalls> host_calls;  // every rank's, in rank order (empty: not counted)
};

class Logger {
public:
    Logger(const std::string& output_dir, bool append = false, bool enabled = true)
        : enabled_(enabled), start_(std::chrono::steady_clock::now()) {
        if (!enabled_) return;
        make_directories(output_dir);
        path_ = output_dir + "/log.jsonl";
        file_ = open_file(path_, append ? "a" : "w");
    }
    Logger(const Logger&) = delete;
    Logger& operator=(const Logger&) = delete;
    ~Logger() {
        if (file_) fclose(file_);
    }

    const std::string& path() const { return path_; }

    // Every flag's value, so that the log alone says how the run was made.
    void config(const Flags& flags) { config(flags.to_json()); }
    void config(const std::string& flags_json) { write(JsonLine("config").raw("flags", flags_json)); }

    // What every step of the run shares, for the step lines: the steps, the model's FLOPs per token and the extra
    // FLOPs per token that recomputation runs (llmc/planning/mfu.h, llmc/parallel/recompute.h), the ranks that
    // share them, and the device's peak FLOP/s (negative: unknown). `ramped`: the batch changes during the run
    // (llmc/batch_ramp.h), and the console line shows it.
    void run(long long total_steps, double model_flops_per_token, double recompute_flops_per_token, int ranks,
             double peak_flops, bool ramped = false) {
        total_steps_ = total_steps, model_flops_per_token_ = model_flops_per_token;
        recompute_flops_per_token_ = recompute_flops_per_token, ranks_ = ranks, peak_flops_ = peak_flops;
        ramped_ = ramped;
    }
    // The tokens of the steps that follow, all ranks together, and this rank's share of their FLOPs.
    void step_tokens(long long tokens) {
        tokens_per_step_ = tokens;
        const double model_flops = model_flops_per_token_ * tokens;
        const double hardware_flops = model_flops + recompute_flops_per_token_ * tokens;
        model_flops_ = model_flops / ranks_, hardware_flops_ = hardware_flops / ranks_;
    }

    // A step's line, from what it measured: the statistics the log keeps, MFU (llmc/planning/mfu.h) included.
    void step(long long number, float loss, float learning_rate, float grad_norm, double seconds,
              const StepTraffic& traffic, const std::vector<HostCalls>& host_calls = {}) {
        StepStats stats;
        stats.step = number;
        stats.total_steps = total_steps_;
        stats.loss = loss;
        stats.learning_rate = learning_rate;
        stats.grad_norm = grad_norm;
        stats.seconds = seconds;
        stats.tokens = tokens_per_step_;
        stats.show_batch = ramped_;
        stats.memory_bytes = device_memory_in_use_bytes();
        stats.mfu = model_flops_utilization(model_flops_, seconds, peak_flops_);
        stats.hfu = model_flops_utilization(hardware_flops_, seconds, peak_flops_);
        stats.model_flops = model_flops_;
        stats.hardware_flops = hardware_flops_;
        stats.comm_bytes = traffic.total;
        stats.tp_comm_bytes = traffic.tp;
        stats.pp_comm_bytes = traffic.pp;
        stats.cp_comm_bytes = traffic.cp;
        stats.ep_comm_bytes = traffic.ep;
        stats.host_calls = host_calls;
        step(stats);
    }

    void step(const StepStats& s) {
        if (!enabled_) return;
        double tokens_per_second = s.seconds > 0 ? s.tokens / s.seconds : 0.0;
        double memory_mib = s.memory_bytes / (1024.0 * 1024.0);
        int width = (int)std::to_string(s.total_steps).size();
        char line[512];
        int n = snprintf(line, sizeof(line),
                         "step %*lld/%lld | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | %.0f MiB",
                         width, s.step, s.total_steps, s.loss, s.learning_rate, s.grad_norm, s.seconds * 1e3,
                         tokens_per_second, memory_mib);
        if (s.show_batch && n > 0 && n < (int)sizeof(line))
            n += snprintf(line + n, sizeof(line) - n, " | batch %lld", s.tokens);
        if (s.mfu >= 0 && n > 0 && n < (int)sizeof(line)) {
            n += snprintf(line + n, sizeof(line) - n, " | MFU %.1f%%", 100.0 * s.mfu);
            if (s.hfu >= 0 && n < (int)sizeof(line)) n += snprintf(line + n, sizeof(line) - n, " HFU %.1f%%", 100.0 * s.hfu);
        } else if (s.model_flops > 0 && s.seconds > 0 && n > 0 && n < (int)sizeof(line)) {  // unknown peak: rates
            n += snprintf(line + n, sizeof(line) - n, " | %.1f GFLOP/s model, %.1f hardware",
                          s.model_flops / s.seconds / 1e9, s.hardware_flops / s.seconds / 1e9);
        }
        if (s.comm_bytes > 0 && n > 0 && n < (int)sizeof(line))
            n += snprintf(line + n, sizeof(line) - n, " | sent %.1f MiB", s.comm_bytes / (1024.0 * 1024.0));
        step_timer_.add(s.seconds);
        double eta_seconds = step_timer_.remaining_seconds(s.total_steps - s.step);
        if (n > 0 && n < (int)sizeof(line))
            snprintf(line + n, sizeof(line) - n, " | ETA %s", format_duration(eta_seconds).c_str());
        printf("%s\n", line);
        fflush(stdout);
        JsonLine json("step");
        json.integer("step", s.step).integer("total_steps", s.total_steps).number("loss", s.loss);
        json.number("lr", s.learning_rate).number("grad_norm", s.grad_norm).number("ms", s.seconds * 1e3);
        json.integer("batch_tokens", s.tokens);
        json.number("tokens_per_s", tokens_per_second).number("memory_mib", memory_mib);
        json.number("mfu", s.mfu >= 0 ? s.mfu : NAN);  // unknown peak: null
        json.number("hfu", s.hfu >= 0 ? s.hfu : NAN);
        json.number("model_flops", s.model_flops).number("hardware_flops", s.hardware_flops);
        json.integer("comm_bytes", s.comm_bytes);
        json.integer("tp_comm_bytes", s.tp_comm_bytes);
        json.integer("pp_comm_bytes", s.pp_comm_bytes);
        json.integer("cp_comm_bytes", s.cp_comm_bytes);
        json.integer("ep_comm_bytes", s.ep_comm_bytes);
        if (!s.host_calls.empty()) json.raw("host_calls", host_calls_json(s.host_calls));
        json.number("eta_s", eta_seconds);
        write(json);
    }

    // A mixture of experts' routing over a step: the load-balancing and z-losses (sums over layers of their
    // means), the rows each expert ran (tokens: layers x experts, row-major) and the assignments dropped.
    void experts(long long step, float aux_loss, float z_loss, const std::vector<long long>& tokens, int experts,
                 long long dropped) {
        if (!enabled_) return;
        printf("experts: aux loss %.6f | z loss %.4f | dropped %lld\n", aux_loss, z_loss, dropped);
        fflush(stdout);
        std::string layers = "[";
        for (size_t i = 0; i < tokens.size(); i++) {
            if (i % experts == 0) layers += i == 0 ? "[" : "], [";
            else layers += ", ";
            layers += std::to_string(tokens[i]);
        }
        layers += tokens.empty() ? "]" : "]]";
        write(JsonLine("experts").integer("step", step).number("aux_loss", aux_loss).number("z_loss", z_loss)
                  .integer("dropped", dropped).raw("tokens", layers));
    }

    // The gradient noise scale after a step (llmc/noise_scale.h): B_simple and the smoothed estimates of |G|^2 and
    // tr(Sigma) it is the ratio of, then the step's own estimates and what they came from.
    void noise_scale(const NoiseScaleMeasurement& m) {
        if (!enabled_) return;
        char b_simple[32] = "n/a";  // while the smoothed |G|^2 is not positive (null in the log)
        if (std::isfinite(m.b_simple)) snprintf(b_simple, sizeof(b_simple), "%.0f tokens", m.b_simple);
        printf("noise scale: B_simple %s | |G|^2 %.4e | tr(Sigma) %.4e (smoothed)\n", b_simple,
               m.grad_squared_smoothed, m.trace_smoothed);
        fflush(stdout);
        write(JsonLine("noise_scale").integer("step", m.step).number("b_simple", m.b_simple)
                  .number("grad_sq", m.grad_squared_smoothed).number("trace_sigma", m.trace_smoothed)
                  .number("grad_sq_step", m.grad_squared).number("trace_sigma_step", m.trace)
                  .number("small_norm_sq", m.small_norm_squared).number("big_norm_sq", m.big_norm_squared)
                  .number("small_tokens", m.small_tokens).number("big_tokens", m.big_tokens));
    }

    void val_loss(long long step, float loss) {
        if (!enabled_) return;
        printf("val loss %.6f at step %lld\n", loss, step);
        fflush(stdout);
        write(JsonLine("val_loss").integer("step", step).number("loss", loss));
    }

    void sample(long long step, const std::string& text) {
        if (!enabled_) return;
        printf("sample at step %lld:\n%s\n", step, text.c_str());
        fflush(stdout);
        write(JsonLine("sample").integer("step", step).text("text", text));
    }

    // save_ms: how long the training loop was held (an asynchronous save: the copy to host memory and the wait for
    // the save before it; its files are complete once the next save or the end of the run has waited for them)
    void checkpoint(long long step, const std::string& path, double save_ms, bool async) {
        if (!enabled_) return;
        printf("checkpoint at step %lld: %s%s\n", step, path.c_str(), async ? " (being written in the background)" : "");
        fflush(stdout);
        write(JsonLine("checkpoint").integer("step", step).text("path", path).number("save_ms", save_ms)
                  .raw("async", async ? "true" : "false"));
    }

    // A rank whose compute stayed above --straggler-factor times the others' median (llmc/parallel/stragglers.h):
    // over `steps` steps up to `step` by `ratio` on average; the last step's compute and median.
    void straggler(long long step, int rank, double ratio, int steps, double compute_seconds, double median_seconds) {
        if (!enabled_) return;
        printf("warning: straggler: rank %d computed %.2fx the median for %d steps (step %lld)\n", rank, ratio, steps,
               step);
        fflush(stdout);
        write(JsonLine("straggler").integer("step", step).integer("rank", rank).number("ratio", ratio)
                  .integer("steps", steps).number("compute_ms", compute_seconds * 1e3)
                  .number("median_ms", median_seconds * 1e3));
    }

    // Appends one line to log.jsonl, with "time_s" added as its last member.
    void write(JsonLine line) {
        if (!enabled_) return;
        line.number("time_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
        std::string json = line.str() + "\n";
        write_exact(json.data(), 1, json.size(), file_, path_);
        if (fflush(file_) != 0) fatal("cannot write %s: %s", path_.c_str(), strerror(errno));
    }

private:
    // {"allocations": [per rank], "frees": [...], "d2h_copies": [...], "syncs": [...], "event_waits": [...],
    //  "moe_layer_passes": [...], "offload_downloads": [...]}
    static std::string host_calls_json(const std::vector<HostCalls>& ranks) {
        auto list = [&](long long HostCalls::*member) {
            std::string text = "[";
            for (size_t r = 0; r < ranks.size(); r++) text += (r ? ", " : "") + std::to_string(ranks[r].*member);
            return text + "]";
        };
        return "{\"allocations\": " + list(&HostCalls::allocations) + ", \"frees\": " + list(&HostCalls::frees) +
               ", \"d2h_copies\": " + list(&HostCalls::device_to_host_copies) + ", \"syncs\": " +
               list(&HostCalls::synchronizations) + ", \"event_waits\": " + list(&HostCalls::event_waits) +
               ", \"moe_layer_passes\": " + list(&HostCalls::moe_layer_passes) +
               ", \"offload_downloads\": " + list(&HostCalls::offload_downloads) +
               "}";
    }

    bool enabled_;
    std::chrono::steady_clock::time_point start_;
    StepTimer step_timer_;  // this run's steps only: a resumed run starts a new logger and a new mean
    long long total_steps_ = 0;  // set by run()
    double model_flops_per_token_ = 0, recompute_flops_per_token_ = 0, peak_flops_ = 0;
    int ranks_ = 1;
    bool ramped_ = false;
    long long tokens_per_step_ = 0;  // set by step_tokens()
    double model_flops_ = 0, hardware_flops_ = 0;
    std::string path_;
    FILE* file_ = nullptr;
};
