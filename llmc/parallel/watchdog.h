/*
The collective watchdog: a rank that waits too long for the others ends the job, and says where it waited.
The design (why it looks like this, and why it cannot fire during a healthy step) is in the header of
llmc/parallel/comm.h, under "The watchdog"; this file is the code.

    watchdog_start(timeout_seconds, world)   once, after the world exists: the thread, the arrival board
    watched_group(name, members)             a group's description, by index (Communicator::watch)
    watchdog_phase("step", 12)               what the job is doing, for the error line
    CollectiveWait wait(group, rank, "all-reduce", peer)
                                             CPU: brackets one blocking MPI call
    watch_enqueued(group, rank, "all-reduce", peer, stream)
                                             GPU: after one NCCL call, an event the thread polls
    watchdog_stop()                          before the communicators are destroyed
*/
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "../cuda_common.cuh"
#include "../utils.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#ifndef LLMC_CPU
#include <nccl.h>
#endif

// A group as the error line names it: what it is for, and its members' world ranks in group order.
struct WatchedGroup {
    std::string name;
    std::vector<int> members;
#ifndef LLMC_CPU
    ncclComm_t nccl = nullptr;  // aborted when the watchdog fires, which frees ranks blocked in it
#endif
};

// One wait: which group, which operation, since when.
struct WatchedWait {
    int group = -1;      // index into the registry; -1: none (the board then cannot say who is missing)
    int group_rank = 0;  // this rank's place in the group
    const char* operation = "";
    int peer = -1;       // point to point: the group rank on the other end
    uint64_t arrivals = 0;  // this rank's count of operations entered on the group, this one included
    std::chrono::steady_clock::time_point since;
    double waited = 0.0;    // seconds, as the watchdog's polls add them up (see watch())
#ifndef LLMC_CPU
    cudaEvent_t done = nullptr;
#endif
};

namespace watchdog {

// The arrival board: one counter per group per rank, in an MPI window every rank can read without the
// owner's help (shared memory on one node; RDMA across nodes where the network offers it). Every member of
// a group enters the group's operations in the same order, so a member whose counter is below this rank's
// has not reached the operation this rank is waiting in.
// Its last entry is a heartbeat that this rank's watchdog thread advances at every poll: a member whose
// heartbeat stands still is not running at all (stopped, or its whole process hangs).
constexpr int kBoardGroups = 256;
constexpr int kBoardHeartbeat = kBoardGroups;

struct State {
    std::mutex lock;  // guards everything below; the collectives take it twice each, uncontended
    std::vector<WatchedGroup> groups;
    double timeout_seconds = 0.0;  // 0: not watching
    double poll_seconds = 1.0;
    int world_rank = 0;
    std::string phase = "set-up";
    int phase_step = -1;
#ifdef LLMC_CPU
    bool waiting = false;
    WatchedWait current;  // the CPU build blocks in one MPI call at a time
#else
    std::deque<WatchedWait> pending;  // enqueued NCCL calls whose event has not completed, oldest first
    std::vector<cudaEvent_t> spare_events;
    int device = 0;
#endif
    MPI_Win board = MPI_WIN_NULL;
    uint64_t* board_counts = nullptr;
    bool mpi_from_thread = false;  // MPI_THREAD_MULTIPLE: the thread may read the board and call MPI_Abort
    std::thread thread;
    std::condition_variable wake;
    bool stopping = false;
};
// Never destroyed: a run that stops with fatal() exits with the thread still running, and destroying a
// running std::thread would abort the process instead of letting it exit with its one line.
inline State& state() {
    static State* s = new State;
    return *s;
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Entry `entry` of every member's board but this rank's (world ranks `members`), into `values`; false if
// they did not all answer within two seconds.
inline bool read_board(State& s, const std::vector<int>& members, int self, int entry, uint64_t* values) {
    std::vector<MPI_Request> requests(members.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < members.size(); i++)
        if ((int)i != self) MPI_Rget(&values[i], 1, MPI_UINT64_T, members[i], entry, 1, MPI_UINT64_T, s.board, &requests[i]);
    const auto start = std::chrono::steady_clock::now();
    int all_done = 0;
    while (!all_done && seconds_since(start) < 2.0)
        MPI_Testall((int)requests.size(), requests.data(), &all_done, MPI_STATUSES_IGNORE);
    return all_done;
}

// The members of the wait's group that have not entered the operation, as "rank 3, rank 5", or why that is
// not known. Reads the board with a deadline: a peer across a network without RDMA may not answer.
inline std::string missing_ranks(State& s, const WatchedWait& wait) {
    if (wait.group < 0) return "";
    const WatchedGroup& group = s.groups[wait.group];
    if (wait.peer >= 0) return "rank " + std::to_string(group.members[wait.peer]) + " did not arrive";
    if (s.board == MPI_WIN_NULL || !s.mpi_from_thread || wait.group >= kBoardGroups) {
        std::string members;
        for (int m : group.members) members += (members.empty() ? "" : ",") + std::to_string(m);
        return "which of ranks " + members + " did not arrive is not known";
    }
    std::vector<uint64_t> counts(group.members.size(), 0), beats(group.members.size(), 0);
    std::vector<uint64_t> later_beats(group.members.size(), 0);
    // the members' counts of this group and heartbeats, then the heartbeats again after a few polls
    if (!read_board(s, group.members, wait.group_rank, wait.group, counts.data()) ||
        !read_board(s, group.members, wait.group_rank, kBoardHeartbeat, beats.data()))
        return "the arrival board did not answer, so which ranks did not arrive is not known";
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.2, 3.0 * s.poll_seconds)));
    if (!read_board(s, group.members, wait.group_rank, kBoardHeartbeat, later_beats.data()))
        return "the arrival board did not answer, so which ranks did not arrive is not known";
    std::string missing, stopped;
    for (size_t i = 0; i < group.members.size(); i++) {
        if ((int)i == wait.group_rank) continue;
        const std::string name = "rank " + std::to_string(group.members[i]);
        if (counts[i] < wait.arrivals) missing += (missing.empty() ? "" : ", ") + name;
        if (later_beats[i] == beats[i]) stopped += (stopped.empty() ? "" : ", ") + name;
    }
    std::string text = missing.empty() ? "every member had entered it" : missing + " did not arrive";
    if (!stopped.empty()) text += "; " + stopped + " stopped running (its heartbeat stands still)";
    return text;
}

// Ends the job: one line, then the NCCL communicators aborted (GPU) and the whole job stopped.
[[noreturn]] inline void fire(State& s, const WatchedWait& wait) {
    const WatchedGroup* group = wait.group >= 0 ? &s.groups[wait.group] : nullptr;
    const std::string missing = missing_ranks(s, wait);
    std::string where = s.phase_step >= 0 ? s.phase + " " + std::to_string(s.phase_step) : s.phase;
    std::string peer;  // point to point: the other end
    if (wait.peer >= 0 && group)
        peer = (strcmp(wait.operation, "send") == 0 ? " to rank " : " from rank ") +
               std::to_string(group->members[wait.peer]);
    fflush(stdout);
    fprintf(stderr, "error: rank %d waited %.0f s in %s%s on the %s group at %s: %s (--collective-timeout %g)\n",
            s.world_rank, wait.waited, wait.operation, peer.c_str(), group ? group->name.c_str() : "?", where.c_str(),
            missing.c_str(), s.timeout_seconds);
    fflush(stderr);
#ifndef LLMC_CPU
    for (WatchedGroup& g : s.groups)
        if (g.nccl) ncclCommAbort(g.nccl);  // frees this rank's streams; its result no longer matters
#endif
    if (s.mpi_from_thread) MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);  // the launcher stops every rank
    std::_Exit(EXIT_FAILURE);  // without MPI the launcher sees this rank fail and stops the others
}

// The thread: wakes 20 times per timeout (at most once a second), advances the heartbeat, and adds the
// time since its last poll to what this rank waits in. A poll adds at most two intervals: time in which
// the process did not run at all (stopped, or starved of CPU) does not count as waiting, so a rank that
// was itself stopped does not accuse the others once it runs again.
inline void watch(State& s) {
#ifndef LLMC_CPU
    cudaSetDevice(s.device);  // events are queried on this rank's device
#endif
    std::unique_lock<std::mutex> guard(s.lock);
    auto last_poll = std::chrono::steady_clock::now();
    while (!s.stopping) {
        s.wake.wait_for(guard, std::chrono::duration<double>(s.poll_seconds));
        if (s.stopping) break;
        const double elapsed = std::min(seconds_since(last_poll), 2.0 * s.poll_seconds);
        last_poll = std::chrono::steady_clock::now();
        if (s.board_counts) __atomic_add_fetch(&s.board_counts[kBoardHeartbeat], 1, __ATOMIC_RELAXED);
        auto add_wait = [&](WatchedWait& wait) {
            wait.waited += std::min(elapsed, seconds_since(wait.since));
            if (wait.waited > s.timeout_seconds) fire(s, wait);
        };
#ifdef LLMC_CPU
        if (s.waiting) add_wait(s.current);
#else
        // completed calls leave the list; every call still running has waited
        for (auto it = s.pending.begin(); it != s.pending.end();) {
            if (cudaEventQuery(it->done) == cudaSuccess) {
                s.spare_events.push_back(it->done);
                it = s.pending.erase(it);
            } else {
                add_wait(*it);
                ++it;
            }
        }
#endif
    }
}

}  // namespace watchdog

// Registers a group and returns its index (Communicator::watch). Every rank creates its groups in the same
// order (each is a split that every rank of the parent calls together), so equal groups get equal indices
// on all their members: the board's column for the group.
inline int watched_group(const std::string& name, const std::vector<int>& members) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    s.groups.push_back(WatchedGroup{name, members});
    return (int)s.groups.size() - 1;
}
// A registered group's members (world ranks, group order); empty for -1.
inline std::vector<int> watched_members(int group) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    return group >= 0 ? s.groups[group].members : std::vector<int>{};
}
#ifndef LLMC_CPU
inline void watched_group_nccl(int group, ncclComm_t nccl) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    if (group >= 0) s.groups[group].nccl = nccl;
}
#endif

// What the job is doing, named in the error line: "step" 12, "validation at step" 12, "set-up" (-1).
inline void watchdog_phase(const char* phase, int step = -1) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    s.phase = phase;
    s.phase_step = step;
}

// Counts one more operation of this rank on the group, on the board; returns the count.
inline uint64_t watchdog_arrive(watchdog::State& s, int group) {
    if (!s.board_counts || group < 0 || group >= watchdog::kBoardGroups) return 0;
    return __atomic_add_fetch(&s.board_counts[group], 1, __ATOMIC_RELAXED);
}

#ifdef LLMC_CPU
// Brackets one blocking MPI call: the thread sees this rank waiting from construction to destruction.
class CollectiveWait {
public:
    CollectiveWait(int group, int group_rank, const char* operation, int peer = -1) {
        watchdog::State& s = watchdog::state();
        std::lock_guard<std::mutex> guard(s.lock);
        if (s.timeout_seconds <= 0.0) return;
        s.current = WatchedWait{group, group_rank, operation, peer, watchdog_arrive(s, group),
                                std::chrono::steady_clock::now()};
        s.waiting = true;
    }
    ~CollectiveWait() {
        watchdog::State& s = watchdog::state();
        std::lock_guard<std::mutex> guard(s.lock);
        s.waiting = false;
    }
    CollectiveWait(const CollectiveWait&) = delete;
    CollectiveWait& operator=(const CollectiveWait&) = delete;
};
#else
// After one NCCL call on `stream`: the thread polls an event recorded behind it.
inline void watch_enqueued(int group, int group_rank, const char* operation, int peer, cudaStream_t stream) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    if (s.timeout_seconds <= 0.0) return;
    WatchedWait wait{group, group_rank, operation, peer, watchdog_arrive(s, group), std::chrono::steady_clock::now()};
    if (s.spare_events.empty()) {
        cudaEvent_t event;
        cudaCheck(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        s.spare_events.push_back(event);
    }
    wait.done = s.spare_events.back();
    s.spare_events.pop_back();
    cudaCheck(cudaEventRecord(wait.done, stream));
    s.pending.push_back(wait);
}
#endif

// Starts watching (timeout 0: never fires, costs nothing). `world` is MPI's world when MPI runs, else
// MPI_COMM_NULL (then the board is missing and a timeout names the group's members as candidates).
inline void watchdog_start(double timeout_seconds, int world_rank, MPI_Comm world) {
    watchdog::State& s = watchdog::state();
    if (timeout_seconds <= 0.0 || s.thread.joinable()) return;
    s.timeout_seconds = timeout_seconds;
    s.poll_seconds = std::min(1.0, timeout_seconds / 20.0);
    s.world_rank = world_rank;
    if (world != MPI_COMM_NULL) {
        int provided = MPI_THREAD_SINGLE;
        if (MPI_Query_thread(&provided) != MPI_SUCCESS) fatal("MPI_Query_thread failed");
        s.mpi_from_thread = provided == MPI_THREAD_MULTIPLE;
        // a collective call; every rank gets the same `provided` from the same MPI library
        if (s.mpi_from_thread) {
            if (MPI_Win_allocate((watchdog::kBoardGroups + 1) * sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL, world,
                                 &s.board_counts, &s.board) != MPI_SUCCESS ||
                MPI_Win_lock_all(MPI_MODE_NOCHECK, s.board) != MPI_SUCCESS)
                fatal("cannot create the watchdog's arrival board (an MPI window)");
            std::fill(s.board_counts, s.board_counts + watchdog::kBoardGroups + 1, 0);
            // nobody counts before everyone has cleared its counters
            if (MPI_Barrier(world) != MPI_SUCCESS) fatal("MPI_Barrier after creating the arrival board failed");
        }
    }
#ifndef LLMC_CPU
    cudaCheck(cudaGetDevice(&s.device));
#endif
    s.stopping = false;
    s.thread = std::thread(watchdog::watch, std::ref(s));
}

// Stops the thread and frees the board (a collective over the world when there is one).
inline void watchdog_stop() {
    watchdog::State& s = watchdog::state();
    if (!s.thread.joinable()) return;
    {
        std::lock_guard<std::mutex> guard(s.lock);
        s.stopping = true;
    }
    s.wake.notify_all();
    s.thread.join();
    s.timeout_seconds = 0.0;
    if (s.board != MPI_WIN_NULL) {
        if (MPI_Win_unlock_all(s.board) != MPI_SUCCESS || MPI_Win_free(&s.board) != MPI_SUCCESS)
            fatal("cannot free the watchdog's arrival board");
        s.board_counts = nullptr;
    }
#ifndef LLMC_CPU
    for (WatchedWait& wait : s.pending) s.spare_events.push_back(wait.done);
    s.pending.clear();
    for (cudaEvent_t event : s.spare_events) cudaCheck(cudaEventDestroy(event));
    s.spare_events.clear();
#endif
}
