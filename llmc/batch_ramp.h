/*
A batch ramp: the tokens per optimizer step as a function of the tokens seen so far.

Why. Early in training the loss is high and the gradient points the same way whatever rows it is measured on:
a small batch gives as good a direction as a big one, for fewer tokens, so steps come quickly. Near the optimum
the signal is small against the noise of each row's gradient, and a step is only worth taking on many rows (the
critical batch size grows as the loss falls; McCandlish et al. 2018). So large runs start small and double the
batch as training goes on: Llama 3 trained at 4M tokens per step, 8M after 252M tokens seen, 16M after 2.87T.

    --batch-ramp 0:16384,2000000:32768,8000000:65536     (tokens seen : tokens per step, phase after phase)

    BatchRamp ramp;
    std::string error = batch_ramp_parse(text, &ramp);   // "": parsed; otherwise one line naming the problem
    long long seen = batch_ramp_tokens_after(ramp, step);  // tokens seen before step `step` (0-based)
    int tokens = batch_ramp_phase(ramp, seen).tokens;      // the tokens of that step

A phase starts at the first step whose tokens seen before it reach the phase's threshold: a step is never cut,
so a phase may start a little after its threshold (the step that crosses it finishes at the old batch). The
first threshold is 0, thresholds increase strictly, every batch is > 0 tokens. A run without a ramp is one
phase: --total-batch-size from 0 on (batch_ramp_fixed).

Tokens seen after n steps, phase by phase: in phase k, from `seen` tokens on, the steps until the next threshold
h are ceil((h - seen) / b_k); if n is within them the answer is seen + n b_k, otherwise those steps are taken and
the next phase goes on from there. The last phase has no end. Pure functions of the ramp and the step: a resumed
run recomputes where it stands from its step alone, and checks it against what the checkpoint recorded.
*/
#pragma once

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

struct BatchPhase {
    long long threshold = 0;  // from this many tokens seen on ...
    int tokens = 0;           // ... the tokens per optimizer step, all ranks together
};

struct BatchRamp {
    std::vector<BatchPhase> phases;  // thresholds strictly increasing from 0
};

inline BatchRamp batch_ramp_fixed(int tokens_per_step) { return BatchRamp{{BatchPhase{0, tokens_per_step}}}; }

inline bool batch_ramp_is_fixed(const BatchRamp& ramp) { return ramp.phases.size() <= 1; }

// "--batch-ramp T0:B0,T1:B1,...": "" when `text` parses into *ramp, otherwise one line saying what is wrong.
inline std::string batch_ramp_parse(const std::string& text, BatchRamp* ramp) {
    const std::string flag = "--batch-ramp " + text + ": ";
    ramp->phases.clear();
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const size_t colon = item.find(':');
        long long threshold = 0, tokens = 0;
        char *threshold_end = nullptr, *tokens_end = nullptr;
        if (colon != std::string::npos && colon > 0 && colon + 1 < item.size() && isdigit((unsigned char)item[0]) &&
            isdigit((unsigned char)item[colon + 1])) {
            threshold = strtoll(item.c_str(), &threshold_end, 10);
            tokens = strtoll(item.c_str() + colon + 1, &tokens_end, 10);
        }
        if (!threshold_end || threshold_end != item.c_str() + colon || *tokens_end != '\0')
            return flag + "'" + item + "' is not TOKENS_SEEN:TOKENS_PER_STEP (e.g. 0:16384,2000000:32768)";
        if (tokens <= 0 || tokens > 2147483647)
            return flag + "phase '" + item + "' has a batch of " + std::to_string(tokens) +
                   " tokens per step; it must be between 1 and 2147483647";
        if (ramp->phases.empty() && threshold != 0)
            return flag + "the first phase starts at " + std::to_string(threshold) + " tokens seen; it must start at 0";
        if (!ramp->phases.empty() && threshold <= ramp->phases.back().threshold)
            return flag + "phase '" + item + "' starts at " + std::to_string(threshold) +
                   " tokens seen, not after the previous phase's " + std::to_string(ramp->phases.back().threshold) +
                   ": thresholds must increase";
        ramp->phases.push_back(BatchPhase{threshold, (int)tokens});
        if (comma == std::string::npos) return "";
        start = comma + 1;
    }
}

// The phase of the step that starts with `tokens_seen` tokens seen: the last one whose threshold it reached.
inline const BatchPhase& batch_ramp_phase(const BatchRamp& ramp, long long tokens_seen) {
    size_t k = 0;
    while (k + 1 < ramp.phases.size() && tokens_seen >= ramp.phases[k + 1].threshold) k++;
    return ramp.phases[k];
}

// Tokens seen after the first `steps` steps of the run (the file's header: phase by phase).
inline long long batch_ramp_tokens_after(const BatchRamp& ramp, long long steps) {
    long long seen = 0;
    for (size_t k = 0; k < ramp.phases.size(); k++) {
        const long long b = ramp.phases[k].tokens;
        if (k + 1 < ramp.phases.size() && seen < ramp.phases[k + 1].threshold) {
            const long long steps_in_phase = (ramp.phases[k + 1].threshold - seen + b - 1) / b;
            if (steps <= steps_in_phase) return seen + steps * b;
            seen += steps_in_phase * b;
            steps -= steps_in_phase;
        } else if (k + 1 == ramp.phases.size()) {
            return seen + steps * b;
        }
    }
    return seen;
}

// The tokens of step `step` (0-based).
inline int batch_ramp_step_tokens(const BatchRamp& ramp, long long step) {
    return batch_ramp_phase(ramp, batch_ramp_tokens_after(ramp, step)).tokens;
}
