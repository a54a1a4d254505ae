/*
Tests of the CPU execution layer itself (llmc/cpu/): the machinery every other CPU test stands on.
Each kernel here exercises one CUDA semantic whose expected outcome is written down independently of
the layer's code: shuffle source lanes (with segments narrower than a warp), barriers, votes,
cooperative groups, atomics, dynamic shared memory, warp-collective operations; then the failures that must be reported (a divergent
warp, invalid launches) are run in a child process and their messages checked; the bf16 stand-in is
compared bit for bit with the CUDA toolkit's own conversion on millions of floats in dev/test/test_bf16.cpp.
*/
#include <atomic>
#include <string>
#include <vector>
#include "../lab/lab.h"

// ----------------------------------------------------------------------------
// shuffles: each lane contributes 100 + lane and records what it received

enum ShuffleKind { kIndexed, kUp, kDown, kXor };

__global__ void shuffle_kernel(int* received, int kind, int argument, int width) {
    int lane = threadIdx.x % 32;
    int value = 100 + (int)threadIdx.x;
    int result = 0;
    if (kind == kIndexed) result = __shfl_sync(0xffffffff, value, argument, width);
    if (kind == kUp) result = __shfl_up_sync(0xffffffff, value, argument, width);
    if (kind == kDown) result = __shfl_down_sync(0xffffffff, value, argument, width);
    if (kind == kXor) result = __shfl_xor_sync(0xffffffff, value, argument, width);
    received[threadIdx.x] = result - 100 - (int)(threadIdx.x - lane);  // the lane it came from
}

// The programming guide's rules, written as a table lookup over segments of `width` lanes.
int expected_source(int kind, int lane, int argument, int width) {
    int segment = lane / width, position = lane % width;
    switch (kind) {
        case kIndexed: return segment * width + ((argument % width) + width) % width;
        case kUp: return position - argument >= 0 ? lane - argument : lane;
        case kDown: return position + argument <= width - 1 ? lane + argument : lane;
        case kXor: {
            int source = lane ^ argument;
            return source / width > segment ? lane : source;  // later segments are out of reach
        }
    }
    return -1;
}

void test_shuffles() {
    printf("shuffles\n");
    DeviceBuffer<int> received(64);
    const char* names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    for (int kind = kIndexed; kind <= kXor; kind++) {
        int mismatches = 0, cases = 0;
        for (int width = 1; width <= 32; width *= 2) {
            for (int argument = 0; argument < 40; argument += (argument < 8 ? 1 : 7)) {
                if (kind == kIndexed && argument >= 32) continue;
                received.poison();
                launch(shuffle_kernel, 1, 64, 0, nullptr, received.ptr, kind, argument, width);
                std::vector<int> raw(64);
                cudaCheck(cudaMemcpy(raw.data(), received.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
                for (int t = 0; t < 64; t++, cases++)
                    if (raw[t] != expected_source(kind, t % 32, argument, width)) mismatches++;
            }
        }
        check_true(std::string(names[kind]) + " source lanes, widths 1..32", mismatches == 0,
                   std::to_string(cases) + " lane cases, " + std::to_string(mismatches) + " wrong");
    }
    // a few cases spelled out by hand
    std::vector<int> raw(64);
    launch(shuffle_kernel, 1, 64, 0, nullptr, received.ptr, (int)kDown, 3, 8);
    cudaCheck(cudaMemcpy(raw.data(), received.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    check_true("shfl_down width 8 delta 3: lane 4 <- 7, lane 5 keeps its own", raw[4] == 7 && raw[5] == 5);
    launch(shuffle_kernel, 1, 64, 0, nullptr, received.ptr, (int)kXor, 16, 16);
    cudaCheck(cudaMemcpy(raw.data(), received.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    check_true("shfl_xor 16 width 16: lane 3 keeps its own, lane 19 <- 3", raw[3] == 3 && raw[19] == 3);
}

// ----------------------------------------------------------------------------
// barriers: a value travels around the block through shared memory, one step per barrier

__global__ void rotate_kernel(int* out, int rounds) {
    __shared__ int ring[1024];
    int n = blockDim.x, t = threadIdx.x;
    ring[t] = t;
    for (int r = 0; r < rounds; r++) {
        __syncthreads();
        int next = ring[(t + 1) % n];
        __syncthreads();
        ring[t] = next;
    }
    __syncthreads();
    out[blockIdx.x * n + t] = ring[t];
}

// half the threads leave early; those that stay still meet at the barrier (exited threads count as arrived)
__global__ void early_exit_kernel(int* out) {
    __shared__ int value[1024];
    int t = threadIdx.x;
    if (t % 64 >= 32) return;  // whole warps exit
    value[t] = t * 3;
    __syncthreads();
    out[t] = value[(t + 64) % blockDim.x % 1024];
}

// the same race with and without the barrier: without it, the result depends on the order threads run in
__global__ void racy_kernel(int* out, int with_barrier) {
    __shared__ int slot[64];
    slot[threadIdx.x] = (int)threadIdx.x + 1;
    if (with_barrier) __syncthreads();
    out[threadIdx.x] = slot[(threadIdx.x + 1) % 64];
}

void test_barriers() {
    printf("barriers\n");
    for (int threads : {32, 96, 1024}) {
        DeviceBuffer<int> out(3 * threads);
        int rounds = 5;
        launch(rotate_kernel, 3, threads, 0, nullptr, out.ptr, rounds);
        std::vector<int> raw(3 * threads);
        cudaCheck(cudaMemcpy(raw.data(), out.ptr, raw.size() * sizeof(int), cudaMemcpyDeviceToHost));
        int wrong = 0;
        for (int i = 0; i < 3 * threads; i++) wrong += raw[i] != (i % threads + rounds) % threads;
        check_true("values rotate one step per barrier, " + std::to_string(threads) + " threads", wrong == 0);
    }
    DeviceBuffer<int> out(256);
    out.poison();
    launch(early_exit_kernel, 1, 256, 0, nullptr, out.ptr);
    std::vector<int> raw(256);
    cudaCheck(cudaMemcpy(raw.data(), out.ptr, 256 * sizeof(int), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < 256; t++)
        if (t % 64 < 32) wrong += raw[t] != ((t + 64) % 256) * 3;
    check_true("barrier after some warps exited", wrong == 0);

    // reverse lane order exposes the race that forward order hides
    DeviceBuffer<int> racy(64);
    std::vector<int> forward(64), backward(64), synced(64);
    bool saved = cudacpu::reverse_lanes();
    cudacpu::set_reverse_lanes(false);
    launch(racy_kernel, 1, 64, 0, nullptr, racy.ptr, 0);
    cudaCheck(cudaMemcpy(forward.data(), racy.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    cudacpu::set_reverse_lanes(true);
    launch(racy_kernel, 1, 64, 0, nullptr, racy.ptr, 0);
    cudaCheck(cudaMemcpy(backward.data(), racy.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    launch(racy_kernel, 1, 64, 0, nullptr, racy.ptr, 1);
    cudaCheck(cudaMemcpy(synced.data(), racy.ptr, 64 * sizeof(int), cudaMemcpyDeviceToHost));
    cudacpu::set_reverse_lanes(saved);
    wrong = 0;
    for (int t = 0; t < 64; t++) wrong += synced[t] != (t + 1) % 64 + 1;
    check_true("a missing barrier gives different results in the two lane orders", forward != backward);
    check_true("with the barrier the result is right", wrong == 0);
}

// ----------------------------------------------------------------------------
// votes, __syncwarp, __activemask

__global__ void vote_kernel(unsigned* out) {
    int t = threadIdx.x;
    unsigned ballot = __ballot_sync(0xffffffff, t % 3 == 0);
    int all = __all_sync(0xffffffff, t < 1000);
    int any = __any_sync(0xffffffff, t == 5);
    __syncwarp();
    if (t % 32 < 16) {
        unsigned half = __ballot_sync(0x0000ffff, t % 2);  // only the lower half-warp takes part
        out[4 * t + 3] = half;
    } else {
        out[4 * t + 3] = __activemask();
    }
    out[4 * t + 0] = ballot;
    out[4 * t + 1] = all;
    out[4 * t + 2] = any;
}

void test_votes() {
    printf("votes\n");
    DeviceBuffer<unsigned> out(4 * 64);
    launch(vote_kernel, 1, 64, 0, nullptr, out.ptr);
    std::vector<unsigned> raw(4 * 64);
    cudaCheck(cudaMemcpy(raw.data(), out.ptr, raw.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < 64; t++) {
        unsigned ballot = 0;
        for (int k = 0; k < 32; k++) ballot |= (unsigned)(((t / 32) * 32 + k) % 3 == 0) << k;
        wrong += raw[4 * t] != ballot;
        wrong += raw[4 * t + 1] != 1;
        wrong += raw[4 * t + 2] != (unsigned)(t / 32 == 0);
        if (t % 32 < 16) wrong += raw[4 * t + 3] != 0x0000aaaau;
        else wrong += raw[4 * t + 3] != 0xffff0000u;  // the upper half-warp, converged in the else branch
    }
    check_true("__ballot_sync, __all_sync, __any_sync, a half-warp mask, __activemask", wrong == 0);
}

// ----------------------------------------------------------------------------
// cooperative groups

namespace cg = cooperative_groups;

__global__ void groups_kernel(float* out) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<16> tile = cg::tiled_partition<16>(block);
    float value = (float)block.thread_rank();
    float sum = cg::reduce(tile, value, cg::plus<float>{});
    float maximum = cg::reduce(tile, value, cg::greater<float>{});
    float minimum = cg::reduce(tile, value, cg::less<float>{});
    tile.sync();
    int t = block.thread_rank();
    out[4 * t + 0] = sum;
    out[4 * t + 1] = maximum;
    out[4 * t + 2] = minimum;
    out[4 * t + 3] = (float)(tile.meta_group_rank() * 100 + tile.thread_rank());
}

void test_cooperative_groups() {
    printf("cooperative groups\n");
    DeviceBuffer<float> out(4 * 96);
    launch(groups_kernel, 1, 96, 0, nullptr, out.ptr);
    std::vector<float> got = out.download();
    int wrong = 0;
    for (int t = 0; t < 96; t++) {
        int first = t / 16 * 16;
        wrong += got[4 * t] != (float)(16 * first + 120);  // first + (first+1) + ... + (first+15)
        wrong += got[4 * t + 1] != (float)(first + 15);
        wrong += got[4 * t + 2] != (float)first;
        wrong += got[4 * t + 3] != (float)(t / 16 * 100 + t % 16);
    }
    check_true("tiled_partition<16>: reduce plus/greater/less, ranks", wrong == 0);
}

// ----------------------------------------------------------------------------
// atomics across blocks running on several OS threads, dynamic shared memory

__global__ void count_kernel(float* total, int* count) {
    atomicAdd(total, 1.0f);
    atomicAdd(count, 1);
}

__global__ void dynamic_shared_kernel(float* out, int n) {
    DYNAMIC_SHARED(float, buffer);
    for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = (float)i;
    __syncthreads();
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += buffer[n - 1 - i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

void test_atomics_and_shared_memory() {
    printf("atomics and shared memory\n");
    DeviceBuffer<float> total(1);
    DeviceBuffer<int> count(1);
    total.zero();
    count.zero();
    launch(count_kernel, 200, 128, 0, nullptr, total.ptr, count.ptr);
    std::vector<float> t = total.download();
    int c = 0;
    cudaCheck(cudaMemcpy(&c, count.ptr, sizeof(int), cudaMemcpyDeviceToHost));
    check_true("atomicAdd from 25600 threads in 200 blocks", t[0] == 25600.0f && c == 25600);

    const int n = 25000;  // 100 KB: more than the default 48 KiB, so the kernel must opt in
    opt_in_shared_memory(dynamic_shared_kernel, n * sizeof(float));
    DeviceBuffer<float> out(4);
    launch(dynamic_shared_kernel, 4, 256, n * sizeof(float), nullptr, out.ptr, n);
    std::vector<float> got = out.download();
    check_true("100 KB of dynamic shared memory after opting in", got[0] == (float)(n * (double)(n - 1) / 2) &&
               got[3] == got[0]);
}

// ----------------------------------------------------------------------------
// a warp-collective operation (the mechanism behind llmc/kernels/mma.cuh): each lane deposits its value; one call
// per warp gives lane i the value of lane 31 - i and the warp's sum

struct ReverseLane {
    int value;
    int* reversed;
    int* sum;
};
std::atomic<int> collective_calls{0};

void reverse_and_sum(void* const lanes[32]) {
    collective_calls++;
    int sum = 0;
    for (int lane = 0; lane < 32; lane++) sum += static_cast<ReverseLane*>(lanes[lane])->value;
    for (int lane = 0; lane < 32; lane++) {
        ReverseLane& mine = *static_cast<ReverseLane*>(lanes[lane]);
        *mine.reversed = static_cast<ReverseLane*>(lanes[31 - lane])->value;
        *mine.sum = sum;
    }
}

__global__ void collective_kernel(int* out) {
    int reversed = -1, sum = -1;
    ReverseLane mine{3 * (int)threadIdx.x, &reversed, &sum};
    cudacpu::warp_collective("reverse_and_sum", reverse_and_sum, &mine, __FILE__, __LINE__);
    out[2 * threadIdx.x] = reversed;
    out[2 * threadIdx.x + 1] = sum;
}

void test_collective() {
    printf("warp-collective operations\n");
    DeviceBuffer<int> out(2 * 96);
    out.poison();
    collective_calls = 0;
    launch(collective_kernel, 1, 96, 0, nullptr, out.ptr);
    std::vector<int> raw(2 * 96);
    cudaCheck(cudaMemcpy(raw.data(), out.ptr, raw.size() * sizeof(int), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int t = 0; t < 96; t++) {
        const int first = t / 32 * 32;
        wrong += raw[2 * t] != 3 * (first + 31 - t % 32);
        wrong += raw[2 * t + 1] != 3 * (32 * first + 496);  // 3 * (first + (first+1) + ... + (first+31))
    }
    check_true("each lane gets its results from all 32 lanes' arguments", wrong == 0);
    check_true("the operation runs once per warp", collective_calls == 3,
               std::to_string(collective_calls.load()) + " calls for 3 warps");
}

// ----------------------------------------------------------------------------
// late streams (LLMC_CPU_LATE_STREAMS=1, llmc/cpu/runtime.h): non-blocking streams run only when forced

__global__ void set_kernel(int* target, int value) { *target = value; }

void test_late_streams() {
    printf("late streams\n");
    cudacpu::set_late_streams(1);
    cudaStream_t producer, consumer, blocking;
    cudaCheck(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreate(&blocking));
    cudaEvent_t written, start, stop, untimed;
    cudaCheck(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
    int* x = nullptr;  // raw allocations: cudaFree would run the queues
    int* y = nullptr;
    cudaCheck(cudaMalloc(&x, sizeof(int)));
    cudaCheck(cudaMalloc(&y, sizeof(int)));
    cudaCheck(cudaMemset(x, 0, sizeof(int)));
    cudaCheck(cudaMemset(y, 0, sizeof(int)));

    cudaCheck(cudaEventRecord(start, producer));
    launch(set_kernel, 1, 1, 0, producer, x, 1);
    int seen = -1;
    cudaCheck(cudaMemcpy(&seen, x, sizeof(int), cudaMemcpyDeviceToHost));  // the legacy stream does not wait
    check_true("a launch on a non-blocking stream waits in its queue (a synchronous copy sees the old value)",
               seen == 0);
    float ms = 0.0f;
    check_true("cudaEventElapsedTime before the markers ran: not ready",
               cudaEventElapsedTime(&ms, start, start) == cudaErrorNotReady);

    // ordered: the consumer copies x into y after waiting for the producer's event
    cudaCheck(cudaEventRecord(written, producer));
    launch(set_kernel, 1, 1, 0, producer, x, 2);  // after the record: the wait must not run it
    cudaCheck(cudaEventRecord(stop, producer));
    cudaCheck(cudaStreamWaitEvent(consumer, written, 0));
    cudaCheck(cudaMemcpyAsync(y, x, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
    cudaCheck(cudaStreamSynchronize(consumer));
    check_true("a wait runs the producer up to the event's record, and no further", *y == 1 && *x == 1,
               "x " + std::to_string(*x) + ", y " + std::to_string(*y));
    cudaCheck(cudaEventSynchronize(stop));
    check_true("cudaEventSynchronize runs the stream up to the record", *x == 2);
    check_true("cudaEventElapsedTime between two markers that ran", cudaEventElapsedTime(&ms, start, stop) ==
               cudaSuccess && ms >= 0.0f);
    cudaCheck(cudaEventRecord(untimed, producer));
    cudaCheck(cudaStreamSynchronize(producer));
    check_true("cudaEventElapsedTime of an event created with cudaEventDisableTiming fails",
               cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);

    // not ordered: without the wait the consumer reads x before the producer wrote it
    launch(set_kernel, 1, 1, 0, producer, x, 3);
    cudaCheck(cudaMemcpyAsync(y, x, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
    cudaCheck(cudaStreamSynchronize(consumer));
    check_true("without a wait the consumer runs first and reads the old value", *y == 2 && *x == 2);
    cudaCheck(cudaMemsetAsync(y, 0, sizeof(int), consumer));
    cudaCheck(cudaDeviceSynchronize());
    check_true("cudaDeviceSynchronize runs every queue", *x == 3 && *y == 0);

    launch(set_kernel, 1, 1, 0, blocking, x, 4);
    check_true("a stream created without cudaStreamNonBlocking runs at once", *x == 4);
    launch(set_kernel, 1, 1, 0, producer, x, 5);
    cudaCheck(cudaStreamDestroy(producer));
    check_true("cudaStreamDestroy runs what is queued", *x == 5);

    for (cudaEvent_t event : {written, start, stop, untimed}) cudaCheck(cudaEventDestroy(event));
    cudaCheck(cudaStreamDestroy(consumer));
    cudaCheck(cudaStreamDestroy(blocking));
    cudaCheck(cudaFree(x));
    cudaCheck(cudaFree(y));

    // mode 2: when the producer is forced, a consumer that does not wait runs ahead of it
    cudacpu::set_late_streams(2);
    cudaCheck(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    cudaCheck(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    cudaCheck(cudaMalloc(&x, sizeof(int)));
    cudaCheck(cudaMalloc(&y, sizeof(int)));
    cudaCheck(cudaMemset(x, 0, sizeof(int)));
    cudaCheck(cudaMemset(y, 0, sizeof(int)));
    launch(set_kernel, 1, 1, 0, producer, x, 1);
    cudaCheck(cudaMemcpyAsync(y, x, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
    cudaCheck(cudaStreamSynchronize(producer));
    check_true("mode 2: without a wait the consumer runs ahead of the forced producer", *y == 0 && *x == 1);
    launch(set_kernel, 1, 1, 0, producer, x, 2);
    cudaCheck(cudaEventRecord(written, producer));
    cudaCheck(cudaStreamWaitEvent(consumer, written, 0));
    cudaCheck(cudaMemcpyAsync(y, x, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
    cudaCheck(cudaStreamSynchronize(producer));
    const int before = *y;  // the consumer may not have run yet, but it must not have run early
    cudaCheck(cudaStreamSynchronize(consumer));
    check_true("mode 2: a consumer that waits does not run ahead of the record", (before == 0 || before == 2) &&
               *y == 2, "y " + std::to_string(before) + " then " + std::to_string(*y));
    cudaCheck(cudaEventDestroy(written));
    cudaCheck(cudaStreamDestroy(producer));
    cudaCheck(cudaStreamDestroy(consumer));
    cudaCheck(cudaFree(x));
    cudaCheck(cudaFree(y));
    cudacpu::set_late_streams(0);
}

// ----------------------------------------------------------------------------
// failures that must be reported: run in a child process, check exit status and message

constexpr int kDivergentBarrierLine = __LINE__ + 5;  // the lines of the two waits below
constexpr int kDivergentShuffleLine = __LINE__ + 6;
__global__ void divergent_kernel(float* out) {
    float value = (float)threadIdx.x;
    if (threadIdx.x % 32 < 16) {
        __syncthreads();
    } else {
        value = __shfl_xor_sync(0xffffffff, value, 1);  // lanes 0..15 never join this shuffle
    }
    out[threadIdx.x] = value;
}

__global__ void nothing_kernel(float* out) { out[0] = 1.0f; }

constexpr int kDivergentCollectiveLine = __LINE__ + 5;
__global__ void divergent_collective_kernel(int* out) {
    int reversed = -1, sum = -1;
    ReverseLane mine{(int)threadIdx.x, &reversed, &sum};
    if (threadIdx.x % 32 != 5)  // lane 5 never joins
        cudacpu::warp_collective("reverse_and_sum", reverse_and_sum, &mine, __FILE__, __LINE__);
    __syncthreads();
    out[threadIdx.x] = reversed;
}
void run_divergent_collective() {
    int* out;
    cudaCheck(cudaMalloc(&out, 32 * sizeof(int)));
    launch(divergent_collective_kernel, 1, 32, 0, nullptr, out);
}

void run_divergent() {
    float* out;
    cudaCheck(cudaMalloc(&out, 64 * sizeof(float)));
    launch(divergent_kernel, 1, 64, 0, nullptr, out);
}
void run_too_many_threads() {
    float* out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    launch(nothing_kernel, 1, 1025, 0, nullptr, out);
}
void run_too_much_shared_memory() {
    float* out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    launch(nothing_kernel, 1, 32, 64 * 1024, nullptr, out);
}

// 200 KiB: within an H100's 227 KiB per block, beyond an A100's 163
__global__ void big_shared_kernel(float* out) {
    DYNAMIC_SHARED(float, buffer);
    buffer[threadIdx.x] = 1.0f;
    out[0] = buffer[0];
}
constexpr size_t kBigShared = 200 * 1024;
void run_big_shared_under_a100() {
    float* out;
    cudaCheck(cudaMalloc(&out, sizeof(float)));
    cudacpu::set_emulated_gpu(cudacpu::kA100);  // the kernel opted in under the H100's limits, before the switch
    launch(big_shared_kernel, 1, 32, kBigShared, nullptr, out);
}

// LLMC_CPU_DEVICE: the GPU whose limits the device takes on; the properties and the launch checks agree
void test_emulated_gpus() {
    printf("emulated GPUs' limits\n");
    const cudacpu::EmulatedGpu& chosen = cudacpu::emulated_gpu();
    cudacpu::set_emulated_gpu(cudacpu::kH100);
    cudaDeviceProp props;
    cudaCheck(cudaGetDeviceProperties(&props, 0));
    check_true("H100: 232448 bytes of shared memory per block (opted in), 1024 threads",
               props.sharedMemPerBlockOptin == 232448 && props.maxThreadsPerBlock == 1024 &&
               device_properties().sharedMemPerBlockOptin == 232448);
    check_true("H100: a kernel may opt in to 200 KiB",
               cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kBigShared) ==
                   cudaSuccess);
    DeviceBuffer<float> out(1);
    launch(big_shared_kernel, 1, 32, kBigShared, nullptr, out.ptr);
    check_true("H100: a launch with 200 KiB runs", out.download()[0] == 1.0f);
    cudacpu::set_emulated_gpu(cudacpu::kA100);
    cudaCheck(cudaGetDeviceProperties(&props, 0));
    check_true("A100: 166912 bytes per block, in cudaGetDeviceProperties and device_properties()",
               props.sharedMemPerBlockOptin == 166912 && device_properties().sharedMemPerBlockOptin == 166912);
    check_true("A100: opting in to 200 KiB is an invalid value",
               cudaFuncSetAttribute(big_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kBigShared) ==
                   cudaErrorInvalidValue);
    cudacpu::set_emulated_gpu(chosen);
    expect_failure("A100: a launch with 200 KiB is invalid, whatever the kernel opted in to before",
                   run_big_shared_under_a100, "more dynamic shared memory than the A100's 166912 bytes per block");
}

void test_reported_failures() {
    printf("reported failures\n");
    // the divergent kernel's message must name the lines of both waits
    std::string shuffle_line = std::to_string(kDivergentShuffleLine);
    std::string barrier_line = std::to_string(kDivergentBarrierLine);
    expect_failure("divergent warp aborts naming the shuffle's line", run_divergent,
                   "test_cpu_layer.cu:" + shuffle_line);
    expect_failure("divergent warp aborts naming the barrier's line", run_divergent,
                   "test_cpu_layer.cu:" + barrier_line);
    expect_failure("a collective that lane 5 skips aborts naming its line", run_divergent_collective,
                   "reverse_and_sum (dev/test/test_cpu_layer.cu:" + std::to_string(kDivergentCollectiveLine) + ")");
    expect_failure("1025 threads per block is an invalid launch", run_too_many_threads, "more than 1024 threads");
    expect_failure("64 KiB of shared memory without opting in is invalid", run_too_much_shared_memory,
                   "48 KiB");
    check_true("cudaFree of a pointer that cudaMalloc did not return fails",
               cudaFree((void*)&test_reported_failures) == cudaErrorInvalidDevicePointer);
}

int main() {
    test_shuffles();
    test_barriers();
    test_votes();
    test_cooperative_groups();
    test_atomics_and_shared_memory();
    test_collective();
    test_late_streams();
    test_reported_failures();
    test_emulated_gpus();
    return lab_closing_line();
}
