/*
The built-in machine profile "h100" (--machine h100, the default): a cluster of H100 SXM GPUs, eight to a node
joined by NVLink 4 through NVSwitches, the nodes joined by a 400 Gb/s NIC per GPU in the network Meta describes
for Llama 3. It is written in the profile format (llmc/planning/hardware.h) and read by the same parser as a file;
every number is cited beside it, and the ones that are estimates say so. None was chosen to make the planner
agree with a published result.

Sources (the short names used below):
  [H100]     NVIDIA H100 Tensor Core GPU datasheet, SXM column: BF16 Tensor Core 1,979 TFLOPS "with sparsity" (989.4
             dense, half of it: 528 tensor cores x 1024 FLOP per clock x 1.83 GHz), GPU memory bandwidth 3.35 TB/s,
             NVLink 900 GB/s (both directions together: 450 GB/s each way), PCIe Gen5 128 GB/s (both directions: 64
             each way).
  [Llama3]   Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.1 (Network): RoCE at 400 Gbps per GPU;
             eight GPUs per server; a rack of 16 GPUs; a pod of 192 racks = 3,072 GPUs with full bisection bandwidth;
             the aggregation layer above the pods oversubscribed 1:7.
  [NCCL]     NCCL's own cost model, src/graph/tuning.cc (NVIDIA/nccl, its recent releases; older ones had 0.47 us
             for NVLink): hwLat, the latency per step
             of each algorithm and protocol on each link kind: NVLink ring LL 0.6 us, network ring LL 2.7 us, network
             tree LL 5.0 us. A step's latency is what the format calls alpha; the LL protocol is the one NCCL picks
             for the small messages where alpha matters. Its per-call base latency (baseLat) has no place in the
             format and is not counted.
  [nt290]    NVIDIA/nccl-tests issue 290, a maintainer's answer (2025-03): all_reduce_perf on one 8-GPU H100 node,
             476 GB/s bus bandwidth with NVLink SHARP, "in the expected range for H100"; "For NDR @ 400Gbps you
             should see 46-48GB/s per NIC".
  [nt267]    NVIDIA/nccl-tests issue 267, maintainers' answers (2024-11, 2025-01): an all-to-all "cannot aggregate the
             bandwidth of multiple NICs", so it runs at one NIC's rate; ConnectX-7 at NDR 400 Gb/s "should achieve up
             to 48-49GB/s per NIC".
  [nccl1281] NVIDIA/nccl issue 1281 (2024-05), a user's report: nccl-tests on H100, reduce_scatter 360 GB/s and
             all_gather 350 GB/s bus bandwidth with the same settings (the node count is not stated; rates above a
             400 Gb/s NIC's are NVLink's, so one node).
  [nccl1264] NVIDIA/nccl issue 1264: p2pBandwidthLatencyTest between two H100 SXM over NVLink 4, 380 GB/s one way
             (376 in another report there): what one send reaches.
  [MAMF]     S. Bekman, "Machine Learning Engineering", compute/accelerator: the Maximum Achievable Matmul FLOPS
             table, H100 SXM BF16: 792.1 TFLOPS = 80.1% of 989, best shape 6144 x 17920 x 2816 (CUDA 12.1): the
             lectures' "about 80% on an H100 for large ones".
  [H200]     measured by this project on one NVIDIA H200 SXM (driver 580.159.04, CUDA 13.0, 2026-11-28): dev/calibrate.cu's
             `calibrate matmul M N K` (BF16 through cuBLASLt, random operands; a shape's rate is 2 M N K over the mean
             time of its three calls, each the median of single calls timed with events). The H200 is the H100 SXM's
             compute: the same GH100 with 132 SMs at up to 1980 MHz, 700 W, the same 989.4 dense BF16 TFLOP/s; only
             its HBM is faster (4.8 TB/s), which no shape above the ridge feels. So its rates stand in for an
             H100's at these compute-bound shapes (each at least 0.7 ms a call, where the call's host-side issue,
             ~10 us, is under 1.5%).
  [FA3]      Shah et al. 2024, "FlashAttention-3" (arXiv 2407.08608), the forward-speed figure (Figure 5: causal,
             head dimension 128, H100 80GB SXM5, FP16/BF16) and the backward-speed one (Figure 6: head dimension 128;
             the paper shows the backward pass without the causal mask only, so that one stands in for the causal
             backward: an estimate).

How the rows that are not a single published number are derived:
  matmul   Measured: [MAMF]'s best shape on an H100, and on an H200 [H200] the cube of 8192 and the five products
           of a Llama 3 405B layer and its LM head at tp 8 and 8192 rows (what Table 4's plans spend their matmul
           time on). The smaller cubes are [MAMF]'s 0.801 times two bounds, which makes them estimates (upper bounds
           under the stated assumptions): the H200 timed them lower (1024^3 0.16, 2048^3 0.54, 4096^3 0.74) but
           one call at a time, so with its ~10 us of host-side issue in each, which a step's queued calls hide:
             the roofline: a matmul moves at least 2 (MK + KN + MN) bytes (BF16) for 2 MNK FLOPs, and below the ridge
               peak / HBM = 989.4e12 / 3.35e12 = 295 FLOP/byte it cannot exceed intensity / 295 of peak;
             the last wave: C is cut into 128 x 128 tiles, one per SM at a time on the 132 SMs, and a last wave
               that fills only some SMs idles the others: tiles / (132 ceil(tiles / 132)) (NVIDIA's "Matrix
               Multiplication Background User's Guide" names this wave quantization; the tile size is an assumption).
           e.g. 1024^3: intensity 341 (above the ridge), 64 tiles on 132 SMs: 0.801 x 1 x 64/132 = 0.388.
  attention  forward and backward together. The papers count a causal forward's FLOPs F and the backward's as 2.5 F,
           so one pass of both takes F/forward + 2.5 F/backward seconds; the efficiency is of the work as this project
           counts it (hardware.h's attention_flops: 2 products a score forward and 7 backward, 4.5 F in all):
           4.5 / (1/forward + 2.5/backward) TFLOP/s, over 989.4.
  tiers    ranks_per_node 8 [H100 servers, Llama3]; ranks_per_leaf 3072, a pod at full bisection bandwidth [Llama3].
           The leaf tier's bus bandwidth is one NIC's: a group that crosses nodes has, in the layouts the planner
           lays out (tp inside the node), one rank per node, whose traffic all goes through that rank's NIC; 47e9 is
           the middle of the 46-48 GB/s the NCCL maintainers quote for 400 Gb/s [nt290] (RoCE at the same line rate
           assumed to reach the same: an estimate). A group with several ranks per node gets more (NCCL spreads a
           ring's node crossings over the node's NICs), so for it this is a lower bound.
           The spine's bus bandwidth is the leaf's / 7, the aggregation layer's oversubscription [Llama3]; its alpha
           the leaf's (one more switch layer adds well under a microsecond: an estimate, no published figure).
*/
#pragma once

constexpr const char* kH100Profile = R"(llmc machine profile 1
# The H100 cluster: sources and derivations in llmc/planning/h100_profile.h
name h100
peak_flops 989.4e12             # [H100] dense BF16
hbm_bytes_per_second 3.35e12    # [H100] HBM3
pcie_bytes_per_second 50e9      # [H100] PCIe Gen5 x16, 64 GB/s each way; 50: what a pinned copy reaches after the
                                # protocol's overhead, about 80% (an estimate)
ranks_per_node 8                # [H100] [Llama3] eight GPUs per server
ranks_per_leaf 3072             # [Llama3] a pod: 192 racks of 16 GPUs, full bisection bandwidth
cores_per_node 0                # one GPU per rank
# launch_seconds absent (0): launches are queued while the previous kernel runs, so a busy GPU does not wait on them

#      M     N     K     efficiency of peak_flops
matmul 512   512   512   0.056  # roofline 170.7/295 = 0.578, 16 tiles of 132 SMs: 0.801 x 0.578 x 0.121 (estimate)
matmul 1024  1024  1024  0.388  # 64 tiles of 132: 0.801 x 0.485 (estimate)
matmul 2048  2048  2048  0.777  # 256 tiles, 2 waves of 132: 0.801 x 0.970 (estimate)
matmul 4096  4096  4096  0.777  # 1024 tiles, 8 waves: 0.801 x 0.970 (estimate)
matmul 8192  8192  8192  0.698  # [H200] 691 TFLOP/s
matmul 6144  17920 2816  0.801  # [MAMF] measured: 792.1 / 989
matmul 8192  2304  16384 0.833  # [H200] 824 TFLOP/s: 405B's qkv at tp 8
matmul 8192  16384 2048  0.765  # [H200] 757 TFLOP/s: attproj
matmul 8192  13312 16384 0.734  # [H200] 726 TFLOP/s: fc (gate and up)
matmul 8192  16384 6656  0.755  # [H200] 747 TFLOP/s: fcproj
matmul 8192  16032 16384 0.745  # [H200] 737 TFLOP/s: the LM head

#         T  HS  efficiency: [FA3] causal forward, backward (TFLOP/s) -> 4.5 / (1/f + 2.5/b) / 989.4
attention 512 128    0.401   # 292, 316 -> 397.0
attention 1024 128   0.551   # 423, 424 -> 544.8
attention 2048 128   0.658   # 521, 501 -> 651.3
attention 4096 128   0.717   # 579, 542 -> 709.8
attention 8192 128   0.742   # 602, 559 -> 733.7
attention 16384 128  0.748   # 616, 561 -> 740.2

#          tier  op             algorithm alpha (s) bus bandwidth (bytes/s)
collective node  all_reduce     ring      0.6e-6    476e9  # [NCCL] NVLink ring LL; [nt290] NVLink SHARP's busbw
collective node  all_gather     ring      0.6e-6    350e9  # [NCCL]; [nccl1281]
collective node  reduce_scatter ring      0.6e-6    360e9  # [NCCL]; [nccl1281]
collective node  all_to_all     ring      0.6e-6    350e9  # [NCCL]; all_gather's: the same bytes per GPU over the
                                                           # same links (an estimate, no published figure found)
collective node  send_recv      ring      0.6e-6    380e9  # [NCCL]; [nccl1264] one way over NVLink 4
collective leaf  all_reduce     ring      2.7e-6    47e9   # [NCCL] network ring LL; [nt290] one 400 Gb/s NIC
collective leaf  all_reduce     tree      5.0e-6    47e9   # [NCCL] network tree LL; the double binary tree keeps
                                                           # the ring's bus bandwidth
collective leaf  all_gather     ring      2.7e-6    47e9   # [NCCL]; [nt290]
collective leaf  reduce_scatter ring      2.7e-6    47e9   # [NCCL]; [nt290]
collective leaf  all_to_all     ring      2.7e-6    47e9   # [NCCL]; [nt267] one NIC's rate
collective leaf  send_recv      ring      2.7e-6    47e9   # [NCCL]; [nt290]
collective spine all_reduce     ring      2.7e-6    6714285714.285714  # [Llama3] the leaf's 47e9 / 7
collective spine all_reduce     tree      5.0e-6    6714285714.285714  # [Llama3] / 7
collective spine all_gather     ring      2.7e-6    6714285714.285714  # [Llama3] / 7
collective spine reduce_scatter ring      2.7e-6    6714285714.285714  # [Llama3] / 7
collective spine all_to_all     ring      2.7e-6    6714285714.285714  # [Llama3] / 7
collective spine send_recv      ring      2.7e-6    6714285714.285714  # [Llama3] / 7
)";
