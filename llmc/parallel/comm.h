/*
Collective communication between the ranks of a training job, written once for both builds.

  GPU build: NCCL on device memory. Each call is enqueued on the caller's stream and returns before the
             data has moved, exactly like a kernel launch: order it with the kernels around it.
  CPU build: MPI on host memory (the CPU device's "device memory"). Each call runs where the CPU device
             runs the stream's kernels: at once, or, with LLMC_CPU_LATE_STREAMS=1 on a non-blocking
             stream, when the stream is forced (llmc/cpu/runtime.h). So each body captures its arguments
             by value, MPI handle included, and only the byte count is updated when the call is issued.

A Communicator is a group of ranks: its size, this rank's place in it, and the MPI or NCCL handle. The
world is one; the device mesh (llmc/parallel/mesh.h) splits it into one per parallel axis.

The operations, with `count` in elements and every buffer in device memory of T = float or floatX:
  all_reduce(comm, data, count, op, stream)        data = sum (mean, max) of everyone's data, in place
  reduce_scatter(comm, out, in, count, op, stream) in holds size*count; out = block `rank` of the sum/mean/max
  all_gather(comm, out, in, count, stream)         out holds size*count; block r is rank r's `in`
  broadcast(comm, data, count, root, stream)       everyone's data = root's data
  send_and_receive(operations, stream)             point to point: sends and receives (PointToPoint) as one
                                                   group that completes when all of them have
  send_recv(comm, send_data, send_peer, recv_data, recv_peer, count, stream)
                                                   a send and a receive at once: a ring shift cannot deadlock
  all_to_all(comm, out, in, count, stream)         block p of in goes to rank p; block p of out came from p
  all_to_all_v(comm, out, receive_counts, in, send_counts, stream)
                                                   the same with blocks of any size (host counts, one per
                                                   peer, laid out one after the other): routed tokens
  barrier(comm, stream)                            returns when every rank got there (the stream drained)
The reductions (op): Sum; Average, which means sum / size; Max, the elementwise maximum. The CPU build
sums and then divides; NCCL (ncclAvg) may fold the division in elsewhere, so the two can differ in the
last bit. Max is exact in both builds and in both types (the maximum of some values is one of them), for
all_reduce and reduce_scatter alike; it is what the vocabulary-parallel softmax needs for its row maxima.
NaN inputs to Max are not defined (MPI and NCCL may treat them differently).

bf16 reductions. MPI has no bf16 type, so the CPU build widens bf16 buffers to fp32, reduces in fp32 and
rounds once to bf16 at the end (for Max the rounding changes nothing). NCCL reduces bf16 in bf16 along its
ring, rounding at every hop, so with many ranks the GPU's sums can differ from the CPU's in the last bits.
Moving bf16 data without arithmetic (gather, broadcast, point to point, all-to-all) is bit-exact in both
builds.

Counting bytes. Every call adds to comm.bytes_sent the bytes THIS rank puts on the wire under the standard
ring algorithms, for n = comm.size ranks and element size s (2 for bf16 even where the CPU build reduces
in fp32: the count describes the algorithm, so CPU runs predict GPU traffic):
  all_reduce      2 (n-1)/n * count*s     a ring reduce-scatter then a ring all-gather; in each phase a rank
                                          sends n-1 of the n chunks of the buffer
  reduce_scatter  (n-1) * count*s         = (n-1)/n of the n*count input: every chunk but its own, once
  all_gather      (n-1) * count*s         = (n-1)/n of the n*count output: its own chunk passes n-1 hops
  broadcast       (n-1)/n * count*s       a pipelined chain root -> ... -> last: every rank but the last
                                          forwards the whole buffer. Charged as the average over ranks, so
                                          every rank counts the same and the ranks' sum is the true (n-1)*count*s
  send_and_receive count*s per send       (a receive counts nothing: the sender pays)
  send_recv       count*s
  all_to_all      (n-1) * count*s         one block to each other rank; its own block is a local copy
  all_to_all_v    sum of send_counts[p] s over the other ranks p
  barrier         0                       synchronisation, not data
Fractions are rounded down to whole bytes, once per call. A single rank (n = 1) sends nothing.

Every MPI and NCCL call is checked; a failure stops the program with one line naming the call.

The CPU build is as strict as NCCL: where MPI forgives what NCCL does not (a group over several communicators,
an early-returning send, a split or a first use that waits for nobody), the CPU build keeps NCCL's rule, so a
structure that would hang on GPUs hangs on the laptop first. The rules and LLMC_CPU_GROUP_ORDER are
llmc/parallel/cpu_nccl_rules.h's; the communicator, the checked calls and the element types that every piece
shares are llmc/parallel/communicator.h's; which launcher started the job, llmc/parallel/launcher.h's.

The watchdog (llmc/parallel/watchdog.h). A rank that stops (a dead GPU, a hung process, a lost node) leaves
the others blocked in their next collective forever, because NCCL and MPI wait for every member. So every
operation above reports itself to a watchdog: a thread per rank, started by parallel_create with
--collective-timeout seconds before MPI or NCCL starts, which ends the job once this rank has waited longer
than that in ONE operation: one `error:` line naming this rank, the operation (and its peer, point to
point), the group (dp, shard, tp, a pp link, cp ...), the step, and the ranks that did not arrive.
  Start-up is watched too. MPI_Init, NCCL's creation of the world and every split wait for all members, so
    a rank that never gets there (a node that does not boot, a process stopped before MPI starts) would
    leave the others blocked before any collective exists. The thread runs from before MPI_Init, naming
    this rank as the launcher does (OMPI_COMM_WORLD_RANK, ...) and the call it waits in (MPI_Init_thread,
    ncclCommInitRankConfig, split); until the world exists nobody can tell which rank is missing.
  What it reads. Every host call that can block is bracketed (CollectiveWait): the thread sees "in
    all-reduce on the tp group since t". CPU build: every MPI call that waits for others is bracketed. GPU
    build: the communicators are non-blocking (config.blocking = 0), so NCCL's calls return ncclInProgress
    instead of blocking the host: ncclCheck brackets each call and waits, polling ncclCommGetAsyncError, until
    the communicators are settled. That covers creating and splitting a communicator, a group's end, and the
    first use of a link, which NCCL connects lazily and which waits for the peer. Once enqueued, each call
    records an event behind itself on its stream and the thread polls the events (cudaEventQuery) of the
    calls not yet complete; a call's clock starts when it is enqueued, at most one step ahead of the device.
    The thread also polls every communicator's ncclCommGetAsyncError, and an error NCCL found in the
    background (a lost connection, a remote error) ends the job with its own line.
  The end never waits on NCCL alone. After the line, the abort runs on a thread of its own: ncclCommAbort of
    every communicator (GPU), which frees this rank's streams, then MPI_Abort, which has the launcher stop
    every rank. NCCL's abort can hang (in cudaFree, NVIDIA/nccl #549, #992, #1777), and so can MPI_Abort, so
    3 seconds after the line (kAbortGraceSeconds) the process exits whatever is still blocked; a rank that
    exits with a failure makes the launcher stop the others. The CPU build has no NCCL to abort: a step
    that stands in for it lets the tests make it hang (LLMC_FAULT_STALL=abort:RANK). At the end of a run
    the thread stops only after every communicator is finalized (NCCL's finalize waits for every member)
    and the board is freed; MPI_Finalize alone is not watched.
  Who did not arrive. Each rank counts the operations it entered on each group on an arrival board, an
    MPI window that other ranks read without the owner's help (shared memory on a node, RDMA across
    nodes). Members of a group enter its operations in the same order, so a member whose count is below
    this rank's has not arrived; one whose watchdog heartbeat (also on the board) stands still is not
    running at all. Point to point, the peer is the one. Without MPI (torchrun, srun without an MPI plugin),
    or when MPI cannot make the window (said once, and the job goes on), there is no board, and the line
    lists the group's members as the candidates.
  Why a long but healthy step does not fire it. The clock runs only while this rank waits inside one
    operation, and restarts with the next. This rank's own long work (a slow first step, writing its
    checkpoint shard, a validation pass, loading the model) is outside every operation, so it never
    counts; a peer's long work counts only for the time this rank waits for it in a single operation,
    which is bounded by the longest stretch the peer spends between two operations: the step's compute
    between two collectives, or one rank's file I/O (its checkpoint shard, rank 0's model file) before the
    barrier or broadcast that follows it. The default, 600 s, is minutes above all of these at any size
    this program trains (NCCL's and PyTorch's default timeouts are of the same order). Time in which this
    process did not run at all (stopped, or starved of a CPU) is not counted either: each poll adds at most
    two poll intervals, so a rank that was itself stopped does not accuse the others when it resumes.
*/
#pragma once

#include <string>
#include <vector>
#include "communicator.h"
#include "cpu_nccl_rules.h"
#include "launcher.h"

// ----------------------------------------------------------------------------
// collectives

template <typename T>
void all_reduce(Communicator& comm, T* data, size_t count, Reduction op, cudaStream_t stream) {
    comm.bytes_sent += ring_share(count * sizeof(T), comm.size, 2);
#ifdef LLMC_CPU
    const float divisor = op == Reduction::Average ? (float)comm.size : 1.0f;
    const MPI_Op reduction = mpi_op(op);
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_collective(group, watch, me);
        CollectiveWait wait(watch, me, "all-reduce");
        if constexpr (std::is_same_v<T, float>) {
            mpiCheck(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, reduction, group));
            if (op == Reduction::Average) narrow(data, data, count, divisor);
        } else {
            std::vector<float> wide = widen(data, count);
            mpiCheck(MPI_Allreduce(MPI_IN_PLACE, wide.data(), mpi_count(count), MPI_FLOAT, reduction, group));
            narrow(data, wide.data(), count, divisor);
        }
    });
#else
    ncclCheck(ncclAllReduce(data, data, count, nccl_type<T>(), nccl_op(op), comm.nccl, stream));
    watch_enqueued(comm.watch, comm.rank, "all-reduce", -1, stream);
#endif
}

template <typename T>
void reduce_scatter(Communicator& comm, T* out, const T* in, size_t count, Reduction op, cudaStream_t stream) {
    comm.bytes_sent += (uint64_t)(comm.size - 1) * count * sizeof(T);
#ifdef LLMC_CPU
    const MPI_Op reduction = mpi_op(op);
    const MPI_Comm group = comm.mpi;
    const int size = comm.size, watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_collective(group, watch, me);
        CollectiveWait wait(watch, me, "reduce-scatter");
        // MPI wants separate buffers and `out` may be this rank's own block of `in`: reduce into scratch first
        std::vector<float> reduced(count);
        if constexpr (std::is_same_v<T, float>) {
            mpiCheck(MPI_Reduce_scatter_block(in, reduced.data(), mpi_count(count), MPI_FLOAT, reduction, group));
        } else {
            std::vector<float> wide = widen(in, (size_t)size * count);
            mpiCheck(MPI_Reduce_scatter_block(wide.data(), reduced.data(), mpi_count(count), MPI_FLOAT, reduction,
                                              group));
        }
        narrow(out, reduced.data(), count, op == Reduction::Average ? (float)size : 1.0f);
    });
#else
    ncclCheck(ncclReduceScatter(in, out, count, nccl_type<T>(), nccl_op(op), comm.nccl, stream));
    watch_enqueued(comm.watch, comm.rank, "reduce-scatter", -1, stream);
#endif
}

// `in` is either a separate buffer or this rank's own block of `out` (out + rank * count): in place.
template <typename T>
void all_gather(Communicator& comm, T* out, const T* in, size_t count, cudaStream_t stream) {
    comm.bytes_sent += (uint64_t)(comm.size - 1) * count * sizeof(T);
#ifdef LLMC_CPU
    const void* source = in == out + (size_t)comm.rank * count ? MPI_IN_PLACE : (const void*)in;
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_collective(group, watch, me);
        CollectiveWait wait(watch, me, "all-gather");
        mpiCheck(MPI_Allgather(source, mpi_count(count), mpi_raw_type<T>(), out, mpi_count(count), mpi_raw_type<T>(),
                               group));
    });
#else
    ncclCheck(ncclAllGather(in, out, count, nccl_type<T>(), comm.nccl, stream));
    watch_enqueued(comm.watch, comm.rank, "all-gather", -1, stream);
#endif
}

template <typename T>
void broadcast(Communicator& comm, T* data, size_t count, int root, cudaStream_t stream) {
    comm.bytes_sent += ring_share(count * sizeof(T), comm.size);
#ifdef LLMC_CPU
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_collective(group, watch, me);
        CollectiveWait wait(watch, me, "broadcast");
        mpiCheck(MPI_Bcast(data, mpi_count(count), mpi_raw_type<T>(), root, group));
    });
#else
    ncclCheck(ncclBroadcast(data, data, count, nccl_type<T>(), root, comm.nccl, stream));
    watch_enqueued(comm.watch, comm.rank, "broadcast", -1, stream);
#endif
}

inline void send_and_receive(const std::vector<PointToPoint>& operations, cudaStream_t stream) {
    if (operations.empty()) return;
    for (const PointToPoint& op : operations)
        if (op.kind == PointToPoint::Send) op.comm->bytes_sent += op.count * sizeof(floatX);
#ifdef LLMC_CPU
    const std::vector<std::vector<PointToPoint>> groups = sub_groups(operations, cpu_group_order());
    cudacpu::on_stream(stream, [=] {
        for (const std::vector<PointToPoint>& group : groups) {
            connect_sub_group(group);
            run_sub_group(group);
        }
    });
#else
    ncclCheck(ncclGroupStart());
    for (const PointToPoint& op : operations) {
        if (op.kind == PointToPoint::Send) ncclCheck(ncclSend(op.data, op.count, nccl_type<floatX>(), op.peer, op.comm->nccl, stream));
        else ncclCheck(ncclRecv(op.data, op.count, nccl_type<floatX>(), op.peer, op.comm->nccl, stream));
    }
    ncclCheck(ncclGroupEnd());
    const PointToPoint& named = p2p_named_operation(operations);
    watch_enqueued(p2p_watch_group(named), named.comm->rank, p2p_operation_name(named), named.peer, stream);
#endif
}

template <typename T>
void send_recv(Communicator& comm, const T* send_data, int send_peer, T* recv_data, int recv_peer, size_t count,
               cudaStream_t stream) {
    comm.bytes_sent += count * sizeof(T);
#ifdef LLMC_CPU
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_peers(group, {send_peer, recv_peer}, watch, me);
        CollectiveWait wait(watch, me, "receive", recv_peer);  // the send cannot block without the receive
        // a synchronous send, as NCCL's: the call completes only once the receiver has its message
        MPI_Request requests[2];
        mpiCheck(MPI_Issend(send_data, mpi_count(count), mpi_raw_type<T>(), send_peer, kDataTag, group, &requests[0]));
        mpiCheck(MPI_Irecv(recv_data, mpi_count(count), mpi_raw_type<T>(), recv_peer, kDataTag, group, &requests[1]));
        mpiCheck(MPI_Waitall(2, requests, MPI_STATUSES_IGNORE));
    });
#else
    // inside one group NCCL starts both transfers together, so neither side waits for the other to receive
    ncclCheck(ncclGroupStart());
    ncclCheck(ncclSend(send_data, count, nccl_type<T>(), send_peer, comm.nccl, stream));
    ncclCheck(ncclRecv(recv_data, count, nccl_type<T>(), recv_peer, comm.nccl, stream));
    ncclCheck(ncclGroupEnd());
    watch_enqueued(comm.watch, comm.rank, "receive", recv_peer, stream);
#endif
}

template <typename T>
void all_to_all(Communicator& comm, T* out, const T* in, size_t count, cudaStream_t stream) {
    comm.bytes_sent += (uint64_t)(comm.size - 1) * count * sizeof(T);
#ifdef LLMC_CPU
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank;
    cudacpu::on_stream(stream, [=] {
        connect_collective(group, watch, me);
        CollectiveWait wait(watch, me, "all-to-all");
        mpiCheck(MPI_Alltoall(in, mpi_count(count), mpi_raw_type<T>(), out, mpi_count(count), mpi_raw_type<T>(), group));
    });
#else
    // one send and one receive per peer, all in one group (works on every NCCL since 2.7)
    ncclCheck(ncclGroupStart());
    for (int peer = 0; peer < comm.size; peer++) {
        ncclCheck(ncclSend(in + (size_t)peer * count, count, nccl_type<T>(), peer, comm.nccl, stream));
        ncclCheck(ncclRecv(out + (size_t)peer * count, count, nccl_type<T>(), peer, comm.nccl, stream));
    }
    ncclCheck(ncclGroupEnd());
    watch_enqueued(comm.watch, comm.rank, "all-to-all", -1, stream);
#endif
}

// Blocks of any size: send_counts[p] elements of `in` (the blocks one after the other, in peer order) go to rank
// p, and receive_counts[p] elements from rank p land in `out`, also one after the other. Each rank must
// receive from p what p sends to it (exchange the counts first, with all_to_all). The counts are host values,
// read when the call is issued.
template <typename T>
void all_to_all_v(Communicator& comm, T* out, const std::vector<size_t>& receive_counts, const T* in,
                  const std::vector<size_t>& send_counts, cudaStream_t stream) {
    if ((int)send_counts.size() != comm.size || (int)receive_counts.size() != comm.size)
        fatal("all_to_all_v: %zu send and %zu receive counts for a group of %d", send_counts.size(),
              receive_counts.size(), comm.size);
    for (int peer = 0; peer < comm.size; peer++)
        if (peer != comm.rank) comm.bytes_sent += send_counts[peer] * sizeof(T);
#ifdef LLMC_CPU
    // the operations NCCL's path issues (one send and one receive per peer with something to move), with
    // synchronous sends: the call completes only once every receiver has its block
    std::vector<int> peers;
    for (int peer = 0; peer < comm.size; peer++)
        if (peer != comm.rank && (send_counts[peer] > 0 || receive_counts[peer] > 0)) peers.push_back(peer);
    const MPI_Comm group = comm.mpi;
    const int watch = comm.watch, me = comm.rank, size = comm.size;
    cudacpu::on_stream(stream, [=] {
        connect_peers(group, peers, watch, me);
        CollectiveWait wait(watch, me, "all-to-all");
        std::vector<MPI_Request> requests;
        size_t send_at = 0, receive_at = 0;
        for (int peer = 0; peer < size; peer++) {
            MPI_Request request;
            if (send_counts[peer] > 0) {
                mpiCheck(MPI_Issend(in + send_at, mpi_count(send_counts[peer]), mpi_raw_type<T>(), peer, kDataTag, group,
                                    &request));
                requests.push_back(request);
            }
            if (receive_counts[peer] > 0) {
                mpiCheck(MPI_Irecv(out + receive_at, mpi_count(receive_counts[peer]), mpi_raw_type<T>(), peer, kDataTag,
                                   group, &request));
                requests.push_back(request);
            }
            send_at += send_counts[peer];
            receive_at += receive_counts[peer];
        }
        mpiCheck(MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE));
    });
#else
    ncclCheck(ncclGroupStart());
    size_t send_at = 0, receive_at = 0;
    for (int peer = 0; peer < comm.size; peer++) {
        if (send_counts[peer] > 0)
            ncclCheck(ncclSend(in + send_at, send_counts[peer], nccl_type<T>(), peer, comm.nccl, stream));
        if (receive_counts[peer] > 0)
            ncclCheck(ncclRecv(out + receive_at, receive_counts[peer], nccl_type<T>(), peer, comm.nccl, stream));
        send_at += send_counts[peer];
        receive_at += receive_counts[peer];
    }
    ncclCheck(ncclGroupEnd());
    watch_enqueued(comm.watch, comm.rank, "all-to-all", -1, stream);
#endif
}

// Device room for the host helpers below: values go up into it, move, and come back before the helper
// returns (each ends by waiting for its stream), so one buffer serves every helper and every communicator.
// It grows on first need and is kept, so that a helper called every token (sampling) or every step (a
// mixture of experts' counts, the log) allocates nothing once warm. Reachable until the process ends.
inline void* host_exchange_bytes(size_t bytes) {
    static void* room = nullptr;
    static size_t room_bytes = 0;
    if (bytes > room_bytes) {
        tracked_free(room);
        room = tracked_alloc<unsigned char>(bytes, MemoryKind::Communication, "host exchanges");
        room_bytes = bytes;
    }
    return room;
}
template <typename T>
T* host_exchange_room(size_t count) {
    return static_cast<T*>(host_exchange_bytes(count * sizeof(T)));
}

// Host values on `root` become the same on every rank of the group (through device memory, which is what
// the collectives move).
template <typename T>
void broadcast_host(Communicator& comm, T* values, size_t count, int root, cudaStream_t stream) {
    if (comm.size == 1) return;
    T* device = host_exchange_room<T>(count);
    copy_to_device(device, values, count, stream);
    broadcast(comm, device, count, root, stream);
    copy_to_host(values, device, count, stream);
}

// One number from every rank of the group, on all of them, in group order (a collective): for reports.
inline std::vector<float> gather_values(Communicator& comm, float value, cudaStream_t stream) {
    std::vector<float> values(comm.size, value);
    if (comm.size == 1) return values;
    float* device = host_exchange_room<float>(comm.size);
    copy_to_device(device + comm.rank, &value, 1, stream);
    all_gather(comm, device, device + comm.rank, 1, stream);
    copy_to_host(values.data(), device, comm.size, stream);
    return values;
}

// 64-bit words (ids, checksums, counts) travel as four bf16 elements each, because moving bf16 without
// arithmetic is bit-exact in both builds. broadcast_word: root's word on every rank of the group.
// all_gather_words: every rank's `count` words, rank after rank, through `room` (device memory for 4 count x
// group size bf16 values) when given, through the shared exchange room otherwise.
inline void broadcast_word(Communicator& comm, uint64_t* word, int root, cudaStream_t stream) {
    broadcast_host(comm, reinterpret_cast<__nv_bfloat16*>(word), 4, root, stream);
}
inline std::vector<uint64_t> all_gather_words(Communicator& comm, const std::vector<uint64_t>& mine,
                                              cudaStream_t stream, __nv_bfloat16* room = nullptr) {
    const size_t count = mine.size();
    std::vector<uint64_t> everyone(count * comm.size);
    std::copy(mine.begin(), mine.end(), everyone.begin() + comm.rank * count);
    if (comm.size == 1 || count == 0) return everyone;
    __nv_bfloat16* device = room ? room : host_exchange_room<__nv_bfloat16>(everyone.size() * 4);
    __nv_bfloat16* host = reinterpret_cast<__nv_bfloat16*>(everyone.data());
    copy_to_device(device + comm.rank * count * 4, host + comm.rank * count * 4, count * 4, stream);
    all_gather(comm, device, device + comm.rank * count * 4, count * 4, stream);
    copy_to_host(host, device, everyone.size() * 4, stream);
    return everyone;
}

inline void barrier(Communicator& comm, cudaStream_t stream) {
#ifdef LLMC_CPU
    cudaCheck(cudaStreamSynchronize(stream));  // the stream drained (a no-op unless its work is queued)
    connect_collective(comm.mpi, comm.watch, comm.rank);
    CollectiveWait wait(comm.watch, comm.rank, "barrier");
    mpiCheck(MPI_Barrier(comm.mpi));
#else
    // NCCL has no barrier of its own: a one-float all-reduce completes only when every rank has joined
    ncclCheck(ncclAllReduce(comm.barrier_token, comm.barrier_token, 1, ncclFloat32, ncclSum, comm.nccl, stream));
    watch_enqueued(comm.watch, comm.rank, "barrier", -1, stream);
    cudaCheck(cudaStreamSynchronize(stream));
#endif
}

// ----------------------------------------------------------------------------
// bootstrap: who we are, how many we are, the world communicator and its subgroups
//
// CPU build: always MPI. Under mpirun (or srun with PMIx) MPI_Init finds the other ranks; started alone
// it runs as a world of one ("singleton" MPI_Init needs no launcher). Another launcher asking for several
// ranks is refused: its processes would each be a world of one and train alone.
// GPU build: the ranks agree on one NCCL unique id, made by rank 0, and each joins the NCCL world with it.
// Under an MPI launcher the id is broadcast over MPI. A launcher that only sets environment variables
// (srun without an MPI plugin, torchrun) gives no MPI; then rank 0 writes the id to the file named by
// --nccl-init-file, on a file system every rank sees, and the others wait for it. Each rank drives the
// GPU numbered local_rank (modulo the GPUs it can see).

inline void mpi_start() {
    int initialized = 0;
    mpiCheck(MPI_Initialized(&initialized));
    // the watchdog's thread reads the arrival board and may call MPI_Abort while this thread is in MPI
    int provided = 0;
    if (!initialized) {
        CollectiveWait wait(-1, 0, "MPI_Init_thread");  // waits for every rank of the launch
        mpiCheck(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    }
    // report failures through mpiCheck's one line instead of MPI's default abort; split groups inherit this
    mpiCheck(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

#ifndef LLMC_CPU
// Non-blocking: NCCL's calls return at once (ncclInProgress) instead of blocking the host, and ncclCheck
// waits for them with the watchdog watching.
inline ncclConfig_t nccl_config() {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
}

inline void make_barrier_token(Communicator& comm) {
    cudaCheck(cudaMalloc(&comm.barrier_token, sizeof(float)));
    cudaCheck(cudaMemset(comm.barrier_token, 0, sizeof(float)));
}
#endif

// The world: every rank of the job. `nccl_init_file` (--nccl-init-file) is needed only by the GPU build
// when a launcher other than MPI starts several ranks. Rank 0 prints the launcher it found. Each call that
// waits for the other ranks is bracketed for the watchdog, if one was started (watchdog_start): start-up is
// watched, by the rank the launcher named.
inline Communicator comm_init_world(const std::string& nccl_init_file = "", double timeout_seconds = 300.0) {
    Communicator world;
    LaunchInfo launch = detect_launcher();
    if (!launch.error.empty()) fatal("%s", launch.error.c_str());
    const bool by_mpi = launch.launcher == Launcher::Mpi;
    const int announced = launch.size;  // MPI: 0 when the environment does not say
    fault_stall("before-init", launch.rank);  // the tests' rank that never starts (llmc/cpu/faults.h)
#ifdef LLMC_CPU
    (void)nccl_init_file;
    (void)timeout_seconds;
    if (!by_mpi && launch.size > 1)
        fatal("%s started %d ranks, but the CPU build's ranks talk over MPI: start them with mpirun (or srun "
              "--mpi=pmix)", launcher_name(launch.launcher), launch.size);
    mpi_start();
    {
        CollectiveWait wait(-1, 0, "MPI_Comm_dup of the world");
        mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &world.mpi));
    }
    mpiCheck(MPI_Comm_rank(world.mpi, &world.rank));
    mpiCheck(MPI_Comm_size(world.mpi, &world.size));
#else
    if (!by_mpi && launch.size > 1 && nccl_init_file.empty())
        fatal("%s started %d ranks without MPI: give --nccl-init-file PATH, a fresh path on a file system all "
              "ranks share, through which rank 0 hands the NCCL id to the others", launcher_name(launch.launcher),
              launch.size);
    if (by_mpi) {
        mpi_start();
        CollectiveWait wait(-1, 0, "MPI start-up (the world's communicator)");
        mpiCheck(MPI_Comm_dup(MPI_COMM_WORLD, &world.mpi));
        mpiCheck(MPI_Comm_rank(world.mpi, &launch.rank));
        mpiCheck(MPI_Comm_size(world.mpi, &launch.size));
        MPI_Comm node;  // the ranks sharing this machine; our place among them picks the GPU
        mpiCheck(MPI_Comm_split_type(world.mpi, MPI_COMM_TYPE_SHARED, launch.rank, MPI_INFO_NULL, &node));
        mpiCheck(MPI_Comm_rank(node, &launch.local_rank));
        mpiCheck(MPI_Comm_free(&node));
    }
    world.rank = launch.rank;
    world.size = launch.size;
#endif
    // an MPI library that does not understand its launcher (say, srun's PMIx without PMIx support) makes
    // every process a world of one: N separate trainings instead of one on N ranks
    if (by_mpi && announced > 0 && announced != world.size)
        fatal("the launcher announced %d ranks but MPI sees %d: this MPI does not speak the launcher's protocol "
              "(for srun, try --mpi=pmix or --mpi=pmi2)", announced, world.size);
    if (world.rank == 0)
        printf("launcher: %s, %d rank%s%s\n", launcher_name(launch.launcher), world.size, world.size > 1 ? "s" : "",
               !by_mpi && world.size > 1 ? (", NCCL id through " + nccl_init_file).c_str() : "");
    std::vector<int> everyone(world.size);
    for (int r = 0; r < world.size; r++) everyone[r] = r;
    world.watch = watched_group("world", everyone);
#ifndef LLMC_CPU
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    cudaCheck(cudaSetDevice(launch.local_rank % devices));
    ncclUniqueId id;
    if (world.rank == 0) ncclCheck(ncclGetUniqueId(&id));
    if (by_mpi) {
        CollectiveWait wait(world.watch, world.rank, "NCCL start-up (the id's broadcast)");
        mpiCheck(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, world.mpi));
    } else if (world.size > 1) {
        share_through_file(nccl_init_file, world.rank, &id, sizeof(id), timeout_seconds);
    }
    {
        CollectiveWait wait(world.watch, world.rank, "NCCL start-up (ncclCommInitRankConfig)");
        ncclConfig_t config = nccl_config();
        ncclCheckCreated(ncclCommInitRankConfig(&world.nccl, world.size, id, world.rank, &config), world.nccl,
                         world.nccl);
    }
    // the communicator is ready only once every rank has joined, so nobody still needs the file
    if (!by_mpi && world.size > 1 && world.rank == 0) remove(nccl_init_file.c_str());
    make_barrier_token(world);
    watched_group_nccl(world.watch, world.nccl);
#endif
    return world;
}

// A subgroup: ranks passing the same `color` form one group, ordered by `key`. Every rank of `parent`
// must call this together. `name` says what the group is for, in the watchdog's error line. A rank that
// passes kNotInGroup joins no group and gets an empty Communicator (size 0) that it need not use: NCCL
// then builds no communicator for it (NCCL_SPLIT_NOCOLOR), nor MPI (MPI_UNDEFINED).
constexpr int kNotInGroup = -1;

inline Communicator comm_split(Communicator& parent, int color, int key, const std::string& name) {
    // the members' world ranks, in group order (by key, then by place in the parent), for the watchdog;
    // colors and keys are small integers, exact as floats
    const std::vector<float> colors = gather_values(parent, (float)color, nullptr);
    const std::vector<float> keys = gather_values(parent, (float)key, nullptr);
    Communicator group;
    const bool member = color != kNotInGroup;
    const int split = parent.splits++;
    const std::vector<int> parent_members = watched_members(parent.watch);
    fault_stall("in-split", parent_members.empty() ? parent.rank : parent_members[parent.rank]);  // the tests' stall
    {
        CollectiveWait wait(parent.watch, parent.rank, "split");
#ifdef LLMC_CPU
        mpiCheck(MPI_Comm_split(parent.mpi, member ? color : MPI_UNDEFINED, key, &group.mpi));
#else
        ncclConfig_t config = nccl_config();
        ncclCheckCreated(ncclCommSplit(parent.nccl, member ? color : NCCL_SPLIT_NOCOLOR, key, &group.nccl, &config),
                         group.nccl, parent.nccl);
        if (member && !group.nccl) fatal("ncclCommSplit gave the %s group no communicator", name.c_str());
#endif
    }
    if (!member) {
        // registered all the same, without members: every rank registers one group per split, so that a
        // group's index (its column on the watchdog's arrival board) is the same on all its members
        watched_group(name, {});
        group.rank = -1;
        group.size = 0;
        return group;
    }
    std::vector<int> places;
    for (int p = 0; p < parent.size; p++)
        if (colors[p] == (float)color) places.push_back(p);
    std::stable_sort(places.begin(), places.end(), [&](int a, int b) { return keys[a] < keys[b]; });
    std::vector<int> members;
    for (int p : places) members.push_back(parent_members.empty() ? p : parent_members[p]);
#ifdef LLMC_CPU
    mpiCheck(MPI_Comm_rank(group.mpi, &group.rank));
    mpiCheck(MPI_Comm_size(group.mpi, &group.size));
#else
    ncclCheck(ncclCommUserRank(group.nccl, &group.rank));
    ncclCheck(ncclCommCount(group.nccl, &group.size));
    make_barrier_token(group);
#endif
    group.watch = watched_group(name, members);
    std::vector<uint64_t> words = {parent.identity, (uint64_t)split, (uint64_t)color};
    for (int member_rank : members) words.push_back((uint64_t)member_rank);
    for (char c : name) words.push_back((uint64_t)(unsigned char)c);
    group.identity = hash_words(words);
#ifdef LLMC_CPU
    {   // ncclCommSplit returns once every member has joined the new communicator; MPI_Comm_split need not
        CollectiveWait wait(group.watch, group.rank, "split");
        mpiCheck(MPI_Barrier(group.mpi));
    }
#else
    watched_group_nccl(group.watch, group.nccl);
#endif
    return group;
}

inline void comm_destroy(Communicator& comm) {
#ifdef LLMC_CPU
    forget_first_uses(comm.mpi);  // MPI may hand the same handle to a later communicator
#endif
    if (comm.mpi != MPI_COMM_NULL) mpiCheck(MPI_Comm_free(&comm.mpi));
#ifndef LLMC_CPU
    watched_group_nccl(comm.watch, nullptr);  // not one to abort any more
    if (comm.nccl) {
        ncclCheckCreated(ncclCommFinalize(comm.nccl), comm.nccl, comm.nccl);  // its operations done, on every member
        ncclCheck(ncclCommDestroy(comm.nccl));
    }
    if (comm.barrier_token) cudaCheck(cudaFree(comm.barrier_token));
    comm.nccl = nullptr;
    comm.barrier_token = nullptr;
#endif
}

// Call last, after comm_destroy of every communicator.
inline void comm_finalize() {
    int initialized = 0, finalized = 0;
    mpiCheck(MPI_Initialized(&initialized));
    mpiCheck(MPI_Finalized(&finalized));
    if (initialized && !finalized) mpiCheck(MPI_Finalize());
}
