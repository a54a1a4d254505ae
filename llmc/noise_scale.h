/*
The gradient noise scale (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training",
appendix A), measured every step from two gradient norms the step already has at hand.

The loss gradient of one token is a random vector with mean G (the true gradient) and covariance Sigma. The mean
gradient of a batch of B tokens then has E[|G_B|^2] = |G|^2 + tr(Sigma) / B. The simple noise scale

    B_simple = tr(Sigma) / |G|^2                                               (in tokens)

is the batch at which the noise in the batch gradient is as large as the gradient itself: well below it, doubling
the batch nearly halves the steps; well above it, more tokens per step save almost no steps. The paper finds the
critical batch size close to it.

Two batches of known sizes, B_small < B_big, with squared gradient norms |G_small|^2 and |G_big|^2, give unbiased
estimates of both terms (two equations, two unknowns):

    |G|^2     ~  (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~  (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

Here the small batch is the step's first microbatch on each data-parallel rank (B_small = batch_size x seq_len
tokens), its gradient squared as soon as it is complete and before the next microbatch adds to it, the squares
averaged over the data-parallel ranks (each measured its own microbatch: a better estimate of E|G_small|^2); the
big batch is the step's averaged gradient (B_big = the step's tokens), whose squared norm clipping needs anyway.
Where measured: llmc/parallel/zero.h's zero_small_batch_norm, llmc/parallel/parallel_context.h's gradient_norm.
Where a microbatch's gradient is not whole on one rank when its backward pass completes a chunk, or a later
microbatch can add to a chunk first, the run is refused (noise_scale_layout_error below).
The gradient buffer holds a microbatch's gradient divided by the step's m microbatches (the loss is the mean over
the step's rows), so the trainer multiplies the measured square by m^2 before it comes here.
Cost: two small kernel launches per parameter chunk of the first microbatch (a few more on a tp rank that leaves
replicated tensors out), one more float in the tp, ep and pp sums of the squared norm, and one scalar all-reduce
over the data-parallel ranks; no extra copy to the host (the step's one read carries it); none of it when off.

Each step's two estimates are noisy (the estimate of |G|^2 can even come out negative), and their ratio is a
biased estimate of B_simple; so, as the paper advises, each is smoothed on its own by an exponential moving
average of decay beta, and B_simple is the ratio of the two averages:

    ema_t = beta ema_{t-1} + (1 - beta) x_t,   ema_0 = 0,   smoothed_t = ema_t / (1 - beta^t)

(Adam's bias correction: an average that starts at 0 is divided by the weight its terms have so far, so the first
steps' smoothed values are plain means rather than values pulled towards 0; in B_simple the two corrections cancel.)
With beta = 0.95 an estimate averages about the last 20 steps, which steadies it while following the training's
drift. The state (two averages and a count) goes into checkpoints, so a resumed run logs what an uninterrupted one
would.
*/
#pragma once

#include <cmath>
#include <string>
#include "parallel/layout.h"

// What the exponential moving averages hold after `updates` steps (the checkpoint stores it as it is).
struct NoiseScaleState {
    double grad_squared_ema = 0.0;  // of the |G|^2 estimates
    double trace_ema = 0.0;         // of the tr(Sigma) estimates
    long long updates = 0;
};

// One step's measurement: the inputs, that step's unbiased estimates, and the smoothed ones.
struct NoiseScaleMeasurement {
    long long step = 0;
    double small_tokens = 0, big_tokens = 0;             // B_small, B_big
    double small_norm_squared = 0, big_norm_squared = 0; // |G_small|^2, |G_big|^2
    double grad_squared = 0, trace = 0;                  // this step's estimates of |G|^2 and tr(Sigma)
    double grad_squared_smoothed = 0, trace_smoothed = 0;
    double b_simple = NAN;                               // NaN while the smoothed |G|^2 is not positive
};

// Adds one step's norms to the averages and returns the step's measurement. A step whose small batch is its whole
// batch (B_small >= B_big: noise_scale_layout_error refuses such a run, but a batch ramp's phase may be one) says
// nothing about the noise: its estimates are NaN (null in the log) and the averages stay as they were.
inline NoiseScaleMeasurement noise_scale_update(NoiseScaleState& state, double decay, long long step,
                                                double small_tokens, double big_tokens, double small_norm_squared,
                                                double big_norm_squared) {
    NoiseScaleMeasurement m;
    m.step = step;
    m.small_tokens = small_tokens, m.big_tokens = big_tokens;
    m.small_norm_squared = small_norm_squared, m.big_norm_squared = big_norm_squared;
    if (small_tokens >= big_tokens) {
        m.grad_squared = m.trace = m.grad_squared_smoothed = m.trace_smoothed = NAN;
        return m;
    }
    m.grad_squared = (big_tokens * big_norm_squared - small_tokens * small_norm_squared) / (big_tokens - small_tokens);
    m.trace = (small_norm_squared - big_norm_squared) / (1.0 / small_tokens - 1.0 / big_tokens);
    state.grad_squared_ema = decay * state.grad_squared_ema + (1.0 - decay) * m.grad_squared;
    state.trace_ema = decay * state.trace_ema + (1.0 - decay) * m.trace;
    state.updates++;
    const double weight = 1.0 - std::pow(decay, (double)state.updates);  // of the terms so far: the bias correction
    m.grad_squared_smoothed = state.grad_squared_ema / weight;
    m.trace_smoothed = state.trace_ema / weight;
    if (state.grad_squared_ema > 0.0) m.b_simple = state.trace_ema / state.grad_squared_ema;
    return m;
}

// Why this run cannot measure the noise scale ("": it can). The small batch must be one microbatch's whole
// gradient on one rank at the moment its backward pass completes it, and smaller than the step's batch.
inline std::string noise_scale_layout_error(const Layout& l, bool tied_head, bool mixture_of_experts,
                                            int data_parallel, int microbatches) {
    const std::string flag = "--noise-scale";
    if (l.cp > 1)
        return flag + " with --cp " + std::to_string(l.cp) + ": each cp rank holds a share of a microbatch's "
               "gradient (its positions) until the step's reduction, so no rank has a microbatch's whole gradient";
    if (l.ep > 1)
        return flag + " with --ep " + std::to_string(l.ep) + ": the experts' gradients of a microbatch are spread "
               "over the ep group's ranks, so no rank has a microbatch's whole gradient";
    if (l.tp > 1 && (l.sequence_parallel || mixture_of_experts) && l.zero_stage < 2)
        return flag + " with --tp " + std::to_string(l.tp) + (l.sequence_parallel ? " and --sequence-parallel" : "") +
               " at --zero " + std::to_string(l.zero_stage) + ": a microbatch's " +
               (l.sequence_parallel ? "layernorm" : "router and expert") + " gradients are partial sums over the tp "
               "ranks until the step's last microbatch (--zero 2 or 3 sums them after every microbatch)";
    if (l.pp > 1 && tied_head)
        return flag + " with --pp " + std::to_string(l.pp) + " and GPT-2's tied embeddings: a microbatch's wte "
               "gradient is split between the first and the last stage until the step's sum (under zbv, on one rank, "
               "a later microbatch's lookup share can come before microbatch 0's head share); --arch llama has an "
               "untied head";
    if (l.pp > 1 && pipeline_splits_backward(l.schedule))
        return flag + " with --pp-schedule " + pipeline_schedule_name(l.schedule) + ": the final norm's weight "
               "gradient of a later microbatch (its B pass) can be added to the last chunk before microbatch 0's W "
               "pass completes that chunk; use 1f1b, gpipe or interleaved";
    if (data_parallel * microbatches == 1)
        return flag + " with one microbatch per step on one data-parallel rank: the small batch (a microbatch) is "
               "the whole step's batch, so there is nothing to compare; raise --total-batch-size";
    return "";
}
