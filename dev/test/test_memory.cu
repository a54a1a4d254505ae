/*
Tests of llmc/planning/memory.h: the books kept by tracked_alloc / tracked_free, and the memory plan's arithmetic
checked against numbers worked out by hand, against the ZeRO paper, and (CPU build) against what
gpt2_allocate and zero_init really allocate (GPT-2, Llama and both with experts; a pipeline rank's part of the
model and the weight-gradient records included), and the per-layer activations against Table 2 of Korthikanti
et al. (2022). The parameter layouts themselves are dev/test/test_parameter_layout.cu's. Prints `N passed, M
failed`.
*/
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include "../lab/lab.h"
#include "small_models.h"
#include "../../llmc/parallel/pipeline.h"  // before memory.h: the Pipeline without its executor
#include "../../llmc/planning/memory.h"
#include "../../llmc/parallel/zero.h"

namespace test_memory {  // one suite of dev/test/host_suites.cu

static void check_equal(const std::string& name, double got, double want) {
    check_true(name, got == want, describe(got, want));
}
static void check_within(const std::string& name, double got, double want, double relative) {
    check_true(name, std::fabs(got - want) <= relative * std::fabs(want), describe(got, want));
}

// ----------------------------------------------------------------------------
// (a) the books

static void test_accounting() {
    printf("accounting\n");
    const MemoryTotals start = memory_totals();
    check_equal("nothing held at start", (double)start.current_total, 0);

    float* a = tracked_alloc<float>(1000, MemoryKind::Parameters);          // 4000 bytes
    floatX* b = tracked_alloc<floatX>(500, MemoryKind::Activations);        // 500 * sizeof(floatX)
    const double b_bytes = 500.0 * sizeof(floatX);
    MemoryTotals t = memory_totals();
    check_equal("parameters now", (double)t.current[(int)MemoryKind::Parameters], 4000);
    check_equal("activations now", (double)t.current[(int)MemoryKind::Activations], b_bytes);
    check_equal("total now", (double)t.current_total, 4000 + b_bytes);
    check_equal("peak total", (double)t.peak_total, 4000 + b_bytes);

    tracked_free(a);
    int* c = tracked_alloc<int>(100, MemoryKind::Gradients);                // 400 bytes
    t = memory_totals();
    check_equal("parameters now after free", (double)t.current[(int)MemoryKind::Parameters], 0);
    check_equal("parameters peak survives free", (double)t.peak[(int)MemoryKind::Parameters], 4000);
    check_equal("total now after free", (double)t.current_total, 400 + b_bytes);
    check_equal("peak total is the largest sum", (double)t.peak_total, 4000 + b_bytes);
    check_equal("gradients peak", (double)t.peak[(int)MemoryKind::Gradients], 400);

    // a larger moment raises the overall peak
    char* d = tracked_alloc<char>(10000, MemoryKind::Communication);
    t = memory_totals();
    check_equal("peak total rises", (double)t.peak_total, 10000 + 400 + b_bytes);
    printf("  %s\n", memory_totals_line(t).c_str());
    print_memory_totals(t);

    check_true("zero count gives nullptr", tracked_alloc<float>(0, MemoryKind::Other) == nullptr);
    tracked_free(nullptr);  // a no-op, like cudaFree
    tracked_free(b);
    tracked_free(c);
    tracked_free(d);
    t = memory_totals();
    check_equal("everything freed", (double)t.current_total, 0);
    for (int k = 0; k < kNumMemoryKinds; k++) check_equal(std::string("nothing held: ") +
                                                          memory_kind_name((MemoryKind)k), (double)t.current[k], 0);

    // several threads at once: the books balance and the peak is at most all of them at once
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; i++)
        threads.emplace_back([] {
            for (int r = 0; r < 200; r++) tracked_free(tracked_alloc<float>(256, MemoryKind::Other));
        });
    for (std::thread& thread : threads) thread.join();
    t = memory_totals();
    check_equal("threads: books balance", (double)t.current_total, 0);
    check_true("threads: peak of other <= 4 buffers", t.peak[(int)MemoryKind::Other] <= 4 * 256 * sizeof(float) &&
                                                         t.peak[(int)MemoryKind::Other] >= 256 * sizeof(float));

    expect_failure("free of a pointer never allocated", [] {
        static int local = 0;
        tracked_free(&local);
    }, "not allocated by tracked_alloc");
    expect_failure("double free", [] {
        float* p = tracked_alloc<float>(8, MemoryKind::Other);
        tracked_free(p);
        tracked_free(p);
    }, "already freed");

    // a buffer no device holds: one line with the category, the label, the size asked for and the free and
    // total memory (2^60 bytes = 1048576 TiB, more than any device, the CPU device included)
    expect_failure("an impossible allocation names the buffer and the sizes", [] {
        tracked_alloc<char>(size_t(1) << 60, MemoryKind::Activations, "a test buffer");
    }, "cannot allocate 1048576.00 TiB of device memory for activations (a test buffer): ");
    expect_failure("an impossible allocation says how much memory is free", [] {
        tracked_alloc<char>(size_t(1) << 60, MemoryKind::Activations);
    }, " free of ");
    // a count whose byte size does not fit in size_t is refused, not wrapped around to a small buffer
    expect_failure("a byte count beyond size_t", [] {
        tracked_alloc<float>(SIZE_MAX / 2, MemoryKind::Gradients);
    }, "cannot allocate 33554432.00 TiB of device memory for gradients: ");
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    check_true("cudaMemGetInfo: some memory free, no more than the total", free_bytes > 0 && free_bytes <= total_bytes,
               format_bytes((double)free_bytes) + " free of " + format_bytes((double)total_bytes));
#ifdef LLMC_CPU
    // Two buffers of 60% of the CPU device's memory each: Linux grants both (it commits pages only when they
    // are written), so without the device's own count the program would go on and be killed when it writes
    // them. The second (or the first, on a busy machine) must be refused at the call, with the line.
    const size_t sixty_percent = total_bytes / 10 * 6;
    expect_failure("the CPU device refuses buffers adding up to more than its memory", [=] {
        tracked_alloc<char>(sixty_percent, MemoryKind::Activations, "first half");
        tracked_alloc<char>(sixty_percent, MemoryKind::Activations, "second half");
    }, "cannot allocate " + format_bytes((double)sixty_percent) + " of device memory for activations (");
#endif
}

// ----------------------------------------------------------------------------
// (b) the ZeRO paper, Figure 1: Psi = 7.5B parameters, N_d = 64 ranks, mixed-precision Adam (K = 12).
// Per-rank model state: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB (GB = 1e9 bytes).

static void test_paper() {
    printf("ZeRO paper, Figure 1 (7.5B parameters, 64 ranks, BF16 mixed precision)\n");
    const double figure[4] = {120.0, 31.4, 16.6, 1.9};
    for (int stage = 0; stage <= 3; stage++) {
        const MemoryPlan plan = plan_training_memory(7500000000ull, stage, 64, 64, true);
        const double gb = plan.model_state / 1e9;
        printf("  stage %d: figure %6.1f GB, plan %8.3f GB\n", stage, figure[stage], gb);
        check_within("paper stage " + std::to_string(stage) + " within 5%", gb, figure[stage], 0.05);
        check_equal("paper stage " + std::to_string(stage) + ": no activations without a shape", plan.total,
                    plan.model_state);
    }
    print_memory_plan(plan_training_memory(7500000000ull, 2, 64, 64, true));
}

// ----------------------------------------------------------------------------
// (c) FP32 and communication, worked out by hand

static void test_formulas() {
    printf("formulas\n");
    // FP32, P = 1000, N = 4: params 4P, grads 4P, m + v 8P
    //   stage 0: 16000;  stage 1: 4000 + 4000 + 8000/4 = 10000;  stage 2: 4000 + 12000/4 = 7000;
    //   stage 3: 16000/4 = 4000
    const double fp32[4] = {16000, 10000, 7000, 4000};
    for (int stage = 0; stage <= 3; stage++)
        check_equal("fp32 P=1000 N=4 stage " + std::to_string(stage),
                    plan_training_memory(1000, stage, 4, 4, false).model_state, fp32[stage]);
    // the split by category, FP32 stage 2: parameters 4000, gradients 4000/4, m + v 8000/4
    const MemoryPlan fp32_stage2 = plan_training_memory(1000, 2, 4, 4, false);
    check_equal("fp32 stage 2 parameters", fp32_stage2.parameters, 4000);
    check_equal("fp32 stage 2 gradients", fp32_stage2.gradients, 1000);
    check_equal("fp32 stage 2 optimizer", fp32_stage2.optimizer_state, 2000);
    // BF16, P = 1000, N = 8: stage 1 = 2000 + 2000 + 12000/8 = 5500; stage 2 = 2000 + 14000/8 = 3750
    check_equal("bf16 P=1000 N=8 stage 1", plan_training_memory(1000, 1, 8, 8, true).model_state, 5500);
    check_equal("bf16 P=1000 N=8 stage 2", plan_training_memory(1000, 2, 8, 8, true).model_state, 3750);
    // stage 0 ignores the shard count: 16 P on every rank
    check_equal("stage 0 ignores shard ranks", plan_training_memory(1000, 0, 8, 4, true).model_state, 16000);
    // --offload optimizer: the state to the host (12P/N, 8P/N in FP32); without a shape no staging is counted
    const MemoryPlan offloaded = plan_training_memory(1000, 1, 8, 8, true, 1, nullptr, true);
    check_equal("offloaded bf16 P=1000 N=8 stage 1: host 12P/N", offloaded.host_total, 1500);
    check_equal("offloaded bf16 P=1000 N=8 stage 1: device 2P + 2P", offloaded.model_state, 4000);
    check_equal("offloaded fp32 P=1000 stage 0: host 8P", plan_training_memory(1000, 0, 1, 1, false, 1, nullptr, true).host_total,
                8000);

    // communication, P = 1024
    //   stage 0, BF16, D = 8: 2 * 7/8 * 1024 * 2 = 3584
    check_equal("comm stage 0 D=8 bf16", plan_training_memory(1024, 0, 8, 1, true).communication, 3584);
    //   stage 1, BF16, one group of N = 4: 2 * 3/4 * 1024 * 2 = 3072
    check_equal("comm stage 1 N=4 bf16", plan_training_memory(1024, 1, 4, 4, true).communication, 3072);
    //   HSDP stage 1, BF16, D = 8 = M 2 x N 4: 3072 within the group
    //   + 2 * 1/2 * (1024/4) * 2 = 512 across the groups = 3584
    check_equal("comm HSDP stage 1 D=8 N=4 bf16", plan_training_memory(1024, 1, 8, 4, true).communication, 3584);
    //   HSDP stage 2, FP32, A = 4, D = 8 = M 4 x N 2: (4+1) * 1/2 * 1024 * 4 = 10240
    //   + 2 * 3/4 * (1024/2) * 4 = 3072 = 13312
    check_equal("comm HSDP stage 2 A=4 D=8 N=2 fp32", plan_training_memory(1024, 2, 8, 2, false, 4).communication,
                13312);
    //   stage 3, BF16, A = 2, N = D = 4: 3 * 2 * 3/4 * 1024 * 2 = 9216
    check_equal("comm stage 3 A=2 N=4 bf16", plan_training_memory(1024, 3, 4, 4, true, 2).communication, 9216);
    //   stage 1 with shards of one rank on D = 4 (plain all-reduce across 4 groups): 2 * 3/4 * 1024 * 2 = 3072
    check_equal("comm stage 1 N=1 D=4 bf16", plan_training_memory(1024, 1, 4, 1, true).communication, 3072);
    //   one rank sends nothing
    check_equal("comm one rank", plan_training_memory(1024, 2, 1, 1, true, 8).communication, 0);

    expect_failure("ranks that do not split into shard groups", [] { plan_training_memory(1000, 1, 6, 4, true); },
                   "do not split");
    expect_failure("stage 4", [] { plan_training_memory(1000, 4, 1, 1, true); }, "does not exist");
    expect_failure("zero accumulation steps", [] { plan_training_memory(1000, 1, 1, 1, true, 0); }, "must be >= 1");
}

// ----------------------------------------------------------------------------
// (d) activations of a small GPT-2, counted by hand:
//   L = 2, C = 64, NH = 4, Vp = 128, B = 2, T = 16 (N = 32 rows), 4 multiprocessors.
//   per layer, BF16: 16 N C s = 16 * 32 * 64 * 2 = 65536; fp32 stats (4N + N NH) * 4 = (128 + 128) * 4 = 1024
//                    = 66560                                  FP32: 131072 + 1024 = 132096
//   activations:     2 layers                                 133120   |  264192
//                    the stage record's input and doutput 2 NC, lnf NC and logits N Vp, floatX
//                                                   (4096 + 2048 + 4096) * s = 20480  |  40960
//                    lnf mean, rstd, losses: 3 N fp32          384
//                    inputs, targets: 2 N int                  256
//                    = 154240 (BF16)                           305792 (FP32)
//   workspace:       projection, dchannels NC, dhidden 4NC, dqkv 3NC = 9 NC s = 36864 | 73728
//                    fp32: attention_D N NH = 128, bias scratch ceil(32/64) * 4C = 256,
//                          layernorm scratch 2C * min(ceil(32/8), 3*4) = 512, norm scratch 4*4 = 16,
//                          step results (loss, squared norm) 2: 914 floats = 3656
//                    encoder workspace 4N int = 512;  loss sum, one double = 8
//                    = 41040 (BF16)                            77904 (FP32)

// The shape (d) and (g2) count by hand: L = 2, C = 64, NH = 4, Vp = 128, B = 2, T = 16, 4 multiprocessors.
static GPT2MemoryShape hand_count_shape() {
    GPT2MemoryShape shape;
    shape.num_layers = 2;
    shape.channels = 64;
    shape.num_heads = 4;
    shape.padded_vocab = 128;
    shape.max_seq_len = 16;
    shape.batch = 2;
    shape.seq_len = 16;
    shape.multiprocessors = 4;
    return shape;
}

static void test_activations() {
    printf("activations\n");
    GPT2MemoryShape shape = hand_count_shape();
    const ActivationBytes bf16 = gpt2_activation_bytes(shape, true), fp32 = gpt2_activation_bytes(shape, false);
    check_equal("hand count bf16 per layer", bf16.per_layer, 66560);
    check_equal("hand count bf16 activations", bf16.activations, 154240);
    check_equal("hand count bf16 workspace", bf16.workspace, 41040);
    check_equal("hand count fp32 per layer", fp32.per_layer, 132096);
    check_equal("hand count fp32 activations", fp32.activations, 305792);
    check_equal("hand count fp32 workspace", fp32.workspace, 77904);
    const MemoryPlan plan = plan_training_memory(1000, 1, 1, 1, true, 1, &shape);
    check_equal("plan total adds the activations", plan.total, plan.model_state + 154240 + 41040);
    print_memory_plan(plan);

#ifdef LLMC_CPU
    // What the program really allocates: the CPU device counts every cudaMalloc. A model of that shape
    // (real vocabulary 100, padded to 128), then the optimizer at each stage on one rank.
    GPT2Config config = small_gpt2(2);
    shape.max_seq_len = config.max_seq_len;
    shape.multiprocessors = device_properties().multiProcessorCount;
    const bool is_bf16 = sizeof(floatX) == 2;
    auto in_use = [] { return (double)cudacpu::allocations().in_use; };
    // one rank's whole model at each ZeRO stage: what gpt2_allocate and zero_init allocate against the plan
    auto check_stages = [&](const GPT2Config& model_config, const GPT2MemoryShape& model_shape, const std::string& base_name) {
        const ActivationBytes expected = gpt2_activation_bytes(model_shape, is_bf16);
        const size_t P = ParameterLayout(model_config, 1).total;
        for (int stage = 0; stage <= 3; stage++) {
          for (bool offload : {false, true}) {  // --offload optimizer: the state in host memory, staging on the device
            const std::string name = base_name + (offload ? "offloaded optimizer, " : "");
            const double before = in_use(), host_before = (double)host_memory_totals().current_total;
            GPT2 model;
            ModelPart whole;  // one rank's whole model, kept as ZeRO's stage keeps it
            whole.full_gradients = stage < 2;
            whole.full_parameters = stage < 3;
            gpt2_allocate(model, model_config, model_shape.batch, model_shape.seq_len, whole);
            const double model_bytes = in_use() - before;
            Zero zero;
            zero_init(zero, stage, nullptr, model, std::vector<float>(P, 0.01f), nullptr, offload);
            const double all_bytes = in_use() - before;
            const double host_bytes = (double)host_memory_totals().current_total - host_before;
            const MemoryPlan p = plan_training_memory(P, stage, 1, 1, is_bf16, 1, &model_shape, offload);
            // the model: full parameters below stage 3, full gradients below stage 2, activations, workspace
            const double s = sizeof(floatX);
            check_equal(name + "gpt2_allocate bytes, stage " + std::to_string(stage), model_bytes,
                        (stage < 3 ? s * P : 0) + (stage < 2 ? s * P : 0) + expected.activations + expected.workspace);
            // everything: the plan's total
            check_equal(name + "gpt2_allocate + zero_init bytes, stage " + std::to_string(stage), all_bytes, p.total);
            // and the pinned host memory: the optimizer state when offloaded, nothing otherwise
            check_equal(name + "zero_init host bytes, stage " + std::to_string(stage), host_bytes, p.host_total);
            if (offload)
                check_equal(name + "host bytes == (master +) m + v of the shard, stage " + std::to_string(stage),
                            host_bytes, (is_bf16 ? 12.0 : 8.0) * P);
            zero_free(zero);
            gpt2_free(model);
            check_equal(name + "all freed, stage " + std::to_string(stage), in_use(), before);
            check_equal(name + "host memory freed, stage " + std::to_string(stage),
                        (double)host_memory_totals().current_total, host_before);
          }
        }
    };
    check_stages(config, shape, "");
    // a Llama of the same size (2 K/V heads, 96 hidden units): its blocks' buffers and chunks (no wpe, an untied
    // LM head in the final chunk), which the ZeRO-2 and -3 working buffers are sized by
    GPT2Config llama = config;
    llama.arch = Arch::Llama;
    llama.kv_heads = 2;
    llama.ffn_hidden = 96;
    llama.rope_theta = 10000.0f;
    gpt2_validate_config(llama, "the Llama memory test");
    GPT2MemoryShape llama_shape = shape;
    llama_shape.llama = true;
    llama_shape.kv_heads = llama.kv_heads;
    llama_shape.ffn_hidden = llama.ffn_hidden;
    check_stages(llama, llama_shape, "Llama: ");
    // mixtures of experts (llmc/model/moe.cuh): the block's MLP as 4 experts, 2 per token, beside `shared` shared
    // experts of the block's own hidden units; GPT-2's with none (no fcw at all: the bias-gradient scratch is then
    // as wide as qkv, 3C), Llama's with one (fcw of 96 units)
    auto with_experts = [](GPT2Config c, GPT2MemoryShape m, int shared) {
        const int expert_hidden = c.llama() ? c.ffn_hidden : 4 * c.channels;
        c.experts = m.experts = 4;
        c.experts_per_token = m.experts_per_token = 2;
        c.shared_experts = shared;
        m.expert_hidden = expert_hidden;
        m.ffn_hidden = shared * expert_hidden;
        gpt2_validate_config(c, "the mixture-of-experts memory test");
        return std::make_pair(c, m);
    };
    const auto [gpt2_moe, gpt2_moe_shape] = with_experts(config, shape, 0);
    check_stages(gpt2_moe, gpt2_moe_shape, "GPT-2 with experts: ");
    const auto [llama_moe, llama_moe_shape] = with_experts(llama, llama_shape, 1);
    check_stages(llama_moe, llama_moe_shape, "Llama with experts: ");
    // a tensor-parallel rank's slices (llmc/parallel/tensor_parallel.h), with and without sequence parallelism:
    // allocating needs no other rank, so rank 0 of tp 2 and 4 stands in for all of them
    for (int tp_size : {2, 4}) {
        for (bool sequence_parallel : {false, true}) {
            ModelPart slice;
            slice.tp = tp_size;
            slice.sequence_parallel = sequence_parallel;
            GPT2MemoryShape sliced = shape;
            sliced.tp = tp_size;
            sliced.sequence_parallel = sequence_parallel;
            const ActivationBytes expected = gpt2_activation_bytes(sliced, is_bf16);
            const double before = in_use();
            GPT2 model;
            gpt2_allocate(model, config, shape.batch, shape.seq_len, slice);
            const double P_rank = (double)ParameterLayout(config, 1, tp_size).total;
            const std::string name = "gpt2_allocate bytes, tp " + std::to_string(tp_size) +
                                     (sequence_parallel ? " with sequence parallelism" : "");
            check_equal(name, in_use() - before, 2 * sizeof(floatX) * P_rank + expected.activations + expected.workspace);
            gpt2_free(model);
        }
    }
#endif
}

// ----------------------------------------------------------------------------
// (e) Korthikanti et al. 2022, Table 2: the paper's per-layer bytes, corrected for our kernels (no dropout,
// flash attention's log-sum-exp instead of the attention matrices, fp32 layernorm statistics), must equal
// gpt2_activation_bytes' per_layer for the run each row describes, to the byte, in 2-byte activations.

static GPT2MemoryShape table2_shape(int layers, int channels, int heads, int batch, int seq_len, int tp) {
    GPT2MemoryShape shape;
    shape.num_layers = layers;
    shape.channels = channels;
    shape.num_heads = heads;
    shape.padded_vocab = 50304;
    shape.max_seq_len = seq_len;
    shape.batch = batch;
    shape.seq_len = seq_len;
    shape.tp = tp;
    return shape;
}

// A small shape worked out by hand: s = 8, b = 2, h = 32, a = 4, t = 2, so sbh = 512, sb = 16,
// a s^2 b = 512, a s b = 64 (h = 32 rather than 16: with h = 16 the sp + selective row's corrections
// cancel, 2sbh/t = 4asb/t + 16sb/t, and that row could not tell a missing term).
//   row                  Table 2                                corrections                        corrected
//   no parallelism (t=1) 34*512 + 5*512 = 19968                 -2*512 -5*512 +4*64 +16*16 = -3072   16896
//   tensor parallel      10*512 + 24*512/2 + 5*512/2 = 12544    -1024 -1280 +128 +256 = -1920        10624
//   tensor + sequence    (34*512 + 5*512)/2 = 9984              -512 -1280 +128 +128 = -1536          8448
//   tp + selective       10*512 + 24*512/2 = 11264              -1024 +128 +256 = -640               10624
//   tp + sp + selective  34*512/2 = 8704                        -512 +128 +128 = -256                 8448
//   full recompute       2*512 = 1024                           none                                  1024
//   ours: selective      from 11264                             -640, then -(512+512 + 8*512/2) = -4096   6528
//   ours: selective + sp from 8704                              -256, then -(256+256 + 2048) = -3072      5376
// And our buffers (N = 16 rows, C = 32, NH = 4), BF16:
//   none, tp 1:       16 N C * 2 = 16384;  fp32 (4N + N NH) * 4 = (64 + 64) * 4 = 512            = 16896
//   none, tp 2:       (4NC 2048 + qkv, atty 4N C/2 1024 + fch, fch_gelu 2N 4C/2 2048) * 2 = 10240
//                     + (4N + N NH/2) * 4 = (64 + 32) * 4 = 384                                    = 10624
//   none, tp 2 + sp:  (4 N/2 C 1024 + 1024 + 2048) * 2 = 8192 + (4 N/2 + 32) * 4 = 256             =  8448
//   full, tp 2:       the block's input N C * 2                                                    =  1024
//   selective, tp 2:  10624 - (ln1, ln2 2NC 1024 + fch_gelu N 4C/2 1024) * 2                       =  6528
//   selective + sp:   8448 - (2 N/2 C 512 + 1024) * 2                                              =  5376
static void test_korthikanti_by_hand() {
    printf("Korthikanti et al. Table 2, a small shape by hand (s=8 b=2 h=32 a=4 t=2)\n");
    const GPT2MemoryShape shape = table2_shape(2, 32, 4, 2, 8, 2);
    const double table[kNumTable2Rows] = {19968, 12544, 9984, 11264, 8704, 1024, 11264, 8704};
    const double corrected[kNumTable2Rows] = {16896, 10624, 8448, 10624, 8448, 1024, 6528, 5376};
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Value v = korthikanti_table2((Table2Row)r, shape);
        check_equal(std::string("by hand: Table 2, ") + v.name, v.table, table[r]);
        check_equal(std::string("by hand: corrected, ") + v.name, v.corrected, corrected[r]);
        check_equal(std::string("by hand: ours, ") + v.name, gpt2_activation_bytes(v.ours, true).per_layer,
                    corrected[r]);
    }
    // the tensor-parallel row's terms, one by one
    const Table2Value tp = korthikanti_table2(Table2Row::TensorParallel, shape);
    check_equal("by hand: dropout masks", tp.dropout_masks, -1024);
    check_equal("by hand: attention matrices", tp.attention_matrix, -1280);
    check_equal("by hand: log-sum-exp", tp.log_sum_exp, 128);
    check_equal("by hand: layernorm statistics", tp.layernorm_statistics, 256);
    check_equal("by hand: our selective's outputs",
                korthikanti_table2(Table2Row::OursSelective, shape).selective_outputs, -4096);
    // each row stands for the run it says
    const Table2Value full = korthikanti_table2(Table2Row::FullRecompute, shape);
    check_true("by hand: full is full, every block, tp 2, no sp", full.ours.recompute.policy == RecomputePolicy::Full &&
               full.ours.recompute.every == 1 && full.ours.tp == 2 && !full.ours.sequence_parallel);
    const Table2Value none = korthikanti_table2(Table2Row::NoParallelism, shape);
    check_true("by hand: no parallelism is tp 1, recompute none",
               none.ours.tp == 1 && none.ours.recompute.policy == RecomputePolicy::None);
}

// Every row at GPT-2 shapes and odd ones: corrected Table 2 == our per-layer bytes, exactly.
static void test_korthikanti_shapes() {
    printf("Korthikanti et al. Table 2 against gpt2_activation_bytes\n");
    struct Case { const char* name; GPT2MemoryShape shape; };
    std::vector<Case> cases;
    for (int tp : {1, 2, 4}) cases.push_back({"124M B=16 T=1024", table2_shape(12, 768, 12, 16, 1024, tp)});
    for (int tp : {1, 2, 3, 6}) cases.push_back({"odd L=5 C=96 NH=6 B=3 T=42", table2_shape(5, 96, 6, 3, 42, tp)});
    for (int tp : {5, 25}) cases.push_back({"1558M B=1 T=1024", table2_shape(48, 1600, 25, 1, 1024, tp)});
    for (const Case& c : cases) {
        int equal = 0;
        std::string differing;
        for (int r = 0; r < kNumTable2Rows; r++) {
            const Table2Value v = korthikanti_table2((Table2Row)r, c.shape);
            const double ours = gpt2_activation_bytes(v.ours, true).per_layer;
            // the corrections are what separates the two counts: without them the rows would not agree
            // (except full, which needs none)
            const bool corrected_matters = r == (int)Table2Row::FullRecompute || v.table != ours;
            if (v.corrected == ours && corrected_matters) equal++;
            else differing += std::string(" ") + v.name + " (" + describe(ours, v.corrected) + ")";
        }
        check_true(std::string(c.name) + " tp " + std::to_string(c.shape.tp) + ": corrected Table 2 == ours, every row",
                   equal == kNumTable2Rows, differing);
    }
    // the 124M table as --plan prints it
    GPT2MemoryShape plan_shape = table2_shape(12, 768, 12, 16, 1024, 4);
    plan_shape.sequence_parallel = true;
    print_korthikanti_table2(plan_shape, true);
}

// Llama's block against the adapted Table 2 (llmc/planning/korthikanti_table2.h), a small shape by hand: s = 8,
// b = 2, h = 32, a = 4, 2 K/V heads of 8 channels (k = 16), f = 48 hidden units, t = 2; sbh = 512, sbk = 256,
// sbf = 768, a s^2 b = 512, asb = 64, sb = 16. Replicated 8sbh = 4096, split sb(4h + 4k + 6f) = 2048 + 1024 + 4608 = 7680
// (whole 11776), attention matrix 2as^2b = 1024:
//   row                  adapted Table 2                  corrections (lse 4asb/t, rstd 8sb)    corrected
//   no parallelism (t=1) 11776 + 1024 = 12800             -1024 +256 +128 = -640                 12160
//   tensor parallel      4096 + 7680/2 + 1024/2 = 8448    -512 +128 +128 = -256                  8192
//   tensor + sequence    (11776 + 1024)/2 = 6400          -512 +128 +64 = -320                   6080
//   tp + selective       4096 + 3840 = 7936               +128 +128 = +256                       8192
//   tp + sp + selective  11776/2 = 5888                   +128 +64 = +192                        6080
//   full recompute       2*512 = 1024                     none                                   1024
//   ours: selective      from 7936                        +256, then -(2048 + 2*768/2) = -2816   5376
//   ours: selective + sp from 5888                        +192, then -(1024 + 768) = -1792       4288
// And our buffers (N = 16 rows, C = 32, q = (4 + 2*2) 8/t columns of qkv, fc 2H/t, H/t), BF16:
//   none, tp 2:  (4NC 2048 + qkv 16*32 512 + atty 16*16 256 + fch 16*48 768 + product 16*24 384) * 2 = 7936
//                + (rstd 2N + lse N NH/2) * 4 = (32 + 32) * 4 = 256                              = 8192
//   none, tp 1:  (2048 + 1024 + 512 + 1536 + 768) * 2 = 11776 + (32 + 64) * 4 = 384              = 12160
//   sp, tp 2:    (4 N/2 C 1024 + 512 + 256 + 768 + 384) * 2 = 5888 + (16 + 32) * 4 = 192           = 6080
//   selective:   8192 - (ln1, ln2 2NC 1024 + product 384) * 2 = 5376;  + sp: 6080 - (512 + 384) * 2 = 4288
static GPT2MemoryShape table2_llama_shape(int layers, int channels, int heads, int kv_heads, int hidden, int batch,
                                          int seq_len, int tp) {
    GPT2MemoryShape shape = table2_shape(layers, channels, heads, batch, seq_len, tp);
    shape.llama = true;
    shape.kv_heads = kv_heads;
    shape.ffn_hidden = hidden;
    shape.padded_vocab = 128256;
    return shape;
}

static void test_korthikanti_llama() {
    printf("Korthikanti et al. Table 2 adapted to Llama's block, a small shape by hand (s=8 b=2 h=32 a=4 k=16 f=48 "
           "t=2) and Llama 3's shapes\n");
    const GPT2MemoryShape shape = table2_llama_shape(2, 32, 4, 2, 48, 2, 8, 2);
    const double table[kNumTable2Rows] = {12800, 8448, 6400, 7936, 5888, 1024, 7936, 5888};
    const double corrected[kNumTable2Rows] = {12160, 8192, 6080, 8192, 6080, 1024, 5376, 4288};
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Value v = korthikanti_table2((Table2Row)r, shape);
        check_equal(std::string("Llama by hand: adapted Table 2, ") + v.name, v.table, table[r]);
        check_equal(std::string("Llama by hand: corrected, ") + v.name, v.corrected, corrected[r]);
        check_equal(std::string("Llama by hand: ours, ") + v.name, gpt2_activation_bytes(v.ours, true).per_layer,
                    corrected[r]);
    }
    const Table2Value tp = korthikanti_table2(Table2Row::TensorParallel, shape);
    check_true("Llama by hand: no dropout masks, softmax output 2as^2b/t, lse 4asb/t, rstd 8sb",
               tp.dropout_masks == 0 && tp.attention_matrix == -512 && tp.log_sum_exp == 128 &&
                   tp.layernorm_statistics == 128,
               describe(tp.attention_matrix, -512));
    check_equal("Llama by hand: our selective's outputs (ln1, ln2, the product)",
                korthikanti_table2(Table2Row::OursSelective, shape).selective_outputs, -2816);

    // Llama 3's shapes at 8K positions, b = 1 (tp up to the 8 K/V heads), and an odd one: every row equal
    struct Case { const char* name; GPT2MemoryShape shape; };
    std::vector<Case> cases;
    for (int tp : {1, 2, 4, 8})
        cases.push_back({"llama3-8B s=8192", table2_llama_shape(32, 4096, 32, 8, 14336, 1, 8192, tp)});
    cases.push_back({"llama3-70B s=8192", table2_llama_shape(80, 8192, 64, 8, 28672, 1, 8192, 8)});
    for (int tp : {1, 8})
        cases.push_back({"llama3-405B s=8192", table2_llama_shape(126, 16384, 128, 8, 53248, 1, 8192, tp)});
    for (int tp : {1, 3})
        cases.push_back({"odd L=3 C=96 NH=6 KV=3 H=264 B=3 T=42", table2_llama_shape(3, 96, 6, 3, 264, 3, 42, tp)});
    for (const Case& c : cases) {
        int equal = 0;
        std::string differing;
        for (int r = 0; r < kNumTable2Rows; r++) {
            const Table2Value v = korthikanti_table2((Table2Row)r, c.shape);
            const double ours = gpt2_activation_bytes(v.ours, true).per_layer;
            const bool corrected_matters = r == (int)Table2Row::FullRecompute || v.table != ours;
            if (v.corrected == ours && corrected_matters) equal++;
            else differing += std::string(" ") + v.name + " (" + describe(ours, v.corrected) + ")";
        }
        check_true(std::string(c.name) + " tp " + std::to_string(c.shape.tp) + ": corrected adapted Table 2 == ours, "
                   "every row", equal == kNumTable2Rows, differing);
    }
    // the 405B table as --plan prints it
    GPT2MemoryShape plan_shape = table2_llama_shape(126, 16384, 128, 8, 53248, 1, 8192, 8);
    plan_shape.sequence_parallel = true;
    print_korthikanti_table2(plan_shape, true);
}

// ----------------------------------------------------------------------------
// (g) a pipeline rank's part of the model, allocated

/*
Under pipeline parallelism gpt2_allocate gets the rank's part (llmc/parallel/pipeline.h's
pipeline_model_part): the chunks it holds, l = L / (p V) layers per stage and K stage records, the peak of its
schedule's records in flight. For every rank of p = 2 and 4 under gpipe, 1f1b and interleaved (V = 2), m = 8 microbatches, an
8-layer model and each recompute policy (per block: mixes of k, f, s, o, and every block offloaded), the bytes
gpt2_allocate books per kind must be
  parameters, gradients   sizeof(floatX) x the rank's ParameterLayout total (its chunks only)
  activations, workspace  gpt2_activation_bytes with stage_layers l, records K, first_stage on rank 0 (it
                          holds stage 0) and last_stage on rank p - 1 (stage S - 1 = (V - 1) p + p - 1)
  host activations        its host term (the offloaded blocks' records, K of each)
and K must be the pool of records its actions use (pipeline_record_assignment).
*/
// Per-block policies for records of `positions` blocks: the letters k, f, s, o in turn from `first` (so that
// every position meets every letter across the calls), and every block offloaded.
static std::vector<Recompute> per_block_policies(int positions) {
    std::vector<Recompute> policies;
    for (int first = 0; first < 4; first++) {
        Recompute r{RecomputePolicy::PerBlock, 1};
        for (int i = 0; i < positions; i++) r.blocks.push_back((BlockKeep)"\0\2\1\3"[(first + i) % 4]);
        policies.push_back(r);
    }
    Recompute offloaded{RecomputePolicy::PerBlock, 1};
    recompute_blocks_resolve(offloaded, positions);
    policies.push_back(offloaded);
    return policies;
}

static void test_pipeline_parts() {
    printf("pipeline parts: gpt2_allocate against gpt2_activation_bytes\n");
    GPT2Config config = small_gpt2(8);
    GPT2MemoryShape shape;
    shape.num_layers = config.num_layers;
    shape.channels = config.channels;
    shape.num_heads = config.num_heads;
    shape.padded_vocab = config.padded_vocab_size;
    shape.max_seq_len = config.max_seq_len;
    shape.batch = 2;
    shape.seq_len = 16;
    shape.multiprocessors = device_properties().multiProcessorCount;
    const bool is_bf16 = sizeof(floatX) == 2;
    const int m = 8, L = config.num_layers;
    // full every 3 on the 4-layer stages of gpipe and 1f1b at p = 2: segments of 3 and 1, two outputs kept
    const std::vector<Recompute> uniform = {Recompute{}, Recompute{RecomputePolicy::Selective, 1},
                                            Recompute{RecomputePolicy::Full, 1}, Recompute{RecomputePolicy::Full, 3}};
    for (int p : {2, 4})
        for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB,
                                          PipelineSchedule::Interleaved, PipelineSchedule::ZeroBubbleV}) {
            const int V = schedule == PipelineSchedule::Interleaved || schedule == PipelineSchedule::ZeroBubbleV ? 2 : 1;
            for (int r = 0; r < p; r++) {
                ModelPart part = pipeline_model_part(schedule, r, p, V, m, std::vector<int>(p * V, L / (p * V)), true,
                                                     pipeline_outboxes(pipeline_all_groups(schedule, p, V, m)[r]));
                int pool = 0;
                pipeline_record_assignment(pipeline_actions(schedule, r, p, m, V), &pool);
                std::string wrong;
                if (part.records != pool)
                    wrong += " records " + std::to_string(part.records) + ", pool " + std::to_string(pool);
                if (part.stage_layers != L / (p * V)) wrong += " stage_layers " + std::to_string(part.stage_layers);
                const double P = (double)ParameterLayout(config, 1, 1, 0, part.held_chunks).total;
                std::vector<Recompute> policies = uniform;
                for (const Recompute& r : per_block_policies(L / (p * V))) policies.push_back(r);
                for (const Recompute& recompute : policies) {
                    GPT2MemoryShape stage = shape;
                    stage.recompute = recompute;
                    stage.stage_layers = L / (p * V);
                    stage.records = part.records;
                    stage.weight_records = part.weight_records;
                    stage.outboxes = part.outboxes;
                    stage.first_stage = r == 0;
                    stage.last_stage = r == pipeline_stage_rank(schedule, p * V - 1, p);  // zbv: rank 0
                    const ActivationBytes want = gpt2_activation_bytes(stage, is_bf16);
                    const MemoryTotals before = memory_totals(), host_before = host_memory_totals();
                    GPT2 model;
                    part.recompute = recompute;
                    gpt2_allocate(model, config, shape.batch, shape.seq_len, part);
                    const MemoryTotals after = memory_totals(), host_after = host_memory_totals();
                    auto booked = [&](MemoryKind kind) {
                        return (double)after.current[(int)kind] - (double)before.current[(int)kind];
                    };
                    const std::string policy = " " + recompute_describe(recompute) + ": ";
                    auto compare = [&](const char* what, double got, double expected) {
                        if (got != expected) wrong += policy + what + " " + describe(got, expected);
                    };
                    compare("parameters", booked(MemoryKind::Parameters), sizeof(floatX) * P);
                    compare("gradients", booked(MemoryKind::Gradients), sizeof(floatX) * P);
                    compare("activations", booked(MemoryKind::Activations), want.activations);
                    compare("workspace", booked(MemoryKind::Workspace), want.workspace);
                    compare("all", (double)after.current_total - (double)before.current_total,
                            2 * sizeof(floatX) * P + want.activations + want.workspace);
                    compare("host activations",
                            (double)host_after.current[(int)MemoryKind::Activations] -
                                (double)host_before.current[(int)MemoryKind::Activations], want.host);
                    compare("host, all", (double)host_after.current_total - (double)host_before.current_total,
                            want.host);
                    compare("records", (double)model.records.size(), part.records);
                    compare("first stage", model.first_stage, stage.first_stage);
                    compare("last stage", model.last_stage, stage.last_stage);
                    gpt2_free(model);
                    compare("left after gpt2_free", (double)memory_totals().current_total,
                            (double)before.current_total);
                    compare("host left after gpt2_free", (double)host_memory_totals().current_total,
                            (double)host_before.current_total);
                }
                char name[160];
                snprintf(name, sizeof(name), "%s p=%d%s rank %d: l %d, K %d records, every policy",
                         pipeline_schedule_name(schedule), p, V > 1 ? " V=2" : "", r, L / (p * V), part.records);
                check_true(name, wrong.empty(), wrong);
            }
        }
}

// ZeRO-2 and -3 on a pipeline rank: the working buffers and the gathered chunks of the chunks it holds (the
// embedding chunk on the first stage, and on the last where GPT-2's LM head is wte; the final chunk on the last),
// allocated by gpt2_allocate and zero_init, against the plan's total for the rank's shape. Two ranks of 1f1b, a
// GPT-2 and a Llama of 4 layers.
static void test_pipeline_zero_buffers() {
    printf("ZeRO-2 and -3 working buffers on a pipeline rank\n");
    GPT2Config gpt2 = small_gpt2(4);
    GPT2Config llama = gpt2;
    llama.arch = Arch::Llama;
    llama.kv_heads = 2;
    llama.ffn_hidden = 96;
    llama.rope_theta = 10000.0f;
    const bool is_bf16 = sizeof(floatX) == 2;
    const int p = 2, m = 2;
    for (const GPT2Config& config : {gpt2, llama}) {
        Layout layout;
        layout.pp = p, layout.batch_size = 2, layout.seq_len = 16;
        layout.multiprocessors = device_properties().multiProcessorCount;
        const std::vector<int> stages(p, config.num_layers / p);
        for (int stage = 2; stage <= 3; stage++)
            for (int r = 0; r < p; r++) {
                const PipelineSchedule schedule = PipelineSchedule::OneFOneB;
                ModelPart part = pipeline_model_part(schedule, r, p, 1, m, stages, config.tied_head(),
                                                     pipeline_outboxes(pipeline_all_groups(schedule, p, 1, m)[r]));
                part.full_gradients = false;
                part.full_parameters = stage < 3;
                const GPT2MemoryShape shape = gpt2_memory_shape(config, layout, part);
                const size_t P = ParameterLayout(config, 1, 1, 0, part.held_chunks).total;
                const double before = (double)cudacpu::allocations().in_use;
                GPT2 model;
                gpt2_allocate(model, config, shape.batch, shape.seq_len, part);
                Zero zero;
                zero_init(zero, stage, nullptr, model, std::vector<float>(P, 0.01f));
                const double bytes = (double)cudacpu::allocations().in_use - before;
                const MemoryPlan plan = plan_training_memory(P, stage, 1, 1, is_bf16, m, &shape);
                check_equal(std::string(arch_name(config.arch)) + " 1f1b p=2 rank " + std::to_string(r) + ", stage " +
                                std::to_string(stage) + ": gpt2_allocate + zero_init bytes == the plan's total",
                            bytes, plan.total);
                zero_free(zero);
                gpt2_free(model);
            }
    }
}

// ----------------------------------------------------------------------------
// (g2) weight-gradient records (schedules that split the backward pass into B and W), counted by hand for the
// shape of (d): L = 2, C = 64, NH = 4, N = 32 rows, per layer and record
//   tp 1:  ln1, ln2, dattention, dmlp 4NC + atty, dqkv 4NC + fch_gelu, dhidden 2 N 4C = 16 NC = 32768,
//          layernorm gradients 4C = 256:  33024 values = 66048 bytes (BF16), 132096 (FP32)
//   tp 2:  4NC 8192 + 4 N C/2 4096 + 2 N 4C/2 8192 + 256 = 20736 values = 41472 bytes (BF16); the same with
//          sequence parallelism (the record holds the gathered rows)
// and W records of l layers add W l of them to the activations, E head records E of the last stage's lnf,
// logits and statistics. Then, in the CPU build, what gpt2_allocate books for part.weight_records W records and
// as many head records against gpt2_activation_bytes, every recompute policy (the record
// is the same under each: copies), with tp and sequence parallelism, and on records sized for 3 layers.
static void test_weight_records() {
    printf("weight-gradient records\n");
    GPT2MemoryShape shape = hand_count_shape();
    check_equal("hand count bf16 per layer", gpt2_activation_bytes(shape, true).weight_record, 66048);
    check_equal("hand count fp32 per layer", gpt2_activation_bytes(shape, false).weight_record, 132096);
    GPT2MemoryShape with_records = shape;
    with_records.weight_records = 2;
    check_equal("2 records of 2 layers, bf16 activations", gpt2_activation_bytes(with_records, true).activations,
                154240 + 2 * 2 * 66048);
    check_equal("... workspace unchanged", gpt2_activation_bytes(with_records, true).workspace, 41040);
    // a head record: floatX lnf and logits (32 x 64 + 32 x 128) x 2 bytes, fp32 mean and rstd 2 x 32 x 4
    GPT2MemoryShape with_heads = shape;
    with_heads.heads = 3;
    check_equal("3 head records, bf16 activations", gpt2_activation_bytes(with_heads, true).activations,
                154240 + 2 * ((32 * 64 + 32 * 128) * 2 + 2 * 32 * 4));
    GPT2MemoryShape sliced = shape;
    sliced.tp = 2;
    check_equal("hand count bf16 per layer, tp 2", gpt2_activation_bytes(sliced, true).weight_record, 41472);
    sliced.sequence_parallel = true;
    check_equal("hand count bf16 per layer, tp 2 + sp", gpt2_activation_bytes(sliced, true).weight_record, 41472);

#ifdef LLMC_CPU
    GPT2Config config = small_gpt2(4);
    shape.num_layers = config.num_layers;
    shape.max_seq_len = config.max_seq_len;
    shape.multiprocessors = device_properties().multiProcessorCount;
    const bool is_bf16 = sizeof(floatX) == 2;
    const std::vector<Recompute> uniform = {Recompute{}, Recompute{RecomputePolicy::Selective, 1},
                                            Recompute{RecomputePolicy::Full, 1}, Recompute{RecomputePolicy::Full, 2}};
    for (int tp_size : {1, 2})
        for (bool sequence_parallel : {false, true}) {
            if (sequence_parallel && tp_size == 1) continue;
            for (int stage_layers : {0, 3})
                for (int weight_records : {1, 3}) {
                    std::string wrong;
                    std::vector<Recompute> policies = uniform;
                    for (const Recompute& r : per_block_policies(stage_layers > 0 ? stage_layers : config.num_layers))
                        policies.push_back(r);
                    for (const Recompute& recompute : policies) {
                        ModelPart part;
                        part.tp = tp_size;
                        part.sequence_parallel = sequence_parallel;
                        part.recompute = recompute;
                        part.stage_layers = stage_layers;
                        part.records = 2;
                        part.weight_records = weight_records;
                        part.heads = weight_records;  // a split backward's head records, as many
                        GPT2MemoryShape expected_shape = shape;
                        expected_shape.tp = tp_size;
                        expected_shape.sequence_parallel = sequence_parallel;
                        expected_shape.recompute = recompute;
                        expected_shape.stage_layers = stage_layers;
                        expected_shape.records = 2;
                        expected_shape.weight_records = weight_records;
                        expected_shape.heads = weight_records;
                        const ActivationBytes want = gpt2_activation_bytes(expected_shape, is_bf16);
                        const MemoryTotals before = memory_totals(), host_before = host_memory_totals();
                        GPT2 model;
                        gpt2_allocate(model, config, shape.batch, shape.seq_len, part);
                        const MemoryTotals after = memory_totals();
                        const double host = (double)host_memory_totals().current_total - host_before.current_total;
                        if (host != want.host)
                            wrong += " " + recompute_describe(recompute) + ": host " + describe(host, want.host);
                        auto booked = [&](MemoryKind kind) {
                            return (double)after.current[(int)kind] - (double)before.current[(int)kind];
                        };
                        const std::string policy = " " + recompute_describe(recompute) + ": ";
                        if (booked(MemoryKind::Activations) != want.activations)
                            wrong += policy + "activations " + describe(booked(MemoryKind::Activations), want.activations);
                        if (booked(MemoryKind::Workspace) != want.workspace)
                            wrong += policy + "workspace " + describe(booked(MemoryKind::Workspace), want.workspace);
                        if ((int)model.weight_records.size() != weight_records ||
                            (int)model.heads.size() != weight_records)
                            wrong += policy + "pool size";
                        gpt2_free(model);
                        if (memory_totals().current_total != before.current_total) wrong += policy + "left after free";
                    }
                    char name[160];
                    snprintf(name, sizeof(name), "gpt2_allocate, %d weight-gradient and head record(s) of %d layers, "
                             "tp %d%s, every policy (per block: k f s o mixes, all o)", weight_records, stage_layers > 0 ? stage_layers : config.num_layers,
                             tp_size, sequence_parallel ? " + sp" : "");
                    check_true(name, wrong.empty(), wrong);
                }
        }
#endif
}

int run(int, char**) {
    test_accounting();
    test_paper();
    test_formulas();
    test_activations();
    test_korthikanti_by_hand();
    test_korthikanti_shapes();
    test_korthikanti_llama();
    test_pipeline_parts();
    test_pipeline_zero_buffers();
    test_weight_records();
    return lab_closing_line();
}
}  // namespace test_memory
