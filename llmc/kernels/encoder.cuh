/*
The encoder: the first activation of the residual stream is the sum of a token embedding and a position
embedding,
    out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
and its backward pass sends the gradient of that activation back to both tables:
    dwte[v, :] += sum over all (b, t) with tokens[b, t] == v of dout[b, t, :]
    dwpe[t, :] += sum over b of dout[b, t, :]

What each launcher does with its outputs:
    encoder_forward             out: overwritten
    embedding_lookup_forward    out: overwritten (rows of tokens outside the slice with zeros)
    position_embedding_forward  out: ACCUMULATED (+= wpe)
    encoder_backward            dwte, dwpe: ACCUMULATED (+=); rows of dwte whose token does not occur, and
                                rows of dwpe at positions >= T, are left as they were.

Under tensor parallelism each rank holds a slice of the vocabulary: the rows [vocab_start, vocab_start +
vocab_rows) of wte. The forward pass then goes in two steps around a collective that the caller issues:
    embedding_lookup_forward    out[n] = wte[tokens[n]] if this rank owns tokens[n], else 0
    (caller) all-reduce (or reduce-scatter, under sequence parallelism) over the tp ranks: exactly one
             rank owns each token, so the sum is that rank's row plus zeros, exact (x + 0 = x)
    position_embedding_forward  out[i] += wpe[(first_row + i) % T], in fp32, rounded once
The value reaching the fp32 addition is the wte element itself, so the result has the bits of
encoder_forward (up to the sign of a zero: a wte element -0 comes out of the sum as +0). The backward
takes the slice too: encoder_backward with vocab_start and vocab_rows accumulates into this rank's rows of
dwte only, from the positions whose token it owns, and skips the others before grouping them. Its sums
are those of the full call restricted to the slice's tokens (the same positions in the same order, cut
into the same pieces), so each row of the slice gets the bits of the same row of the full dwte. dwpe needs
every position and is the same on every rank.

Determinism. Many positions share a token (think of "the", or the end-of-text token), so a kernel that
lets every position add its row into dwte with atomics would add in whatever order the hardware picks,
and float addition is not associative: different bits on every run. Instead the positions are grouped
by token before anything runs on the device:
  - the host, which has the token ids anyway (the data loader reads them there), sorts the B*T positions
    by (token, position) and cuts the sorted list into one bucket per distinct token;
  - a bucket of at most ENCODER_ROWS_PER_PIECE positions is one piece; a larger one (a heavy token) is
    cut into pieces of that many positions (the last one shorter);
  - on the device one warp takes one piece and adds its positions' rows in list order, into dwte for a
    light token, into an fp32 partial row of its own for a piece of a heavy token; then the partial rows
    of each heavy token are added, in piece order, into its row of dwte.
Each row of dwte is then written once, by sums in a fixed order: the same bits on every run and on
every GPU. dwpe needs no grouping: one thread sums the B rows of one position chunk in order of b.

Balance. Text is skewed: the most frequent token of a batch can fill a few percent of it, and padding
or end-of-text tokens half of it. One warp per token would leave that token's thousands of rows to a
single warp while the rest of the GPU idles. Pieces bound every warp's work to ENCODER_ROWS_PER_PIECE
rows; the partial rows of a token are then few (a token filling half of GPT-2 124M's B=16, T=1024 batch,
8192 rows, gives 128 pieces of 64 rows, each on its own warp, then one pass over 128 partial rows).

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
#include <climits>
#include "../cuda_common.cuh"
#include "../device_memory.h"

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

// out[n, :] = wte_slice[tokens[n] - vocab_start, :] for a token in [vocab_start, vocab_start + vocab_rows),
// else 0; a grid-stride loop over 16-byte chunks of out
__global__ void embedding_lookup_forward_kernel(floatX* out, const int* tokens, const floatX* wte_slice,
                                                int vocab_start, int vocab_rows, int N, int C) {
    const GridStride chunks = grid_stride((size_t)N * C / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const size_t n = i / C;  // a chunk never straddles two rows, since C % x128::size == 0
        const int c = (int)(i % C);
        const long long row = (long long)tokens[n] - vocab_start;  // no overflow for any int token
        x128 result = x128::constant((floatX)0.0f);
        if (row >= 0 && row < vocab_rows) result = load128(wte_slice + (size_t)row * C + c);
        store128(out + i, result);
    }
}

// out[i, :] += wpe[(first_row + i) % T, :] for i in [0, rows): row i of out is token row first_row + i of
// the batch; a grid-stride loop over 16-byte chunks of out
__global__ void position_embedding_forward_kernel(floatX* out, const floatX* wpe, int first_row, int rows, int T,
                                                  int C) {
    const GridStride chunks = grid_stride((size_t)rows * C / x128::size);
    for (size_t chunk = chunks.first; chunk < chunks.end; chunk += chunks.step) {
        const size_t i = chunk * x128::size;
        const size_t row = i / C;
        const int c = (int)(i % C);
        const int t = (int)(((size_t)first_row + row) % T);
        const x128 token_part = load128(out + i);
        const x128 position_part = load128(wpe + (size_t)t * C + c);
        x128 result;
        // the same expression as encoder_forward's, so that the bits agree
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

// Rows of dout one warp adds up at most: small enough to spread a heavy token over many warps, large
// enough that few partial rows are left to add (see the top of the file).
constexpr int ENCODER_ROWS_PER_PIECE = 64;

// One warp per piece: the sum of the dout rows at the piece's positions, in list order.
// pieces[3*j .. 3*j+2] = (token, first, count): the piece's positions (b*T + t) are positions[first ..
// first+count), in increasing order. Pieces j < num_partial_pieces belong to heavy tokens: their sums go
// to partial_rows[j] (fp32, C each); the others' sums are added to dwte[token]. (Here and below `token`
// is the token's row of dwte: the id itself, or id - vocab_start for a slice of the vocabulary.)
__global__ void encoder_backward_wte_pieces_kernel(floatX* dwte, float* partial_rows, const int* pieces,
                                                   int num_pieces, int num_partial_pieces, const int* positions,
                                                   const floatX* dout, int C) {
    const int warps_per_block = blockDim.x / 32;
    const int lane = threadIdx.x % 32;
    for (int j = blockIdx.x * warps_per_block + threadIdx.x / 32; j < num_pieces; j += gridDim.x * warps_per_block) {
        const int token = pieces[3 * j];
        const int first = pieces[3 * j + 1];
        const int count = pieces[3 * j + 2];
        for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
            float sum[x128::size] = {};
            for (int p = first; p < first + count; p++) {
                const x128 g = load128(dout + (size_t)positions[p] * C + c);
                for (int k = 0; k < x128::size; k++) sum[k] += (float)g[k];
            }
            if (j < num_partial_pieces) {
                float* partial = partial_rows + (size_t)j * C + c;
                for (int k = 0; k < x128::size; k += f128::size) {
                    f128 packed;
                    for (int i = 0; i < f128::size; i++) packed[i] = sum[k + i];
                    store128(partial + k, packed);
                }
            } else {
                floatX* target = dwte + (size_t)token * C + c;
                const x128 previous = load128(target);
                x128 result;
                for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)previous[k] + sum[k]);
                store128(target, result);
            }
        }
    }
}

// dwte[token] += the partial rows of each heavy token, in piece order; a grid-stride loop over 16-byte
// chunks of dwte. heavy[3*h .. 3*h+2] = (token, first piece, pieces): its partial rows.
__global__ void encoder_backward_wte_combine_kernel(floatX* dwte, const float* partial_rows, const int* heavy,
                                                    int num_heavy, int C) {
    const int chunks_per_row = C / x128::size;
    const GridStride items = grid_stride((size_t)num_heavy * chunks_per_row);
    for (size_t item = items.first; item < items.end; item += items.step) {
        const int h = (int)(item / chunks_per_row);
        const int c = (int)(item % chunks_per_row) * x128::size;
        const int token = heavy[3 * h];
        const int first_piece = heavy[3 * h + 1];
        const int num_pieces = heavy[3 * h + 2];
        float sum[x128::size] = {};
        for (int piece = first_piece; piece < first_piece + num_pieces; piece++) {
            const float* partial = partial_rows + (size_t)piece * C + c;
            for (int k = 0; k < x128::size; k += f128::size) {
                const f128 packed = load128(partial + k);
                for (int i = 0; i < f128::size; i++) sum[k + i] += packed[i];
            }
        }
        floatX* target = dwte + (size_t)token * C + c;
        const x128 previous = load128(target);
        x128 result;
        for (int k = 0; k < x128::size; k++) result[k] = (floatX)((float)previous[k] + sum[k]);
        store128(target, result);
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

// Tensor parallelism, step 1 of the forward pass. tokens: N = B*T ids (device). wte_slice: this rank's
// vocab_rows rows of wte, the first being token vocab_start. out (N, C): written, every row (zeros where the
// token is not in the slice). The caller then sums the ranks' outputs (all-reduce or reduce-scatter).
void embedding_lookup_forward(floatX* out, const int* tokens, const floatX* wte_slice, int vocab_start,
                              int vocab_rows, int N, int C, cudaStream_t stream) {
    encoder_check_width("embedding_lookup_forward", C);
    if (vocab_start < 0 || vocab_rows < 0) {
        fprintf(stderr, "error: embedding_lookup_forward: vocab_start = %d and vocab_rows = %d must not be negative\n",
                vocab_start, vocab_rows);
        exit(EXIT_FAILURE);
    }
    if (N <= 0) return;
    const int block_size = 256;
    const int grid = grid_size_for((size_t)N * C / x128::size, block_size);
    launch(embedding_lookup_forward_kernel, grid, block_size, 0, stream, out, tokens, wte_slice, vocab_start,
           vocab_rows, N, C);
}

// wpe null: no position table (Llama's positions come from RoPE in attention), out = wte[tokens]
void encoder_forward(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe, int B, int T, int C,
                     cudaStream_t stream) {
    encoder_check_width("encoder_forward", C);
    if (wpe == nullptr) {
        embedding_lookup_forward(out, tokens, wte, 0, INT_MAX, B * T, C, stream);
        return;
    }
    const int block_size = 256;
    const int grid = grid_size_for((size_t)B * T * C / x128::size, block_size);
    launch(encoder_forward_kernel, grid, block_size, 0, stream, out, tokens, wte, wpe, B, T, C);
}

// Tensor parallelism, step 2: out (rows, C) += the position rows, in place. Row i of out is row
// first_row + i of the B*T token rows, at position (first_row + i) % T: a rank that holds a slice of the
// rows (sequence parallelism) passes the index of its first row.
void position_embedding_forward(floatX* out, const floatX* wpe, int first_row, int rows, int T, int C,
                                cudaStream_t stream) {
    encoder_check_width("position_embedding_forward", C);
    if (first_row < 0 || T <= 0) {
        fprintf(stderr, "error: position_embedding_forward: first_row = %d must not be negative and T = %d must "
                "be positive\n", first_row, T);
        exit(EXIT_FAILURE);
    }
    if (rows <= 0) return;
    const int block_size = 256;
    const int grid = grid_size_for((size_t)rows * C / x128::size, block_size);
    launch(position_embedding_forward_kernel, grid, block_size, 0, stream, out, wpe, first_row, rows, T, C);
}

// What encoder_backward needs besides the tensors, for up to `max_positions` (= B*T) token positions of
// up to `max_channels` (C) channels: the piece lists, on the device and in pinned host memory, and the
// partial rows of heavy tokens. Sizes, with K = ENCODER_ROWS_PER_PIECE:
//   positions: max_positions ints (every position appears once)
//   heavy:     3 ints per heavy token; a heavy token has more than K positions: floor(max_positions / (K+1))
//   pieces:    3 ints per piece; every piece holds a position: max_positions
//   partial rows: a heavy token with c positions has ceil(c / K) <= c / K + 1 pieces, so all heavy tokens
//              together at most floor(max_positions / K) + floor(max_positions / (K+1)) rows of C floats
// (llmc/planning/memory.h counts the same sizes)
inline int encoder_backward_max_heavy_tokens(int max_positions) { return max_positions / (ENCODER_ROWS_PER_PIECE + 1); }
inline int encoder_backward_max_partial_rows(int max_positions) {
    return max_positions / ENCODER_ROWS_PER_PIECE + encoder_backward_max_heavy_tokens(max_positions);
}
inline size_t encoder_backward_workspace_ints(int max_positions) {
    return (size_t)4 * max_positions + (size_t)3 * encoder_backward_max_heavy_tokens(max_positions);
}

struct EncoderBackwardWorkspace {
    int max_positions = 0;
    int max_channels = 0;
    int* device = nullptr;          // encoder_backward_workspace_ints: positions, heavy tokens, pieces
    int* host_staging = nullptr;    // the same layout, pinned, filled by the host before each upload
    float* partial_rows = nullptr;  // encoder_backward_max_partial_rows(max_positions) rows of max_channels
    cudaEvent_t staging_uploaded = nullptr;  // recorded after each upload
    std::vector<uint64_t> sort_keys;        // (row of dwte << 32 | position), reused between calls
    std::vector<int> buckets;               // (token, first, count) per distinct token, reused between calls
};

inline void encoder_backward_workspace_create(EncoderBackwardWorkspace* workspace, int max_positions,
                                              int max_channels) {
    workspace->max_positions = max_positions;
    workspace->max_channels = max_channels;
    const size_t ints = encoder_backward_workspace_ints(max_positions);
    workspace->device = tracked_alloc<int>(ints, MemoryKind::Workspace, "encoder backward lists");
    cudaCheck(cudaMallocHost(&workspace->host_staging, ints * sizeof(int)));
    const size_t partial_floats = (size_t)encoder_backward_max_partial_rows(max_positions) * max_channels;
    workspace->partial_rows = tracked_alloc<float>(partial_floats, MemoryKind::Workspace, "encoder partial rows");
    // an event never recorded counts as complete, so the first call does not wait
    cudaCheck(cudaEventCreateWithFlags(&workspace->staging_uploaded, cudaEventDisableTiming));
    workspace->sort_keys.resize(max_positions);
}

inline void encoder_backward_workspace_free(EncoderBackwardWorkspace* workspace) {
    tracked_free(workspace->device);
    cudaCheck(cudaFreeHost(workspace->host_staging));
    tracked_free(workspace->partial_rows);
    cudaCheck(cudaEventDestroy(workspace->staging_uploaded));
    *workspace = EncoderBackwardWorkspace{};
}

// tokens_host: the same B*T token ids the forward pass read from device memory.
// vocab_start, vocab_rows (tensor parallelism): dwte holds only the rows [vocab_start, vocab_start +
// vocab_rows) of the table, its row 0 being token vocab_start; positions whose token lies outside are
// left out of dwte (neither sorted nor uploaded). dwpe takes every position, as without a slice.
void encoder_backward(floatX* dwte, floatX* dwpe, EncoderBackwardWorkspace* workspace, const floatX* dout,
                      const int* tokens_host, int B, int T, int C, cudaStream_t stream, int vocab_start = 0,
                      int vocab_rows = INT_MAX) {
    encoder_check_width("encoder_backward", C);
    if (vocab_start < 0 || vocab_rows < 0) {
        fprintf(stderr, "error: encoder_backward: vocab_start = %d and vocab_rows = %d must not be negative\n",
                vocab_start, vocab_rows);
        exit(EXIT_FAILURE);
    }
    const int num_positions = B * T;
    if (num_positions > workspace->max_positions || C > workspace->max_channels) {
        fprintf(stderr, "error: encoder_backward: B*T = %d, C = %d exceed the workspace's %d positions, %d "
                "channels\n", num_positions, C, workspace->max_positions, workspace->max_channels);
        exit(EXIT_FAILURE);
    }

    // dwpe first (null: no position table): it needs no host work, so the device starts on it while the host sorts
    const int block_size = 256;
    if (dwpe != nullptr)
        launch(encoder_backward_wpe_kernel, grid_size_for((size_t)T * C / x128::size, block_size), block_size, 0,
               stream, dwpe, dout, B, T, C);

    // group the slice's positions by token: sort (row of dwte, position) pairs, then cut at every change of
    // row. Subtracting vocab_start keeps the order, so the slice's positions come out exactly as in the
    // full sort, and are cut into the same pieces.
    std::vector<uint64_t>& keys = workspace->sort_keys;
    int num_included = 0;  // positions whose token is in the slice
    for (int p = 0; p < num_positions; p++) {
        if (tokens_host[p] < 0) {
            fprintf(stderr, "error: encoder_backward: negative token id %d at position %d\n", tokens_host[p], p);
            exit(EXIT_FAILURE);
        }
        const long long row = (long long)tokens_host[p] - vocab_start;
        if (row < 0 || row >= vocab_rows) continue;
        keys[num_included++] = ((uint64_t)row << 32) | (uint32_t)p;
    }
    if (num_included == 0) return;  // nothing for this slice of dwte
    std::sort(keys.begin(), keys.begin() + num_included);
    std::vector<int>& buckets = workspace->buckets;
    buckets.clear();
    int num_heavy = 0;
    for (int i = 0; i < num_included; i++) {
        const int token = (int)(keys[i] >> 32);
        if (i == 0 || token != (int)(keys[i - 1] >> 32)) buckets.insert(buckets.end(), {token, i, 0});
        const int count = ++buckets.back();
        if (count == ENCODER_ROWS_PER_PIECE + 1) num_heavy++;
    }

    // the previous call's upload must have finished reading host_staging before we overwrite it
    cudaCheck(cudaEventSynchronize(workspace->staging_uploaded));
    int* positions = workspace->host_staging;
    int* heavy = positions + num_included;
    int* pieces = heavy + 3 * num_heavy;
    for (int i = 0; i < num_included; i++) positions[i] = (int)(keys[i] & 0xffffffffu);
    // heavy tokens' pieces first: they are the ones with partial rows, numbered as the pieces
    int num_pieces = 0, h = 0;
    for (size_t b = 0; b < buckets.size(); b += 3) {
        const int token = buckets[b], first = buckets[b + 1], count = buckets[b + 2];
        if (count <= ENCODER_ROWS_PER_PIECE) continue;
        heavy[3 * h] = token;
        heavy[3 * h + 1] = num_pieces;
        for (int start = first; start < first + count; start += ENCODER_ROWS_PER_PIECE, num_pieces++) {
            pieces[3 * num_pieces] = token;
            pieces[3 * num_pieces + 1] = start;
            pieces[3 * num_pieces + 2] = std::min(ENCODER_ROWS_PER_PIECE, first + count - start);
        }
        heavy[3 * h + 2] = num_pieces - heavy[3 * h + 1];
        h++;
    }
    const int num_partial_pieces = num_pieces;
    for (size_t b = 0; b < buckets.size(); b += 3) {
        if (buckets[b + 2] > ENCODER_ROWS_PER_PIECE) continue;
        for (int k = 0; k < 3; k++) pieces[3 * num_pieces + k] = buckets[b + k];
        num_pieces++;
    }
    const size_t upload_ints = (size_t)num_included + 3 * (size_t)num_heavy + 3 * (size_t)num_pieces;
    cudaCheck(cudaMemcpyAsync(workspace->device, workspace->host_staging, upload_ints * sizeof(int),
                              cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(workspace->staging_uploaded, stream));

    const int* device_positions = workspace->device;
    const int* device_heavy = device_positions + num_included;
    const int* device_pieces = device_heavy + 3 * num_heavy;
    const int warps_per_block = 4;
    launch(encoder_backward_wte_pieces_kernel, grid_size_for(num_pieces, warps_per_block), warps_per_block * 32, 0,
           stream, dwte, workspace->partial_rows, device_pieces, num_pieces, num_partial_pieces, device_positions,
           dout, C);
    if (num_heavy > 0) {
        launch(encoder_backward_wte_combine_kernel, grid_size_for((size_t)num_heavy * C / x128::size, block_size),
               block_size, 0, stream, dwte, workspace->partial_rows, device_heavy, num_heavy, C);
    }
}
