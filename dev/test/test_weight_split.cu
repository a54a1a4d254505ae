/*
The backward pass split into B (input gradients) and W (weight gradients), as zero-bubble pipeline
schedules run it (llmc/model/forward_backward.cuh), against the fused backward pass, on ranks that each hold
every layer (one rank; or, under mpirun, the world split over --tp, --cp and data parallelism), in the FP32
CPU build:
  - the whole model as one stage: gpt2_backward fused, and as B then W with a weight-gradient record (the LM
    head's backward pass split too: the gradient of its input in B, its share of dwte in W);
  - the model as two stages of different sizes on records sized for the longer one (a rank holding two
    stages, as an interleaved rank does), each stage's B, then their W, fused and split;
under every recompute policy (none, selective, full every 1, 2 and 4 blocks) and ZeRO stages 0, 2 and 3 (on
one rank too the working buffers, the reductions into the shard and the gathers all run), over two
microbatches of gradient accumulation. W adds exactly what the fused pass adds, in the same order (the matmuls' dW +=
dY^T X on the same operands and the same old gradient; a layernorm's gradient summed from 0 then added,
where the fused pass adds the same sum), so every gradient must be bitwise equal to the fused whole-model
run's at the same layout and ZeRO stage (recomputation itself gives the same bits, llmc/parallel/recompute.h).
Prints `N passed, M failed` (rank 0; a case fails if it fails on any rank).

    make build/test_weight_split && build/test_weight_split
    mpirun -np 2 build/test_weight_split --tp 2 --sequence-parallel 1      (also: --cp 2; no flag: dp 2)
*/
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "../../llmc/model/gpt2.cuh"
#include "../../llmc/model/forward_backward.cuh"
#include "../../llmc/parallel/parallel_context.h"
#include "small_models.h"

static int passed = 0, failed = 0;

static void check(const std::string& name, bool ok, const std::string& detail = "") {
    printf("  %-80s %s%s\n", name.c_str(), ok ? "ok" : "FAILED", detail.c_str());
    (ok ? passed : failed)++;
}


constexpr int kBatch = 2, kSeq = 16, kMicrobatches = 2;

// How the backward pass runs: the whole model as one stage, or as two stages of `first_layers` and
// L - first_layers blocks on one rank; fused, or as B then W.
struct Variant {
    std::string name;
    int first_layers;  // 0: one stage of all L
    bool split;
};

// This rank's gradients (its chunks, its shard of them at ZeRO 2 and 3) after kMicrobatches microbatches
// (fp32 host values); `values`: the whole model's parameters, tokens and targets: this rank's ids.
static std::vector<float> gradients_of(ParallelContext& par, const Recompute& recompute, int zero_stage,
                                       const Variant& v, const std::vector<float>& values,
                                       const std::vector<int>& tokens, const std::vector<int>& targets) {
    const GPT2Config config = small_gpt2(4, 16);
    const int L = config.num_layers, T = par.T_local, N = kBatch * T;
    const int second_layers = L - v.first_layers;
    par.layout.recompute = recompute;
    par.layout.zero_stage = zero_stage;
    ModelPart part = model_part(par, config);
    part.stage_layers = v.first_layers > 0 ? std::max(v.first_layers, second_layers) : L;
    part.records = v.first_layers > 0 ? 2 : 1;
    part.weight_records = v.split ? part.records : 0;
    GPT2 model;
    gpt2_allocate(model, config, kBatch, T, part);
    if (par.zero.comm_stream) zero_free(par.zero);  // the previous case's (parallel_destroy frees the last)
    zero_init(par.zero, zero_stage, &par.mesh, model, parameters_in_layout(ParameterLayout(config), values,
                                                                           model.layout));
    zero_begin_step(par.zero, model);
    const float dloss = 1.0f / (N * kMicrobatches);
    const size_t rows = (size_t)tp_rows(par.tp, N) * config.channels;
    for (int m = 0; m < kMicrobatches; m++) {
        zero_begin_microbatch(par.zero, m == 0, m == kMicrobatches - 1);
        const int* x = tokens.data() + m * N;
        const int* y = targets.data() + m * N;
        if (v.first_layers == 0) {
            gpt2_forward(model, par, x, kBatch, T);
            gpt2_loss(model, par, model.heads[0], y, kBatch, T, dloss);
            gpt2_backward(model, par, kBatch, T, v.split ? &model.weight_records[0] : nullptr);
            continue;
        }
        // two stages, records 0 and 1: the first stage's output handed to the second, its input gradient back
        StageActivations& first = model.records[0];
        StageActivations& second = model.records[1];
        StageWeightRecord* first_w = v.split ? &model.weight_records[0] : nullptr;
        StageWeightRecord* second_w = v.split ? &model.weight_records[1] : nullptr;
        gpt2_embed(model, par, first, x, kBatch, T);
        gpt2_stage_forward(model, par, first, 0, v.first_layers, kBatch, T);
        cudaCheck(cudaMemcpyAsync(second.input, first.output(), rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        gpt2_stage_forward(model, par, second, v.first_layers, second_layers, kBatch, T);
        gpt2_head_forward(model, par, second, model.heads[0], kBatch, T);
        gpt2_loss(model, par, model.heads[0], y, kBatch, T, dloss);
        gpt2_head_backward(model, par, second, model.heads[0], kBatch, T, /*weights_later=*/v.split);
        gpt2_stage_backward(model, par, second, v.first_layers, second_layers, kBatch, T, second_w);
        cudaCheck(cudaMemcpyAsync(first.doutput, second.doutput, rows * sizeof(floatX), cudaMemcpyDeviceToDevice,
                                  model.stream));
        gpt2_stage_backward(model, par, first, 0, v.first_layers, kBatch, T, first_w);
        if (v.split) {  // W after both B, the later stage's first, as a zero-bubble schedule may order them
            gpt2_head_weights(model, par, model.heads[0], kBatch, T);
            gpt2_stage_weights(model, par, *second_w, v.first_layers, second_layers, kBatch, T);
            gpt2_stage_weights(model, par, *first_w, 0, v.first_layers, kBatch, T);
        }
        gpt2_embed_backward(model, par, first, kBatch, T);
        chunk_gradient_done(model, par, 0);
    }
    zero_wait_for_gradients(par.zero, model);
    std::vector<float> gradients;
    for (int c = 0; c < model.layout.num_chunks(); c++) {
        if (!model.layout.holds(c)) continue;
        size_t count = 0;
        const floatX* chunk = zero_chunk_gradient(par.zero, model, c, &count);
        std::vector<floatX> raw(count);
        copy_to_host(raw.data(), chunk, count, model.stream);
        gradients.insert(gradients.end(), raw.begin(), raw.end());
    }
    gpt2_free(model);
    return gradients;
}

// Bitwise equality on every rank, or where this rank's first difference is and the largest one.
static void check_same_bits(ParallelContext& par, const std::string& name, const std::vector<float>& got,
                            const std::vector<float>& want) {
    size_t first = got.size() == want.size() ? got.size() : 0;
    double largest = 0;
    for (size_t i = 0; i < got.size() && got.size() == want.size(); i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
        if (first == got.size()) first = i;
        largest = std::max(largest, std::fabs((double)got[i] - want[i]));
    }
    char detail[160] = "";
    if (first < got.size())
        snprintf(detail, sizeof(detail), " (first difference at %zu: %g vs %g; largest %g)", first, got[first],
                 want[first], largest);
    int different = first != got.size(), on_any_rank = 0;
    MPI_Allreduce(&different, &on_any_rank, 1, MPI_INT, MPI_MAX, par.world.mpi);
    if (par.main_rank) check(name, on_any_rank == 0, detail);
}

int main(int argc, char** argv) {
#ifndef ENABLE_FP32
    printf("test_weight_split compares bits, which needs the FP32 build (-DENABLE_FP32)\n");
    printf("0 passed, 1 failed\n");
    return EXIT_FAILURE;
#endif
    Layout asked;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const int value = atoi(argv[i + 1]);
        if (flag == "--tp") asked.tp = value;
        else if (flag == "--cp") asked.cp = value;
        else if (flag == "--sequence-parallel") asked.sequence_parallel = value != 0;
        else fatal("unknown flag %s (usage: test_weight_split [--tp N] [--cp N] [--sequence-parallel 0|1])",
                   flag.c_str());
    }
    asked.batch_size = kBatch;
    asked.seq_len = kSeq;
    const GPT2Config config = small_gpt2(4, 16);
    ParallelContext par;
    parallel_create(par, asked, config, "", 300.0);
    const ParameterLayout layout(config, 1);
    std::mt19937 random(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::vector<float> values = gpt2_initial_parameters(layout, [&] { return normal(random); });
    const int N = kBatch * par.T_local;  // this rank's token rows; every data-parallel rank takes the same ones
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
        if (par.main_rank)
            printf("%d rank(s): tp %d%s, cp %d, dp %d; ZeRO stage %d; against the fused backward pass without "
                   "recomputation\n", par.world.size, asked.tp, asked.sequence_parallel ? " (sequence parallel)" : "",
                   asked.cp, par.dp_size, zero_stage);
        const std::vector<float> reference =
            gradients_of(par, policies[0], zero_stage, variants[0], values, tokens, targets);
        int nonzero = 0, on_every_rank = 0;
        for (float g : reference) nonzero = nonzero || g != 0.0f;
        MPI_Allreduce(&nonzero, &on_every_rank, 1, MPI_INT, MPI_MIN, par.world.mpi);
        if (par.main_rank) check("the reference gradients are not all zero", on_every_rank != 0);
        for (const Recompute& recompute : policies)
            for (const Variant& v : variants)
                check_same_bits(par, "recompute " + recompute_describe(recompute) + ", " + v.name,
                                gradients_of(par, recompute, zero_stage, v, values, tokens, targets), reference);
    }
    parallel_destroy(par);
    if (par.main_rank) printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
