/*
The AdamW optimizer step, elementwise over a range of parameters.

For each parameter w with gradient g (at step t = 1, 2, ...):

    g      = grad_scale * g                          (grad_scale < 1 when the global norm is clipped)
    m      = beta1 * m + (1 - beta1) * g             first moment: a running mean of gradients
    v      = beta2 * v + (1 - beta2) * g^2           second moment: a running mean of squared gradients
    m_hat  = m / (1 - beta1^t)                       bias correction: m and v start at 0, so early
    v_hat  = v / (1 - beta2^t)                       averages are too small by exactly these factors
    w      = w - lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)

The weight decay is "decoupled" (the W in AdamW): it shrinks w directly instead of being added to the
gradient, where Adam's normalisation by sqrt(v_hat) would rescale it differently for every parameter.
Which tensors decay (matrices) and which do not (biases, layernorm gains) is the caller's choice: one call
per tensor or per contiguous range with the same hyperparameters.

Precision. The moments m, v and the update are fp32 in both builds.
  - FP32 build: the parameters are fp32 themselves and are the master copy (master = nullptr).
  - BF16 build: an fp32 master copy (master != nullptr) holds the real value; the bf16 parameter the
    forward pass reads is the master rounded STOCHASTICALLY: up with probability equal to the distance
    from the lower bf16 neighbour, in units of the spacing. Rounding to nearest would lose every update
    smaller than half a bf16 step (2^-9 relative), which late in training is most of them; stochastic
    rounding keeps them in expectation. Without a master copy (master = nullptr in BF16) the old bf16
    value is the starting point and the stochastic rounding is all that carries small updates.
The random bits come from a hash of (seed, element index within the tensor), never from the thread or
block, so the result does not depend on the launch configuration and a run can be repeated bit for bit.
A tensor updated in pieces (each rank its shard, under ZeRO) passes each piece's first index, so it
rounds exactly as when updated whole. Use a new seed every step and a different one per tensor.
*/
#pragma once

#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// stochastic rounding

// A counter-based random number: a few rounds of multiply/xorshift mixing (a murmur3-style finalizer)
// over the seed and the 64-bit element index. Every input bit affects every output bit.
__device__ __host__ __forceinline__ uint32_t mix_bits(uint32_t x) {
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}
__device__ __host__ __forceinline__ uint32_t random_bits_for(uint32_t seed, size_t index) {
    uint32_t high = mix_bits((uint32_t)(index >> 32) ^ mix_bits(seed + 0x9e3779b9u));
    return mix_bits((uint32_t)index ^ high);
}

// fp32 -> Target (floatX). For bf16: a bf16 is the top 16 bits of an fp32. Adding a uniform random number in
// [0, 2^16) to the low 16 bits carries into the top half with probability (low bits) / 2^16, which is
// exactly the fraction of the way from the lower bf16 neighbour (in magnitude) to the upper one; then
// the low bits are dropped. Infinity and NaN are passed through unchanged (NaN's low bits could carry).
// An fp32 target needs no rounding.
template <class Target>
__device__ __host__ __forceinline__ Target round_stochastically(float value, uint32_t random_bits) {
    if constexpr (sizeof(Target) == sizeof(float)) {
        return value;
    } else {
        uint32_t bits;
        memcpy(&bits, &value, sizeof(bits));
        if ((bits & 0x7f800000u) == 0x7f800000u) return (Target)value;
        bits += random_bits & 0xffffu;
        const uint16_t top_half = (uint16_t)(bits >> 16);
        Target rounded;
        memcpy((void*)&rounded, &top_half, sizeof(rounded));
        return rounded;
    }
}

// ----------------------------------------------------------------------------
// kernels

struct AdamWSettings {
    float learning_rate;
    float beta1;
    float beta2;
    float bias_correction1;  // 1 - beta1^step
    float bias_correction2;  // 1 - beta2^step
    float eps;
    float weight_decay;
    float grad_scale;
    uint32_t seed;
    size_t first_index;  // index within its tensor of the first element of this call
};

// One parameter: updates m and v in place and returns the new fp32 value of the weight.
__device__ __forceinline__ float adamw_new_weight(float weight, float grad, float& m, float& v,
                                                  const AdamWSettings& s) {
    grad *= s.grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * grad;
    v = s.beta2 * v + (1.0f - s.beta2) * grad * grad;
    const float m_hat = m / s.bias_correction1;
    const float v_hat = v / s.bias_correction2;
    return weight - s.learning_rate * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * weight);
}

// Grid-stride loop over 128-bit chunks of x128::size parameters for elements [0, packed_count), then
// one element at a time for the rest [packed_count, count) (a tail, or everything when some pointer is
// not 16-byte aligned). fp32 arrays are read as x128::size / f128::size f128 chunks per parameter chunk.
__global__ void adamw_kernel(floatX* params, float* master, float* m, float* v, const floatX* grads,
                             size_t count, size_t packed_count, AdamWSettings settings) {
    const GridStride chunks = grid_stride(packed_count / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t base = chunk * x128::size;
        const x128 grad = load128cs(grads + base);
        const x128 old_param = load128cs(params + base);
        x128 new_param;
        for (int j = 0; j < x128::size; j += f128::size) {
            f128 moment1 = load128cs(m + base + j);
            f128 moment2 = load128cs(v + base + j);
            f128 weight;
            if (master != nullptr) {
                weight = load128cs(master + base + j);
            } else {
                for (int k = 0; k < f128::size; k++) weight[k] = (float)old_param[j + k];
            }
            for (int k = 0; k < f128::size; k++) {
                weight[k] = adamw_new_weight(weight[k], (float)grad[j + k], moment1[k], moment2[k], settings);
                const uint32_t random_bits = random_bits_for(settings.seed, settings.first_index + base + j + k);
                new_param[j + k] = round_stochastically<floatX>(weight[k], random_bits);
            }
            store128cs(m + base + j, moment1);
            store128cs(v + base + j, moment2);
            if (master != nullptr) store128cs(master + base + j, weight);
        }
        store128cs(params + base, new_param);
    }

    const GridStride tail = grid_stride(count - packed_count);
    for (size_t i = packed_count + tail.first; i < packed_count + tail.end; i += tail.step) {
        const float weight = master != nullptr ? master[i] : (float)params[i];
        const float new_weight = adamw_new_weight(weight, (float)grads[i], m[i], v[i], settings);
        if (master != nullptr) master[i] = new_weight;
        params[i] = round_stochastically<floatX>(new_weight, random_bits_for(settings.seed, settings.first_index + i));
    }
}

__global__ void copy_to_master_kernel(float* master, const floatX* params, size_t count) {
    const GridStride share = grid_stride(count);
    for (size_t i = share.first; i < share.end; i += share.step) {
        master[i] = (float)params[i];
    }
}

// ----------------------------------------------------------------------------
// launchers

// One AdamW step over `count` parameters (see the top of the file).
// params (count): updated in place (written from the new fp32 value; stochastic rounding in BF16).
// master (count): fp32 master weights, read and written; nullptr to use params as the master.
// m, v (count): fp32 moments, read and written. grads (count): read only.
// step: 1-based (the first update is step 1). grad_scale multiplies every gradient (clipping).
// seed, first_index: element i rounds with the bits of hash(seed, first_index + i).
// Any count and any alignment; 16-byte aligned pointers take the 128-bit path.
inline void adamw_update(floatX* params, float* master, float* m, float* v, const floatX* grads, size_t count,
                         float learning_rate, float beta1, float beta2, float eps, float weight_decay, int step,
                         float grad_scale, uint32_t seed, size_t first_index, cudaStream_t stream) {
    if (step < 1) {
        fprintf(stderr, "error: adamw_update: step must be 1 or more (got %d)\n", step);
        exit(EXIT_FAILURE);
    }
    if (count == 0) return;
    AdamWSettings settings;
    settings.learning_rate = learning_rate;
    settings.beta1 = beta1;
    settings.beta2 = beta2;
    settings.bias_correction1 = (float)(1.0 - pow((double)beta1, step));
    settings.bias_correction2 = (float)(1.0 - pow((double)beta2, step));
    settings.eps = eps;
    settings.weight_decay = weight_decay;
    settings.grad_scale = grad_scale;
    settings.seed = seed;
    settings.first_index = first_index;

    auto aligned = [](const void* pointer) { return pointer == nullptr || (uintptr_t)pointer % 16 == 0; };
    const bool packed = aligned(params) && aligned(master) && aligned(m) && aligned(v) && aligned(grads);
    const size_t packed_count = packed ? count / x128::size * x128::size : 0;

    const int block_size = 512;
    const long long work_items = packed ? (long long)(count / x128::size) + 1 : (long long)count;
    launch(adamw_kernel, grid_size_for(work_items, block_size), block_size, 0, stream,
           params, master, m, v, grads, count, packed_count, settings);
}

// master = (float)params, for the start of training (or after loading a checkpoint without master weights)
inline void init_master_weights(float* master, const floatX* params, size_t count, cudaStream_t stream) {
    if (count == 0) return;
    const int block_size = 512;
    launch(copy_to_master_kernel, grid_size_for((long long)count, block_size), block_size, 0, stream,
           master, params, count);
}
