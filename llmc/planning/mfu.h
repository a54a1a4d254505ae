/*
Model FLOPs utilisation (MFU): the fraction of the GPU's peak arithmetic that the model's own math uses.

    double per_token = gpt2_flops_per_token(num_parameters, L, C, T);
    double peak = peak_flops_per_second(device_properties().name, PRECISION_NAME);   // -1: unknown GPU
    double mfu = model_flops_utilization(per_token * tokens_this_gpu_per_step, seconds_per_step, peak);
    if (mfu >= 0) ... print 100 * mfu percent

FLOPs per token of training (forward + backward), after PaLM (Chowdhery et al. 2022, appendix B):
    flops_per_token = 6 * N + 12 * L * C * T
  6 * N: every parameter takes part in one multiply-add (2 FLOPs) per token in the forward pass, and the
         backward pass does twice that (the gradient with respect to the input and with respect to the
         weight): 2 + 4 = 6 FLOPs per parameter per token.
         N counts ALL parameters as stored, embeddings included. wte is also the LM head (tied), so its
         6 * Vp * C FLOPs are real matmul work; wpe is only looked up, but at GPT-2 124M it is 0.6% of N, and
         counting everything keeps N equal to the parameter count the program prints at startup.
  12 * L * C * T: attention's two matmuls, which have no parameters. Per layer and token, the scores
         q . k over T keys cost 2 * T * C (all heads together), and the weighted sum of T values another
         2 * T * C: 4 * T * C forward, times 3 for forward + backward = 12 * T * C.
         This counts the full T x T score matrix, as PaLM does, although a causal kernel only computes the
         lower triangle (about half). We keep PaLM's convention so that numbers compare with published
         MFU; the attention term is ~13% of the total for GPT-2 124M at T = 1024, so a causal count would
         read about 7% lower there.
  Llama: the same formula, with N every parameter but wte, which is only looked up there (its LM head is a
         tensor of its own, counted). Grouped-query attention shares K/V heads but every query head still
         scores T keys, so the 12 * L * C * T term is unchanged; SwiGLU's three matrices are in N.
  Work the model does not need (recomputed activations, optimizer updates) is not model FLOPs: MFU
  measures useful work, not how busy the GPU was. (N as stored does include wte's padding rows V..Vp-1,
  47 * 768 parameters for GPT-2: 0.03%, not worth a special case.)

Peak FLOP/s: the datasheet dense (no sparsity) tensor-core rate for BF16 inputs with FP32 accumulation,
and for the FP32 build (whose matmuls are true FP32, no TF32) the plain FP32 rate. Only GPUs whose
numbers we are sure of are listed; any other name (and the CPU build's device) gives -1 ("unknown")
and MFU is then not reported. Variants with different clocks or unlisted numbers (H100 NVL, RTX 3090 Ti,
...) are listed as unknown explicitly so that they do not fall through to their sibling's row.
*/
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>
#include "../utils.h"
#include "../model/parameters.h"

inline double gpt2_flops_per_token(long long num_parameters, int num_layers, int channels, int seq_len) {
    return 6.0 * (double)num_parameters + 12.0 * (double)num_layers * (double)channels * (double)seq_len;
}

// The parameters a token meets: all of them, but in a mixture of experts only the K experts it is routed to
// of the E in each mixture block (the router and the shared experts it meets whole). Mixtral's 47B have 13B
// active.
inline double idle_expert_parameters_per_mixture(const GPT2Config& c) {
    if (!c.moe()) return 0.0;
    return (double)(c.experts - c.experts_per_token) / c.experts *
           (double)(tensor_elements(c, EXPERTFCW) + tensor_elements(c, EXPERTPROJW));
}
inline double active_parameters(const GPT2Config& c) {
    return (double)ParameterLayout(c).num_parameters - idle_expert_parameters_per_mixture(c) * c.moe_blocks();
}
// ... of a block, on average over the blocks (what a recomputed forward pass of one costs a token: 2 FLOPs each)
inline double active_block_parameters(const GPT2Config& c) {
    const ParameterLayout whole(c);
    double blocks = 0;
    for (int layer = 0; layer < c.num_layers; layer++) blocks += (double)whole.block_elements(layer);
    return (blocks - idle_expert_parameters_per_mixture(c) * c.moe_blocks()) / c.num_layers;
}

// The formula for a model of this shape (the whole model, every active parameter but a Llama's wte).
// A mixture of experts counts the FLOPs of its active parameters: what the token needed (a dropped
// assignment's, too: the capacity is a shortcut the run takes, not less work the model asked for).
inline double model_flops_per_token(const GPT2Config& c, int seq_len) {
    const ParameterLayout whole(c);
    const double looked_up_only = c.llama() ? (double)whole.elements(WTE, 0) : 0.0;
    return gpt2_flops_per_token((long long)(active_parameters(c) - looked_up_only), c.num_layers, c.channels, seq_len);
}

struct GpuPeak {
    std::vector<std::string> words;  // all must appear as whole words in the device name (case-insensitive)
    double bf16_flops;               // dense tensor-core BF16 with FP32 accumulate; -1 unknown
    double fp32_flops;               // plain FP32 (CUDA cores, no TF32); -1 unknown
};

// First matching row wins, so more specific names come before the generic one.
inline const std::vector<GpuPeak>& gpu_peak_table() {
    static const std::vector<GpuPeak> table = {
        {{"H100", "NVL"}, -1, -1},
        {{"H100", "PCIe"}, 756e12, 51e12},
        {{"H100"}, 989.4e12, 66.9e12},  // SXM5, e.g. "NVIDIA H100 80GB HBM3"
        {{"GH200"}, 989.4e12, 66.9e12},
        {{"H200", "NVL"}, -1, -1},
        {{"H200"}, 989.4e12, 66.9e12},  // SXM
        {{"A100"}, 312e12, 19.5e12},    // SXM4 and PCIe alike
        {{"A10"}, 125e12, 31.2e12},     // not A10G (a different part): whole-word matching keeps them apart
        {{"L40S"}, 362e12, 91.6e12},
        {{"L40"}, 181e12, 90.5e12},
        {{"L4"}, 121e12, 30.3e12},
        {{"RTX", "4090", "D"}, -1, -1},
        {{"RTX", "4090"}, 165.2e12, 82.6e12},
        {{"RTX", "3090", "Ti"}, -1, -1},
        {{"RTX", "3090"}, 71e12, 35.6e12},
    };
    return table;
}

// The device name split into upper-cased words at every character that is not a letter or digit:
// "NVIDIA A100-SXM4-80GB" -> NVIDIA, A100, SXM4, 80GB.
inline std::vector<std::string> device_name_words(const std::string& name) {
    std::vector<std::string> words(1);
    for (char c : name) {
        if (isalnum((unsigned char)c)) words.back() += (char)toupper((unsigned char)c);
        else if (!words.back().empty()) words.emplace_back();
    }
    if (words.back().empty()) words.pop_back();
    return words;
}

// Peak FLOP/s of the named device for precision "BF16" or "FP32" (PRECISION_NAME); -1 when unknown.
inline double peak_flops_per_second(const std::string& device_name, const std::string& precision) {
    if (precision != "BF16" && precision != "FP32") fatal("peak_flops_per_second: unknown precision '%s'", precision.c_str());
    std::vector<std::string> have = device_name_words(device_name);
    for (const GpuPeak& row : gpu_peak_table()) {
        bool all = true;
        for (const std::string& word : row.words) {
            std::string upper;
            for (char c : word) upper += (char)toupper((unsigned char)c);
            bool found = false;
            for (const std::string& w : have) found = found || w == upper;
            all = all && found;
        }
        if (all) return precision == "BF16" ? row.bf16_flops : row.fp32_flops;
    }
    return -1.0;
}

// Fraction of peak (0.45 = 45%) used by `model_flops` of work done in `seconds`; -1 when the peak is unknown.
inline double model_flops_utilization(double model_flops, double seconds, double peak_flops_per_second) {
    if (peak_flops_per_second <= 0.0 || seconds <= 0.0) return -1.0;
    return model_flops / seconds / peak_flops_per_second;
}
