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
Which tensors decay (matrices) and which do not (biases, layernorm gains) is the caller's choice: each
tensor of an update carries its own weight decay and seed.

Launches. A GPT-2 block has 12 tensors, half of them C = 768 elements long; one launch per tensor would
be ~150 launches per step at 124M, most of them a handful of blocks. adamw_update_tensors instead takes
a list of tensors (a chunk of the model, or this rank's shard of one: up to ADAMW_TENSORS_PER_LAUNCH per
launch) and one grid-stride kernel walks them in turn, so each launch is a full grid. Every element is
computed from its own values and (seed, index within its tensor) alone, so the grouping of tensors into
launches, and the launch shape, never change a bit.

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

#include "../cuda_common.cuh"

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

// the hyperparameters shared by all tensors of an update
struct AdamWSettings {
    float learning_rate;
    float beta1;
    float beta2;
    float bias_correction1;  // 1 - beta1^step
    float bias_correction2;  // 1 - beta2^step
    float eps;
    float grad_scale;
};

// One tensor (or a piece of one) in an update: elements [offset, offset + count) of the arrays the update
// is given, which are elements [first_index, first_index + count) of the tensor.
struct AdamWTensor {
    size_t offset;
    size_t count;
    size_t first_index;
    uint32_t seed;
    float weight_decay;
};

// What one launch walks, passed by value as a kernel argument (no upload needed).
// packed_count[t]: elements [0, packed_count) of tensor t go in 128-bit chunks, the rest one by one.
constexpr int ADAMW_TENSORS_PER_LAUNCH = 16;
struct AdamWTensorList {
    int count;
    AdamWTensor tensors[ADAMW_TENSORS_PER_LAUNCH];
    size_t packed_count[ADAMW_TENSORS_PER_LAUNCH];
};

// One parameter: updates m and v in place and returns the new fp32 value of the weight.
__device__ __forceinline__ float adamw_new_weight(float weight, float grad, float& m, float& v,
                                                  const AdamWSettings& s, float weight_decay) {
    grad *= s.grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * grad;
    v = s.beta2 * v + (1.0f - s.beta2) * grad * grad;
    const float m_hat = m / s.bias_correction1;
    const float v_hat = v / s.bias_correction2;
    return weight - s.learning_rate * (m_hat / (sqrtf(v_hat) + s.eps) + weight_decay * weight);
}

// For each tensor in turn, a grid-stride loop over 128-bit chunks of x128::size parameters for its
// elements [0, packed_count), then one element at a time for the rest [packed_count, count) (a tail, or
// everything when some pointer is not 16-byte aligned). fp32 arrays are read as x128::size / f128::size
// f128 chunks per parameter chunk. master may be null (see the top of the file).
__global__ void adamw_kernel(floatX* params, float* master, float* m, float* v, const floatX* grads,
                             AdamWTensorList list, AdamWSettings settings) {
    for (int t = 0; t < list.count; t++) {
        const AdamWTensor tensor = list.tensors[t];
        const size_t packed_count = list.packed_count[t];
        floatX* tensor_params = params + tensor.offset;
        float* tensor_master = master != nullptr ? master + tensor.offset : nullptr;
        float* tensor_m = m + tensor.offset;
        float* tensor_v = v + tensor.offset;
        const floatX* tensor_grads = grads + tensor.offset;

        const GridStride chunks = grid_stride(packed_count / x128::size);
        for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
            const size_t base = chunk * x128::size;
            const x128 grad = load128cs(tensor_grads + base);
            const x128 old_param = load128cs(tensor_params + base);
            x128 new_param;
            for (int j = 0; j < x128::size; j += f128::size) {
                f128 moment1 = load128cs(tensor_m + base + j);
                f128 moment2 = load128cs(tensor_v + base + j);
                f128 weight;
                if (tensor_master != nullptr) {
                    weight = load128cs(tensor_master + base + j);
                } else {
                    for (int k = 0; k < f128::size; k++) weight[k] = (float)old_param[j + k];
                }
                for (int k = 0; k < f128::size; k++) {
                    weight[k] = adamw_new_weight(weight[k], (float)grad[j + k], moment1[k], moment2[k], settings,
                                                 tensor.weight_decay);
                    const uint32_t random_bits = random_bits_for(tensor.seed, tensor.first_index + base + j + k);
                    new_param[j + k] = round_stochastically<floatX>(weight[k], random_bits);
                }
                store128cs(tensor_m + base + j, moment1);
                store128cs(tensor_v + base + j, moment2);
                if (tensor_master != nullptr) store128cs(tensor_master + base + j, weight);
            }
            store128cs(tensor_params + base, new_param);
        }

        const GridStride tail = grid_stride(tensor.count - packed_count);
        for (size_t i = packed_count + tail.first; i < packed_count + tail.end; i += tail.step) {
            const float weight = tensor_master != nullptr ? tensor_master[i] : (float)tensor_params[i];
            const float new_weight = adamw_new_weight(weight, (float)tensor_grads[i], tensor_m[i], tensor_v[i],
                                                      settings, tensor.weight_decay);
            if (tensor_master != nullptr) tensor_master[i] = new_weight;
            tensor_params[i] =
                round_stochastically<floatX>(new_weight, random_bits_for(tensor.seed, tensor.first_index + i));
        }
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

// One AdamW step over the tensors listed (see the top of the file). Tensor t's elements are
// [tensors[t].offset, + count) of each array:
// params: updated in place (written from the new fp32 value; stochastic rounding in BF16).
// master: fp32 master weights, read and written; nullptr to use params as the master.
// m, v: fp32 moments, read and written. grads: read only.
// step: 1-based (the first update is step 1). grad_scale multiplies every gradient (clipping).
// Element i of tensor t rounds with the bits of hash(tensors[t].seed, tensors[t].first_index + i).
// Any counts and any alignment; a tensor whose pointers are all 16-byte aligned takes the 128-bit path.
inline void adamw_update_tensors(floatX* params, float* master, float* m, float* v, const floatX* grads,
                                 const AdamWTensor* tensors, int num_tensors, float learning_rate, float beta1,
                                 float beta2, float eps, int step, float grad_scale, cudaStream_t stream) {
    if (step < 1) {
        fprintf(stderr, "error: adamw_update: step must be 1 or more (got %d)\n", step);
        exit(EXIT_FAILURE);
    }
    AdamWSettings settings;
    settings.learning_rate = learning_rate;
    settings.beta1 = beta1;
    settings.beta2 = beta2;
    settings.bias_correction1 = (float)(1.0 - pow((double)beta1, step));
    settings.bias_correction2 = (float)(1.0 - pow((double)beta2, step));
    settings.eps = eps;
    settings.grad_scale = grad_scale;

    auto aligned = [](const void* pointer) { return pointer == nullptr || (uintptr_t)pointer % 16 == 0; };
    AdamWTensorList list;
    list.count = 0;
    long long work_items = 0;  // 128-bit chunks and single elements, over the tensors of the launch
    auto flush = [&]() {
        if (list.count == 0) return;
        const int block_size = 512;
        launch(adamw_kernel, grid_size_for(work_items, block_size), block_size, 0, stream, params, master, m, v,
               grads, list, settings);
        list.count = 0;
        work_items = 0;
    };
    for (int t = 0; t < num_tensors; t++) {
        const AdamWTensor& tensor = tensors[t];
        if (tensor.count == 0) continue;
        const size_t o = tensor.offset;
        const bool packed = aligned(params + o) && aligned(master ? master + o : nullptr) && aligned(m + o) &&
                            aligned(v + o) && aligned(grads + o);
        const size_t packed_count = packed ? tensor.count / x128::size * x128::size : 0;
        list.tensors[list.count] = tensor;
        list.packed_count[list.count] = packed_count;
        list.count++;
        work_items += (long long)(packed_count / x128::size + (tensor.count - packed_count));
        if (list.count == ADAMW_TENSORS_PER_LAUNCH) flush();
    }
    flush();
}

// One AdamW step over one tensor of `count` parameters (or a piece of one whose first element is element
// `first_index` of the tensor); see adamw_update_tensors.
inline void adamw_update(floatX* params, float* master, float* m, float* v, const floatX* grads, size_t count,
                         float learning_rate, float beta1, float beta2, float eps, float weight_decay, int step,
                         float grad_scale, uint32_t seed, size_t first_index, cudaStream_t stream) {
    const AdamWTensor tensor{0, count, first_index, seed, weight_decay};
    adamw_update_tensors(params, master, m, v, grads, &tensor, 1, learning_rate, beta1, beta2, eps, step,
                         grad_scale, stream);
}

// master = (float)params, for the start of training (or after loading a checkpoint without master weights)
inline void init_master_weights(float* master, const floatX* params, size_t count, cudaStream_t stream) {
    if (count == 0) return;
    const int block_size = 512;
    launch(copy_to_master_kernel, grid_size_for((long long)count, block_size), block_size, 0, stream,
           master, params, count);
}
