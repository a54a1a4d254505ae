/*
Data parallelism: N ranks, each with the whole model, each training on its own rows of the batch.

The global batch of every step is N * B rows; the data loader gives rank r the rows [r*B, r*B + B) of it
(llmc/dataloader.h states the invariant). Each rank runs forward and backward on its rows, so its gradient
is the mean loss gradient over ITS rows (dloss = 1 / (B * T * micro-steps)). Averaging those N gradients
gives the mean over all N * B rows: exactly the gradient one rank would compute on the whole batch, up to
the order of the additions. After the average every rank holds the same gradient, takes the same
(deterministic) AdamW step, and so keeps the same parameters without ever sending them.

When to average. A layer's gradient is final once the backward pass of the LAST micro-step has gone
through that layer (earlier micro-steps only accumulate locally). gpt2_backward reports each parameter
chunk as it becomes final: the final layernorm first, then block L-1 down to block 0, and the embedding
chunk last (wte collects gradient from both the LM head and the token lookup). Each chunk is averaged
right away, so on a GPU the all-reduce of block l runs on its own stream while block l-1's backward
kernels run on the compute stream:

    compute stream:  ...  backward(block l)  [event]  backward(block l-1)  [event]  ...   [wait]  optimizer
    comm stream:                     wait event -> all-reduce(l)   wait event -> all-reduce(l-1)  ...

No later kernel of the step writes a chunk after it was handed over, and the optimizer waits for the
comm stream, so nothing races. On the CPU build the all-reduce runs when it is called (MPI, blocking).

Traffic: all-reduce of the whole gradient, 2 (N-1)/N x (parameters x bytes per gradient) sent per rank per
step (the ring algorithm), as counted by llmc/comm.h.
*/
#pragma once

#include "cuda_common.cuh"
#include "comm.h"

struct DataParallel {
    Communicator* group = nullptr;         // the ranks that average gradients (the mesh's gradient group)
    cudaStream_t comm_stream = nullptr;    // reductions run here, beside the compute stream
    cudaEvent_t chunk_ready = nullptr;     // recorded on the compute stream when a chunk's gradient is final
    cudaEvent_t reductions_done = nullptr; // recorded on the comm stream after the last reduction
    float* scalar = nullptr;               // one float of device memory, to average logged values
};

inline void data_parallel_init(DataParallel& dp, Communicator& group) {
    dp.group = &group;
    cudaCheck(cudaStreamCreate(&dp.comm_stream));
    cudaCheck(cudaEventCreate(&dp.chunk_ready));
    cudaCheck(cudaEventCreate(&dp.reductions_done));
    cudaCheck(cudaMalloc(&dp.scalar, sizeof(float)));
}

inline void data_parallel_free(DataParallel& dp) {
    cudaCheck(cudaStreamDestroy(dp.comm_stream));
    cudaCheck(cudaEventDestroy(dp.chunk_ready));
    cudaCheck(cudaEventDestroy(dp.reductions_done));
    cudaCheck(cudaFree(dp.scalar));
    dp = DataParallel{};
}

// Averages `count` gradients (one parameter chunk) over the group, once the compute stream has written them.
inline void average_gradient_chunk(DataParallel& dp, floatX* grads, size_t count, cudaStream_t compute) {
    if (dp.group->size == 1) return;
    cudaCheck(cudaEventRecord(dp.chunk_ready, compute));
    cudaCheck(cudaStreamWaitEvent(dp.comm_stream, dp.chunk_ready, 0));
    all_reduce(*dp.group, grads, count, Reduction::Average, dp.comm_stream);
}

// Makes the compute stream wait until every reduction handed over so far has finished.
inline void wait_for_gradient_averages(DataParallel& dp, cudaStream_t compute) {
    if (dp.group->size == 1) return;
    cudaCheck(cudaEventRecord(dp.reductions_done, dp.comm_stream));
    cudaCheck(cudaStreamWaitEvent(compute, dp.reductions_done, 0));
}

// The mean of a host value over the group (the loss each rank measured on its rows, for the log).
inline float average_over_ranks(DataParallel& dp, float value, cudaStream_t compute) {
    if (dp.group->size == 1) return value;
    cudaCheck(cudaMemcpy(dp.scalar, &value, sizeof(float), cudaMemcpyHostToDevice));
    all_reduce(*dp.group, dp.scalar, 1, Reduction::Average, compute);
    cudaCheck(cudaMemcpy(&value, dp.scalar, sizeof(float), cudaMemcpyDeviceToHost));
    return value;
}
