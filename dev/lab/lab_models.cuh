/*
Kernel lab: every kernel at the shapes of every named model (llmc/model/parameters.h: GPT-2 124M to 1558M,
Llama 3 8B, 70B and 405B, mixtral-8x7B-like, deepseek-v3-like), on a few tokens each: the real width C,
heads, K/V heads, head size, hidden units F and experts E, against the families' own references. What a
real run adds (more rows, longer sequences) lengthens grids, not blocks: a kernel's block and its shared
memory depend on the widths, which are the real ones here. The embedding tables use a vocabulary of 512
rows (their kernels read the rows of the batch's tokens, and C is the real one); the classifier runs the
whole padded vocabulary, at the 512 threads per row the GPU build launches.

On the CPU device each model runs twice, under the H100's limits and the A100's (llmc/cpu/runtime.h,
switched at run time; the second time, and under AddressSanitizer, attention runs one K/V head's group, see
check_model), and every launch is recorded: the table that follows gives, per kernel, the dynamic
shared memory per block at each model (the limits: 227 and 163 KiB), the threads per block and the
largest grid, and then, for each GPU, the launch that came closest to each limit. Static __shared__ arrays
are fixed at compile time and do not grow with a model (scripts/bench/kernel_report.sh lists them).
*/
#pragma once

#include <map>
#include "lab.h"
#include "../../llmc/model/parameters.h"

namespace models_lab {

struct NamedModel {
    const char* name;   // as --model takes it
    const char* label;  // the table's column
};
const NamedModel kModels[] = {
    {"124M", "124M"}, {"350M", "350M"}, {"774M", "774M"}, {"1558M", "1558M"},
    {"llama3-8B", "8B"}, {"llama3-70B", "70B"}, {"llama3-405B", "405B"},
    {"mixtral-8x7B-like", "mixtral"}, {"deepseek-v3-like", "deepseek"},
};
constexpr int kTokens = 4;           // one sequence of 4 tokens
constexpr int kEmbeddingVocab = 512;

inline GPT2Config config_of(const char* name) {
    GPT2Config c;
    if (!gpt2_config_by_name(name, &c) && !llama_config_by_name(name, &c) && !moe_config_by_name(name, &c)) {
        fprintf(stderr, "error: kernel lab: no model named %s\n", name);
        exit(EXIT_FAILURE);
    }
    return c;
}

// Every kernel family the model's block uses, at its widths. `one_kv_group`: attention runs the query heads of
// one K/V head only (its blocks are the model's, their number, grid.y, is the head count): the emulated
// tensor cores make attention at head size 128 most of the family's time, and a second pass under other
// limits needs its blocks, not all of them again.
inline void check_model(const GPT2Config& c, bool one_kv_group) {
    const int B = 1, T = kTokens, N = B * T, C = c.channels;
    const int group = c.num_heads / c.kv_heads;
    const AttentionHeads heads = one_kv_group ? AttentionHeads{group, 1, c.head_size()}
                                              : AttentionHeads{c.num_heads, c.kv_heads, c.head_size()};
    if (c.llama()) {
        encoder_lab::check_vocab_slices(B, T, C, kEmbeddingVocab, 1);
        layernorm_lab::check_rms_forward(N, C, c.norm_eps);
        layernorm_lab::check_rms_fused_residual(N, C);
        layernorm_lab::check_rms_backward(N, C);
        rope_lab::check(rope_lab::Shape{B, T, 0, c.num_heads, c.kv_heads, c.head_size(), c.rope_theta});
        swiglu_lab::check(N, c.ffn_hidden);
    } else {
        encoder_lab::check(B, T, C, kEmbeddingVocab);
        layernorm_lab::check_forward(N, C);
        layernorm_lab::check_fused_residual(N, C);
        layernorm_lab::check_residual(N, C);
        layernorm_lab::check_backward(N, C);
        gelu_lab::check((size_t)N * 4 * C);
        // the bias gradient (ours; the product is cuBLASLt's) at the MLP's 4C outputs; its launch does not
        // depend on the inner dimension, kept at 64 so that the reference stays cheap
        matmul_lab_check_shape(N, 64, 4 * C);
    }
    lab_attention_shape(B, T, heads, false);
    if (c.experts > 0) moe_lab::check(moe_lab::Case{B, T, c.experts, c.experts_per_token, 0, C, moe_lab::Routing::Random});
    classifier_lab_check_shape(N, c.vocab_size, c.padded_vocab_size, false, 512);
    adamw_lab_check((size_t)4 * C, 0, true);
    global_norm_lab_check((size_t)4 * C, 0);
}

#ifdef LLMC_CPU
// What one kernel's launches asked for, at one model under one GPU's limits: the largest of each.
struct Usage {
    size_t shared_bytes = 0;
    int threads = 0;
    unsigned grid[3] = {0, 0, 0};
};
// kernel name -> model index -> GPU index -> usage
using UsageTable = std::map<std::string, std::map<int, std::map<int, Usage>>>;

inline std::string kernel_name(const void* kernel) {
    std::string name = cudacpu::describe_function(kernel);
    if (name.rfind("void ", 0) == 0) name = name.substr(5);
    return name;
}

inline void add_launches(UsageTable& table, const std::vector<cudacpu::LaunchRecord>& records, int model, int gpu) {
    for (const cudacpu::LaunchRecord& r : records) {
        Usage& u = table[kernel_name(r.kernel)][model][gpu];
        u.shared_bytes = std::max(u.shared_bytes, r.shared_bytes);
        u.threads = std::max(u.threads, (int)(r.block.x * r.block.y * r.block.z));
        const unsigned dims[3] = {r.grid.x, r.grid.y, r.grid.z};
        for (int d = 0; d < 3; d++) u.grid[d] = std::max(u.grid[d], dims[d]);
    }
}

// One row per kernel with dynamic shared memory (KiB per model; "H100/A100" where the launcher chose
// differently under the two limits), then one line for all the others; then, per GPU, the launch closest to
// each limit.
inline void print_table(const UsageTable& table) {
    const int models = (int)(sizeof(kModels) / sizeof(kModels[0]));
    const int gpus = (int)(sizeof(cudacpu::kEmulatedGpus) / sizeof(cudacpu::kEmulatedGpus[0]));
    printf("  dynamic shared memory per block, KiB (H100/A100 where they differ; limits %zu and %zu KiB):\n",
           cudacpu::kH100.shared_bytes_opt_in / 1024, cudacpu::kA100.shared_bytes_opt_in / 1024);
    printf("  %-48s %7s", "kernel", "threads");
    for (const NamedModel& m : kModels) printf(" %8s", m.label);
    printf("\n");
    int other_kernels = 0, other_threads = 0;
    std::string other_threads_kernel;
    for (const auto& [name, per_model] : table) {
        size_t most = 0;
        int threads = 0;
        for (const auto& [model, per_gpu] : per_model)
            for (const auto& [gpu, u] : per_gpu) most = std::max(most, u.shared_bytes), threads = std::max(threads, u.threads);
        if (most == 0) {
            other_kernels++;
            if (threads > other_threads) other_threads = threads, other_threads_kernel = name;
            continue;
        }
        printf("  %-48.48s %7d", name.c_str(), threads);
        for (int m = 0; m < models; m++) {
            auto found = per_model.find(m);
            char cell[32] = "-";
            if (found != per_model.end()) {
                const double h100 = found->second.count(0) ? found->second.at(0).shared_bytes / 1024.0 : 0.0;
                const double a100 = found->second.count(1) ? found->second.at(1).shared_bytes / 1024.0 : 0.0;
                if (h100 == a100) snprintf(cell, sizeof(cell), "%.0f", h100);
                else snprintf(cell, sizeof(cell), "%.0f/%.0f", h100, a100);
            }
            printf(" %8s", cell);
        }
        printf("\n");
    }
    printf("  %d other kernels use no dynamic shared memory; at most %d threads per block (%s)\n", other_kernels,
           other_threads, other_threads_kernel.c_str());
    for (int g = 0; g < gpus; g++) {
        const cudacpu::EmulatedGpu& gpu = *cudacpu::kEmulatedGpus[g];
        // the largest share of each limit, and where
        struct Closest { double share = 0; std::string where; } shared, threads, grid_yz;
        for (const auto& [name, per_model] : table)
            for (const auto& [model, per_gpu] : per_model) {
                auto found = per_gpu.find(g);
                if (found == per_gpu.end()) continue;
                const Usage& u = found->second;
                const std::string where = name + " at " + kModels[model].label;
                const double shared_share = (double)u.shared_bytes / gpu.shared_bytes_opt_in;
                const double thread_share = (double)u.threads / gpu.max_threads_per_block;
                const double grid_share = std::max(u.grid[1], u.grid[2]) / 65535.0;
                char detail[96];
                if (shared_share > shared.share) {
                    snprintf(detail, sizeof(detail), ": %zu of %zu bytes", u.shared_bytes, gpu.shared_bytes_opt_in);
                    shared = {shared_share, where + detail};
                }
                if (thread_share > threads.share) {
                    snprintf(detail, sizeof(detail), ": %d of %d", u.threads, gpu.max_threads_per_block);
                    threads = {thread_share, where + detail};
                }
                if (grid_share > grid_yz.share) {
                    snprintf(detail, sizeof(detail), ": grid %u,%u,%u (y, z at most 65535)", u.grid[0], u.grid[1],
                             u.grid[2]);
                    grid_yz = {grid_share, where + detail};
                }
            }
        printf("  closest to the %s's limits: shared memory %.0f%% (%s); threads %.0f%% (%s); grid.y/z %.1f%% (%s)\n",
               gpu.name, 100 * shared.share, shared.where.c_str(), 100 * threads.share, threads.where.c_str(),
               100 * grid_yz.share, grid_yz.where.c_str());
    }
}
#endif

}  // namespace models_lab

void lab_models() {
    if (!family_selected("models")) return;
    const bool was_quiet = lab.quiet;
    lab.quiet = true;  // hundreds of checks: print the failures, and a line per model
#ifdef LLMC_CPU
    const cudacpu::EmulatedGpu& chosen = cudacpu::emulated_gpu();
    models_lab::UsageTable table;
    std::vector<cudacpu::LaunchRecord> records;
    int g = 0;
    for (const cudacpu::EmulatedGpu* gpu : cudacpu::kEmulatedGpus) {
        cudacpu::set_emulated_gpu(*gpu);
#else
    {
#endif
        int m = 0;
        for (const models_lab::NamedModel& model : models_lab::kModels) {
            const GPT2Config c = models_lab::config_of(model.name);
            const int passed = lab.passed, failed = lab.failed;
#ifdef LLMC_CPU
            records.clear();
            cudacpu::launch_records = &records;
#endif
#ifdef LLMC_CPU
            // under AddressSanitizer one K/V group always: every head's blocks make the same accesses, and the
            // other four runs of the lab see all the heads
#if defined(__SANITIZE_ADDRESS__)
            models_lab::check_model(c, true);
#else
            models_lab::check_model(c, gpu != cudacpu::kEmulatedGpus[0]);
#endif
#else
            models_lab::check_model(c, false);
#endif
#ifdef LLMC_CPU
            cudacpu::launch_records = nullptr;
            models_lab::add_launches(table, records, m, g);
            const char* limits = gpu->name;
#else
            const char* limits = "this GPU";
#endif
            printf("  %-18s C %5d, heads %3d/%d of %3d, F %5zu, E %3d: %s limits, %d checks, %d failed\n", model.name,
                   c.channels, c.num_heads, c.kv_heads, c.head_size(), c.expert_hidden(), c.experts, limits,
                   lab.passed + lab.failed - passed - failed, lab.failed - failed);
            m++;
        }
#ifdef LLMC_CPU
        g++;
    }
    cudacpu::set_emulated_gpu(chosen);
    models_lab::print_table(table);
#else
    }
#endif
    lab.quiet = was_quiet;
}
