/*
The per-layer activations against Korthikanti et al. 2022, Table 2: korthikanti_table2 sets the count of
llmc/planning/activation_memory.h beside the paper's (for a Llama shape, beside that table adapted to Llama's
block), corrected term by term for these kernels, and print_korthikanti_table2 shows the two side by side
(--plan prints it).

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), count the bytes
one transformer layer keeps for the backward pass in 2-byte (fp16) numbers, with s the sequence length, b
the micro-batch, h the hidden size, a the heads and t the tensor-parallel ranks. Their Table 2:
    no parallelism                          sbh (34 + 5as/h)
    tensor parallel                         sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel              sbh/t (34 + 5as/h)
    tensor parallel + selective             sbh (10 + 24/t)
    tensor + sequence parallel + selective  sbh/t 34
    full recomputation                      2 sbh
Their 34 sbh + 5 a s^2 b, term by term, and the buffer of BlockActivations (llmc/model/gpt2.cuh) that holds the
same thing here (N = b s rows, C = h, R = N rows or N/t under sequence parallelism):
    attention  QKV input 2sbh                         ln1 (R, C)          replicated over tp (their 10)
               Q, K (4sbh) + V (2sbh)                 qkv (N, 3C/t)       split over tp (their 24)
               softmax output 2as^2b, its dropout     -- flash attention keeps none of the s x s matrices,
               mask as^2b, the dropout output 2as^2b     only the fp32 log-sum-exp lse, 4asb/t
               output projection input 2sbh           atty (N, C/t)       split
               dropout mask after the projection sbh  -- no dropout here (replicated in their 10)
    MLP        fc input 2sbh                          ln2 (R, C)          replicated
               GELU input 8sbh                        fch (N, 4C/t)       split
               fc projection input 8sbh               fch_gelu (N, 4C/t)  split
               dropout mask after the projection sbh  -- no dropout here (replicated)
    layernorms their inputs 4sbh                      residual2 (ln2's input) and output (the next layer's
                                                      ln1 input), (R, C) each; replicated
               (statistics: not in their count)       ln1 and ln2 mean and rstd, fp32: 16sb (R rows)
Under sequence parallelism their replicated 10 sbh become 10 sbh/t, as our R = N/t rows do. So the value
for our kernels is theirs with three corrections (flash attention's in two parts), each a named term of
Table2Value:
    dropout_masks         - 2 sbh (- 2sbh/t under sequence parallelism): the two masks
    attention_matrix      - 5 as^2b/t: the softmax output, its mask and the dropout output
    log_sum_exp           + 4 asb/t: what flash attention keeps instead (fp32, one per row and head)
    layernorm_statistics  + 16 sb (+ 16 sb/t under sequence parallelism): fp32 mean and rstd of both
Their "selective" recomputes exactly the attention core (the 5 as^2b), which flash attention never stores,
so both selective rows, corrected, are our recompute none (for them attention_matrix is zero). Our
selective goes further and drops ln1, ln2 and fch_gelu (QKV input, fc input, fc projection input): that is
the selective_outputs term of our own two rows, which start from their selective rows. Their full row
keeps the layer's input, 2 sbh, as our full does with --recompute-every 1 (nothing to correct).

Llama's block, counted their way. The same buffers hold the Llama block's activations at other widths
(k = h kv_heads / a the channels of K and of V each, f = ffn_hidden the MLP's hidden units), and the block
has no dropout, so the adapted count, term by term, is:
    attention  QKV input 2sbh                          ln1 (R, C)            replicated
               Q 2sbh, K and V 2sbk each: 2sb(h + 2k)  qkv (N, (h + 2k)/t)   split
               softmax output 2as^2b, which is also    -- not stored (flash attention: lse 4asb/t)
               the input of attention over V
               output projection input 2sbh            atty (N, C/t)         split
    MLP        fc input 2sbh                           ln2 (R, C)            replicated
               gate and up outputs 2 x 2sbf            fch (N, 2f/t)         split (SiLU's input and the
                                                                             other factor of the product)
               their product, the down projection's    fch_gelu (N, f/t)     split
               input 2sbf
    RMSNorms   their inputs 4sbh                       residual2, output     replicated
               (statistics: not in their count)        rstd only, fp32: 8sb
that is 8sbh replicated (GPT-2's 10 less the two dropout masks) and sb(4h + 4k + 6f) split (GPT-2's 24 sbh),
plus the attention matrix 2as^2b (GPT-2's 5as^2b less the mask and the dropout output):
    no parallelism                          sb (12h + 4k + 6f) + 2as^2b
    tensor parallel                         8sbh + sb (4h + 4k + 6f)/t + 2as^2b/t
    tensor + sequence parallel              sb/t (12h + 4k + 6f + 2as)
    tensor parallel + selective             8sbh + sb (4h + 4k + 6f)/t
    tensor + sequence parallel + selective  sb/t (12h + 4k + 6f)
    full recomputation                      2 sbh
The corrections are GPT-2's with Llama's terms: no dropout masks to take away; attention_matrix - 2as^2b/t;
log_sum_exp + 4asb/t (a query heads: every one of them scores the keys); layernorm_statistics + 8sb (+ 8sb/t
under sequence parallelism), the rstd of both RMSNorms; our selective's outputs - 4sbh (ln1, ln2; /t under
sequence parallelism) - 2sbf/t (the product). With k = h and f = 4h, 2sbf/t is GPT-2's 8sbh/t, and the
other terms are GPT-2's less what the block lacks.
*/
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "../device_memory.h"
#include "../parallel/recompute.h"
#include "activation_memory.h"

enum class Table2Row {
    NoParallelism,
    TensorParallel,
    TensorSequenceParallel,
    TensorParallelSelective,
    TensorSequenceParallelSelective,
    FullRecompute,
    OursSelective,                  // not in Table 2: our selective (ln1, ln2, fch_gelu dropped too)
    OursSelectiveSequenceParallel,  // the same under sequence parallelism
};
constexpr int kNumTable2Rows = 8;

struct Table2Value {
    const char* name = "";               // "tensor + sequence parallel"
    const char* formula = "";            // Table 2's formula (Llama: adapted); our rows: the row they start from
    const char* corrected_formula = "";  // the formula after the corrections
    bool in_table = true;                // false: one of our rows
    double table = 0;                    // Table 2's bytes per layer (our rows: the row they start from)
    // the corrections for this program's kernels, bytes (negative: stored there, not here)
    double dropout_masks = 0, attention_matrix = 0, log_sum_exp = 0, layernorm_statistics = 0;
    double selective_outputs = 0;        // our rows: - (ln1 + ln2 + fch_gelu)
    double corrected = 0;                // table + every correction
    GPT2MemoryShape ours;                // the run of this program the row describes (tp, sequence
                                         // parallelism, recompute policy): gpt2_activation_bytes(ours, true)'s
                                         // per_layer equals corrected
};

// The row's value for the shape's s = seq_len, b = batch, h = channels, a = num_heads, t = tp (t = 1 for the
// no-parallelism row), and for a Llama shape k = kv_heads h / a and f = ffn_hidden, in 2-byte activations
// whatever the build: GPT-2's Table 2, or its adaptation to Llama's block (above). Each product is formed
// before it is divided by t, so with h, a, k and f multiples of t (and s b too under sequence parallelism),
// as a tp layout needs, every value is a whole number and exact in a double.
inline Table2Value korthikanti_table2(Table2Row row, const GPT2MemoryShape& shape) {
    const double s = shape.seq_len, b = shape.batch, h = shape.channels, a = shape.num_heads;
    const bool llama = shape.llama;
    const double k = (shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads) * (h / a);
    const double f = shape.ffn_hidden > 0 ? shape.ffn_hidden : 4 * h;
    const double t = row == Table2Row::NoParallelism ? 1 : shape.tp;
    const double sbh = s * b * h, sbf = s * b * f;
    // what tp replicates (the inputs of the norms and of the matmuls that take the residual stream, and
    // GPT-2's dropout masks), what it splits, and the attention core's s x s matrices
    const double replicated = llama ? 8 * sbh : 10 * sbh;
    const double split = llama ? 4 * sbh + 4 * s * b * k + 6 * sbf : 24 * sbh;
    const double whole = replicated + split, attention = (llama ? 2 : 5) * a * s * s * b;
    Table2Value v;
    v.ours = shape;
    v.ours.tp = (int)t;
    v.ours.recompute = Recompute{};  // none
    bool sequence_parallel = false, selective = false;  // theirs; selective: the attention core recomputed
    switch (row) {
        case Table2Row::NoParallelism:
            v.name = "no parallelism";
            v.formula = llama ? "sb (12h + 4k + 6f) + 2as^2b" : "sbh (34 + 5as/h)";
            v.corrected_formula = llama ? "sb (12h + 4k + 6f + 8 + 4a)" : "32sbh + 16sb + 4asb";
            v.table = whole + attention;
            break;
        case Table2Row::TensorParallel:
            v.name = "tensor parallel";
            v.formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 2as^2b/t" : "sbh (10 + 24/t + 5as/(ht))";
            v.corrected_formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 8sb + 4asb/t"
                                        : "sbh (8 + 24/t) + 16sb + 4asb/t";
            v.table = replicated + split / t + attention / t;
            break;
        case Table2Row::TensorSequenceParallel:
            v.name = "tensor + sequence parallel";
            v.formula = llama ? "sb/t (12h + 4k + 6f + 2as)" : "sbh/t (34 + 5as/h)";
            v.corrected_formula = llama ? "sb/t (12h + 4k + 6f + 8 + 4a)" : "sb/t (32h + 16 + 4a)";
            v.table = (whole + attention) / t;
            sequence_parallel = true;
            break;
        case Table2Row::TensorParallelSelective:
            v.name = "tp + selective";
            v.formula = llama ? "8sbh + sb (4h + 4k + 6f)/t" : "sbh (10 + 24/t)";
            v.corrected_formula = llama ? "8sbh + sb (4h + 4k + 6f)/t + 8sb + 4asb/t"
                                        : "sbh (8 + 24/t) + 16sb + 4asb/t";
            v.table = replicated + split / t;
            selective = true;
            break;
        case Table2Row::TensorSequenceParallelSelective:
            v.name = "tp + sp + selective";
            v.formula = llama ? "sb/t (12h + 4k + 6f)" : "sbh/t 34";
            v.corrected_formula = llama ? "sb/t (12h + 4k + 6f + 8 + 4a)" : "sb/t (32h + 16 + 4a)";
            v.table = whole / t;
            sequence_parallel = selective = true;
            break;
        case Table2Row::FullRecompute:
            v.name = "full recompute";
            v.formula = "2 sbh";
            v.corrected_formula = "2 sbh";
            v.table = v.corrected = 2 * sbh;  // the layer's input only: nothing to correct
            v.ours.sequence_parallel = false;
            v.ours.recompute = Recompute{RecomputePolicy::Full, 1};
            return v;
        case Table2Row::OursSelective:
        case Table2Row::OursSelectiveSequenceParallel:
            sequence_parallel = row == Table2Row::OursSelectiveSequenceParallel;
            v.name = sequence_parallel ? "ours: selective + sp" : "ours: selective";
            v.formula = sequence_parallel ? "(from tp + sp + selective)" : "(from tp + selective)";
            v.corrected_formula = llama ? sequence_parallel ? "sb/t (8h + 4k + 4f + 8 + 4a)"
                                                            : "4sbh + sb (4h + 4k + 4f)/t + 8sb + 4asb/t"
                                        : sequence_parallel ? "sb/t (20h + 16 + 4a)" : "sbh (4 + 16/t) + 16sb + 4asb/t";
            v.in_table = false;
            v.table = sequence_parallel ? whole / t : replicated + split / t;
            selective = true;
            // ln1 (QKV input) and ln2 (fc input), 2sbh each, replicated or split by sequence parallelism;
            // fch_gelu (fc projection input: GELU's output, or SwiGLU's product) 2sbf/t, GPT-2's 8sbh/t
            v.selective_outputs = -((sequence_parallel ? 4 * sbh / t : 4 * sbh) + 2 * sbf / t);
            v.ours.recompute = Recompute{RecomputePolicy::Selective, 1};
            break;
    }
    v.ours.sequence_parallel = sequence_parallel;
    v.dropout_masks = llama ? 0 : sequence_parallel ? -2 * sbh / t : -2 * sbh;
    v.attention_matrix = selective ? 0 : -attention / t;
    v.log_sum_exp = 4 * a * s * b / t;
    const double statistics = (llama ? 8 : 16) * s * b;  // fp32: RMSNorm's rstd, or layernorm's mean and rstd
    v.layernorm_statistics = sequence_parallel ? statistics / t : statistics;
    v.corrected = v.table + v.dropout_masks + v.attention_matrix + v.log_sum_exp + v.layernorm_statistics +
                  v.selective_outputs;
    return v;
}

// The table for one shape: each row's Table 2 value (a Llama shape: the adapted count), the corrected value and
// gpt2_activation_bytes' per_layer for the run the row describes, all in 2-byte activations as the paper
// counts (bf16_build false adds what the FP32 build's sizes are). Of our two rows, the one matching
// shape.sequence_parallel is printed.
inline void print_korthikanti_table2(const GPT2MemoryShape& shape, bool bf16_build, FILE* out = stdout) {
    const bool llama = shape.llama;
    std::vector<Table2Value> rows;
    int formula_width = 27, corrected_width = 31;  // GPT-2's longest formulas, and a space
    for (int r = 0; r < kNumTable2Rows; r++) {
        const Table2Row row = (Table2Row)r;
        if ((row == Table2Row::OursSelective && shape.sequence_parallel) ||
            (row == Table2Row::OursSelectiveSequenceParallel && !shape.sequence_parallel))
            continue;
        rows.push_back(korthikanti_table2(row, shape));
        formula_width = std::max(formula_width, (int)strlen(rows.back().formula) + 1);
        corrected_width = std::max(corrected_width, (int)strlen(rows.back().corrected_formula) + 1);
    }
    char widths[64] = "";  // a Llama shape's k and f
    if (llama)
        snprintf(widths, sizeof(widths), " k=%d f=%d",
                 (shape.kv_heads > 0 ? shape.kv_heads : shape.num_heads) * (shape.channels / shape.num_heads),
                 shape.ffn_hidden > 0 ? shape.ffn_hidden : 4 * shape.channels);
    fprintf(out, "per-layer activations, Korthikanti et al. Table 2%s: bytes per layer and rank, 2-byte activations "
            "(s=%d b=%d h=%d a=%d%s t=%d)%s\n", llama ? " adapted to Llama's block (K/V heads, SwiGLU, RMSNorm, no "
            "dropout)" : "", shape.seq_len, shape.batch, shape.channels, shape.num_heads, widths, shape.tp,
            bf16_build ? "" : "; this FP32 build's 4-byte activations double every term but the fp32 log-sum-exp "
                              "and norm statistics");
    fprintf(out, "  %-27s %-*s %10s  %-*s %10s %13s  %s\n", "row", formula_width, llama ? "Table 2 adapted" : "Table 2",
            "bytes", corrected_width, "corrected for our kernels", "bytes", "ours", "(our run)");
    for (const Table2Value& v : rows) {
        const double ours = gpt2_activation_bytes(v.ours, true).per_layer;
        const RecomputePolicy policy = v.ours.recompute.policy;
        const std::string run = std::string(policy == RecomputePolicy::None        ? "none"
                                            : policy == RecomputePolicy::Selective ? "selective"
                                                                                   : "full, every 1") +
                                ", tp " + std::to_string(v.ours.tp) + (v.ours.sequence_parallel && v.ours.tp > 1 ? " + sp" : "");
        fprintf(out, "  %-27s %-*s %10s  %-*s %10s %s %10s  (%s)\n", v.name, formula_width, v.formula,
                v.in_table ? format_bytes(v.table).c_str() : "-", corrected_width, v.corrected_formula,
                format_bytes(v.corrected).c_str(), ours == v.corrected ? "==" : "!=", format_bytes(ours).c_str(),
                run.c_str());
    }
    if (llama)
        fprintf(out, "  corrected = adapted Table 2 - softmax output 2as^2b/t (not under selective) + fp32 log-sum-exp "
                "4asb/t + fp32 RMSNorm rstd 8sb (/t with sp)\n");
    else
        fprintf(out, "  corrected = Table 2 - dropout masks 2sbh (/t with sp) - attention matrices 5as^2b/t (not under "
                "selective) + fp32 log-sum-exp 4asb/t + fp32 layernorm mean, rstd 16sb (/t with sp)\n");
}
