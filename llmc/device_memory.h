/*
Device memory as the program holds it: every device buffer is booked by category.

Accounting. Every device buffer is allocated through tracked_alloc with the category it belongs to, and
released through tracked_free; the totals say, per category, how many bytes are held now and the most
ever held, plus the most ever held in all categories together (the number that has to fit on the GPU):
    floatX* params = tracked_alloc<floatX>(count, MemoryKind::Parameters);
    ...
    tracked_free(params);
    print_memory_totals(memory_totals());        // a table; memory_totals_line(...) gives one line
The per-category peaks need not have happened at the same moment, so they can add up to more than the
overall peak. tracked_free(nullptr) does nothing, as cudaFree does; freeing a pointer tracked_alloc did
not hand out (or freeing it twice) stops the program with one error line. So does an allocation the device
cannot hold: the line names the category (and the buffer, given a label as third argument), the size asked
for and the device's free and total memory, so the user knows which flag to lower. A mutex guards the
books, so any thread may allocate.

Pinned host memory that stands in for device memory (offload: llmc/parallel/zero.h's optimizer state, the
offloaded blocks' records) is booked the same way in books of its own, by tracked_host_alloc (cudaMallocHost)
and the same tracked_free; host_memory_totals() reads them. Staging and read-back buffers of a few bytes are
not booked.

What a run will need, by formula, is llmc/planning/memory.h's; train_gpt prints the two side by side.
*/
#pragma once

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include "cuda_common.cuh"
#include "utils.h"

// ----------------------------------------------------------------------------
// accounting

// Activations: what the forward pass keeps for the backward pass (llmc/parallel/recompute.h decides how much), and
// the model-level buffers (embeddings' output, logits, ...). Workspace: the buffers every layer reuses in
// turn, the recomputation's records among them.
enum class MemoryKind { Parameters, Gradients, OptimizerState, Activations, Workspace, Communication, Other };
constexpr int kNumMemoryKinds = 7;

inline const char* memory_kind_name(MemoryKind kind) {
    static const char* names[kNumMemoryKinds] = {"parameters", "gradients", "optimizer state",
                                                 "activations", "workspace", "communication", "other"};
    return names[(int)kind];
}

struct MemoryTotals {
    size_t current[kNumMemoryKinds] = {};  // bytes held now, per MemoryKind
    size_t peak[kNumMemoryKinds] = {};     // the most each kind ever held
    size_t current_total = 0;
    size_t peak_total = 0;                 // the most held in all kinds together at one moment
};

struct MemoryBooks {
    std::mutex mutex;
    MemoryTotals totals;       // device memory
    MemoryTotals host_totals;  // pinned host memory
    struct Entry { size_t bytes; MemoryKind kind; bool host; };
    std::unordered_map<void*, Entry> allocations;
};
inline MemoryBooks& memory_books() {
    static MemoryBooks books;
    return books;
}

// Stops with one line saying what could not be allocated, how much was asked for and how much the device
// has: the plain "out of memory" of cudaCheck leaves a user guessing which flag to lower.
//   error: cannot allocate 196.50 GiB of device memory for activations (logits): 23.10 GiB free of 24.00 GiB
//          (this program holds 1.20 GiB)
[[noreturn]] inline void memory_allocation_failed(size_t count, size_t element_size, MemoryKind kind, const char* what,
                                                  cudaError_t error);

inline void memory_book(void* pointer, size_t bytes, MemoryKind kind, bool host) {
    MemoryBooks& books = memory_books();
    std::lock_guard<std::mutex> lock(books.mutex);
    books.allocations[pointer] = MemoryBooks::Entry{bytes, kind, host};
    MemoryTotals& t = host ? books.host_totals : books.totals;
    const int k = (int)kind;
    t.current[k] += bytes;
    t.peak[k] = std::max(t.peak[k], t.current[k]);
    t.current_total += bytes;
    t.peak_total = std::max(t.peak_total, t.current_total);
}

// count elements of T in device memory, charged to `kind`; `what` (optional) names the buffer in the error
// line when the device cannot hold it. A zero count gives nullptr and charges nothing.
template <class T>
T* tracked_alloc(size_t count, MemoryKind kind, const char* what = nullptr) {
    if (count == 0) return nullptr;
    if (count > SIZE_MAX / sizeof(T)) memory_allocation_failed(count, sizeof(T), kind, what, cudaErrorMemoryAllocation);
    const size_t bytes = count * sizeof(T);
    T* pointer = nullptr;
    const cudaError_t error = cudaMalloc(&pointer, bytes);
    if (error != cudaSuccess) memory_allocation_failed(count, sizeof(T), kind, what, error);
    memory_book((void*)pointer, bytes, kind, /*host=*/false);
    return pointer;
}

// count elements of T in pinned host memory, charged to `kind` in the host books
template <class T>
T* tracked_host_alloc(size_t count, MemoryKind kind, const char* what = nullptr) {
    if (count == 0) return nullptr;
    if (count > SIZE_MAX / sizeof(T)) fatal("cannot allocate %zu elements of host memory for %s", count, memory_kind_name(kind));
    T* pointer = nullptr;
    const cudaError_t error = cudaMallocHost(&pointer, count * sizeof(T));
    if (error != cudaSuccess)
        fatal("cannot allocate %.2f GiB of pinned host memory for %s%s%s: %s", (double)count * sizeof(T) / (1 << 30),
              memory_kind_name(kind), what ? " " : "", what ? what : "", cudaGetErrorString(error));
    memory_book((void*)pointer, count * sizeof(T), kind, /*host=*/true);
    return pointer;
}

inline void tracked_free(void* pointer) {
    if (pointer == nullptr) return;
    MemoryBooks::Entry entry{};
    {
        MemoryBooks& books = memory_books();
        std::lock_guard<std::mutex> lock(books.mutex);
        auto found = books.allocations.find(pointer);
        if (found == books.allocations.end())
            fatal("tracked_free: %p was not allocated by tracked_alloc (or was already freed)", pointer);
        entry = found->second;
        books.allocations.erase(found);
        MemoryTotals& t = entry.host ? books.host_totals : books.totals;
        t.current[(int)entry.kind] -= entry.bytes;
        t.current_total -= entry.bytes;
    }
    if (entry.host) cudaCheck(cudaFreeHost(pointer));
    else cudaCheck(cudaFree(pointer));
}

inline MemoryTotals memory_totals() {
    MemoryBooks& books = memory_books();
    std::lock_guard<std::mutex> lock(books.mutex);
    return books.totals;
}
inline MemoryTotals host_memory_totals() {
    MemoryBooks& books = memory_books();
    std::lock_guard<std::mutex> lock(books.mutex);
    return books.host_totals;
}

// "12.0 MiB": bytes in binary units, three significant digits or so
// A count with its thousands grouped: 405853388800 -> "405,853,388,800".
inline std::string format_count(double count) {
    std::string digits = std::to_string((long long)std::llround(count)), grouped;
    const size_t first = digits[0] == '-' ? 1 : 0;
    for (size_t i = 0; i < digits.size(); i++) {
        if (i > first && (digits.size() - i) % 3 == 0) grouped += ',';
        grouped += digits[i];
    }
    return grouped;
}

inline std::string format_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    while (bytes >= 1024.0 && unit < 4) { bytes /= 1024.0; unit++; }
    char text[32];
    snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
    return text;
}

inline void memory_allocation_failed(size_t count, size_t element_size, MemoryKind kind, const char* what,
                                     cudaError_t error) {
    (void)cudaGetLastError();  // the failed cudaMalloc is the last error; clear it so the query below works
    const std::string label = what ? std::string(" (") + what + ")" : "";
    const std::string asked = format_bytes((double)count * (double)element_size);  // double: no overflow
    std::string device = "the free memory is unknown";
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
        device = format_bytes((double)free_bytes) + " free of " + format_bytes((double)total_bytes);
    // out of memory is the expected failure; anything else is named as the runtime names it
    const std::string reason =
        error == cudaErrorMemoryAllocation ? "" : std::string(" (cudaMalloc: ") + cudaGetErrorString(error) + ")";
    fatal("cannot allocate %s of device memory for %s%s: %s (this program holds %s)%s", asked.c_str(),
          memory_kind_name(kind), label.c_str(), device.c_str(),
          format_bytes((double)memory_totals().current_total).c_str(), reason.c_str());
}

// "device memory 1.52 GiB (peak 1.60 GiB): parameters 237 MiB, gradients ..." (kinds holding nothing now
// are left out)
inline std::string memory_totals_line(const MemoryTotals& t) {
    std::string line = "device memory " + format_bytes((double)t.current_total) + " (peak " +
                       format_bytes((double)t.peak_total) + ")";
    const char* separator = ": ";
    for (int k = 0; k < kNumMemoryKinds; k++) {
        if (t.current[k] == 0) continue;
        line += separator + std::string(memory_kind_name((MemoryKind)k)) + " " + format_bytes((double)t.current[k]);
        separator = ", ";
    }
    return line;
}

inline void print_memory_totals(const MemoryTotals& t, FILE* out = stdout) {
    fprintf(out, "%-16s %14s %14s\n", "device memory", "now", "peak");
    for (int k = 0; k < kNumMemoryKinds; k++)
        fprintf(out, "%-16s %14s %14s\n", memory_kind_name((MemoryKind)k), format_bytes((double)t.current[k]).c_str(),
                format_bytes((double)t.peak[k]).c_str());
    fprintf(out, "%-16s %14s %14s\n", "total", format_bytes((double)t.current_total).c_str(),
            format_bytes((double)t.peak_total).c_str());
}

