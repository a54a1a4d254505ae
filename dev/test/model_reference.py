#!/usr/bin/python3
"""
GPT-2 and Llama 3 references in PyTorch: the answers test_gpt.cu checks the CUDA trainer against.

It builds (or loads) a model (--arch gpt2 or llama), runs a few training steps on one fixed batch in fp32
and writes
  - the model file (tensor-major, llm.c's layout), so the trainer starts from the very same weights;
  - the reference state: inputs, targets, the logits, loss and every gradient of the first step, and the
    loss and gradient norm of every step, so the trainer's forward, backward and AdamW can each be
    compared on their own.

The two models, written out in full so they can be read next to the CUDA kernels:

  GPT-2 (--arch gpt2)
    x      = wte[token] + wpe[position]                        embeddings, (B, T, C)
    for each of the L blocks:
        x  = x + attproj(attention(qkv(ln1(x))))               pre-LayerNorm: the residual stream x
        x  = x + fcproj(gelu(fc(ln2(x))))                      itself is never normalised
    logits = lnf(x) @ wte^T                                    the LM head is tied to the token embedding

  Llama 3 (--arch llama)
    x      = wte[token]                                        no position embedding: RoPE places tokens
    for each of the L blocks:
        x  = x + attproj(attention(rope(qkv(rmsnorm1(x)))))    no biases anywhere
        x  = x + fcproj(swiglu(fc(rmsnorm2(x))))
    logits = rmsnormf(x) @ lmhead^T                            an untied head, its own (Vp, C) tensor

  both: loss = mean over the B*T positions of -log softmax(logits[:V])[target]

  Mixture of experts (--experts E > 0, either architecture): the MLP of every N-th block (--moe-every N,
  default 1: of block l when l + 1 is divisible by N) becomes, on h = ln2(x) or rmsnorm2(x), for the B*T rows
  (row n = b*T + t):
    p, lse = softmax and logsumexp of h @ routerw^T            (E columns), in fp32
    e_0..e_K-1 = the K experts of largest p[n], in descending p, ties to the smaller index
    w_k    = p[n, e_k] / (p[n, e_0] + ... + p[n, e_K-1])       renormalised over the K chosen
    mlp(h) = shared(h) + sum over the kept k of w_k expert_{e_k}(h)
    expert_e(v) = expertprojw[e] @ act(expertfcw[e] @ v), act GPT-2's gelu or Llama's swiglu, H hidden units
                 (H = 4C for GPT-2, F for Llama); shared is one such MLP of S*H hidden units in fcw and
                 fcprojw (absent when S = 0). No MLP biases in an MoE block.
    the others : the blocks whose l + 1 is not divisible by N keep the dense MLP above (GPT-2's with its
                 biases), with no router and no router losses.
    capacity   : with --capacity-factor cf > 0, each expert keeps cap = ceil(cf T K / E) assignments per
                 sequence; visited in the order (t, then k), an assignment is dropped once cap of its
                 sequence's assignments to that expert were kept (the other weights stay as they are).
                 cf = 0: nothing is dropped.
  and the loss whose gradient training takes grows two router terms per MoE block:
    total = loss + alpha * sum over MoE blocks of aux + beta * sum over MoE blocks of zloss
    aux   = (1/B) sum_b E sum_e f[b,e] P[b,e]    f[b,e] the share of sequence b's T*K assignments routed
                                                 to e (before drops; a constant, no gradient), P[b,e] the
                                                 mean of p[b*T+t, e] over its T positions; 1 when balanced
    zloss = (1/(B*T)) sum_n lse[n]^2
  with alpha = --moe-aux-loss (0.01) and beta = --moe-z-loss (0.001). The loss reported for each step is
  the cross-entropy alone.

  layernorm(x) = (x - mean) / sqrt(var + 1e-5) * w + b         biased variance over the C channels
  rmsnorm(x)   = x / sqrt(mean(x^2) + eps) * w                 mean over the C channels; eps from the file
  gelu(x)      = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))      the tanh approximation GPT-2 used
  swiglu(gu)   = silu(gate) * up, silu(g) = g sigmoid(g)       gu's first F columns are the gate (fcw's rows
                                                               0..F-1), the next F the up projection
  attention    : each head has HS = C/NH channels. GPT-2: qkv is q, k, v (C channels each), NH heads each.
                 Llama, grouped-query: qkv is q (NH heads), then k (KVH heads), then v (KVH heads), and
                 query head h uses key/value head h // (NH/KVH). Per head softmax(q k^T / sqrt(HS)) with
                 position t seeing positions <= t, times v; heads concatenated back into NH*HS = C channels.
  rope         : every query and key head, adjacent pairs (x_2i, x_2i+1), i = 0..HS/2-1, turned by the angle
                 a = t f_i at position t (0-based):  (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a).
                 As llmc/kernels/rope.cuh computes them: f_i = theta^(-2i/HS) in float64 from the float32
                 theta, rounded once to float32; a = float32(t) * f_i, a float32 product; cos a and sin a
                 of that float32 angle (here in float64, then rounded to the model's precision).

The vocabulary is padded from V to Vp (a multiple of 128) so the LM head matmul has friendly shapes.
The padded rows of wte (and of Llama's lmhead) are zero, and their logits are left out of the softmax: they
are not tokens. So they get no gradient, weight decay keeps them at zero, and the logits written for
columns >= V are 0.

Initialisation: the matrices (wte, wpe, qkvw, fcw, lmhead, routerw, expertfcw) ~ N(0, 0.02), except the
projections that write into the residual stream (attprojw, fcprojw, expertprojw) ~ N(0, 0.02 / sqrt(2L)),
so the stream's variance does not grow with depth; biases 0, norm weights 1. Draws come from torch's CPU
generator seeded with --seed, tensor by tensor in model-file order, one draw for all the layers of a tensor
(their values one after the other, as the file holds them). Every parameter is then rounded to the
nearest bf16 value, so one model file is exact for both the FP32 and the BF16 trainer.

AdamW, per parameter w with gradient g at step t = 1, 2, ... (written out in AdamW.step below):
    g = g * min(1, max_norm / ||g||)   (only with --grad-clip > 0; ||g|| is the global norm of all grads)
    m = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
    w = w - lr * ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)
  weight decay only for the 2-D tensors: GPT-2's wte, wpe, qkvw, attprojw, fcw, fcprojw; Llama's wte,
  qkvw, attprojw, fcw, fcprojw, lmhead; and an MoE model's routerw, expertfcw, expertprojw (2-D per layer
  and per expert).

Files. Little-endian throughout; each starts with a header of 256 int32, the slots not listed are 0.

  GPT-2 model file                            Llama model file
  slot  value                                 slot  value
  [0]   magic 20240326                        [0]   magic 20241125
  [1]   version: 3 fp32 values, 5 bf16        [1]   version: 3 fp32 values, 5 bf16
  [2]   max_seq_len maxT                      [2]   max_seq_len maxT
  [3]   vocab_size V                          [3]   vocab_size V
  [4]   num_layers L                          [4]   num_layers L
  [5]   num_heads NH                          [5]   num_heads NH
  [6]   channels C                            [6]   channels C
  [7]   padded_vocab_size Vp                  [7]   padded_vocab_size Vp
                                              [8]   kv_heads KVH (NH a multiple of it)
                                              [9]   ffn_hidden F
                                              [10]  rope_theta, the bits of a float32
                                              [11]  norm_eps, the bits of a float32
  [12]  experts E (0: a dense model)          [12]  experts E (0: a dense model)
  [13]  experts_per_token K (0 if dense)      [13]  experts_per_token K (0 if dense)
  [14]  shared_experts S (0 if dense)         [14]  shared_experts S (0 if dense)
  [15]  moe_every N (0 if dense; 0 reads 1)   [15]  moe_every N (0 if dense; 0 reads 1)
  then the tensors, tensor-major (a tensor for all L layers, then the next), in this order:
  wte       (Vp, C)                           wte       (Vp, C)
  wpe       (maxT, C)                         ln1w      (L, C)
  ln1w ln1b (L, C)                            qkvw      (L, (NH + 2 KVH) HS, C)
  qkvw      (L, 3C, C)                        attprojw  (L, C, C)
  qkvb      (L, 3C)                           ln2w      (L, C)
  attprojw  (L, C, C)                         fcw       (L, 2F, C)             MoE: (L, 2SF, C)
  attprojb  (L, C)                            fcprojw   (L, C, F)              MoE: (L, C, SF)
  ln2w ln2b (L, C)                            routerw   (L, E, C)              MoE only
  fcw       (L, 4C, C)   MoE: (L, 4SC, C)     expertfcw (L, E, 2F, C)          MoE only
  fcb       (L, 4C)      dense only           expertprojw (L, E, C, F)         MoE only
  fcprojw   (L, C, 4C)   MoE: (L, C, 4SC)     lnfw      (C)
  fcprojb   (L, C)       dense only           lmhead    (Vp, C)
  routerw   (L, E, C)          MoE only
  expertfcw (L, E, 4C, C)      MoE only
  expertprojw (L, E, C, 4C)    MoE only
  lnfw lnfb (C)
  (L, ...) is one instance per layer l = 0..L-1, each of the shape after "MoE:" in an MoE block. An instance
  of 0 elements is absent: an MoE block has no fcb and fcprojb, and with S = 0 no fcw and fcprojw either;
  a dense block (all of a dense model's, and in an MoE model those with l + 1 not divisible by N) has none
  of the MoE tensors. So with L = 2 and N = 2, GPT-2's fcw is layer 0's (4C, C) then layer 1's (4SC, C),
  fcb and fcprojb are layer 0's alone, and routerw, expertfcw and expertprojw layer 1's alone. Llama's fcw
  and expertfcw rows are [gate; up], each half SF (or F) rows.
  Version 3 stores each value as a float32, version 5 as a bf16 (the top 16 bits of the float32).

  Reference state file (both architectures; the model file beside it gives the shape)
  slot     value
  [0]      magic 20240327
  [1]      version 3
  [2] [3]  B, T
  [4]      the number of steps
  [5..10]  the bits of float32 learning rate, beta1, beta2, eps, weight decay, grad clip
  [11]     the magic of the model file this state belongs to (20240326 GPT-2, 20241125 Llama)
  [12]     P, the number of parameters (the gradient floats below)
  [13..15] the bits of float32 alpha (--moe-aux-loss), beta (--moe-z-loss), capacity factor (0: dropless)
  then inputs (B, T) int32, targets (B, T) int32, logits (B, T, Vp) float32, the loss (1 float32, the
  cross-entropy), the first forward's router numbers: aux loss and z loss (1 float32 each, summed over the
  MoE blocks without alpha and beta; 0 and 0 for a dense model), the routed counts (L*E int32, per layer per
  expert, summed over the batch's sequences, before drops; zero rows for the dense blocks, none for a dense
  model) and the dropped assignments summed over the MoE blocks (1 int32); then the first step's gradients
  (P float32, the model file's tensors in its order and shapes, the gradients of the total), the losses of
  the steps (one float32 each) and their gradient norms before clipping (one float32 each).

Run with Debian's Python (/usr/bin/python3, packages python3-torch python3-numpy libopenblas0).
"""

import argparse
import math
import os
import struct
import sys
import tempfile
import time

GPT2_MAGIC = 20240326
LLAMA_MAGIC = 20241125
STATE_MAGIC = 20240327
STATE_VERSION = 3
SHARD_MAGIC = 20240520
HEADER_INTS = 256

CONFIGS = {
    "small": dict(arch="gpt2", layers=2, heads=4, channels=64, vocab=500, max_seq_len=64,
                  batch_size=3, seq_len=37, learning_rate=1e-3),
    "124M": dict(arch="gpt2", layers=12, heads=12, channels=768, vocab=50257, max_seq_len=1024,
                 batch_size=4, seq_len=64, learning_rate=1e-4),
    # head size 16, two query heads per key/value head; F = 96, a multiple of 32 (the SwiGLU kernel reads
    # its rows in 16-byte chunks)
    "llama_small": dict(arch="llama", layers=2, heads=4, kv_heads=2, channels=64, ffn_hidden=96, vocab=500,
                        max_seq_len=64, rope_theta=500000.0, norm_eps=1e-5,
                        batch_size=3, seq_len=37, learning_rate=1e-3),
    # Llama 3's proportions at GPT-2's width: head size 64, three query heads per key/value head,
    # F = 8/3 C. The untied head doubles the 38.6M of the embedding, so 4 blocks make ~100M parameters.
    "llama_100M": dict(arch="llama", layers=4, heads=12, kv_heads=4, channels=768, ffn_hidden=2048,
                       vocab=50257, max_seq_len=1024, rope_theta=500000.0, norm_eps=1e-5,
                       batch_size=4, seq_len=64, learning_rate=1e-4),
    # the small shapes with a mixture-of-experts MLP: 4 experts, 2 per token, 1 shared expert
    "moe_small": dict(arch="gpt2", layers=2, heads=4, channels=64, vocab=500, max_seq_len=64,
                      experts=4, experts_per_token=2, shared_experts=1,
                      batch_size=3, seq_len=37, learning_rate=1e-3),
    "llama_moe_small": dict(arch="llama", layers=2, heads=4, kv_heads=2, channels=64, ffn_hidden=96, vocab=500,
                            max_seq_len=64, rope_theta=500000.0, norm_eps=1e-5,
                            experts=4, experts_per_token=2, shared_experts=1,
                            batch_size=3, seq_len=37, learning_rate=1e-3),
}
DEFAULT_CONFIG = {"gpt2": "small", "llama": "llama_small"}
# the mixture-of-experts shape, for both architectures, and its value where a preset lacks the key: a preset
# without them is dense (0 experts), and an MoE preset without moe_every has experts in every block
MOE_DEFAULTS = dict(experts=0, experts_per_token=0, shared_experts=0, moe_every=1)
MOE_KEYS = tuple(MOE_DEFAULTS)
SHAPE_KEYS = {"gpt2": ("layers", "heads", "channels", "vocab", "max_seq_len") + MOE_KEYS,
              "llama": ("layers", "heads", "kv_heads", "channels", "ffn_hidden", "vocab", "max_seq_len",
                        "rope_theta", "norm_eps") + MOE_KEYS}

def moe_block(config, l):
    """Whether block l (0-based) has the mixture-of-experts MLP: in an MoE model every N-th block, those with
    l + 1 divisible by N (all of them for N = 1); the other blocks are the dense model's."""
    return config["E"] > 0 and (l + 1) % config["N"] == 0


# The parameter tensors in model-file order, one entry per tensor of the file: "wte", or "qkvw.3" for
# layer 3 of qkvw, each layer's own shape (in terms of C channels, Vp padded vocab, maxT positions (GPT-2),
# KVH key/value heads and F hidden units (Llama), and E experts and S shared experts of H hidden units each
# (MoE)), tensor-major: a tensor's layers 0..L-1, then the next tensor. An MoE block's MLP differs from a
# dense block's, so a tensor's layers need not share a shape. A layer's tensor of 0 elements is absent from
# the file, so it is left out here: an MoE block's MLP biases, its fcw and fcprojw when S = 0, and all the
# MoE tensors of a dense block.
def parameter_shapes(config):
    L, C, Vp, E = config["L"], config["C"], config["Vp"], config["E"]
    if config["arch"] == "gpt2":
        H = 4 * C                                  # hidden units of an expert (of the dense MLP)

        def block(moe):
            D = config["S"] * H if moe else H      # hidden units of fcw/fcprojw: the shared experts if MoE
            bias = 0 if moe else 1                 # MoE blocks have no MLP biases
            experts = E if moe else 0
            return [("ln1w", (C,)), ("ln1b", (C,)),
                    ("qkvw", (3 * C, C)), ("qkvb", (3 * C,)),
                    ("attprojw", (C, C)), ("attprojb", (C,)),
                    ("ln2w", (C,)), ("ln2b", (C,)),
                    ("fcw", (D, C)), ("fcb", (bias * D,)),
                    ("fcprojw", (C, D)), ("fcprojb", (bias * C,)),
                    ("routerw", (experts, C)), ("expertfcw", (experts, H, C)), ("expertprojw", (experts, C, H))]
        before, after = [("wte", (Vp, C)), ("wpe", (config["maxT"], C))], [("lnfw", (C,)), ("lnfb", (C,))]
    else:
        H = config["F"]
        HS = C // config["NH"]

        def block(moe):
            D = config["S"] * H if moe else H
            experts = E if moe else 0
            return [("ln1w", (C,)),
                    ("qkvw", ((config["NH"] + 2 * config["KVH"]) * HS, C)),
                    ("attprojw", (C, C)),
                    ("ln2w", (C,)),
                    ("fcw", (2 * D, C)),           # SwiGLU: D gate rows, then D up rows
                    ("fcprojw", (C, D)),
                    ("routerw", (experts, C)), ("expertfcw", (experts, 2 * H, C)),
                    ("expertprojw", (experts, C, H))]
        before, after = [("wte", (Vp, C))], [("lnfw", (C,)), ("lmhead", (Vp, C))]
    blocks = [block(moe_block(config, l)) for l in range(L)]
    layered = [(f"{name}.{l}", blocks[l][i][1]) for i, (name, _) in enumerate(blocks[0]) for l in range(L)]
    return [(name, shape) for name, shape in before + layered + after if math.prod(shape) > 0]


def tensor_name(name):
    """The file tensor of a parameter_shapes entry: "qkvw" for "qkvw.3"."""
    return name.split(".")[0]


# The 2-D tensors, which get weight decay (wpe is GPT-2's only, lmhead Llama's only; the expert tensors
# are 2-D per layer and expert).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw", "lmhead", "routerw", "expertfcw", "expertprojw"}
NORM_WEIGHTS = {"ln1w", "ln2w", "lnfw"}
RESIDUAL_PROJECTIONS = {"attprojw", "fcprojw", "expertprojw"}


def fail(message):
    """Every bad input ends here: one line naming the problem, exit status 1."""
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def padded_vocab(V):
    return (V + 127) // 128 * 128


def as_float32(value):
    """The float32 nearest to value, as a Python float: theta and eps travel as float32 in the model file,
    so the config holds exactly what a file round trip gives back."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def gpt2_config(L, NH, C, V, maxT, Vp=None, E=0, K=0, S=0, N=1):
    """E experts, K of them per token, S shared experts, in every N-th block: E = 0 is the dense model."""
    return dict(arch="gpt2", L=L, NH=NH, C=C, V=V, Vp=Vp if Vp is not None else padded_vocab(V), maxT=maxT,
                E=E, K=K, S=S, N=N)


def llama_config(L, NH, KVH, C, F, V, maxT, theta=500000.0, eps=1e-5, Vp=None, E=0, K=0, S=0, N=1):
    return dict(arch="llama", L=L, NH=NH, KVH=KVH, C=C, F=F, V=V, Vp=Vp if Vp is not None else padded_vocab(V),
                maxT=maxT, theta=as_float32(theta), eps=as_float32(eps), E=E, K=K, S=S, N=N)


def config_from(shape):
    """A model config from a dict with the flag names of SHAPE_KEYS (a preset, or the parsed arguments)."""
    s = shape if isinstance(shape, dict) else vars(shape)
    E, K, S, N = (s.get(key, default) for key, default in MOE_DEFAULTS.items())
    if s["arch"] == "gpt2":
        return gpt2_config(s["layers"], s["heads"], s["channels"], s["vocab"], s["max_seq_len"], E=E, K=K, S=S,
                           N=N)
    return llama_config(s["layers"], s["heads"], s["kv_heads"], s["channels"], s["ffn_hidden"], s["vocab"],
                        s["max_seq_len"], s["rope_theta"], s["norm_eps"], E=E, K=K, S=S, N=N)


def shape_problem(config):
    """What makes this shape one the models (and the CUDA kernels) cannot take, or None."""
    c = config
    if min(c["L"], c["NH"], c["C"], c["V"], c["Vp"], c["maxT"]) <= 0 or c["Vp"] < c["V"]:
        return "sizes must be positive and Vp >= V"
    if c["C"] % c["NH"] != 0:
        return f"channels {c['C']} is not divisible by heads {c['NH']}"
    if c["arch"] == "llama":
        if c["KVH"] <= 0 or c["NH"] % c["KVH"] != 0:
            return f"heads {c['NH']} is not a multiple of kv_heads {c['KVH']}"
        if (c["C"] // c["NH"]) % 2 != 0:
            return f"the head size {c['C'] // c['NH']} is odd: RoPE turns pairs of channels"
        if c["F"] <= 0:
            return f"ffn_hidden {c['F']} must be positive"
        if not c["theta"] > 1.0:      # also refuses NaN
            return f"rope_theta {c['theta']} must exceed 1"
        if not c["eps"] > 0.0:
            return f"norm_eps {c['eps']} must be positive"
    E, K, S, N = c["E"], c["K"], c["S"], c["N"]
    if E < 0 or S < 0:
        return f"experts {E} and shared_experts {S} must not be negative"
    if E == 0 and (K != 0 or S != 0):
        return f"a dense model (experts 0) has no experts_per_token ({K}) or shared_experts ({S})"
    if E == 0 and N != 1:
        return f"a dense model (experts 0) has no moe_every ({N}): it has no mixture-of-experts blocks"
    if E > 0 and not 1 <= K <= E:
        return f"experts_per_token {K} must be between 1 and experts {E}"
    if E > 0 and not 1 <= N <= c["L"]:
        return f"moe_every {N} must be between 1 and layers {c['L']} (at least one block with experts)"
    return None


def describe(config):
    c = config
    text = f"L={c['L']} NH={c['NH']} "
    if c["arch"] == "llama":
        text += f"KVH={c['KVH']} "
    text += f"C={c['C']} "
    if c["arch"] == "llama":
        text += f"F={c['F']} "
    text += f"V={c['V']} Vp={c['Vp']} maxT={c['maxT']}"
    if c["arch"] == "llama":
        text += f" theta={c['theta']:g} eps={c['eps']:g}"
    if c["E"]:
        text += f" E={c['E']} K={c['K']} S={c['S']}"
        if c["N"] > 1:
            text += f" moe_every={c['N']}"
    return ("GPT-2 " if c["arch"] == "gpt2" else "Llama ") + text


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="GPT-2 or Llama 3 in PyTorch (fp32): writes a model file and the reference state that "
                    "test_gpt compares the CUDA trainer against, and times training steps for the CPU "
                    "benchmark.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
examples:
  /usr/bin/python3 dev/test/model_reference.py --config small --model-out small.bin --state-out small_state.bin
  /usr/bin/python3 dev/test/model_reference.py --config 124M --tokens data/train_000000.bin \\
      --model-out gpt2_124M.bin --state-out gpt2_124M_state.bin
  /usr/bin/python3 dev/test/model_reference.py --config llama_small --model-out llama_small.bin \\
      --state-out llama_small_state.bin
  /usr/bin/python3 dev/test/model_reference.py --arch llama --layers 3 --kv-heads 1 --steps 2
  /usr/bin/python3 dev/test/model_reference.py --config moe_small --capacity-factor 1.0 \\
      --model-out moe_small.bin --state-out moe_small_state.bin
  /usr/bin/python3 dev/test/model_reference.py --arch llama --experts 8 --experts-per-token 2 --steps 2
  /usr/bin/python3 dev/test/model_reference.py --config moe_small --layers 4 --moe-every 2 --steps 2
  /usr/bin/python3 dev/test/model_reference.py --model gpt2_124M.bin --steps 0 --bench 5
  /usr/bin/python3 dev/test/model_reference.py --self-check

CPU speed: the best setting measured on 2 cores is OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE, plus
OPENBLAS_CORETYPE=SkylakeX on CPUs with AVX-512 (/proc/cpuinfo lists avx512f; OpenBLAS 0.3.21 does not
recognise some of them and falls back to a kernel ~5x slower; never set it on a CPU without AVX-512).
This script sets OMP_WAIT_POLICY=PASSIVE, and OPENBLAS_CORETYPE=SkylakeX when avx512f is present,
whenever they are not already in the environment; torch uses OMP_NUM_THREADS threads (default 2).""")
    model = parser.add_argument_group("model")
    model.add_argument("--arch", choices=["gpt2", "llama"],
                       help="the model: gpt2 (default) or llama; implied by --config and by --model's file")
    model.add_argument("--config", choices=sorted(CONFIGS), default=None,
                       help="preset shape: small (GPT-2, L=2, NH=4, C=64, V=500, maxT=64), 124M (GPT-2, "
                            "L=12, NH=12, C=768, V=50257, maxT=1024), llama_small (L=2, NH=4, KVH=2, C=64, "
                            "F=96, V=500, maxT=64), llama_100M (L=4, NH=12, KVH=4, C=768, F=2048, V=50257, "
                            "maxT=1024), moe_small and llama_moe_small (small and llama_small with E=4 "
                            "experts, K=2 per token, S=1 shared); default small, or llama_small with "
                            "--arch llama")
    model.add_argument("--layers", type=int, help="number of blocks L (overrides --config)")
    model.add_argument("--heads", type=int, help="attention heads NH (overrides --config)")
    model.add_argument("--channels", type=int, help="channels C (overrides --config)")
    model.add_argument("--vocab", type=int, help="vocabulary size V; padded to a multiple of 128")
    model.add_argument("--max-seq-len", type=int, help="longest sequence, maxT (GPT-2: positions in wpe)")
    model.add_argument("--kv-heads", type=int, help="Llama: key/value heads KVH, dividing NH")
    model.add_argument("--ffn-hidden", type=int, help="Llama: hidden units F of the SwiGLU MLP")
    model.add_argument("--rope-theta", type=float, help="Llama: RoPE's base theta (default 500000)")
    model.add_argument("--norm-eps", type=float, help="Llama: RMSNorm's epsilon (default 1e-5)")
    model.add_argument("--experts", type=int, metavar="E",
                       help="mixture of experts: E routed experts in the MLP of every block, or of every N-th "
                            "with --moe-every (default 0: the dense MLP)")
    model.add_argument("--experts-per-token", type=int, metavar="K",
                       help="MoE: the K experts each token is routed to")
    model.add_argument("--shared-experts", type=int, metavar="S",
                       help="MoE: S shared experts every token goes through, one MLP of S*H hidden units")
    model.add_argument("--moe-every", type=int, metavar="N",
                       help="every N-th block's MLP is a mixture of experts, the others dense; default 1")
    model.add_argument("--model", metavar="PATH",
                       help="load this model file (either architecture, version 3 fp32 or 5 bf16) instead "
                            "of creating one")
    model.add_argument("--seed", type=int, default=1337,
                       help="seed of the initialisation and of the random batch (default 1337)")
    model.add_argument("--model-out", metavar="PATH", help="write the model file here")
    model.add_argument("--model-dtype", choices=["fp32", "bf16"], default="fp32",
                       help="parameters in --model-out: fp32 (version 3, default) or bf16 (version 5); "
                            "both hold the same values after the bf16 rounding")
    batch = parser.add_argument_group("batch")
    batch.add_argument("--batch-size", type=int, help="B (default 3 for the small configs, 4 for the others)")
    batch.add_argument("--seq-len", type=int, help="T (default 37 for the small configs, 64 for the others)")
    batch.add_argument("--tokens", metavar="SHARD",
                       help="take the batch from the start of this token shard: inputs[b,t] = "
                            "tokens[b*T+t], targets[b,t] = tokens[b*T+t+1]; default: random ids in [0, V)")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=10, help="training steps on the batch (default 10)")
    train.add_argument("--learning-rate", type=float,
                       help="AdamW learning rate (default 1e-3 for the small configs, 1e-4 otherwise)")
    train.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1 (default 0.9)")
    train.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2 (default 0.95)")
    train.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon (default 1e-8)")
    train.add_argument("--weight-decay", type=float, default=0.1,
                       help="decoupled weight decay of the 2-D tensors (default 0.1)")
    train.add_argument("--grad-clip", type=float, default=0.0,
                       help="clip the global gradient norm to this (default 0 = no clipping)")
    train.add_argument("--moe-aux-loss", type=float, default=0.01, metavar="ALPHA",
                       help="MoE: weight of the load-balancing loss in the total (default 0.01)")
    train.add_argument("--moe-z-loss", type=float, default=0.001, metavar="BETA",
                       help="MoE: weight of the router z-loss in the total (default 0.001)")
    train.add_argument("--capacity-factor", type=float, default=0.0, metavar="CF",
                       help="MoE: each expert keeps ceil(CF T K / E) assignments per sequence, the rest are "
                            "dropped (default 0: dropless)")
    output = parser.add_argument_group("output")
    output.add_argument("--state-out", metavar="PATH", help="write the reference state file here")
    output.add_argument("--bench", type=int, default=0, metavar="N",
                        help="also time N training steps (forward, backward, AdamW) at this shape")
    output.add_argument("--self-check", action="store_true",
                        help="check this script's own math (attention, RoPE, both models with and without "
                             "experts against naive float64 versions, finite-difference gradients, the MoE "
                             "layer's routing, capacity and losses, AdamW, file round trips); exits non-zero "
                             "on any failure")
    args = parser.parse_args(argv)

    llama_only = ("kv_heads", "ffn_hidden", "rope_theta", "norm_eps")
    explicit = [k for k in SHAPE_KEYS["llama"] if getattr(args, k) is not None]
    if args.model and (explicit or args.config or args.arch):
        fail("--model takes the architecture and shape from the file: do not combine it with --arch, "
             "--config or the shape flags (--layers, --heads, --experts, ...)")
    if args.config and args.arch and CONFIGS[args.config]["arch"] != args.arch:
        fail(f"--config {args.config} is a {CONFIGS[args.config]['arch']} shape, not --arch {args.arch}")
    for key in ("layers", "heads", "channels", "vocab", "max_seq_len", "kv_heads", "ffn_hidden", "batch_size",
                "seq_len"):
        if getattr(args, key) is not None and getattr(args, key) <= 0:
            fail(f"--{key.replace('_', '-')} must be positive, not {getattr(args, key)}")
    if not args.model:
        preset = CONFIGS[args.config or DEFAULT_CONFIG[args.arch or "gpt2"]]
        args.arch = preset["arch"]
        if args.arch == "gpt2" and any(k in explicit for k in llama_only):
            fail("--kv-heads, --ffn-hidden, --rope-theta and --norm-eps are Llama's: add --arch llama")
        for key in SHAPE_KEYS[args.arch]:
            if getattr(args, key) is None:
                setattr(args, key, preset.get(key, MOE_DEFAULTS[key]) if key in MOE_KEYS else preset[key])
        problem = shape_problem(config_from(args))
        if problem:
            fail(problem)
    if args.steps < 0 or args.bench < 0:
        fail("--steps and --bench must not be negative")
    if args.state_out and args.steps < 1:
        fail("--state-out needs at least one step (--steps >= 1)")
    if args.grad_clip < 0:
        fail("--grad-clip must be >= 0")
    for key in ("moe_aux_loss", "moe_z_loss", "capacity_factor"):
        if not (math.isfinite(getattr(args, key)) and getattr(args, key) >= 0):
            fail(f"--{key.replace('_', '-')} must be a finite number >= 0, not {getattr(args, key)}")
    return args


def tune_cpu_environment():
    """OpenBLAS and OpenMP read these when torch loads them, so this must run before `import torch`."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "OPENBLAS_CORETYPE" not in os.environ:
        try:
            with open("/proc/cpuinfo") as f:
                if " avx512f" in f.read():
                    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------------
# the pieces of the models

def layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def swiglu(gate_up):
    """(..., 2F) -> (..., F): the gate is the first F columns, the up projection the last F."""
    gate, up = gate_up.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def causal_attention(q, k, v):
    """q (B, NH, T, HS), k and v (B, KVH, T, HS) with NH a multiple of KVH -> (B, NH, T, HS). Query head h
    reads key/value head h // (NH / KVH): consecutive query heads share one (repeat_interleave)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    T, HS = q.shape[2], q.shape[3]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))     # (B, NH, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def causal_self_attention(qkv, NH):
    """GPT-2's: qkv (B, T, 3C) -> (B, T, C). q, k, v are the three C-wide thirds; head h owns channels
    h*HS .. h*HS+HS-1 of each."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))   # (B, NH, T, HS)
    return causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)


def rope_angles(T, HS, theta):
    """The angles (T, HS/2) as llmc/kernels/rope.cuh computes them, so that the fp32 comparison is tight:
    f_i = theta^(-2i/HS) in float64 (theta the float32 of the model file) rounded once to float32, and the
    angle the float32 product float32(t) * f_i. At T ~ 1000 a float64 angle would differ by ~1e-4."""
    frequencies = torch.tensor([theta ** (-2.0 * i / HS) for i in range(HS // 2)],
                               dtype=torch.float64).to(torch.float32)
    return torch.arange(T, dtype=torch.float32).unsqueeze(1) * frequencies


def rope_tables(T, HS, theta, dtype):
    """cos and sin of rope_angles, computed in float64 and rounded to dtype (the kernel's sincosf is
    within an ulp or two of the rounded value)."""
    angles = rope_angles(T, HS, theta).double()
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope(x, cos, sin):
    """x (B, T, H, HS), each head's adjacent pairs (x_2i, x_2i+1) turned by the angle of (t, i)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos[:, None, :], sin[:, None, :]                       # broadcast over the heads
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def grouped_query_attention(qkv, NH, KVH, cos, sin):
    """Llama's: qkv (B, T, (NH + 2 KVH) HS) -> (B, T, NH HS). RoPE turns the query and key heads."""
    B, T, width = qkv.shape
    HS = width // (NH + 2 * KVH)
    q, k, v = qkv.split([NH * HS, KVH * HS, KVH * HS], dim=2)
    q = rope(q.view(B, T, NH, HS), cos, sin).transpose(1, 2)        # (B, NH, T, HS)
    k = rope(k.view(B, T, KVH, HS), cos, sin).transpose(1, 2)       # (B, KVH, T, HS)
    v = v.view(B, T, KVH, HS).transpose(1, 2)
    return causal_attention(q, k, v).transpose(1, 2).reshape(B, T, NH * HS)


# ----------------------------------------------------------------------------------------------------
# the mixture-of-experts MLP

def route(z, K):
    """The router on its logits z (N, E): p = softmax(z) and lse = logsumexp(z) in fp32 (a float64 z stays
    float64), each row's K experts (N, K) in descending p with ties to the smaller index, and their weights
    p / (sum of the K chosen p). torch.topk does not promise an order for equal values, so the rule is
    spelled out: a stable ascending sort of -p keeps equal values in index order."""
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    p = torch.softmax(z, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    experts = torch.sort(-p.detach(), dim=-1, stable=True).indices[:, :K]
    chosen = p.gather(1, experts)
    return p, lse, experts, chosen / chosen.sum(dim=1, keepdim=True)


def capacity(cf, T, K, E):
    """The assignments an expert keeps per sequence, ceil(cf T K / E), cf taken as the float32 that the
    state file stores, the ceiling of the exact quotient: cf * T * K is exact in float64, and a quotient
    that is not an integer lies at least ulp(cf) / E from one, far beyond float64's rounding of it (for any
    T K below 2^29). Float32 arithmetic could give one less: cf = 1.1, T = 10, K = 1, E = 11 is exactly
    1.0000000217, but 1.0 in float32."""
    return math.ceil(as_float32(cf) * T * K / E)


def kept_assignments(experts, B, T, E, cf):
    """(N, K) bools: which of experts' (N, K) assignments the capacity keeps (all of them with cf = 0).
    Within a sequence, visited in the order (t, then k), an assignment to e is dropped once cap of the
    sequence's assignments to e were kept, that is when cap or more came before it (those before were kept
    up to cap)."""
    N, K = experts.shape
    if cf == 0:
        return torch.ones(N, K, dtype=torch.bool)
    onehot = torch.nn.functional.one_hot(experts.reshape(B, T * K), E)      # (B, T*K, E), (t, k) order
    before = ((onehot.cumsum(dim=1) - onehot) * onehot).sum(dim=2)         # earlier ones to the same expert
    return (before < capacity(cf, T, K, E)).reshape(N, K)


def balance_loss(p, experts, B, T, E):
    """The sequence-wise load-balancing loss (1/B) sum_b E sum_e f[b,e] P[b,e] and the routed counts (B, E).
    f[b,e] = routed[b,e] / (T K), the share of sequence b's assignments that went to e before any drop, is
    a count: it carries no gradient. P[b,e] is the mean of p[., e] over the sequence's T rows."""
    K = experts.shape[1]
    routed = torch.nn.functional.one_hot(experts.reshape(B, T * K), E).sum(dim=1)          # (B, E)
    f = routed.to(p.dtype) / (T * K)
    P = p.reshape(B, T, E).mean(dim=1)
    return (E * (f * P).sum(dim=1)).mean(), routed


def moe_mlp(h, w, l, config, capacity_factor):
    """Block l's mixture-of-experts MLP on h (B, T, C), w from trainable(). Returns mlp(h) (B, T, C) and the
    layer's router numbers: aux and z (the two losses, tensors with gradients), routed (E,) (the
    assignments per expert over all sequences, before drops) and dropped (the dropped assignments)."""
    B, T, C = h.shape
    E, K, S = config["E"], config["K"], config["S"]
    linear = torch.nn.functional.linear
    act = gelu_tanh if config["arch"] == "gpt2" else swiglu
    rows = h.reshape(B * T, C)                                                  # row n = b*T + t
    p, lse, experts, weights = route(linear(rows, w[f"routerw.{l}"]), K)
    kept = kept_assignments(experts, B, T, E, capacity_factor)
    if S:
        out = linear(act(linear(rows, w[f"fcw.{l}"])), w[f"fcprojw.{l}"])       # the shared experts
    else:
        out = torch.zeros_like(rows)
    for e in range(E):
        n, k = torch.nonzero((experts == e) & kept, as_tuple=True)    # the rows e serves, in which slot
        y = linear(act(linear(rows.index_select(0, n), w[f"expertfcw.{l}"][e])), w[f"expertprojw.{l}"][e])
        out = out.index_add(0, n, weights[n, k].unsqueeze(1).to(y.dtype) * y)
    aux, routed = balance_loss(p, experts, B, T, E)
    return out.reshape(B, T, C), dict(aux=aux, z=lse.square().mean(), routed=routed.sum(dim=0),
                                      dropped=int((~kept).sum()))


def router_summary(layers):
    """The router numbers of all layers (each block's, None for a dense block) as training and the state
    file use them: aux and z summed over the MoE blocks (tensors), routed (L, E) with zero rows for the
    dense blocks, and dropped summed over the MoE blocks. None for a dense model."""
    moe = [r for r in layers if r is not None]
    if not moe:
        return None
    none_routed = torch.zeros_like(moe[0]["routed"])
    return dict(aux=sum(r["aux"] for r in moe), z=sum(r["z"] for r in moe),
                routed=torch.stack([none_routed if r is None else r["routed"] for r in layers]),
                dropped=sum(r["dropped"] for r in moe))


class MoeTraining:
    """The training options of an MoE model, as float32 like the state file holds them: alpha and beta
    weigh the aux and z losses in the total, capacity_factor > 0 caps each expert per sequence (0: no
    drops). A dense model has no use for them."""

    def __init__(self, alpha=0.01, beta=0.001, capacity_factor=0.0):
        self.alpha, self.beta = as_float32(alpha), as_float32(beta)
        self.capacity_factor = as_float32(capacity_factor)

    def total(self, loss, router):
        """What training differentiates: the cross-entropy plus alpha times the aux losses and beta times the
        z-losses of all MoE blocks (just the cross-entropy for a dense model)."""
        return loss if router is None else loss + self.alpha * router["aux"] + self.beta * router["z"]


# ----------------------------------------------------------------------------------------------------
# the models

def trainable(params):
    """The tensors autograd and AdamW work on, under params' names ("qkvw.3" is layer 3 of qkvw). Each
    shares memory with params, so an update to one is an update to the other, and each gets its own
    gradient."""
    return {name: tensor.detach().requires_grad_(True) for name, tensor in params.items()}


def forward(w, config, inputs, targets, capacity_factor=0.0):
    """w from trainable(). Returns the logits over all Vp columns, the mean cross-entropy over the first V
    columns, the looked-up token embeddings that backward() needs, and an MoE model's router numbers
    (router_summary; None for a dense model)."""
    L, NH, V = config["L"], config["NH"], config["V"]
    layers = []                     # each block's router numbers, None for a dense block
    B, T = inputs.shape
    # The token lookup is kept out of autograd: its backward would zero-fill a second (Vp, C) gradient
    # every step and add it to the LM head's. backward() scatters into wte.grad in place instead.
    token_embeddings = w["wte"].detach()[inputs].requires_grad_(True)
    linear = torch.nn.functional.linear
    if config["arch"] == "gpt2":
        x = token_embeddings + w["wpe"][:T]
        for l in range(L):
            h = layernorm(x, w[f"ln1w.{l}"], w[f"ln1b.{l}"])
            y = causal_self_attention(linear(h, w[f"qkvw.{l}"], w[f"qkvb.{l}"]), NH)
            x = x + linear(y, w[f"attprojw.{l}"], w[f"attprojb.{l}"])
            h = layernorm(x, w[f"ln2w.{l}"], w[f"ln2b.{l}"])
            if moe_block(config, l):
                y, router = moe_mlp(h, w, l, config, capacity_factor)
                layers.append(router)
                x = x + y
            else:
                layers.append(None)
                h = gelu_tanh(linear(h, w[f"fcw.{l}"], w[f"fcb.{l}"]))
                x = x + linear(h, w[f"fcprojw.{l}"], w[f"fcprojb.{l}"])
        logits = layernorm(x, w["lnfw"], w["lnfb"]) @ w["wte"].t()             # (B, T, Vp)
    else:
        eps = config["eps"]
        cos, sin = rope_tables(T, config["C"] // NH, config["theta"], w["wte"].dtype)
        x = token_embeddings
        for l in range(L):
            h = rmsnorm(x, w[f"ln1w.{l}"], eps)
            y = grouped_query_attention(linear(h, w[f"qkvw.{l}"]), NH, config["KVH"], cos, sin)
            x = x + linear(y, w[f"attprojw.{l}"])
            h = rmsnorm(x, w[f"ln2w.{l}"], eps)
            if moe_block(config, l):
                y, router = moe_mlp(h, w, l, config, capacity_factor)
                layers.append(router)
                x = x + y
            else:
                layers.append(None)
                h = swiglu(linear(h, w[f"fcw.{l}"]))
                x = x + linear(h, w[f"fcprojw.{l}"])
        logits = rmsnorm(x, w["lnfw"], eps) @ w["lmhead"].t()                  # (B, T, Vp)
    # the padded columns are not tokens: they take no part in the softmax
    loss = torch.nn.functional.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))
    return logits, loss, token_embeddings, router_summary(layers)


def backward(w, loss, token_embeddings, inputs):
    """Gradients of loss (for an MoE model the total) into w[...].grad. wte's is, for each position, the
    gradient of its token's embedding added to that token's row, plus (GPT-2, whose head is tied) the LM
    head's from autograd."""
    loss.backward()
    wte = w["wte"]
    if wte.grad is None:            # Llama: only the lookup reads wte
        wte.grad = torch.zeros_like(wte)
    wte.grad.index_add_(0, inputs.reshape(-1), token_embeddings.grad.reshape(-1, wte.shape[1]))


def file_grads(w):
    """The gradients of w = trainable(params), under the names and in the order of the model file."""
    return {name: tensor.grad for name, tensor in w.items()}


def init_params(config, seed, dtype):
    """The parameters under parameter_shapes' names. All the layers of a tensor come from one draw, their
    values one after the other as in the file: for layers of one shape, value for value the draw of the
    stacked (L, ...) tensor, whatever shapes the layers of other tensors have."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * config["L"])
    shapes = parameter_shapes(config)
    params = {}
    for tensor in dict.fromkeys(tensor_name(name) for name, _ in shapes):
        layers = [(name, shape) for name, shape in shapes if tensor_name(name) == tensor]
        sizes = [math.prod(shape) for _, shape in layers]
        if tensor in NORM_WEIGHTS:
            values = torch.ones(sum(sizes), dtype=torch.float32)
        elif tensor in DECAYED:
            std = residual_std if tensor in RESIDUAL_PROJECTIONS else 0.02
            values = torch.empty(sum(sizes), dtype=torch.float32).normal_(0.0, std, generator=generator)
        else:
            values = torch.zeros(sum(sizes), dtype=torch.float32)
        # one file for both trainers: every value exactly representable in bf16
        values = values.to(torch.bfloat16).to(torch.float32)
        for (name, shape), piece in zip(layers, values.split(sizes)):
            params[name] = piece.view(shape)
    for name in ("wte", "lmhead"):
        if name in params:
            params[name][config["V"]:] = 0.0
    return {name: t.to(dtype) for name, t in params.items()}


# ----------------------------------------------------------------------------------------------------
# files

def f32_bits(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


def f32_from_bits(bits):
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def model_magic(config):
    return GPT2_MAGIC if config["arch"] == "gpt2" else LLAMA_MAGIC


def write_model(path, params, config, dtype_name="fp32"):
    c = config
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [model_magic(c), 3 if dtype_name == "fp32" else 5, c["maxT"], c["V"], c["L"], c["NH"], c["C"],
                  c["Vp"]]
    if c["arch"] == "llama":
        header[8:12] = [c["KVH"], c["F"], f32_bits(c["theta"]), f32_bits(c["eps"])]
    header[12:16] = [c["E"], c["K"], c["S"], c["N"] if c["E"] else 0]      # 0 0 0 0 for a dense model
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, _ in parameter_shapes(c):
            values = params[name].detach().to(torch.float32).contiguous().numpy()
            if dtype_name == "bf16":
                # bf16 is the top half of an fp32; the values were rounded to bf16 already, so this is exact
                values = (values.view(np.uint32) >> 16).astype(np.uint16)
            f.write(values.tobytes())


def read_model(path):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
            if header.size != HEADER_INTS:
                fail(f"{path}: too short for a model header")
            if header[0] not in (GPT2_MAGIC, LLAMA_MAGIC):
                fail(f"{path}: bad magic {header[0]} (not a model file, expected {GPT2_MAGIC} for GPT-2 or "
                     f"{LLAMA_MAGIC} for Llama)")
            version = int(header[1])
            if version not in (3, 5):
                fail(f"{path}: unsupported version {version} (3 = fp32, 5 = bf16)")
            maxT, V, L, NH, C, Vp = (int(v) for v in header[2:8])
            E, K, S = (int(v) for v in header[12:15])
            N = int(header[15]) or 1                  # 0: a dense model, or experts in every block
            if header[0] == GPT2_MAGIC:
                config = gpt2_config(L, NH, C, V, maxT, Vp, E, K, S, N)
            else:
                config = llama_config(L, NH, int(header[8]), C, int(header[9]), V, maxT,
                                      f32_from_bits(int(header[10])), f32_from_bits(int(header[11])), Vp,
                                      E, K, S, N)
            problem = shape_problem(config)
            if problem:
                fail(f"{path}: inconsistent shape {describe(config)}: {problem}")
            shapes = parameter_shapes(config)
            count = sum(int(np.prod(s)) for _, s in shapes)
            itemsize = 4 if version == 3 else 2
            expected = HEADER_INTS * 4 + count * itemsize
            if size != expected:
                fail(f"{path}: {size} bytes, expected {expected} for this shape and version {version}")
            raw = np.frombuffer(f.read(count * itemsize), dtype=np.float32 if version == 3 else np.uint16)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if version == 5:
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    params, offset = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        params[name] = torch.from_numpy(raw[offset:offset + n].copy()).view(shape)
        offset += n
    return params, config


def read_tokens(path, count):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
            if header.size != HEADER_INTS or header[0] != SHARD_MAGIC:
                fail(f"{path}: not a token shard (bad magic)")
            if header[1] != 1:
                fail(f"{path}: unsupported token shard version {header[1]}")
            n = int(header[2])
            if size != HEADER_INTS * 4 + 2 * n:
                fail(f"{path}: {size} bytes but the header says {n} tokens ({HEADER_INTS * 4 + 2 * n} bytes)")
            if n < count:
                fail(f"{path}: {n} tokens, the batch needs {count} (B*T+1)")
            return np.frombuffer(f.read(2 * count), dtype=np.uint16).astype(np.int64)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def write_state(path, args, B, T, inputs, targets, logits, loss, router, grads, config, losses, norms):
    """router: the first forward's router numbers as plain numbers (aux, z, routed (L, E), dropped), or None
    for a dense model (0, 0, no counts, 0)."""
    shapes = parameter_shapes(config)
    count = sum(int(np.prod(s)) for _, s in shapes)
    if count >= 2 ** 31:
        fail(f"{count} parameters do not fit the state header's int32")
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:5] = [STATE_MAGIC, STATE_VERSION, B, T, len(losses)]
    header[5:11] = [f32_bits(v) for v in (args.learning_rate, args.beta1, args.beta2, args.eps,
                                          args.weight_decay, args.grad_clip)]
    # so that a reader can refuse a state next to a model file of the other architecture or shape
    header[11:13] = [model_magic(config), count]
    header[13:16] = [f32_bits(v) for v in (args.moe_aux_loss, args.moe_z_loss, args.capacity_factor)]
    if router is None:
        router = dict(aux=0.0, z=0.0, routed=np.zeros((config["L"], config["E"])), dropped=0)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(inputs.to(torch.int32).numpy().tobytes())
        f.write(targets.to(torch.int32).numpy().tobytes())
        f.write(logits.detach().to(torch.float32).contiguous().numpy().tobytes())
        f.write(np.array([loss, router["aux"], router["z"]], dtype=np.float32).tobytes())
        f.write(np.asarray(router["routed"], dtype=np.int32).tobytes())
        f.write(np.array([router["dropped"]], dtype=np.int32).tobytes())
        for name, _ in shapes:
            f.write(grads[name].to(torch.float32).contiguous().numpy().tobytes())
        f.write(np.array(losses, dtype=np.float32).tobytes())
        f.write(np.array(norms, dtype=np.float32).tobytes())


def read_state(path, config):
    """The state file back as a dict (the self-check's round trip: the layout above, read independently)."""
    with open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:HEADER_INTS * 4], dtype=np.int32)
    B, T, S = (int(v) for v in header[2:5])
    state = dict(magic=int(header[0]), version=int(header[1]), B=B, T=T, steps=S,
                 hyper=[f32_from_bits(int(v)) for v in header[5:11]], model_magic=int(header[11]),
                 count=int(header[12]), moe=[f32_from_bits(int(v)) for v in header[13:16]])
    pieces = [("inputs", np.int32, B * T), ("targets", np.int32, B * T),
              ("logits", np.float32, B * T * config["Vp"]), ("loss", np.float32, 1),
              ("aux", np.float32, 1), ("z", np.float32, 1), ("routed", np.int32, config["L"] * config["E"]),
              ("dropped", np.int32, 1),
              ("grads", np.float32, state["count"]), ("losses", np.float32, S), ("norms", np.float32, S)]
    offset = HEADER_INTS * 4
    for name, dtype, n in pieces:
        state[name] = np.frombuffer(data[offset:offset + 4 * n], dtype=dtype)
        offset += 4 * n
    state["trailing_bytes"] = len(data) - offset
    return state


# ----------------------------------------------------------------------------------------------------
# training

class AdamW:
    # Walked in chunks that stay in cache, with two reused scratch buffers: whole-tensor temporaries
    # (wte alone is 150 MiB at 124M) would make each step stream the parameters through memory ~10 times.
    CHUNK = 1 << 20

    def __init__(self, params, lr, beta1, beta2, eps, weight_decay):
        self.params, self.lr, self.beta1, self.beta2, self.eps, self.wd = params, lr, beta1, beta2, eps, weight_decay
        self.m = {name: torch.zeros_like(p) for name, p in params.items()}
        self.v = {name: torch.zeros_like(p) for name, p in params.items()}
        self.t = 0

    def step(self, grad_scale=1.0):
        self.t += 1
        correction1 = 1.0 - self.beta1 ** self.t
        correction2 = 1.0 - self.beta2 ** self.t
        with torch.no_grad():
            for name, param in self.params.items():
                dtype = param.dtype
                scratch = [torch.empty(self.CHUNK, dtype=dtype) for _ in range(2)]
                flat = [t.view(-1) for t in (param, param.grad, self.m[name], self.v[name])]
                for start in range(0, param.numel(), self.CHUNK):
                    w, g, m, v = (t[start:start + self.CHUNK] for t in flat)
                    denom, update = (s[:w.numel()] for s in scratch)
                    if grad_scale != 1.0:
                        g = g * grad_scale
                    m.mul_(self.beta1).add_(g, alpha=1.0 - self.beta1)
                    v.mul_(self.beta2).addcmul_(g, g, value=1.0 - self.beta2)
                    torch.div(v, correction2, out=denom).sqrt_().add_(self.eps)      # sqrt(v_hat) + eps
                    torch.div(m, correction1, out=update).div_(denom)                 # m_hat / denom
                    if tensor_name(name) in DECAYED:
                        update.add_(w, alpha=self.wd)
                    w.sub_(update, alpha=self.lr)


def global_norm(w):
    # summed in float64, a slice at a time: an fp32 sum over wte's 38M squares drifts by ~1e-5 relative
    total = 0.0
    for p in w.values():
        for piece in p.grad.view(-1).split(1 << 20):
            total += float(piece.double().square_().sum())
    return math.sqrt(total)


def router_numbers(router):
    """The router numbers as plain numbers, for printing and the state file (None for a dense model)."""
    if router is None:
        return None
    return dict(aux=float(router["aux"]), z=float(router["z"]), routed=router["routed"].numpy(),
                dropped=router["dropped"])


def train_step(w, config, inputs, targets, optimizer, grad_clip, keep=False, moe=MoeTraining()):
    """One forward, backward and AdamW update of w = trainable(params); an MoE model trains on the total of
    moe (MoeTraining). Returns (loss, grad norm before clipping), the loss the cross-entropy, and, with keep,
    also the logits, the router numbers (router_numbers) and the gradients (file order), taken before the
    update."""
    for p in w.values():
        p.grad = None
    logits, loss, token_embeddings, router = forward(w, config, inputs, targets, moe.capacity_factor)
    backward(w, moe.total(loss, router), token_embeddings, inputs)
    norm = global_norm(w)
    kept = (logits.detach(), router_numbers(router), file_grads(w)) if keep else None
    del logits
    optimizer.step(grad_clip / norm if 0 < grad_clip < norm else 1.0)
    return float(loss), norm, kept


def make_batch(args, config):
    B, T, V = args.batch_size, args.seq_len, config["V"]
    if T > config["maxT"]:
        fail(f"--seq-len {T} exceeds the model's max_seq_len {config['maxT']}")
    if args.tokens:
        tokens = torch.from_numpy(read_tokens(args.tokens, B * T + 1))
        if int(tokens.max()) >= V:
            fail(f"{args.tokens}: token id {int(tokens.max())} is outside the vocabulary (V = {V})")
    else:
        # a generator of its own, so the batch does not depend on whether the model was created or loaded
        generator = torch.Generator().manual_seed(args.seed + 1)
        tokens = torch.randint(0, V, (B * T + 1,), generator=generator)
    rows = torch.arange(B).unsqueeze(1) * T + torch.arange(T).unsqueeze(0)     # (B, T): b*T + t
    return tokens[rows], tokens[rows + 1]


def run(args):
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    torch.use_deterministic_algorithms(True)

    if args.model:
        params, config = read_model(args.model)
    else:
        config = config_from(args)
        params = init_params(config, args.seed, torch.float32)
    # batch and learning-rate defaults: those of the preset with this exact shape, else of --config or the
    # architecture's default preset
    preset = CONFIGS[args.config or DEFAULT_CONFIG[config["arch"]]]
    for candidate in CONFIGS.values():
        if config_from(candidate) == config:
            preset = candidate
    for key in ("batch_size", "seq_len", "learning_rate"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    count = sum(p.numel() for p in params.values())
    print(f"model: {describe(config)}, {count:,} parameters "
          f"({'loaded from ' + args.model if args.model else 'seed %d' % args.seed})")
    if args.model_out:
        write_model(args.model_out, params, config, args.model_dtype)
        print(f"wrote {args.model_out}")

    inputs, targets = make_batch(args, config)
    B, T = inputs.shape
    print(f"batch: B={B} T={T} from {args.tokens or 'random ids (seed %d)' % (args.seed + 1)}; "
          f"lr={args.learning_rate:g} betas=({args.beta1:g}, {args.beta2:g}) eps={args.eps:g} "
          f"wd={args.weight_decay:g} clip={args.grad_clip:g}; threads={torch.get_num_threads()}")

    if config["E"]:
        blocks = [l for l in range(config["L"]) if moe_block(config, l)]
        where = f" in blocks {blocks} (moe_every {config['N']})" if config["N"] > 1 else ""
        print(f"experts: E={config['E']} K={config['K']} S={config['S']}{where}; aux loss weight "
              f"{args.moe_aux_loss:g}, z loss weight {args.moe_z_loss:g}, capacity factor "
              + (f"{args.capacity_factor:g} (cap {capacity(args.capacity_factor, T, config['K'], config['E'])} "
                 f"per expert per sequence)" if args.capacity_factor else "0 (dropless)"))

    w = trainable(params)
    optimizer = AdamW(w, args.learning_rate, args.beta1, args.beta2, args.eps, args.weight_decay)
    moe = MoeTraining(args.moe_aux_loss, args.moe_z_loss, args.capacity_factor)
    losses, norms, first = [], [], None
    start = time.perf_counter()
    for step in range(args.steps):
        loss, norm, kept = train_step(w, config, inputs, targets, optimizer, args.grad_clip,
                                      keep=(step == 0 and (args.state_out is not None or config["E"] > 0)),
                                      moe=moe)
        if kept:
            first = (kept[0], loss, kept[1], kept[2])
            if kept[1] is not None:
                r = kept[1]
                print(f"router, first forward: aux loss {r['aux']:.6f}  z loss {r['z']:.6f}  routed "
                      f"{r['routed'].tolist()} (per layer, per expert)  dropped {r['dropped']}")
        losses.append(loss)
        norms.append(norm)
        print(f"step {step + 1:3d}/{args.steps}: loss {loss:.6f}  grad norm {norm:.6f}")
    if args.steps:
        elapsed = time.perf_counter() - start
        print(f"{args.steps} steps in {elapsed:.2f} s: {1000 * elapsed / args.steps:.1f} ms/step")

    if args.state_out:
        logits, loss, router, grads = first
        write_state(args.state_out, args, B, T, inputs, targets, logits, loss, router, grads, config, losses,
                    norms)
        print(f"wrote {args.state_out}")

    if args.bench:
        train_step(w, config, inputs, targets, optimizer, args.grad_clip, moe=moe)   # warm-up
        start = time.perf_counter()
        for _ in range(args.bench):
            train_step(w, config, inputs, targets, optimizer, args.grad_clip, moe=moe)
        seconds = (time.perf_counter() - start) / args.bench
        print(f"pytorch: {1000 * seconds:.1f} ms/step, {B * T / seconds:.1f} tokens/s "
              f"(B={B}, T={T}, {torch.get_num_threads()} threads, mean of {args.bench} steps)")


# ----------------------------------------------------------------------------------------------------
# self-check: the reference is only useful if it is right

def naive_moe(rows, P, l, config, act, B, cap, stats):
    """One sequence's MoE MLP at block l, token by token in float64 Python: rows are the sequence's T
    normalised vectors in order, act the activation of one hidden vector, cap the capacity per expert (None:
    dropless). Adds the sequence's share of the router numbers to stats (aux, z, routed, dropped). Returns
    the T outputs."""
    E, K, S, C = config["E"], config["K"], config["S"], config["C"]
    T = len(rows)
    routed, kept, mean_p, outs = [0] * E, [0] * E, [0.0] * E, []
    for row in rows:                                   # t in order, then k in order: the capacity's visit
        z = (P[f"routerw.{l}"] @ row).tolist()
        top = max(z)
        exps = [math.exp(v - top) for v in z]
        p = [v / sum(exps) for v in exps]
        stats["z"] += (top + math.log(sum(exps))) ** 2 / (B * T)
        chosen = sorted(range(E), key=lambda e: (-p[e], e))[:K]          # descending p, ties by index
        chosen_sum = sum(p[e] for e in chosen)
        out = P[f"fcprojw.{l}"] @ act(P[f"fcw.{l}"] @ row) if S else torch.zeros(C, dtype=torch.float64)
        for e in chosen:
            routed[e] += 1
            if cap is not None and kept[e] == cap:
                stats["dropped"] += 1
                continue
            kept[e] += 1
            out = out + p[e] / chosen_sum * (P[f"expertprojw.{l}"][e] @ act(P[f"expertfcw.{l}"][e] @ row))
        for e in range(E):
            mean_p[e] += p[e] / T
        outs.append(out)
    stats["aux"] += E * sum(routed[e] / (T * K) * mean_p[e] for e in range(E)) / B
    for e in range(E):
        stats["routed"][l][e] += routed[e]
    return outs


def naive_stats(config, T, capacity_factor):
    """The capacity of naive_moe and an empty stats for it."""
    E, K = config["E"], config["K"]
    cap = capacity(capacity_factor, T, K, E) if E and capacity_factor > 0 else None
    return cap, dict(aux=0.0, z=0.0, routed=[[0] * E for _ in range(config["L"])], dropped=0)


def naive_gpt2_loss(params, config, inputs, targets, capacity_factor=0.0, stats=None):
    """GPT-2 with every operation spelled out element by element in float64 Python loops over positions,
    independent of the vectorised code above. Tiny shapes only. An MoE model's router numbers go into
    stats (a dict) when given."""
    L, NH, C, V = config["L"], config["NH"], config["C"], config["V"]
    HS = C // NH
    B, T = inputs.shape
    P = {k: v.double() for k, v in params.items()}
    cap, router = naive_stats(config, T, capacity_factor)

    def gelu(u):
        return torch.tensor([0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
                             for z in u.tolist()], dtype=torch.float64)

    def ln(row, w, b):
        mean = row.sum() / C
        var = ((row - mean) ** 2).sum() / C
        return (row - mean) / math.sqrt(float(var) + 1e-5) * w + b

    total = 0.0
    for b in range(B):
        x = [P["wte"][int(inputs[b, t])] + P["wpe"][t] for t in range(T)]
        for l in range(L):
            qkv = [P[f"qkvw.{l}"] @ ln(x[t], P[f"ln1w.{l}"], P[f"ln1b.{l}"]) + P[f"qkvb.{l}"] for t in range(T)]
            out = []
            for t in range(T):
                y = torch.zeros(C, dtype=torch.float64)
                for h in range(NH):
                    q = qkv[t][h * HS:(h + 1) * HS]
                    scores = [float((q * qkv[s][C + h * HS:C + (h + 1) * HS]).sum()) / math.sqrt(HS)
                              for s in range(t + 1)]
                    top = max(scores)
                    weights = [math.exp(z - top) for z in scores]
                    norm = sum(weights)
                    for s in range(t + 1):
                        y[h * HS:(h + 1) * HS] += weights[s] / norm * qkv[s][2 * C + h * HS:2 * C + (h + 1) * HS]
                out.append(P[f"attprojw.{l}"] @ y + P[f"attprojb.{l}"])
            x = [x[t] + out[t] for t in range(T)]
            if moe_block(config, l):
                rows = [ln(x[t], P[f"ln2w.{l}"], P[f"ln2b.{l}"]) for t in range(T)]
                out = naive_moe(rows, P, l, config, gelu, B, cap, router)
                x = [x[t] + out[t] for t in range(T)]
                continue
            for t in range(T):
                u = P[f"fcw.{l}"] @ ln(x[t], P[f"ln2w.{l}"], P[f"ln2b.{l}"]) + P[f"fcb.{l}"]
                g = torch.tensor([0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
                                  for z in u.tolist()], dtype=torch.float64)
                x[t] = x[t] + P[f"fcprojw.{l}"] @ g + P[f"fcprojb.{l}"]
        for t in range(T):
            logits = (P["wte"][:V] @ ln(x[t], P["lnfw"], P["lnfb"])).tolist()
            top = max(logits)
            lse = top + math.log(sum(math.exp(z - top) for z in logits))
            total += lse - logits[int(targets[b, t])]
    if stats is not None:
        stats.update(router)
    return total / (B * T)


def naive_rope_angle(t, i, HS, theta):
    """The kernel's angle for pair i at position t, scalar by scalar with numpy's float32."""
    frequency = np.float32(theta ** (-2.0 * i / HS))
    return float(np.float32(t) * frequency)


def naive_llama_loss(params, config, inputs, targets, capacity_factor=0.0, stats=None):
    """Llama with every operation spelled out element by element in float64 Python loops over positions,
    pairs and heads, independent of the vectorised code above. Tiny shapes only. An MoE model's router
    numbers go into stats (a dict) when given."""
    L, NH, KVH, C, F, V = (config[k] for k in ("L", "NH", "KVH", "C", "F", "V"))
    eps, theta = config["eps"], config["theta"]
    HS = C // NH
    B, T = inputs.shape
    P = {k: v.double() for k, v in params.items()}
    cap, router = naive_stats(config, T, capacity_factor)

    def swiglu_row(u):
        u, H = u.tolist(), len(u) // 2             # H gate values, then H up values
        return torch.tensor([u[n] / (1 + math.exp(-u[n])) * u[H + n] for n in range(H)], dtype=torch.float64)

    def rms(row, w):
        return row / math.sqrt(sum(z * z for z in row.tolist()) / C + eps) * w

    def turned(head, t):
        out = head.clone()
        for i in range(HS // 2):
            a = naive_rope_angle(t, i, HS, theta)
            x0, x1 = float(head[2 * i]), float(head[2 * i + 1])
            out[2 * i] = x0 * math.cos(a) - x1 * math.sin(a)
            out[2 * i + 1] = x0 * math.sin(a) + x1 * math.cos(a)
        return out

    total = 0.0
    for b in range(B):
        x = [P["wte"][int(inputs[b, t])].clone() for t in range(T)]
        for l in range(L):
            qkv = [P[f"qkvw.{l}"] @ rms(x[t], P[f"ln1w.{l}"]) for t in range(T)]
            q = [[turned(qkv[t][h * HS:(h + 1) * HS], t) for h in range(NH)] for t in range(T)]
            k = [[turned(qkv[t][(NH + j) * HS:(NH + j + 1) * HS], t) for j in range(KVH)] for t in range(T)]
            v = [[qkv[t][(NH + KVH + j) * HS:(NH + KVH + j + 1) * HS] for j in range(KVH)] for t in range(T)]
            out = []
            for t in range(T):
                y = torch.zeros(C, dtype=torch.float64)
                for h in range(NH):
                    j = h * KVH // NH            # the key/value head of query head h
                    scores = [float((q[t][h] * k[s][j]).sum()) / math.sqrt(HS) for s in range(t + 1)]
                    top = max(scores)
                    weights = [math.exp(z - top) for z in scores]
                    norm = sum(weights)
                    for s in range(t + 1):
                        y[h * HS:(h + 1) * HS] += weights[s] / norm * v[s][j]
                out.append(P[f"attprojw.{l}"] @ y)
            x = [x[t] + out[t] for t in range(T)]
            if moe_block(config, l):
                rows = [rms(x[t], P[f"ln2w.{l}"]) for t in range(T)]
                out = naive_moe(rows, P, l, config, swiglu_row, B, cap, router)
                x = [x[t] + out[t] for t in range(T)]
                continue
            for t in range(T):
                u = (P[f"fcw.{l}"] @ rms(x[t], P[f"ln2w.{l}"])).tolist()
                hidden = torch.tensor([u[n] / (1 + math.exp(-u[n])) * u[F + n] for n in range(F)],
                                      dtype=torch.float64)
                x[t] = x[t] + P[f"fcprojw.{l}"] @ hidden
        for t in range(T):
            logits = (P["lmhead"][:V] @ rms(x[t], P["lnfw"])).tolist()
            top = max(logits)
            lse = top + math.log(sum(math.exp(z - top) for z in logits))
            total += lse - logits[int(targets[b, t])]
    if stats is not None:
        stats.update(router)
    return total / (B * T)


SMALL_PRESETS = ("small", "llama_small", "moe_small", "llama_moe_small")


def small_shapes():
    """(label, config) of the shapes the self-check initialises, writes and trains: the small presets, and
    their MoE ones with a dense block before the mixture (--moe-every 2)."""
    shapes = [(name, config_from(CONFIGS[name])) for name in SMALL_PRESETS]
    return shapes + [(f"{name} --moe-every 2", config_from(dict(CONFIGS[name], moe_every=2)))
                     for name in ("moe_small", "llama_moe_small")]


def whole(params, name):
    """All the layers' values of one tensor of the model file, flat."""
    return torch.cat([p.reshape(-1) for n, p in params.items() if tensor_name(n) == name])


class Checks:
    """Counts and prints the self-check's results; g is the one generator its random inputs come from."""

    def __init__(self):
        self.passed, self.failed = 0, 0
        self.g = torch.Generator().manual_seed(1)

    def check(self, name, ok, detail=""):
        self.passed += bool(ok)
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    @staticmethod
    def rel_err(a, b):
        return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def check_attention(c):
    """Vectorised attention against an explicit loop over heads, queries and keys (float64): GPT-2's (as
    many key/value heads as query heads) and grouped-query (query head h reads head h // group)."""
    for NH, KVH in ((3, 3), (6, 2)):
        B, T, HS = 2, 7, 5
        q = torch.randn(B, NH, T, HS, generator=c.g, dtype=torch.float64)
        k = torch.randn(B, KVH, T, HS, generator=c.g, dtype=torch.float64)
        v = torch.randn(B, KVH, T, HS, generator=c.g, dtype=torch.float64)
        ref = torch.zeros(B, NH, T, HS, dtype=torch.float64)
        for b in range(B):
            for h in range(NH):
                j = h // (NH // KVH)
                for t in range(T):
                    s = torch.stack([(q[b, h, t] * k[b, j, u]).sum() / math.sqrt(HS) for u in range(t + 1)])
                    p = torch.exp(s - s.max())
                    p = p / p.sum()
                    for u in range(t + 1):
                        ref[b, h, t] += p[u] * v[b, j, u]
        err = c.rel_err(causal_attention(q, k, v), ref)
        c.check(f"attention vs loops, NH={NH} KVH={KVH} (float64)", err < 1e-12, f"max rel err {err:.2e}")
        if NH == KVH:
            qkv = torch.cat([t.transpose(1, 2).reshape(B, T, NH * HS) for t in (q, k, v)], dim=2)
            err = c.rel_err(causal_self_attention(qkv, NH), ref.transpose(1, 2).reshape(B, T, NH * HS))
            c.check("GPT-2's qkv split into heads vs loops (float64)", err < 1e-12, f"max rel err {err:.2e}")


def check_rope(c):
    """RoPE: the angles are the kernel's (float32 frequency, float32 product) to the bit, and the rotation
    is the complex product (x_2i + i x_2i+1) e^(i a), Meta's way of writing it."""
    T, HS, theta = 1000, 16, as_float32(500000.0)
    cos32, sin32 = rope_tables(T, HS, theta, torch.float32)
    cos64, sin64 = rope_tables(T, HS, theta, torch.float64)
    angles = rope_angles(T, HS, theta)
    spots = [(t, i) for t in (0, 1, 37, 999) for i in range(HS // 2)]
    c.check("RoPE angles: the kernel's, float32 frequency times float32 position, to the bit",
            all(float(angles[t, i]) == naive_rope_angle(t, i, HS, theta) for t, i in spots))
    err = max(max(abs(float(cos64[t, i]) - math.cos(float(angles[t, i]))),
                  abs(float(sin64[t, i]) - math.sin(float(angles[t, i])))) for t, i in spots)
    c.check("RoPE tables: cos and sin of those angles (float64)", err < 1e-15, f"max abs err {err:.1e}")
    c.check("RoPE tables in float32: float64's rounded", torch.equal(cos32, cos64.float()) and
            torch.equal(sin32, sin64.float()))
    x = torch.randn(2, T, 3, HS, generator=c.g, dtype=torch.float64)
    turn = torch.complex(cos64, sin64)                                           # e^(i a), (T, HS/2)
    as_complex = torch.view_as_complex(x.reshape(2, T, 3, HS // 2, 2).contiguous())
    ref = torch.view_as_real(as_complex * turn[:, None, :]).reshape(x.shape)
    err = c.rel_err(rope(x, cos64, sin64), ref)
    c.check("RoPE on adjacent pairs vs the complex product (float64)", err < 1e-12, f"max rel err {err:.2e}")
    # the point of RoPE: after turning, q . k depends on the positions only through their difference
    # (to 1e-4: the float32 angles of positions t + 5 and t differ from 5 f_i by their rounding)
    same = torch.randn(2, 1, 1, HS, generator=c.g, dtype=torch.float64).expand(2, T, 1, HS)   # q, k at every t
    turned = rope(same, cos64, sin64)
    dots = [float(turned[0, t + 5, 0] @ turned[1, t, 0]) for t in (0, 10, 100, 900)]
    c.check("RoPE: q.k depends only on the offset", max(dots) - min(dots) < 1e-4 * abs(dots[0]), f"{dots}")


def check_models(c):
    """Both models against the element-by-element versions (float64, tiny shapes, weights made larger than
    the init so every op matters, padded vocab rows non-zero to prove they are ignored), Llama with
    grouped-query attention and with as many key/value heads as query heads, both with experts (with and
    without capacity drops and shared experts, in every block and in every second one); and their gradients
    against finite differences (of the total, with router terms weighted up so that they matter)."""
    tiny = [("GPT-2", gpt2_config(L=2, NH=2, C=8, V=11, maxT=6), naive_gpt2_loss, 0.0),
            ("Llama KVH=2", llama_config(L=2, NH=4, KVH=2, C=16, F=12, V=11, maxT=6, theta=10000.0, eps=1e-5),
             naive_llama_loss, 0.0),
            ("Llama KVH=NH", llama_config(L=2, NH=2, KVH=2, C=8, F=8, V=11, maxT=6, theta=10000.0, eps=1e-2),
             naive_llama_loss, 0.0),
            ("GPT-2 MoE E=4 K=2 S=1 capacity 0.5", gpt2_config(L=2, NH=2, C=8, V=11, maxT=6, E=4, K=2, S=1),
             naive_gpt2_loss, 0.5),
            ("Llama MoE E=3 K=2 S=0 dropless", llama_config(L=2, NH=4, KVH=2, C=16, F=12, V=11, maxT=6,
                                                            theta=10000.0, eps=1e-5, E=3, K=2, S=0),
             naive_llama_loss, 0.0),
            ("Llama MoE E=4 K=1 S=2 capacity 1", llama_config(L=2, NH=2, KVH=1, C=8, F=6, V=11, maxT=6,
                                                              theta=10000.0, eps=1e-5, E=4, K=1, S=2),
             naive_llama_loss, 1.0),
            ("GPT-2 MoE E=3 K=2 S=1 in block 1 of 3 (moe_every 2), capacity 0.5",
             gpt2_config(L=3, NH=2, C=8, V=11, maxT=6, E=3, K=2, S=1, N=2), naive_gpt2_loss, 0.5),
            ("Llama MoE E=4 K=2 S=0 in block 1 of 2 (moe_every 2), dropless",
             llama_config(L=2, NH=4, KVH=2, C=16, F=12, V=11, maxT=6, theta=10000.0, eps=1e-5, E=4, K=2, S=0, N=2),
             naive_llama_loss, 0.0)]
    for label, config, naive, capacity_factor in tiny:
        moe = MoeTraining(alpha=0.5, beta=0.1, capacity_factor=capacity_factor)
        params = init_params(config, seed=5, dtype=torch.float64)
        for p in params.values():
            p.add_(torch.randn(p.shape, generator=c.g, dtype=torch.float64) * 0.3)
        inputs = torch.randint(0, config["V"], (2, 5), generator=c.g)
        targets = torch.randint(0, config["V"], (2, 5), generator=c.g)
        w = trainable(params)
        _, loss, _, router = forward(w, config, inputs, targets, capacity_factor)
        stats = {}
        expected = naive(params, config, inputs, targets, capacity_factor, stats)
        c.check(f"{label}: loss vs naive float64 model", abs(float(loss) - expected) < 1e-10 * abs(expected),
                f"{float(loss):.12f} vs {expected:.12f}")
        if config["E"]:
            same = (abs(float(router["aux"]) - stats["aux"]) < 1e-10 * stats["aux"]
                    and abs(float(router["z"]) - stats["z"]) < 1e-10 * stats["z"]
                    and router["routed"].tolist() == stats["routed"] and router["dropped"] == stats["dropped"]
                    and (router["dropped"] > 0) == (capacity_factor > 0))
            c.check(f"{label}: aux loss, z loss, routed counts and drops vs naive", same,
                    f"aux {float(router['aux']):.10f} vs {stats['aux']:.10f}, z {float(router['z']):.10f} vs "
                    f"{stats['z']:.10f}, routed {router['routed'].tolist()} vs {stats['routed']}, dropped "
                    f"{router['dropped']} vs {stats['dropped']}")
        else:
            c.check(f"{label}: a dense model has no router numbers", router is None)

        # gradients against central finite differences (float64), a few entries of every tensor; the
        # padded vocab rows must get exactly zero gradient. Steps of 1e-5: the rounding of the loss (~1e-15
        # of a total of ~5 with the router terms) over 2h stays ~1e-10, and the h^2 term about as small.
        # An MoE model's routing is piecewise constant: such steps do not move these random points across
        # a tie.
        def total():
            _, loss, token_embeddings, router = forward(w, config, inputs, targets, capacity_factor)
            return moe.total(loss, router), token_embeddings
        loss, token_embeddings = total()
        backward(w, loss, token_embeddings, inputs)
        grads = file_grads(w)
        worst, h = 0.0, 1e-5
        with torch.no_grad():
            for name, p in params.items():
                flat, grad = p.view(-1), grads[name].reshape(-1)
                rows = config["V"] if name in ("wte", "lmhead") else p.shape[0]     # entries that can matter
                limit = rows * (p.numel() // p.shape[0])
                indices = torch.randint(0, limit, (3,), generator=c.g).tolist()
                if name == "wte":   # rows of tokens in the batch
                    indices += [int(inputs[0, 0]) * config["C"] + 1, int(inputs[1, 2]) * config["C"] + 5]
                for index in indices:
                    saved = float(flat[index])
                    flat[index] = saved + h
                    plus = float(total()[0])
                    flat[index] = saved - h
                    minus = float(total()[0])
                    flat[index] = saved
                    numeric = (plus - minus) / (2 * h)
                    worst = max(worst, abs(numeric - float(grad[index])) / max(abs(numeric), 1e-3))
        c.check(f"{label}: gradients vs finite differences (float64, 3-5 entries per tensor)", worst < 1e-6,
                f"worst rel err {worst:.2e}")
        padded = [grads[n][config["V"]:] for n in ("wte", "lmhead") if n in grads]
        c.check(f"{label}: padded vocab rows get zero gradient", all(bool((p == 0).all()) for p in padded))


def check_moe_routing(c):
    """The tie rule: descending p, equal p in index order (torch.topk promises no order for ties), against
    Python's sort by (-p, e) on logits full of ties; and the renormalised weights."""
    z = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [0.0] * 5, [2.0, 2.0, 5.0, 2.0, 5.0]], dtype=torch.float64)
    picks = [route(z, K)[2].tolist() for K in (2, 3)]
    c.check("MoE tie rule by hand: equal p go in index order", picks == [[[1, 2], [0, 1], [2, 4]],
                                                                        [[1, 2, 4], [0, 1, 2], [2, 4, 0]]],
            f"{picks}")
    E, ok = 6, True
    for dtype in (torch.float32, torch.float64):
        z = torch.randint(0, 3, (300, E), generator=c.g).to(dtype)              # about 2 equal values per row
        for K in range(1, E + 1):
            p, _, experts, weights = route(z, K)
            for n in range(z.shape[0]):
                ok &= experts[n].tolist() == sorted(range(E), key=lambda e: (-float(p[n, e]), e))[:K]
            chosen = p.gather(1, experts)
            ok &= bool(torch.equal(weights, chosen / chosen.sum(dim=1, keepdim=True)))
            ok &= bool((weights.sum(dim=1) - 1).abs().max() < 1e-6)
    c.check("MoE top-K vs sorted by (-p, expert) on 300 rows of tied logits, K = 1..6, fp32 and float64; "
            "weights renormalised", ok)


def check_moe_capacity(c):
    """The capacity: the exact ceiling, the vectorised drops against a visit in the order (t, then k), and
    a hand-made case through the layer (every token to expert 0, counts reset per sequence)."""
    caps = [capacity(1.0, 37, 2, 4), capacity(1.25, 32, 2, 4), capacity(1.1, 10, 1, 11), capacity(0.01, 5, 1, 8)]
    c.check("MoE capacity: ceil(cf T K / E) exactly, cf a float32", caps == [19, 20, 2, 1], f"{caps}")

    ok, drops = True, 0
    for cf in (0.5, 1.0, 1.5, 0.0):
        B, T, E, K = 3, 9, 5, 2
        experts = route(torch.randn(B * T, E, generator=c.g, dtype=torch.float64), K)[2]
        kept = kept_assignments(experts, B, T, E, cf)
        cap = capacity(cf, T, K, E) if cf else None
        for b in range(B):
            count = [0] * E
            for t in range(T):
                for k in range(K):
                    e = int(experts[b * T + t, k])
                    keep = cap is None or count[e] < cap
                    count[e] += keep
                    ok &= bool(kept[b * T + t, k]) == keep
        drops += int((~kept).sum())
    c.check("MoE capacity drops vs a visit in (t, k) order (3 capacity factors and dropless)", ok and drops > 0,
            f"{drops} drops")

    # B=2 sequences of T=4, E=2, K=1, cf=1: cap 2. A zero router gives p = (0.5, 0.5): by the tie rule
    # every token goes to expert 0, with weight 1; tokens 2 and 3 of each sequence are dropped.
    config = gpt2_config(L=1, NH=1, C=4, V=5, maxT=4, E=2, K=1, S=1)
    h = torch.randn(2, 4, 4, generator=c.g, dtype=torch.float64)
    w = {"routerw.0": torch.zeros(2, 4, dtype=torch.float64)}
    for name in ("fcw", "fcprojw", "expertfcw", "expertprojw"):
        shape = dict(parameter_shapes(config))[f"{name}.0"]
        w[f"{name}.0"] = torch.randn(shape, generator=c.g, dtype=torch.float64)
    out, router = moe_mlp(h, w, 0, config, 1.0)
    linear = torch.nn.functional.linear
    shared = linear(gelu_tanh(linear(h, w["fcw.0"])), w["fcprojw.0"])
    expert0 = linear(gelu_tanh(linear(h, w["expertfcw.0"][0])), w["expertprojw.0"][0])
    expected = shared + torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)[None, :, None] * expert0
    c.check("MoE capacity through the layer: 2 of 4 kept per sequence, dropped tokens get the shared "
            "experts only, routed counts before drops",
            router["dropped"] == 4 and router["routed"].tolist() == [8, 0] and c.rel_err(out, expected) < 1e-15,
            f"dropped {router['dropped']}, routed {router['routed'].tolist()}")


def check_moe_losses(c):
    """The aux loss is 1 for a perfectly balanced router (f = P = 1/E), also 1 whenever p is uniform
    whatever the counts, larger when unbalanced, E when every token goes to one expert with p = 1; the
    z-loss is the mean of lse^2."""
    B, T, E = 2, 8, 4

    def aux_of(z, K):
        p, _, experts, _ = route(z, K)
        return float(balance_loss(p, experts, B, T, E)[0])
    t = torch.arange(B * T) % E
    onehot = torch.nn.functional.one_hot
    balanced = [aux_of((4.0 * onehot(t, E) + 2.0 * onehot((t + 1) % E, E)).double(), K) for K in (1, 2)]
    c.check("MoE aux loss of a balanced router (each expert 1/E of the assignments and of p) is 1",
            max(abs(a - 1) for a in balanced) < 1e-12, f"K=1 {balanced[0]!r}, K=2 {balanced[1]!r}")
    uniform = aux_of(torch.zeros(B * T, E, dtype=torch.float64), 2)
    c.check("MoE aux loss with uniform p is 1 although experts 0 and 1 take every assignment",
            abs(uniform - 1) < 1e-12, f"{uniform!r}")
    leaning = aux_of(torch.randn(B * T, E, generator=c.g, dtype=torch.float64) + 2.0 * onehot(torch.zeros(
        B * T, dtype=torch.long), E), 2)
    collapsed = aux_of(100.0 * onehot(torch.zeros(B * T, dtype=torch.long), E).double(), 1)
    c.check("MoE aux loss of unbalanced routers: > 1, and E when one expert takes everything with p = 1",
            leaning > 1.1 and abs(collapsed - E) < 1e-12, f"leaning to expert 0: {leaning:.4f}, "
            f"collapsed: {collapsed!r}")
    z = torch.randn(B * T, E, generator=c.g, dtype=torch.float64) * 3
    config = gpt2_config(L=1, NH=1, C=E, V=5, maxT=T, E=E, K=2, S=0)
    w = {"routerw.0": torch.eye(E, dtype=torch.float64),
         "expertfcw.0": torch.zeros(E, 4 * E, E, dtype=torch.float64),
         "expertprojw.0": torch.zeros(E, E, 4 * E, dtype=torch.float64)}
    _, router = moe_mlp(z.view(B, T, E), w, 0, config, 0.0)               # the router's logits are z
    expected = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in z.tolist()) / (B * T)
    c.check("MoE z-loss: mean over the rows of logsumexp(z)^2",
            abs(float(router["z"]) - expected) < 1e-12 * expected, f"{float(router['z']):.12f} vs {expected:.12f}")


def moe_layer_inputs(c, config, B, T, scale):
    """Random float64 h (B, T, C) and the layer-0 tensors of an MoE block (file names, no layer suffix)."""
    h = torch.randn(B, T, config["C"], generator=c.g, dtype=torch.float64)
    shapes = dict(parameter_shapes(config))
    names = [n for n in ("fcw", "fcprojw", "routerw", "expertfcw", "expertprojw") if f"{n}.0" in shapes]
    tensors = [torch.randn(shapes[f"{n}.0"], generator=c.g, dtype=torch.float64) * scale for n in names]
    return h, names, tensors


def check_moe_gradcheck(c):
    """torch.autograd.gradcheck (float64) of the MoE layer alone: mlp(h), aux and z as functions of h and of
    all its weights. Top-K and the drops are piecewise constant, so the point must be away from ties: the
    K-th and (K+1)-th largest p of every row differ by far more than gradcheck's steps can move them."""
    cases = [("GPT-2, E=4 K=2 S=1, capacity 0.75", gpt2_config(L=1, NH=1, C=6, V=5, maxT=8, E=4, K=2, S=1), 0.75),
             ("Llama, E=3 K=2 S=2, dropless", llama_config(L=1, NH=2, KVH=1, C=6, F=5, V=5, maxT=8, E=3, K=2, S=2),
              0.0),
             ("Llama, E=5 K=1 S=0, capacity 1", llama_config(L=1, NH=2, KVH=1, C=6, F=4, V=5, maxT=8, E=5, K=1,
                                                            S=0), 1.0)]
    for label, config, cf in cases:
        B, T, K = 2, 6, config["K"]
        h, names, tensors = moe_layer_inputs(c, config, B, T, scale=0.7)
        h.requires_grad_(True)
        for t in tensors:
            t.requires_grad_(True)

        def layer(h, *tensors):
            out, router = moe_mlp(h, {f"{n}.0": t for n, t in zip(names, tensors)}, 0, config, cf)
            return out, router["aux"], router["z"]
        p = torch.softmax(h.detach().reshape(B * T, -1) @ tensors[names.index("routerw")].detach().t(), dim=-1)
        ranked = p.sort(dim=-1, descending=True).values
        gap = float((ranked[:, K - 1] - ranked[:, K]).min())
        _, router = moe_mlp(h.detach(), {f"{n}.0": t.detach() for n, t in zip(names, tensors)}, 0, config, cf)
        passed = torch.autograd.gradcheck(layer, (h, *tensors), eps=1e-6, atol=1e-8, rtol=1e-6,
                                          raise_exception=False)
        c.check(f"MoE layer gradcheck, {label} (float64)", passed and gap > 1e-3 and
                (router["dropped"] > 0) == (cf > 0), f"smallest top-K gap {gap:.3f}, {router['dropped']} dropped")


def check_moe_spec_gradients(c):
    """The router's gradient as the CUDA kernels compute it (combine, renormalisation, aux, softmax and z-loss
    steps written out) against autograd's, for d(sum dout . mlp + a aux + b zloss)/dz with given expert
    outputs."""
    B, T, E, K, C = 2, 7, 5, 3, 4
    N, a, b = B * T, 0.3, 0.2
    z = torch.randn(N, E, generator=c.g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(N, K, C, generator=c.g, dtype=torch.float64)               # the experts' outputs per slot
    dout = torch.randn(N, C, generator=c.g, dtype=torch.float64)
    for cf in (0.0, 0.6):
        z.grad = None
        p, lse, experts, weights = route(z, K)
        kept = kept_assignments(experts, B, T, E, cf)
        out = (kept[:, :, None] * weights[:, :, None] * y).sum(dim=1)
        aux, routed = balance_loss(p, experts, B, T, E)
        ((out * dout).sum() + a * aux + b * lse.square().mean()).backward()
        with torch.no_grad():
            dw = kept * (y * dout[:, None, :]).sum(dim=2)                      # (N, K); dropped: 0
            s = p.gather(1, experts).sum(dim=1, keepdim=True)
            dp = torch.zeros(N, E, dtype=torch.float64)
            dp.scatter_add_(1, experts, (dw - (dw * weights).sum(dim=1, keepdim=True)) / s)
            f = routed.double() / (T * K)                                      # (B, E)
            dp += (a / B) * E * f.repeat_interleave(T, dim=0) / T
            dz = p * (dp - (p * dp).sum(dim=1, keepdim=True))
            dz += (b / N) * 2 * lse[:, None] * p
        c.check(f"MoE router gradient: the kernels' formulas vs autograd "
                f"({'capacity %g' % cf if cf else 'dropless'})",
                c.rel_err(dz, z.grad) < 1e-13 and (int((~kept).sum()) > 0) == (cf > 0),
                f"max rel err {c.rel_err(dz, z.grad):.1e}, {int((~kept).sum())} dropped")


def per_layer(stacked):
    """A listing of whole tensors, (name, (L, ...)) for the layered ones, as parameter_shapes lists them:
    one entry per layer, tensor-major. wte, wpe, lnfw, lnfb and lmhead have no layer dimension."""
    return [entry for name, shape in stacked
            for entry in ([(name, shape)] if name in ("wte", "wpe", "lnfw", "lnfb", "lmhead") else
                          [(f"{name}.{l}", shape[1:]) for l in range(shape[0])])]


def three_recorded_steps(config, moe):
    """(loss, gradient norm) of 3 AdamW steps on a fixed batch of 2 x 5 tokens from a fixed initialisation:
    the numbers recorded before a change to the model, which must not move them."""
    generator = torch.Generator().manual_seed(11)
    inputs = torch.randint(0, config["V"], (2, 5), generator=generator)
    targets = torch.randint(0, config["V"], (2, 5), generator=generator)
    w = trainable(init_params(config, seed=7, dtype=torch.float32))
    optimizer = AdamW(w, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    return [train_step(w, config, inputs, targets, optimizer, 1.0, moe=moe)[:2] for _ in range(3)]


def check_dense_unchanged(c):
    """E = 0 is the dense model as it was before the MoE layer: the same tensors in the same order and no MoE
    header slots, and a few training steps of small and llama_small give the losses and gradient norms
    recorded with the script before experts existed (to 1e-6: another BLAS may round differently; here
    they agree to the bit)."""
    for name in ("small", "llama_small", "124M", "llama_100M"):
        config = config_from(CONFIGS[name])
        L, C, Vp, maxT = config["L"], config["C"], config["Vp"], config["maxT"]
        if config["arch"] == "gpt2":
            before = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                      ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
                      ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
                      ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
        else:
            HS, F = C // config["NH"], config["F"]
            before = [("wte", (Vp, C)), ("ln1w", (L, C)),
                      ("qkvw", (L, (config["NH"] + 2 * config["KVH"]) * HS, C)), ("attprojw", (L, C, C)),
                      ("ln2w", (L, C)), ("fcw", (L, 2 * F, C)), ("fcprojw", (L, C, F)),
                      ("lnfw", (C,)), ("lmhead", (Vp, C))]
        c.check(f"{name} (dense): the tensors of the model file as before the MoE layer",
                parameter_shapes(config) == per_layer(before) and
                (config["E"], config["K"], config["S"], config["N"]) == (0, 0, 0, 1))
    recorded = {"small": [(6.1614179611206055, 6.667221818082044), (5.506646156311035, 4.011066711864838),
                          (5.202295780181885, 3.2833614748957958)],
                "llama_small": [(6.244335651397705, 4.907777945798072), (5.838030815124512, 4.028617547687663),
                                (5.568377494812012, 3.357865754280531)]}
    for name, expected in recorded.items():
        got = three_recorded_steps(config_from(CONFIGS[name]), MoeTraining(0.5, 0.5, 1.0))
        err = max(abs(x - y) / abs(y) for pair, want in zip(got, expected) for x, y in zip(pair, want))
        c.check(f"{name} (dense, MoE options ignored): 3 steps' losses and gradient norms as recorded before "
                f"the MoE layer", err < 1e-6, "bitwise" if got == expected else f"max rel diff {err:.1e}")


def check_moe_every(c, tmp):
    """--moe-every: which tensors a model with dense blocks between its mixtures has, in which order; N = 1
    as the MoE presets were before it (their tensors, and 3 training steps recorded then, to 1e-6 as in
    check_dense_unchanged); the shapes refused; slot [15] of 0 read as 1; the router numbers of the dense
    blocks."""
    C, H, F = 8, 32, 12
    common = per_layer([("wte", (128, C)), ("wpe", (6, C)), ("ln1w", (2, C)), ("ln1b", (2, C)),
                        ("qkvw", (2, 3 * C, C)), ("qkvb", (2, 3 * C)), ("attprojw", (2, C, C)), ("attprojb", (2, C)),
                        ("ln2w", (2, C)), ("ln2b", (2, C))])
    mlp = [("fcw.0", (H, C)), ("fcw.1", (2 * H, C)), ("fcb.0", (H,)), ("fcprojw.0", (C, H)),
           ("fcprojw.1", (C, 2 * H)), ("fcprojb.0", (C,)),
           ("routerw.1", (4, C)), ("expertfcw.1", (4, H, C)), ("expertprojw.1", (4, C, H))]
    config = gpt2_config(L=2, NH=2, C=C, V=11, maxT=6, E=4, K=2, S=2, N=2)
    c.check("GPT-2 L=2 moe_every 2: block 0 dense (with MLP biases), block 1 MoE (S=2 shared), tensor-major",
            parameter_shapes(config) == common + mlp + [("lnfw", (C,)), ("lnfb", (C,))])
    config = llama_config(L=3, NH=2, KVH=1, C=C, F=F, V=11, maxT=6, E=4, K=2, S=0, N=3)
    c.check("Llama L=3 moe_every 3: blocks 0 and 1 dense, block 2 MoE without shared experts",
            [(n, s) for n, s in parameter_shapes(config) if tensor_name(n) in ("fcw", "fcprojw", "routerw",
                                                                              "expertfcw", "expertprojw")] ==
            [("fcw.0", (2 * F, C)), ("fcw.1", (2 * F, C)), ("fcprojw.0", (C, F)), ("fcprojw.1", (C, F)),
             ("routerw.2", (4, C)), ("expertfcw.2", (4, 2 * F, C)), ("expertprojw.2", (4, C, F))])

    recorded = {"moe_small": [(6.154908657073975, 6.540705134930747), (5.3525614738464355, 3.5803351853818546),
                              (5.09158182144165, 3.0501636062313295)],
                "llama_moe_small": [(6.161511421203613, 5.067730365225642),
                                    (5.739358425140381, 3.8649901277317356),
                                    (5.4745073318481445, 3.2552144636708347)]}
    for name, expected in recorded.items():
        config = config_from(CONFIGS[name])
        L, C, Vp, E, S = config["L"], config["C"], config["Vp"], config["E"], config["S"]
        if config["arch"] == "gpt2":
            H, maxT = 4 * C, config["maxT"]
            before = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
                      ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
                      ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, S * H, C)), ("fcprojw", (L, C, S * H)),
                      ("routerw", (L, E, C)), ("expertfcw", (L, E, H, C)), ("expertprojw", (L, E, C, H)),
                      ("lnfw", (C,)), ("lnfb", (C,))]
        else:
            HS, H = C // config["NH"], config["F"]
            before = [("wte", (Vp, C)), ("ln1w", (L, C)),
                      ("qkvw", (L, (config["NH"] + 2 * config["KVH"]) * HS, C)), ("attprojw", (L, C, C)),
                      ("ln2w", (L, C)), ("fcw", (L, 2 * S * H, C)), ("fcprojw", (L, C, S * H)),
                      ("routerw", (L, E, C)), ("expertfcw", (L, E, 2 * H, C)), ("expertprojw", (L, E, C, H)),
                      ("lnfw", (C,)), ("lmhead", (Vp, C))]
        c.check(f"{name} (moe_every 1): the tensors of the model file as before --moe-every",
                parameter_shapes(config) == per_layer(before) and config["N"] == 1)
        got = three_recorded_steps(config, MoeTraining(0.01, 0.001, 1.0))
        err = max(abs(x - y) / abs(y) for pair, want in zip(got, expected) for x, y in zip(pair, want))
        c.check(f"{name} (moe_every 1): 3 steps' losses and gradient norms as recorded before --moe-every",
                err < 1e-6, "bitwise" if got == expected else f"max rel diff {err:.1e}")

    moe = config_from(CONFIGS["moe_small"])                                          # L = 2
    problems = [shape_problem(dict(moe, N=N)) for N in (0, -1, 3)] + [
        shape_problem(dict(config_from(CONFIGS["small"]), N=2))]
    c.check("moe_every refused below 1, above L (no MoE block) and in a dense model; N = L taken",
            all(problems) and shape_problem(dict(moe, N=2)) is None, f"{problems}")

    path = os.path.join(tmp, "moe_every_slot15.bin")
    write_model(path, init_params(moe, seed=3, dtype=torch.float32), moe)
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    with open(path, "r+b") as f:                          # slot [15] of 1 rewritten as 0
        f.seek(15 * 4)
        f.write(np.int32(0).tobytes())
    c.check("model file: slot [15] 1 for moe_every 1, and 0 read as 1",
            header[15] == 1 and read_model(path)[1] == moe)

    config = dict(moe, N=2)
    inputs = torch.randint(0, config["V"], (3, 7), generator=c.g)
    targets = torch.randint(0, config["V"], (3, 7), generator=c.g)
    _, _, _, router = forward(trainable(init_params(config, seed=3, dtype=torch.float32)), config, inputs, targets)
    c.check("moe_small --moe-every 2: the dense block 0 routes nothing, block 1 all B T K assignments",
            router["routed"].tolist()[0] == [0] * 4 and int(router["routed"][1].sum()) == 3 * 7 * 2,
            f"routed {router['routed'].tolist()}")


def check_init(c):
    """The initialisation of the small shapes: loss close to log(V) (the init logits are small, the
    softmax nearly uniform), zero padded rows and logits, bf16-representable values, the two stds."""
    for name, config in small_shapes():
        params = init_params(config, seed=1337, dtype=torch.float32)
        inputs = torch.randint(0, 500, (3, 37), generator=c.g)
        targets = torch.randint(0, 500, (3, 37), generator=c.g)
        logits, loss, _, _ = forward(trainable(params), config, inputs, targets)
        c.check(f"{name} init: loss ~ log(V)", abs(float(loss) - math.log(500)) < 0.05,
                f"{float(loss):.4f} vs {math.log(500):.4f}")
        c.check(f"{name} init: padded vocab rows and their logits are zero",
                all(bool((params[n][500:] == 0).all()) for n in ("wte", "lmhead") if n in params) and
                bool((logits[..., 500:] == 0).all()))
        c.check(f"{name} init: every parameter is bf16-representable",
                all(bool((p == p.to(torch.bfloat16).to(torch.float32)).all()) for p in params.values()))
        stds = {n: float(whole(params, n).std()) for n in ("qkvw", "fcprojw")}
        c.check(f"{name} init: std 0.02 and 0.02/sqrt(2L)", abs(stds["qkvw"] - 0.02) < 0.002 and
                abs(stds["fcprojw"] - 0.01) < 0.001, f"{stds}")
        if config["E"]:
            stds = {n: float(whole(params, n).std()) for n in ("routerw", "expertfcw", "expertprojw")}
            c.check(f"{name} init: router and experts std 0.02, expert projections 0.02/sqrt(2L)",
                    abs(stds["routerw"] - 0.02) < 0.002 and abs(stds["expertfcw"] - 0.02) < 0.002 and
                    abs(stds["expertprojw"] - 0.01) < 0.001, f"{stds}")
        if config["arch"] == "llama":
            c.check(f"{name} init: norm weights 1, head untied",
                    all(bool((whole(params, n) == 1).all()) for n in NORM_WEIGHTS) and
                    not torch.equal(params["lmhead"], params["wte"]))


def check_adamw(c):
    """The hand-written AdamW against torch.optim.AdamW (which decays first, then steps: the same math), on
    Llama's tensors (GPT-2's differ only in which names are in DECAYED)."""
    params = init_params(config_from(CONFIGS["llama_small"]), seed=2, dtype=torch.float64)
    ours_params = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    twin = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    ours = AdamW(ours_params, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    decayed = [n for n in twin if tensor_name(n) in DECAYED]
    theirs = torch.optim.AdamW([{"params": [twin[n] for n in decayed], "weight_decay": 0.1},
                                {"params": [twin[n] for n in twin if n not in decayed], "weight_decay": 0.0}],
                               lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    for scale in (1.0, 1.0, 0.25):   # the last step as if clipped: gradients scaled by 0.25
        for n in ours_params:
            grad = torch.randn(params[n].shape, generator=c.g, dtype=torch.float64)
            ours_params[n].grad, twin[n].grad = grad.clone(), grad * scale
        ours.step(scale)
        theirs.step()
    err = max(c.rel_err(ours_params[n].detach(), twin[n].detach()) for n in params)
    c.check("AdamW vs torch.optim.AdamW (float64, 3 steps, one clipped)", err < 1e-12, f"max rel err {err:.2e}")


def check_files(c, tmp, name, config):
    """The model file (both versions) and the state file of one shape, written as the docstring lays them
    out and read back."""
    params = init_params(config, seed=3, dtype=torch.float32)
    stem = os.path.join(tmp, name.replace(" ", ""))
    for dtype_name in ("fp32", "bf16"):
        path = f"{stem}_{dtype_name}.bin"
        write_model(path, params, config, dtype_name)
        loaded, loaded_config = read_model(path)
        same = loaded_config == config and all(torch.equal(loaded[n], params[n]) for n in params)
        c.check(f"{name}: model file round trip ({dtype_name})", same)

    # the header slot by slot, read here with numpy rather than by read_model (the bf16 file is the last)
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    expected = [model_magic(config), 5] + [config[k] for k in ("maxT", "V", "L", "NH", "C", "Vp")]
    if config["arch"] == "llama":
        expected += [config["KVH"], config["F"], f32_bits(config["theta"]), f32_bits(config["eps"])]
    else:
        expected += [0, 0, 0, 0]
    expected += [config["E"], config["K"], config["S"], config["N"] if config["E"] else 0]
    c.check(f"{name}: model header slots", header[:len(expected)].tolist() == expected and
            not header[len(expected):].any(), f"{header[:16].tolist()}")
    # tensor-major: layer 1 of qkvw follows layer 0 of qkvw, not layer 0's next tensor
    raw = np.fromfile(path, dtype=np.uint16, offset=HEADER_INTS * 4)
    names = [n for n, _ in parameter_shapes(config)]
    start = sum(params[n].numel() for n in names[:names.index("qkvw.1")])
    stored = torch.from_numpy((raw[start:start + 4].astype(np.uint32) << 16).view(np.float32))
    c.check(f"{name}: qkvw is stored tensor-major (layer 1 right after layer 0)",
            names.index("qkvw.1") == names.index("qkvw.0") + 1 and
            torch.equal(stored, params["qkvw.1"].reshape(-1)[:4]))

    B, T = 2, 5
    inputs = torch.randint(0, config["V"], (B, T), generator=c.g)
    targets = torch.randint(0, config["V"], (B, T), generator=c.g)
    hyper = argparse.Namespace(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                               grad_clip=1.0, moe_aux_loss=0.01, moe_z_loss=0.001, capacity_factor=1.0)
    w = trainable(params)
    logits, loss, token_embeddings, router = forward(w, config, inputs, targets, hyper.capacity_factor)
    backward(w, MoeTraining(0.01, 0.001, 1.0).total(loss, router), token_embeddings, inputs)
    grads = file_grads(w)
    path = f"{stem}_state.bin"
    numbers = router_numbers(router)
    write_state(path, hyper, B, T, inputs, targets, logits, float(loss), numbers, grads, config,
                [1.5, 2.5, 3.5], [0.5, 0.25, 0.125])
    s = read_state(path, config)
    flat_grads = torch.cat([grads[n].reshape(-1) for n in names])
    if numbers is None:                 # what a dense model's state holds
        numbers = dict(aux=0.0, z=0.0, routed=np.zeros(0, dtype=np.int32), dropped=0)
    same = (s["magic"] == STATE_MAGIC and s["version"] == STATE_VERSION and (s["B"], s["T"], s["steps"]) == (B, T, 3)
            and s["hyper"] == [as_float32(v) for v in (1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0)]
            and s["model_magic"] == model_magic(config) and s["count"] == flat_grads.numel()
            and s["moe"] == [as_float32(v) for v in (0.01, 0.001, 1.0)]
            and np.array_equal(s["inputs"], inputs.reshape(-1).numpy())
            and np.array_equal(s["targets"], targets.reshape(-1).numpy())
            and np.array_equal(s["logits"], logits.detach().reshape(-1).numpy())
            and s["loss"][0] == np.float32(float(loss))
            and s["aux"][0] == np.float32(numbers["aux"]) and s["z"][0] == np.float32(numbers["z"])
            and np.array_equal(s["routed"], numbers["routed"].reshape(-1))
            and s["dropped"][0] == numbers["dropped"]
            and np.array_equal(s["grads"], flat_grads.numpy())
            and s["losses"].tolist() == [1.5, 2.5, 3.5] and s["norms"].tolist() == [0.5, 0.25, 0.125]
            and s["trailing_bytes"] == 0)
    c.check(f"{name}: state file round trip", same,
            "" if numbers["dropped"] == 0 else f"with {numbers['dropped']} dropped assignments")


def check_training(c, name, config):
    """The same steps twice give the same bits (so a state file is reproducible), and they lower the loss.
    GPT-2's MoE shapes train with a capacity factor that drops assignments."""
    inputs = torch.randint(0, config["V"], (2, 5), generator=c.g)
    targets = torch.randint(0, config["V"], (2, 5), generator=c.g)
    moe = MoeTraining(capacity_factor=1.0 if config["arch"] == "gpt2" and config["E"] else 0.0)

    def three_steps():
        params = init_params(config, seed=7, dtype=torch.float32)
        w = trainable(params)
        optimizer = AdamW(w, 1e-3, 0.9, 0.95, 1e-8, 0.1)
        out = [train_step(w, config, inputs, targets, optimizer, 1.0, moe=moe)[:2] for _ in range(3)]
        return out, torch.cat([p.detach().view(-1) for p in params.values()])
    first, second = three_steps(), three_steps()
    c.check(f"{name}: 3 training steps are bitwise repeatable",
            first[0] == second[0] and torch.equal(first[1], second[1]))
    c.check(f"{name}: training lowers the loss", first[0][2][0] < first[0][0][0],
            f"{[round(l, 4) for l, _ in first[0]]}")


def self_check():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    c = Checks()
    check_attention(c)
    check_rope(c)
    check_models(c)
    check_moe_routing(c)
    check_moe_capacity(c)
    check_moe_losses(c)
    check_moe_gradcheck(c)
    check_moe_spec_gradients(c)
    check_dense_unchanged(c)
    check_init(c)
    check_adamw(c)
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in small_shapes():
            check_files(c, tmp, name, config)
        check_moe_every(c, tmp)
    for name, config in small_shapes():
        check_training(c, name, config)
    print(f"{c.passed} passed, {c.failed} failed")
    return c.failed == 0


def main():
    args = parse_args(sys.argv[1:])
    tune_cpu_environment()
    global torch, np
    import numpy as np
    import torch
    if args.self_check:
        sys.exit(0 if self_check() else 1)
    run(args)


if __name__ == "__main__":
    main()
