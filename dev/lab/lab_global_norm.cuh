/*
Kernel lab: the deterministic squared global norm, against a double-precision sum.

Counts 1, 1000, 1234567 and 2^24 + 3 (odd: a tail after the 128-bit chunks; more elements than the grid has
threads), one unaligned array (the element-by-element path), and two arrays accumulated into one result,
as the model's gradient chunks are.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/global_norm.cuh"

static double global_norm_lab_reference(const std::vector<float>& values, size_t begin = 0) {
    double sum = 0.0;
    for (size_t i = begin; i < values.size(); i++) sum += (double)values[i] * (double)values[i];
    return sum;
}

/*
Tolerance: the square of a bf16 value is exact in fp32 (8 + 8 significant bits fit in 24); the square of
an fp32 value rounds once (2^-24). Each thread adds the squares of one 16-byte chunk in fp32 (at most 7
roundings) and the chunks into a double (negligible), then the block and the partials are added in fp32
trees and short strided loops: about 10 + 10 + 8 more roundings on the longest path. For positive terms
the relative error is at most (roundings on the longest path) * 2^-24 ~ 36 * 6e-8 = 2.1e-6. 5e-6 holds
for any count: the 2^24 + 3 case makes threads on the CPU device add ~8000 chunks each, where an fp32
running sum would be off by ~1e-3.
*/
static const double global_norm_lab_rtol = 5e-6;

static float global_norm_lab_run(DeviceBuffer<float>& out, DeviceBuffer<float>& scratch, const floatX* values,
                                 size_t count) {
    out.poison();
    scratch.poison();
    global_norm_squared(out.ptr, scratch.ptr, values, count, 0);
    cudaCheck(cudaDeviceSynchronize());
    return out.download()[0];
}

static void global_norm_lab_check(size_t count, size_t offset) {
    char shape[64];
    snprintf(shape, sizeof(shape), "count=%zu%s", count, offset ? " unaligned" : "");
    const std::string name = shape;
    const std::vector<float> values = round_to_floatX(random_floats(count + offset));
    DeviceBuffer<floatX> d_values(count + offset);
    DeviceBuffer<float> out(1), scratch(global_norm_scratch_count());
    d_values.upload(values);

    const float first = global_norm_lab_run(out, scratch, d_values.ptr + offset, count);
    check_close("global_norm_squared " + name, {first}, {global_norm_lab_reference(values, offset)}, 0.0,
                global_norm_lab_rtol);
    const float second = global_norm_lab_run(out, scratch, d_values.ptr + offset, count);
    check_true("global_norm_squared deterministic " + name, memcmp(&first, &second, sizeof(float)) == 0);
}

// the total over two arrays: the first call writes, the second adds
static void global_norm_lab_check_accumulate(size_t count_a, size_t count_b) {
    const std::vector<float> a = round_to_floatX(random_floats(count_a));
    const std::vector<float> b = round_to_floatX(random_floats(count_b, -3.0f, 3.0f));
    DeviceBuffer<floatX> d_a(count_a), d_b(count_b);
    DeviceBuffer<float> out(1), scratch(global_norm_scratch_count());
    d_a.upload(a);
    d_b.upload(b);
    out.poison();  // the first call must write, not add to NaN
    scratch.poison();
    global_norm_squared(out.ptr, scratch.ptr, d_a.ptr, count_a, 0);
    global_norm_squared_accumulate(out.ptr, scratch.ptr, d_b.ptr, count_b, 0);
    cudaCheck(cudaDeviceSynchronize());
    char name[96];
    snprintf(name, sizeof(name), "global_norm_squared accumulate count=%zu+%zu", count_a, count_b);
    check_close(name, out.download(), {global_norm_lab_reference(a) + global_norm_lab_reference(b)}, 0.0,
                global_norm_lab_rtol);
}

static void global_norm_lab_bench() {
#ifdef LLMC_CPU
    const size_t count = (size_t)1 << 24;  // the CPU is slow: 16.8M values instead of 124M
#else
    const size_t count = 124475904;  // GPT-2 124M's gradients
#endif
    DeviceBuffer<floatX> values(count);
    DeviceBuffer<float> out(1), scratch(global_norm_scratch_count());
    values.upload(random_floats(count));
    const double ms = time_ms([&] { global_norm_squared(out.ptr, scratch.ptr, values.ptr, count, 0); });
    char name[96];
    snprintf(name, sizeof(name), "global_norm_squared count=%zu", count);
    report_bench(name, ms, (double)count * sizeof(floatX), 0);
}

void lab_global_norm() {
    if (!family_selected("global_norm")) return;
    global_norm_lab_check(1, 0);
    global_norm_lab_check(1000, 0);
    global_norm_lab_check(1234567, 0);
    global_norm_lab_check(1001, 1);
    global_norm_lab_check(((size_t)1 << 24) + 3, 0);
    global_norm_lab_check_accumulate(1000, 1234567);
    if (lab.bench) global_norm_lab_bench();
}
