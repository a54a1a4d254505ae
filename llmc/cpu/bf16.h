/*
The CPU build's stand-in for CUDA's __nv_bfloat16.

bfloat16 is the top half of an IEEE fp32: 1 sign bit, 8 exponent bits, 7 mantissa bits. Converting from
fp32 keeps the top 16 bits after rounding to nearest, ties to even:
    bits16 = (bits32 + 0x7fff + ((bits32 >> 16) & 1)) >> 16
Adding 0x7fff rounds up exactly when the discarded low half is above one half; the extra 1 when the kept
lowest bit is odd turns the exact tie into round-to-even. Infinities pass through unchanged (their low
half is zero) and large finite values round up to infinity, as they should. NaN must stay NaN, and
CUDA's conversion returns the canonical 0x7fff for every NaN input; so do we, so that the two builds
produce identical bits (dev/test/test_bf16.cpp checks this against the toolkit's own host code).

On the GPU `bf16 + bf16` is a bf16 addition that rounds. Here it would silently be an fp32 addition, so
the arithmetic operators between two bf16 values are deleted: kernels must convert to float explicitly,
which computes the same thing in both builds. The float constructor is explicit for the same reason.
*/
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
    uint16_t __x;

    __nv_bfloat16() = default;
    explicit __nv_bfloat16(float value) : __x(round_to_nearest_even(value)) {}
    operator float() const {
        uint32_t bits = (uint32_t)__x << 16;
        float value;
        memcpy(&value, &bits, sizeof(value));
        return value;
    }

    static uint16_t round_to_nearest_even(float value) {
        uint32_t bits;
        memcpy(&bits, &value, sizeof(bits));
        if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
        bits += 0x7fffu + ((bits >> 16) & 1u);
        return (uint16_t)(bits >> 16);
    }
};

#define LLMC_NO_BF16_ARITHMETIC(op) \
    __nv_bfloat16 operator op(__nv_bfloat16, __nv_bfloat16) = delete; \
    __nv_bfloat16& operator op##=(__nv_bfloat16&, __nv_bfloat16) = delete;
LLMC_NO_BF16_ARITHMETIC(+)
LLMC_NO_BF16_ARITHMETIC(-)
LLMC_NO_BF16_ARITHMETIC(*)
LLMC_NO_BF16_ARITHMETIC(/)
#undef LLMC_NO_BF16_ARITHMETIC

inline __nv_bfloat16 __float2bfloat16(float value) { return __nv_bfloat16(value); }
inline __nv_bfloat16 __float2bfloat16_rn(float value) { return __nv_bfloat16(value); }
inline float __bfloat162float(__nv_bfloat16 value) { return (float)value; }
