/*
Which launcher started this process, and how rank 0 hands the others a start-up id when no MPI does
(llmc/parallel/comm.h's comm_init_world uses both). Read from the environment alone, before any MPI call,
so that a table of environments tests it (dev/test/test_comm.cu).
*/
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <unistd.h>
#include "../utils.h"

enum class Launcher { Single, Mpi, Srun, Torchrun };

inline const char* launcher_name(Launcher launcher) {
    switch (launcher) {
        case Launcher::Mpi: return "MPI";
        case Launcher::Srun: return "srun";
        case Launcher::Torchrun: return "torchrun";
        default: return "none";
    }
}

struct LaunchInfo {
    Launcher launcher = Launcher::Single;
    int rank = 0, size = 1, local_rank = 0;  // MPI: what the environment announces; size 0 = MPI_Init will tell
    std::string error;                       // not empty: the environment contradicts itself
};

// Where variables are read from: getenv in the program, a table in the tests.
using EnvironmentLookup = std::function<const char*(const char* name)>;
inline const char* process_environment(const char* name) { return getenv(name); }

// Which launcher started this process, read from the environment alone (no MPI call), so a table of
// environments tests it. The innermost launcher wins: torchrun is often started by srun, and mpirun inside
// a Slurm job; each leaves the outer launcher's variables in place.
//
//   row  variables present                                    launcher   rank / size / local rank
//   1    OMPI_COMM_WORLD_SIZE or PMI_SIZE > 1, or PMIX_RANK    MPI        from MPI_Init (PMIx announces no
//        alone (srun --mpi=pmix)                                          size; the srun step's is expected)
//   2    RANK + WORLD_SIZE (+ LOCAL_RANK, LOCAL_WORLD_SIZE)   torchrun   RANK / WORLD_SIZE / LOCAL_RANK
//   3    SLURM_STEP_ID (or SLURM_STEPID) of a task step       srun       SLURM_PROCID / SLURM_STEP_NUM_TASKS /
//        + SLURM_STEP_NUM_TASKS                                          SLURM_LOCALID
//   4    OMPI_COMM_WORLD_SIZE or PMI_SIZE = 1                 MPI        0 / 1 / 0
//   5    none of these                                        none       0 / 1 / 0
//
// The first row that matches decides. Slurm counts only inside a task step that srun started: a batch
// script (sbatch) or salloc's interactive step has SLURM_NTASKS (the job's allocation, not this launch)
// and SLURM_PROCID=0 but no step id, or one of the ids Slurm reserves for its own steps at the top of the
// range, and a program run there is ONE process. An MPI that announces
// one rank does not hide an srun or torchrun launch of several (row 4 comes after rows 2 and 3).
// Errors: values that are not counts, a rank outside its world, RANK without WORLD_SIZE (or the other way
// round), a Slurm step without its task count, and two launchers that announce different numbers of
// ranks above one (srun -n 2 mpirun -np 4 starts two separate worlds of 4).
inline LaunchInfo detect_launcher(const EnvironmentLookup& env = process_environment) {
    LaunchInfo info;
    auto fail = [&](const std::string& message) {
        if (info.error.empty()) info.error = message;
    };
    // the variable as an integer: `absent` when unset or empty; an error when it is not an integer
    const long long absent = -1;
    auto read = [&](const char* name, bool allow_negative = false) -> long long {
        const char* text = env(name);
        if (!text || !*text) return absent;
        char* end = nullptr;
        errno = 0;
        long long value = strtoll(text, &end, 10);
        if (*end != '\0' || errno == ERANGE || (value < 0 && !allow_negative) || value > 0xffffffffLL) {
            fail(std::string("environment variable ") + name + "=" + text + " is not a count");
            return absent;
        }
        return value;
    };
    auto place = [&](Launcher launcher, long long rank, long long size, long long local_rank,
                     const char* rank_name, const char* size_name) {
        info.launcher = launcher;
        if (size < 1 || size > INT32_MAX) fail(std::string(size_name) + "=" + std::to_string(size) + " must be at least 1");
        else if (rank < 0 || rank >= size)
            fail(std::string(launcher_name(launcher)) + " says " + rank_name + "=" + std::to_string(rank) +
                 " of " + size_name + "=" + std::to_string(size) + " ranks");
        info.rank = (int)std::max(0LL, std::min(rank, (long long)INT32_MAX));
        info.size = (int)std::max(0LL, std::min(size, (long long)INT32_MAX));
        info.local_rank = (int)std::max(0LL, std::min(local_rank, (long long)INT32_MAX));
    };

    // MPI: Open MPI's mpirun, a PMI-1/PMI-2 launcher (MPICH's Hydra, srun --mpi=pmi2), or PMIx
    long long mpi_size = read("OMPI_COMM_WORLD_SIZE");
    long long mpi_rank = read("OMPI_COMM_WORLD_RANK");
    if (mpi_size == absent) mpi_size = read("PMI_SIZE"), mpi_rank = read("PMI_RANK");
    const bool pmix_only = mpi_size == absent && env("PMIX_RANK") != nullptr;
    if (pmix_only) mpi_rank = read("PMIX_RANK");
    // torchrun (and other launchers that follow its convention)
    const long long world_size = read("WORLD_SIZE"), torch_rank = read("RANK");
    const long long local_world_size = read("LOCAL_WORLD_SIZE"), torch_local_rank = read("LOCAL_RANK");
    if ((world_size == absent) != (torch_rank == absent))
        fail(world_size == absent ? "RANK is set but WORLD_SIZE is not" : "WORLD_SIZE is set but RANK is not");
    const bool torchrun = world_size != absent && torch_rank != absent;
    // srun: a regular step id; Slurm's own steps (batch script, interactive shell, extern) use the top ids
    long long step_id = read("SLURM_STEP_ID", true);
    if (step_id == absent) step_id = read("SLURM_STEPID", true);
    const bool task_step = step_id >= 0 && step_id < 0xfffffff0LL;
    const long long step_tasks = task_step ? read("SLURM_STEP_NUM_TASKS") : absent;
    if (task_step && step_tasks == absent) fail("SLURM_STEP_ID is set but SLURM_STEP_NUM_TASKS is not");
    const long long slurm_rank = task_step ? read("SLURM_PROCID") : absent;
    if (task_step && slurm_rank == absent) fail("SLURM_STEP_ID is set but SLURM_PROCID is not");

    auto disagree = [&](const char* a, long long a_size, const char* b, long long b_size) {
        if (a_size > 1 && b_size > 1 && a_size != b_size)
            fail(std::string("contradictory launchers: ") + a + " announces " + std::to_string(a_size) +
                 " ranks and " + b + " " + std::to_string(b_size));
    };
    if (mpi_size > 1 || pmix_only) {  // row 1
        disagree("MPI", mpi_size, "torchrun (WORLD_SIZE)", torchrun ? world_size : absent);
        if (pmix_only && torchrun && world_size > 1)
            fail("contradictory launchers: MPI (PMIx) and torchrun (WORLD_SIZE=" + std::to_string(world_size) +
                 ") both started this process");
        disagree("MPI", mpi_size, "srun (SLURM_STEP_NUM_TASKS)", step_tasks);
        const long long expected = mpi_size > 1 ? mpi_size : (step_tasks > 0 ? step_tasks : 0);
        info.launcher = Launcher::Mpi;
        info.size = (int)std::min(expected, (long long)INT32_MAX);
        info.rank = (int)std::max(0LL, std::min(mpi_rank, (long long)INT32_MAX));
        if (expected > 0 && mpi_rank >= expected)
            fail("MPI says rank " + std::to_string(mpi_rank) + " of " + std::to_string(expected) + " ranks");
    } else if (torchrun) {  // row 2
        place(Launcher::Torchrun, torch_rank, world_size, torch_local_rank == absent ? 0 : torch_local_rank,
              "RANK", "WORLD_SIZE");
        if (local_world_size != absent && (local_world_size < 1 || local_world_size > world_size))
            fail("LOCAL_WORLD_SIZE=" + std::to_string(local_world_size) + " must be between 1 and WORLD_SIZE=" +
                 std::to_string(world_size));
        else if (local_world_size != absent && torch_local_rank >= local_world_size)
            fail("torchrun says LOCAL_RANK=" + std::to_string(torch_local_rank) + " of LOCAL_WORLD_SIZE=" +
                 std::to_string(local_world_size));
    } else if (task_step && step_tasks != absent && slurm_rank != absent) {  // row 3
        const long long local = read("SLURM_LOCALID");
        place(Launcher::Srun, slurm_rank, step_tasks, local == absent ? 0 : local, "SLURM_PROCID",
              "SLURM_STEP_NUM_TASKS");
    } else if (mpi_size == 1) {  // row 4
        info.launcher = Launcher::Mpi;
        if (mpi_rank > 0) fail("MPI says rank " + std::to_string(mpi_rank) + " of 1 rank");
    }
    return info;
}

// Rank 0 publishes `size` bytes at `path`; every other rank waits up to `timeout_seconds` for them.
// Rank 0 writes a temporary file and renames it into place, so a reader never sees half a file. The path
// must be fresh for every run (put the job id in it): rank 0 refuses one that already exists, because the
// other ranks might already have read a stale id from it. Rank 0 removes it once everyone has joined.
inline void share_through_file(const std::string& path, int rank, void* bytes, size_t size, double timeout_seconds) {
    if (rank == 0) {
        if (file_exists(path))
            fatal("%s already exists (left by an earlier run?): remove it or give every run its own path",
                  path.c_str());
        std::string temporary = path + ".tmp." + std::to_string(getpid());
        FILE* file = open_file(temporary, "wb");
        write_exact(bytes, 1, size, file, temporary);
        if (fflush(file) != 0 || fsync(fileno(file)) != 0) fatal("cannot write %s: %s", temporary.c_str(), strerror(errno));
        close_file(file, temporary);
        if (rename(temporary.c_str(), path.c_str()) != 0)
            fatal("cannot rename %s to %s: %s", temporary.c_str(), path.c_str(), strerror(errno));
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    while (!file_exists(path) || file_size(path) != size) {
        double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > timeout_seconds)
            fatal("rank %d waited %.0f s for %s from rank 0: is rank 0 running, and is the path on a file system "
                  "all ranks share?", rank, waited, path.c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FILE* file = open_file(path, "rb");
    read_exact(bytes, 1, size, file, path, "the shared bootstrap id");
    close_file(file, path);
}
