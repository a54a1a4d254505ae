/*
Faults on purpose, so that the tests can show the program surviving them. The CPU execution layer reads
them from the environment; the GPU build has none (the functions below are empty there, so a GPU run pays
nothing and cannot be hurt by a stray variable).

    LLMC_FAULT_FLIP_BIT=RANK:STEP:TENSOR:LAYER:ELEMENT:BIT
        after the optimizer update of step STEP (1-based), world rank RANK flips bit BIT of element ELEMENT
        of its copy of tensor TENSOR of layer LAYER ("ln1w", "fcw", ...: llmc/model/parameters.h) in its
        parameters: silent data corruption, which --check-replicas must catch
    LLMC_FAULT_KILL=POINT:RANK:STEP
        world rank RANK kills itself (SIGKILL: no clean-up, like a lost node) when it reaches the point
        named POINT during step STEP; the points: "mid-step" (train_gpt.cu: the step's forward and backward
        passes are issued, the gradients not yet reduced) and "before-main-file" (llmc/parallel/reshard.h:
        every shard file of the checkpoint of step STEP is written, the main file is not) and "in-async-save"
        (llmc/parallel/reshard.h, under --checkpoint-async: the rank's writer thread has written its file of the
        checkpoint of step STEP, a shard file or on rank 0 the main file, and not committed it)
    LLMC_FAULT_UNGROUPED_P2P=1
        the pipeline sends each result right after the action that made it and receives each input right before
        the action that needs it, each operation alone (llmc/parallel/pipeline.h's pipeline_exchange), blocking
        like a lone NCCL kernel, instead of the groups pipeline_message_groups forms: the structure that
        deadlocks 1F1B on a GPU, which the test then sees deadlock here too
    LLMC_FAULT_STALL=POINT:RANK[,POINT:RANK...]
        world rank RANK stops making progress (it sleeps forever, its watchdog thread still running) the first
        time it reaches POINT; the points: "before-init" (llmc/parallel/comm.h's comm_init_world, before MPI
        starts: RANK is the launcher's, OMPI_COMM_WORLD_RANK), "in-split" (comm_split, its split of the group
        not yet called), "before-first-p2p" (llmc/parallel/pipeline.h: before the rank's first pipeline
        group of sends and receives) and "abort" (llmc/parallel/watchdog.h: the step that stands in for
        ncclCommAbort when the watchdog fires never returns, as NCCL's abort sometimes does)
    LLMC_FAULT_NO_BOARD=RANK
        world rank RANK's allocation of the watchdog's arrival board (an MPI window) reports failure
    LLMC_FAULT_PER_LINK_P2P=1
        the pipeline's messages travel on a communicator per neighbour pair (and per chunk under zbv), as they
        once did, instead of all on the pp axis (llmc/parallel/pipeline.h): a group then spans two
        communicators, which NCCL runs one after the other in an order of its choosing, and the test sees it
        deadlock here under such an order too (LLMC_CPU_GROUP_ORDER, llmc/parallel/cpu_nccl_rules.h)
    LLMC_FAULT_SLOW=RANK:FACTOR
        world rank RANK computes about FACTOR (a number from 1 to 100) times as long as it would: at the
        "mid-step" point (train_gpt.cu) it keeps its CPU busy until its compute since the step began
        (llmc/parallel/stragglers.h's ComputeClock) is FACTOR times what it was, so the others wait for it
        in the collectives that follow, as for a slow GPU: the straggler --straggler-factor names
A malformed value stops the program with one line, so a test cannot pass by injecting nothing.
*/
#pragma once

#include <csignal>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>
#include <unistd.h>
#include "../utils.h"

struct PlannedBitFlip {
    int rank = -1, step = -1, layer = 0, bit = 0;
    long long element = 0;
    std::string tensor;
};

#ifdef LLMC_CPU
// The value of an LLMC_FAULT_* variable split at ':' into exactly `fields` parts; empty when unset.
inline std::vector<std::string> fault_fields(const char* variable, size_t fields) {
    std::vector<std::string> parts;
    const char* value = getenv(variable);
    if (!value || !*value) return parts;
    std::string text = value;
    for (size_t start = 0;;) {
        const size_t colon = text.find(':', start);
        parts.push_back(text.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
        if (colon == std::string::npos) break;
        start = colon + 1;
    }
    if (parts.size() != fields) fatal("%s=%s: expected %zu fields separated by ':'", variable, value, fields);
    return parts;
}
inline long long fault_number(const char* variable, const std::string& field) {
    char* end = nullptr;
    const long long value = strtoll(field.c_str(), &end, 10);
    if (field.empty() || *end != '\0' || value < 0) fatal("%s: '%s' is not a count", variable, field.c_str());
    return value;
}

// The bit flip LLMC_FAULT_FLIP_BIT asks for, or nullptr.
inline const PlannedBitFlip* planned_bit_flip() {
    static const PlannedBitFlip* planned = [] {
        const char* name = "LLMC_FAULT_FLIP_BIT";
        const std::vector<std::string> f = fault_fields(name, 6);
        if (f.empty()) return (const PlannedBitFlip*)nullptr;
        PlannedBitFlip* flip = new PlannedBitFlip;
        flip->rank = (int)fault_number(name, f[0]);
        flip->step = (int)fault_number(name, f[1]);
        flip->tensor = f[2];
        flip->layer = (int)fault_number(name, f[3]);
        flip->element = fault_number(name, f[4]);
        flip->bit = (int)fault_number(name, f[5]);
        return (const PlannedBitFlip*)flip;
    }();
    return planned;
}

// Kills this process if LLMC_FAULT_KILL names this point, rank and step (the variable is read once).
inline void fault_point(const char* point, int rank, long long step) {
    struct PlannedKill {
        std::string point;
        long long rank = -1, step = -1;
    };
    static const PlannedKill planned = [] {
        const char* name = "LLMC_FAULT_KILL";
        const std::vector<std::string> f = fault_fields(name, 3);
        return f.empty() ? PlannedKill{} : PlannedKill{f[0], fault_number(name, f[1]), fault_number(name, f[2])};
    }();
    if (planned.point != point || planned.rank != rank || planned.step != step) return;
    fprintf(stderr, "fault injected: rank %d killed at %s of step %lld\n", rank, point, step);
    fflush(stderr);
    raise(SIGKILL);
}

// Whether a switch LLMC_FAULT_...=1 is on; any other value stops the program with one line.
inline bool fault_switch(const char* name) {
    const std::vector<std::string> f = fault_fields(name, 1);
    if (f.empty()) return false;
    if (f[0] != "1") fatal("%s=%s: expected 1", name, f[0].c_str());
    return true;
}
// Whether LLMC_FAULT_UNGROUPED_P2P=1 asks for point-to-point operations one at a time (read once).
inline bool fault_ungrouped_point_to_point() {
    static const bool ungrouped = fault_switch("LLMC_FAULT_UNGROUPED_P2P");
    return ungrouped;
}

// Stalls this thread forever if LLMC_FAULT_STALL names this point and rank (the variable is read once).
inline void fault_stall(const char* point, int rank) {
    static const std::vector<std::pair<std::string, long long>> planned = [] {
        const char* name = "LLMC_FAULT_STALL";
        const char* value = getenv(name);
        std::vector<std::pair<std::string, long long>> stalls;
        const std::string text = value ? value : "";
        for (size_t start = 0; start < text.size();) {
            size_t comma = text.find(',', start);
            if (comma == std::string::npos) comma = text.size();
            const std::string entry = text.substr(start, comma - start);
            const size_t colon = entry.find(':');
            if (colon == std::string::npos || entry.find(':', colon + 1) != std::string::npos)
                fatal("%s=%s: expected POINT:RANK entries separated by ','", name, value);
            const std::string where = entry.substr(0, colon);
            if (where != "before-init" && where != "in-split" && where != "before-first-p2p" && where != "abort")
                fatal("%s=%s: unknown point '%s' (before-init, in-split, before-first-p2p, abort)", name, value,
                      where.c_str());
            stalls.push_back({where, fault_number(name, entry.substr(colon + 1))});
            start = comma + 1;
        }
        return stalls;
    }();
    for (const auto& [where, stalled_rank] : planned) {
        if (where != point || stalled_rank != rank) continue;
        fprintf(stderr, "fault injected: rank %d stalls at %s\n", rank, point);
        fflush(stderr);
        for (;;) pause();
    }
}

// Whether LLMC_FAULT_NO_BOARD names this rank: its arrival board's allocation then reports failure.
inline bool fault_no_board(int rank) {
    static const long long planned = [] {
        const char* name = "LLMC_FAULT_NO_BOARD";
        const std::vector<std::string> f = fault_fields(name, 1);
        return f.empty() ? -1LL : fault_number(name, f[0]);
    }();
    return planned == rank;
}

// The factor LLMC_FAULT_SLOW slows this rank's compute by; 1 when it names another rank or is unset (read once).
inline double fault_slow_factor(int rank) {
    struct PlannedSlowness {
        long long rank = -1;
        double factor = 1.0;
    };
    static const PlannedSlowness planned = [] {
        const char* name = "LLMC_FAULT_SLOW";
        const std::vector<std::string> f = fault_fields(name, 2);
        if (f.empty()) return PlannedSlowness{};
        char* end = nullptr;
        const double factor = strtod(f[1].c_str(), &end);
        if (f[1].empty() || *end != '\0' || !(factor >= 1.0) || factor > 100.0)
            fatal("%s: '%s' is not a factor between 1 and 100", name, f[1].c_str());
        return PlannedSlowness{fault_number(name, f[0]), factor};
    }();
    return planned.rank == rank ? planned.factor : 1.0;
}

// Whether LLMC_FAULT_PER_LINK_P2P=1 asks for the pipeline's messages on a communicator per link (read once).
inline bool fault_per_link_point_to_point() {
    static const bool per_link = fault_switch("LLMC_FAULT_PER_LINK_P2P");
    return per_link;
}
#else
inline const PlannedBitFlip* planned_bit_flip() { return nullptr; }
inline void fault_stall(const char*, int) {}
inline bool fault_no_board(int) { return false; }
inline void fault_point(const char*, int, long long) {}
inline double fault_slow_factor(int) { return 1.0; }
inline bool fault_ungrouped_point_to_point() { return false; }
inline bool fault_per_link_point_to_point() { return false; }
#endif
