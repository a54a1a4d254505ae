/*
The kernel lab's harness: random inputs, poisoned outputs, comparison with a double-precision reference,
and timing. Each op family has a file dev/lab/lab_<family>.cuh with one function that runs its checks (and,
with --bench, its benchmarks); dev/lab/kernel_lab.cu calls them all and prints `N passed, M failed`.

How a check goes:
  1. make fresh random inputs on the host (never zeros, a new seed per check),
  2. round them to floatX (so the reference sees exactly the values the kernel sees) and upload them,
  3. poison every output buffer (all bits set: NaN in fp32 and in bf16), so an element the kernel forgets
     to write can never pass by accident,
  4. run the kernel, download, and compare against a plain C++ loop that accumulates in double.
A result passes when |got - ref| <= atol + rtol * |ref| for every element (and got is finite).
*/
#pragma once

#include <vector>
#include <algorithm>
#include <string>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>
#include "../../llmc/cuda_common.cuh"

constexpr bool kBF16 = sizeof(floatX) == 2;

// one of two tolerances, by the build's precision
inline double by_precision(double fp32_value, double bf16_value) { return kBF16 ? bf16_value : fp32_value; }

// the build under AddressSanitizer (kernel_lab_cpu_asan): it looks for memory errors, which need every kernel path
// but not the large shapes that other runs of the lab check results at; a family may shrink such a shape there
#ifdef __SANITIZE_ADDRESS__
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

struct LabState {
    int passed = 0;
    int failed = 0;
    bool bench = false;        // --bench: also time each kernel at GPT-2 124M shapes
    std::string only;          // --only NAME: run the families whose name contains NAME
    std::string skip;          // --skip NAME: leave out the family named exactly NAME
    uint64_t seed = 1337;      // advanced for every random array, so inputs are fresh everywhere
    bool quiet = false;        // print failed checks only (suites with thousands of checks)
};
inline LabState lab;

// ----------------------------------------------------------------------------
// random inputs

inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// uniform in [lo, hi], with exact zeros nudged away (a zero input hides bugs such as a missing term)
inline std::vector<float> random_floats(size_t count, float lo = -1.0f, float hi = 1.0f) {
    uint64_t state = lab.seed++ * 0x2545f4914f6cdd1dull;
    std::vector<float> values(count);
    for (size_t i = 0; i < count; i++) {
        double unit = (splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
        float v = (float)(lo + (hi - lo) * unit);
        if (v == 0.0f) v = 1e-3f;
        values[i] = v;
    }
    return values;
}

inline std::vector<int> random_ints(size_t count, int lo, int hi_exclusive) {
    uint64_t state = lab.seed++ * 0x2545f4914f6cdd1dull;
    std::vector<int> values(count);
    for (size_t i = 0; i < count; i++) values[i] = lo + (int)(splitmix64(state) % (uint64_t)(hi_exclusive - lo));
    return values;
}

// the values as the kernel will see them: rounded to floatX
inline std::vector<float> round_to_floatX(std::vector<float> values) {
    for (float& v : values) v = (float)(floatX)v;
    return values;
}

// ----------------------------------------------------------------------------
// device buffers

template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t count = 0;

    explicit DeviceBuffer(size_t n) : count(n) { cudaCheck(cudaMalloc(&ptr, n * sizeof(T))); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaCheck(cudaFree(ptr)); }

    // upload host values, converting each to T
    template <class Source>
    void upload(const std::vector<Source>& values) {
        std::vector<T> converted(count);
        for (size_t i = 0; i < count; i++) converted[i] = (T)values[i];
        cudaCheck(cudaMemcpy(ptr, converted.data(), count * sizeof(T), cudaMemcpyHostToDevice));
    }
    // download, converting each element to float
    std::vector<float> download() const {
        std::vector<T> raw(count);
        cudaCheck(cudaMemcpy(raw.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        std::vector<float> values(count);
        for (size_t i = 0; i < count; i++) values[i] = (float)raw[i];
        return values;
    }
    // all bits set: NaN as fp32 and as bf16, -1 as an integer
    void poison() { cudaCheck(cudaMemset(ptr, 0xff, count * sizeof(T))); }
    void zero() { cudaCheck(cudaMemset(ptr, 0, count * sizeof(T))); }
};

// ----------------------------------------------------------------------------
// comparison

// Compares every element; prints one line with the worst error and the tolerance; counts the result.
// `allowance`, when given, adds a tolerance of its own to each element (an error bound that depends on
// more than |ref|, e.g. on the sizes of the terms that were summed).
inline bool check_close(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                        double atol, double rtol, const std::vector<double>& allowance = {}) {
    if (got.size() != ref.size() || got.empty() || (!allowance.empty() && allowance.size() != got.size())) {
        printf("  FAIL %-48s size %zu, expected %zu\n", name.c_str(), got.size(), ref.size());
        lab.failed++;
        return false;
    }
    // the worst element is the one that comes closest to (or goes furthest past) its allowed error
    size_t worst = 0, bad = 0;
    double worst_excess = -INFINITY;
    for (size_t i = 0; i < got.size(); i++) {
        double diff = std::isfinite(got[i]) ? std::fabs((double)got[i] - ref[i]) : INFINITY;
        double excess = diff - (atol + rtol * std::fabs(ref[i]) + (allowance.empty() ? 0.0 : allowance[i]));
        if (excess > 0) bad++;
        if (excess > worst_excess) { worst_excess = excess; worst = i; }
    }
    double diff = std::fabs((double)got[worst] - ref[worst]);
    bool ok = bad == 0;
    (ok ? lab.passed : lab.failed)++;
    if (ok && lab.quiet) return true;
    printf("  %s %-48s worst |err| %.3e (rel %.2e) at %zu: got %.6g ref %.6g   tol %.0e + %.0e*|ref|",
           ok ? "ok  " : "FAIL", name.c_str(), diff, diff / std::max(std::fabs(ref[worst]), 1e-30), worst,
           (double)got[worst], ref[worst], atol, rtol);
    if (!allowance.empty()) printf(" + %.1e", allowance[worst]);
    if (!ok) printf("   (%zu of %zu elements out of tolerance)", bad, got.size());
    printf("\n");
    return ok;
}

// A yes/no check that is not a numerical comparison (e.g. "two runs gave the same bits").
inline bool check_true(const std::string& name, bool condition, const std::string& detail = "") {
    (condition ? lab.passed : lab.failed)++;
    if (condition && lab.quiet) return true;
    printf("  %s %-48s %s\n", condition ? "ok  " : "FAIL", name.c_str(), detail.c_str());
    return condition;
}

// Whether `text` holds `part` (a message checked for the words that name its problem).
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A check_true's detail for a number against the value worked out for it.
inline std::string describe(double got, double want) {
    char text[128];
    snprintf(text, sizeof(text), "got %.12g, expected %.12g", got, want);
    return text;
}

// The closing line every suite prints, `N passed, M failed`, which scripts/test/run_tests.sh adds up; returns the
// suite's exit status (non-zero when a check failed).
inline int lab_closing_line() {
    printf("%d passed, %d failed\n", lab.passed, lab.failed);
    return lab.failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

// ----------------------------------------------------------------------------
// bad input must stop the program with one line: such cases run in a forked child

// Runs `body` in a child process; returns its exit status (128 + signal number when it was killed) and
// everything it printed on stdout and stderr.
// A child that stops on bad input exits on purpose with the parent's allocations still held (and, once the
// CPU device's threads exist, with threads fork did not copy): LeakSanitizer would report them as leaks and
// add lines to the one line under test. It asks this hook at exit; only children answer "off".
inline bool lab_in_failing_child = false;
#ifdef __SANITIZE_ADDRESS__
extern "C" int __lsan_is_turned_off() { return lab_in_failing_child ? 1 : 0; }
#endif

inline std::pair<int, std::string> run_in_child(const std::function<void()>& body) {
    int pipe_ends[2];
    if (pipe(pipe_ends) != 0) return {-1, "pipe failed"};
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    if (child == 0) {
        lab_in_failing_child = true;
        dup2(pipe_ends[1], 1);
        dup2(pipe_ends[1], 2);
        close(pipe_ends[0]);
        body();
        fflush(stdout);
        _exit(0);
    }
    close(pipe_ends[1]);
    std::string output;
    char chunk[512];
    ssize_t got;
    while ((got = read(pipe_ends[0], chunk, sizeof(chunk))) > 0) output.append(chunk, got);
    close(pipe_ends[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

// Whether `body` fails the way bad input must: a non-zero exit that is not a crash, and exactly one line of
// output, "error: ...", containing `must_contain`. `report` receives "exit N: <the line>".
inline bool fails_with_one_error_line(const std::function<void()>& body, const std::string& must_contain,
                                      std::string* report) {
    auto [status, message] = run_in_child(body);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    *report = "exit " + std::to_string(status) + ": " + message;
    return status != 0 && status < 128 && message.rfind("error: ", 0) == 0 &&
           message.find('\n') == std::string::npos && message.find(must_contain) != std::string::npos;
}

inline void expect_failure(const std::string& name, const std::function<void()>& body, const std::string& must_contain) {
    std::string report;
    const bool ok = fails_with_one_error_line(body, must_contain, &report);
    check_true(name, ok, report);
}

inline std::vector<double> to_double(const std::vector<float>& values) {
    return std::vector<double>(values.begin(), values.end());
}

// ----------------------------------------------------------------------------
// benchmarking: median-free and simple: warm up once, then average over `repeats` runs timed with events
// (CUDA events on a GPU; wall clock on the CPU device).

inline double time_ms(const std::function<void()>& run, int repeats = 10) {
    run();
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start, 0));
    for (int i = 0; i < repeats; i++) run();
    cudaCheck(cudaEventRecord(stop, 0));
    cudaCheck(cudaEventSynchronize(stop));
    float elapsed = 0.0f;
    cudaCheck(cudaEventElapsedTime(&elapsed, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return elapsed / repeats;
}

// prints one benchmark line; pass bytes moved and/or flops done by one run (0 when not meaningful)
inline void report_bench(const std::string& name, double ms, double bytes, double flops) {
    printf("  bench %-44s %9.3f ms", name.c_str(), ms);
    if (bytes > 0) printf("  %8.1f GB/s", bytes / (ms * 1e-3) / 1e9);
    if (flops > 0) printf("  %8.2f TFLOP/s", flops / (ms * 1e-3) / 1e12);
    printf("\n");
}

inline bool family_selected(const char* family) {
    bool selected = (lab.only.empty() || std::string(family).find(lab.only) != std::string::npos) &&
                    lab.skip != family;
    if (selected) printf("%s\n", family);
    return selected;
}
