/*
Kernel lab: rotary position embedding (RoPE), forward and backward, on grouped-query layouts (fewer key/value
heads than query heads) and at positions far into a sequence.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/rope.cuh"

namespace rope_lab {

struct Shape {
    int B, T, first_position, q_heads, kv_heads, head_size;
    float theta;
    std::string name() const {
        return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " from " + std::to_string(first_position) +
               " heads " + std::to_string(q_heads) + "/" + std::to_string(kv_heads) + " hs=" +
               std::to_string(head_size) + " theta=" + std::to_string((int)theta);
    }
};

// The rotation in double, by `direction` times each pair's angle, the angle taken in fp32 as the definition
// says (llmc/kernels/rope.cuh): values of the value heads pass through.
inline std::vector<double> reference_rotate(const std::vector<float>& qkv, const Shape& s, double direction) {
    const int row_width = (s.q_heads + 2 * s.kv_heads) * s.head_size;
    std::vector<double> out(qkv.begin(), qkv.end());
    for (int row = 0; row < s.B * s.T; row++)
        for (int head = 0; head < s.q_heads + s.kv_heads; head++)
            for (int i = 0; i < s.head_size / 2; i++) {
                const float frequency = (float)std::pow((double)s.theta, -2.0 * i / s.head_size);
                const float angle = (float)(s.first_position + row % s.T) * frequency;
                const double c = std::cos((double)angle), sn = direction * std::sin((double)angle);
                const size_t at = (size_t)row * row_width + (size_t)head * s.head_size + 2 * i;
                out[at] = qkv[at] * c - qkv[at + 1] * sn;
                out[at + 1] = qkv[at] * sn + qkv[at + 1] * c;
            }
    return out;
}

inline void check(const Shape& s) {
    const size_t count = (size_t)s.B * s.T * (s.q_heads + 2 * s.kv_heads) * s.head_size;
    const std::vector<float> qkv = round_to_floatX(random_floats(count, -2.0f, 2.0f));
    // the table: each f_i the double pow rounded once to fp32, as the definition says, bit for bit (the
    // double pow of CUDA and of glibc agree to far below the half-ulp of fp32 that could flip the rounding)
    DeviceBuffer<float> d_frequencies(s.head_size / 2);
    rope_frequencies(d_frequencies.ptr, s.head_size, s.theta, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> frequencies = d_frequencies.download();
    bool table_exact = true;
    for (int i = 0; i < s.head_size / 2; i++)
        table_exact = table_exact && frequencies[i] == (float)std::pow((double)s.theta, -2.0 * i / s.head_size);
    check_true("rope_frequencies" + s.name(), table_exact, "same bits as the double pow rounded to fp32");
    DeviceBuffer<floatX> d_qkv(count);
    d_qkv.upload(qkv);
    rope_forward(d_qkv.ptr, s.B, s.T, s.first_position, s.q_heads, s.kv_heads, s.head_size, d_frequencies.ptr, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> rotated = d_qkv.download();
    // FP32: the kernel's sincosf of the same fp32 angle is within a few ulp of the double cosine and sine
    // (the angle reaches ~1e4 here, where the argument reduction is still exact in CUDA's and glibc's
    // sincosf), and each output is two products and a sum of values <= 2: ~1e-6 absolute.
    // BF16: the output is rounded to 8 mantissa bits, 2^-9 relative (2^-8 for margin).
    const double atol = 2e-6, rtol = by_precision(1e-5, 1.0 / 256);
    check_close("rope_forward" + s.name(), rotated, reference_rotate(qkv, s, +1.0), atol, rtol);
    // the value heads are not touched: the same bits
    const int row_width = (s.q_heads + 2 * s.kv_heads) * s.head_size, values = s.kv_heads * s.head_size;
    bool values_kept = true;
    for (int row = 0; row < s.B * s.T; row++)
        values_kept = values_kept && memcmp(&rotated[(size_t)row * row_width + row_width - values],
                                            &qkv[(size_t)row * row_width + row_width - values],
                                            values * sizeof(float)) == 0;
    check_true("rope_forward leaves the value heads" + s.name(), values_kept, "same bits");

    // the backward pass rotates a gradient back: against the reference, from an independent gradient
    const std::vector<float> dout = round_to_floatX(random_floats(count, -1.0f, 1.0f));
    d_qkv.upload(dout);
    rope_backward(d_qkv.ptr, s.B, s.T, s.first_position, s.q_heads, s.kv_heads, s.head_size, d_frequencies.ptr, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> dinp = d_qkv.download();
    check_close("rope_backward" + s.name(), dinp, reference_rotate(dout, s, -1.0), atol, rtol);
    // and it is the forward pass's transpose: <dout, rope(x)> = <rope_backward(dout), x>, in double from
    // the kernels' own outputs (FP32: both sides carry the kernels' ~1e-7 relative errors over `count` terms)
    double forward_side = 0.0, backward_side = 0.0, scale = 0.0;
    for (size_t k = 0; k < count; k++) {
        forward_side += (double)dout[k] * rotated[k];
        backward_side += (double)dinp[k] * qkv[k];
        scale += std::fabs((double)dout[k] * qkv[k]);
    }
    const double mismatch = std::fabs(forward_side - backward_side) / scale;
    check_true("rope_backward is rope_forward's transpose" + s.name(), mismatch < by_precision(1e-6, 1e-2),
               "relative mismatch " + std::to_string(mismatch));
}

}  // namespace rope_lab

void lab_rope() {
    if (!family_selected("rope")) return;
    const rope_lab::Shape shapes[] = {
        {2, 16, 0, 4, 4, 16, 10000.0f},     // multi-head attention (as many key/value heads as query heads)
        {2, 16, 0, 8, 2, 64, 500000.0f},    // grouped: 4 query heads per key/value head, Llama 3's theta
        {1, 7, 1000, 4, 1, 128, 500000.0f}, // one key/value head, a chunk far into the sequence (context
                                            // parallelism's later chunks, or one token of a KV cache)
        {3, 5, 8192, 6, 3, 32, 10000.0f},
    };
    for (const rope_lab::Shape& s : shapes) rope_lab::check(s);
}
