/*
The part of the CUDA runtime API the project uses, for the CPU device.

"Device memory" is host memory. Every cudaMalloc is an allocation of exactly the size asked for, so that
AddressSanitizer reports a kernel that reads or writes one element past a buffer (a GPU would silently
read a neighbour's memory). By default kernels run to completion inside launch(), so streams and events
are ordered trivially: every operation runs when it is issued, synchronising does nothing, and an event
records the wall clock so that benchmarks time the CPU the same way they time the GPU.

Late streams (LLMC_CPU_LATE_STREAMS=1 or 2). Running everything in issue order hides every missing stream
wait: on a GPU, a stream created with cudaStreamNonBlocking runs beside the others, and a kernel that
reads what another stream writes sees it only if an event orders the two. In this mode every operation
issued on a non-blocking stream (kernel launch, cudaMemcpyAsync, cudaMemsetAsync, a collective of
llmc/parallel/comm.h, cudaEventRecord, cudaStreamWaitEvent) is queued on that stream, with its arguments copied,
and runs only when something forces it, as late as the CUDA semantics allow:
  - cudaStreamSynchronize(s) runs s's queue; cudaEventSynchronize(e) runs e's stream up to e's record;
  - cudaStreamWaitEvent(s, e) puts a wait in s's queue; when s reaches it, e's stream runs up to the
    record (on a stream that runs at once, that happens at the call);
  - cudaDeviceSynchronize, cudaFree, cudaFreeHost, cudaStreamDestroy and program exit run every queue.
The legacy stream (0), streams created without cudaStreamNonBlocking, and the synchronous cudaMemcpy and
cudaMemset run at once and flush nothing, exactly as on a GPU, where they do not wait for non-blocking
streams either. So a missing wait becomes a wrong answer: the consumer runs before its producer. An
event's record executes as a marker in its queue; cudaEventElapsedTime reports the time between the two
markers' executions.
Which waits it sees. A late schedule is one schedule among many: it catches a missing wait in the stream
that gets forced (the host reads the compute stream's results, so compute runs ahead of a communication
stream it forgot to wait for). A stream that only runs when forced, such as a communication stream
reading what the compute stream wrote, runs after its producer anyway. LLMC_CPU_LATE_STREAMS=2 reverses
that: whenever a forced stream is about to run an operation, every other stream first runs as far as it
can without forcing anyone (up to a wait for a record that has not run), so the streams nobody waits for
race ahead of the forced one and a consumer that forgot its wait reads too early. Together the two modes
catch a missing wait on either side of a pair of streams.
MPI: a queued collective runs at a flush point, not where it was issued. Every rank runs the same program,
so every rank reaches the same flush points with the same queues, and both modes decide what runs from
the queues alone (never from timing): every rank runs its queued collectives in the same order and the
ranks still meet in each one. (Where flushes differ between ranks, for example a host sync that only
rank 0 makes, the ranks still meet as long as each communicator sees its collectives in the same order
on every rank: the order of each stream, and the events between streams, guarantee that - as NCCL
requires on a GPU.)
*/
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <omp.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;

struct CUstream_st;
namespace cudacpu {
// One cudaEventRecord: where its marker sits in a queue, and whether (and when) it has run.
struct EventRecord {
    CUstream_st* stream = nullptr;         // the queue holding the marker (null once it has run)
    bool done = false;
    std::chrono::steady_clock::time_point time;
};
}  // namespace cudacpu

namespace cudacpu {
struct QueuedOperation {
    std::function<void()> run;
    std::shared_ptr<EventRecord> waits_for;  // a cudaStreamWaitEvent: the record it waits for
};
}  // namespace cudacpu
struct CUstream_st {
    bool late = false;                                 // operations wait in `queue` until forced
    std::deque<cudacpu::QueuedOperation> queue;
    bool running = false;                              // an operation of this stream is executing
};
struct CUevent_st {
    bool timing = true;
    std::shared_ptr<cudacpu::EventRecord> latest;      // the last record; null: never recorded
};
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int multiProcessorCount;
    int major;
    int minor;
};

namespace cudacpu {

// The GPU whose launch limits the CPU device takes on: LLMC_CPU_DEVICE=h100 (the default) or a100. Both
// cudaGetDeviceProperties and the launch checks of llmc/cpu/device.h read it, so a launcher that sizes its
// launch from the properties meets the same limit that checks it. The multiprocessor count is not among
// them: grids are sized from it, and on the CPU each emulated thread costs time, so the device reports one
// multiprocessor per OS thread that runs blocks, whichever GPU it emulates (the GPU's count is kept here
// for the lab's tables).
struct EmulatedGpu {
    const char* name;
    size_t shared_bytes_opt_in;    // the most dynamic shared memory one block may opt in to
    size_t shared_bytes_default;   // what a kernel may use without opting in
    int max_threads_per_block;
    int multiprocessors;
    int major, minor;              // compute capability
};
inline constexpr EmulatedGpu kH100{"H100", 227 * 1024, 48 * 1024, 1024, 132, 9, 0};
inline constexpr EmulatedGpu kA100{"A100", 163 * 1024, 48 * 1024, 1024, 108, 8, 0};
inline constexpr const EmulatedGpu* kEmulatedGpus[] = {&kH100, &kA100};

inline const EmulatedGpu*& emulated_gpu_setting() {
    static const EmulatedGpu* gpu = [] {
        const char* value = getenv("LLMC_CPU_DEVICE");
        if (!value || !*value || strcasecmp(value, "h100") == 0) return &kH100;
        if (strcasecmp(value, "a100") == 0) return &kA100;
        fprintf(stderr, "error: LLMC_CPU_DEVICE=%s: must be h100 or a100 (the GPU whose limits the CPU device takes on)\n",
                value);
        std::_Exit(EXIT_FAILURE);
    }();
    return gpu;
}
inline const EmulatedGpu& emulated_gpu() { return *emulated_gpu_setting(); }
// for the lab and the layer's tests: later launches and property queries see `gpu`'s limits
inline void set_emulated_gpu(const EmulatedGpu& gpu) { emulated_gpu_setting() = &gpu; }

// bytes currently allocated, per pointer (cudaFree of a foreign pointer is an error, as on the GPU)
struct Allocations {
    std::mutex lock;
    std::map<void*, size_t> sizes;
    size_t in_use = 0;
    size_t peak = 0;
};
inline Allocations& allocations() {
    static Allocations state;
    return state;
}

inline size_t physical_memory_bytes() {
    return (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
}

// ----------------------------------------------------------------------------
// host waits and allocations, counted
//
// On a GPU the host issues a step's work far ahead of the device, and these calls take that lead away: a
// synchronisation (cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous device-to-host cudaMemcpy),
// a device-to-host copy (the host wants a value: a synchronisation follows), and an allocation or a free
// (cudaMalloc and cudaMallocHost cost milliseconds; cudaFree and cudaFreeHost synchronise the device).
// cudaEventSynchronize is counted apart (event_waits): the step uses it only to reuse a double-buffered
// staging slot, a wait for a copy issued one upload earlier, which blocks only a host that runs that far
// ahead of the device. The CPU device runs everything at once, so it cannot feel them; it counts them
// instead, from the program's start, and the trainer reports the counts of each step against the budget in
// the README. Counted at the call, as the host makes it (a queued late-stream copy counts when issued).
struct HostCallCounts {
    long long allocations = 0, frees = 0, device_to_host_copies = 0, synchronizations = 0, event_waits = 0;
};
inline std::atomic<long long>* host_call_counters() {
    static std::atomic<long long> counters[5];  // in HostCallCounts' order
    return counters;
}
enum class HostCall { Allocation, Free, DeviceToHostCopy, Synchronization, EventWait };
inline void count_host_call(HostCall call) { host_call_counters()[(int)call]++; }
inline HostCallCounts host_call_counts() {
    std::atomic<long long>* c = host_call_counters();
    return HostCallCounts{c[0].load(), c[1].load(), c[2].load(), c[3].load(), c[4].load()};
}
// ---------------------------------------------------------------------------- (end of the counts)

// ----------------------------------------------------------------------------
// late streams (see the top of this file)

// 0: off, 1: late, 2: late, and the streams not forced run ahead of the forced one
inline int& late_streams_setting() {
    static int mode = [] {
        const char* value = getenv("LLMC_CPU_LATE_STREAMS");
        return value && (value[0] == '1' || value[0] == '2') ? value[0] - '0' : 0;
    }();
    return mode;
}
inline int late_streams() { return late_streams_setting(); }
// for tests of the layer; affects streams created afterwards
inline void set_late_streams(int mode) { late_streams_setting() = mode; }

inline void run_all_streams();
// every stream that queues, in creation order; at exit whatever is still queued runs
inline std::vector<cudaStream_t>& late_stream_list() {
    static std::vector<cudaStream_t>* streams = [] {
        atexit([] { run_all_streams(); });
        return new std::vector<cudaStream_t>;
    }();
    return *streams;
}

[[noreturn]] inline void stream_fatal(const char* message) {
    fprintf(stderr, "error: CPU device, late streams: %s\n", message);
    fflush(stderr);
    std::_Exit(EXIT_FAILURE);
}

// Runs the oldest queued operation of `stream`. An operation may force other streams (a wait); it can
// never need its own stream to go further, since a wait refers to a record made before it was issued.
inline void run_next(cudaStream_t stream) {
    if (stream->running) stream_fatal("two streams wait for each other");
    std::function<void()> operation = std::move(stream->queue.front().run);
    stream->queue.pop_front();
    stream->running = true;
    operation();
    stream->running = false;
}
// Mode 2: every stream but `forced` runs until its next operation is a wait for a record not yet run.
inline void run_others_ahead(cudaStream_t forced) {
    for (bool progress = true; progress;) {
        progress = false;
        for (cudaStream_t other : late_stream_list()) {
            while (other != forced && !other->running && !other->queue.empty() &&
                   (!other->queue.front().waits_for || other->queue.front().waits_for->done)) {
                run_next(other);
                progress = true;
            }
        }
    }
}
// Runs the next operation of a stream the program forces (in mode 2 after letting the others run ahead).
inline void run_forced(cudaStream_t stream) {
    if (late_streams() == 2) run_others_ahead(stream);
    run_next(stream);
}
inline void run_stream(cudaStream_t stream) {
    while (!stream->queue.empty()) run_forced(stream);
}
// Runs a record's stream until the record's marker has run.
inline void complete(const std::shared_ptr<EventRecord>& record) {
    while (record && !record->done) {
        if (record->stream->queue.empty()) stream_fatal("an event's marker is missing from its queue");
        run_forced(record->stream);
    }
}
inline void run_all_streams() {
    for (bool any = true; any;) {
        any = false;
        for (cudaStream_t stream : late_stream_list()) {
            any = any || !stream->queue.empty();
            run_stream(stream);
        }
    }
}

inline bool is_late(cudaStream_t stream) { return stream != nullptr && stream->late; }

// Runs `operation` now, or queues it on a late stream. It must hold copies of everything it uses.
template <class Operation>
void on_stream(cudaStream_t stream, Operation&& operation) {
    if (is_late(stream)) stream->queue.push_back({std::forward<Operation>(operation), nullptr});
    else operation();
}

}  // namespace cudacpu

inline const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }

inline cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
inline cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() {
    cudacpu::count_host_call(cudacpu::HostCall::Synchronization);
    cudacpu::run_all_streams();
    return cudaSuccess;
}

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* props, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    memset(props, 0, sizeof(*props));
    const cudacpu::EmulatedGpu& gpu = cudacpu::emulated_gpu();
    // the GPU's name stays out of the device's, which would otherwise look up that GPU's peak FLOP/s (mfu.h)
    snprintf(props->name, sizeof(props->name), "CPU (CUDA emulated on %d OpenMP threads)", omp_get_max_threads());
    props->totalGlobalMem = cudacpu::physical_memory_bytes();
    props->sharedMemPerBlock = gpu.shared_bytes_default;
    props->sharedMemPerBlockOptin = gpu.shared_bytes_opt_in;
    props->warpSize = 32;
    props->maxThreadsPerBlock = gpu.max_threads_per_block;
    props->multiProcessorCount = omp_get_max_threads();  // one "SM" per OS thread that runs blocks (see above)
    props->major = gpu.major;
    props->minor = gpu.minor;
    return cudaSuccess;
}

namespace cudacpu {

// What the host could still give this program, in bytes: MemAvailable of /proc/meminfo, the kernel's
// estimate of what can be allocated without swapping (free pages plus page cache it can drop; sysconf's
// _SC_AVPHYS_PAGES counts free pages only, a fraction of that once files have been read).
inline size_t host_available_bytes() {
    size_t available = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    if (FILE* meminfo = fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib = 0;
        while (fgets(line, sizeof(line), meminfo))
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) { available = (size_t)kib * 1024; break; }
        fclose(meminfo);
    }
    return available;
}

// The CPU device's free memory: what the host has available, but never more than its physical memory less
// what cudaMalloc has handed out. Linux gives a page to an allocation only when it is first written, so
// buffers not yet written do not show in MemAvailable: without the second bound a run could allocate far
// more than the machine holds and be killed by the kernel's out-of-memory killer once it writes them.
// (Other processes' buffers count only once written: ranks of one job on one machine that all allocate
// before writing can still add up to more than it holds.)
inline size_t free_device_bytes() {
    const size_t total = physical_memory_bytes();
    Allocations& a = allocations();
    std::lock_guard<std::mutex> guard(a.lock);
    return std::min(host_available_bytes(), total > a.in_use ? total - a.in_use : 0);
}

}  // namespace cudacpu

inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = cudacpu::physical_memory_bytes();
    *free_bytes = cudacpu::free_device_bytes();
    return cudaSuccess;
}

// Aligned to 256 bytes, as the CUDA runtime guarantees: code that looks at alignment (the matmul plans'
// keys, 128-bit loads) sees the same addresses modulo 256 on both devices. A request larger than
// cudaMemGetInfo's free memory fails as on a GPU, at the call, rather than when the pages are written
// (Linux's overcommit would grant it).
template <class T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
    cudacpu::count_host_call(cudacpu::HostCall::Allocation);
    if (bytes > cudacpu::free_device_bytes()) return cudaErrorMemoryAllocation;
    void* memory = nullptr;
    // A buffer of 2 MiB or more is asked for in 2 MiB pages (transparent huge pages, where the kernel grants
    // them): its first touch then faults once per 2 MiB instead of once per 4 KiB, which was most of the time
    // of a step of a wide model (a 70B-wide layer's 2.5 GB of state) on a virtual machine.
    constexpr size_t huge_page = (size_t)2 << 20;
    const bool huge = bytes >= huge_page;
    if (posix_memalign(&memory, huge ? huge_page : 256, bytes > 0 ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
    if (huge) madvise(memory, bytes, MADV_HUGEPAGE);  // advice only: without it the buffer still works
    cudacpu::Allocations& a = cudacpu::allocations();
    std::lock_guard<std::mutex> guard(a.lock);
    a.sizes[memory] = bytes;
    a.in_use += bytes;
    if (a.in_use > a.peak) a.peak = a.in_use;
    *pointer = static_cast<T*>(memory);
    return cudaSuccess;
}

template <class T>
cudaError_t cudaMallocHost(T** pointer, size_t bytes) {
    cudacpu::count_host_call(cudacpu::HostCall::Allocation);
    *pointer = static_cast<T*>(malloc(bytes > 0 ? bytes : 1));
    return *pointer ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* pointer) {
    cudacpu::count_host_call(cudacpu::HostCall::Free);
    cudacpu::run_all_streams();  // as on a GPU: queued work may still use it
    free(pointer);
    return cudaSuccess;
}

inline cudaError_t cudaFree(void* pointer) {
    cudacpu::run_all_streams();
    if (!pointer) return cudaSuccess;
    cudacpu::count_host_call(cudacpu::HostCall::Free);
    cudacpu::Allocations& a = cudacpu::allocations();
    std::lock_guard<std::mutex> guard(a.lock);
    auto found = a.sizes.find(pointer);
    if (found == a.sizes.end()) return cudaErrorInvalidDevicePointer;
    a.in_use -= found->second;
    a.sizes.erase(found);
    free(pointer);
    return cudaSuccess;
}

namespace cudacpu {
inline void copy_bytes(void* target, const void* source, size_t bytes) {
    if (bytes) memmove(target, source, bytes);
}
inline void count_copy(cudaMemcpyKind kind) {
    if (kind == cudaMemcpyDeviceToHost) count_host_call(HostCall::DeviceToHostCopy);
}
}  // namespace cudacpu
// A synchronous device-to-host copy is a copy and a wait for it.
inline cudaError_t cudaMemcpy(void* target, const void* source, size_t bytes, cudaMemcpyKind kind) {
    cudacpu::count_copy(kind);
    if (kind == cudaMemcpyDeviceToHost) cudacpu::count_host_call(cudacpu::HostCall::Synchronization);
    cudacpu::copy_bytes(target, source, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* target, const void* source, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
    cudacpu::count_copy(kind);
    cudacpu::on_stream(stream, [=] { cudacpu::copy_bytes(target, source, bytes); });
    return cudaSuccess;
}
// `height` rows of `width` bytes, rows `target_pitch` and `source_pitch` bytes apart (a block of columns)
inline cudaError_t cudaMemcpy2DAsync(void* target, size_t target_pitch, const void* source, size_t source_pitch,
                                     size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
    if (width > target_pitch || width > source_pitch) return cudaErrorInvalidValue;
    cudacpu::count_copy(kind);
    cudacpu::on_stream(stream, [=] {
        for (size_t row = 0; row < height; row++)
            cudacpu::copy_bytes((char*)target + row * target_pitch, (const char*)source + row * source_pitch, width);
    });
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void* target, int value, size_t bytes) {
    if (bytes) memset(target, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* target, int value, size_t bytes, cudaStream_t stream = nullptr) {
    cudacpu::on_stream(stream, [=] { cudaMemset(target, value, bytes); });
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    *stream = new CUstream_st;
    (*stream)->late = cudacpu::late_streams() != 0 && (flags & cudaStreamNonBlocking);
    if ((*stream)->late) cudacpu::late_stream_list().push_back(*stream);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return cudaErrorInvalidResourceHandle;
    cudacpu::run_all_streams();
    std::vector<cudaStream_t>& list = cudacpu::late_stream_list();
    list.erase(std::remove(list.begin(), list.end(), stream), list.end());
    delete stream;
    return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cudacpu::count_host_call(cudacpu::HostCall::Synchronization);
    if (cudacpu::is_late(stream)) cudacpu::run_stream(stream);
    return cudaSuccess;
}

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    *event = new CUevent_st;
    (*event)->timing = !(flags & cudaEventDisableTiming);
    return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;  // a marker still queued keeps its record alive
    return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
    auto record = std::make_shared<cudacpu::EventRecord>();
    event->latest = record;
    if (cudacpu::is_late(stream)) record->stream = stream;
    cudacpu::on_stream(stream, [record] {
        record->time = std::chrono::steady_clock::now();
        record->done = true;
        record->stream = nullptr;
    });
    return cudaSuccess;
}
// Waits for the event's latest record at the time of the call (later records do not count), as CUDA does.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned = 0) {
    std::shared_ptr<cudacpu::EventRecord> record = event->latest;  // null: never recorded, nothing to wait for
    if (cudacpu::is_late(stream)) stream->queue.push_back({[record] { cudacpu::complete(record); }, record});
    else cudacpu::complete(record);
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cudacpu::count_host_call(cudacpu::HostCall::EventWait);
    cudacpu::complete(event->latest);
    return cudaSuccess;
}
inline cudaError_t cudaEventQuery(cudaEvent_t event) {
    return !event->latest || event->latest->done ? cudaSuccess : cudaErrorNotReady;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    if (!start->timing || !stop->timing) return cudaErrorInvalidResourceHandle;
    if (!start->latest || !stop->latest) return cudaErrorInvalidResourceHandle;
    if (!start->latest->done || !stop->latest->done) return cudaErrorNotReady;
    *ms = std::chrono::duration<float, std::milli>(stop->latest->time - start->latest->time).count();
    return cudaSuccess;
}
