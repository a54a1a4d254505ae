/*
The backward pass split into B (input gradients) and W (weight gradients), as zero-bubble pipeline
schedules run it (llmc/model/forward_backward.cuh), against the fused backward pass, on one rank holding the
whole model, in the FP32 CPU build:
  - the whole model as one stage: gpt2_backward fused, and as B then W with a weight-gradient record;
  - the model as two stages of different sizes on records sized for the longer one (a rank holding two
    stages, as zbv's first rank does), each stage's B, then their W, fused and split;
under every recompute policy (none, selective, full every 1, 2 and 4 blocks) and ZeRO stages 0, 2 and 3 (one
rank: the working buffers, the reductions into the shard and the gathers all run), over two microbatches
of gradient accumulation. W adds exactly what the fused pass adds, in the same order (the matmuls' dW +=
dY^T X on the same operands and the same old gradient; a layernorm's gradient summed from 0 then added,
where the fused pass adds the same sum), so every gradient must be bitwise equal to the fused whole-model
run's at the same ZeRO stage (recomputation itself gives the same bits, llmc/parallel/recompute.h).
Prints `N passed, M failed`.

    make build/test_weight_split && build/test_weight_split
*/
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "../../llmc/model/gpt2.cuh"
#include "../../llmc/model/forward_backward.cuh"
#include "../../llmc/parallel/parallel_context.h"

static int passed = 0, failed = 0;

static void check(const std::string& name, bool ok, const std::string& detail = "") {
    printf("  %-80s %s%s\n", name.c_str(), ok ? "ok" : "FAILED", detail.c_str());
    (ok ? passed : failed)++;
}

static GPT2Config small_config() {
    GPT2Config c;
    c.max_seq_len = 16;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    c.num_layers = 4;
    c.num_heads = 4;
    c.channels = 64;
    return c;
}

constexpr int kBatch = 2, kSeq = 16, kMicrobatches = 2;

// How the backward pass runs: the whole model as one stage, or as two stages of `first_layers` and
// L - first_layers blocks on one rank; fused, or as B then W.
struct Variant {
    std::string name;
    int first_layers;  // 0: one stage of all L
    bool split;
};

// The gradients of every parameter after kMicrobatches microbatches (fp32 host values, the layout's order).
static std::vector<float> gradients_of(const Recompute& recompute, int zero_stage, const Variant& v,
                                       const std::vector<float>& values, const std::vector<int>& tokens,
                                       const std::vector<int>& targets) {
    const GPT2Config config = small_config();
    const int L = config.num_layers, N = kBatch * kSeq;
    const int second_layers = L - v.first_layers;
    ModelPart part;
    part.recompute = recompute;
    part.full_gradients = zero_stage < 2;
    part.full_parameters = zero_stage < 3;
    part.stage_layers = v.first_layers > 0 ? std::max(v.first_layers, second_layers) : L;
    part.records = v.first_layers > 0 ? 2 : 1;
    part.weight_records = v.split ? part.records : 0;
    GPT2 model;
    gpt2_allocate(model, config, kBatch, kSeq, part);
    ParallelContext par;
    par.layout.recompute = recompute;
    zero_init(par.zero, zero_stage, nullptr, model, values);
    zero_begin_step(par.zero, model);
    const float dloss = 1.0f / (N * kMicrobatches);
    const size_t rows = (size_t)N * config.channels;
    for (int m = 0; m < kMicrobatches; m++) {
        zero_begin_microbatch(par.zero, m == kMicrobatches - 1);
        const int* x = tokens.data() + m * N;
        const int* y = targets.data() + m * N;
        if (v.first_layers == 0) {
            gpt2_forward(model, par, x, kBatch, kSeq);
            gpt2_loss(model, par, y, kBatch, kSeq, dloss);
            gpt2_backward(model, par, kBatch, kSeq, v.split ? &model.weight_records[0] : nullptr);
            continue;
        }
        // two stages, records 0 and 1: the first stage's output handed to the second, its input gradient back
        StageActivations& first = model.records[0];
        StageActivations& second = model.records[1];
        StageWeightRecord* first_w = v.split ? &model.weight_records[0] : nullptr;
        StageWeightRecord* second_w = v.split ? &model.weight_records[1] : nullptr;
        gpt2_embed(model, par, first, x, kBatch, kSeq);
        gpt2_stage_forward(model, par, first, 0, v.first_layers, kBatch, kSeq);
        cudaCheck(cudaMemcpyAsync(second.input, first.output(), rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        gpt2_stage_forward(model, par, second, v.first_layers, second_layers, kBatch, kSeq);
        gpt2_head_forward(model, par, second, kBatch, kSeq);
        gpt2_loss(model, par, y, kBatch, kSeq, dloss);
        gpt2_head_backward(model, par, second, kBatch, kSeq);
        gpt2_stage_backward(model, par, second, v.first_layers, second_layers, kBatch, kSeq, second_w);
        cudaCheck(cudaMemcpyAsync(first.doutput, second.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        gpt2_stage_backward(model, par, first, 0, v.first_layers, kBatch, kSeq, first_w);
        if (v.split) {  // W after both B, the later stage's first, as a zero-bubble schedule may order them
            gpt2_stage_weights(model, par, *second_w, v.first_layers, second_layers, kBatch, kSeq);
            gpt2_stage_weights(model, par, *first_w, 0, v.first_layers, kBatch, kSeq);
        }
        gpt2_embed_backward(model, par, first, kBatch, kSeq);
        chunk_gradient_done(model, par, 0);
    }
    zero_wait_for_gradients(par.zero, model);
    std::vector<float> gradients(model.layout.total);
    for (int c = 0; c < model.layout.num_chunks(); c++) {
        size_t count = 0;
        const floatX* chunk = zero_chunk_gradient(par.zero, model, c, &count);
        std::vector<floatX> raw(count);
        copy_to_host(raw.data(), chunk, count, model.stream);
        std::copy(raw.begin(), raw.end(), gradients.begin() + model.layout.chunk_start(c));
    }
    zero_free(par.zero);
    gpt2_free(model);
    return gradients;
}

// Bitwise equality, or where the first difference is and the largest one.
static void check_same_bits(const std::string& name, const std::vector<float>& got, const std::vector<float>& want) {
    size_t first = got.size();
    double largest = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
        if (first == got.size()) first = i;
        largest = std::max(largest, std::fabs((double)got[i] - want[i]));
    }
    char detail[160] = "";
    if (first < got.size())
        snprintf(detail, sizeof(detail), " (first difference at %zu: %g vs %g; largest %g)", first, got[first],
                 want[first], largest);
    check(name, first == got.size(), detail);
}

int main() {
#ifndef ENABLE_FP32
    printf("test_weight_split compares bits, which needs the FP32 build (-DENABLE_FP32)\n");
    printf("0 passed, 1 failed\n");
    return EXIT_FAILURE;
#endif
    const GPT2Config config = small_config();
    const ParameterLayout layout(config, 1);
    std::mt19937 random(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<float> values = gpt2_initial_parameters(layout, [&] { return normal(random); });
    const int N = kBatch * kSeq;
    std::vector<int> tokens(kMicrobatches * N), targets(kMicrobatches * N);
    std::uniform_int_distribution<int> token(0, config.vocab_size - 1);
    for (int& t : tokens) t = token(random);
    for (int& t : targets) t = token(random);

    const std::vector<Variant> variants = {
        {"whole model, fused", 0, false},
        {"whole model, B then W", 0, true},
        {"stages of 1 and 3 layers, fused", 1, false},
        {"stages of 1 and 3 layers, B then W", 1, true},
        {"stages of 3 and 1 layers, B then W", 3, true},
    };
    std::vector<Recompute> policies(5);
    policies[1].policy = RecomputePolicy::Selective;
    for (int i = 2; i < 5; i++) policies[i].policy = RecomputePolicy::Full;
    policies[2].every = 1;
    policies[3].every = 2;
    policies[4].every = 4;
    for (int zero_stage : {0, 2, 3}) {
        printf("ZeRO stage %d, against the fused backward pass without recomputation\n", zero_stage);
        const std::vector<float> reference = gradients_of(policies[0], zero_stage, variants[0], values, tokens, targets);
        bool nonzero = false;
        for (float g : reference) nonzero = nonzero || g != 0.0f;
        check("the reference gradients are not all zero", nonzero);
        for (const Recompute& recompute : policies)
            for (const Variant& v : variants)
                check_same_bits("recompute " + recompute_describe(recompute) + ", " + v.name,
                                gradients_of(recompute, zero_stage, v, values, tokens, targets), reference);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
