/*
The CPU execution layer: runs CUDA kernels, unchanged, on the host.

A CUDA block is a group of threads that may wait for each other (__syncthreads) and, 32 at a time (a
warp), exchange registers (__shfl_*_sync). A plain loop over threads cannot express that: a thread that
reaches a barrier must stop there, with its registers and stack intact, until all others arrive. So each
emulated thread is a fiber, a function with a stack of its own that can be suspended and resumed
(boost.context's fcontext: a switch costs a few nanoseconds, no system call).

Scheduling, for one block:
  - The scheduler runs warp by warp. It resumes each ready lane of the warp; a lane runs until it reaches
    a warp operation, a block barrier, or the end of the kernel, and then switches back.
  - When no lane of the warp is ready, the lanes waiting in warp operations are grouped by the mask they
    passed. A group whose lanes have all arrived (and agree on the operation and its source line) is
    released: the scheduler computes every lane's result (for a shuffle, the value of its source lane),
    marks them ready, and the warp runs on. That is lockstep semantics: no lane sees a value that another
    lane has not yet produced.
  - A warp that can go no further, with lanes left waiting in a warp operation, is divergent (say lane 3
    waits in a shuffle at line 57 while lane 4 waits at __syncthreads): on a GPU that is undefined
    behaviour or a hang. Here it aborts with both source lines.
  - When every warp is at the block barrier or finished, the barrier is released. Finished threads count
    as arrived (as on Volta and later GPUs).
Warp-collective operations (the tensor-core instructions of llmc/kernels/mma.cuh: mma.sync, ldmatrix) use the
same machinery with a full mask: each lane deposits a pointer to its own arguments (its stack stays alive
while it is suspended), and when all 32 lanes have arrived at the same operation and source line, one
function computes every lane's result from all 32 argument blocks. A lane missing from the call is a
divergent warp, reported as for shuffles.

Asynchronous copies (cp.async) land at one of the two extremes a GPU allows. By default they are queued
in the issuing thread and performed only when that thread waits for their group (cp_async_wait<N>),
never earlier and never at a barrier: a kernel that reads the target before waiting reads the stale
contents every time (dynamic shared memory starts each block filled with 0xff bytes), and a thread that
exits with copies still queued is reported. In reverse lane order (below) they land the moment they are
issued instead: a kernel that refills a buffer other warps may still be reading (a missing barrier
before the prefetch of a double buffer) then overwrites it under them. Running both orders, as the tests
do, exercises both races.

Blocks run on OpenMP threads, one block at a time per OS thread, so `__shared__` is `static thread_local`
and dynamic shared memory is one buffer per OS thread. Real atomics make concurrent blocks safe.

LLMC_CPU_REVERSE_LANES=1 runs lanes, warps and blocks in reverse order: a kernel whose result depends on
the order in which threads happen to run (a race) gives a different answer one way or the other.
LLMC_CPU_PROFILE=1 times every launch and prints, at exit, each kernel's total time and launch count.
LLMC_CPU_LATE_STREAMS=1 holds back the work of non-blocking streams until something forces it, so that a
missing stream wait gives a wrong answer (llmc/cpu/runtime.h explains it).

Launch errors (too many threads, too much shared memory, empty grid) abort with a one-line message
naming the kernel, like the GPU's launch failure reported by cudaGetLastError. The limits are those of
the GPU the device emulates: LLMC_CPU_DEVICE=h100 (the default: 227 KiB of shared memory per block) or
a100 (163 KiB), the GPUs the GPU build targets (sm_90, sm_80); cudaGetDeviceProperties reports the same
limits (llmc/cpu/runtime.h), so a launcher that sizes its launch from them is checked against them.
*/
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <boost/context/detail/fcontext.hpp>
#include <omp.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include "vector_types.h"
#include "runtime.h"

namespace cudacpu {

namespace fctx = boost::context::detail;

constexpr int kWarpSize = 32;
// (the limits a launch must meet are the emulated GPU's: emulated_gpu() in llmc/cpu/runtime.h)
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kFiberStackBytes = 256 * 1024;     // sanitizers need much more stack per frame
#else
constexpr size_t kFiberStackBytes = 64 * 1024;
#endif

[[noreturn]] inline void fatal(const std::string& message) {
    fprintf(stderr, "error: %s\n", message.c_str());
    fflush(stderr);
    std::_Exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------
// what a waiting thread is waiting for

enum class Wait { None, Barrier, Warp, Exited };
enum class WarpOp { Sync, Shuffle, Ballot, ActiveMask, Collective };

// computes the results of a warp-collective operation from every lane's argument block
using CollectiveFunction = void (*)(void* const lanes[kWarpSize]);

inline const char* warp_op_name(WarpOp op) {
    switch (op) {
        case WarpOp::Sync: return "__syncwarp";
        case WarpOp::Shuffle: return "__shfl_sync";
        case WarpOp::Ballot: return "__ballot_sync";
        case WarpOp::ActiveMask: return "__activemask";
        case WarpOp::Collective: return "a warp-collective operation";
    }
    return "?";
}

// a 16-byte cp.async copy waiting for its group's wait (valid == false: write zeros, read nothing)
struct PendingCopy {
    void* target;
    const void* source;
    bool valid;
    int group;
    const char* file;
    int line;
};

struct Fiber {
    fctx::fcontext_t context = nullptr;
    char* stack_base = nullptr;   // lowest usable address
    uint3 thread_idx{};
    int lane = 0;
    int warp = 0;
    Wait wait = Wait::None;
    // where it waits (for the divergence message)
    const char* file = "";
    int line = 0;
    // a warp operation: its kind, mask, this lane's contribution and, after release, its result
    WarpOp op = WarpOp::Sync;
    unsigned mask = 0;
    int source_lane = 0;
    int value_bytes = 0;
    alignas(16) unsigned char value[16];
    alignas(16) unsigned char result[16];
    // a warp-collective operation: what computes it, its name for messages, this lane's arguments
    CollectiveFunction collective = nullptr;
    const char* collective_name = "";
    void* collective_arguments = nullptr;
    // cp.async copies issued but not yet waited for, oldest first, and the number of committed groups
    std::vector<PendingCopy> pending_copies;
    size_t first_pending = 0;
    int committed_groups = 0;
#if defined(__SANITIZE_ADDRESS__)
    void* fake_stack = nullptr;
#endif
};

// One per OS thread: the fibers (and their stacks) of the block it is running.
struct BlockRunner {
    std::vector<Fiber> fibers;
    char* stacks = nullptr;
    size_t stack_slot_bytes = 0;
    int capacity = 0;
    fctx::fcontext_t scheduler_context = nullptr;
    const void* scheduler_stack_bottom = nullptr;  // for the sanitizer's bookkeeping of stack switches
    size_t scheduler_stack_size = 0;
    void (*body)(void*) = nullptr;   // runs the kernel for the current thread
    void* body_state = nullptr;
    const void* kernel = nullptr;     // for error messages
    std::vector<unsigned char> dynamic_shared;

    ~BlockRunner() {
        if (stacks) munmap(stacks, stack_slot_bytes * capacity);
    }
    void reserve(int threads);
    void run_block(int num_threads, dim3 block_dim);
    void resume(Fiber& fiber);
    void settle_warp(int warp, int num_threads);
};

inline std::string describe_function(const void* function);

inline thread_local Fiber* current_fiber = nullptr;
inline thread_local BlockRunner* current_runner = nullptr;
inline thread_local uint3 current_block_idx{};
inline thread_local dim3 current_block_dim{};
inline dim3 current_grid_dim{};

inline void* dynamic_shared_memory() { return current_runner->dynamic_shared.data(); }

inline bool& reverse_lanes_setting() {
    static bool reverse = [] {
        const char* value = getenv("LLMC_CPU_REVERSE_LANES");
        return value && value[0] == '1';
    }();
    return reverse;
}
inline bool reverse_lanes() { return reverse_lanes_setting(); }
inline void set_reverse_lanes(bool reverse) { reverse_lanes_setting() = reverse; }

// ----------------------------------------------------------------------------
// switching stacks (with the bookkeeping AddressSanitizer needs to follow a fiber switch)

inline void sanitizer_start_switch(void** fake_stack, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
    (void)fake_stack; (void)bottom; (void)size;
#endif
}
inline void sanitizer_finish_switch(void* fake_stack, const void** old_bottom, size_t* old_size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
#else
    (void)fake_stack; (void)old_bottom; (void)old_size;
#endif
}

inline void* fake_stack_slot(Fiber& fiber) {
#if defined(__SANITIZE_ADDRESS__)
    return fiber.fake_stack;
#else
    (void)fiber;
    return nullptr;
#endif
}
inline void** fake_stack_address(Fiber& fiber) {
#if defined(__SANITIZE_ADDRESS__)
    return &fiber.fake_stack;
#else
    (void)fiber;
    return nullptr;
#endif
}

// Called by the running fiber: suspend it until the scheduler resumes it.
inline void yield_to_scheduler() {
    Fiber& self = *current_fiber;
    BlockRunner& runner = *current_runner;
    sanitizer_start_switch(self.wait == Wait::Exited ? nullptr : fake_stack_address(self),
                           runner.scheduler_stack_bottom, runner.scheduler_stack_size);
    fctx::transfer_t back = fctx::jump_fcontext(runner.scheduler_context, nullptr);
    runner.scheduler_context = back.fctx;
    sanitizer_finish_switch(fake_stack_slot(self), &runner.scheduler_stack_bottom, &runner.scheduler_stack_size);
}

// A copy still queued when its thread ends would land in shared memory nobody reads (or, here, never land):
// the kernel forgot a cp_async_wait.
inline void check_no_copies_pending(const Fiber& fiber) {
    if (fiber.first_pending == fiber.pending_copies.size()) return;
    const PendingCopy& copy = fiber.pending_copies[fiber.first_pending];
    char message[512];
    snprintf(message, sizeof(message),
             "in kernel %s: thread (%u,%u,%u) of block (%u,%u,%u) exits with cp.async pending (issued at %s:%d, "
             "never completed by cp_async_wait)", describe_function(current_runner->kernel).c_str(),
             fiber.thread_idx.x, fiber.thread_idx.y, fiber.thread_idx.z, current_block_idx.x, current_block_idx.y,
             current_block_idx.z, copy.file, copy.line);
    fatal(message);
}

inline void fiber_entry(fctx::transfer_t from) {
    BlockRunner& runner = *static_cast<BlockRunner*>(from.data);
    runner.scheduler_context = from.fctx;
    sanitizer_finish_switch(nullptr, &runner.scheduler_stack_bottom, &runner.scheduler_stack_size);
    runner.body(runner.body_state);
    check_no_copies_pending(*current_fiber);
    current_fiber->wait = Wait::Exited;
    yield_to_scheduler();  // never resumed
    fatal("an exited emulated thread was resumed");
}

inline void BlockRunner::resume(Fiber& fiber) {
    current_fiber = &fiber;
    fiber.wait = Wait::None;
    void* fake_stack = nullptr;
    sanitizer_start_switch(&fake_stack, fiber.stack_base, kFiberStackBytes);
    fctx::transfer_t back = fctx::jump_fcontext(fiber.context, this);
    sanitizer_finish_switch(fake_stack, nullptr, nullptr);
    fiber.context = back.fctx;
}

inline void BlockRunner::reserve(int threads) {
    if (threads <= capacity) return;
    if (stacks) munmap(stacks, stack_slot_bytes * capacity);
    // each stack sits above a guard page, so an overflow faults instead of corrupting a neighbour
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    stack_slot_bytes = kFiberStackBytes + page;
    void* memory = mmap(nullptr, stack_slot_bytes * threads, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) fatal("cannot map fiber stacks for the CPU device");
    stacks = static_cast<char*>(memory);
    for (int i = 0; i < threads; i++) mprotect(stacks + i * stack_slot_bytes, page, PROT_NONE);
    fibers.assign(threads, Fiber{});
    for (int i = 0; i < threads; i++) fibers[i].stack_base = stacks + i * stack_slot_bytes + page;
    capacity = threads;
}

// ----------------------------------------------------------------------------
// the scheduler

[[noreturn]] inline void report_divergence(const void* kernel, const Fiber& a, const char* what_a, const Fiber& b,
                                           const char* what_b) {
    char message[1024];
    snprintf(message, sizeof(message),
             "divergent warp in kernel %s: block (%u,%u,%u) warp %d: lane %d waits in %s (%s:%d) while lane %d "
             "waits in %s (%s:%d)",
             describe_function(kernel).c_str(), current_block_idx.x, current_block_idx.y, current_block_idx.z, a.warp, a.lane, what_a, a.file,
             a.line, b.lane, what_b, b.file, b.line);
    fatal(message);
}

inline const char* operation_name(const Fiber& fiber) {
    return fiber.op == WarpOp::Collective ? fiber.collective_name : warp_op_name(fiber.op);
}
inline const char* wait_name(const Fiber& fiber) {
    return fiber.wait == Wait::Barrier ? "__syncthreads" : operation_name(fiber);
}

// Runs warp `warp` until none of its lanes can make progress without the rest of the block.
inline void BlockRunner::settle_warp(int warp, int num_threads) {
    const int first = warp * kWarpSize;
    const int count = std::min(kWarpSize, num_threads - first);
    Fiber* lanes = &fibers[first];
    for (;;) {
        for (int k = 0; k < count; k++) {
            Fiber& fiber = lanes[reverse_lanes() ? count - 1 - k : k];
            if (fiber.wait == Wait::None) resume(fiber);
        }
        // Which lanes wait in warp operations, and which have finished?
        unsigned waiting = 0, exited = 0;
        for (int k = 0; k < count; k++) {
            if (lanes[k].wait == Wait::Warp) waiting |= 1u << k;
            if (lanes[k].wait == Wait::Exited) exited |= 1u << k;
        }
        if (!waiting) return;
        // __activemask: the lanes that reached the same call together form the active set.
        for (int k = 0; k < count; k++) {
            if (!(waiting & (1u << k)) || lanes[k].op != WarpOp::ActiveMask) continue;
            unsigned together = 0;
            for (int j = k; j < count; j++)
                if ((waiting & (1u << j)) && lanes[j].op == WarpOp::ActiveMask && lanes[j].line == lanes[k].line)
                    together |= 1u << j;
            for (unsigned bits = together; bits; bits &= bits - 1) {
                Fiber& lane = lanes[__builtin_ctz(bits)];
                memcpy(lane.result, &together, 4);
                lane.wait = Wait::None;
            }
            waiting &= ~together;
        }
        if (!waiting) continue;
        // Release every group of lanes whose mask is complete.
        bool released = false;
        for (int k = 0; k < count; k++) {
            if (!(waiting & (1u << k))) continue;
            const Fiber& leader = lanes[k];
            unsigned mask = leader.mask;
            if (mask & exited) {
                int gone = __builtin_ctz(mask & exited);
                char message[512];
                snprintf(message, sizeof(message),
                         "in kernel %s: lane %d calls %s (%s:%d) with a mask naming lane %d, which has exited",
                         describe_function(kernel).c_str(), leader.lane, operation_name(leader), leader.file, leader.line, gone);
                fatal(message);
            }
            if (count < kWarpSize && (mask >> count)) {
                char message[512];
                snprintf(message, sizeof(message),
                         "in kernel %s: lane %d calls %s (%s:%d) with a mask naming lanes beyond the block's %d threads",
                         describe_function(kernel).c_str(), leader.lane, operation_name(leader), leader.file, leader.line, num_threads);
                fatal(message);
            }
            if ((waiting & mask) != mask) continue;  // someone in the mask has not arrived yet
            for (unsigned bits = mask; bits; bits &= bits - 1) {
                const Fiber& other = lanes[__builtin_ctz(bits)];
                if (other.op != leader.op || other.line != leader.line || other.mask != mask ||
                    (other.op == WarpOp::Collective && other.collective != leader.collective))
                    report_divergence(kernel, leader, operation_name(leader), other, operation_name(other));
            }
            if (leader.op == WarpOp::Shuffle) {
                for (unsigned bits = mask; bits; bits &= bits - 1) {
                    Fiber& reader = lanes[__builtin_ctz(bits)];
                    int source = reader.source_lane;
                    if (!(mask & (1u << source))) {
                        char message[512];
                        snprintf(message, sizeof(message),
                                 "in kernel %s: lane %d reads lane %d in a shuffle (%s:%d), but lane %d is not in the "
                                 "mask", describe_function(kernel).c_str(), reader.lane, source, reader.file, reader.line, source);
                        fatal(message);
                    }
                    memcpy(reader.result, lanes[source].value, reader.value_bytes);
                }
            } else if (leader.op == WarpOp::Ballot) {
                unsigned ballot = 0;
                for (unsigned bits = mask; bits; bits &= bits - 1) {
                    int lane = __builtin_ctz(bits);
                    if (lanes[lane].value[0]) ballot |= 1u << lane;
                }
                for (unsigned bits = mask; bits; bits &= bits - 1) memcpy(lanes[__builtin_ctz(bits)].result, &ballot, 4);
            } else if (leader.op == WarpOp::Collective) {  // the mask is the full warp
                void* arguments[kWarpSize];
                for (int lane = 0; lane < kWarpSize; lane++) arguments[lane] = lanes[lane].collective_arguments;
                leader.collective(arguments);
            }
            for (unsigned bits = mask; bits; bits &= bits - 1) lanes[__builtin_ctz(bits)].wait = Wait::None;
            waiting &= ~mask;
            released = true;
        }
        if (!released) {
            // Nobody can move: lanes wait in warp operations that lanes at the block barrier would have to join.
            const Fiber* in_warp_op = nullptr;
            const Fiber* elsewhere = nullptr;
            for (int k = 0; k < count; k++) {
                if (lanes[k].wait == Wait::Warp && !in_warp_op) in_warp_op = &lanes[k];
                else if (lanes[k].wait == Wait::Barrier && !elsewhere) elsewhere = &lanes[k];
            }
            if (!elsewhere) {  // two groups with different masks each wait for the other
                for (int k = 0; k < count; k++)
                    if (lanes[k].wait == Wait::Warp && &lanes[k] != in_warp_op) elsewhere = &lanes[k];
            }
            report_divergence(kernel, *in_warp_op, wait_name(*in_warp_op), *elsewhere, wait_name(*elsewhere));
        }
    }
}

inline void BlockRunner::run_block(int num_threads, dim3 block_dim) {
    for (int i = 0; i < num_threads; i++) {
        Fiber& fiber = fibers[i];
        fiber.context = fctx::make_fcontext(fiber.stack_base + kFiberStackBytes, kFiberStackBytes, fiber_entry);
        fiber.thread_idx = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
        fiber.lane = i % kWarpSize;
        fiber.warp = i / kWarpSize;
        fiber.wait = Wait::None;
        fiber.pending_copies.clear();
        fiber.first_pending = 0;
        fiber.committed_groups = 0;
    }
    const int num_warps = (num_threads + kWarpSize - 1) / kWarpSize;
    for (;;) {
        for (int k = 0; k < num_warps; k++) settle_warp(reverse_lanes() ? num_warps - 1 - k : k, num_threads);
        // every thread is now at the barrier or finished
        bool any_waiting = false;
        for (int i = 0; i < num_threads; i++) {
            if (fibers[i].wait == Wait::Barrier) {
                fibers[i].wait = Wait::None;
                any_waiting = true;
            }
        }
        if (!any_waiting) break;
    }
    current_fiber = nullptr;
}

inline BlockRunner& this_os_thread_runner() {
    static thread_local std::unique_ptr<BlockRunner> runner;
    if (!runner) runner = std::make_unique<BlockRunner>();
    return *runner;
}

// ----------------------------------------------------------------------------
// the calls a kernel makes

inline void syncthreads(const char* file, int line) {
    Fiber& self = *current_fiber;
    self.wait = Wait::Barrier;
    self.file = file;
    self.line = line;
    yield_to_scheduler();
}

inline void check_mask(unsigned mask, const char* what, const char* file, int line) {
    if (!(mask & (1u << current_fiber->lane))) {
        char message[512];
        snprintf(message, sizeof(message), "in kernel %s: lane %d calls %s (%s:%d) with a mask that excludes itself",
                 describe_function(current_runner->kernel).c_str(), current_fiber->lane, what, file, line);
        fatal(message);
    }
}

// Deposits this lane's part of a warp operation, waits for the group, and leaves the result in self.result.
inline void warp_operation(WarpOp op, unsigned mask, const void* value, int bytes, int source_lane, const char* file,
                           int line) {
    Fiber& self = *current_fiber;
    check_mask(mask, warp_op_name(op), file, line);
    self.op = op;
    self.mask = mask;
    self.source_lane = source_lane;
    self.value_bytes = bytes;
    if (bytes) memcpy(self.value, value, bytes);
    self.wait = Wait::Warp;
    self.file = file;
    self.line = line;
    yield_to_scheduler();
}

inline int checked_width(int width, const char* file, int line) {
    if (width <= 0 || width > kWarpSize || (width & (width - 1))) {
        char message[256];
        snprintf(message, sizeof(message), "shuffle width %d at %s:%d is not a power of two in [1, 32]", width, file,
                 line);
        fatal(message);
    }
    return width;
}

template <class T>
T shuffle(unsigned mask, T value, int source_lane, const char* file, int line) {
    static_assert(sizeof(T) <= 16 && std::is_trivially_copyable<T>::value, "shuffled values must be plain data");
    warp_operation(WarpOp::Shuffle, mask, &value, (int)sizeof(T), source_lane, file, line);
    T result;
    memcpy(&result, current_fiber->result, sizeof(T));
    return result;
}

// A warp-collective operation: every lane of the warp calls this with its own argument block (which must
// stay alive until the call returns: a local of the caller does); when all 32 have arrived, `compute` runs
// once with all 32 blocks and writes each lane's results wherever its block points.
inline void warp_collective(const char* name, CollectiveFunction compute, void* lane_arguments, const char* file,
                            int line) {
    Fiber& self = *current_fiber;
    self.collective = compute;
    self.collective_name = name;
    self.collective_arguments = lane_arguments;
    warp_operation(WarpOp::Collective, 0xffffffffu, nullptr, 0, 0, file, line);
}

// ----------------------------------------------------------------------------
// cp.async: 16-byte copies queued in the issuing thread, performed when their group is waited for

inline void check_aligned_16(const void* address, const char* what, const char* file, int line) {
    if (reinterpret_cast<uintptr_t>(address) % 16 != 0) {
        char message[512];
        snprintf(message, sizeof(message), "in kernel %s: thread %u calls %s (%s:%d) with an address that is not "
                 "16-byte aligned (%p)", describe_function(current_runner->kernel).c_str(), current_fiber->thread_idx.x,
                 what, file, line, address);
        fatal(message);
    }
}

inline void async_copy_16(void* target, const void* source, bool valid, const char* file, int line) {
    check_aligned_16(target, "cp.async", file, line);
    if (valid) check_aligned_16(source, "cp.async", file, line);
    if (reverse_lanes()) {  // the earliest a copy may land: now
        if (valid) memcpy(target, source, 16);
        else memset(target, 0, 16);
        return;
    }
    Fiber& self = *current_fiber;
    self.pending_copies.push_back(PendingCopy{target, source, valid, self.committed_groups, file, line});
}

// copies issued since the last commit form the next group
inline void async_copy_commit() { current_fiber->committed_groups++; }

// performs every copy of the committed groups except the newest `groups_left_pending`
inline void async_copy_wait(int groups_left_pending) {
    Fiber& self = *current_fiber;
    const int complete_below = self.committed_groups - groups_left_pending;
    while (self.first_pending < self.pending_copies.size() &&
           self.pending_copies[self.first_pending].group < complete_below) {
        const PendingCopy& copy = self.pending_copies[self.first_pending++];
        if (copy.valid) memcpy(copy.target, copy.source, 16);
        else memset(copy.target, 0, 16);
    }
    if (self.first_pending == self.pending_copies.size()) {  // reuse the storage from the start
        self.pending_copies.clear();
        self.first_pending = 0;
    }
}

// ----------------------------------------------------------------------------
// launching a grid

inline std::string describe_function(const void* function) {
    Dl_info info;
    if (dladdr(function, &info) && info.dli_sname) {
        int status = 0;
        char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        std::string name = status == 0 && demangled ? demangled : info.dli_sname;
        free(demangled);
        return name.substr(0, name.find('('));
    }
    char fallback[32];
    snprintf(fallback, sizeof(fallback), "%p", function);
    return fallback;
}

// per-kernel opt-in for more than 48 KiB of dynamic shared memory (cudaFuncSetAttribute)
inline std::map<const void*, size_t>& shared_memory_limits() {
    static std::map<const void*, size_t> limits;
    return limits;
}

}  // namespace cudacpu

template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        (size_t)value > cudacpu::emulated_gpu().shared_bytes_opt_in)
        return cudaErrorInvalidValue;
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    cudacpu::shared_memory_limits()[reinterpret_cast<const void*>(kernel)] = (size_t)value;
    return cudaSuccess;
}

namespace cudacpu {

// LLMC_CPU_PROFILE=1: wall time and launches per kernel, printed at exit, slowest first
struct KernelProfile {
    std::mutex lock;
    std::map<const void*, std::pair<double, long long>> totals;  // seconds, launches
    ~KernelProfile() {
        std::vector<std::pair<double, std::string>> rows;
        double all = 0.0;
        for (auto& [kernel, total] : totals) {
            rows.push_back({total.first, describe_function(kernel) + " (" + std::to_string(total.second) + ")"});
            all += total.first;
        }
        std::sort(rows.rbegin(), rows.rend());
        if (!rows.empty()) fprintf(stderr, "CPU device profile: %.3f s in kernels\n", all);
        for (auto& [seconds, name] : rows) fprintf(stderr, "  %9.3f s  %5.1f%%  %s\n", seconds, 100 * seconds / all, name.c_str());
    }
};
inline KernelProfile* kernel_profile() {
    static KernelProfile* profile = [] {
        const char* setting = getenv("LLMC_CPU_PROFILE");
        if (!setting || setting[0] != '1') return (KernelProfile*)nullptr;
        atexit([] { delete kernel_profile(); });
        return new KernelProfile;
    }();
    return profile;
}
// adds time spent in `function` (a kernel, or host code such as the CPU matmul) to the profile
inline void profile_add(const void* function, std::chrono::steady_clock::time_point start) {
    if (KernelProfile* profile = kernel_profile()) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::lock_guard<std::mutex> guard(profile->lock);
        auto& total = profile->totals[function];
        total.first += seconds;
        total.second += 1;
    }
}

// One launch as issued, for the kernel lab's table of every launch against each GPU's limits.
struct LaunchRecord {
    const void* kernel;
    dim3 grid, block;
    size_t shared_bytes;
};
// where check_launch appends each launch; null (the default): nowhere. Set by the one host thread that launches.
inline std::vector<LaunchRecord>* launch_records = nullptr;

// Refuses a launch the emulated GPU would refuse, when it is issued (a queued launch is checked before it waits).
inline void check_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
    if (launch_records) launch_records->push_back(LaunchRecord{kernel, grid, block, shared_bytes});
    const EmulatedGpu& gpu = emulated_gpu();
    const long long threads = (long long)block.x * block.y * block.z;
    auto fail = [&](const char* problem) {
        char message[512];
        snprintf(message, sizeof(message), "invalid launch of kernel %s (grid %u,%u,%u block %u,%u,%u, %zu bytes of "
                 "shared memory): %s", describe_function(kernel).c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes,
                 problem);
        fatal(message);
    };
    char problem[160];
    if (threads > gpu.max_threads_per_block) {
        snprintf(problem, sizeof(problem), "more than %d threads per block", gpu.max_threads_per_block);
        fail(problem);
    }
    if (threads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) fail("empty grid or block");
    if (block.z > 64) fail("block.z above 64");
    if (grid.x > 2147483647u) fail("grid.x above 2^31 - 1");
    if (grid.y > 65535 || grid.z > 65535) fail("grid.y or grid.z above 65535");
    if (shared_bytes > gpu.shared_bytes_opt_in) {
        snprintf(problem, sizeof(problem), "more dynamic shared memory than the %s's %zu bytes per block", gpu.name,
                 gpu.shared_bytes_opt_in);
        fail(problem);
    }
    size_t limit = gpu.shared_bytes_default;
    auto opted = shared_memory_limits().find(kernel);
    if (opted != shared_memory_limits().end()) limit = opted->second;
    if (shared_bytes > limit)
        fail(opted == shared_memory_limits().end() ? "more than 48 KiB of dynamic shared memory without opting in"
                                                   : "more dynamic shared memory than the kernel opted in to");
}

inline void run_grid(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* state) {
    const long long threads = (long long)block.x * block.y * block.z;
    const auto start = std::chrono::steady_clock::now();
    current_grid_dim = grid;
    const long long num_blocks = (long long)grid.x * grid.y * grid.z;
    const bool reverse = reverse_lanes();
    #pragma omp parallel for schedule(dynamic, 1) if (num_blocks > 1)
    for (long long i = 0; i < num_blocks; i++) {
        long long index = reverse ? num_blocks - 1 - i : i;
        BlockRunner& runner = this_os_thread_runner();
        runner.reserve((int)threads);
        runner.body = body;
        runner.body_state = state;
        runner.kernel = kernel;
        // fresh garbage in shared memory each block: a kernel that reads before writing sees NaNs
        runner.dynamic_shared.assign(shared_bytes + 16, 0xff);
        current_runner = &runner;
        current_block_idx = uint3{(unsigned)(index % grid.x), (unsigned)((index / grid.x) % grid.y),
                                  (unsigned)(index / ((long long)grid.x * grid.y))};
        current_block_dim = block;
        runner.run_block((int)threads, block);
        current_runner = nullptr;
    }
    profile_add(kernel, start);
}

}  // namespace cudacpu

// The launch helper of llmc/cuda_common.cuh, CPU edition: converts the arguments to the kernel's parameter
// types once, then every emulated thread calls the kernel with its own copies. On a late stream (see
// llmc/cpu/runtime.h) the converted arguments wait in the stream's queue until it runs.
template <typename... KernelParams, typename... Args>
void launch(void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
    using Params = std::tuple<std::decay_t<KernelParams>...>;
    struct State {
        void (*kernel)(KernelParams...);
        Params params;
    };
    auto body = [](void* opaque) {
        State& s = *static_cast<State*>(opaque);
        std::apply(s.kernel, s.params);
    };
    const void* name = reinterpret_cast<const void*>(kernel);
    cudacpu::check_launch(name, grid, block, shared_bytes);
    if (!cudacpu::is_late(stream)) {
        State state{kernel, Params(static_cast<KernelParams>(args)...)};
        cudacpu::run_grid(name, grid, block, shared_bytes, body, &state);
        return;
    }
    auto state = std::make_shared<State>(State{kernel, Params(static_cast<KernelParams>(args)...)});
    cudacpu::on_stream(stream, [=] { cudacpu::run_grid(name, grid, block, shared_bytes, body, state.get()); });
}

// ----------------------------------------------------------------------------
// CUDA's built-in variables and intrinsics

#define threadIdx (::cudacpu::current_fiber->thread_idx)
#define blockIdx (::cudacpu::current_block_idx)
#define blockDim (::cudacpu::current_block_dim)
#define gridDim (::cudacpu::current_grid_dim)
constexpr int warpSize = cudacpu::kWarpSize;

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    cudacpu::syncthreads(file, line);
}

inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    cudacpu::warp_operation(cudacpu::WarpOp::Sync, mask, nullptr, 0, 0, file, line);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    unsigned char vote = predicate != 0;
    cudacpu::warp_operation(cudacpu::WarpOp::Ballot, mask, &vote, 1, 0, file, line);
    unsigned result;
    memcpy(&result, cudacpu::current_fiber->result, 4);
    return result;
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return __ballot_sync(mask, predicate, file, line) == mask;
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return __ballot_sync(mask, predicate, file, line) != 0;
}

// The lanes of this warp that reach this call together. (On a GPU: the lanes converged here. The
// scheduler runs every lane of the warp as far as it can go before answering, so lanes that took the same
// path are all here, and lanes on another path are not.)
inline unsigned __activemask(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    cudacpu::warp_operation(cudacpu::WarpOp::ActiveMask, 1u << cudacpu::current_fiber->lane, nullptr, 0, 0, file,
                            line);
    unsigned result;
    memcpy(&result, cudacpu::current_fiber->result, 4);
    return result;
}

// Shuffles. Source lanes follow the CUDA programming guide: lanes form segments of `width`; a lane may read
// inside its own segment (indices wrap modulo width); shfl_up/down return the lane's own value when the
// source would leave the segment; shfl_xor may reach into earlier segments but not later ones.
template <class T>
T __shfl_sync(unsigned mask, T value, int source, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
    width = cudacpu::checked_width(width, file, line);
    int lane = cudacpu::current_fiber->lane;
    int segment_start = lane & ~(width - 1);
    return cudacpu::shuffle(mask, value, segment_start + (source & (width - 1)), file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
    width = cudacpu::checked_width(width, file, line);
    int lane = cudacpu::current_fiber->lane;
    int source = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return cudacpu::shuffle(mask, value, source, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
    width = cudacpu::checked_width(width, file, line);
    int lane = cudacpu::current_fiber->lane;
    int source = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return cudacpu::shuffle(mask, value, source, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
    width = cudacpu::checked_width(width, file, line);
    int lane = cudacpu::current_fiber->lane;
    int source = lane ^ lane_mask;
    int segment_end = (lane & ~(width - 1)) + width;
    if (source >= segment_end || source >= warpSize) source = lane;
    return cudacpu::shuffle(mask, value, source, file, line);
}
