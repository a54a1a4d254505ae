/*
The pieces every part of the communication layer (llmc/parallel/comm.h) shares: every MPI and NCCL call
checked (mpiCheck, and ncclCheck, which brackets the call for the watchdog and waits for a non-blocking
communicator to settle), the Communicator, the reductions and the element types that can travel, and a
point-to-point operation (PointToPoint), which send_and_receive groups.
*/
#pragma once


#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include <type_traits>
#include <chrono>
#include <thread>
#include <unistd.h>
#include "../cuda_common.cuh"
#include "../device_memory.h"
#include "../utils.h"
#include "watchdog.h"

#define OMPI_SKIP_MPICXX 1  // the C API is all we use; OpenMPI's deprecated C++ bindings stay out
#include <mpi.h>
#ifndef LLMC_CPU
#include <nccl.h>
#endif

// ----------------------------------------------------------------------------
// checking every call

inline void mpi_check_impl(int result, const char* call, const char* file, int line) {
    if (result == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(result, text, &length);
    fatal("MPI call %s failed at %s:%d: %s", call, file, line, text);
}
#define mpiCheck(call) mpi_check_impl((call), #call, __FILE__, __LINE__)

#ifndef LLMC_CPU
inline void nccl_fail(ncclResult_t result, const char* call, const char* file, int line) {
    std::string detail = ncclGetLastError(nullptr);
    for (char& c : detail) if (c == '\n') c = ' ';  // the message stays on one line
    fatal("NCCL call %s failed at %s:%d: %s (%s)", call, file, line, ncclGetErrorString(result), detail.c_str());
}
// The communicators are non-blocking (see "The watchdog" above): a call may return ncclInProgress and finish
// in the background, before its work is even on the stream. So the host waits here until `comm` (when
// given: one being created, split or finalized) and every communicator the watchdog knows are done, with
// the watchdog watching the wait through the bracket ncclCheck opens.
inline void nccl_settle(ncclResult_t result, const char* call, const char* file, int line, ncclComm_t comm = nullptr) {
    if (result != ncclSuccess && result != ncclInProgress) nccl_fail(result, call, file, line);
    if (result == ncclSuccess && !comm) return;
    std::vector<ncclComm_t> unsettled = watched_nccl_communicators();
    if (comm) unsettled.push_back(comm);
    while (!unsettled.empty()) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t query = watched_async_state(unsettled.back(), &state);
        if (query != ncclSuccess) nccl_fail(query, call, file, line);
        if (state == ncclInProgress) std::this_thread::yield();
        else if (state == ncclSuccess) unsettled.pop_back();
        else nccl_fail(state, call, file, line);
    }
}
// Every NCCL call, watched from before it starts (HostCallWait): creating, splitting, a group's end and the
// first use of a link can block the host until the peers join.
#define ncclCheck(call) \
    do { \
        HostCallWait watched_call_(#call); \
        const ncclResult_t result_ = (call); \
        nccl_settle(result_, #call, __FILE__, __LINE__); \
    } while (0)
// The same for a call that creates, splits or finalizes a communicator. `runs_under` is the communicator whose
// background job does the work (a split's parent; the communicator itself otherwise); once it has settled, the
// job has written `comm` (a split's child is written by that job, after the call has returned: read before, it
// is still null) and `comm`, when there is one, is settled too.
#define ncclCheckCreated(call, comm, runs_under) \
    do { \
        HostCallWait watched_call_(#call); \
        const ncclResult_t result_ = (call); \
        nccl_settle(result_, #call, __FILE__, __LINE__, (runs_under)); \
        if ((comm) != nullptr) nccl_settle(ncclInProgress, #call, __FILE__, __LINE__, (comm)); \
    } while (0)
#endif

// ----------------------------------------------------------------------------
// the communicator

struct Communicator {
    int rank = 0;                  // this rank's place in the group, 0 .. size-1
    int size = 1;
    MPI_Comm mpi = MPI_COMM_NULL;  // CPU build: the group. GPU build: only the world, only when MPI launched us
#ifndef LLMC_CPU
    ncclComm_t nccl = nullptr;
    float* barrier_token = nullptr;  // one float of device memory that barrier() all-reduces
#endif
    uint64_t bytes_sent = 0;       // see "Counting bytes" above; reset it by assigning 0
    int watch = -1;                // the group as the watchdog names it (llmc/parallel/watchdog.h)
    uint64_t identity = 0;         // the same on every member, different for every group (comm_split)
    int splits = 0;                // comm_split calls made on it so far (alike on all its members)
};

// FNV-1a over 64-bit words, then mixed so that neighbouring inputs land far apart
inline uint64_t hash_words(const std::vector<uint64_t>& words) {
    uint64_t h = 1469598103934665603ULL;
    for (uint64_t word : words)
        for (int byte = 0; byte < 8; byte++) h = (h ^ ((word >> (8 * byte)) & 0xff)) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    return h ^ (h >> 33);
}

enum class Reduction { Sum, Average, Max };

// Element types that can travel: float and bf16 (floatX is one of them in either precision).
template <typename T>
constexpr bool is_comm_element = std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>;

#ifdef LLMC_CPU
// MPI's view of the raw elements, for operations that only move them
template <typename T>
MPI_Datatype mpi_raw_type() {
    static_assert(is_comm_element<T>, "communication supports float and bf16 buffers");
    return std::is_same_v<T, float> ? MPI_FLOAT : MPI_UINT16_T;
}
// MPI counts are ints; a larger message would silently wrap
inline int mpi_count(size_t count) {
    if (count > (size_t)INT32_MAX) fatal("a message of %zu elements is too large for one MPI call", count);
    return (int)count;
}
// MPI's operation for a reduction (Average is a sum, divided afterwards)
inline MPI_Op mpi_op(Reduction op) { return op == Reduction::Max ? MPI_MAX : MPI_SUM; }
// bf16 elements widened to fp32 for a reduction, and rounded back once after it
template <typename T>
std::vector<float> widen(const T* data, size_t count) {
    std::vector<float> wide(count);
    for (size_t i = 0; i < count; i++) wide[i] = (float)data[i];
    return wide;
}
template <typename T>
void narrow(T* data, const float* wide, size_t count, float divisor) {
    for (size_t i = 0; i < count; i++) data[i] = (T)(wide[i] / divisor);
}
#else
template <typename T>
ncclDataType_t nccl_type() {
    static_assert(is_comm_element<T>, "communication supports float and bf16 buffers");
    return std::is_same_v<T, float> ? ncclFloat32 : ncclBfloat16;
}
inline ncclRedOp_t nccl_op(Reduction op) {
    switch (op) {
        case Reduction::Sum: return ncclSum;
        case Reduction::Average: return ncclAvg;
        case Reduction::Max: return ncclMax;
    }
    fatal("unknown reduction %d", (int)op);
}
#endif

// passes * (n-1)/n of `bytes`, rounded down once: what leaves a rank in `passes` trips around the ring
inline uint64_t ring_share(uint64_t bytes, int n, int passes = 1) {
    return (uint64_t)passes * bytes * (uint64_t)(n - 1) / (uint64_t)n;
}

// ----------------------------------------------------------------------------
// point to point

// Point to point: a group of sends and receives that complete together.
//
// NCCL's send and receive block the GPU until the peer arrives, and operations that must progress at the same
// time have to be in one group (ncclGroupStart/End): 1F1B's neighbours each send one message and receive the
// other's at the same moment, and two lone operations would wait for each other forever. So every pipeline
// transfer goes through send_and_receive(), which issues its operations as one group. Messages between the
// same two ranks on one communicator are paired in the order they are issued, per direction (NCCL has no tags).
// `watch` names the group the watchdog reports a stalled operation under, when that is not the communicator
// itself: the pipeline's neighbour links are named groups of the pp axis (llmc/parallel/pipeline.h), so
// the axis' own arrival counts stay those of its collectives. Its members must be the communicator's.
struct PointToPoint {
    enum Kind { Send, Receive } kind;
    Communicator* comm;
    floatX* data;
    size_t count;
    int peer;        // the other end's rank in comm
    int watch = -1;  // the watchdog's group (-1: comm's)
};

// The operation the watchdog names if a group stalls: a receive (what this rank waits for), else a send; and
// the group it names it under.
inline const PointToPoint& p2p_named_operation(const std::vector<PointToPoint>& operations) {
    for (const PointToPoint& op : operations)
        if (op.kind == PointToPoint::Receive) return op;
    return operations[0];
}
inline int p2p_watch_group(const PointToPoint& op) { return op.watch >= 0 ? op.watch : op.comm->watch; }
inline const char* p2p_operation_name(const PointToPoint& op) {
    return op.kind == PointToPoint::Receive ? "receive" : "send";
}
