/*
The machine the planner assumes (llmc/planning/planner.h), as the flags set it (llmc/io/options.h). Kept
apart from the planner so that reading the flags needs neither the model nor a kernel.
*/
#pragma once

// what the plan does not count but a GPU needs: the CUDA context (~0.5 GiB), cuBLASLt's 32 MiB workspace,
// NCCL's buffers (a few hundred MiB with several communicators); --memory-reserve sets it
constexpr double kPlanReserveBytes = 2.0 * (1 << 30);

struct PlanHardware {
    double gpu_memory_bytes = 80.0 * (1 << 30);
    int gpus_per_node = 8;
    double nvlink_bytes_per_second = 450e9;      // per direction per GPU (H100 SXM, NVLink 4)
    double infiniband_bytes_per_second = 50e9;   // per GPU (NDR, 400 Gb/s)
    double pcie_bytes_per_second = 50e9;         // per direction, GPU <-> pinned host memory (PCIe 5 x16)
    double hbm_bytes_per_second = 3.35e12;       // the GPU's own memory (H100 SXM, HBM3)
    double reserve_bytes = kPlanReserveBytes;    // kept free of the plan: "fits" is total + this <= gpu_memory_bytes
    double peak_flops = 989.4e12;                // dense BF16 (H100 SXM, llmc/planning/mfu.h)
    double efficiency = 0.5;                     // fraction of peak the matmuls reach
};
