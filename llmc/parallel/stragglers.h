/*
Stragglers named. In a synchronous job every rank waits for the slowest at each collective, so one slow GPU
(throttled, a bad link, a noisy neighbour on its host) slows the whole job, and every rank's step time shows
the same slowness. What tells the straggler apart is the time it spends computing rather than waiting: each
rank measures its own compute per step, the ranks exchange those numbers, and the main rank names a rank whose
compute stays above --straggler-factor times the median of the others' for --straggler-steps steps in a row.

    StragglerWatch watch = straggler_watch(options.straggler_factor, options.straggler_steps, par.world.size);
    ComputeClock clock;                               // where the step begins
    ... the step ...
    straggler_step(watch, par.world, clock.seconds(), step + 1, logger, stream);   // a collective when on

What "compute" is: the step's time (from before its batch is loaded to the device's end of it, as the step
line's ms) less the time this rank spent inside the communication layer's waits, the brackets
llmc/parallel/watchdog.h's CollectiveWait and HostCallWait put around every host call that can block (the same
ones the watchdog reads; waits_clock_start turns their clock on).
  CPU build: every collective, send and receive is an MPI call inside such a bracket, and the time is the
    process's CPU time (watchdog.h's waits_clock_seconds; all its threads, OpenMP's workers too), so the
    measure is the CPU time spent on its own kernels, copies and bookkeeping: what a slower rank takes longer
    to do. Wall time would not do there:
    ranks share cores (tests run 4 ranks on 2), so a rank's wall time counts the time others held its core,
    and ranks that arrive early at a collective poll in MPI, taking the CPU from the late ones. Measured on
    4 ranks on 2 cores (a tiny model, ~14 ms a step): wall time less waits put a healthy rank at up to 1.56x
    the others' median and a rank slowed 2x at 0.7x-2.4x; CPU time less waits, at most 1.2x and 1.8x-1.9x.
    MPI's polling costs CPU time too, and the brackets take it out.
  GPU build: wall time. NCCL's calls only enqueue work (the brackets cover those host calls, and the rare
    ones that block: a link's first use, a group's end), and the host waits for the device in the step's one read of
    the loss and in the final synchronisation, which are not brackets: a wait on the device cannot tell this
    GPU's kernels from its NCCL kernels waiting for a peer. So there the measure is the host's wall time less
    its blocking NCCL calls, and it names a rank whose HOST is slow (data loading, a starved CPU, a slow file
    system); a GPU that is slow by itself makes every rank's measure grow alike. Timing each rank's compute
    kernels on the device (events around the passes, without the collectives' kernels) would see that, at
    the price of events per pass; this file does not.
Time spent elsewhere in the loop (validation, samples, checkpoints) is outside the step and not counted.

The exchange: one all-gather of one 64-bit word per rank on the world (the seconds as a double's bits, which
all_gather_words moves exactly), after the step's measure, only with --straggler-factor above 0: without it
the run has no extra collective, and reading the clock twice a step is all it costs. The decision is the
main rank's: for each rank the median of the OTHER ranks' compute (with one other rank, its compute), so the
straggler does not raise the yardstick it is measured against; a rank above factor x that median for `steps` steps in a row gets one line
"warning: straggler: rank 2 computed 2.03x the median for 3 steps (step 7)" (the ratio: the mean over those
steps) on stdout and one event in log.jsonl (Logger::straggler):
    {"event": "straggler", "step": 7, "rank": 2, "ratio": 2.03, "steps": 3, "compute_ms": 41.2, "median_ms": 20.3}
A streak is named once; a step below the factor ends it, and a new streak is named again. One rank alone has
no others to compare with: nothing is exchanged.
*/
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#include "comm.h"
#include "watchdog.h"
#include "../io/logger.h"

// One step's compute on this rank: the time since construction less the waits since then, both on the
// waits' clock (CPU time on the CPU build, wall time on the GPU build).
struct ComputeClock {
    double start = watchdog::waits_clock_seconds();
    double waited_at_start = waited_seconds();
    double seconds() const { return elapsed() - (waited_seconds() - waited_at_start); }
    double elapsed() const { return watchdog::waits_clock_seconds() - start; }  // waits included
};

// The tests' straggler (LLMC_FAULT_SLOW, llmc/cpu/faults.h): this rank's clock so far in the step, run FACTOR
// times over, busy as a slower device would be (a sleep would not be compute on the CPU's clock). The clock with
// its waits: the waits are wall time taken from the CPU's clock, so under load they can exceed it and leave
// nothing to repeat.
inline void straggle_if_injected(int world_rank, const ComputeClock& clock) {
    const double factor = fault_slow_factor(world_rank);
    if (factor <= 1.0) return;
    const double until = factor * clock.elapsed();
    while (clock.elapsed() < until) {}
}

// A rank named: over `steps` steps up to `step`, its compute was `ratio` (their mean) times the others' median.
struct StragglerNotice {
    int rank = 0, steps = 0;
    long long step = 0;
    double ratio = 0.0, compute_seconds = 0.0, median_seconds = 0.0;  // the last step's
};

struct StragglerWatch {
    double factor = 0.0;  // 0: off
    int steps = 3;
    std::vector<int> streak;          // per world rank: consecutive steps above factor x the others' median
    std::vector<double> ratio_total;  // the sum of the streak's ratios
};

// Turns the waits' clock on when the watch is on (and there are others to compare with).
inline StragglerWatch straggler_watch(double factor, int steps, int ranks) {
    StragglerWatch watch;
    watch.factor = ranks > 1 ? factor : 0.0;
    watch.steps = steps;
    watch.streak.assign(ranks, 0);
    watch.ratio_total.assign(ranks, 0.0);
    if (watch.factor > 0.0) waits_clock_start();
    return watch;
}

// The median of every rank's compute but `rank`'s (the mean of the middle two for an even count).
inline double median_of_others(const std::vector<double>& seconds, int rank) {
    std::vector<double> others;
    for (int r = 0; r < (int)seconds.size(); r++)
        if (r != rank) others.push_back(seconds[r]);
    std::sort(others.begin(), others.end());
    const size_t n = others.size();
    return n % 2 ? others[n / 2] : 0.5 * (others[n / 2 - 1] + others[n / 2]);
}

// One step's compute of every rank (world order) into the streaks; the ranks whose streak reached `steps` now.
inline std::vector<StragglerNotice> straggler_update(StragglerWatch& watch, const std::vector<double>& seconds,
                                                      long long step) {
    std::vector<StragglerNotice> named;
    for (int r = 0; r < (int)seconds.size(); r++) {
        const double median = median_of_others(seconds, r);
        const double ratio = median > 0.0 ? seconds[r] / median : 0.0;
        if (ratio <= watch.factor) {
            watch.streak[r] = 0, watch.ratio_total[r] = 0.0;
            continue;
        }
        watch.ratio_total[r] += ratio;
        if (++watch.streak[r] == watch.steps)
            named.push_back(StragglerNotice{r, watch.steps, step, watch.ratio_total[r] / watch.steps, seconds[r],
                                            median});
    }
    return named;
}

// After a step: every rank's compute to the main rank (a collective on the world), and its verdict in one
// line and one log event per rank named. Nothing, and no collective, when the watch is off.
inline void straggler_step(StragglerWatch& watch, Communicator& world, double compute_seconds, long long step,
                           Logger& logger, cudaStream_t stream) {
    if (watch.factor <= 0.0) return;
    uint64_t word = 0;
    memcpy(&word, &compute_seconds, sizeof(word));
    const std::vector<uint64_t> words = all_gather_words(world, {word}, stream);
    std::vector<double> seconds(words.size());
    for (size_t r = 0; r < words.size(); r++) memcpy(&seconds[r], &words[r], sizeof(double));
    for (const StragglerNotice& n : straggler_update(watch, seconds, step))  // (the logger: the main rank's only)
        logger.straggler(n.step, n.rank, n.ratio, n.steps, n.compute_seconds, n.median_seconds);
}
