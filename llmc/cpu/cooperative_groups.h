/*
The subset of cooperative_groups the project uses, for the CPU build: the block, tiles of a warp
(tiled_partition<N>, N a power of two up to 32) and reduce() over a tile with plus, greater or less.
A tile's operations are the warp operations of device.h restricted to the tile's lanes.
*/
#pragma once

namespace cooperative_groups {

struct thread_block {
    void sync() const { __syncthreads(); }
    unsigned thread_rank() const { return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x; }
    unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
    unsigned num_threads() const { return size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    dim3 group_dim() const { return blockDim; }
};
inline thread_block this_thread_block() { return thread_block{}; }

template <unsigned Size>
struct thread_block_tile {
    static_assert(Size >= 1 && Size <= 32 && (Size & (Size - 1)) == 0, "tile size must be a power of two <= 32");
    unsigned linear_rank;  // rank in the block

    unsigned thread_rank() const { return linear_rank % Size; }
    unsigned size() const { return Size; }
    unsigned num_threads() const { return Size; }
    unsigned meta_group_rank() const { return linear_rank / Size; }
    unsigned meta_group_size() const { return (this_thread_block().size() + Size - 1) / Size; }
    unsigned lanes() const {  // this tile's lanes as a warp mask
        unsigned bits = Size == 32 ? 0xffffffffu : (1u << Size) - 1;
        return bits << (linear_rank % 32 / Size * Size);
    }
    void sync(const char* file = __builtin_FILE(), int line = __builtin_LINE()) const { __syncwarp(lanes(), file, line); }
    template <class T>
    T shfl(T value, int source, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __shfl_sync(lanes(), value, source, Size, file, line);
    }
    template <class T>
    T shfl_xor(T value, int lane_mask, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __shfl_xor_sync(lanes(), value, lane_mask, Size, file, line);
    }
    template <class T>
    T shfl_down(T value, unsigned delta, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __shfl_down_sync(lanes(), value, delta, Size, file, line);
    }
    template <class T>
    T shfl_up(T value, unsigned delta, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __shfl_up_sync(lanes(), value, delta, Size, file, line);
    }
    unsigned ballot(int predicate, const char* file = __builtin_FILE(), int line = __builtin_LINE()) const {
        return __ballot_sync(lanes(), predicate, file, line) >> (linear_rank % 32 / Size * Size);
    }
    bool any(int predicate) const { return ballot(predicate) != 0; }
    bool all(int predicate) const { return ballot(predicate) == (Size == 32 ? 0xffffffffu : (1u << Size) - 1); }
};

template <unsigned Size>
thread_block_tile<Size> tiled_partition(const thread_block& block) {
    return thread_block_tile<Size>{block.thread_rank()};
}

template <class T> struct plus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct greater { T operator()(T a, T b) const { return a > b ? a : b; } };
template <class T> struct less { T operator()(T a, T b) const { return a < b ? a : b; } };

// butterfly reduction: after log2(Size) exchanges every lane of the tile holds the result
template <unsigned Size, class T, class Op>
T reduce(const thread_block_tile<Size>& tile, T value, Op op) {
    for (unsigned offset = Size / 2; offset > 0; offset /= 2) value = op(value, tile.shfl_xor(value, offset));
    return value;
}

}  // namespace cooperative_groups
