/*
NCCL's rules, as the CPU build keeps them (the GPU build has NCCL itself; llmc/parallel/comm.h runs these
where its CPU branches talk MPI).

The CPU build is as strict as NCCL. MPI forgives what NCCL does not, so the CPU build keeps NCCL's rules, and
a structure that would hang on GPUs hangs on the laptop first (where the watchdog names it):
  - A group of sends and receives over several communicators progresses one communicator at a time: NCCL
    launches one kernel per communicator, one after the other on the stream, in an order it chooses (its
    user guide, "Using multiple NCCL communicators concurrently"). send_and_receive runs a sub-group per
    communicator (post all its operations, wait for all), in the order LLMC_CPU_GROUP_ORDER names:
      hash     (the default) by the communicator's identity, a hash of how it was made (its parent's
               identity, which split of the parent, the color, its members and name): both ends agree
      reverse  the reverse of that: the other order NCCL could pick with both ends agreeing
      issue    the order in which this rank first names each communicator in the group: the ends may
               disagree, which a group whose ends name its communicators in different orders cannot survive
    Within a communicator the messages between two ranks pair in the order they are posted, per direction.
    The tests run the pipeline suites under hash and reverse (scripts/test/test_pipeline*.sh).
  - A send completes only with its receive: every send of send_and_receive, send_recv and all_to_all_v is
    synchronous (MPI_Issend), where MPI's plain sends return early for small messages.
  - Creating or splitting a communicator is a collective of its members: comm_split ends with a barrier on
    the new group, as ncclCommSplit returns only once every member has joined.
  - NCCL connects lazily, and the calling thread blocks until the other end comes: the first send or
    receive between two ranks on a communicator waits for the peer's first use of that link (a token each
    way, on a tag of its own), and the first collective on a communicator waits for every member's (a
    barrier). Both are watched as the operation "connect". The CPU device runs a stream's work as it is
    issued, so this happens at issue time as on the GPU's host thread (under LLMC_CPU_LATE_STREAMS it
    waits with the stream's work: the CPU device cannot run a stream while its host thread is blocked).
*/
#pragma once

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include "communicator.h"

#ifdef LLMC_CPU
constexpr int kDataTag = 0, kConnectTag = 1;  // data, and the tokens of a first use (never mistaken for data)

// Which links (communicator, peer; peer -1: the communicator's collectives) this rank has used
struct FirstUses {
    std::mutex lock;
    std::set<std::pair<MPI_Comm, int>> connected;
};
inline FirstUses& first_uses() {
    static FirstUses* uses = new FirstUses;  // never destroyed: a rank may exit with a stream still queued
    return *uses;
}
inline bool first_use(MPI_Comm comm, int peer) {
    FirstUses& uses = first_uses();
    std::lock_guard<std::mutex> guard(uses.lock);
    return uses.connected.insert({comm, peer}).second;
}
inline void forget_first_uses(MPI_Comm comm) {
    FirstUses& uses = first_uses();
    std::lock_guard<std::mutex> guard(uses.lock);
    for (auto it = uses.connected.begin(); it != uses.connected.end();)
        it = it->first == comm ? uses.connected.erase(it) : std::next(it);
}

// The first collective on a communicator waits for every member's first (NCCL connects its rings then).
inline void connect_collective(MPI_Comm comm, int watch, int me) {
    if (!first_use(comm, -1)) return;
    CollectiveWait wait(watch, me, "connect");
    mpiCheck(MPI_Barrier(comm));
}

// The first send or receive between this rank and each of `peers` on `comm` waits until the peer has come
// to its own first use of the link: a token each way, synchronous, on a tag of its own.
inline void connect_peers(MPI_Comm comm, const std::vector<int>& peers, int watch, int me) {
    std::vector<int> fresh;
    for (int peer : peers)
        if (std::find(fresh.begin(), fresh.end(), peer) == fresh.end() && first_use(comm, peer)) fresh.push_back(peer);
    if (fresh.empty()) return;
    CollectiveWait wait(watch, me, "connect", fresh[0]);
    std::vector<char> tokens(fresh.size());
    const char token = 0;
    std::vector<MPI_Request> requests(2 * fresh.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < fresh.size(); i++) {
        mpiCheck(MPI_Issend(&token, 1, MPI_CHAR, fresh[i], kConnectTag, comm, &requests[2 * i]));
        mpiCheck(MPI_Irecv(&tokens[i], 1, MPI_CHAR, fresh[i], kConnectTag, comm, &requests[2 * i + 1]));
    }
    mpiCheck(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE));
}

enum class GroupOrder { Hash, Reverse, Issue };

// LLMC_CPU_GROUP_ORDER, read once; a bad value stops the program with one line
inline GroupOrder cpu_group_order() {
    static const GroupOrder order = [] {
        const char* value = getenv("LLMC_CPU_GROUP_ORDER");
        const std::string text = value ? value : "";
        if (text.empty() || text == "hash") return GroupOrder::Hash;
        if (text == "reverse") return GroupOrder::Reverse;
        if (text == "issue") return GroupOrder::Issue;
        fatal("LLMC_CPU_GROUP_ORDER=%s: expected hash, reverse or issue", text.c_str());
    }();
    return order;
}

// A group's operations as NCCL runs them: one sub-group per communicator, in LLMC_CPU_GROUP_ORDER's order
// (by identity, its reverse, or the order in which this rank first names each communicator).
inline std::vector<std::vector<PointToPoint>> sub_groups(const std::vector<PointToPoint>& operations,
                                                         GroupOrder order) {
    std::vector<std::vector<PointToPoint>> groups;
    std::vector<uint64_t> identities;
    for (const PointToPoint& op : operations) {
        size_t g = 0;
        while (g < groups.size() && groups[g][0].comm->mpi != op.comm->mpi) g++;
        if (g == groups.size()) groups.emplace_back(), identities.push_back(op.comm->identity);
        groups[g].push_back(op);
    }
    if (order == GroupOrder::Issue) return groups;
    std::vector<size_t> by(groups.size());
    for (size_t g = 0; g < by.size(); g++) by[g] = g;
    std::sort(by.begin(), by.end(), [&](size_t a, size_t b) {
        return order == GroupOrder::Hash ? identities[a] < identities[b] : identities[a] > identities[b];
    });
    std::vector<std::vector<PointToPoint>> sorted;
    for (size_t g : by) sorted.push_back(groups[g]);
    return sorted;
}

// A sub-group's first uses of its links, just before its operations. NCCL connects a whole group's links at
// ncclGroupEnd, before any of its kernels run, but its host thread runs ahead of the GPU; the CPU device runs
// a stream's work on the host thread, and connecting all of a group's links first would also wait for peers
// that reach a link only after this group's earlier sub-groups have moved their data, which NCCL does not.
inline void connect_sub_group(const std::vector<PointToPoint>& operations) {
    const PointToPoint& named = p2p_named_operation(operations);
    std::vector<int> peers;
    for (const PointToPoint& op : operations) peers.push_back(op.peer);
    connect_peers(named.comm->mpi, peers, p2p_watch_group(named), named.comm->rank);
}

// One sub-group: every operation posted and all of them waited for. The sends are synchronous (MPI_Issend
// completes only once the matching receive has started): MPI's plain sends return early for small messages
// and would hide a structure that deadlocks on a GPU.
inline void run_sub_group(const std::vector<PointToPoint>& operations) {
    const PointToPoint& named = p2p_named_operation(operations);
    const MPI_Comm comm = named.comm->mpi;
    CollectiveWait wait(p2p_watch_group(named), named.comm->rank, p2p_operation_name(named), named.peer);
    std::vector<MPI_Request> requests(operations.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < operations.size(); i++) {
        const PointToPoint& op = operations[i];
        const int count = mpi_count(op.count);
        if (op.kind == PointToPoint::Send)
            mpiCheck(MPI_Issend(op.data, count, mpi_raw_type<floatX>(), op.peer, kDataTag, comm, &requests[i]));
        else
            mpiCheck(MPI_Irecv(op.data, count, mpi_raw_type<floatX>(), op.peer, kDataTag, comm, &requests[i]));
    }
    mpiCheck(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE));
}
#endif
