/*
A small seedable random number generator whose whole state is one 64-bit integer, so a checkpoint can
save it by copying the struct, and a restored run draws exactly the numbers the original would have.

The generator is SplitMix64: the state advances by a fixed odd constant (the golden ratio times 2^64)
and each output is that counter passed through a mixing function (xor-shifts and multiplications that
spread every input bit over all output bits):
    state += 0x9E3779B97F4A7C15
    z = state;  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    output = z ^ (z >> 31)
It passes the usual statistical test batteries, has period 2^64, and every seed (including 0) is fine.
Because the state is a counter, independent streams for (seed, epoch, shard...) are made by hashing
those numbers into a starting state with the same mixing function (rng_for_stream).

Everything here is deterministic and identical on every platform: no std:: distributions, whose
outputs differ between standard libraries.
*/
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

// The SplitMix64 finaliser: a bijection on 64-bit integers that mixes all bits.
inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

struct Rng {
    uint64_t state;  // the whole state: save and restore it by copying the struct

    uint64_t next_u64() {
        state += 0x9E3779B97F4A7C15ull;
        return mix64(state);
    }
    // the upper half: the best-mixed bits
    uint32_t next_u32() { return (uint32_t)(next_u64() >> 32); }

    // uniform in [0, 1): 24 random bits, exactly representable in a float, so 1.0f is never returned
    float next_float() { return (float)(next_u32() >> 8) * (1.0f / 16777216.0f); }

    // uniform integer in [0, n) for n >= 1, without modulo bias: multiply a 32-bit draw by n and keep
    // the high word; draws that would land in the uneven remainder are rejected and redrawn
    uint32_t next_below(uint32_t n) {
        uint64_t product = (uint64_t)next_u32() * n;
        uint32_t low = (uint32_t)product;
        if (low < n) {
            uint32_t threshold = (uint32_t)(-n) % n;  // 2^32 mod n
            while (low < threshold) {
                product = (uint64_t)next_u32() * n;
                low = (uint32_t)product;
            }
        }
        return (uint32_t)(product >> 32);
    }

    // standard normal sample by the Box-Muller transform (one of the pair is discarded, which keeps the
    // state a single integer)
    float next_normal() {
        double u1 = ((double)(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]: log is finite
        double u2 = (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0);
        return (float)(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
};

inline Rng rng_from_seed(uint64_t seed) { return Rng{seed}; }

// A generator for one stream of a family, e.g. rng_for_stream(seed, {epoch, shard}): each distinct list
// of numbers gives an unrelated starting state.
inline Rng rng_for_stream(uint64_t seed, std::initializer_list<uint64_t> stream) {
    uint64_t state = mix64(seed ^ 0x5DEECE66Dull);
    for (uint64_t part : stream) state = mix64(state ^ mix64(part + 0x9E3779B97F4A7C15ull));
    return Rng{state};
}

// Fisher-Yates: position i (from the end down) swaps with a uniformly chosen position in [0, i], which
// makes every permutation equally likely.
template <typename T>
void shuffle(Rng& rng, T* items, size_t count) {
    for (size_t i = count; i > 1; i--) {
        size_t j = rng.next_below((uint32_t)i);
        T held = items[i - 1];
        items[i - 1] = items[j];
        items[j] = held;
    }
}

// Fills order[0..count) with 0..count-1 in a random order.
inline void random_permutation(Rng& rng, int* order, size_t count) {
    for (size_t i = 0; i < count; i++) order[i] = (int)i;
    shuffle(rng, order, count);
}
