/*
The machine's measurements for its profile (scripts/bench/calibrate.sh runs this and fits the numbers): what one
rank's device computes and moves, timed through the project's own kernels and communication layer, so the
planner is priced by the code that train_gpt runs. One source for both builds: on the CPU build the "device" is
the CPU execution layer (OpenBLAS matmuls, emulated kernels, MPI collectives); on the GPU build cuBLASLt, the
CUDA kernels and NCCL.

    ./calibrate_fp32_cpu compute [--quick]                  one rank: matmuls, attention, memory, launch, copies
    ./calibrate_fp32_cpu matmul M N K                       one rank: the matmul line of one shape, as compute's
    mpirun -np G ./calibrate_fp32_cpu collectives [--quick] every collective over sizes 8 B .. 32 MiB

Each measurement is one line, words separated by spaces, seconds per call (the median of several calls after a
warm-up), for the script to read:
    matmul M N K FORWARD BACKWARD_INPUT BACKWARD_WEIGHTS
        C (M x N) = A (M x K) B (K x N) through each of the model's three calls of the matmul launcher, which
        differ only in which operand is transposed (llmc/kernels/matmul.cuh): matmul_forward with N = M rows,
        C = K, OC = N; matmul_backward_input with N = M, C = N, OC = K; matmul_backward_weights with OC = M,
        C = N, N = K rows. Each does 2 M N K flops.
    attention T B NH HS SECONDS FLOPS       causal attention_forward + attention_backward; FLOPS counted as the
                                            planner counts them (llmc/planning/hardware.h attention_flops: the
                                            causal kernel's T^2/2 scores a head, 2 + 7 products each), so the
                                            planner's count over peak x efficiency gives back the kernel's time
    stream BYTES SECONDS                    residual_forward over buffers beyond the caches: the streaming rate
    memory KIND C R BYTES SECONDS           a block's memory-bound kernels of one kind (hardware.h's memory KIND:
                                            pointwise, layernorm, rmsnorm, route) on R rows of C values: BYTES as
                                            the planner counts them, SECONDS less their launches (measure_memory)
    launch SECONDS                          one launch of residual_forward on 16 bytes (a launch's fixed cost)
    copy BYTES TO_DEVICE TO_HOST            copy_to_device / copy_to_host between device memory and pinned host
                                            memory (cudaMallocHost)
    collective OP G BYTES SECONDS           OP all_reduce | all_gather | reduce_scatter | all_to_all | send_recv,
                                            BYTES in nccl-tests' convention (hardware.h), G ranks; per call the
                                            slowest rank's time, after a barrier
Collectives: every rank times each call from after a barrier to its stream's end; the slowest rank's time is
the call's (a collective ends when its last member does), and the median over calls is printed by rank 0.
send_recv is the ring shift the pipeline and ring attention do: every rank sends to the next and receives from
the previous at once.
*/
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>
#include "../llmc/utils.h"
#include "../llmc/cuda_common.cuh"
#include "../llmc/kernels/matmul.cuh"
#include "../llmc/kernels/attention.cuh"
#include "../llmc/kernels/layernorm.cuh"
#include "../llmc/kernels/gelu.cuh"
#include "../llmc/kernels/moe_routing.cuh"
#include "../llmc/parallel/comm.h"
#include "../llmc/planning/hardware.h"
#include "../llmc/planning/cost_model.h"

namespace {

bool quick = false;  // --quick: a coarse grid and fewer calls (the test suite's)

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// How many timed calls: enough to fill about `budget` seconds, within [fewest, most], from one call's time.
int calls_for(double one_call_seconds, double budget, int fewest, int most) {
    const double calls = budget / std::max(one_call_seconds, 1e-9);
    return (int)std::clamp(calls, (double)fewest, (double)most);
}

// Seconds per call of `run` on the default stream: the median of timed samples, each timed with events (the
// device's clock on a GPU, the wall clock on the CPU device), after one warm-up call. On a GPU a sample is a batch
// of calls queued back to back, as a training step issues them, filling about a millisecond: a short call timed
// alone is mostly its host-side issue (an H200 timed single cuBLASLt calls of 512^3 at 11 us, 24 TFLOP/s). The
// CPU device runs each call as it is issued, so there a sample is one call.
double device_seconds(const std::function<void()>& run) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    auto timed = [&](int batch) {
        cudaCheck(cudaEventRecord(start, 0));
        for (int i = 0; i < batch; i++) run();
        cudaCheck(cudaEventRecord(stop, 0));
        cudaCheck(cudaEventSynchronize(stop));
        float ms = 0;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        return ms * 1e-3 / batch;
    };
    timed(1);  // warm-up: first-touch of the buffers, the matmul's plan, the kernel's code
    const double first = timed(1);
#ifdef LLMC_CPU
    const int batch = 1;
#else
    const int batch = (int)std::clamp(1e-3 / std::max(first, 1e-9), 1.0, 256.0);
#endif
    const int samples = calls_for(first * batch, quick ? 0.03 : 0.15, quick ? 2 : 5, quick ? 5 : 25);
    std::vector<double> times{first};
    if (batch > 1) times = {timed(batch)};
    for (int i = 1; i < samples; i++) times.push_back(timed(batch));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return median(times);
}

template <class T>
T* device_alloc(size_t count) {
    T* pointer = nullptr;
    cudaCheck(cudaMalloc(&pointer, count * sizeof(T)));
    return pointer;
}
// every byte set to 0x3c (bf16 1.17, fp32 0.0115): finite values, never NaN, never denormal
template <class T>
T* device_filled(size_t count) {
    T* pointer = device_alloc<T>(count);
    cudaCheck(cudaMemset(pointer, 0x3c, count * sizeof(T)));
    return pointer;
}

// uniform values in [-1, 1): a matmul's operands. A GPU multiplies constant or zero operands faster than real ones
// (fewer bits toggle, so it draws less power and keeps a higher clock: H200, 8192^3 BF16, ~790 TFLOP/s on random
// values and ~890 on zeros), so memset-filled operands would overstate its rate.
template <class T>
T* device_random(size_t count) {
    std::vector<T> host(count);
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (T& x : host) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = (T)((float)(state >> 40) / (float)(1ull << 23) - 1.0f);
    }
    T* pointer = device_alloc<T>(count);
    cudaCheck(cudaMemcpy(pointer, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    return pointer;
}

// ----------------------------------------------------------------------------
// one rank's device

// One shape through the three calls (operands of at least M x K, K x N and M x N values), its line printed.
void measure_matmul(int m, int n, int k, floatX* a, floatX* b, floatX* d) {
    // operand roles as each call names them (see the header): only the transposes differ
    const double forward = device_seconds([&] { matmul_forward(d, a, b, nullptr, m, k, n, 0); });
    const double input = device_seconds([&] { matmul_backward_input(d, a, b, m, n, k, 0); });
    const double weights = device_seconds([&] { matmul_backward_weights(d, nullptr, nullptr, a, b, k, n, m, 0); });
    printf("matmul %d %d %d %.6e %.6e %.6e\n", m, n, k, forward, input, weights);
    fflush(stdout);
}

// Every shape of the grid, and each of `extra` (M, N, K triples) after it.
void measure_matmuls(const std::vector<int>& extra) {
    std::vector<int> sizes = quick ? std::vector<int>{64, 256, 1024} : std::vector<int>{64, 128, 256, 512, 1024};
#ifndef LLMC_CPU
    // a GPU reaches its peak only on large products (a CPU core already at 1024)
    sizes = quick ? std::vector<int>{256, 2048, 8192} : std::vector<int>{256, 512, 1024, 2048, 4096, 8192};
#endif
    if (!extra.empty()) sizes.clear();  // one shape asked for: that one alone
    // the operands' largest product of two of M, N, K
    size_t largest = 0;
    for (int x : sizes) largest = std::max(largest, (size_t)x * x);
    for (size_t i = 0; i < extra.size(); i += 3)
        largest = std::max({largest, (size_t)extra[i] * extra[i + 1], (size_t)extra[i + 1] * extra[i + 2],
                            (size_t)extra[i] * extra[i + 2]});
    floatX* a = device_random<floatX>(largest);
    floatX* b = device_random<floatX>(largest);
    floatX* d = device_random<floatX>(largest);
    for (int m : sizes)
        for (int n : sizes)
            for (int k : sizes) measure_matmul(m, n, k, a, b, d);
    for (size_t i = 0; i < extra.size(); i += 3) measure_matmul(extra[i], extra[i + 1], extra[i + 2], a, b, d);
    for (floatX* x : {a, b, d}) cudaCheck(cudaFree(x));
}

// Causal attention over T at the head sizes the runs have (the CPU build's small models' 32 and 64; Llama's 128 and
// GPT-2's 64 on a GPU). B x NH chosen so that every T does a comparable amount of work per call: on the CPU
// B NH T = 4096 rows (at least one sequence of 4 heads); on a GPU 2^18 rows of 16 heads, as many (sequence, head)
// pairs as a training step has (GPT-2 124M at B 16: 192 of T 1024), since a GPU given a few heads idles most of its
// multiprocessors (an H200 measured T 1024, head size 64 with B 1 x 4 heads at 2% of peak).
void measure_attention() {
    std::vector<int> lengths = quick ? std::vector<int>{32, 128} : std::vector<int>{16, 32, 64, 128, 256, 512};
    std::vector<int> head_sizes = {32, 64};
    int NH = 4, rows_per_call = 4096;
#ifndef LLMC_CPU
    lengths = {128, 256, 512, 1024, 2048, 4096, 8192};  // a GPU: the lengths its runs use
    head_sizes = {64, 128};
    NH = 16, rows_per_call = 1 << 18;
#endif
    for (int HS : head_sizes)
        for (int T : lengths) {
            const int B = std::max(1, rows_per_call / (NH * T));
            const AttentionHeads heads = attention_heads(NH, NH, HS);
            const size_t rows = (size_t)B * T;
            floatX* qkv = device_filled<floatX>(rows * heads.qkv_columns());
            floatX* out = device_filled<floatX>(rows * heads.q_columns());
            floatX* dout = device_filled<floatX>(rows * heads.q_columns());
            floatX* dqkv = device_filled<floatX>(rows * heads.qkv_columns());
            float* lse = device_filled<float>((size_t)B * NH * T);
            float* workspace = device_filled<float>((size_t)B * NH * T);
            const double seconds = device_seconds([&] {
                attention_forward(out, lse, qkv, B, T, heads, 0);
                attention_backward(dqkv, workspace, dout, qkv, out, lse, B, T, heads, 0);
            });
            const double scores = (double)B * NH * T * T / 2;
            printf("attention %d %d %d %d %.6e %.6e\n", T, B, NH, HS, seconds,
                   attention_flops(kAttentionForwardProducts + kAttentionBackwardProducts, scores, HS));
            fflush(stdout);
            for (floatX* x : {qkv, out, dout, dqkv}) cudaCheck(cudaFree(x));
            for (float* x : {lse, workspace}) cudaCheck(cudaFree(x));
        }
}

// A launch's fixed cost: residual_forward on one 16-byte vector, many launches back to back, then one wait.
double measure_launch() {
    floatX* a = device_filled<floatX>(x128::size);
    floatX* out = device_filled<floatX>(x128::size);
    const int launches = quick ? 200 : 2000;
    const double per_launch = device_seconds([&] {
        for (int i = 0; i < launches; i++) residual_forward(out, a, a, x128::size, 0);
    }) / launches;
    printf("launch %.6e\n", per_launch);
    for (floatX* x : {a, out}) cudaCheck(cudaFree(x));
    return per_launch;
}

// residual_forward reads two buffers and writes a third, over buffers well beyond a CPU's last-level cache (tens
// of MiB) and a GPU's L2 (50 MiB on an H100/H200): the memory's streaming rate (AdamW's, the profile's
// hbm_bytes_per_second).
void measure_stream() {
#ifdef LLMC_CPU
    const size_t count = (quick ? 8u : 32u) << 20;
#else
    const size_t count = (size_t)512 << 20;
#endif
    floatX *a = device_filled<floatX>(count), *b = device_filled<floatX>(count), *out = device_filled<floatX>(count);
    const double seconds = device_seconds([&] { residual_forward(out, a, b, count, 0); });
    printf("stream %.6e %.6e\n", 3.0 * count * sizeof(floatX), seconds);
    fflush(stdout);
    for (floatX* x : {a, b, out}) cudaCheck(cudaFree(x));
}

// The memory-bound kernels a block runs on R rows of C values, kind by kind (hardware.h's memory KIND), with the
// bytes the planner counts for each (llmc/planning/cost_model.h block_pass_seconds):
//     layernorm  a norm forward, the fused residual + norm forward, two norm backwards: 2 + 4 + 2 x 4 = 14 R C
//     rmsnorm    the same with RMSNorm's kernels
//     pointwise  GELU forward and backward on R x 4C, a residual add: 2 + 3 (x 4 R C) + 3 R C = 23 R C
//     route      a mixture's routing of the R rows, 8 experts, 2 a row, forward and backward (route_forward_bytes
//                and route_backward_bytes), the router's logits spread so that every expert gets rows; R / T
//                sequences of T rows
// Their time less their launches, over those bytes, is the rate the planner's memory term divides by at (C, R)
// (the profile's memory rows): on a GPU near its memory's bandwidth once R fills it; on the CPU build what its
// emulated warps reach, set by rows and barriers more than by bytes.
void measure_memory(int C, int R, double per_launch) {
    const size_t h = (size_t)4 * C, values = (size_t)R * C;
    const double s = sizeof(floatX);
    floatX *x = device_filled<floatX>(values), *y = device_filled<floatX>(values), *dy = device_filled<floatX>(values);
    floatX *dx = device_filled<floatX>(values), *weight = device_filled<floatX>(C), *bias = device_filled<floatX>(C);
    floatX *dweight = device_filled<floatX>(C), *dbias = device_filled<floatX>(C), *sum = device_filled<floatX>(values);
    floatX *pre = device_filled<floatX>(R * h), *act = device_filled<floatX>(R * h), *dact = device_filled<floatX>(R * h);
    float *mean = device_filled<float>(R), *rstd = device_filled<float>(R);
    float* scratch = device_filled<float>(layernorm_backward_scratch_floats(R, C));
    auto report = [&](const char* kind, double bytes, int launches, const std::function<void()>& run) {
        const double seconds = device_seconds(run);
        printf("memory %s %d %d %.6e %.6e\n", kind, C, R, bytes, std::max(seconds - launches * per_launch, 0.1 * seconds));
        fflush(stdout);
    };
    report("layernorm", 14.0 * values * s, 1 + 1 + 2 * 3, [&] {  // layernorm_backward is 3 launches (kernel, 2 sums)
        layernorm_forward(y, mean, rstd, x, weight, bias, R, C, 0);
        fused_residual_layernorm_forward(sum, y, mean, rstd, x, dx, weight, bias, R, C, 0);
        layernorm_backward(dx, dweight, dbias, scratch, dy, x, weight, mean, rstd, R, C, 0);
        layernorm_backward(dx, dweight, dbias, scratch, dy, x, weight, mean, rstd, R, C, 0);
    });
    report("rmsnorm", 14.0 * values * s, 1 + 1 + 2 * 2, [&] {  // rmsnorm_backward is 2 launches (kernel, 1 sum)
        rmsnorm_forward(y, rstd, x, weight, R, C, 1e-5f, 0);
        fused_residual_rmsnorm_forward(sum, y, rstd, x, dx, weight, R, C, 1e-5f, 0);
        rmsnorm_backward(dx, dweight, scratch, dy, x, weight, rstd, R, C, 0);
        rmsnorm_backward(dx, dweight, scratch, dy, x, weight, rstd, R, C, 0);
    });
    report("pointwise", 23.0 * values * s, 3, [&] {
        gelu_forward(act, pre, R * h, 0);
        gelu_backward(dact, pre, act, R * h, 0);
        residual_forward(y, x, dx, values, 0);
    });

    // the plan's kernels take a sequence a block: the runs' sequences (the CPU build's small models' 64 positions)
#ifdef LLMC_CPU
    const int T = std::min(R, 64);
#else
    const int T = std::min(R, 8192);
#endif
    const MoeShape shape{R / T, T, T, 8, 2, C};
    const int E = shape.E, K = shape.K;
    std::vector<floatX> spread((size_t)R * E);  // logits that send each row's top 2 to different experts by row
    for (size_t i = 0; i < spread.size(); i++) spread[i] = (floatX)(0.05f * (float)((i * 7919) % 61));
    floatX* logits = device_alloc<floatX>(spread.size());
    cudaCheck(cudaMemcpy(logits, spread.data(), spread.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    MoeRouting r;
    r.probs = device_filled<float>((size_t)R * E), r.dprobs = device_filled<float>((size_t)R * E);
    r.lse = device_filled<float>(R), r.weights = device_filled<float>((size_t)R * K);
    r.dweights = device_filled<float>((size_t)R * K), r.experts = device_alloc<int>((size_t)R * K);
    r.slots = device_alloc<int>((size_t)R * K), r.routed_counts = device_alloc<int>((size_t)shape.B * E);
    int* expert_counts = device_alloc<int>(E);
    floatX *permuted = device_filled<floatX>(values * K), *dpermuted = device_filled<floatX>(values * K);
    floatX* dlogits = device_filled<floatX>(spread.size());
    float* loss_sums = device_filled<float>(2);
    // forward: the router, the plan (count, offsets, place), permute, aux loss, combine; backward: the combine's,
    // the permute's, the aux loss's, the router's
    report("route", route_forward_bytes(R, C, E, K, s) + route_backward_bytes(R, C, E, K, s), 10, [&] {
        moe_router_forward(r, logits, shape, 0);
        moe_dispatch_plan(r, expert_counts, shape, 0, 0);
        moe_permute_forward(permuted, x, r, shape, 0);
        moe_aux_loss_forward(loss_sums, loss_sums + 1, r, shape, 0);
        moe_unpermute_forward(y, permuted, r, shape, 0);
        moe_unpermute_backward(dpermuted, dy, permuted, r, shape, 0);
        moe_permute_backward(dx, dpermuted, r, shape, 0);
        moe_aux_loss_backward(r, shape, 1e-3f, 0);
        moe_router_backward(dlogits, r, shape, 1e-3f, 0);
    });
    for (floatX* p : {x, y, dy, dx, weight, bias, dweight, dbias, sum, pre, act, dact, logits, permuted, dpermuted, dlogits})
        cudaCheck(cudaFree(p));
    for (float* p : {mean, rstd, scratch, r.probs, r.dprobs, r.lse, r.weights, r.dweights, loss_sums}) cudaCheck(cudaFree(p));
    for (int* p : {r.experts, r.slots, r.routed_counts, expert_counts}) cudaCheck(cudaFree(p));
}

void measure_copies() {
    const size_t bytes = (size_t)(quick ? 16 : 64) << 20;
    unsigned char* host = nullptr;
    cudaCheck(cudaMallocHost(&host, bytes));
    memset(host, 0x3c, bytes);
    unsigned char* device = device_filled<unsigned char>(bytes);
    const double to_device = device_seconds([&] { copy_to_device(device, host, bytes, 0); });
    const double to_host = device_seconds([&] { copy_to_host(host, device, bytes, 0); });
    printf("copy %.6e %.6e %.6e\n", (double)bytes, to_device, to_host);
    fflush(stdout);
    cudaCheck(cudaFreeHost(host));
    cudaCheck(cudaFree(device));
}

// ----------------------------------------------------------------------------
// the collectives

const char* const kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"};

// One call of collective `op` over `comm` moving `count` elements per block (all_reduce and send_recv: the
// whole buffer); `in` and `out` hold size x count elements.
void run_collective(int op, Communicator& comm, floatX* out, floatX* in, size_t count, cudaStream_t stream) {
    const int g = comm.size, me = comm.rank;
    switch (op) {
        case 0: all_reduce(comm, in, count, Reduction::Sum, stream); break;
        case 1: all_gather(comm, out, in, count, stream); break;
        case 2: reduce_scatter(comm, out, in, count, Reduction::Sum, stream); break;
        case 3: all_to_all(comm, out, in, count, stream); break;
        default: send_recv(comm, in, (me + 1) % g, out, (me + g - 1) % g, count, stream); break;
    }
}

// nccl-tests' n for `count` elements per block: all_reduce and send_recv the buffer; all_gather the gathered
// output, reduce_scatter the input, all_to_all one rank's send buffer: g blocks
size_t collective_bytes(int op, int g, size_t count) {
    return (op == 0 || op == 4 ? 1 : (size_t)g) * count * sizeof(floatX);
}

void measure_collectives(Communicator& world, cudaStream_t stream) {
    const int g = world.size;
    std::vector<size_t> sizes;  // nccl-tests' n, 8 B to 32 MiB in powers of 4 (quick: of 16, to 8 MiB)
    for (size_t n = 8; n <= ((size_t)32 << 20); n *= quick ? 16 : 4) sizes.push_back(n);
    const size_t largest = sizes.back() / sizeof(floatX) + (size_t)g;  // rounding up below adds < g elements
    floatX* in = device_filled<floatX>(largest);
    floatX* out = device_filled<floatX>(largest);
    float* slowest = device_alloc<float>(64);
    for (int op = 0; op < 5; op++)
        for (size_t n : sizes) {
            const size_t blocks = op == 0 || op == 4 ? 1 : (size_t)g;
            const size_t count = std::max<size_t>(1, n / (blocks * sizeof(floatX)));  // at least one element
            auto timed = [&] {
                barrier(world, stream);
                const auto start = std::chrono::steady_clock::now();
                run_collective(op, world, out, in, count, stream);
                cudaCheck(cudaStreamSynchronize(stream));
                return seconds_since(start);
            };
            timed();  // warm-up: the first use of each link waits for its peer (NCCL connects lazily)
            // Every rank must make the same number of calls: they agree on the quickest of three calls on the
            // slowest rank (a call slowed by another process's burst does not set the count). Right after a start
            // or a large call the ranks take some tens of milliseconds to settle (measured here: calls of 8 bytes
            // after 32 MiB ones took 8-20 ms for about 60 ms, then 1 us), so while three calls are quick enough for
            // that to matter (< 0.1 s) and the next three are twice as quick, the three were warm-up.
            std::vector<float> times;
            float quickest_call = INFINITY;
            for (int probe = 0; probe < 4; probe++) {
                std::vector<float> probed;
                for (int i = 0; i < 3; i++) probed.push_back((float)timed());
                float quickest = *std::min_element(probed.begin(), probed.end());
                copy_to_device(slowest, &quickest, 1, stream);
                all_reduce(world, slowest, 1, Reduction::Max, stream);
                copy_to_host(&quickest, slowest, 1, stream);
                const bool settling = quickest < 0.5f * quickest_call;  // (always on the first probe)
                quickest_call = std::min(quickest_call, quickest);
                times = probed;
                if (!settling || quickest > 0.1f) break;
            }
            if (quickest_call < 0.01f) times.clear();  // cheap calls: the probes were warm-up, time afresh
            const int calls = calls_for(quickest_call, quick ? 0.02 : 0.15, quick ? 5 : 7, quick ? 9 : 31);
            while ((int)times.size() < calls) times.push_back((float)timed());
            // each call's time is its slowest rank's
            for (size_t done = 0; done < times.size(); done += 64) {
                const size_t part = std::min<size_t>(64, times.size() - done);
                copy_to_device(slowest, times.data() + done, part, stream);
                all_reduce(world, slowest, part, Reduction::Max, stream);
                copy_to_host(times.data() + done, slowest, part, stream);
            }
            if (world.rank == 0) {
                printf("collective %s %d %zu %.6e\n", kOpNames[op], g, collective_bytes(op, g, count),
                       median(std::vector<double>(times.begin(), times.end())));
                fflush(stdout);
            }
        }
    cudaCheck(cudaFree(in));
    cudaCheck(cudaFree(out));
    cudaCheck(cudaFree(slowest));
}

}  // namespace

int main(int argc, char** argv) {
    const std::string usage = std::string("usage: ") + argv[0] + " compute|collectives [--quick] | matmul M N K";
    std::string what;
    std::vector<int> shape;  // matmul M N K
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (arg == "--quick") quick = true;
        else if ((arg == "compute" || arg == "collectives") && what.empty()) what = arg;
        else if (arg == "matmul" && what.empty()) {
            what = arg;
            for (int j = 0; j < 3; j++) {
                const char* word = i + 1 < argc ? argv[++i] : "";
                char* end = nullptr;
                const long v = strtol(word, &end, 10);
                if (*word == '\0' || *end != '\0' || v < 1 || v > (1 << 20)) {
                    fprintf(stderr, "error: matmul needs M N K, whole numbers 1 .. 1048576, not '%s' (%s)\n", word,
                            usage.c_str());
                    return EXIT_FAILURE;
                }
                shape.push_back((int)v);
            }
        } else {
            fprintf(stderr, "error: unknown argument '%s' (%s)\n", arg.c_str(), usage.c_str());
            return EXIT_FAILURE;
        }
    }
    if (what.empty()) {
        fprintf(stderr, "error: say what to measure (%s)\n", usage.c_str());
        return EXIT_FAILURE;
    }
    if (what == "matmul") {
        matmul_setup();
        measure_matmuls(shape);
        matmul_teardown();
        return EXIT_SUCCESS;
    }
    if (what == "compute") {
        printf("# calibrate: %s, %s\n", PRECISION_NAME, device_properties().name);
        matmul_setup();
        measure_matmuls({});
        measure_attention();
        const double per_launch = measure_launch();
        measure_stream();
        // the widths and rows the runs have: the CPU build's small models' microbatches; a GPU's blocks
#ifdef LLMC_CPU
        const std::vector<int> widths = quick ? std::vector<int>{128, 256} : std::vector<int>{128, 256, 512};
        const std::vector<int> rows = quick ? std::vector<int>{128, 1024} : std::vector<int>{128, 256, 512, 1024};
#else
        const std::vector<int> widths = {1024, 4096, 8192};
        const std::vector<int> rows = {2048, 8192, 32768};
#endif
        for (int C : widths)
            for (int R : rows) measure_memory(C, R, per_launch);
        measure_copies();
        matmul_teardown();
        return EXIT_SUCCESS;
    }
    Communicator world = comm_init_world();
    cudaStream_t stream;
    cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    measure_collectives(world, stream);
    cudaCheck(cudaStreamDestroy(stream));
    comm_destroy(world);
    comm_finalize();
    return EXIT_SUCCESS;
}
