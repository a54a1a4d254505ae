/*
The collective watchdog: a rank that waits too long for the others ends the job, and says where it waited.
The design (why it looks like this, and why it cannot fire during a healthy step) is in the header of
llmc/parallel/comm.h, under "The watchdog"; this file is the code.

    watchdog_start(timeout_seconds, rank)    once, before MPI or NCCL starts (rank: the launcher's): the thread
    watchdog_attach(rank, world, group)      once the world exists: its rank, the arrival board
    watched_group(name, members)             a group's description, by index (Communicator::watch)
    watchdog_phase("step", 12)               what the job is doing, for the error line
    waits_clock_start() / waited_seconds()   the seconds this rank has spent inside the brackets below, for
                                             llmc/parallel/stragglers.h (counted only once started; CPU time
                                             on the CPU build: waits_clock_seconds)
    CollectiveWait wait(group, rank, "all-reduce", peer)
                                             brackets one host call that can block (CPU: every MPI call
                                             that waits for others; both: start-up, splits)
    HostCallWait wait("ncclGroupEnd()")       GPU: brackets one NCCL call, unless a bracket above is open
    watch_enqueued(group, rank, "all-reduce", peer, stream)
                                             GPU: after one NCCL call, an event the thread polls
    watchdog_stop()                          after the communicators are destroyed, before MPI_Finalize
*/
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "../cuda_common.cuh"
#include "../utils.h"
#include "../cpu/faults.h"

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
    uint64_t arrivals = 0;  // this rank's count of operations entered on the group, this one included (0: not
                            // counted, so the board cannot say who is missing)
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
// After the line, how long the abort (ncclCommAbort, MPI_Abort) may take before the process exits anyway.
constexpr double kAbortGraceSeconds = 3.0;

struct State {
    std::mutex lock;  // guards everything below; the collectives take it twice each, uncontended
    std::vector<WatchedGroup> groups;
    double timeout_seconds = 0.0;  // 0: not watching
    double poll_seconds = 1.0;
    int world_rank = 0;
    int world_group = -1;  // the world's registered group, once it exists
    std::string phase = "start-up";
    int phase_step = -1;
    bool waiting = false;
    WatchedWait current;  // the host call this thread blocks in (one at a time; see CollectiveWait)
#ifndef LLMC_CPU
    std::deque<WatchedWait> pending;  // enqueued NCCL calls whose event has not completed, oldest first
    std::vector<cudaEvent_t> spare_events;
    int device = -1;  // set by watchdog_attach, once the rank has picked its GPU
#endif
    // The waits' clock (waits_clock_start): the seconds the thread that started it spends inside outermost
    // brackets, whether or not the watchdog watches (another thread's waits, a background writer's, are not
    // that thread's compute left out).
    bool timing_waits = false;
    std::thread::id timed_thread;
    int timed_depth = 0;
    double timed_since = 0.0;  // waits_clock_seconds() when the outermost bracket opened
    double waited_total = 0.0;
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

// What the job is doing, for the error line: "step 12", "start-up".
inline std::string phase_text(const State& s) {
    return s.phase_step >= 0 ? s.phase + " " + std::to_string(s.phase_step) : s.phase;
}

// What the waits' clock reads. The CPU build: the process's CPU time, because ranks there share cores (often
// more ranks than cores) and wall time would count the time another rank had this one's core; MPI's waits
// poll, so they cost CPU time too, and the brackets take it out. The GPU build: wall time.
inline double waits_clock_seconds() {
#ifdef LLMC_CPU
    timespec t;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) fatal("clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
#else
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
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
    if (wait.group < 0)
        return s.phase == "start-up" ? "which rank did not arrive is not known before the world's communicator exists"
                                     : "which rank did not arrive is not known";
    const WatchedGroup& group = s.groups[wait.group];
    if (wait.peer >= 0) return "rank " + std::to_string(group.members[wait.peer]) + " did not arrive";
    if (s.board == MPI_WIN_NULL || !s.mpi_from_thread || wait.group >= kBoardGroups || wait.arrivals == 0) {
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

// Ends the job: the one line, then the abort tried on a thread of its own (NCCL's abort of every
// communicator on the GPU, its stand-in on the CPU, then MPI_Abort, which stops every rank through the
// launcher), and after kAbortGraceSeconds the exit whatever the abort is still blocked in: ncclCommAbort can
// hang in cudaFree (NVIDIA/nccl #549, #992, #1777), and MPI_Abort can wait on an unreachable launcher. A
// rank that exits with a failure makes the launcher stop the others too. Called by the thread with the lock
// held, which it keeps: no other thread starts a watched call or queries a communicator from then on.
[[noreturn]] inline void end_job(State& s, const std::string& line) {
    fflush(stdout);
    fprintf(stderr, "%s\n", line.c_str());
    fflush(stderr);
#ifndef LLMC_CPU
    std::vector<ncclComm_t> communicators;
    for (const WatchedGroup& g : s.groups)
        if (g.nccl) communicators.push_back(g.nccl);
#endif
    const bool mpi = s.mpi_from_thread;
    [[maybe_unused]] const int rank = s.world_rank;
    std::thread([=] {
#ifdef LLMC_CPU
        fault_stall("abort", rank);  // no NCCL to abort here: the tests' abort that never returns
#else
        for (ncclComm_t comm : communicators) ncclCommAbort(comm);  // frees this rank's streams; results moot
#endif
        if (mpi) MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
        std::_Exit(EXIT_FAILURE);
    }).detach();
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceSeconds));
    std::_Exit(EXIT_FAILURE);
}

// A wait longer than the timeout: the line names this rank, the operation (and its peer), the group, what the
// job was doing and who did not arrive.
[[noreturn]] inline void fire(State& s, WatchedWait wait) {
#ifndef LLMC_CPU
    // a bracket around one NCCL call knows no group: the communicator that call left in progress is its group
    for (size_t g = 0; g < s.groups.size() && wait.group < 0 && s.device >= 0; g++) {
        ncclResult_t state = ncclSuccess;
        if (s.groups[g].nccl && ncclCommGetAsyncError(s.groups[g].nccl, &state) == ncclSuccess && state == ncclInProgress)
            wait.group = (int)g;
    }
#endif
    const WatchedGroup* group = wait.group >= 0 ? &s.groups[wait.group] : nullptr;
    const std::string missing = missing_ranks(s, wait);
    std::string peer;  // point to point: the other end
    if (wait.peer >= 0 && group)
        peer = (strcmp(wait.operation, "send") == 0 ? " to rank " : " from rank ") +
               std::to_string(group->members[wait.peer]);
    char line[1024];
    snprintf(line, sizeof(line), "error: rank %d waited %.0f s in %s%s%s%s at %s: %s (--collective-timeout %g)",
             s.world_rank, wait.waited, wait.operation, peer.c_str(), group ? " on the " : "",
             group ? (group->name + " group").c_str() : "", phase_text(s).c_str(), missing.c_str(), s.timeout_seconds);
    end_job(s, line);
}

// The thread: wakes 20 times per timeout (at most once a second), advances the heartbeat, and adds the
// time since its last poll to what this rank waits in. A poll adds at most two intervals: time in which
// the process did not run at all (stopped, or starved of CPU) does not count as waiting, so a rank that
// was itself stopped does not accuse the others once it runs again.
inline void watch(State& s) {
    std::unique_lock<std::mutex> guard(s.lock);
#ifndef LLMC_CPU
    int thread_device = -1;  // events are queried on this rank's device, once it has one
#endif
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
        if (s.waiting) add_wait(s.current);
#ifndef LLMC_CPU
        if (s.device < 0) continue;
        if (thread_device != s.device) cudaSetDevice(thread_device = s.device);
        // an error NCCL found in the background (a peer's connection lost, a remote error) ends the job too
        for (const WatchedGroup& g : s.groups) {
            ncclResult_t async = ncclSuccess;
            if (!g.nccl) continue;
            const ncclResult_t query = ncclCommGetAsyncError(g.nccl, &async);
            if (query == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
            const ncclResult_t error = query != ncclSuccess ? query : async;
            std::string detail = ncclGetLastError(g.nccl);
            for (char& c : detail) if (c == '\n') c = ' ';
            end_job(s, "error: rank " + std::to_string(s.world_rank) + ": NCCL reports an asynchronous error on the " +
                           g.name + " group at " + phase_text(s) + ": " + ncclGetErrorString(error) + " (" + detail + ")");
        }
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
// ncclCommGetAsyncError under the watchdog's lock, which a firing watchdog keeps until the process exits: so
// no thread queries a communicator that the abort may be freeing.
inline ncclResult_t watched_async_state(ncclComm_t comm, ncclResult_t* state) {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    return ncclCommGetAsyncError(comm, state);
}
// Every registered group's NCCL communicator.
inline std::vector<ncclComm_t> watched_nccl_communicators() {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    std::vector<ncclComm_t> communicators;
    for (const WatchedGroup& g : s.groups)
        if (g.nccl) communicators.push_back(g.nccl);
    return communicators;
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

// Brackets one host call that can block: the thread sees this rank waiting from construction to
// destruction. Brackets nest: an inner one is watched while it is open, then the outer one again.
class CollectiveWait {
public:
    CollectiveWait(int group, int group_rank, const char* operation, int peer = -1) {
        watchdog::State& s = watchdog::state();
        std::lock_guard<std::mutex> guard(s.lock);
        start_timing(s);
        if (s.timeout_seconds <= 0.0) return;
        open(s, WatchedWait{group, group_rank, operation, peer, watchdog_arrive(s, group),
                            std::chrono::steady_clock::now()});
    }
    ~CollectiveWait() {
        if (!opened_ && !timed_) return;
        watchdog::State& s = watchdog::state();
        std::lock_guard<std::mutex> guard(s.lock);
        if (timed_ && --s.timed_depth == 0) s.waited_total += watchdog::waits_clock_seconds() - s.timed_since;
        if (!opened_) return;
        s.waiting = outer_waiting_;
        s.current = outer_;
    }
    CollectiveWait(const CollectiveWait&) = delete;
    CollectiveWait& operator=(const CollectiveWait&) = delete;

protected:
    CollectiveWait() = default;
    // the waits' clock: the outermost bracket starts it
    void start_timing(watchdog::State& s) {
        if (!s.timing_waits || std::this_thread::get_id() != s.timed_thread) return;
        timed_ = true;
        if (s.timed_depth++ == 0) s.timed_since = watchdog::waits_clock_seconds();
    }
    void open(watchdog::State& s, const WatchedWait& wait) {
        opened_ = true;
        outer_waiting_ = s.waiting;
        outer_ = s.current;
        s.current = wait;
        s.waiting = true;
    }

private:
    bool opened_ = false, outer_waiting_ = false, timed_ = false;
    WatchedWait outer_;
};

// From now on, the brackets above add up the seconds (waits_clock_seconds) this thread spends inside them, nested
// ones once.
inline void waits_clock_start() {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    s.timing_waits = true;
    s.timed_thread = std::this_thread::get_id();
}
// The seconds spent inside brackets since waits_clock_start, an open one's so far included.
inline double waited_seconds() {
    watchdog::State& s = watchdog::state();
    std::lock_guard<std::mutex> guard(s.lock);
    return s.waited_total + (s.timed_depth > 0 ? watchdog::waits_clock_seconds() - s.timed_since : 0.0);
}

#ifndef LLMC_CPU
// Brackets one NCCL host call (llmc/parallel/communicator.h's ncclCheck), named by its text, when no bracket that
// knows more (a collective's, a split's) is open. It counts no arrival: the call's group is found when the
// watchdog fires, as the communicator still in progress.
class HostCallWait : public CollectiveWait {
public:
    explicit HostCallWait(const char* call) {
        watchdog::State& s = watchdog::state();
        std::lock_guard<std::mutex> guard(s.lock);
        start_timing(s);
        if (s.timeout_seconds <= 0.0 || s.waiting) return;
        open(s, WatchedWait{-1, 0, call, -1, 0, std::chrono::steady_clock::now()});
    }
};

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

// Starts watching (timeout 0: never fires, costs nothing), before MPI or NCCL starts, so that start-up is
// watched too: `rank` is what the launcher's environment says (llmc/parallel/launcher.h's detect_launcher).
inline void watchdog_start(double timeout_seconds, int rank) {
    watchdog::State& s = watchdog::state();
    if (timeout_seconds <= 0.0 || s.thread.joinable()) return;
    s.timeout_seconds = timeout_seconds;
    s.poll_seconds = std::min(1.0, timeout_seconds / 20.0);
    s.world_rank = rank;
    s.phase = "start-up";
    s.phase_step = -1;
    s.stopping = false;
    s.thread = std::thread(watchdog::watch, std::ref(s));
}

// Once the world exists: this rank's place in it, its GPU, and the arrival board. `world` is MPI's world when
// MPI runs, else MPI_COMM_NULL; `world_group` the world's registered group. Without MPI, or when the board
// cannot be made, a timeout names the group's members as the candidates (said once, by the first rank
// whose allocation failed).
inline void watchdog_attach(int world_rank, MPI_Comm world, int world_group) {
    watchdog::State& s = watchdog::state();
    if (!s.thread.joinable()) return;
    bool mpi_from_thread = false;
    if (world != MPI_COMM_NULL) {
        int provided = MPI_THREAD_SINGLE;
        if (MPI_Query_thread(&provided) != MPI_SUCCESS) fatal("MPI_Query_thread failed");
        mpi_from_thread = provided == MPI_THREAD_MULTIPLE;
    }
    {
        std::lock_guard<std::mutex> guard(s.lock);
        s.world_rank = world_rank;
        s.world_group = world_group;
        s.phase = "set-up";
#ifndef LLMC_CPU
        cudaCheck(cudaGetDevice(&s.device));
#endif
    }
    // a collective call; every rank gets the same `provided` from the same MPI library
    if (!mpi_from_thread) return;
    CollectiveWait wait(world_group, world_rank, "the arrival board's creation (MPI_Win_allocate)");
    MPI_Win board = MPI_WIN_NULL;
    uint64_t* counts = nullptr;
    int result = MPI_Win_allocate((watchdog::kBoardGroups + 1) * sizeof(uint64_t), sizeof(uint64_t), MPI_INFO_NULL,
                                  world, &counts, &board);
    if (result == MPI_SUCCESS) result = MPI_Win_lock_all(MPI_MODE_NOCHECK, board);
    if (result == MPI_SUCCESS && fault_no_board(world_rank)) result = MPI_ERR_NO_MEM;  // the tests' failure
    if (result == MPI_SUCCESS) std::fill(counts, counts + watchdog::kBoardGroups + 1, 0);
    // every rank uses the board, or none does: the first rank that could not make it, or the world's size
    int size = 0, first_failed = 0;
    if (MPI_Comm_size(world, &size) != MPI_SUCCESS) fatal("MPI_Comm_size of the world failed");
    const int mine = result == MPI_SUCCESS ? size : world_rank;
    // (also: nobody counts before everyone has cleared its counters)
    if (MPI_Allreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, world) != MPI_SUCCESS)
        fatal("MPI_Allreduce after creating the watchdog's arrival board failed");
    if (first_failed < size) {
        // a window made on some ranks stays unused: freeing it is a collective the others cannot join
        if (first_failed == world_rank) {
            char text[MPI_MAX_ERROR_STRING] = "";
            int length = 0;
            MPI_Error_string(result, text, &length);
            fprintf(stderr, "warning: rank %d cannot create the watchdog's arrival board (MPI_Win_allocate: %s): the "
                    "watchdog works without it, and a timeout names a group's members instead of the ranks that did "
                    "not arrive\n", world_rank, text);
            fflush(stderr);
        }
        std::lock_guard<std::mutex> guard(s.lock);
        s.mpi_from_thread = true;
        return;
    }
    std::lock_guard<std::mutex> guard(s.lock);
    s.board = board;
    s.board_counts = counts;
    s.mpi_from_thread = true;
}

// Frees the board (a collective over the world when there is one, watched) and stops the thread.
inline void watchdog_stop() {
    watchdog::State& s = watchdog::state();
    if (!s.thread.joinable()) return;
    MPI_Win board = MPI_WIN_NULL;
    {
        std::lock_guard<std::mutex> guard(s.lock);  // from here on the thread leaves the board alone
        std::swap(board, s.board);
        s.board_counts = nullptr;
    }
    if (board != MPI_WIN_NULL) {
        CollectiveWait wait(s.world_group, s.world_rank, "the arrival board's release (MPI_Win_free)");
        if (MPI_Win_unlock_all(board) != MPI_SUCCESS || MPI_Win_free(&board) != MPI_SUCCESS)
            fatal("cannot free the watchdog's arrival board");
    }
    {
        std::lock_guard<std::mutex> guard(s.lock);
        s.stopping = true;
    }
    s.wake.notify_all();
    s.thread.join();
    s.timeout_seconds = 0.0;
#ifndef LLMC_CPU
    for (WatchedWait& wait : s.pending) s.spare_events.push_back(wait.done);
    s.pending.clear();
    for (cudaEvent_t event : s.spare_events) cudaCheck(cudaEventDestroy(event));
    s.spare_events.clear();
#endif
}
