/*
Learning-rate schedules: the learning rate to use at optimizer step `step` (0-based) of `total_steps`.

    LearningRateSchedule schedule = make_lr_schedule("cosine", 6e-4f, 700, 19000, 0.1f);  // kind, max lr,
                                                                     // warmup steps, total steps, final fraction
    float lr = schedule.at(step);

Both schedules begin with the same linear warmup over the first W = warmup_steps steps:
    lr(s) = max_lr * (s + 1) / W                      for s < W
so the first step already moves the weights (lr = max_lr / W, not 0) and step W-1 reaches max_lr.
Warmup exists because AdamW's second-moment estimate is noisy during the first steps: full-size updates
then can throw the weights somewhere the loss never recovers from.

"constant": max_lr for every step after the warmup.
"cosine":   after the warmup, half a cosine from max_lr down to max_lr * final_fraction, reached exactly
            at the last step s = total_steps - 1:
                progress = (s - W) / (total_steps - 1 - W)        in [0, 1]
                lr(s)    = min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2,  min_lr = max_lr * final_fraction
            so step W runs at max_lr and the last step at min_lr. With a single step after the warmup
            (total_steps = W + 1) there is nothing to decay over and that step runs at max_lr. Steps past the
            end (a run extended beyond total_steps) stay at min_lr.

The functions are pure (no state), so a resumed run recomputes the same rate from the step number alone.
*/
#pragma once

#include <cmath>
#include <string>
#include <vector>
#include "utils.h"

// The names accepted by make_lr_schedule, e.g. for a choice flag.
inline std::vector<std::string> lr_schedule_names() { return {"cosine", "constant"}; }

inline float warmup_learning_rate(int step, float max_lr, int warmup_steps) {
    return (float)((double)max_lr * (step + 1) / warmup_steps);
}

inline float constant_learning_rate(int step, float max_lr, int warmup_steps) {
    if (step < warmup_steps) return warmup_learning_rate(step, max_lr, warmup_steps);
    return max_lr;
}

inline float cosine_learning_rate(int step, float max_lr, int warmup_steps, int total_steps, float final_fraction) {
    if (step < warmup_steps) return warmup_learning_rate(step, max_lr, warmup_steps);
    double min_lr = (double)max_lr * final_fraction;
    int decay_steps = total_steps - 1 - warmup_steps;  // steps from the first after warmup to the last
    double progress = decay_steps > 0 ? (double)(step - warmup_steps) / decay_steps : 0.0;
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

    float at(int step) const {
        if (kind == "cosine") return cosine_learning_rate(step, max_lr, warmup_steps, total_steps, final_fraction);
        return constant_learning_rate(step, max_lr, warmup_steps);
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
    return LearningRateSchedule{kind, max_lr, warmup_steps, total_steps, final_fraction};
}
