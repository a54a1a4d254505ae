/*
Kernel lab: the AdamW step, against a double-precision reference, and its stochastic rounding.

Every check runs one step from a state downloaded from the device, so errors never compound: step 1 from a
random state (random, not zero, moments so that a forgotten beta1 * m shows), then step 7 with other
hyperparameters from the state step 1 left. Counts are odd (a tail after the 128-bit chunks), and one case
offsets every pointer by one element, which takes the element-by-element path.

In BF16 the parameter written must be exactly the master value rounded stochastically with the bits of
(seed, index): one of the two bf16 neighbours of the fp32 master value, chosen by the hash. Over many
elements the rounding must be unbiased: a separate test fixes every master value a quarter of the way
between two bf16 neighbours (where rounding to nearest is always off by -1/4 of a step) and checks that the
mean error is zero and that a quarter of the values round up.
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/adamw.cuh"

struct AdamWLabHyperparameters {
    float learning_rate, beta1, beta2, eps, weight_decay, grad_scale;
    int step;
    uint32_t seed;
};

struct AdamWLabState {
    std::vector<float> params, master, m, v;
};

// the new state in double, from the kernel's inputs as floats
static void adamw_lab_reference(const AdamWLabState& in, const std::vector<float>& grads, bool use_master,
                                const AdamWLabHyperparameters& h, std::vector<double>& new_weight,
                                std::vector<double>& new_m, std::vector<double>& new_v) {
    const size_t count = grads.size();
    new_weight.resize(count);
    new_m.resize(count);
    new_v.resize(count);
    const double beta1 = h.beta1, beta2 = h.beta2;
    const double correction1 = 1.0 - std::pow(beta1, h.step), correction2 = 1.0 - std::pow(beta2, h.step);
    for (size_t i = 0; i < count; i++) {
        const double g = (double)grads[i] * (double)h.grad_scale;
        const double w = use_master ? in.master[i] : in.params[i];
        new_m[i] = beta1 * in.m[i] + (1.0 - beta1) * g;
        new_v[i] = beta2 * in.v[i] + (1.0 - beta2) * g * g;
        const double update = (new_m[i] / correction1) / (std::sqrt(new_v[i] / correction2) + (double)h.eps);
        new_weight[i] = w - (double)h.learning_rate * (update + (double)h.weight_decay * w);
    }
}

static uint32_t adamw_lab_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    return bits;
}

// the parameter the kernel must write for a master value (the hash is computed here on the host, so this
// also shows the result does not depend on how the kernel was launched)
static float adamw_lab_expected_param(float master_value, uint32_t seed, size_t index) {
    return (float)round_stochastically<floatX>(master_value, random_bits_for(seed, index));
}

// ----------------------------------------------------------------------------
// one configuration: two steps on `count` parameters, pointers offset by `offset` elements

static void adamw_lab_check(size_t count, size_t offset, bool use_master) {
    char shape[96];
    snprintf(shape, sizeof(shape), "count=%zu%s%s", count, offset ? " unaligned" : "",
             use_master ? " master" : " no master");
    const std::string name = shape;

    AdamWLabState state;
    state.master = random_floats(count, -1.0f, 1.0f);
    state.params = round_to_floatX(state.master);
    if (!use_master) state.master = state.params;  // unused by the kernel; the reference reads params
    state.m = random_floats(count, -0.01f, 0.01f);
    state.v = random_floats(count, 1e-6f, 1e-4f);

    DeviceBuffer<floatX> d_params(count + offset), d_grads(count + offset);
    DeviceBuffer<float> d_master(count + offset), d_m(count + offset), d_v(count + offset);
    auto with_offset = [offset](std::vector<float> values) {
        values.insert(values.begin(), offset, 0.5f);
        return values;
    };
    auto without_offset = [offset](std::vector<float> values) {
        values.erase(values.begin(), values.begin() + offset);
        return values;
    };
    auto upload_state = [&](const AdamWLabState& s) {
        d_params.upload(with_offset(s.params));
        d_master.upload(with_offset(s.master));
        d_m.upload(with_offset(s.m));
        d_v.upload(with_offset(s.v));
    };
    auto download_state = [&]() {
        AdamWLabState s;
        s.params = without_offset(d_params.download());
        s.master = without_offset(d_master.download());
        s.m = without_offset(d_m.download());
        s.v = without_offset(d_v.download());
        return s;
    };
    const cudaStream_t stream = 0;
    auto run = [&](const AdamWLabHyperparameters& h) {
        adamw_update(d_params.ptr + offset, use_master ? d_master.ptr + offset : nullptr, d_m.ptr + offset,
                     d_v.ptr + offset, d_grads.ptr + offset, count, h.learning_rate, h.beta1, h.beta2, h.eps,
                     h.weight_decay, h.step, h.grad_scale, h.seed, 0, stream);
        cudaCheck(cudaDeviceSynchronize());
    };

    const AdamWLabHyperparameters steps[2] = {
        {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 1, 1234u},
        {3e-4f, 0.8f, 0.999f, 1e-6f, 0.0f, 1.0f, 7, 98765u},
    };
    AdamWLabState first_after;
    for (const AdamWLabHyperparameters& h : steps) {
        const std::string step_name = " step " + std::to_string(h.step) + " " + name;
        const std::vector<float> grads = round_to_floatX(random_floats(count, -1.0f, 1.0f));
        d_grads.upload(with_offset(grads));
        upload_state(state);
        run(h);
        const AdamWLabState after = download_state();

        std::vector<double> weight_reference, m_reference, v_reference;
        adamw_lab_reference(state, grads, use_master, h, weight_reference, m_reference, v_reference);

        // m = b1*m + (1-b1)*(scale*g): |m| <= 0.1 before, |(1-b1)*g| <= 0.2, |result| <= 0.3; four fp32
        // roundings (2^-24 relative each) of numbers that size: at most ~5e-8 absolute, whatever cancels.
        check_close("adamw m" + step_name, after.m, m_reference, 6e-8, 1e-6);
        // v: a sum of positive terms, so its error is relative: a few roundings of 2^-24.
        check_close("adamw v" + step_name, after.v, v_reference, 1e-12, 1e-6);
        // The new weight w - lr*(u + wd*w), |w| <= 1: the fp32 result rounds by 2^-24 relative, and the
        // update lr*|u| <= lr / sqrt(1 - b2) (Adam's step is bounded) carries the relative error of m, v,
        // sqrt and the divisions, ~1e-6 when m is small. 1e-7 absolute covers both with margin.
        if (use_master) check_close("adamw master" + step_name, after.master, weight_reference, 1e-7, 1e-6);

        if (!kBF16) {
            // FP32: the parameters are the new weights themselves
            check_close("adamw params" + step_name, after.params, weight_reference, 1e-7, 1e-6);
            if (use_master)
                check_true("adamw params == master" + step_name,
                           memcmp(after.params.data(), after.master.data(), count * sizeof(float)) == 0);
        } else if (use_master) {
            // BF16: exactly the stochastic rounding of the kernel's own master value, and therefore one of
            // its two bf16 neighbours (equal to it when it is representable)
            size_t not_neighbour = 0, not_expected = 0;
            double mean_error_in_steps = 0.0;
            for (size_t i = 0; i < count; i++) {
                const uint32_t master_bits = adamw_lab_bits(after.master[i]);
                const uint32_t lower = master_bits & 0xffff0000u;
                const uint32_t param_bits = adamw_lab_bits(after.params[i]);
                const bool exact = master_bits == lower;
                if (!(param_bits == lower || (!exact && param_bits == lower + 0x10000u))) not_neighbour++;
                if (after.params[i] != adamw_lab_expected_param(after.master[i], h.seed, i)) not_expected++;
                float lower_value, upper_value;
                const uint32_t upper = lower + 0x10000u;
                memcpy(&lower_value, &lower, 4);
                memcpy(&upper_value, &upper, 4);
                const double spacing = std::fabs((double)upper_value - (double)lower_value);
                const double error = std::fabs((double)after.params[i]) - std::fabs((double)after.master[i]);
                mean_error_in_steps += error / spacing;
            }
            mean_error_in_steps /= (double)count;
            check_true("adamw bf16 params are master's neighbours" + step_name, not_neighbour == 0,
                       std::to_string(not_neighbour) + " of " + std::to_string(count) + " are not");
            check_true("adamw bf16 params == SR(master, hash)" + step_name, not_expected == 0,
                       std::to_string(not_expected) + " of " + std::to_string(count) + " differ");
            // Unbiased: each error (in units of the bf16 step) has mean 0 and variance f(1-f) <= 1/4, so the
            // mean over `count` values has a standard deviation <= 0.5/sqrt(count). Allow 6 of them.
            const double bound = 6.0 * 0.5 / std::sqrt((double)count);
            char detail[96];
            snprintf(detail, sizeof(detail), "mean %.2e steps, bound %.2e", mean_error_in_steps, bound);
            check_true("adamw bf16 rounding unbiased" + step_name, std::fabs(mean_error_in_steps) < bound, detail);
        } else {
            // BF16 without master weights: the new weight is never visible in fp32; it is the reference within
            // the fp32 error, rounded up or down by less than one bf16 step (2^-7 relative at most)
            check_close("adamw params (bf16, SR)" + step_name, after.params, weight_reference, 1e-7,
                        std::ldexp(1.0, -7));
        }

        if (h.step == 1) {
            // determinism: the same state, gradients and seed give the same bits
            upload_state(state);
            run(h);
            const AdamWLabState again = download_state();
            const bool same = again.params == after.params && again.m == after.m && again.v == after.v &&
                              (!use_master || again.master == after.master);
            check_true("adamw deterministic" + step_name, same);
            if (kBF16 && count >= 1000) {
                // and a different seed rounds some values the other way
                upload_state(state);
                AdamWLabHyperparameters other = h;
                other.seed++;
                run(other);
                check_true("adamw bf16 other seed, other roundings" + step_name,
                           without_offset(d_params.download()) != after.params);
            }
        }
        state = after;
    }
}

// Unbiased rounding with a known fraction: master values exactly 1/4 of a bf16 step above a bf16 value
// (in magnitude), and a learning rate of 0 so the master value passes through unchanged. Rounding to
// nearest would always go down: mean error -1/4 step, none rounded up.
static void adamw_lab_check_rounding_statistics() {
    if (!kBF16) return;
    const size_t count = (size_t)1 << 18;
    std::vector<float> master = random_floats(count, -2.0f, 2.0f);
    for (float& value : master) {
        uint32_t bits = (adamw_lab_bits(value) & 0xffff0000u) | 0x4000u;  // 0x4000 / 0x10000 = 1/4
        memcpy(&value, &bits, sizeof(bits));
    }
    DeviceBuffer<floatX> d_params(count), d_grads(count);
    DeviceBuffer<float> d_master(count), d_m(count), d_v(count);
    d_master.upload(master);
    d_params.poison();
    d_grads.upload(random_floats(count));
    d_m.upload(random_floats(count, -0.01f, 0.01f));
    d_v.upload(random_floats(count, 1e-6f, 1e-4f));
    adamw_update(d_params.ptr, d_master.ptr, d_m.ptr, d_v.ptr, d_grads.ptr, count, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 3,
                 1.0f, 2024u, 0, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> params = d_params.download();
    check_true("adamw master unchanged at lr=0", d_master.download() == master);

    // the same tensor updated in two pieces, as two ZeRO shards would, rounds exactly as when updated whole
    const size_t split = count / 3 + 5;  // odd, so the second piece also takes the unaligned path
    d_params.poison();
    for (size_t first : {(size_t)0, split}) {
        const size_t piece = first == 0 ? split : count - split;
        adamw_update(d_params.ptr + first, d_master.ptr + first, d_m.ptr + first, d_v.ptr + first,
                     d_grads.ptr + first, piece, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 3, 1.0f, 2024u, first, 0);
    }
    cudaCheck(cudaDeviceSynchronize());
    check_true("adamw bf16 tensor in two pieces == whole", d_params.download() == params);

    // more elements than the grid has threads: each thread rounds several, and each must still use the
    // bits of its own element index
    size_t not_expected = 0;
    for (size_t i = 0; i < count; i++) not_expected += params[i] != adamw_lab_expected_param(master[i], 2024u, i);
    check_true("adamw bf16 params == SR(master, hash) 2^18 values", not_expected == 0,
               std::to_string(not_expected) + " differ");

    size_t rounded_up = 0;
    double mean_error_in_steps = 0.0;
    for (size_t i = 0; i < count; i++) {
        const bool up = std::fabs(params[i]) > std::fabs(master[i]);
        rounded_up += up;
        mean_error_in_steps += up ? 0.75 : -0.25;
    }
    mean_error_in_steps /= (double)count;
    const double fraction_up = (double)rounded_up / (double)count;
    // Each value rounds up with probability 1/4: the count of ups is binomial, so the fraction has standard
    // deviation sqrt(1/4 * 3/4 / count) = 8.5e-4 at 2^18 values, and the mean error (0.75 or -0.25 per value)
    // the same. 6 standard deviations: a correct rounding fails with probability ~2e-9, while rounding to
    // nearest (-0.25) or any other deterministic rounding misses by ~50 standard deviations.
    const double bound = 6.0 * std::sqrt(0.25 * 0.75 / (double)count);
    char detail[128];
    snprintf(detail, sizeof(detail), "fraction up %.4f (expect 0.25), mean error %.2e steps, bound %.2e", fraction_up,
             mean_error_in_steps, bound);
    check_true("adamw bf16 rounding unbiased at 1/4 step", std::fabs(mean_error_in_steps) < bound, detail);
    check_true("adamw bf16 rounds up 1/4 of the time at 1/4 step", std::fabs(fraction_up - 0.25) < bound, detail);
}

static void adamw_lab_check_master_init() {
    const size_t count = 1001;
    const std::vector<float> params = round_to_floatX(random_floats(count));
    DeviceBuffer<floatX> d_params(count);
    DeviceBuffer<float> d_master(count);
    d_params.upload(params);
    d_master.poison();
    init_master_weights(d_master.ptr, d_params.ptr, count, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_true("init_master_weights copies params", d_master.download() == params);
}

// ----------------------------------------------------------------------------
// several tensors in one launch: a chunk of tensors laid end to end (odd sizes, so most start unaligned and
// take the element-by-element path while others go 128 bits at a time), each with its own seed and
// weight decay. Updated tensor by tensor, all in one adamw_update_tensors call, and shard by shard (the
// chunk cut at odd points, each shard's pieces of tensors updated in one call with their first_index), the
// state must come out the same to the bit.

static void adamw_lab_check_tensor_list(const std::vector<size_t>& sizes, bool use_master, int shards) {
    size_t total = 0;
    std::vector<AdamWTensor> whole;
    for (size_t t = 0; t < sizes.size(); t++) {
        const uint32_t seed = 1000u + 7919u * (uint32_t)t;
        whole.push_back({total, sizes[t], 0, seed, t % 2 == 0 ? 0.1f : 0.0f});
        total += sizes[t];
    }
    char name[128];
    snprintf(name, sizeof(name), "%zu tensors, %zu elements%s", sizes.size(), total, use_master ? " master" : "");

    AdamWLabState start;
    start.master = random_floats(total, -1.0f, 1.0f);
    start.params = round_to_floatX(start.master);
    start.m = random_floats(total, -0.01f, 0.01f);
    start.v = random_floats(total, 1e-6f, 1e-4f);
    const std::vector<float> grads = round_to_floatX(random_floats(total, -1.0f, 1.0f));
    DeviceBuffer<floatX> d_params(total), d_grads(total);
    DeviceBuffer<float> d_master(total), d_m(total), d_v(total);
    d_grads.upload(grads);
    float* master = use_master ? d_master.ptr : nullptr;
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, grad_scale = 0.8f;
    const int step = 3;

    // runs `update` from the start state and returns the state it leaves
    auto state_after = [&](const std::function<void()>& update) {
        d_params.upload(start.params);
        d_master.upload(start.master);
        d_m.upload(start.m);
        d_v.upload(start.v);
        update();
        cudaCheck(cudaDeviceSynchronize());
        return std::vector<std::vector<float>>{d_params.download(), d_master.download(), d_m.download(),
                                               d_v.download()};
    };
    auto same_bits = [](const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
        for (size_t k = 0; k < a.size(); k++)
            if (a[k].size() != b[k].size() || memcmp(a[k].data(), b[k].data(), a[k].size() * sizeof(float)) != 0)
                return false;
        return true;
    };

    const auto one_by_one = state_after([&] {
        for (const AdamWTensor& t : whole)
            adamw_update(d_params.ptr + t.offset, master ? master + t.offset : nullptr, d_m.ptr + t.offset,
                         d_v.ptr + t.offset, d_grads.ptr + t.offset, t.count, lr, beta1, beta2, eps, t.weight_decay,
                         step, grad_scale, t.seed, 0, 0);
    });
    const auto together = state_after([&] {
        adamw_update_tensors(d_params.ptr, master, d_m.ptr, d_v.ptr, d_grads.ptr, whole.data(), (int)whole.size(), lr,
                             beta1, beta2, eps, step, grad_scale, 0);
    });
    check_true(std::string("adamw one launch == tensor by tensor, ") + name, same_bits(together, one_by_one),
               "params, master, m, v");
    // every element was updated (two runs that both skip a tensor would compare equal)
    size_t unchanged = 0;
    for (size_t i = 0; i < total; i++) unchanged += together[2][i] == start.m[i] || together[3][i] == start.v[i];
    check_true(std::string("adamw tensor list updates every element, ") + name, unchanged == 0,
               std::to_string(unchanged) + " moments unchanged");

    const auto sharded = state_after([&] {
        for (int k = 0; k < shards; k++) {
            const size_t shard_first = total * k / shards + (k > 0 ? 3 : 0);
            const size_t shard_end = k + 1 < shards ? total * (k + 1) / shards + 3 : total;
            std::vector<AdamWTensor> pieces;
            for (const AdamWTensor& t : whole) {
                const size_t first = std::max(t.offset, shard_first), end = std::min(t.offset + t.count, shard_end);
                if (first < end) pieces.push_back({first - shard_first, end - first, first - t.offset, t.seed,
                                                   t.weight_decay});
            }
            adamw_update_tensors(d_params.ptr + shard_first, master ? master + shard_first : nullptr,
                                 d_m.ptr + shard_first, d_v.ptr + shard_first, d_grads.ptr + shard_first,
                                 pieces.data(), (int)pieces.size(), lr, beta1, beta2, eps, step, grad_scale, 0);
        }
    });
    check_true(std::string("adamw ") + std::to_string(shards) + " shards == whole, " + name,
               same_bits(sharded, together), "params, master, m, v");
}

// ----------------------------------------------------------------------------
// benchmark: one step over all of GPT-2 124M's parameters

static void adamw_lab_bench() {
#ifdef LLMC_CPU
    const size_t count = (size_t)1 << 24;  // the CPU is slow: 16.8M parameters instead of 124M
#else
    const size_t count = 124475904;  // GPT-2 124M with the vocabulary padded to 50304
#endif
    DeviceBuffer<floatX> params(count), grads(count);
    DeviceBuffer<float> master(count), m(count), v(count);
    params.zero();
    grads.zero();
    master.zero();
    m.zero();
    v.zero();
    float* master_or_null = kBF16 ? master.ptr : nullptr;
    int step = 1;
    const double ms = time_ms([&] {
        adamw_update(params.ptr, master_or_null, m.ptr, v.ptr, grads.ptr, count, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                     step, 1.0f, (uint32_t)step, 0, 0);
        step++;
    });
    // bytes: params and m, v (and master in BF16) read and written, grads read
    const double bytes_per_parameter = 3.0 * sizeof(floatX) + 16.0 + (kBF16 ? 8.0 : 0.0);
    char name[96];
    snprintf(name, sizeof(name), "adamw_update count=%zu", count);
    report_bench(name, ms, bytes_per_parameter * count, 0);
}

void lab_adamw() {
    if (!family_selected("adamw")) return;
    adamw_lab_check(4099, 0, true);
    adamw_lab_check(4099, 0, false);
    adamw_lab_check(1027, 1, true);
    adamw_lab_check(3, 0, true);
    adamw_lab_check_rounding_statistics();
    // a GPT-2 block's 12 tensors at C = 64 (biases and layernorm weights 64..256 long, matrices 4096..16384)
    const std::vector<size_t> block = {64, 64, 12288, 192, 4096, 64, 64, 64, 16384, 256, 16384, 64};
    adamw_lab_check_tensor_list(block, true, 3);
    adamw_lab_check_tensor_list(block, false, 2);
    // odd sizes: most tensors start unaligned; 20 tensors take two launches of at most 16
    std::vector<size_t> odd = {4099, 3, 1027, 13, 770};
    for (size_t t = 0; t < 15; t++) odd.push_back(1 + 37 * t);
    adamw_lab_check_tensor_list(odd, true, 4);
    adamw_lab_check_tensor_list(odd, false, 3);
    adamw_lab_check_master_init();
    if (lab.bench) adamw_lab_bench();
}
