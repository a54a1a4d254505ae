/*
Kernel lab: matmul forward and backward (cuBLASLt on the GPU, OpenBLAS on the CPU) and the hand-written
bias-gradient kernel, against plain double-precision loops.

The bias-gradient kernel takes any OC: rows whose length is a multiple of x128::size are read with 128-bit
loads, other widths (OC = 50 below) element by element; both paths are checked.

Operands need not be 256-byte aligned (weights sit at offsets inside the parameter buffer): the products
are checked again with every operand 2 (4 in FP32), 16, 32, 128 and 256 bytes past a 256-byte boundary,
and the plan cache (llmc/kernels/matmul.cuh, "Plans") must hit on a repeated shape and alignment, build a new plan
when only an alignment differs, and hand cuBLASLt the alignments of the right operands.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/matmul.cuh"

// ----------------------------------------------------------------------------
// references, accumulating in double; loops ordered so the innermost one runs along contiguous memory

// out[n][o] = bias[o] + sum_c inp[n][c] * weight[o][c]   (without bias here; the caller adds it)
static std::vector<double> matmul_lab_forward_reference(const std::vector<float>& inp, const std::vector<float>& weight,
                                                        int N, int C, int OC) {
    std::vector<double> out((size_t)N * OC);
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            const float* x = &inp[(size_t)n * C];
            const float* w = &weight[(size_t)o * C];
            double sum = 0.0;
            for (int c = 0; c < C; c++) sum += (double)x[c] * (double)w[c];
            out[(size_t)n * OC + o] = sum;
        }
    }
    return out;
}

// dinp[n][c] = sum_o dout[n][o] * weight[o][c]
static std::vector<double> matmul_lab_dinp_reference(const std::vector<float>& dout, const std::vector<float>& weight,
                                                     int N, int C, int OC) {
    std::vector<double> dinp((size_t)N * C, 0.0);
    for (int n = 0; n < N; n++) {
        double* row = &dinp[(size_t)n * C];
        for (int o = 0; o < OC; o++) {
            const double g = dout[(size_t)n * OC + o];
            const float* w = &weight[(size_t)o * C];
            for (int c = 0; c < C; c++) row[c] += g * (double)w[c];
        }
    }
    return dinp;
}

// dweight[o][c] = start[o][c] + sum_n dout[n][o] * inp[n][c]
static std::vector<double> matmul_lab_dweight_reference(const std::vector<float>& start, const std::vector<float>& dout,
                                                        const std::vector<float>& inp, int N, int C, int OC) {
    std::vector<double> dweight = to_double(start);
    for (int o = 0; o < OC; o++) {
        double* row = &dweight[(size_t)o * C];
        for (int n = 0; n < N; n++) {
            const double g = dout[(size_t)n * OC + o];
            const float* x = &inp[(size_t)n * C];
            for (int c = 0; c < C; c++) row[c] += g * (double)x[c];
        }
    }
    return dweight;
}

// dbias[o] = start[o] + sum_n dout[n][o]
static std::vector<double> matmul_lab_dbias_reference(const std::vector<float>& start, const std::vector<float>& dout,
                                                      int N, int OC) {
    std::vector<double> dbias = to_double(start);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(size_t)n * OC + o];
    return dbias;
}

// ----------------------------------------------------------------------------
// tolerances

/*
All inputs here are uniform in [-1, 1]: mean square 1/3, so a product of two has root mean square 1/3 and
a single value 1/sqrt(3). A sum of K such terms, and each of its partial sums, is then about
sqrt(K) * term_rms in size.

FP32 accumulation (both precisions accumulate in fp32): each of the K additions rounds with a relative
error of at most 2^-24 of the partial sum. The roundings have random signs and add up like a random walk,
to about 2^-24 * sqrt(K) * (sqrt(K) * term_rms) on a typical output: one sqrt(K) from the number of
roundings, one from the size of what is rounded, so the tolerance grows like K. The worst of 10^5..10^6
outputs is a few times the typical one (the largest outputs have the largest partial sums, and the walk
has a tail): OpenBLAS and a plain sequential fma loop both reach 3.6 times it at K = 64; we allow 16 times.
Blocked or split sums, as BLAS libraries compute them, only shorten the walk. (The textbook worst-case
bound, K * 2^-24 * sum|terms|, grows like K^2 and would be far too loose at K = 2304.)
*/
static double matmul_lab_fp32_sum_error(int K, double term_rms) {
    return 16.0 * std::ldexp(1.0, -24) * std::sqrt((double)K) * (std::sqrt((double)K) * term_rms);
}

// atol for a sum of K terms of the given rms
static double matmul_lab_atol(int K, double term_rms) {
    // FP32: the accumulation error above.
    // BF16: products of bf16 values are exact in fp32 and summed in fp32 (same error as above), then the
    // result is rounded to bf16 once (covered by rtol). cuBLASLt may split K into parts and combine the
    // parts in the output type, so allow one more bf16 rounding (2^-8 relative) of a typical-size sum.
    const double fp32_error = matmul_lab_fp32_sum_error(K, term_rms);
    return by_precision(fp32_error, fp32_error + std::ldexp(1.0, -8) * std::sqrt((double)K) * term_rms);
}

// rtol: twice the unit roundoff of floatX, for the one rounding of the result and the rounding of the
// starting value's addition when accumulating. Rounding to nearest is off by at most half a unit in the
// last place: 2^-24 relative for fp32 (24 significant bits), 2^-8 for bf16 (8 significant bits: 7 stored
// and the implicit leading one; a value just above a power of two really is off by that much).
static double matmul_lab_rtol() { return by_precision(std::ldexp(1.0, -23), std::ldexp(1.0, -7)); }

// ----------------------------------------------------------------------------
// floatX operands that start `offset_bytes` past a 256-byte boundary (cudaMalloc's alignment)

struct OffsetBuffer {
    DeviceBuffer<floatX> storage;
    floatX* ptr;
    size_t count;
    OffsetBuffer(size_t n, int offset_bytes)
        : storage(n + MATMUL_MAX_ALIGNMENT / sizeof(floatX)), ptr(storage.ptr + offset_bytes / sizeof(floatX)),
          count(n) {}
    void upload(const std::vector<float>& values) {
        std::vector<floatX> converted(values.begin(), values.end());
        cudaCheck(cudaMemcpy(ptr, converted.data(), count * sizeof(floatX), cudaMemcpyHostToDevice));
    }
    std::vector<float> download() const {
        std::vector<floatX> raw(count);
        cudaCheck(cudaMemcpy(raw.data(), ptr, count * sizeof(floatX), cudaMemcpyDeviceToHost));
        return std::vector<float>(raw.begin(), raw.end());
    }
    void poison() { cudaCheck(cudaMemset(ptr, 0xff, count * sizeof(floatX))); }
};

// ----------------------------------------------------------------------------
// one shape: forward and backward, without and with bias, on the same inputs, every operand offset_bytes
// past a 256-byte boundary

static void matmul_lab_check_shape(int N, int C, int OC, int offset_bytes = 0) {
    const double product_rms = 1.0 / 3.0, value_rms = 1.0 / std::sqrt(3.0);
    const std::vector<float> inp = round_to_floatX(random_floats((size_t)N * C));
    const std::vector<float> weight = round_to_floatX(random_floats((size_t)OC * C));
    const std::vector<float> bias = round_to_floatX(random_floats(OC));
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * OC));
    // non-zero starting gradients, so that "accumulates" and "overwrites" are both checked
    const std::vector<float> dweight_start = round_to_floatX(random_floats((size_t)OC * C));
    const std::vector<float> dbias_start = round_to_floatX(random_floats(OC));

    const std::vector<double> out_reference_no_bias = matmul_lab_forward_reference(inp, weight, N, C, OC);
    std::vector<double> out_reference_bias = out_reference_no_bias;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out_reference_bias[(size_t)n * OC + o] += bias[o];
    const std::vector<double> dinp_reference = matmul_lab_dinp_reference(dout, weight, N, C, OC);
    const std::vector<double> dweight_reference = matmul_lab_dweight_reference(dweight_start, dout, inp, N, C, OC);
    const std::vector<double> dbias_reference = matmul_lab_dbias_reference(dbias_start, dout, N, OC);

    const int o = offset_bytes;
    OffsetBuffer d_inp((size_t)N * C, o), d_weight((size_t)OC * C, o), d_bias(OC, o), d_out((size_t)N * OC, o);
    OffsetBuffer d_dout((size_t)N * OC, o), d_dinp((size_t)N * C, o), d_dweight((size_t)OC * C, o), d_dbias(OC, o);
    if (offset_bytes != 0)  // the offsets really give the alignment they are meant to
        check_true("matmul operands " + std::to_string(offset_bytes) + "-byte aligned",
                   address_alignment((uintptr_t)d_weight.ptr) == offset_bytes &&
                   address_alignment((uintptr_t)d_dweight.ptr) == offset_bytes);
    DeviceBuffer<float> d_scratch(matmul_backward_scratch_floats(N, OC));
    d_inp.upload(inp);
    d_weight.upload(weight);
    d_bias.upload(bias);
    d_dout.upload(dout);
    const cudaStream_t stream = 0;

    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        char shape[96];
        snprintf(shape, sizeof(shape), "N=%d C=%d OC=%d%s%s", N, C, OC, with_bias ? " bias" : "",
                 offset_bytes ? (" at +" + std::to_string(offset_bytes) + "B").c_str() : "");
        const std::string name = shape;

        d_out.poison();
        d_dinp.poison();
        d_scratch.poison();
        d_dweight.upload(dweight_start);
        d_dbias.upload(dbias_start);
        matmul_forward(d_out.ptr, d_inp.ptr, d_weight.ptr, with_bias ? d_bias.ptr : nullptr, N, C, OC, stream);
        matmul_backward(d_dinp.ptr, d_dweight.ptr, with_bias ? d_dbias.ptr : nullptr, d_scratch.ptr, d_dout.ptr,
                        d_inp.ptr, d_weight.ptr, N, C, OC, stream);
        cudaCheck(cudaDeviceSynchronize());

        // a bias adds a value of rms 1/sqrt(3) to sums that are larger; rtol covers its rounding
        check_close("matmul_forward out " + name, d_out.download(),
                    with_bias ? out_reference_bias : out_reference_no_bias, matmul_lab_atol(C, product_rms),
                    matmul_lab_rtol());
        check_close("matmul_backward dinp " + name, d_dinp.download(), dinp_reference, matmul_lab_atol(OC, product_rms),
                    matmul_lab_rtol());
        check_close("matmul_backward dweight (+=) " + name, d_dweight.download(), dweight_reference,
                    matmul_lab_atol(N, product_rms), matmul_lab_rtol());
        const std::vector<float> dbias_got = d_dbias.download();
        if (!with_bias) {
            // no bias: the bias gradient must be left alone
            check_true("matmul_backward dbias untouched " + name, dbias_got == round_to_floatX(dbias_start));
            continue;
        }
        check_close("matmul_backward dbias (+=) " + name, dbias_got, dbias_reference, matmul_lab_atol(N, value_rms),
                    matmul_lab_rtol());

        // deterministic: the bias gradient alone, again from the same start, gives the same bits
        d_scratch.poison();
        d_dbias.upload(dbias_start);
        matmul_bias_backward(d_dbias.ptr, d_scratch.ptr, d_dout.ptr, N, OC, stream);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> dbias_again = d_dbias.download();
        check_true("matmul_backward dbias deterministic " + name,
                   memcmp(dbias_got.data(), dbias_again.data(), dbias_got.size() * sizeof(float)) == 0);
    }
}

// ----------------------------------------------------------------------------
// the plans: alignment, the key's operand order, the cache, the trace

static void matmul_lab_alignment_table() {
    const struct { uintptr_t address; int alignment; } table[] = {
        {0x7f0000001000, 256}, {0x7f0000001001, 1}, {0x7f0000001002, 2}, {0x7f0000001004, 4},
        {0x7f0000001008, 8},   {0x7f0000001010, 16}, {0x7f0000001030, 16}, {0x7f0000001020, 32},
        {0x7f0000001040, 64},  {0x7f00000010c0, 64}, {0x7f0000001080, 128}, {0x7f0000001100, 256},
        {0x7f0000010000, 256}, {0xfffffffffffffffe, 2}, {0, 256},
    };
    std::string first_wrong;
    for (const auto& row : table) {
        const int got = address_alignment(row.address);
        if (got != row.alignment && first_wrong.empty()) {
            char text[96];
            snprintf(text, sizeof(text), "0x%llx: got %d, expected %d", (unsigned long long)row.address, got,
                     row.alignment);
            first_wrong = text;
        }
    }
    check_true("address_alignment on a table of addresses", first_wrong.empty(), first_wrong);

    // cudaMalloc's 256 bytes, on the CPU device too
    DeviceBuffer<floatX> buffer(3);
    check_true("cudaMalloc is 256-byte aligned", address_alignment((uintptr_t)buffer.ptr) == 256);

    // workspace per architecture: 4 MiB before Hopper, 32 MiB from Hopper on
    check_true("workspace: 4 MiB on sm_80, 32 MiB on sm_90 and sm_100",
               matmul_workspace_bytes(8) == (4u << 20) && matmul_workspace_bytes(9) == (32u << 20) &&
               matmul_workspace_bytes(10) == (32u << 20));
}

// Runs fn() with stderr going to a temporary file; returns what was written.
static std::string capture_stderr(const std::function<void()>& fn) {
    fflush(stderr);
    FILE* file = tmpfile();
    if (file == nullptr) return "tmpfile failed";
    const int saved = dup(2);
    dup2(fileno(file), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string text;
    rewind(file);
    char chunk[512];
    size_t got;
    while ((got = fread(chunk, 1, sizeof(chunk), file)) > 0) text.append(chunk, got);
    fclose(file);
    return text;
}

static void matmul_lab_plan_cache() {
    const int N = 48, C = 64, OC = 96;
    // every operand 256-byte aligned, and the weight 16 bytes past a boundary
    OffsetBuffer inp((size_t)N * C, 0), weight((size_t)OC * C, 0), shifted_weight((size_t)OC * C, 16);
    OffsetBuffer bias(OC, 0), out((size_t)N * OC, 0), dweight((size_t)OC * C, 32), dout((size_t)N * OC, 0);
    inp.upload(random_floats(inp.count));
    weight.upload(random_floats(weight.count));
    shifted_weight.upload(random_floats(shifted_weight.count));
    bias.upload(random_floats(bias.count));
    const cudaStream_t stream = 0;  // (dout and dweight only give keys)

    // The forward pass's key names the weight as b and the input as a; cuBLASLt's A is our b.
    const MatmulPlanKey forward_key = matmul_plan_key(out.ptr, inp.ptr, shifted_weight.ptr, bias.ptr, N, OC, C, false,
                                                      true, false);
    const CublasAlignments forward = matmul_cublas_alignments(forward_key);
    check_true("forward: cuBLAS A is the weight (16), B the input (256)", forward.A == 16 && forward.B == 256 &&
                                                                              forward.C == 256 && forward.D == 256);
    // The weight gradient's key: D is dweight (32 bytes), A is the input (cuBLAS's A, our b)
    const MatmulPlanKey dweight_key = matmul_plan_key(dweight.ptr, dout.ptr, inp.ptr, nullptr, OC, C, N, true, false,
                                                      true);
    const CublasAlignments backward = matmul_cublas_alignments(dweight_key);
    check_true("dweight: cuBLAS C and D are dweight (32)",
               backward.C == 32 && backward.D == 32 && backward.A == 256 && dweight_key.bias_alignment == 0 &&
                   dweight_key.accumulate);

    matmul_teardown();  // an empty cache
    matmul_setup();
    setenv("LLMC_MATMUL_TRACE", "1", 1);
    long built[5], hits[5];
    const std::string trace = capture_stderr([&] {
        matmul_forward(out.ptr, inp.ptr, weight.ptr, bias.ptr, N, C, OC, stream);          // new
        built[0] = matmul_context.plans_built, hits[0] = matmul_context.cache_hits;
        matmul_forward(out.ptr, inp.ptr, weight.ptr, bias.ptr, N, C, OC, stream);          // the same key
        built[1] = matmul_context.plans_built, hits[1] = matmul_context.cache_hits;
        matmul_forward(out.ptr, inp.ptr, shifted_weight.ptr, bias.ptr, N, C, OC, stream);  // only the alignment differs
        built[2] = matmul_context.plans_built, hits[2] = matmul_context.cache_hits;
        matmul_forward(out.ptr, inp.ptr, shifted_weight.ptr, bias.ptr, N, C, OC, stream);  // that one again
        built[3] = matmul_context.plans_built, hits[3] = matmul_context.cache_hits;
        matmul_forward(out.ptr, inp.ptr, weight.ptr, nullptr, N, C, OC, stream);           // no bias: another plan
        built[4] = matmul_context.plans_built, hits[4] = matmul_context.cache_hits;
    });
    unsetenv("LLMC_MATMUL_TRACE");
    cudaCheck(cudaDeviceSynchronize());
    char counts[160];
    snprintf(counts, sizeof(counts), "plans built %ld %ld %ld %ld %ld, hits %ld %ld %ld %ld %ld", built[0], built[1],
             built[2], built[3], built[4], hits[0], hits[1], hits[2], hits[3], hits[4]);
    check_true("cache: first call builds a plan", built[0] == 1 && hits[0] == 0, counts);
    check_true("cache: the same shape and alignment hits", built[1] == 1 && hits[1] == 1, counts);
    check_true("cache: another alignment builds a plan", built[2] == 2 && hits[2] == 1, counts);
    check_true("cache: ... which then hits", built[3] == 2 && hits[3] == 2, counts);
    check_true("cache: no bias builds a plan", built[4] == 3 && hits[4] == 2, counts);
    check_true("cache holds three plans", matmul_context.plans.size() == 3);

    // the trace: one line per new plan, with the alignments cuBLASLt is told
    int lines = 0;
    for (char ch : trace) lines += ch == '\n';
    check_true("trace: one line per new plan (3)", lines == 3, std::to_string(lines) + " lines");
    check_true("trace names the 16-byte weight as cuBLAS's A",
               trace.find("alignment A/B/C/D=16/256/256/256 bias=256") != std::string::npos);
    printf("  trace:\n");
    for (size_t start = 0, end; (end = trace.find('\n', start)) != std::string::npos; start = end + 1)
        printf("    %s\n", trace.substr(start, end - start).c_str());

    matmul_teardown();
    check_true("teardown empties the cache", matmul_context.plans.empty() && matmul_context.plans_built == 0 &&
                                                 matmul_context.cache_hits == 0);
    matmul_setup();
}

// ----------------------------------------------------------------------------
// benchmarks at GPT-2 124M shapes: the qkv (OC = 3C) and fc (OC = 4C) layers

static void matmul_lab_bench(int OC) {
#ifdef LLMC_CPU
    const int N = 256;  // the CPU is slow: B*T = 256 instead of 8192
#else
    const int N = 8 * 1024;
#endif
    const int C = 768;
    char shape[96];
    snprintf(shape, sizeof(shape), "N=%d C=%d OC=%d", N, C, OC);
    const std::string name = shape;

    DeviceBuffer<floatX> inp((size_t)N * C), weight((size_t)OC * C), bias(OC), out((size_t)N * OC);
    DeviceBuffer<floatX> dout((size_t)N * OC), dinp((size_t)N * C), dweight((size_t)OC * C), dbias(OC);
    DeviceBuffer<float> scratch(matmul_backward_scratch_floats(N, OC));
    inp.upload(random_floats(inp.count));
    weight.upload(random_floats(weight.count));
    bias.upload(random_floats(bias.count));
    dout.upload(random_floats(dout.count));
    dweight.zero();
    dbias.zero();
    const cudaStream_t stream = 0;
    const double x = sizeof(floatX);
    const double flops = 2.0 * N * C * OC;  // one product

    double ms = time_ms([&] { matmul_forward(out.ptr, inp.ptr, weight.ptr, bias.ptr, N, C, OC, stream); });
    report_bench("matmul_forward " + name, ms, x * ((double)N * C + (double)OC * C + OC + (double)N * OC), flops);

    ms = time_ms([&] {
        matmul_backward(dinp.ptr, dweight.ptr, dbias.ptr, scratch.ptr, dout.ptr, inp.ptr, weight.ptr, N, C, OC, stream);
    });
    // dinp reads dout and weight and writes dinp; dweight reads dout and inp and updates dweight; dbias
    // reads dout once more and writes and reads the partials
    report_bench("matmul_backward " + name, ms,
                 x * (3.0 * N * OC + 3.0 * OC * C + 2.0 * N * C) + 4.0 * scratch.count * 2, 2 * flops);

    ms = time_ms([&] { matmul_bias_backward(dbias.ptr, scratch.ptr, dout.ptr, N, OC, stream); });
    // reads dout once, writes and reads the partials once, reads and writes dbias
    report_bench("matmul_bias_backward " + name, ms, x * ((double)N * OC + 2.0 * OC) + 4.0 * scratch.count * 2, 0);
}

// ----------------------------------------------------------------------------
// add_column_partials (llmc/cuda_common.cuh), which finishes every bias and layernorm weight gradient: its
// grouping of the partial rows, with row counts that leave the last group short, fill it, or give
// groups of one row. The fixed order is spelled out here on the host, in fp32, so the result must match
// to the bit (and stay within the usual distance of the double sum).

static void matmul_lab_check_column_partials(int num_partials, int columns) {
    char shape[96];
    snprintf(shape, sizeof(shape), "partials=%d columns=%d", num_partials, columns);
    const std::string name = shape;
    const std::vector<float> partials = random_floats((size_t)num_partials * columns);
    const std::vector<float> start = round_to_floatX(random_floats(columns));

    const int rows_per_group = column_partials_rows_per_group(num_partials);
    std::vector<float> expected(columns);
    std::vector<double> reference(columns);
    for (int c = 0; c < columns; c++) {
        float sum = 0.0f;
        double exact = start[c];
        for (int first = 0; first < num_partials; first += rows_per_group) {
            float group = 0.0f;
            for (int p = first; p < std::min(first + rows_per_group, num_partials); p++) {
                group += partials[(size_t)p * columns + c];
                exact += partials[(size_t)p * columns + c];
            }
            sum += group;
        }
        expected[c] = (float)(floatX)(start[c] + sum);
        reference[c] = exact;
    }

    DeviceBuffer<float> d_partials(partials.size());
    DeviceBuffer<floatX> d_target(columns);
    std::vector<float> runs[2];
    for (std::vector<float>& got : runs) {
        d_partials.upload(partials);
        d_target.upload(start);
        add_column_partials(d_target.ptr, d_partials.ptr, num_partials, columns, 0);
        cudaCheck(cudaDeviceSynchronize());
        got = d_target.download();
    }
    // fp32 sums of up to 1000 values in [-1, 1]: error ~ sqrt(1000) * 2^-24 * 30, far below 1e-4;
    // rtol: the final rounding to floatX
    check_close("add_column_partials " + name, runs[0], reference, 1e-4, matmul_lab_rtol());
    check_true("add_column_partials in its fixed order " + name, runs[0] == expected && runs[1] == expected,
               "two runs, each equal to the host's fp32 sums group by group");
}

// ----------------------------------------------------------------------------

void lab_matmul() {
    if (!family_selected("matmul")) return;

    // small and odd: rows fewer than one bias-gradient chunk, OC not a multiple of the 256-column block
    matmul_lab_check_shape(37, 64, 96);
    // OC = 50: not a multiple of x128::size, the bias gradient's element-by-element path; N = 300: several
    // row chunks, the last one partial
    matmul_lab_check_shape(300, 40, 50);
    // GPT-2 widths: the qkv layer (OC = 3C), and the attention projection (OC = C) over two row chunks
    matmul_lab_check_shape(64, 768, 2304);
    matmul_lab_check_shape(128, 768, 768);
    // operands off the 256-byte boundary by as little as one element (2 bytes in BF16, 4 in FP32)
    for (int offset : {(int)sizeof(floatX), 16, 32, 128, 256}) matmul_lab_check_shape(40, 96, 160, offset);

    matmul_lab_alignment_table();
    matmul_lab_plan_cache();

    // 1 row; fewer rows than groups; 33 and 396 (GPT-2 124M's layernorm at 132 SMs): a short last group;
    // 256 (124M's bias gradient at B=16, T=1024): 32 full groups
    for (int num_partials : {1, 5, 33, 256, 396})
        for (int columns : {50, 768}) matmul_lab_check_column_partials(num_partials, columns);

    if (lab.bench) {
        matmul_lab_bench(3072);
        matmul_lab_bench(2304);
    }
}
