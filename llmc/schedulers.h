/*
Learning-rate schedules: the learning rate to use at optimizer step `step` (0-based) of `total_steps`, drawn on
the axis of tokens seen, so that a run whose batch changes (a batch ramp, llmc/batch_ramp.h) and a run of a
fixed batch that see the same tokens decay alike.

    LearningRateSchedule schedule = make_lr_schedule("cosine", 6e-4f, 700, 19000, 0.1f);  // kind, max lr,
                                                                     // warmup steps, total steps, final fraction
    schedule.ramp = ramp;                 // the run's batch per step (default: a fixed batch)
    float lr = schedule.at(step);

The token axis. For step s: t = tokens seen before it, b = its tokens (llmc/batch_ramp.h), W = warmup_steps,
t_W = tokens seen after W steps, t_last = tokens seen before the last step (s = total_steps - 1).

Both schedules begin with the same linear warmup:
    lr(s) = max_lr * (t + b) / t_W                    while t < t_W
so the first step already moves the weights (lr = max_lr b / t_W, not 0) and step W-1 reaches max_lr.
Warmup exists because AdamW's second-moment estimate is noisy during the first steps: full-size updates
then can throw the weights somewhere the loss never recovers from.

"constant": max_lr for every step after the warmup.
"cosine":   after the warmup, half a cosine from max_lr down to max_lr * final_fraction, reached exactly
            at the last step:
                progress = (t - t_W) / (t_last - t_W)        in [0, 1]
                lr(s)    = min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2,  min_lr = max_lr * final_fraction
            so the first step after the warmup runs at max_lr and the last step at min_lr. With a single step
            after the warmup (t_last = t_W) there is nothing to decay over and that step runs at max_lr. Steps
            past the end (a run extended beyond total_steps) stay at min_lr.

A fixed batch B gives exactly the step formulas, bit for bit: t = s B, b = B, t_W = W B, t_last = (total - 1) B.
The progress is the quotient of (s - W) B and (total - 1 - W) B, two integers that doubles hold exactly (below
2^53), so their correctly rounded quotient is that of s - W and total - 1 - W. The warmup's fraction (t + b) / t_W
is first reduced by the two integers' greatest common divisor, then max_lr times the numerator (exact: max_lr
has 24 significant bits, a reduced fixed-batch numerator divides s + 1) is divided by the denominator: one
rounding of the same real number max_lr (s + 1) / W as the step formula. dev/test/test_host.cu compares the two
bit for bit.

The functions are pure (no state), so a resumed run recomputes the same rate from the step number alone.
*/
#pragma once

#include <cmath>
#include <numeric>
#include <string>
#include <vector>
#include "utils.h"
#include "batch_ramp.h"

// The names accepted by make_lr_schedule, e.g. for a choice flag.
inline std::vector<std::string> lr_schedule_names() { return {"cosine", "constant"}; }

// lr at `tokens_seen` + `step_tokens` of `warmup_tokens`: the reduced fraction's numerator times max_lr, divided
// by its denominator (the header: one rounding, as the step formula's).
inline float warmup_learning_rate(long long tokens_seen, long long step_tokens, float max_lr, long long warmup_tokens) {
    const long long reached = tokens_seen + step_tokens, divisor = std::gcd(reached, warmup_tokens);
    return (float)((double)max_lr * (double)(reached / divisor) / (double)(warmup_tokens / divisor));
}

inline float constant_learning_rate(long long tokens_seen, long long step_tokens, float max_lr, long long warmup_tokens) {
    if (tokens_seen < warmup_tokens) return warmup_learning_rate(tokens_seen, step_tokens, max_lr, warmup_tokens);
    return max_lr;
}

inline float cosine_learning_rate(long long tokens_seen, long long step_tokens, float max_lr, long long warmup_tokens,
                                  long long last_step_tokens_seen, float final_fraction) {
    if (tokens_seen < warmup_tokens) return warmup_learning_rate(tokens_seen, step_tokens, max_lr, warmup_tokens);
    double min_lr = (double)max_lr * final_fraction;
    const long long decay_tokens = last_step_tokens_seen - warmup_tokens;  // from the first step after warmup to the last
    double progress = decay_tokens > 0 ? (double)(tokens_seen - warmup_tokens) / (double)decay_tokens : 0.0;
    if (progress > 1.0) progress = 1.0;
    const double pi = 3.14159265358979323846;
    return (float)(min_lr + (max_lr - min_lr) * 0.5 * (1.0 + cos(pi * progress)));
}

struct LearningRateSchedule {
    std::string kind;      // "cosine" or "constant"
    float max_lr;
    int warmup_steps;
    int total_steps;
    float final_fraction;  // cosine only: the last step runs at max_lr * final_fraction
    BatchRamp ramp = batch_ramp_fixed(1);  // the token axis (any fixed batch draws the same schedule)

    float at(int step) const {
        const long long seen = batch_ramp_tokens_after(ramp, step);
        const long long tokens = batch_ramp_phase(ramp, seen).tokens;
        const long long warmup_tokens = batch_ramp_tokens_after(ramp, warmup_steps);
        if (kind == "cosine")
            return cosine_learning_rate(seen, tokens, max_lr, warmup_tokens, batch_ramp_tokens_after(ramp, total_steps - 1),
                                        final_fraction);
        return constant_learning_rate(seen, tokens, max_lr, warmup_tokens);
    }
};

// Checks the arguments once, so that at() never has to.
inline LearningRateSchedule make_lr_schedule(const std::string& kind, float max_lr, int warmup_steps,
                                             int total_steps, float final_fraction) {
    if (kind != "cosine" && kind != "constant")
        fatal("unknown learning-rate schedule '%s' (known: cosine, constant)", kind.c_str());
    if (!(max_lr >= 0.0f) || !std::isfinite(max_lr)) fatal("learning rate must be a finite number >= 0, got %g", max_lr);
    if (total_steps < 1) fatal("learning-rate schedule needs at least 1 step, got %d", total_steps);
    if (warmup_steps < 0) fatal("warmup steps must be >= 0, got %d", warmup_steps);
    if (!(final_fraction >= 0.0f && final_fraction <= 1.0f))
        fatal("final learning-rate fraction must be between 0 and 1, got %g", final_fraction);
    return LearningRateSchedule{kind, max_lr, warmup_steps, total_steps, final_fraction, batch_ramp_fixed(1)};
}
