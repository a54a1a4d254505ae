/*
Activation offload: the records of the blocks that --recompute-blocks marks o (every block under --offload
activations) live in pinned host memory between a block's forward pass and its backward pass
(llmc/parallel/recompute.h has the letters, llmc/model/gpt2.cuh's gpt2_allocate_records the buffers,
llmc/model/forward_backward.cuh's gpt2_stage_forward and gpt2_stage_backward the calls below).

What moves. All of an offloaded block's record but its output: the output is the next block's input (and a
full block's rerun starts from it), so it stays on the device, booked as activations; the rest (the norms'
outputs and statistics, qkv, the attention output and its log-sum-exp, residual2, fch and its activation) goes
to the host, booked as host activations (llmc/device_memory.h's tracked_host_alloc), once per stage record.

Two staging records on the device. The forward pass of an offloaded block writes its record into a staging
record, and the copy stream copies it to the host after the block; the next offloaded block uses the other
staging record, so that its forward pass runs while the previous copy is in flight. The backward pass brings
a record back into a staging record one block ahead: while block i's backward pass runs, the copy stream
fetches block i-1's record (the last block's record is fetched at the start of the stage's backward pass,
where nothing runs beside it). Position i of a stage record always uses staging record (number of o
positions before i) mod 2, so consecutive offloaded blocks alternate in both passes.

    compute:  F(i) [writes S0] -> F(i+1) [writes S1] -> ... -> B(i+1) [reads S1] -> B(i) [reads S0]
    copy:                 S0 -> host(i)  S1 -> host(i+1)    host(i) -> S0 (during B(i+1))

Ordering, by events only (no host synchronisation in the step). Each staging record has one event, `used`,
recorded after every use of it, on the stream of that use; the next use, on either stream, first waits for it:
    before a block's forward pass writes staging record S   compute waits S.used: the copy to the host that
                                                            read S before (or the backward pass that read it)
    after that forward pass, the copy to the host          copy waits S.used, recorded on compute after the block
    the fetch before the backward pass                      copy waits S.used: the last use (another block's
                                                            backward pass, or the copy out)
    before the backward pass reads S                        compute waits S.used, recorded after the fetch
    after the backward pass                                 S.used recorded on compute
A block's host record is written by its copy out and read by its fetch, both on the one copy stream, so they
come in the order issued: a stage record's host copy is not overwritten by the next microbatch's forward pass
before its own backward pass has fetched it.

Under pipeline parallelism every record in flight is offloaded. The alternative, keeping on the device the
record of the microbatch whose backward pass comes next (under 1f1b the last one filled, on the last stage
the one whose backward follows its forward at once), saves that record's round trip over PCIe but costs a
whole record of device memory per rank, the memory this offload exists to free, and makes the device's bytes
depend on the schedule's action order. With all of them offloaded the device holds the same bytes for any
schedule (two staging records and the outputs), the host K records of the K in flight, and the formula is one
line (llmc/planning/memory.h: host = K x the offloaded positions' records).
*/
#pragma once

#include <utility>
#include <vector>
#include "../cuda_common.cuh"

// One staging record: its buffers on the device (each with its size, in the order of a host record's buffers)
// and the event recorded after its last use.
struct OffloadStaging {
    std::vector<std::pair<void*, size_t>> buffers;
    cudaEvent_t used = nullptr;
};

struct ActivationOffload {
    cudaStream_t copy_stream = nullptr;  // null: no block is offloaded
    OffloadStaging staging[2];
    std::vector<int> staging_of;  // per position of a stage record: its staging record, -1 if not offloaded
};

inline void activation_offload_create(ActivationOffload& offload) {
    cudaCheck(cudaStreamCreateWithFlags(&offload.copy_stream, cudaStreamNonBlocking));
    for (OffloadStaging& staging : offload.staging)
        cudaCheck(cudaEventCreateWithFlags(&staging.used, cudaEventDisableTiming));
}
inline void activation_offload_free(ActivationOffload& offload) {
    if (offload.copy_stream == nullptr) return;
    cudaCheck(cudaStreamSynchronize(offload.copy_stream));
    for (OffloadStaging& staging : offload.staging) cudaCheck(cudaEventDestroy(staging.used));
    cudaCheck(cudaStreamDestroy(offload.copy_stream));
    offload = ActivationOffload{};
}

// Before the forward or the backward pass of position `slot` touches its staging record on `compute`.
inline void activation_offload_wait(ActivationOffload& offload, int slot, cudaStream_t compute) {
    cudaCheck(cudaStreamWaitEvent(compute, offload.staging[offload.staging_of[slot]].used, 0));
}

// After a backward pass read the staging record of `slot`: the next fetch into it waits for this.
inline void activation_offload_release(ActivationOffload& offload, int slot, cudaStream_t compute) {
    cudaCheck(cudaEventRecord(offload.staging[offload.staging_of[slot]].used, compute));
}

// After the forward pass of `slot` filled its staging record on `compute`: the record to `host` (its buffers,
// in the staging record's order) on the copy stream.
inline void activation_offload_copy_out(ActivationOffload& offload, int slot, const std::vector<void*>& host,
                                        cudaStream_t compute) {
    OffloadStaging& staging = offload.staging[offload.staging_of[slot]];
    cudaCheck(cudaEventRecord(staging.used, compute));
    cudaCheck(cudaStreamWaitEvent(offload.copy_stream, staging.used, 0));
    for (size_t b = 0; b < staging.buffers.size(); b++)
        cudaCheck(cudaMemcpyAsync(host[b], staging.buffers[b].first, staging.buffers[b].second,
                                  cudaMemcpyDeviceToHost, offload.copy_stream));
    cudaCheck(cudaEventRecord(staging.used, offload.copy_stream));
}

// Before the backward pass of `slot`: its record from `host` back into its staging record, on the copy stream,
// once the staging record's last use is done.
inline void activation_offload_fetch(ActivationOffload& offload, int slot, const std::vector<void*>& host) {
    OffloadStaging& staging = offload.staging[offload.staging_of[slot]];
    cudaCheck(cudaStreamWaitEvent(offload.copy_stream, staging.used, 0));
    for (size_t b = 0; b < staging.buffers.size(); b++)
        cudaCheck(cudaMemcpyAsync(staging.buffers[b].first, host[b], staging.buffers[b].second,
                                  cudaMemcpyHostToDevice, offload.copy_stream));
    cudaCheck(cudaEventRecord(staging.used, offload.copy_stream));
}
