#!/usr/bin/python3
"""
The kernel report's arithmetic (scripts/bench/kernel_report.sh compiles; this reads what the compiler left).

Per kernel (.entry) and architecture: registers, static and dynamic shared memory, spills and the
theoretical occupancy from ptxas -v; tensor-core (HMMA), FP32 fused multiply-add (FFMA) and shared-load
instruction counts from the PTX, or from the SASS when cuobjdump is there. Then a roofline estimate of one
GPT-2 124M training step on an H100 SXM, and the checks: no kernel spills, and in the BF16 build every
attention forward/backward kernel issues HMMA, and so do the kernels a grouped-query attention case (Llama 3
8B's heads on one GPU: 32 query heads over 8 K/V heads of 128) launches. Prints `N passed, M failed`; exits 1
on any failure.

    kernel_report.py WORK_DIR PRECISION ARCH...
WORK_DIR holds sm_<arch>/ptxas.txt, sm_<arch>/*.ptx, optionally sm_<arch>/sass.txt, and shared_bytes.txt
(lines "role head_size bytes" from the launchers' own size functions, and "gqa q_heads kv_heads head_size
group" from llmc/kernels/attention.cuh's attention_heads; absent if the probe did not build).
"""
import glob
import os
import re
import subprocess
import sys

work, precision, archs = sys.argv[1], sys.argv[2], sys.argv[3:]

# ----------------------------------------------------------------------------------------------------
# the streaming multiprocessor's limits (CUDA programming guide, "compute capabilities" table)
SM_LIMITS = {
    "80": dict(registers=65536, threads=2048, blocks=32, shared=164 * 1024),
    "90": dict(registers=65536, threads=2048, blocks=32, shared=228 * 1024),
}
REGISTER_GRANULE = 256        # registers are allocated per warp in units of 256
SHARED_GRANULE = 128          # shared memory per block is allocated in units of 128 bytes
SHARED_RESERVED = 1024        # and the system reserves 1 KiB of it for every block (sm_80 and later)

# Threads per block, from the launchers in llmc/ (the PTX carries it only where a kernel declares
# __launch_bounds__, as .maxntid, which takes precedence). A kernel missing here shows "-" for occupancy.
KNOWN_BLOCK_SIZES = {
    "attention_forward_kernel": 128, "attention_backward_dkdv_kernel": 128, "attention_backward_dq_kernel": 128,
    "attention_backward_preprocess_kernel": 256,
    "adamw_kernel": 512, "copy_to_master_kernel": 512,
    "sum_of_squares_partials_kernel": 512, "sum_partials_kernel": 256,
    "fused_classifier_kernel": 512,
    "gelu_forward_kernel": 512, "gelu_backward_kernel": 512, "rope_kernel": 256,
    "swiglu_forward_kernel": 512, "swiglu_backward_kernel": 512,
    "moe_router_forward_kernel": 256, "moe_router_backward_kernel": 256, "moe_count_routed_kernel": 256,
    "moe_expert_offsets_kernel": 256, "moe_place_kernel": 256, "moe_permute_forward_kernel": 256,
    "moe_gather_rows_kernel": 256, "moe_unpermute_backward_kernel": 256, "moe_aux_loss_forward_kernel": 1024,
    "moe_aux_loss_backward_kernel": 256,
    "residual_forward_kernel": 256, "layernorm_forward_kernel": 256,
    "fused_residual_layernorm_forward_kernel": 256, "layernorm_backward_kernel": 256,
    "rmsnorm_forward_kernel": 256, "fused_residual_rmsnorm_forward_kernel": 256, "rmsnorm_backward_kernel": 256,
    "encoder_forward_kernel": 256, "encoder_backward_wpe_kernel": 256, "encoder_backward_wte_pieces_kernel": 128,
    "encoder_backward_wte_combine_kernel": 256, "embedding_lookup_forward_kernel": 256,
    "position_embedding_forward_kernel": 256,
    "vocab_parallel_softmax_partials_kernel": 512, "vocab_parallel_rescale_sums_kernel": 256,
    "vocab_parallel_loss_and_gradient_kernel": 512,
    "add_column_partials_kernel": 256, "bias_gradient_partials_kernel": 256,
}


def is_attention_core(name):
    """The kernels that must run on tensor cores in the BF16 build: attention forward, dK/dV and dQ."""
    return re.match(r"attention_.*(forward|dkdv|dq)", name) is not None and "preprocess" not in name


def short_names(mangled):
    """Demangled, without the return type and the parameter list: attention_forward_kernel<64>."""
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                               check=True).stdout.split("\n")
    names = {}
    for raw, text in zip(mangled, demangled):
        text = re.sub(r"^void ", "", text.strip())
        depth = 0
        for i, c in enumerate(text):  # the parameter list is the first '(' outside template brackets
            depth += c == "<"
            depth -= c == ">"
            if c == "(" and depth == 0:
                text = text[:i]
                break
        names[raw] = text
    return names


# ----------------------------------------------------------------------------------------------------
# reading ptxas -v, the PTX and the SASS

def read_ptxas(path):
    kernels, current, properties_of = {}, None, None
    for line in open(path):
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
            kernels[current] = dict(registers=0, smem=0, spill_stores=0, spill_loads=0)
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            properties_of = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and properties_of in kernels:  # device functions that were not inlined have properties too
            kernels[properties_of]["spill_stores"] = int(m.group(1))
            kernels[properties_of]["spill_loads"] = int(m.group(2))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            kernels[current]["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s.group(1)) if s else 0
    return kernels


def read_ptx(path):
    """Per .entry: HMMA (mma.sync m16n8k16), FFMA (fma.rn.f32), shared loads (ld.shared, ldmatrix), .maxntid.
    The PTX of an entry holds every device function inlined into it; calls to non-inlined .func are
    counted in the callee, not here (`calls` says how many there are)."""
    entries, name, body = {}, None, []
    for line in open(path):
        m = re.match(r"\s*(?:\.visible\s+|\.weak\s+)*\.entry\s+([\w$]+)\s*\(", line)
        if m:
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        body.append(line)
        if line.rstrip() == "}":
            text = "".join(body)
            maxntid = re.search(r"\.maxntid\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", text)
            threads = None
            if maxntid:
                threads = 1
                for g in maxntid.groups():
                    threads *= int(g) if g else 1
            entries[name] = dict(
                hmma=len(re.findall(r"\bmma\.sync\.aligned\.m16n8k16\b", text)),
                ffma=len(re.findall(r"\bfma\.rn(?:\.ftz)?(?:\.sat)?\.f32\b", text)),
                lds=len(re.findall(r"\bld(?:\.volatile)?\.shared\b", text)) + len(re.findall(r"\bldmatrix\b", text)),
                calls=len(re.findall(r"^\s*call", text, re.M)),
                threads=threads)
            name = None
    return entries


def read_sass(path):
    counts, name = {}, None
    for line in open(path):
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            counts[name] = dict(hmma=0, ffma=0, lds=0)
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)[.\s]", line)
        if m and name:
            op = m.group(1)
            if op == "HMMA": counts[name]["hmma"] += 1
            elif op == "FFMA": counts[name]["ffma"] += 1
            elif op in ("LDS", "LDSM"): counts[name]["lds"] += 1
    return counts


def dynamic_shared_bytes():
    """{(role, head_size or 0): bytes} from the launchers' size functions; None when the probe did not build."""
    path = os.path.join(work, "shared_bytes.txt")
    if not os.path.exists(path):
        return None
    table = {}
    for line in open(path):
        if line.startswith("gqa "):
            continue
        role, hs, size = line.split()
        table[(role, int(hs))] = int(size)
    return table


def gqa_heads():
    """(q_heads, kv_heads, head_size, group) of the grouped-query case, as the probe's attention_heads accepted
    them, and whether the probe said so (otherwise the same numbers, unchecked)."""
    path = os.path.join(work, "shared_bytes.txt")
    if os.path.exists(path):
        for line in open(path):
            if line.startswith("gqa "):
                return tuple(int(x) for x in line.split()[1:5]), True
    return (32, 8, 128, 4), False


def role_of(name):
    template = re.search(r"<(\d+)[,>]", name)  # <HS> or <HS, ACCUMULATE>
    hs = int(template.group(1)) if template else 0
    if "preprocess" in name: return None
    if re.match(r"attention_forward", name): return ("attention_forward", hs)
    if re.match(r"attention_backward_dkdv", name): return ("attention_dkdv", hs)
    if re.match(r"attention_backward_dq", name): return ("attention_dq", hs)
    if name == "layernorm_backward_kernel": return ("layernorm_backward", 0)
    if name == "rmsnorm_backward_kernel": return ("rmsnorm_backward", 0)
    return None


def occupancy(limits, registers, shared_bytes, threads):
    """Resident warps / maximum warps per SM, from registers, shared memory and the block size."""
    warps = -(-threads // 32)
    registers_per_warp = -(-max(registers, 1) * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = limits["registers"] // (registers_per_warp * warps)
    shared = -(-(shared_bytes + SHARED_RESERVED) // SHARED_GRANULE) * SHARED_GRANULE
    by_shared = limits["shared"] // shared
    by_threads = limits["threads"] // (warps * 32)
    blocks = min(limits["blocks"], by_registers, by_shared, by_threads)
    return blocks * warps / (limits["threads"] // 32), blocks


# ----------------------------------------------------------------------------------------------------
# the table and the checks

passed, spills, without_hmma = 0, [], {}  # without_hmma: (arch, kernel family) -> [(kernel, FFMA count)]
dynamic = dynamic_shared_bytes()
attention_hmma = {}  # (arch, role) -> whether every such kernel issues HMMA
attention_kernels = {}  # arch -> [(name, role, head size, accumulate, HMMA, FFMA)] of attention's kernels
have_sass = all(os.path.exists(os.path.join(work, f"sm_{a}", "sass.txt")) for a in archs)
print(f"kernel report: {precision} build of dev/lab/kernel_lab.cu, nvcc -O3, instruction counts from "
      + ("SASS (cuobjdump -sass: HMMA, FFMA, LDS/LDSM)" if have_sass else
         "PTX (no cuobjdump here: each mma.sync.m16n8k16 becomes one HMMA on sm_80/sm_90; fma.rn.f32 = FFMA; "
         "ld.shared + ldmatrix = shared loads)"))
print("  counts are static (instructions in the code, not executed); occupancy = resident warps / 64 from "
      "registers, shared memory (static + the launcher's dynamic bytes at GPT-2 124M, where known) and block size")
if dynamic is None:
    print("  (the launchers' shared-memory sizes could not be read: occupancy uses static shared memory only)")

for arch in archs:
    limits = SM_LIMITS[arch]
    ptxas = read_ptxas(os.path.join(work, f"sm_{arch}", "ptxas.txt"))
    ptx = {}
    for path in glob.glob(os.path.join(work, f"sm_{arch}", "*.ptx")):
        ptx.update(read_ptx(path))
    sass = read_sass(os.path.join(work, f"sm_{arch}", "sass.txt")) if have_sass else None
    names = short_names(sorted(ptxas))
    print(f"\nsm_{arch} ({limits['registers'] // 1024}K registers, {limits['threads']} threads, {limits['blocks']} "
          f"blocks, {limits['shared'] // 1024} KiB shared memory per SM)")
    print(f"  {'kernel':<46} {'regs':>4} {'smem':>6} {'+dyn':>6} {'spill st/ld':>11} {'threads':>7} "
          f"{'occup.':>6} {'HMMA':>5} {'FFMA':>6} {'shared loads':>16}")
    natural = lambda m: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", names[m])]  # <16> before <112>
    for mangled in sorted(ptxas, key=natural):
        name, k = names[mangled], ptxas[mangled]
        counts = (sass or {}).get(mangled) or ptx.get(mangled) or dict(hmma=0, ffma=0, lds=0)
        code = ptx.get(mangled, {})
        threads = code.get("threads") or KNOWN_BLOCK_SIZES.get(re.sub(r"<.*", "", name))
        role = role_of(name)
        if role is not None and role[0].startswith("attention"):
            attention_kernels.setdefault(arch, []).append(
                (name, role[0], role[1], "true" in name, counts["hmma"], counts["ffma"]))
        dyn = 0
        dyn_text = "0"
        if role is not None:
            if dynamic is not None and role in dynamic:
                dyn = dynamic[role]
                dyn_text = str(dyn)
            else:
                dyn_text = "?"
        if threads:
            occ, blocks = occupancy(limits, k["registers"], k["smem"] + dyn, threads)
            occ_text = f"{100 * occ:.0f}%"
        else:
            occ_text = "-"
        ratio = str(counts["lds"])  # per HMMA where there are tensor-core instructions, else per FFMA
        if counts["lds"] and counts["hmma"]:
            ratio = f"{counts['lds'] / counts['hmma']:.2f}/HMMA"
        elif counts["lds"] and counts["ffma"]:
            ratio = f"{counts['lds'] / counts['ffma']:.2f}/FFMA"
        print(f"  {name:<46} {k['registers']:>4} {k['smem']:>6} {dyn_text:>6} "
              f"{str(k['spill_stores']) + '/' + str(k['spill_loads']):>11} {threads or '-':>7} {occ_text:>6} "
              f"{counts['hmma']:>5} {counts['ffma']:>6} {ratio:>16}")
        if code.get("calls"):
            print(f"    ({code['calls']} calls to non-inlined functions: their instructions are not counted here)")

        # check 1: no spills (a spill is local memory traffic in the inner loop)
        if k["spill_stores"] or k["spill_loads"]:
            spills.append(f"sm_{arch} {name} spills {k['spill_stores']} bytes of stores, {k['spill_loads']} of loads")
        else:
            passed += 1
        # check 2: BF16 attention on tensor cores
        if precision == "BF16" and is_attention_core(name):
            kind = "attention forward" if "forward" in name else "attention backward"
            attention_hmma[(arch, kind)] = attention_hmma.get((arch, kind), True) and counts["hmma"] > 0
            if counts["hmma"] == 0:
                family = (arch, re.sub(r"<\d+>", "", name))
                without_hmma.setdefault(family, []).append((name, counts["ffma"]))
            else:
                passed += 1

# ----------------------------------------------------------------------------------------------------
# grouped-query attention: the kernels are the same templates (the group is a run-time argument of the
# launchers, llmc/kernels/attention.cuh), so the case is the set of instances its launchers run at its head
# size, with the grids they launch; in the BF16 build each must issue HMMA

(gqa_q, gqa_kv, gqa_hs, gqa_group), gqa_checked = gqa_heads()
tile = 64 if precision == "BF16" else 32  # rows a block owns (attention_tensor_cores.cuh, attention_cuda_cores.cuh)
gqa_failures = []
print(f"\ngrouped-query attention: {gqa_q} query heads over {gqa_kv} K/V heads of {gqa_hs} (group {gqa_group}; Llama 3 "
      f"8B on one GPU" + ("" if gqa_checked else ", not confirmed by attention_heads: the probe did not build")
      + "): the kernels its launchers run")
gqa_launches = [  # (role, ACCUMULATE, what runs it, grid)
    ("attention_forward", False, "attention_forward(_pair)", f"(T/{tile}, {gqa_q} query heads, B)"),
    ("attention_dkdv", False, "attention_backward",
     f"(T/{tile}, {gqa_kv} K/V heads, B), each block over the query tiles of {gqa_group} query heads"),
    ("attention_dq", False, "attention_backward", f"(T/{tile}, {gqa_q} query heads, B)"),
    ("attention_dkdv", True, "attention_backward_pair (ring)",
     f"(Tk/{tile}, {gqa_kv} K/V heads, B), each block over the query tiles of {gqa_group} query heads"),
    ("attention_dq", True, "attention_backward_pair (ring)", f"(Tq/{tile}, {gqa_q} query heads, B)"),
]
for arch in archs:
    print(f"  sm_{arch}")
    missing, without = [], []
    for role, accumulate, caller, grid in gqa_launches:
        found = [k for k in attention_kernels.get(arch, [])
                 if k[1] == role and k[2] == gqa_hs and (role == "attention_forward" or k[3] == accumulate)]
        if not found:
            missing.append(f"{role}<{gqa_hs}{', true' if accumulate else ''}>")
            continue
        name, _, _, _, hmma, ffma = found[0]
        print(f"    {name:<46} HMMA {hmma:>5} FFMA {ffma:>6}   {caller}: grid {grid}")
        if hmma == 0:
            without.append(name)
    if precision == "BF16":
        if missing or without:
            gqa_failures.append(f"sm_{arch} grouped-query case: " + "; ".join(
                ([f"no kernel {', '.join(missing)}"] if missing else []) +
                ([f"0 HMMA in {', '.join(without)}: attention runs on the FP32 cores"] if without else [])))
        else:
            passed += 1

# ----------------------------------------------------------------------------------------------------
# roofline: GPT-2 124M, B=16, T=1024, one training step on an H100 SXM

PEAK_TENSOR = 989e12   # dense BF16 tensor-core FLOP/s
PEAK_FP32 = 67e12      # FP32 FLOP/s on the CUDA cores (FFMA counted as 2)
BANDWIDTH = 3.35e12    # HBM3 bytes/s
L, C, NH, V, Vp, maxT, B, T = 12, 768, 12, 50257, 50304, 1024, 16, 1024
HS, BT = C // NH, B * T
X = 2 if precision == "BF16" else 4  # bytes of an activation, parameter or gradient element
# the FP32 build's matmuls are true FP32 (no TF32): on the CUDA cores
MATMUL_UNIT, MATMUL_PEAK = ("tensor cores", PEAK_TENSOR) if precision == "BF16" else ("FP32 cores", PEAK_FP32)
N = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C

target = "90" if "90" in archs else archs[-1]  # the H100 is sm_90


def attention_unit(kind):
    """Without tensor cores each FMA of attention also loads an operand from shared memory: with one shared
    load per FMA, the load pipe (a quarter of the FMA rate per SM) caps attention at ~25% of the FP32 peak."""
    if precision == "BF16" and attention_hmma.get((target, kind), False):
        return "tensor cores", PEAK_TENSOR
    return "FP32 cores, shared-load bound (25%)", 0.25 * PEAK_FP32


def timed(flops, bytes_moved, peak):
    return max(flops / peak, bytes_moved / BANDWIDTH)


classes = []  # (name, unit, flops, bytes, seconds)
# matmuls: forward x W (2 FLOPs per multiply-add), backward dinp = dout W^T and dW = dout^T x (twice the
# forward); each operand read once and the output written once, in bf16
shapes = [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C)] * L + [(C, Vp)]
flops = bytes_moved = seconds = 0.0
for fan_in, fan_out in shapes:
    f = 2.0 * BT * fan_in * fan_out
    b = X * (BT * fan_in + fan_in * fan_out + BT * fan_out)
    seconds += 3 * timed(f, b, MATMUL_PEAK)
    flops += 3 * f
    bytes_moved += 3 * b
classes.append(("matmuls (cuBLASLt)", MATMUL_UNIT, flops, bytes_moved, seconds))
# attention: causal, so half of the T x T scores. Forward: S = Q K^T and O = P V, 2 matmuls of
# 2*T*T*HS/2 FLOPs per head. Backward: S recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q:
# 5 matmuls = 2.5 x forward. Bytes: q, k, v read, out and lse written (backward: also dout, out, lse, D
# read and dq, dk, dv written)
f = L * 2 * (B * NH * 2.0 * T * T * HS / 2)
b = L * (X * BT * 4 * C + 4 * B * NH * T)
unit, peak = attention_unit("attention forward")
classes.append(("attention forward", unit, f, b, timed(f, b, peak)))
f, b = 2.5 * f, L * (X * BT * 8 * C + 8 * B * NH * T)
unit, peak = attention_unit("attention backward")
classes.append(("attention backward", unit, f, b, timed(f, b, peak)))
# layernorm (2 per layer + the final one), each fused with a residual add: forward reads 2 rows and writes
# 2 (+ mean, rstd); backward reads dout, inp and the residual gradient and writes dinp
calls = 2 * L + 1
f = calls * 10.0 * BT * C * 3
b = calls * (X * BT * C * 4 + 8 * BT) + calls * (X * BT * C * 4 + 8 * BT)
classes.append(("layernorm + residual", "memory", f, b, timed(f, b, PEAK_FP32)))
# gelu on (BT, 4C): forward reads and writes once; backward reads inp and dout, writes dinp
f = L * 20.0 * BT * 4 * C * 2
b = L * X * BT * 4 * C * (2 + 3)
classes.append(("gelu", "memory", f, b, timed(f, b, PEAK_FP32)))
# classifier: softmax + cross-entropy + dlogits in place: the (BT, Vp) logits read once and written once
f = 8.0 * BT * Vp
b = 2 * X * BT * Vp
classes.append(("classifier (softmax + loss)", "memory", f, b, timed(f, b, PEAK_FP32)))
# AdamW: per parameter read bf16 param and grad, fp32 master, m, v; write all but the gradient;
# the gradient norm reads the gradients once more
f = 15.0 * N
b = N * (X + X + 4 + 4 + 4) + N * (X + 4 + 4 + 4) + N * X
classes.append(("adamw + gradient norm", "memory", f, b, timed(f, b, PEAK_FP32)))
# encoder: forward gathers wte and wpe rows and writes (BT, C); backward reads dout and adds it into the
# rows of dwte (read and written) and dwpe
f = 2.0 * BT * C
b = X * (BT * C * 2 + T * C) + X * (BT * C * 3 + T * C * 2)
classes.append(("encoder", "memory", f, b, timed(f, b, PEAK_FP32)))

step = sum(c[4] for c in classes)
model_flops = (6.0 * N + 12.0 * L * C * T) * BT  # llmc/planning/mfu.h's count (PaLM), for comparison with training logs
print(f"\nroofline: GPT-2 124M ({N:,} parameters), B={B}, T={T}, one {precision} training step on an H100 SXM")
print(f"  model: BF16 tensor cores {PEAK_TENSOR / 1e12:.0f} TFLOP/s dense, FP32 cores {PEAK_FP32 / 1e12:.0f} "
      f"TFLOP/s, HBM {BANDWIDTH / 1e12:.2f} TB/s; time = max(FLOPs / peak of the unit, bytes / bandwidth) per kernel;")
print(f"  forward + backward over {L} layers, FLOPs and bytes from the shapes (each tensor moved once, caches "
      f"ignored), attention causal (half the scores)")
print(f"  {'class':<28} {'unit':<37} {'GFLOP':>8} {'GB':>7} {'ms':>7} {'share':>6}")
for name, unit, f, b, s in classes:
    print(f"  {name:<28} {unit:<37} {f / 1e9:>8.0f} {b / 1e9:>7.2f} {s * 1e3:>7.2f} {100 * s / step:>5.1f}%")
print(f"  step: {step * 1e3:.1f} ms at best -> {BT / step:,.0f} tokens/s, MFU {100 * model_flops / step / MATMUL_PEAK:.0f}% "
      f"(model FLOPs 6N + 12LCT per token, as llmc/planning/mfu.h)")

# ----------------------------------------------------------------------------------------------------
# verdict: one check per kernel and architecture for spills, one per attention kernel for HMMA
failed = len(spills) + sum(len(kernels) for kernels in without_hmma.values()) + len(gqa_failures)
print("\nchecks: no kernel spills registers" + ("; every attention forward, dK/dV and dQ kernel issues HMMA "
                                                "(tensor cores), those of the grouped-query case included"
                                                if precision == "BF16" else " (FP32 build: no tensor-core check)"))
for spill in spills:
    print(f"  FAIL {spill}")
for (arch, family), kernels in sorted(without_hmma.items()):
    sizes = [re.search(r"<(\d+)>", k).group(1) for k, _ in kernels if re.search(r"<(\d+)>", k)]
    label = family + (f"<{','.join(sizes)}>" if sizes else "")
    ffma = [f for _, f in kernels]
    print(f"  FAIL sm_{arch} {label}: 0 HMMA in {len(kernels)} kernel(s), {min(ffma)}-{max(ffma)} FFMA each: "
          f"attention runs on the FP32 cores")
for failure in gqa_failures:
    print(f"  FAIL {failure}")
print(f"{passed} passed, {failed} failed")
if failed:
    reasons = []
    if spills: reasons.append(f"{len(spills)} kernel(s) spill registers")
    if without_hmma:
        reasons.append(f"{failed - len(spills) - len(gqa_failures)} attention kernel(s) have no HMMA (tensor-core) "
                       f"instructions")
    if gqa_failures:
        reasons.append("the grouped-query case does not run on tensor cores")
    print("error: kernel report: " + "; ".join(reasons), file=sys.stderr)
    sys.exit(1)
