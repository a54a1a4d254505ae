/*
GPT-2's shape and where its parameters live: the configuration, the kinds of tensors, and the
layer-major parameter buffer (ParameterLayout) that every part of the program indexes, including the
slices each tensor-parallel rank keeps (tensor_slice) and the conversion between any two layouts
(for_each_common_run, parameters_in_layout), which model files and checkpoints go through.
*/
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include "../utils.h"

// ----------------------------------------------------------------------------
// configuration

// Every parameter chunk is padded to a multiple of this many elements per ZeRO shard (ParameterLayout
// below), so chunks and shards start 256 bytes apart in bf16.
constexpr size_t kChunkPaddingElements = 128;

// The two blocks the program knows. One block function (llmc/model/forward_backward.cuh) chooses the op at
// four points by the architecture: the norm (LayerNorm | RMSNorm), the positions (a learned table wpe |
// RoPE on q and k), the MLP (GELU | SwiGLU) and attention's K/V heads (= heads | fewer: grouped-query
// attention). Llama has no biases and an LM head of its own; GPT-2's head is tied to wte.
enum class Arch { GPT2, Llama };
inline const char* arch_name(Arch arch) { return arch == Arch::Llama ? "llama" : "gpt2"; }

struct GPT2Config {
    Arch arch = Arch::GPT2;
    int max_seq_len = 0;        // GPT-2: rows of wpe; Llama: the longest sequence RoPE is run at
    int vocab_size = 0;         // V: real tokens
    int padded_vocab_size = 0;  // Vp: rows of wte, V rounded up to a multiple of 128 (aligned matmuls)
    int num_layers = 0;
    int num_heads = 0;
    int channels = 0;
    int kv_heads = 0;           // heads of K and V (GPT-2: num_heads; Llama: a divisor of it)
    int ffn_hidden = 0;         // Llama: the MLP's hidden units (GPT-2: 0, its 4 C are hidden())
    float rope_theta = 0.0f;    // Llama: RoPE's base
    float norm_eps = 1e-5f;     // the norms' epsilon (GPT-2's layernorm: 1e-5, fixed in its kernels)
    // mixture of experts (llmc/model/moe.cuh; 0 experts: a dense MLP): every moe_every-th block's MLP routes
    // each token to its top experts_per_token of `experts` MLPs, beside `shared_experts` MLPs that every token
    // goes through; the other blocks are the dense model's (moe_block)
    int experts = 0;
    int experts_per_token = 0;
    int shared_experts = 0;
    int moe_every = 1;

    bool llama() const { return arch == Arch::Llama; }
    bool tied_head() const { return arch == Arch::GPT2; }  // the LM head is wte
    int head_size() const { return channels / num_heads; }
    // (in size_t: a model file's header may claim dimensions whose products overflow an int, and is refused by
    // its size, gpt2_read_config)
    // width of the qkv projection's output: the query heads, then the K heads, then the V heads
    size_t qkv_channels() const { return ((size_t)num_heads + 2 * (size_t)kv_heads) * head_size(); }
    bool moe() const { return experts > 0; }
    // one MLP's hidden units (a dense block's, or one expert's), and the width of its fc's output: the hidden
    // units (GELU), or the gate and the up projection (SwiGLU)
    size_t expert_hidden() const { return llama() ? (size_t)ffn_hidden : 4 * (size_t)channels; }
    size_t expert_fc_channels() const { return llama() ? 2 * expert_hidden() : expert_hidden(); }
    // the hidden units of the MLP in fcw and fcprojw: the dense MLP's, or, in a mixture of experts, the shared
    // experts' together (S of them act as one MLP of S times the hidden units: their outputs add up)
    size_t hidden() const { return moe() ? (size_t)shared_experts * expert_hidden() : expert_hidden(); }
    size_t fc_channels() const { return llama() ? 2 * hidden() : hidden(); }
    // Block `layer`'s MLP is a mixture when the model has experts and layer + 1 is a multiple of moe_every
    // (moe_every 2: blocks 1, 3, 5, ...; the others are dense, as in GShard and Switch).
    bool moe_block(int layer) const { return moe() && (layer + 1) % moe_every == 0; }
    int moe_blocks() const { return moe() ? num_layers / moe_every : 0; }
    // where the mixtures are, in words: "every block", or "1 block of every 2"
    std::string mixture_blocks() const {
        return moe_every == 1 ? "every block" : "1 block of every " + std::to_string(moe_every);
    }
    // The shape of block `layer`: the model's, or for a dense block of a mixture the dense model's (no experts,
    // the MLP's expert_hidden units, and GPT-2's MLP biases), which is what every per-layer size is read from.
    GPT2Config block(int layer) const { return moe_block(layer) ? *this : dense_block(); }
    GPT2Config dense_block() const {
        GPT2Config dense = *this;
        dense.experts = dense.experts_per_token = dense.shared_experts = 0, dense.moe_every = 1;
        return dense;
    }
    // The widest MLP of any block (a dense block's and a mixture's shared experts' can differ): the buffers one
    // record of any block runs on are sized by it.
    size_t widest_hidden() const { return moe_every > 1 ? std::max(hidden(), expert_hidden()) : hidden(); }
    size_t widest_fc_channels() const { return llama() ? 2 * widest_hidden() : widest_hidden(); }
};

// Two configurations describe the same model (the same tensors of the same sizes, the same computation).
inline bool same_shape(const GPT2Config& a, const GPT2Config& b) {
    return a.arch == b.arch && a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.channels == b.channels &&
           a.kv_heads == b.kv_heads && a.ffn_hidden == b.ffn_hidden && a.vocab_size == b.vocab_size &&
           a.padded_vocab_size == b.padded_vocab_size && a.max_seq_len == b.max_seq_len &&
           a.rope_theta == b.rope_theta && a.norm_eps == b.norm_eps && a.experts == b.experts &&
           a.experts_per_token == b.experts_per_token && a.shared_experts == b.shared_experts &&
           a.moe_every == b.moe_every;
}

inline int padded_vocab(int vocab_size) { return (vocab_size + 127) / 128 * 128; }

// A mixture of experts' capacity (llmc/model/moe.cuh): the most assignments an expert takes from one sequence
// of T rows under capacity factor cf (0: no limit).
inline int moe_capacity(const GPT2Config& c, float capacity_factor, int T) {
    if (capacity_factor <= 0.0f) return 0;
    return (int)std::ceil((double)capacity_factor * T * c.experts_per_token / c.experts);
}

// The most rows one rank's experts run in a layer, for B sequences of T rows per rank: its own B T K at ep 1;
// under expert parallelism (llmc/parallel/expert_parallel.h) the rows of all ep ranks of its group may come to its
// experts, ep B T K without a capacity, and with one (moe_capacity of a whole sequence's positions, T cp under
// context parallelism; 0: none) at most `capacity` rows of each of the group's ep B sequences for each of its E/ep
// experts. The buffers these rows pass through are sized by it.
inline size_t moe_expert_rows(const GPT2Config& c, int B, int T, int ep, int capacity) {
    const size_t own = (size_t)B * T * c.experts_per_token;
    if (ep == 1) return own;
    const size_t all = (size_t)ep * own;
    return capacity > 0 ? std::min(all, (size_t)ep * B * (c.experts / ep) * capacity) : all;
}

// GPT-2's derived field: as many K/V heads as heads.
inline GPT2Config gpt2_shape(GPT2Config c) {
    c.arch = Arch::GPT2;
    c.kv_heads = c.num_heads;
    return c;
}

// The GPT-2 family by name ("124M" etc.; "d12" style depth names too), with GPT-2's vocabulary.
inline bool gpt2_config_by_name(const std::string& name, GPT2Config* config) {
    struct Named { const char* name; const char* depth_name; int layers, heads, channels; };
    static const Named family[] = {
        {"124M", "d12", 12, 12, 768}, {"350M", "d24", 24, 16, 1024},
        {"774M", "d36", 36, 20, 1280}, {"1558M", "d48", 48, 25, 1600},
    };
    for (const Named& n : family) {
        if (name == n.name || name == n.depth_name) {
            GPT2Config c;
            c.max_seq_len = 1024;
            c.vocab_size = 50257;
            c.padded_vocab_size = 50304;
            c.num_layers = n.layers;
            c.num_heads = n.heads;
            c.channels = n.channels;
            *config = gpt2_shape(c);
            return true;
        }
    }
    return false;
}

// Llama 3 by name (Meta's published shapes; Dubey et al. 2024, Table 3): 128,256 tokens, RoPE base 500,000,
// 8 K/V heads; up to 128K positions (trained at 8K, then extended to 128K; the extension's rescaled RoPE
// frequencies are not modelled here).
inline bool llama_config_by_name(const std::string& name, GPT2Config* config) {
    struct Named { const char* name; int layers, heads, channels, ffn_hidden; };
    static const Named family[] = {
        {"llama3-8B", 32, 32, 4096, 14336}, {"llama3-70B", 80, 64, 8192, 28672},
        {"llama3-405B", 126, 128, 16384, 53248},
    };
    for (const Named& n : family) {
        if (name != n.name) continue;
        GPT2Config c;
        c.arch = Arch::Llama;
        c.max_seq_len = 131072;
        c.vocab_size = 128256;
        c.padded_vocab_size = padded_vocab(c.vocab_size);
        c.num_layers = n.layers;
        c.num_heads = n.heads;
        c.channels = n.channels;
        c.kv_heads = 8;
        c.ffn_hidden = n.ffn_hidden;
        c.rope_theta = 500000.0f;
        c.norm_eps = 1e-5f;
        *config = c;
        return true;
    }
    return false;
}

// Two mixtures of experts by name, in our Llama block (for --plan, or from scratch). "-like": our block where
// theirs differs.
//   mixtral-8x7B-like  Mistral's shape (Jiang et al. 2024): 32 layers, 32 heads over 8 K/V heads, 8 SwiGLU
//                      experts of 14,336 units, top 2, vocabulary 32,000, RoPE base 1e6: exactly its 46.7B
//                      parameters, 12.9B active.
//   deepseek-v3-like   DeepSeek-V3's MoE (DeepSeek-AI 2024): 61 layers of C = 7168, 256 experts of 2048 units, top
//                      8, 1 shared expert, vocabulary 129,280. Where ours differs: grouped-query attention (56
//                      heads of 128 over 8 K/V heads) instead of multi-head latent attention, every layer's MLP a
//                      mixture (theirs: the first 3 dense), softmax routing with the balance loss instead of
//                      sigmoid scores with bias-adjusted balancing, and no multi-token prediction: 699.5B
//                      parameters, 33.3B active (theirs: 671B, 37B).
inline bool moe_config_by_name(const std::string& name, GPT2Config* config) {
    struct Named { const char* name; int layers, heads, kv_heads, channels, ffn_hidden, experts, per_token, shared,
                   vocab, max_seq_len; float rope_theta; };
    static const Named family[] = {
        {"mixtral-8x7B-like", 32, 32, 8, 4096, 14336, 8, 2, 0, 32000, 32768, 1e6f},
        {"deepseek-v3-like", 61, 56, 8, 7168, 2048, 256, 8, 1, 129280, 163840, 10000.0f},
    };
    for (const Named& n : family) {
        if (name != n.name) continue;
        GPT2Config c;
        c.arch = Arch::Llama;
        c.max_seq_len = n.max_seq_len;
        c.vocab_size = n.vocab;
        c.padded_vocab_size = padded_vocab(c.vocab_size);
        c.num_layers = n.layers;
        c.num_heads = n.heads;
        c.kv_heads = n.kv_heads;
        c.channels = n.channels;
        c.ffn_hidden = n.ffn_hidden;
        c.rope_theta = n.rope_theta;
        c.norm_eps = 1e-5f;
        c.experts = n.experts;
        c.experts_per_token = n.per_token;
        c.shared_experts = n.shared;
        *config = c;
        return true;
    }
    return false;
}

// Refuses shapes the kernels cannot run, naming the problem (`source` says where the config came from).
inline void gpt2_validate_config(const GPT2Config& c, const std::string& source) {
    auto refuse = [&](const char* problem) {
        fatal("%s: invalid %s model shape (layers %d, heads %d, K/V heads %d, channels %d, hidden %zu, vocab %d padded "
              "to %d, max_seq_len %d): %s", source.c_str(), arch_name(c.arch), c.num_layers, c.num_heads, c.kv_heads,
              c.channels, c.hidden(), c.vocab_size, c.padded_vocab_size, c.max_seq_len, problem);
    };
    if (c.num_layers <= 0 || c.num_heads <= 0 || c.channels <= 0 || c.vocab_size <= 0 || c.max_seq_len <= 0 ||
        c.kv_heads <= 0 || (c.llama() && c.ffn_hidden <= 0))
        refuse("every dimension must be positive");
    if (c.padded_vocab_size < c.vocab_size || c.padded_vocab_size % 128 != 0)
        refuse("the padded vocabulary must be >= the vocabulary and a multiple of 128");
    if (c.channels % c.num_heads != 0) refuse("channels must be divisible by heads");
    const int head_size = c.channels / c.num_heads;
    if (head_size % 16 != 0 || head_size > 128) refuse("the head size (channels / heads) must be 16, 32, ..., 128");
    if (c.channels % 8 != 0) refuse("channels must be a multiple of 8");
    if (c.num_heads % c.kv_heads != 0) refuse("the K/V heads must divide the heads (query heads share them in groups)");
    if (!c.llama() && (c.kv_heads != c.num_heads || c.ffn_hidden != 0))
        refuse("GPT-2 has as many K/V heads as heads and 4 C hidden units");
    if (c.llama() && c.ffn_hidden % 8 != 0) refuse("the hidden units must be a multiple of 8");
    if (c.llama() && !(c.rope_theta > 1.0f && std::isfinite(c.rope_theta))) refuse("RoPE's theta must exceed 1");
    if (!(c.norm_eps > 0.0f && c.norm_eps < 1.0f)) refuse("the norm epsilon must lie in (0, 1)");
    if (c.experts < 0 || c.shared_experts < 0 || c.experts_per_token < 0)
        refuse("experts, experts per token and shared experts cannot be negative");
    if (c.moe() && (c.experts_per_token < 1 || c.experts_per_token > c.experts || c.experts > 256 ||
                    c.experts_per_token > 16))
        refuse("a token goes to 1 .. min(16, experts) of at most 256 experts");
    if (!c.moe() && (c.experts_per_token != 0 || c.shared_experts != 0 || c.moe_every != 1))
        refuse("experts per token, shared experts and a mixture every N blocks need experts");
    if (c.moe() && (c.moe_every < 1 || c.moe_every > c.num_layers))
        refuse("the mixture every N blocks needs 1 <= N <= layers (at least one block with experts)");
}

// ----------------------------------------------------------------------------
// parameter layout

// The tensors, in the order of the model file. Per-layer tensors exist once per block. GPT-2 has the
// sixteen of llm.c's file; Llama has no wpe, no biases and no norm biases (they have 0 elements, so they take
// no room anywhere and are left out of its file) and an LM head of its own, lmhead, last. A mixture of
// experts adds the router and the experts' two matrices to each block, and has no MLP biases; its fcw and
// fcprojw are the shared experts' (none without them).
enum TensorKind {
    WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
    ROUTERW, EXPERTFCW, EXPERTPROJW, LNFW, LNFB, LMHEAD, NUM_TENSOR_KINDS
};
constexpr int kFirstBlockKind = LN1W, kLastBlockKind = EXPERTPROJW;  // a block's chunk: these, in order
struct TensorKindInfo {
    const char* name;
    bool per_layer;
    bool is_matrix;  // weight decay applies to matrices only (embeddings and matmul weights)
};
inline const TensorKindInfo& tensor_kind_info(int kind) {
    static const TensorKindInfo info[NUM_TENSOR_KINDS] = {
        {"wte", false, true},      {"wpe", false, true},       {"ln1w", true, false},  {"ln1b", true, false},
        {"qkvw", true, true},      {"qkvb", true, false},      {"attprojw", true, true}, {"attprojb", true, false},
        {"ln2w", true, false},     {"ln2b", true, false},      {"fcw", true, true},    {"fcb", true, false},
        {"fcprojw", true, true},   {"fcprojb", true, false},   {"routerw", true, true}, {"expertfcw", true, true},
        {"expertprojw", true, true}, {"lnfw", false, false},   {"lnfb", false, false}, {"lmhead", false, true},
    };
    return info[kind];
}

// Tensor parallelism (llmc/parallel/tensor_parallel.h) gives each of tp ranks a slice of some tensors:
//   column-parallel (a slice of the output features): qkvw, qkvb (this rank's heads of q, k and v), fcw, fcb
//   row-parallel (a slice of the input features):    attprojw, fcprojw
//   vocabulary-parallel (a slice of the rows):         wte, lmhead
// and a whole copy of the others (the "replicated" ones: wpe, the norms, the row-parallel biases, and a mixture
// of experts' router and experts, which each tp rank runs whole on its share of the sequences).
inline bool tensor_is_replicated(int kind) {
    return !(kind == WTE || kind == QKVW || kind == QKVB || kind == ATTPROJW || kind == FCW || kind == FCB ||
             kind == FCPROJW || kind == LMHEAD);
}

// Expert parallelism (llmc/parallel/expert_parallel.h) gives each of ep ranks E/ep of the experts: a block of
// consecutive experts of expertfcw and expertprojw (rank r the experts [r E/ep, (r+1) E/ep)). Every other
// tensor, the router included, is whole on every ep rank.
inline bool tensor_is_expert(int kind) { return kind == EXPERTFCW || kind == EXPERTPROJW; }

// elements of one instance of a tensor (one layer's, for per-layer tensors), whole or, under tp ranks,
// one rank's slice (under ep ranks, the experts' tensors: one rank's experts). With H = ffn_hidden and Q = qkv_channels (3C for GPT-2, C + 2 C kv_heads/heads for Llama):
//   wte, lmhead Vp x C   qkvw Q x C   attprojw C x C   fcw H x C (GELU) or 2H x C (SwiGLU: gate, then up)
//   fcprojw C x H        wpe max_seq_len x C (GPT-2)   biases and norm weights: their output width
// and in a mixture of E experts of He hidden units each (fcw and fcprojw: the shared experts', H = S He):
//   routerw E x C        expertfcw E x He x C (GELU) or E x 2He x C (SwiGLU)   expertprojw E x C x He
inline size_t tensor_elements(const GPT2Config& c, int kind, int tp = 1, int ep = 1) {
    const size_t C = c.channels, H = c.hidden(), E = c.experts;
    const bool gpt2 = !c.llama(), mlp_biases = gpt2 && !c.moe();
    size_t whole = 0;
    switch (kind) {
        case WTE: whole = (size_t)c.padded_vocab_size * C; break;
        case WPE: whole = gpt2 ? (size_t)c.max_seq_len * C : 0; break;
        case LN1W: case LN2W: case LNFW: whole = C; break;
        case LN1B: case LN2B: case LNFB: case ATTPROJB: whole = gpt2 ? C : 0; break;
        case FCPROJB: whole = mlp_biases ? C : 0; break;
        case QKVW: whole = c.qkv_channels() * C; break;
        case QKVB: whole = gpt2 ? c.qkv_channels() : 0; break;
        case ATTPROJW: whole = C * C; break;
        case FCW: whole = c.fc_channels() * C; break;
        case FCB: whole = mlp_biases ? c.fc_channels() : 0; break;
        case FCPROJW: whole = C * H; break;
        case ROUTERW: whole = E * C; break;
        case EXPERTFCW: whole = E * c.expert_fc_channels() * C; break;
        case EXPERTPROJW: whole = E * C * c.expert_hidden(); break;
        case LMHEAD: whole = c.tied_head() ? 0 : (size_t)c.padded_vocab_size * C; break;
    }
    if (tensor_is_expert(kind)) return whole / ep;
    return tensor_is_replicated(kind) ? whole : whole / tp;
}

// Where tp rank `rank`'s slice of tensor `kind` lies in the whole tensor (row-major, as in the model
// file): runs of consecutive elements, in the order the slice stores them, which is increasing order.
// With h = C/tp channels of attention (and k = C kv_heads/heads / tp of K and of V each) and f = H/tp
// hidden units per rank:
//   wte, lmhead  rows [rank Vp/tp, (rank+1) Vp/tp): one run
//   qkvw      rows [rank h, rank h + h) of the q block (C x C) and [rank k, rank k + k) of each of the k and
//             v blocks: three runs; qkvb alike
//   fcw       rows [rank f, rank f + f) (H x C): one run; SwiGLU's (2H x C) the same rows of the gate and of
//             the up projection: two runs; fcb alike
//   attprojw  columns [rank h, rank h + h) of each of its C rows (C x C): C runs
//   fcprojw   columns [rank f, rank f + f) of each of its C rows (C x H): C runs
//   the experts' tensors, by ep rank: experts [ep_rank E/ep, (ep_rank+1) E/ep): one run
//   the others, whole: one run
struct SliceRun {
    size_t start;  // element of the whole tensor
    size_t count;
};
inline std::vector<SliceRun> tensor_slice(const GPT2Config& c, int kind, int tp, int rank, int ep = 1,
                                          int ep_rank = 0) {
    const size_t C = c.channels, local = tensor_elements(c, kind, tp, ep);
    std::vector<SliceRun> runs;
    if (local == 0) return runs;
    if (tensor_is_expert(kind)) {
        runs.push_back({ep_rank * local, local});
    } else if (tensor_is_replicated(kind) || tp == 1) {
        runs.push_back({0, local});
    } else if (kind == QKVW || kind == QKVB) {
        // the q block is heads/(heads + 2 kv_heads) of the tensor, the k and v blocks kv_heads/(...) each
        const size_t per_head = local / ((c.num_heads + 2 * c.kv_heads) / tp);  // one head's rows (x C)
        const size_t q = per_head * (c.num_heads / tp), kv = per_head * (c.kv_heads / tp);
        runs.push_back({rank * q, q});
        runs.push_back({q * tp + rank * kv, kv});
        runs.push_back({q * tp + kv * tp + rank * kv, kv});
    } else if ((kind == FCW || kind == FCB) && c.llama()) {
        const size_t half = local / 2;  // this rank's rows of the gate, and as many of the up projection
        runs.push_back({rank * half, half});
        runs.push_back({half * tp + rank * half, half});
    } else if (kind == ATTPROJW || kind == FCPROJW) {
        const size_t width = local / C, whole_width = width * tp;  // input features per row: mine, all
        for (size_t row = 0; row < C; row++) runs.push_back({row * whole_width + rank * width, width});
    } else {  // wte, lmhead, GPT-2's fcw and fcb: a block of rows
        runs.push_back({rank * local, local});
    }
    return runs;
}

// Where each tensor of each layer sits in the one parameter buffer:
//   [ embedding chunk: wte wpe ][ block 0: ln1w ... fcprojb ] ... [ block L-1 ][ final chunk: lnfw lnfb lmhead ]
// Under tensor parallelism the buffer holds tp rank `tp_rank`'s slices (tensor_slice), laid out the same
// way. Under pipeline parallelism it holds only the chunks of this rank's stages (`held`, one flag per
// chunk, from pipeline_held_chunks in llmc/parallel/pipeline_schedule.h): their blocks, the embedding chunk on the
// first stage (and on the last, where the LM head is tied to wte) and the final chunk on the last. A chunk not
// held takes no room: its size is 0 and its start is that of the next chunk held. Each chunk is padded with
// zeros to a multiple of kChunkPaddingElements (128) * shards elements (ZeRO: every rank keeps 1/shards of
// each chunk), so it splits into equal shards, and every chunk and shard starts a multiple of 256 bytes
// (128 bf16) from the buffer's start: the alignment cuBLASLt's fastest kernels want, whatever the shard
// count (with a multiple of 8 * 3, the weights of 350M-1558M at 3 shards were only 16-32-byte aligned).
// Padding parameters are 0, get gradient 0 and stay 0; they are never read by a kernel nor written to a
// model file.
struct ParameterLayout {
    GPT2Config config;
    int shards = 1;
    int tp = 1, tp_rank = 0;     // the tensor-parallel slice this buffer holds
    int ep = 1, ep_rank = 0;     // the experts this buffer holds (expert parallelism)
    std::vector<char> held;      // per chunk: in this buffer or not
    std::vector<size_t> sizes;   // per chunk: its elements, padding included (0 when not held)
    std::vector<size_t> starts;  // per chunk: its offset in the buffer
    size_t total = 0;            // the buffer: every chunk held, padding included
    size_t num_parameters = 0;   // the parameters in the buffer, without padding (the model's, at tp = 1)

    ParameterLayout() = default;
    // held_chunks: one flag per chunk (num_chunks()); empty: the whole model
    explicit ParameterLayout(const GPT2Config& c, int num_shards = 1, int tp_size = 1, int tp_index = 0,
                             const std::vector<char>& held_chunks = {}, int ep_size = 1, int ep_index = 0)
        : config(c), shards(num_shards), tp(tp_size), tp_rank(tp_index), ep(ep_size), ep_rank(ep_index) {
        held = held_chunks.empty() ? std::vector<char>(num_chunks(), 1) : held_chunks;
        if ((int)held.size() != num_chunks()) fatal("a parameter layout of %d chunks given %zu flags", num_chunks(), held.size());
        for (int chunk = 0; chunk < num_chunks(); chunk++) {
            starts.push_back(total);
            sizes.push_back(holds(chunk) ? padded_chunk(chunk) : 0);
            total += sizes.back();
        }
        for_each_tensor_instance([&](int, int, size_t count) { num_parameters += count; });
    }
    // elements of one instance of tensor `kind` in this buffer (of block `layer`'s shape for a per-layer kind:
    // the blocks of a model with a mixture every N blocks differ)
    size_t elements(int kind, int layer) const {
        return tensor_elements(tensor_kind_info(kind).per_layer ? config.block(layer) : config, kind, tp, ep);
    }
    // tp rank `tp_rank`'s slice of tensor `kind` of `layer`, of ep rank `ep_rank`'s experts (tensor_slice)
    std::vector<SliceRun> slice(int kind, int layer) const {
        return tensor_slice(tensor_kind_info(kind).per_layer ? config.block(layer) : config, kind, tp, tp_rank, ep,
                            ep_rank);
    }
    // parameters of block `layer` in this buffer (its chunk without the padding)
    size_t block_elements(int layer) const {
        size_t block = 0;
        for (int kind = kFirstBlockKind; kind <= kLastBlockKind; kind++) block += elements(kind, layer);
        return block;
    }
    // the parameters of chunk `chunk`, padded with zeros to a multiple of 128 * shards elements
    size_t padded_chunk(int chunk) const {
        const size_t multiple = kChunkPaddingElements * (size_t)shards;
        const size_t count = chunk == 0 ? elements(WTE, 0) + elements(WPE, 0)
                           : chunk <= config.num_layers ? block_elements(chunk - 1)
                           : elements(LNFW, 0) + elements(LNFB, 0) + elements(LMHEAD, 0);
        return (count + multiple - 1) / multiple * multiple;
    }
    // the largest block chunk of the model, held or not (buffers that take any block's chunk are this size)
    size_t largest_block_chunk() const {
        size_t largest = 0;
        for (int layer = 0; layer < config.num_layers; layer++) largest = std::max(largest, padded_chunk(layer + 1));
        return largest;
    }
    int num_chunks() const { return config.num_layers + 2; }
    // chunk 0 is the embeddings, chunks 1..L the blocks, chunk L+1 the final norm (and an untied LM head)
    bool holds(int chunk) const { return held[chunk] != 0; }
    size_t chunk_start(int chunk) const { return starts[chunk]; }
    size_t chunk_size(int chunk) const { return sizes[chunk]; }
    size_t block_start(int layer) const { return chunk_start(layer + 1); }
    // the chunk that holds tensor `kind` of `layer`
    int chunk_of(int kind, int layer) const {
        return kind < kFirstBlockKind ? 0 : kind > kLastBlockKind ? num_chunks() - 1 : layer + 1;
    }
    // the chunk that holds element `offset` of the buffer: the last chunk starting at or before it (chunks
    // not held start where the next chunk held does, so they come before it)
    int chunk_of_offset(size_t offset) const {
        return (int)(std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin()) - 1;
    }
    // offset of tensor `kind` of `layer` (layer ignored for the embedding and final tensors)
    size_t offset(int kind, int layer = 0) const {
        size_t start = chunk_start(chunk_of(kind, layer));
        int first = kind < kFirstBlockKind ? WTE : kind > kLastBlockKind ? LNFW : kFirstBlockKind;
        for (int k = first; k < kind; k++) start += elements(k, layer);
        return start;
    }
    // Whether this buffer's copy of tensor `kind` counts in the model's gradient norm, where other ranks hold
    // copies of it: a tensor every tp rank holds whole (tensor_is_replicated) counts on tp rank 0 only, one
    // every ep rank holds whole (all but the experts) on ep rank 0 only, and the embeddings on the first
    // pipeline stage only (a tied LM head's stage holds a copy).
    bool counts_in_norm(int kind) const {
        const bool tied_copy = (kind == WTE || kind == WPE) && !holds(1);
        return (tp_rank == 0 || !tensor_is_replicated(kind)) && (ep_rank == 0 || tensor_is_expert(kind)) &&
               !tied_copy;
    }
    // calls fn(kind, layer, count) for every tensor instance held, in the model file's order (only those the
    // architecture and the block have: none of 0 elements)
    template <class Function>
    void for_each_tensor_instance(Function&& fn) const {
        for (int kind = 0; kind < NUM_TENSOR_KINDS; kind++) {
            const int layers = tensor_kind_info(kind).per_layer ? config.num_layers : 1;
            for (int layer = 0; layer < layers; layer++)
                if (elements(kind, layer) > 0 && holds(chunk_of(kind, layer))) fn(kind, layer, elements(kind, layer));
        }
    }
};

// A tensor instance's place in the model file's order (every kind counted, those of 0 elements too), whichever chunks a layout holds:
// seeds per tensor (AdamW's stochastic rounding) follow it, so every layout rounds a tensor alike.
inline int tensor_file_index(const GPT2Config& c, int kind, int layer) {
    int index = 0;
    for (int k = 0; k < kind; k++) index += tensor_kind_info(k).per_layer ? c.num_layers : 1;
    return index + (tensor_kind_info(kind).per_layer ? layer : 0);
}

// Calls fn(kind, layer, offset, count) for every tensor instance the layout holds, in the model file's order.
template <class Function>
void for_each_tensor_in_file_order(const ParameterLayout& layout, Function&& fn) {
    layout.for_each_tensor_instance([&](int kind, int layer, size_t count) { fn(kind, layer, layout.offset(kind, layer), count); });
}

// Calls fn(from_offset, to_offset, count) for every run of parameters that both buffers hold: `from`'s
// elements [from_offset, + count) are `to`'s [to_offset, + count). The two layouts may differ in tp size
// and rank, in the experts they hold (ep size and rank), in the chunks they hold (pipeline stages) and in
// shards (padding is never part of a run). This
// one function converts between the model file (the whole model, tp = 1) and a rank's part of it, and
// re-slices checkpoints saved on another layout.
template <class Function>
void for_each_common_run(const ParameterLayout& from, const ParameterLayout& to, Function&& fn) {
    for_each_tensor_in_file_order(from, [&](int kind, int layer, size_t from_tensor, size_t) {
        if (!to.holds(to.chunk_of(kind, layer))) return;
        const size_t to_tensor = to.offset(kind, layer);
        const std::vector<SliceRun> a = from.slice(kind, layer);
        const std::vector<SliceRun> b = to.slice(kind, layer);
        size_t i = 0, j = 0, a_local = 0, b_local = 0;  // runs are in increasing order: merge them
        while (i < a.size() && j < b.size()) {
            const size_t first = std::max(a[i].start, b[j].start);
            const size_t a_end = a[i].start + a[i].count, b_end = b[j].start + b[j].count;
            const size_t end = std::min(a_end, b_end);
            if (first < end)
                fn(from_tensor + a_local + (first - a[i].start), to_tensor + b_local + (first - b[j].start), end - first);
            if (a_end <= b_end) a_local += a[i++].count;
            else b_local += b[j++].count;
        }
    });
}

// Tensor `kind` of `layer` in the buffer of its chunk (`chunk` points at the chunk's start; the layer is
// ignored for the embedding and final tensors), or null where the architecture or the block has no such tensor.
inline floatX* tensor_in_chunk(floatX* chunk, const ParameterLayout& layout, int kind, int layer = 0) {
    if (layout.elements(kind, layer) == 0) return nullptr;
    return chunk + (layout.offset(kind, layer) - layout.chunk_start(layout.chunk_of(kind, layer)));
}

// One block's tensors, as pointers into its chunk of parameters (or gradients); null where the
// architecture has none (Llama's biases).
struct BlockParams {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
    floatX *routerw, *expertfcw, *expertprojw;  // a mixture of experts (null in a dense block)
};
// Block `layer`'s tensors, given where its chunk starts.
inline BlockParams block_params_in_chunk(floatX* chunk, const ParameterLayout& layout, int layer) {
    auto at = [&](int kind) { return tensor_in_chunk(chunk, layout, kind, layer); };
    return BlockParams{at(LN1W), at(LN1B), at(QKVW), at(QKVB), at(ATTPROJW), at(ATTPROJB),
                       at(LN2W), at(LN2B), at(FCW),  at(FCB),  at(FCPROJW),  at(FCPROJB),
                       at(ROUTERW), at(EXPERTFCW), at(EXPERTPROJW)};
}

// The values of `from` (host, in its layout) rearranged into the layout `to`: the parameters `to` holds
// that `from` holds too; the rest (padding, slices `from` lacks) 0.
inline std::vector<float> parameters_in_layout(const ParameterLayout& from, const std::vector<float>& values,
                                               const ParameterLayout& to) {
    std::vector<float> converted(to.total, 0.0f);
    for_each_common_run(from, to, [&](size_t at, size_t to_offset, size_t count) {
        std::copy(values.begin() + at, values.begin() + at + count, converted.begin() + to_offset);
    });
    return converted;
}
