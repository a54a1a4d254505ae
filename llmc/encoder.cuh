/*
The encoder: the first activation of the residual stream is the sum of a token embedding and a position
embedding,
    out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
and its backward pass sends the gradient of that activation back to both tables:
    dwte[v, :] += sum over all (b, t) with tokens[b, t] == v of dout[b, t, :]
    dwpe[t, :] += sum over b of dout[b, t, :]

What each launcher does with its outputs:
    encoder_forward   out: overwritten
    encoder_backward  dwte, dwpe: ACCUMULATED (+=); rows of dwte whose token does not occur, and rows of
                      dwpe at positions >= T, are left as they were.

Determinism. Many positions share a token (think of "the", or the end-of-text token), so a kernel that
lets every position add its row into dwte with atomics would add in whatever order the hardware picks,
and float addition is not associative: different bits on every run. Instead the positions are grouped
by token before anything runs on the device:
  - the host, which has the token ids anyway (the data loader reads them there), sorts the B*T positions
    by (token, position) and cuts the sorted list into buckets, one per distinct token;
  - it uploads the list and a (token, first, count) triple per bucket;
  - on the device one warp takes one bucket and adds its positions' rows in list order.
Each row of dwte is then written by exactly one warp, in a fixed order: the same bits on every run and on
every GPU. dwpe needs no grouping: one thread sums the B rows of one position chunk in order of b.

The upload goes through a pinned host buffer, so the copy is asynchronous on the GPU. The host must not
refill that buffer while the previous call's copy may still be reading it, so each call records an event
after its copy and the next call waits for that event first (by then it has long completed: one call is
made per training step).

Constraints: C % x128::size == 0 (8 in BF16, 4 in FP32). Token ids must lie in [0, V): the kernels
index wte with them unchecked (the data loader validates them). Calls sharing one workspace must use
the same stream, which orders each call's upload after the previous call's kernel has read it.
*/
#pragma once

#include <vector>
#include <algorithm>
#include "cuda_common.cuh"

// ----------------------------------------------------------------------------
// kernels

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], a grid-stride loop over 16-byte chunks of out
__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B,
                                       int T, int C) {
    const size_t total = (size_t)B * T * C;
    const GridStride chunks = grid_stride(total / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const size_t bt = i / C;  // a chunk never straddles two rows, since C % x128::size == 0
        const int c = (int)(i % C);
        const int t = (int)(bt % T);
        const x128 token_part = load128(wte + (size_t)tokens[bt] * C + c);
        const x128 position_part = load128(wpe + (size_t)t * C + c);
        x128 result;
        for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)token_part[k] + (float)position_part[k]);
        store128(out + i, result);
    }
}

// dwpe[t, :] += sum_b dout[b, t, :]; each thread owns 16-byte chunks of dwpe and sums over b in order
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t per_sequence = (size_t)T * C;
    const GridStride chunks = grid_stride(per_sequence / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        float sum[x128::size] = {};
        for (int b = 0; b < B; b++) {
            const x128 g = load128cs(dout + b * per_sequence + i);
            for (int k = 0; k < x128::size; k++) sum[k] += (float)g[k];
        }
        const x128 previous = load128(dwpe + i);
        x128 result;
        for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)previous[k] + sum[k]);
        store128(dwpe + i, result);
    }
}

// dwte[token, :] += the rows of dout at the bucket's positions, one warp per bucket.
// buckets[3*j .. 3*j+2] = (token, first, count): the bucket's positions (b*T + t) are
// positions[first .. first+count), in increasing order.
__global__ void encoder_backward_wte_kernel(floatX* dwte, const int* buckets, const int* positions, int num_buckets,
                                            const floatX* dout, int C) {
    const int warps_per_block = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int j = blockIdx.x * warps_per_block + threadIdx.x / 32; j < num_buckets; j += gridDim.x * warps_per_block) {
        const int token = buckets[3 * j];
        const int first = buckets[3 * j + 1];
        const int count = buckets[3 * j + 2];
        for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
            float sum[x128::size] = {};
            for (int p = first; p < first + count; p++) {
                const x128 g = load128(dout + (size_t)positions[p] * C + c);
                for (int k = 0; k < x128::size; k++) sum[k] += (float)g[k];
            }
            floatX* target = dwte + (size_t)token * C + c;
            const x128 previous = load128(target);
            x128 result;
            for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)previous[k] + sum[k]);
            store128(target, result);
        }
    }
}

// ----------------------------------------------------------------------------
// launchers

inline void encoder_check_width(const char* caller, int C) {
    if (C <= 0 || C % x128::size != 0) {
        fprintf(stderr, "error: %s: C = %d must be a positive multiple of %d (16 bytes of %s)\n", caller, C,
                x128::size, PRECISION_NAME);
        exit(EXIT_FAILURE);
    }
}

void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T, int C,
                     cudaStream_t stream) {
    encoder_check_width("encoder_forward", C);
    const int block_size = 256;
    const int grid = grid_size_for((size_t)B * T * C / x128::size, block_size);
    launch(encoder_forward_kernel, grid, block_size, 0, stream, out, tokens, wte, wpe, B, T, C);
}

// What encoder_backward needs besides the tensors: room for the bucket lists of up to `max_positions`
// (= B*T) token positions, on the device and in pinned host memory. Sizes, in ints:
//   positions: max_positions (every position appears once)
//   buckets:   3 * max_positions (at most one bucket per position, when no token repeats)
struct EncoderBackwardWorkspace {
    int max_positions = 0;
    int* device = nullptr;          // 4 * max_positions ints: positions, then bucket triples
    int* host_staging = nullptr;    // the same layout, pinned, filled by the host before each upload
    cudaEvent_t staging_uploaded = nullptr;  // recorded after each upload
    std::vector<uint64_t> sort_keys;        // (token << 32 | position), reused between calls
};

inline void encoder_backward_workspace_create(EncoderBackwardWorkspace* workspace, int max_positions) {
    workspace->max_positions = max_positions;
    cudaCheck(cudaMalloc(&workspace->device, (size_t)4 * max_positions * sizeof(int)));
    cudaCheck(cudaMallocHost(&workspace->host_staging, (size_t)4 * max_positions * sizeof(int)));
    // an event never recorded counts as complete, so the first call does not wait
    cudaCheck(cudaEventCreateWithFlags(&workspace->staging_uploaded, cudaEventDisableTiming));
    workspace->sort_keys.resize(max_positions);
}

inline void encoder_backward_workspace_free(EncoderBackwardWorkspace* workspace) {
    cudaCheck(cudaFree(workspace->device));
    cudaCheck(cudaFreeHost(workspace->host_staging));
    cudaCheck(cudaEventDestroy(workspace->staging_uploaded));
    *workspace = EncoderBackwardWorkspace{};
}

// tokens_host: the same B*T token ids the forward pass read from device memory
void encoder_backward(floatX* dwte, floatX* dwpe, EncoderBackwardWorkspace* workspace, const floatX* dout,
                      const int* tokens_host, int B, int T, int C, cudaStream_t stream) {
    encoder_check_width("encoder_backward", C);
    const int num_positions = B * T;
    if (num_positions > workspace->max_positions) {
        fprintf(stderr, "error: encoder_backward: B*T = %d exceeds the workspace's %d positions\n", num_positions,
                workspace->max_positions);
        exit(EXIT_FAILURE);
    }

    // dwpe first: it needs no host work, so the device starts on it while the host sorts
    const int block_size = 256;
    launch(encoder_backward_wpe_kernel, grid_size_for((size_t)T * C / x128::size, block_size), block_size, 0, stream,
           dwpe, dout, B, T, C);

    // group positions by token: sort (token, position) pairs, then cut at every change of token
    std::vector<uint64_t>& keys = workspace->sort_keys;
    for (int p = 0; p < num_positions; p++) {
        if (tokens_host[p] < 0) {
            fprintf(stderr, "error: encoder_backward: negative token id %d at position %d\n", tokens_host[p], p);
            exit(EXIT_FAILURE);
        }
        keys[p] = ((uint64_t)tokens_host[p] << 32) | (uint32_t)p;
    }
    std::sort(keys.begin(), keys.begin() + num_positions);

    // the previous call's upload must have finished reading host_staging before we overwrite it
    cudaCheck(cudaEventSynchronize(workspace->staging_uploaded));
    int* positions = workspace->host_staging;
    int* buckets = workspace->host_staging + num_positions;
    int num_buckets = 0;
    for (int i = 0; i < num_positions; i++) {
        const int token = (int)(keys[i] >> 32);
        positions[i] = (int)(keys[i] & 0xffffffffu);
        if (i == 0 || token != (int)(keys[i - 1] >> 32)) {
            buckets[3 * num_buckets] = token;
            buckets[3 * num_buckets + 1] = i;
            buckets[3 * num_buckets + 2] = 0;
            num_buckets++;
        }
        buckets[3 * (num_buckets - 1) + 2]++;
    }
    const size_t upload_ints = (size_t)num_positions + 3 * (size_t)num_buckets;
    cudaCheck(cudaMemcpyAsync(workspace->device, workspace->host_staging, upload_ints * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(workspace->staging_uploaded, stream));

    const int warps_per_block = 4;
    launch(encoder_backward_wte_kernel, grid_size_for(num_buckets, warps_per_block), warps_per_block * 32, 0, stream,
           dwte, workspace->device + num_positions, workspace->device, num_buckets, dout, C);
}
