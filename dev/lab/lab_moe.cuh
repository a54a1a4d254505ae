/*
Kernel lab: the mixture-of-experts kernels (llmc/kernels/moe_routing.cuh), each case run through the whole chain as
training runs it: router forward, dispatch plan, permute, unpermute, their backward passes, the aux and z
losses, the router backward. Every output is compared with a plain double-precision loop written from the
definitions, not from the kernels' rearrangements: the plan by counting sorts in the order the definition
visits, the router backward by the chain rule (itself checked against central differences).

The router's logits are multiples of 1/8 up to +-30, which bf16 holds exactly, so both builds see the same
logits; distinct ones differ by at least 1/8, so their probabilities differ by far more than fp32's rounding
and the top-K choice (and everything integer after it) must match exactly. Equal logits are common, for the
ties (the smaller index first). Capacities are chosen to drop nothing, some, or nearly everything (a
favourite pair of experts takes every token, so every row after a sequence's first loses all of its
assignments and the other experts get no rows).
*/
#pragma once

#include "lab.h"
#include "../../llmc/kernels/moe_routing.cuh"

namespace moe_lab {

constexpr double kUnit = 0x1p-24;  // fp32's unit roundoff

// How a case's router logits are drawn
enum class Routing {
    Random,         // multiples of 1/8 in [-4, 4]: ties in most rows of many experts
    Wide,           // multiples of 1/8 in [-30, 30]: probabilities down to e^-60
    AllEqual,       // every logit 0.5: every row a K-way tie, experts 0..K-1
    TwoFavourites,  // experts 0 and 1 both at 4 (a tie), the rest below: every token picks them first
};

struct Case {
    int B, T, E, K, capacity, C;  // capacity <= 0: dropless
    Routing routing;
    std::string name() const {
        static const char* routings[] = {"random", "wide", "all equal", "two favourites"};
        return " B=" + std::to_string(B) + " T=" + std::to_string(T) + " E=" + std::to_string(E) + " K=" +
               std::to_string(K) + (capacity > 0 ? " cap=" + std::to_string(capacity) : " dropless") + " C=" +
               std::to_string(C) + " " + routings[(int)routing];
    }
};

inline std::vector<float> make_logits(const Case& c) {
    const size_t N = (size_t)c.B * c.T;
    const int eighths = c.routing == Routing::Wide ? 240 : 32;
    const std::vector<int> draws = random_ints(N * c.E, -eighths, eighths + 1);
    std::vector<float> logits(N * c.E);
    for (size_t i = 0; i < logits.size(); i++) {
        const int e = (int)(i % c.E);
        logits[i] = draws[i] / 8.0f;
        if (c.routing == Routing::AllEqual) logits[i] = 0.5f;
        if (c.routing == Routing::TwoFavourites) logits[i] = e < 2 ? 4.0f : std::min(logits[i], 3.0f);
    }
    return logits;
}

inline std::vector<int> download_ints(const DeviceBuffer<int>& buffer) {
    std::vector<int> values(buffer.count);
    cudaCheck(cudaMemcpy(values.data(), buffer.ptr, buffer.count * sizeof(int), cudaMemcpyDeviceToHost));
    return values;
}

// integers must be equal, every one
inline bool check_equal(const std::string& name, const std::vector<int>& got, const std::vector<int>& ref) {
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < ref.size(); i++)
        if (got[i] != ref[i] && wrong++ == 0) first = i;
    std::string detail = "all " + std::to_string(ref.size()) + " equal";
    if (wrong > 0)
        detail = std::to_string(wrong) + " of " + std::to_string(ref.size()) + " differ, first at " +
                 std::to_string(first) + ": got " + std::to_string(got[first]) + " ref " + std::to_string(ref[first]);
    return check_true(name, got.size() == ref.size() && wrong == 0, detail);
}

// ----------------------------------------------------------------------------
// the references, in double

// one row's softmax and log-sum-exp
struct SoftmaxRow {
    std::vector<double> p;
    double lse;
};
inline SoftmaxRow softmax_row(const double* z, int E) {
    double m = z[0];
    for (int e = 1; e < E; e++) m = std::max(m, z[e]);
    double S = 0.0;
    for (int e = 0; e < E; e++) S += std::exp(z[e] - m);
    SoftmaxRow row{std::vector<double>(E), m + std::log(S)};
    for (int e = 0; e < E; e++) row.p[e] = std::exp(z[e] - m) / S;
    return row;
}

// the K largest p, largest first, equal p by the smaller index
inline std::vector<int> top_k(const std::vector<double>& p, int K) {
    std::vector<int> order(p.size());
    for (size_t e = 0; e < p.size(); e++) order[e] = (int)e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    return std::vector<int>(order.begin(), order.begin() + K);
}

struct RouterReference {
    std::vector<double> probs, lse, weights;
    std::vector<int> experts;
};
inline RouterReference reference_router(const std::vector<float>& logits, int N, int E, int K) {
    RouterReference r;
    for (int n = 0; n < N; n++) {
        const std::vector<double> z(logits.begin() + (size_t)n * E, logits.begin() + (size_t)(n + 1) * E);
        const SoftmaxRow row = softmax_row(z.data(), E);
        const std::vector<int> chosen = top_k(row.p, K);
        double chosen_sum = 0.0;
        for (int e : chosen) chosen_sum += row.p[e];
        r.probs.insert(r.probs.end(), row.p.begin(), row.p.end());
        r.lse.push_back(row.lse);
        for (int e : chosen) {
            r.experts.push_back(e);
            r.weights.push_back(row.p[e] / chosen_sum);
        }
    }
    return r;
}

// The plan as the definition reads: visit each sequence's assignments in (t, k) order, keeping the first
// `capacity` per expert; then number the kept ones expert by expert, each in (n, k) order. `spent` (B x E, or
// empty: none) counts each sequence's assignments to each expert before it (the pieces of a longer sequence
// ahead of this one, under context parallelism), which the capacity has already seen.
struct PlanReference {
    std::vector<int> slots, expert_counts, routed_counts;
    int kept_rows = 0;
};
inline PlanReference reference_plan(const std::vector<int>& experts, int B, int T, int K, int E, int capacity,
                                    const std::vector<int>& spent = {}) {
    PlanReference plan;
    plan.slots.assign((size_t)B * T * K, -1);
    plan.expert_counts.assign(E, 0);
    plan.routed_counts.assign((size_t)B * E, 0);
    std::vector<bool> kept((size_t)B * T * K, false);
    for (int b = 0; b < B; b++) {
        std::vector<int> kept_in_sequence(E, 0);  // the assignments the capacity has seen
        if (!spent.empty()) std::copy_n(spent.begin() + (size_t)b * E, E, kept_in_sequence.begin());
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                const size_t a = ((size_t)b * T + t) * K + k;
                const int e = experts[a];
                plan.routed_counts[(size_t)b * E + e]++;
                if (capacity <= 0 || kept_in_sequence[e] < capacity) kept[a] = true;
                kept_in_sequence[e]++;
            }
    }
    for (int e = 0; e < E; e++)
        for (size_t a = 0; a < kept.size(); a++)
            if (kept[a] && experts[a] == e) {
                plan.slots[a] = plan.kept_rows++;
                plan.expert_counts[e]++;
            }
    return plan;
}

// The router's loss terms as functions of one row's logits z, with the top-K set held fixed:
//     L(z) = sum_k dw_k w_k(z) + sum_e aux_e p_e(z) + z_scale lse(z)^2
// whose gradient is what moe_router_backward computes (dw: the upstream gradient of the weights, aux: the
// aux loss's gradient of p).
struct RouterRowGradient {
    const int* experts;
    const float* dweights;
    const float* aux;
    int E, K;
    double z_scale;

    double loss(const double* z) const {
        const SoftmaxRow row = softmax_row(z, E);
        double chosen_sum = 0.0, value = z_scale * row.lse * row.lse;
        for (int k = 0; k < K; k++) chosen_sum += row.p[experts[k]];
        for (int k = 0; k < K; k++) value += dweights[k] * row.p[experts[k]] / chosen_sum;
        for (int e = 0; e < E; e++) value += aux[e] * row.p[e];
        return value;
    }
    // dL/dz by the chain rule (spec's formulas); magnitude[i]: the same sums of absolute values, for the
    // tolerance of a computation that rounds each term
    std::vector<double> gradient(const double* z, std::vector<double>* magnitude) const {
        const SoftmaxRow row = softmax_row(z, E);
        double chosen_sum = 0.0, weighted = 0.0, weighted_abs = 0.0;
        for (int k = 0; k < K; k++) chosen_sum += row.p[experts[k]];
        for (int k = 0; k < K; k++) {
            weighted += dweights[k] * row.p[experts[k]] / chosen_sum;
            weighted_abs += std::fabs(dweights[k]) * row.p[experts[k]] / chosen_sum;
        }
        std::vector<double> dp(aux, aux + E), dp_abs(E);
        for (int e = 0; e < E; e++) dp_abs[e] = std::fabs(aux[e]);
        for (int k = 0; k < K; k++) {
            dp[experts[k]] += (dweights[k] - weighted) / chosen_sum;
            dp_abs[experts[k]] += (std::fabs(dweights[k]) + weighted_abs) / chosen_sum;
        }
        double p_dot_dp = 0.0, p_dot_dp_abs = 0.0;
        for (int e = 0; e < E; e++) {
            p_dot_dp += row.p[e] * dp[e];
            p_dot_dp_abs += row.p[e] * dp_abs[e];
        }
        std::vector<double> dz(E);
        magnitude->assign(E, 0.0);
        for (int e = 0; e < E; e++) {
            dz[e] = row.p[e] * (dp[e] - p_dot_dp) + z_scale * 2.0 * row.lse * row.p[e];
            (*magnitude)[e] = row.p[e] * (dp_abs[e] + p_dot_dp_abs + std::fabs(z_scale * 2.0 * row.lse));
        }
        return dz;
    }
};

// ----------------------------------------------------------------------------
// one case through the whole chain

inline void check(const Case& c) {
    const int B = c.B, T = c.T, E = c.E, K = c.K, C = c.C, N = B * T;
    const std::string shape = c.name();
    const MoeShape sizes{B, T, T, E, K, C};

    // router forward
    const std::vector<float> logits = make_logits(c);
    const RouterReference router = reference_router(logits, N, E, K);
    DeviceBuffer<floatX> d_logits(logits.size());
    DeviceBuffer<float> d_probs((size_t)N * E), d_lse(N), d_weights((size_t)N * K);
    DeviceBuffer<int> d_experts((size_t)N * K);
    d_logits.upload(logits);
    d_probs.poison(), d_lse.poison(), d_weights.poison(), d_experts.poison();
    MoeRouting routing;
    routing.probs = d_probs.ptr, routing.lse = d_lse.ptr, routing.experts = d_experts.ptr, routing.weights = d_weights.ptr;
    moe_router_forward(routing, d_logits.ptr, sizes, 0);
    cudaCheck(cudaDeviceSynchronize());
    // fp32 in both builds, from the same logits. p: z - m is exact (multiples of 1/8), expf within 2 ulp,
    // S a sum of positive terms over at most 8 + 5 additions (a lane's, then the warp's), one division:
    // under 16 ulp, so 32 * 2^-24. lse: m + log S with S off by 13 ulp: ~1e-6 absolute, plus an ulp of lse.
    // w = p / s, s a sum of K such p: (32 + K) ulp.
    const std::vector<float> probs = d_probs.download(), lse = d_lse.download(), weights = d_weights.download();
    check_close("moe_router_forward probs" + shape, probs, router.probs, 0.0, 32 * kUnit);
    check_close("moe_router_forward lse" + shape, lse, router.lse, 2e-6, 4 * kUnit);
    check_equal("moe_router_forward experts (top-K, ties by index)" + shape, download_ints(d_experts),
                router.experts);
    check_close("moe_router_forward weights" + shape, weights, router.weights, 0.0, (32 + K) * kUnit);
    d_experts.upload(router.experts);  // what follows is checked on its own, whatever the router did

    // dispatch plan
    const PlanReference plan = reference_plan(router.experts, B, T, K, E, c.capacity);
    DeviceBuffer<int> d_slots((size_t)N * K), d_expert_counts(E), d_routed((size_t)B * E);
    d_slots.poison(), d_expert_counts.poison(), d_routed.poison();
    routing.slots = d_slots.ptr, routing.routed_counts = d_routed.ptr;
    moe_dispatch_plan(routing, d_expert_counts.ptr, sizes, c.capacity, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_equal("moe_dispatch_plan slots" + shape, download_ints(d_slots), plan.slots);
    check_equal("moe_dispatch_plan expert_counts" + shape, download_ints(d_expert_counts), plan.expert_counts);
    check_equal("moe_dispatch_plan routed_counts" + shape, download_ints(d_routed), plan.routed_counts);
    if (c.capacity > 0) {  // in two halves, with part of each sequence's capacity spent by pieces before it
        const std::vector<int> spent = random_ints((size_t)B * E, 0, c.capacity + 2);
        std::vector<int> left(spent.size());
        for (size_t i = 0; i < left.size(); i++) left[i] = std::max(0, c.capacity - spent[i]);
        const PlanReference pieces = reference_plan(router.experts, B, T, K, E, c.capacity, spent);
        DeviceBuffer<int> d_left(left.size());
        d_left.upload(left);
        d_slots.poison(), d_expert_counts.poison(), d_routed.poison();
        moe_count_routed(routing, sizes, 0);
        moe_place_assignments(routing, d_expert_counts.ptr, sizes, c.capacity, d_left.ptr, 0);
        cudaCheck(cudaDeviceSynchronize());
        check_equal("moe_place_assignments slots, capacity partly spent" + shape, download_ints(d_slots), pieces.slots);
        check_equal("moe_place_assignments expert_counts, capacity partly spent" + shape,
                    download_ints(d_expert_counts), pieces.expert_counts);
        check_equal("moe_place_assignments routed_counts, capacity partly spent" + shape, download_ints(d_routed),
                    pieces.routed_counts);
    }
    d_slots.upload(plan.slots);
    d_routed.upload(plan.routed_counts);

    // permute: exactly the kept rows, each once (the buffer has no row to spare: ASan sees a stray write)
    const size_t rows = plan.kept_rows;
    const std::vector<float> h = round_to_floatX(random_floats((size_t)N * C));
    DeviceBuffer<floatX> d_h(h.size()), d_permuted(rows * C);
    d_h.upload(h);
    d_permuted.poison();
    moe_permute_forward(d_permuted.ptr, d_h.ptr, routing, sizes, 0);
    cudaCheck(cudaDeviceSynchronize());
    std::vector<double> permuted_ref(rows * C);
    for (size_t a = 0; a < plan.slots.size(); a++)
        if (plan.slots[a] >= 0)
            for (int j = 0; j < C; j++) permuted_ref[(size_t)plan.slots[a] * C + j] = h[a / K * C + j];
    // copies: the same bits
    check_close("moe_permute_forward" + shape, d_permuted.download(), permuted_ref, 0.0, 0.0);

    // The gathers below add up to K terms in fp32, in order: at most K ulp of the sum of their magnitudes
    // (products rounded once more in FP32). BF16 rounds the result to 8 mantissa bits: 2^-9 relative (2^-8 for
    // margin). A row whose assignments were all dropped must be exactly 0.
    const double gather_rtol = by_precision(0.0, 1.0 / 256);
    const std::vector<float> dpermuted = round_to_floatX(random_floats(rows * C));
    const std::vector<float> y = round_to_floatX(random_floats(rows * C));
    std::vector<double> dh_ref((size_t)N * C, 0.0), dh_allowance((size_t)N * C, 0.0);
    std::vector<double> out_ref((size_t)N * C, 0.0), out_allowance((size_t)N * C, 0.0);
    for (size_t a = 0; a < plan.slots.size(); a++) {
        if (plan.slots[a] < 0) continue;
        for (int j = 0; j < C; j++) {
            const size_t at = a / K * C + j, from = (size_t)plan.slots[a] * C + j;
            dh_ref[at] += dpermuted[from];
            dh_allowance[at] += K * kUnit * std::fabs(dpermuted[from]);
            out_ref[at] += (double)weights[a] * y[from];
            out_allowance[at] += (K + 1) * kUnit * std::fabs((double)weights[a] * y[from]);
        }
    }
    DeviceBuffer<floatX> d_dpermuted(dpermuted.size()), d_y(y.size()), d_dh(dh_ref.size()), d_out(out_ref.size());
    d_dpermuted.upload(dpermuted);
    d_y.upload(y);
    d_dh.poison(), d_out.poison();
    moe_permute_backward(d_dh.ptr, d_dpermuted.ptr, routing, sizes, 0);
    moe_unpermute_forward(d_out.ptr, d_y.ptr, routing, sizes, 0);
    cudaCheck(cudaDeviceSynchronize());
    check_close("moe_permute_backward dinp" + shape, d_dh.download(), dh_ref, 0.0, gather_rtol, dh_allowance);
    check_close("moe_unpermute_forward out" + shape, d_out.download(), out_ref, 0.0, gather_rtol, out_allowance);

    // unpermute backward
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)N * C));
    std::vector<double> dy_ref(rows * C), dweights_ref((size_t)N * K, 0.0), dweights_allowance((size_t)N * K, 0.0);
    for (size_t a = 0; a < plan.slots.size(); a++) {
        if (plan.slots[a] < 0) continue;
        for (int j = 0; j < C; j++) {
            const double d = dout[a / K * C + j], yj = y[(size_t)plan.slots[a] * C + j];
            dy_ref[(size_t)plan.slots[a] * C + j] = weights[a] * d;
            dweights_ref[a] += d * yj;
            // a lane adds C/32 products, then 5 rounds of the warp's tree, each product rounded in FP32
            dweights_allowance[a] += (C / 32.0 + 6) * kUnit * std::fabs(d * yj);
        }
    }
    DeviceBuffer<floatX> d_dout(dout.size()), d_dy(dy_ref.size());
    DeviceBuffer<float> d_dweights((size_t)N * K);
    d_dout.upload(dout);
    d_dy.poison(), d_dweights.poison();
    routing.dweights = d_dweights.ptr;
    moe_unpermute_backward(d_dy.ptr, d_dout.ptr, d_y.ptr, routing, sizes, 0);
    cudaCheck(cudaDeviceSynchronize());
    // dy: one fp32 product, rounded once (FP32: half an ulp; BF16: to 8 mantissa bits, 2^-8 with margin);
    // dweights: fp32 in both builds, 0 where dropped
    check_close("moe_unpermute_backward dexpert_out" + shape, d_dy.download(), dy_ref, 0.0,
                by_precision(kUnit, 1.0 / 256));
    check_close("moe_unpermute_backward dweights" + shape, d_dweights.download(), dweights_ref, 0.0, 0.0,
                dweights_allowance);

    // the losses: accumulated onto values already there. Sequences of S = T positions, and of S = 3T where this
    // rank holds T of each (context parallelism: the counts are the whole sequence's, P a part of its mean)
    for (const int S : {T, 3 * T}) {
        const std::string of = shape + (S == T ? "" : " S=3T");
        const float aux_start = 0.5f, z_start = 0.25f;
        double aux_ref = 0.0, z_ref = 0.0;
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++) {
                const double f = (double)plan.routed_counts[(size_t)b * E + e] / ((double)S * K);
                double P = 0.0;
                for (int t = 0; t < T; t++) P += probs[((size_t)b * T + t) * E + e];
                aux_ref += E * f * (P / S);
            }
        for (int n = 0; n < N; n++) z_ref += (double)lse[n] * lse[n];
        DeviceBuffer<float> d_aux(1), d_z(1);
        d_aux.upload(std::vector<float>{aux_start});
        d_z.upload(std::vector<float>{z_start});
        const MoeShape of_S{B, T, S, E, K, C};
        moe_aux_loss_forward(d_aux.ptr, d_z.ptr, routing, of_S, 0);
        cudaCheck(cudaDeviceSynchronize());
        // fp32 sums of non-negative terms: a thread adds its share (N E / 1024 products, N / 1024 squares), the
        // block's tree 10 rounds more, then the scaling and the += a few roundings: that many ulp of the result
        const double aux_ulps = std::ceil((double)N * E / MOE_AUX_BLOCK_SIZE) + 16;
        const double z_ulps = std::ceil((double)N / MOE_AUX_BLOCK_SIZE) + 16;
        check_close("moe_aux_loss_forward aux_sum (+=)" + of, d_aux.download(), {aux_start + aux_ref}, 0.0,
                    aux_ulps * kUnit);
        check_close("moe_aux_loss_forward z_sum (+=)" + of, d_z.download(), {z_start + z_ref}, 0.0, z_ulps * kUnit);

        const float aux_scale = 0.01f / B;
        std::vector<double> daux_ref((size_t)N * E);
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++) {
                const double f = (double)plan.routed_counts[(size_t)(n / T) * E + e] / ((double)S * K);
                daux_ref[(size_t)n * E + e] = (double)aux_scale * E * f / S;
            }
        DeviceBuffer<float> d_dprobs((size_t)N * E);
        d_dprobs.poison();
        MoeRouting with_dprobs = routing;
        with_dprobs.dprobs = d_dprobs.ptr;
        moe_aux_loss_backward(with_dprobs, of_S, aux_scale, 0);
        cudaCheck(cudaDeviceSynchronize());
        // four fp32 roundings (S K, /, E, /S) of exact integers and aux_scale
        check_close("moe_aux_loss_backward dprobs" + of, d_dprobs.download(), daux_ref, 0.0, 8 * kUnit);
    }

    // router backward, from the router forward's own outputs (as in training) and an aux part of any size
    const std::vector<float> aux_part = random_floats((size_t)N * E, -1.0f, 1.0f);
    const std::vector<float> dweights = random_floats((size_t)N * K, -1.0f, 1.0f);
    const float z_scale = 0.05f;
    std::vector<double> dlogits_ref, dlogits_allowance;
    for (int n = 0; n < N; n++) {
        const std::vector<double> z(logits.begin() + (size_t)n * E, logits.begin() + (size_t)(n + 1) * E);
        const RouterRowGradient row{&router.experts[(size_t)n * K], &dweights[(size_t)n * K],
                                    &aux_part[(size_t)n * E], E, K, z_scale};
        std::vector<double> magnitude;
        const std::vector<double> dz = row.gradient(z.data(), &magnitude);
        dlogits_ref.insert(dlogits_ref.end(), dz.begin(), dz.end());
        // the kernel's p, s and w are off by the forward's (32 + K) ulp; its few fp32 operations on top add
        // ulps of the terms' magnitudes
        for (double m : magnitude) dlogits_allowance.push_back((64 + 2 * K) * kUnit * m);
    }
    DeviceBuffer<float> d_aux_part(aux_part.size()), d_dweights_in(dweights.size());
    DeviceBuffer<floatX> d_dlogits((size_t)N * E);
    d_aux_part.upload(aux_part);
    d_dweights_in.upload(dweights);
    d_dlogits.poison();
    MoeRouting gradients = routing;
    gradients.dprobs = d_aux_part.ptr, gradients.dweights = d_dweights_in.ptr;
    moe_router_backward(d_dlogits.ptr, gradients, sizes, z_scale, 0);
    cudaCheck(cudaDeviceSynchronize());
    // BF16: dlogits rounded to 8 mantissa bits (2^-8 with margin) on top
    check_close("moe_router_backward dlogits" + shape, d_dlogits.download(), dlogits_ref, 0.0,
                by_precision(0.0, 1.0 / 256), dlogits_allowance);
}

// The reference router backward against central differences of the loss it differentiates, in double: the
// kernel is checked against the chain rule, and this checks the chain rule.
inline void check_reference_gradient(int E, int K) {
    const std::vector<float> logits = random_floats(E, -3.0f, 3.0f);
    const std::vector<double> z(logits.begin(), logits.end());
    const std::vector<int> experts = top_k(softmax_row(z.data(), E).p, K);
    const std::vector<float> dweights = random_floats(K), aux = random_floats(E);
    const RouterRowGradient row{experts.data(), dweights.data(), aux.data(), E, K, 0.05};
    std::vector<double> magnitude;
    const std::vector<double> gradient = row.gradient(z.data(), &magnitude);
    // step 1e-5: truncation ~1e-10 times the third derivative, cancellation ~1e-16 / 1e-5
    double worst = 0.0;
    for (int i = 0; i < E; i++) {
        std::vector<double> up = z, down = z;
        up[i] += 1e-5;
        down[i] -= 1e-5;
        const double numeric = (row.loss(up.data()) - row.loss(down.data())) / 2e-5;
        worst = std::max(worst, std::fabs(numeric - gradient[i]));
    }
    char detail[64];
    snprintf(detail, sizeof(detail), "worst |difference| %.1e", worst);
    check_true("moe reference router gradient = central differences E=" + std::to_string(E) + " K=" +
                   std::to_string(K),
               worst < 1e-8, detail);
}

// moe_scale: each value times the factor in fp32, rounded once to floatX; a count no block size divides
inline void check_scale() {
    for (float factor : {0.5f, 1.0f / 3.0f}) {
        const std::vector<float> values = round_to_floatX(random_floats(12345, -4.0f, 4.0f));
        std::vector<double> ref(values.size());
        for (size_t i = 0; i < values.size(); i++) ref[i] = (double)(float)(floatX)(values[i] * factor);
        DeviceBuffer<floatX> d_values(values.size());
        d_values.upload(values);
        moe_scale(d_values.ptr, factor, values.size(), 0);
        cudaCheck(cudaDeviceSynchronize());
        check_close("moe_scale by " + std::to_string(factor), d_values.download(), ref, 0.0, 0.0);
    }
}

inline void check_bad_input() {
    expect_failure("moe_router_forward refuses E > 256",
                   [] { moe_router_forward(MoeRouting{}, nullptr, MoeShape{4, 1, 1, 257, 2, 0}, 0); },
                   "257 experts");
    expect_failure("moe_router_forward refuses K > E",
                   [] { moe_router_forward(MoeRouting{}, nullptr, MoeShape{4, 1, 1, 4, 5, 0}, 0); },
                   "5 experts per token out of 4");
    expect_failure("moe_dispatch_plan refuses K = 0",
                   [] { moe_dispatch_plan(MoeRouting{}, nullptr, MoeShape{2, 3, 3, 4, 0, 0}, 0, 0); },
                   "0 experts per token");
    expect_failure("moe_permute_forward refuses C off 16 bytes",
                   [] { moe_permute_forward(nullptr, nullptr, MoeRouting{}, MoeShape{4, 1, 1, 2, 2, x128::size + 1}, 0); },
                   "C = " + std::to_string(x128::size + 1));
}

inline void bench(int B, int T, int E, int K, int C, const std::string& note) {
    const int N = B * T;
    const std::string shape = " N=" + std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                              " C=" + std::to_string(C) + note;
    DeviceBuffer<floatX> d_logits((size_t)N * E), d_dlogits((size_t)N * E), d_h((size_t)N * C),
        d_permuted((size_t)N * K * C), d_dpermuted((size_t)N * K * C), d_out((size_t)N * C);
    DeviceBuffer<float> d_probs((size_t)N * E), d_dprobs((size_t)N * E), d_lse(N), d_weights((size_t)N * K),
        d_dweights((size_t)N * K), d_scalars(2);
    DeviceBuffer<int> d_experts((size_t)N * K), d_slots((size_t)N * K), d_counts(E), d_routed((size_t)B * E);
    d_logits.upload(round_to_floatX(random_floats((size_t)N * E, -4.0f, 4.0f)));
    d_h.upload(round_to_floatX(random_floats((size_t)N * C)));
    d_permuted.upload(round_to_floatX(random_floats((size_t)N * K * C)));
    d_scalars.zero();
    const MoeShape sizes{B, T, T, E, K, C};
    MoeRouting routing;
    routing.probs = d_probs.ptr, routing.lse = d_lse.ptr, routing.experts = d_experts.ptr, routing.weights = d_weights.ptr;
    routing.slots = d_slots.ptr, routing.routed_counts = d_routed.ptr, routing.dprobs = d_dprobs.ptr;
    routing.dweights = d_dweights.ptr;
    double ms = time_ms([&] {
        moe_router_forward(routing, d_logits.ptr, sizes, 0);
    });
    report_bench("moe_router_forward" + shape, ms, (double)N * E * (sizeof(floatX) + 4) + N * K * 8.0, 0);
    ms = time_ms([&] {
        moe_dispatch_plan(routing, d_counts.ptr, sizes, 0, 0);
    });
    report_bench("moe_dispatch_plan (dropless)" + shape, ms, N * K * 4.0 * 3, 0);
    ms = time_ms([&] { moe_permute_forward(d_permuted.ptr, d_h.ptr, routing, sizes, 0); });
    report_bench("moe_permute_forward" + shape, ms, 2.0 * N * K * C * sizeof(floatX), 0);
    ms = time_ms([&] { moe_unpermute_forward(d_out.ptr, d_permuted.ptr, routing, sizes, 0); });
    report_bench("moe_unpermute_forward" + shape, ms, (double)N * (K + 1) * C * sizeof(floatX), 0);
    ms = time_ms([&] {
        moe_unpermute_backward(d_dpermuted.ptr, d_out.ptr, d_permuted.ptr, routing, sizes, 0);
    });
    report_bench("moe_unpermute_backward" + shape, ms, 3.0 * N * K * C * sizeof(floatX), 0);
    ms = time_ms([&] {
        moe_aux_loss_forward(d_scalars.ptr, d_scalars.ptr + 1, routing, sizes, 0);
    });
    report_bench("moe_aux_loss_forward" + shape, ms, (double)N * E * 4, 0);
    ms = time_ms([&] {
        moe_router_backward(d_dlogits.ptr, routing, sizes, 1e-3f, 0);
    });
    report_bench("moe_router_backward" + shape, ms, (double)N * E * (8 + sizeof(floatX)), 0);
}

}  // namespace moe_lab

void lab_moe() {
    if (!family_selected("moe")) return;
    using moe_lab::Routing;
    const moe_lab::Case cases[] = {
        // rows not a multiple of the 8 rows per block; E a power of two, then not; K = 1, 2, E
        {3, 17, 8, 2, 0, 16, Routing::Random},
        {3, 17, 8, 2, 5, 16, Routing::Random},        // cap = ceil(1.0 T K / E): some drops
        {2, 50, 6, 1, 5, 24, Routing::Random},        // K = 1, cap 60% of a fair share: many drops
        {2, 9, 6, 6, 0, 8, Routing::Random},          // K = E: every expert once per token
        {2, 9, 6, 6, 4, 8, Routing::Random},          // K = E with drops (each expert keeps 4 of 9 tokens)
        {1, 3, 4, 2, 0, 8, Routing::Random},          // fewer assignments than a warp's chunk
        {2, 13, 12, 3, 0, 40, Routing::Wide},         // probabilities down to e^-60
        {2, 11, 7, 3, 0, 16, Routing::AllEqual},      // all ties: experts 0, 1, 2, weights 1/3
        {2, 40, 5, 2, 1, 16, Routing::TwoFavourites}, // each sequence keeps token 0's two; every other row
                                                      // loses both, experts 2..4 get nothing
        {2, 40, 5, 1, 0, 16, Routing::TwoFavourites}, // dropless, one expert takes every token
        {3, 300, 256, 8, 0, 8, Routing::Random},      // 256 experts (index 255: the ballots' 8th bit); 2400
                                                      // assignments a sequence: several chunks per warp
        {3, 300, 256, 8, 2, 8, Routing::Random},
        {1, 2000, 7, 2, 400, 8, Routing::Random},     // one long sequence: 16 chunks per warp, cap ~ 70%
        {2, 5, 32, 16, 0, 64, Routing::Random},       // K = 16
    };
    for (const moe_lab::Case& c : cases) moe_lab::check(c);
    moe_lab::check_reference_gradient(7, 3);
    moe_lab::check_reference_gradient(5, 5);
    moe_lab::check_reference_gradient(9, 1);
    moe_lab::check_scale();
    moe_lab::check_bad_input();
    if (lab.bench) {
#ifdef LLMC_CPU
        moe_lab::bench(2, 256, 8, 2, 768, " (CPU: B*T=512)");
#else
        moe_lab::bench(8, 1024, 64, 8, 768, "");
#endif
    }
}
