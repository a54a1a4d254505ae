/*
Tests of the parameter buffer's layout (llmc/model/parameters.h's ParameterLayout): the alignment cuBLASLt sees
for every matmul operand in the real layouts of GPT-2 124M to 1558M, and the layouts that hold only a pipeline
rank's chunks (and an ep rank's experts, with chunks of two sizes under --moe-every): their sizes, offsets, and
conversions to and from the model file's layout. Prints `N passed, M failed`.
*/
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>
#include "../lab/lab.h"
#include "small_models.h"
#include "../../llmc/parallel/pipeline.h"

namespace test_parameter_layout {  // one suite of dev/test/host_suites.cu

// ----------------------------------------------------------------------------
// (a) the alignment of the trainer's matmul operands in the real parameter layouts

/*
The matmul plans (llmc/kernels/matmul.cuh, "Plans") tell cuBLASLt how aligned each operand is. Activations are
cudaMallocs of their own (256 bytes); the weights and their gradients sit at offsets in the parameter
buffer, counted from the buffer's start when it holds every chunk (parameters at ZeRO stages 0-2,
gradients at 0-1) or from the chunk's start when each chunk gets a buffer of its own (parameters gathered
at stage 3, gradients accumulated at stages 2-3). For every GPT-2 size, chunks padded for 1, 2, 3, 4 and
8 shards, and both placements, this builds every matmul key the trainer's forward and backward passes
compute (qkv, attention projection, fc and fc projection of every layer, forward, dinp and dweight, and
the lm head), from pointers made by the same block_params_in_chunk the trainer uses on a 256-aligned
address, and checks each alignment against its definition: it divides the offset, and it is 256 or the
quotient is odd. It also checks that no weight or bias drops below 16 bytes, the alignment the cuBLAS
guide asks of pointers for the fastest tensor-core paths, and prints the smallest alignment per tensor
for 1558M.
*/
static void test_matmul_alignment() {
    printf("matmul operand alignment in the parameter layouts (BF16)\n");
    const uintptr_t base = 0x7f0000000000;  // 256-byte aligned, like cudaMalloc's; never dereferenced
    floatX* const activation = (floatX*)(base + 0x10000000000);  // any 256-aligned activation
    const int N = 8 * 1024;
    auto offset_of = [&](const floatX* pointer) { return (uintptr_t)pointer - base; };
    // an alignment is right when it divides the offset and is 256 or leaves an odd quotient
    auto is_largest_power_of_two = [](uintptr_t offset, int alignment) {
        return offset % alignment == 0 && (alignment == MATMUL_MAX_ALIGNMENT || (offset / alignment) % 2 == 1);
    };

    enum { QKV, ATTPROJ, FC, FCPROJ, LM_HEAD, NUM_LINEAR };
    for (const char* model_name : {"124M", "350M", "774M", "1558M"}) {
        GPT2Config config;
        gpt2_config_by_name(model_name, &config);
        const int C = config.channels;
        const bool print = std::string(model_name) == "1558M";
        if (print)
            printf("  GPT-2 %s: smallest alignment (bytes) of each weight / its bias over all layers, as cuBLASLt "
                   "sees them\n  %-6s %-13s %8s %8s %8s %8s %8s\n", model_name, "shards", "placement", "qkv",
                   "attproj", "fc", "fcproj", "lm head");
        int keys = 0, wrong = 0, below_16 = 0;
        std::string smallest_line;  // the smallest weight alignment in one buffer, per shard count
        for (int shards : {1, 2, 3, 4, 8}) {
            const ParameterLayout layout(config, shards);
            for (int per_chunk = 0; per_chunk <= 1; per_chunk++) {
                int weight_min[NUM_LINEAR], bias_min[NUM_LINEAR];
                for (int i = 0; i < NUM_LINEAR; i++) weight_min[i] = bias_min[i] = MATMUL_MAX_ALIGNMENT;
                // forward, dinp and dweight of one linear layer, keyed as matmul_forward / matmul_backward do
                auto check_linear = [&](int which, const floatX* weight, const floatX* bias, const floatX* dweight,
                                        int in, int out) {
                    const MatmulPlanKey forward = matmul_plan_key(activation, activation, weight, bias, N, out, in,
                                                                  false, true, false);
                    const MatmulPlanKey dinp = matmul_plan_key(activation, activation, weight, nullptr, N, in, out,
                                                               false, false, false);
                    const MatmulPlanKey dweight_key = matmul_plan_key(dweight, activation, activation, nullptr, out,
                                                                      in, N, true, false, true);
                    const int weight_alignment = matmul_cublas_alignments(forward).A;  // cuBLAS's A: the weight
                    keys += 3;
                    wrong += !is_largest_power_of_two(offset_of(weight), weight_alignment);
                    wrong += matmul_cublas_alignments(dinp).A != weight_alignment;
                    wrong += !is_largest_power_of_two(offset_of(dweight), matmul_cublas_alignments(dweight_key).D);
                    wrong += matmul_cublas_alignments(forward).B != 256 || matmul_cublas_alignments(dweight_key).A != 256;
                    below_16 += weight_alignment < 16;
                    weight_min[which] = std::min(weight_min[which], weight_alignment);
                    if (bias != nullptr) {
                        wrong += !is_largest_power_of_two(offset_of(bias), forward.bias_alignment);
                        below_16 += forward.bias_alignment < 16;
                        bias_min[which] = std::min(bias_min[which], forward.bias_alignment);
                    }
                };
                for (int l = 0; l < config.num_layers; l++) {
                    // parameters and gradients share the layout; the gradient buffer starts 256-aligned too
                    floatX* chunk = (floatX*)(base + (per_chunk ? 0 : layout.chunk_start(l + 1) * sizeof(floatX)));
                    const BlockParams p = block_params_in_chunk(chunk, layout, l);
                    check_linear(QKV, p.qkvw, p.qkvb, p.qkvw, C, 3 * C);
                    check_linear(ATTPROJ, p.attprojw, p.attprojb, p.attprojw, C, C);
                    check_linear(FC, p.fcw, p.fcb, p.fcw, C, 4 * C);
                    check_linear(FCPROJ, p.fcprojw, p.fcprojb, p.fcprojw, 4 * C, C);
                }
                // the lm head: wte, at the start of the embedding chunk
                const floatX* wte = (floatX*)(base + layout.offset(WTE) * sizeof(floatX));
                check_linear(LM_HEAD, wte, nullptr, wte, C, config.padded_vocab_size);
                if (!per_chunk)
                    smallest_line += " " + std::to_string(shards) + ": " +
                                     std::to_string(*std::min_element(weight_min, weight_min + NUM_LINEAR));
                if (print) {
                    printf("  %-6d %-13s", shards, per_chunk ? "chunk's own" : "one buffer");
                    for (int i = 0; i < NUM_LINEAR; i++) {
                        char cell[16];
                        if (i == LM_HEAD) snprintf(cell, sizeof(cell), "%d", weight_min[i]);
                        else snprintf(cell, sizeof(cell), "%d/%d", weight_min[i], bias_min[i]);
                        printf(" %8s", cell);
                    }
                    printf("\n");
                }
            }
        }
        const std::string name = std::string("GPT-2 ") + model_name;
        printf("  %s: smallest weight alignment in one buffer, by shards:%s\n", name.c_str(), smallest_line.c_str());
        check_true(name + ": every alignment is the offset's largest power of two <= 256", wrong == 0,
                   std::to_string(keys) + " keys, " + std::to_string(wrong) + " wrong");
        check_true(name + ": every weight and bias at least 16-byte aligned", below_16 == 0,
                   std::to_string(below_16) + " below");
    }
}

// ----------------------------------------------------------------------------
// (b) parameter layouts that hold a pipeline rank's chunks

/*
A rank's ParameterLayout holds only its chunks (pipeline_held_chunks), each padded as in the whole layout
of the same shards, tp and ep. For a 4-layer model, dense and with experts in blocks 1 and 3 (--moe-every 2:
two sizes of block chunk), tp 1 and 2, ep 1 and 2 (with experts), shards 1 and 3, and p x V = 1, 2, 4 and
2 x 2 (1f1b, interleaved, zbv), on every pp, tp and ep rank's layout:
  - total is the sum of the held chunks' sizes (as in the layout holding every chunk), and chunks not held
    take 0 elements;
  - chunk_of_offset maps every element of each held chunk to that chunk, the held chunks lying end to end;
  - for_each_common_run from the model file's layout (tp 1, every chunk) writes each of the rank's
    parameters exactly once and never its padding; over all ranks it reads every parameter of the model,
    a block's once, the embeddings twice when p > 1 (first and last stage), tp-replicated tensors once per
    tp rank, all but the experts once per ep rank, padding never;
  - parameters_in_layout to the rank's layout and back gives the model's values where the rank holds them
    and 0 elsewhere; the ranks' round trips together give back the whole model; and a rank's part converts
    to the same part padded for another shard count and back unchanged.
*/
// One rank's layout `part` against the model file's layout `model` (values: the model's, 0 on padding).
// Returns what is wrong, "" when nothing; adds to `reads` how many runs read each model element, and puts
// the values that come back from the round trip into `assembled`.
static std::string check_rank_layout(const ParameterLayout& model, const std::vector<float>& values,
                                     const ParameterLayout& part, std::vector<int>& reads,
                                     std::vector<float>& assembled) {
    const int L = part.config.num_layers;
    const ParameterLayout all(part.config, part.shards, part.tp, part.tp_rank, {}, part.ep, part.ep_rank);  // every chunk
    // sizes and chunk_of_offset, and which elements are parameters (each chunk's first ones, then padding)
    std::vector<char> parameter(part.total, 0);
    size_t end = 0, parameters = 0;
    for (int chunk = 0; chunk < L + 2; chunk++) {
        const std::string which = "chunk " + std::to_string(chunk);
        if (!part.holds(chunk)) {
            if (part.chunk_size(chunk) != 0) return which + ", not held, has a size";
            continue;
        }
        if (part.chunk_start(chunk) != end || part.chunk_size(chunk) != all.chunk_size(chunk))
            return which + " does not follow the held chunks before it at its size in the whole layout";
        const size_t used = chunk == 0       ? part.elements(WTE, 0) + part.elements(WPE, 0)
                            : chunk == L + 1 ? part.elements(LNFW, 0) + part.elements(LNFB, 0) + part.elements(LMHEAD, 0)
                                             : part.block_elements(chunk - 1);
        for (size_t o = end; o < end + part.chunk_size(chunk); o++) {
            if (part.chunk_of_offset(o) != chunk) return "chunk_of_offset(" + std::to_string(o) + ") is not " + which;
            parameter[o] = o < end + used;
        }
        parameters += used;
        end += part.chunk_size(chunk);
    }
    if (part.total != end) return "total " + std::to_string(part.total) + ", the held chunks " + std::to_string(end);
    if (part.num_parameters != parameters) return "num_parameters " + std::to_string(part.num_parameters);
    // the runs from the model file's layout: each parameter written once, padding never
    std::vector<int> writes(part.total, 0);
    std::vector<char> mine(model.total, 0);  // the model elements this rank holds
    for_each_common_run(model, part, [&](size_t from, size_t to, size_t count) {
        for (size_t k = 0; k < count; k++) {
            writes[to + k]++;
            reads[from + k]++;
            mine[from + k] = 1;
        }
    });
    for (size_t o = 0; o < part.total; o++)
        if (writes[o] != parameter[o])
            return "element " + std::to_string(o) + " (" + (parameter[o] ? "a parameter" : "padding") + ") written " +
                   std::to_string(writes[o]) + " times by the runs";
    // round trips: to the rank's layout and back; to another shard count and back
    const std::vector<float> here = parameters_in_layout(model, values, part);
    for (size_t o = 0; o < part.total; o++)
        if ((here[o] != 0) != (parameter[o] != 0))
            return "element " + std::to_string(o) + ": a parameter without a value, or padding with one";
    const std::vector<float> back = parameters_in_layout(part, here, model);
    for (size_t i = 0; i < model.total; i++) {
        if (back[i] != (mine[i] ? values[i] : 0.0f))
            return "model element " + std::to_string(i) + " does not come back";
        if (mine[i]) assembled[i] = back[i];
    }
    const ParameterLayout other(part.config, part.shards == 1 ? 3 : 1, part.tp, part.tp_rank, part.held, part.ep,
                                part.ep_rank);
    if (parameters_in_layout(other, parameters_in_layout(part, here, other), part) != here)
        return "converted to " + std::to_string(other.shards) + " shards and back, it changes";
    return "";
}

static void test_held_layouts() {
    printf("parameter layouts holding a pipeline rank's chunks\n");
    GPT2Config dense = small_gpt2(4);
    // and with 4 experts (2 per token, no shared one) in every 2nd block: blocks 1 and 3, whose chunks differ
    // from the dense blocks 0 and 2, split over ep ranks too
    GPT2Config mixture = dense;
    mixture.experts = 4, mixture.experts_per_token = 2, mixture.moe_every = 2;
    const int L = dense.num_layers;
    for (const GPT2Config& config : {dense, mixture}) {
        const ParameterLayout model(config);  // the model file's
        // every element of the model: its kind and chunk (-1: padding)
        std::vector<int> kind_of(model.total, -1), chunk_of(model.total, -1);
        for_each_tensor_in_file_order(model, [&](int kind, int layer, size_t offset, size_t count) {
            std::fill(kind_of.begin() + offset, kind_of.begin() + offset + count, kind);
            std::fill(chunk_of.begin() + offset, chunk_of.begin() + offset + count, model.chunk_of(kind, layer));
        });
        std::vector<float> values(model.total);  // distinct and exact (the model has fewer than 2^24 elements)
        for (size_t i = 0; i < model.total; i++) values[i] = kind_of[i] < 0 ? 0.0f : (float)(i + 1);

        for (int tp : {1, 2})
            for (int ep : config.moe() ? std::vector<int>{1, 2} : std::vector<int>{1})
                for (int shards : {1, 3})
                    for (const auto& [schedule, p, V] :
                         {std::tuple{PipelineSchedule::OneFOneB, 1, 1}, std::tuple{PipelineSchedule::OneFOneB, 2, 1},
                          std::tuple{PipelineSchedule::OneFOneB, 4, 1}, std::tuple{PipelineSchedule::Interleaved, 2, 2},
                          std::tuple{PipelineSchedule::ZeroBubbleV, 2, 2}}) {
                        std::string wrong;
                        std::vector<int> reads(model.total, 0);        // over all ranks: the runs reading each element
                        std::vector<float> assembled(model.total, 0);  // over all ranks: the round trips
                        for (int pp_rank = 0; pp_rank < p && wrong.empty(); pp_rank++)
                            for (int tp_rank = 0; tp_rank < tp && wrong.empty(); tp_rank++)
                                for (int ep_rank = 0; ep_rank < ep && wrong.empty(); ep_rank++) {
                                    const std::vector<char> held = pipeline_held_chunks(
                                        schedule, pp_rank, p, V, std::vector<int>(p * V, L / (p * V)), true);
                                    const ParameterLayout part(config, shards, tp, tp_rank, held, ep, ep_rank);
                                    wrong = check_rank_layout(model, values, part, reads, assembled);
                                    if (!wrong.empty())
                                        wrong = "pp rank " + std::to_string(pp_rank) + " tp rank " +
                                                std::to_string(tp_rank) + " ep rank " + std::to_string(ep_rank) +
                                                ": " + wrong;
                                }
                        // every parameter read by one pp rank (the embeddings by two when the first and the last
                        // stage are on different ranks), by every tp rank when tp replicates the tensor and by
                        // every ep rank unless ep splits it (the experts); padding never
                        const bool two_embeddings = pipeline_stage_rank(schedule, p * V - 1, p) != 0;
                        for (size_t i = 0; i < model.total && wrong.empty(); i++) {
                            const int kind = kind_of[i];
                            const int want = kind < 0 ? 0
                                                      : (chunk_of[i] == 0 && two_embeddings ? 2 : 1) *
                                                            (tensor_is_replicated(kind) ? tp : 1) *
                                                            (tensor_is_expert(kind) ? 1 : ep);
                            if (reads[i] != want)
                                wrong = "model element " + std::to_string(i) + " (" +
                                        (kind >= 0 ? tensor_kind_info(kind).name : "padding") + ") read " +
                                        std::to_string(reads[i]) + " times, expected " + std::to_string(want);
                            else if (assembled[i] != values[i])
                                wrong = "model element " + std::to_string(i) + " missing from the ranks' round trips";
                        }
                        char name[160];
                        snprintf(name, sizeof(name), "%s, tp %d, ep %d, shards %d, %s pp %d x V %d: sizes, chunks, "
                                 "runs, round trips", config.moe() ? "experts every 2nd block" : "dense", tp, ep,
                                 shards, pipeline_schedule_name(schedule), p, V);
                        check_true(name, wrong.empty(), wrong);
                    }
    }
    expect_failure("a layout given the wrong number of chunk flags",
                   [&] { ParameterLayout(dense, 1, 1, 0, std::vector<char>(L + 1, 1)); },
                   "a parameter layout of 6 chunks given 5 flags");
}

int run(int, char**) {
    test_matmul_alignment();
    test_held_layouts();
    return lab_closing_line();
}
}  // namespace test_parameter_layout
