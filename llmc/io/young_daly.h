/*
The checkpoint interval that loses the least time to failures (--checkpoint-every auto), after Young (1974) and
Daly (2006). A job that saves every tau seconds, each save costing C seconds, and fails on average once every M
seconds (its MTBF) loses per second of work about

    C / tau          (the saves)  +  tau / (2 M)      (after a failure, half an interval redone on average)

The sum is least where its derivative -C / tau^2 + 1 / (2 M) is zero:

    tau = sqrt(2 x C x M)

(first order in C / M: it assumes saves much shorter than the MTBF, as they are). In steps: tau over the step time,
rounded, at least 1. Example: C = 30 s, M = 2.8 h = 10080 s: tau = sqrt(2 x 30 x 10080) = 777.7 s, at 2 s a step
every 389 steps.
*/
#pragma once

#include <algorithm>
#include <cmath>

struct CheckpointInterval {
    double save_seconds = 0, mtbf_seconds = 0, step_seconds = 0;
    double interval_seconds = 0;  // sqrt(2 C M)
    int steps = 0;                // interval_seconds / step_seconds, rounded, at least 1
};

inline CheckpointInterval young_daly_interval(double save_seconds, double mtbf_hours, double step_seconds) {
    CheckpointInterval interval;
    interval.save_seconds = save_seconds, interval.mtbf_seconds = mtbf_hours * 3600.0;
    interval.step_seconds = step_seconds;
    interval.interval_seconds = std::sqrt(2.0 * save_seconds * interval.mtbf_seconds);
    const double steps = interval.interval_seconds / std::max(step_seconds, 1e-9);
    interval.steps = (int)std::clamp(std::llround(steps), 1LL, 1LL << 30);
    return interval;
}
