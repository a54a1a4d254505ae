/*
The part of the CUDA runtime API the project uses, for the CPU device.

"Device memory" is host memory. Every cudaMalloc is an allocation of exactly the size asked for, so that
AddressSanitizer reports a kernel that reads or writes one element past a buffer (a GPU would silently
read a neighbour's memory). Kernels run to completion inside launch(), so streams and events are ordered
trivially: a stream is a name, synchronising does nothing, and an event records the wall clock so that
benchmarks time the CPU the same way they time the GPU.
*/
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <omp.h>
#include <unistd.h>

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidDevice = 101,
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

struct CUstream_st {};
struct CUevent_st { std::chrono::steady_clock::time_point time; };
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

}  // namespace cudacpu

inline const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
    }
    return "unknown error";
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }

inline cudaError_t cudaGetDeviceCount(int* count) { *count = 1; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
inline cudaError_t cudaGetDevice(int* device) { *device = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* props, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    memset(props, 0, sizeof(*props));
    snprintf(props->name, sizeof(props->name), "CPU (CUDA emulated on %d OpenMP threads)", omp_get_max_threads());
    props->totalGlobalMem = cudacpu::physical_memory_bytes();
    props->sharedMemPerBlock = 48 * 1024;
    props->sharedMemPerBlockOptin = 227 * 1024;
    props->warpSize = 32;
    props->maxThreadsPerBlock = 1024;
    props->multiProcessorCount = omp_get_max_threads();  // one "SM" per OS thread that runs blocks
    props->major = 8;
    props->minor = 0;
    return cudaSuccess;
}

inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = cudacpu::physical_memory_bytes();
    *free_bytes = (size_t)sysconf(_SC_AVPHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    return cudaSuccess;
}

// Aligned to 256 bytes, as the CUDA runtime guarantees: code that looks at alignment (the matmul plans'
// keys, 128-bit loads) sees the same addresses modulo 256 on both devices.
template <class T>
cudaError_t cudaMalloc(T** pointer, size_t bytes) {
    void* memory = nullptr;
    if (posix_memalign(&memory, 256, bytes > 0 ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
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
    *pointer = static_cast<T*>(malloc(bytes > 0 ? bytes : 1));
    return *pointer ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* pointer) { free(pointer); return cudaSuccess; }

inline cudaError_t cudaFree(void* pointer) {
    if (!pointer) return cudaSuccess;
    cudacpu::Allocations& a = cudacpu::allocations();
    std::lock_guard<std::mutex> guard(a.lock);
    auto found = a.sizes.find(pointer);
    if (found == a.sizes.end()) return cudaErrorInvalidDevicePointer;
    a.in_use -= found->second;
    a.sizes.erase(found);
    free(pointer);
    return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* target, const void* source, size_t bytes, cudaMemcpyKind) {
    if (bytes) memmove(target, source, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* target, const void* source, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
    return cudaMemcpy(target, source, bytes, kind);
}
inline cudaError_t cudaMemset(void* target, int value, size_t bytes) {
    if (bytes) memset(target, value, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* target, int value, size_t bytes, cudaStream_t = nullptr) {
    return cudaMemset(target, value, bytes);
}

inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { *stream = new CUstream_st; return cudaSuccess; }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) { delete stream; return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }

inline cudaError_t cudaEventCreate(cudaEvent_t* event) { *event = new CUevent_st; return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) { delete event; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
    event->time = std::chrono::steady_clock::now();
    return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    *ms = std::chrono::duration<float, std::milli>(stop->time - start->time).count();
    return cudaSuccess;
}
