/*
The CPU build's bf16 stand-in (llmc/cpu/bf16.h) against the CUDA toolkit's own host implementation of
__float2bfloat16 / __bfloat162float (cuda_bf16.h), bit for bit. Both are compiled into this one program:
the stand-in under other names, the toolkit's under its own.
Inputs: every special value we can think of, 2^24 uniformly random bit patterns (so NaNs with every
payload, infinities, denormals and both signs all occur), and 2^22 values placed exactly on or next to
a rounding tie.
*/
#define __nv_bfloat16 cpu_bfloat16
#define __float2bfloat16 cpu_float2bfloat16
#define __float2bfloat16_rn cpu_float2bfloat16_rn
#define __bfloat162float cpu_bfloat162float
#include "../../llmc/cpu/bf16.h"
#undef __nv_bfloat16
#undef __float2bfloat16
#undef __float2bfloat16_rn
#undef __bfloat162float

#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

static int passed = 0, failed = 0;

static uint16_t toolkit_bits(float value) {
    __nv_bfloat16 rounded = __float2bfloat16(value);
    uint16_t bits;
    memcpy(&bits, &rounded, 2);
    return bits;
}

static float from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, 4);
    return value;
}

// compares the two conversions on `values`; one result line
static void compare(const char* name, const std::vector<uint32_t>& inputs) {
    size_t mismatches = 0, widen_mismatches = 0;
    uint32_t first_bad = 0;
    for (uint32_t input : inputs) {
        float value = from_bits(input);
        uint16_t ours = cpu_float2bfloat16(value).__x;
        if (ours != toolkit_bits(value)) {
            if (mismatches++ == 0) first_bad = input;
        }
        // widening back to float must agree too (compare bits: NaN != NaN)
        cpu_bfloat16 narrow;
        narrow.__x = ours;
        __nv_bfloat16 theirs;
        memcpy(&theirs, &ours, 2);
        float a = (float)narrow, b = __bfloat162float(theirs);
        if (memcmp(&a, &b, 4) != 0) widen_mismatches++;
    }
    bool ok = mismatches == 0 && widen_mismatches == 0;
    printf("  %s %-44s %zu inputs, %zu differ in rounding, %zu in widening", ok ? "ok  " : "FAIL", name,
           inputs.size(), mismatches, widen_mismatches);
    if (mismatches) printf(" (first: 0x%08x)", first_bad);
    printf("\n");
    (ok ? passed : failed)++;
}

int main() {
    printf("bf16 stand-in vs cuda_bf16.h\n");
    std::vector<uint32_t> special = {
        0x00000000, 0x80000000,              // +-0
        0x7f800000, 0xff800000,              // +-inf
        0x7fc00000, 0xffc00000, 0x7f800001,  // quiet and signalling NaNs
        0x7fffffff, 0xffffffff, 0x7f810000,
        0x00000001, 0x807fffff, 0x00008000,  // denormals, including a tie in the lowest bf16 denormal
        0x7f7fffff, 0xff7fffff, 0x7f7f8000,  // largest finite (rounds up to inf), a tie at the top
        0x3f808000, 0x3f818000, 0x3f807fff,  // ties to even (down, up) and just below a tie
    };
    compare("special values", special);

    std::vector<uint32_t> random(1u << 24);
    uint64_t state = 0x243f6a8885a308d3ull;
    for (auto& bits : random) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        bits = (uint32_t)(state >> 32);
    }
    compare("2^24 random bit patterns", random);

    std::vector<uint32_t> ties;
    for (uint32_t i = 0; i < (1u << 20); i++) {
        uint32_t high = (uint32_t)((i * 2654435761u) & 0xffff0000u);
        for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0000u}) ties.push_back(high | low);
    }
    compare("2^22 values at and next to rounding ties", ties);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
