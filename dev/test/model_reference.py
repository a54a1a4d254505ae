#!/usr/bin/python3
"""
GPT-2 reference in PyTorch: the answers test_gpt.cu checks the CUDA trainer against.

It builds (or loads) a GPT-2, runs a few training steps on one fixed batch in fp32 and writes
  - the model file (llm.c's tensor-major format), so the trainer starts from the very same weights;
  - the reference state: inputs, targets, the logits, loss and every gradient of the first step, and the
    loss and gradient norm of every step, so the trainer's forward, backward and AdamW can each be
    compared on their own.

The model, written out in full so it can be read next to the CUDA kernels:

    x      = wte[token] + wpe[position]                        embeddings, (B, T, C)
    for each of the L blocks:
        x  = x + attproj(attention(qkv(ln1(x))))               pre-LayerNorm: the residual stream x
        x  = x + fcproj(gelu(fc(ln2(x))))                      itself is never normalised
    logits = lnf(x) @ wte^T                                    the LM head is tied to the token embedding
    loss   = mean over the B*T positions of -log softmax(logits[:V])[target]

  layernorm(x) = (x - mean) / sqrt(var + 1e-5) * w + b         biased variance over the C channels
  gelu(x)      = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))      the tanh approximation GPT-2 used
  attention    : qkv splits into q, k, v (C channels each), each split into NH heads of HS = C/NH
                 channels; per head softmax(q k^T / sqrt(HS)) with position t seeing positions <= t,
                 times v; heads concatenated back into C channels.

The vocabulary is padded from V to Vp (a multiple of 128) so the LM head matmul has friendly shapes.
The padded rows of wte are zero, and their logits are left out of the softmax: they are not tokens.
So they get no gradient, weight decay keeps them at zero, and the logits written for columns >= V are 0.

Initialisation (GPT-2's): wte, wpe and the Linear weights ~ N(0, 0.02), except the two projections that
write into the residual stream (attproj, fcproj) ~ N(0, 0.02 / sqrt(2L)), so the stream's variance does
not grow with depth; biases 0, LayerNorm weights 1. Draws come from torch's CPU generator seeded with
--seed, tensor by tensor in model-file order. Every parameter is then rounded to the nearest bf16 value,
so one model file is exact for both the FP32 and the BF16 trainer.

AdamW, per parameter w with gradient g at step t = 1, 2, ... (written out in adamw_step below):
    g = g * min(1, max_norm / ||g||)   (only with --grad-clip > 0; ||g|| is the global norm of all grads)
    m = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
    w = w - lr * ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)
  weight decay only for the 2-D tensors: wte, wpe, qkvw, attprojw, fcw, fcprojw.

Run with Debian's Python (/usr/bin/python3, packages python3-torch python3-numpy libopenblas0).
"""

import argparse
import math
import os
import struct
import sys
import tempfile
import time

MODEL_MAGIC = 20240326
STATE_MAGIC = 20240327
STATE_VERSION = 2
SHARD_MAGIC = 20240520
HEADER_INTS = 256

CONFIGS = {
    "small": dict(layers=2, heads=4, channels=64, vocab=500, max_seq_len=64, batch_size=3, seq_len=37,
                  learning_rate=1e-3),
    "124M": dict(layers=12, heads=12, channels=768, vocab=50257, max_seq_len=1024, batch_size=4, seq_len=64,
                 learning_rate=1e-4),
}

# The parameter tensors in model-file order. Shapes in terms of L layers, C channels, Vp padded vocab,
# maxT positions; "decay" marks the 2-D tensors that get weight decay.
def parameter_shapes(L, C, Vp, maxT):
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]

DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def fail(message):
    """Every bad input ends here: one line naming the problem, exit status 1."""
    sys.stdout.flush()
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def padded_vocab(V):
    return (V + 127) // 128 * 128


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="GPT-2 in PyTorch (fp32): writes a model file and the reference state that test_gpt "
                    "compares the CUDA trainer against, and times training steps for the CPU benchmark.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""\
examples:
  /usr/bin/python3 dev/test/model_reference.py --config small --model-out small.bin --state-out small_state.bin
  /usr/bin/python3 dev/test/model_reference.py --config 124M --tokens data/train_000000.bin \\
      --model-out gpt2_124M.bin --state-out gpt2_124M_state.bin
  /usr/bin/python3 dev/test/model_reference.py --model gpt2_124M.bin --steps 0 --bench 5
  /usr/bin/python3 dev/test/model_reference.py --self-check

CPU speed: the best setting measured on 2 cores is OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE, plus
OPENBLAS_CORETYPE=SkylakeX on CPUs with AVX-512 (/proc/cpuinfo lists avx512f; OpenBLAS 0.3.21 does not
recognise some of them and falls back to a kernel ~5x slower; never set it on a CPU without AVX-512).
This script sets OMP_WAIT_POLICY=PASSIVE, and OPENBLAS_CORETYPE=SkylakeX when avx512f is present,
whenever they are not already in the environment; torch uses OMP_NUM_THREADS threads (default 2).""")
    model = parser.add_argument_group("model")
    model.add_argument("--config", choices=sorted(CONFIGS), default=None,
                       help="preset shape: small (L=2, NH=4, C=64, V=500, maxT=64) or 124M "
                            "(L=12, NH=12, C=768, V=50257, maxT=1024); default small")
    model.add_argument("--layers", type=int, help="number of blocks L (overrides --config)")
    model.add_argument("--heads", type=int, help="attention heads NH (overrides --config)")
    model.add_argument("--channels", type=int, help="channels C (overrides --config)")
    model.add_argument("--vocab", type=int, help="vocabulary size V; padded to a multiple of 128")
    model.add_argument("--max-seq-len", type=int, help="positions in wpe, maxT (overrides --config)")
    model.add_argument("--model", metavar="PATH",
                       help="load this model file (version 3 fp32 or 5 bf16) instead of creating one")
    model.add_argument("--seed", type=int, default=1337,
                       help="seed of the initialisation and of the random batch (default 1337)")
    model.add_argument("--model-out", metavar="PATH", help="write the model file here")
    model.add_argument("--model-dtype", choices=["fp32", "bf16"], default="fp32",
                       help="parameters in --model-out: fp32 (version 3, default) or bf16 (version 5); "
                            "both hold the same values after the bf16 rounding")
    batch = parser.add_argument_group("batch")
    batch.add_argument("--batch-size", type=int, help="B (default 3 for small, 4 for 124M)")
    batch.add_argument("--seq-len", type=int, help="T (default 37 for small, 64 for 124M)")
    batch.add_argument("--tokens", metavar="SHARD",
                       help="take the batch from the start of this token shard: inputs[b,t] = "
                            "tokens[b*T+t], targets[b,t] = tokens[b*T+t+1]; default: random ids in [0, V)")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=10, help="training steps on the batch (default 10)")
    train.add_argument("--learning-rate", type=float,
                       help="AdamW learning rate (default 1e-3 for small, 1e-4 otherwise)")
    train.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1 (default 0.9)")
    train.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2 (default 0.95)")
    train.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon (default 1e-8)")
    train.add_argument("--weight-decay", type=float, default=0.1,
                       help="decoupled weight decay of the 2-D tensors (default 0.1)")
    train.add_argument("--grad-clip", type=float, default=0.0,
                       help="clip the global gradient norm to this (default 0 = no clipping)")
    output = parser.add_argument_group("output")
    output.add_argument("--state-out", metavar="PATH", help="write the reference state file here")
    output.add_argument("--bench", type=int, default=0, metavar="N",
                        help="also time N training steps (forward, backward, AdamW) at this shape")
    output.add_argument("--self-check", action="store_true",
                        help="check this script's own math (attention, the whole model against a naive "
                             "float64 version, finite-difference gradients, AdamW, file round trips); "
                             "exits non-zero on any failure")
    args = parser.parse_args(argv)

    explicit = {k: getattr(args, k) for k in ("layers", "heads", "channels", "vocab", "max_seq_len")
                if getattr(args, k) is not None}
    if args.model and (explicit or args.config):
        fail("--model takes the shape from the file: do not combine it with --config or --layers/--heads/"
             "--channels/--vocab/--max-seq-len")
    for key in ("layers", "heads", "channels", "vocab", "max_seq_len", "batch_size", "seq_len"):
        if getattr(args, key) is not None and getattr(args, key) <= 0:
            fail(f"--{key.replace('_', '-')} must be positive, not {getattr(args, key)}")
    if not args.model:
        preset = CONFIGS[args.config or "small"]
        for key in ("layers", "heads", "channels", "vocab", "max_seq_len"):
            if getattr(args, key) is None:
                setattr(args, key, preset[key])
        if args.channels % args.heads != 0:
            fail(f"--channels {args.channels} is not divisible by --heads {args.heads}")
    if args.steps < 0 or args.bench < 0:
        fail("--steps and --bench must not be negative")
    if args.state_out and args.steps < 1:
        fail("--state-out needs at least one step (--steps >= 1)")
    if args.grad_clip < 0:
        fail("--grad-clip must be >= 0")
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
# the model

def layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def causal_self_attention(qkv, NH):
    """qkv (B, T, 3C) -> (B, T, C). q, k, v are the three C-wide thirds; head h owns channels
    h*HS .. h*HS+HS-1 of each."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    HS = C // NH
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, HS).transpose(1, 2)                      # (B, NH, T, HS)
    k = k.view(B, T, NH, HS).transpose(1, 2)
    v = v.view(B, T, NH, HS).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))     # (B, NH, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v                          # (B, NH, T, HS)
    return y.transpose(1, 2).reshape(B, T, C)


def trainable(params):
    """The tensors autograd and AdamW work on: wte, wpe, lnfw, lnfb and one tensor per layer per stacked
    tensor ("qkvw.3" is layer 3 of qkvw). Each shares memory with params, so an update to one is an
    update to the other, and each gets its own gradient (no per-step scatter into the stacked tensors)."""
    w = {}
    for name, tensor in params.items():
        if name in ("wte", "wpe", "lnfw", "lnfb"):
            w[name] = tensor.detach().requires_grad_(True)
        else:
            for l in range(tensor.shape[0]):
                w[f"{name}.{l}"] = tensor[l].detach().requires_grad_(True)
    return w


def backward(w, loss, token_embeddings, inputs):
    """Gradients of loss into w[...].grad. wte's has two parts: the LM head's (from autograd) and, for
    each position, the gradient of its token's embedding, added to that token's row."""
    loss.backward()
    C = w["wte"].shape[1]
    w["wte"].grad.index_add_(0, inputs.reshape(-1), token_embeddings.grad.reshape(-1, C))


def stacked_grads(w, params):
    """The gradients of trainable(params) in the shapes and order of the model file."""
    return {name: w[name].grad if name in w else
            torch.stack([w[f"{name}.{l}"].grad for l in range(tensor.shape[0])])
            for name, tensor in params.items()}


def forward(w, config, inputs, targets):
    """w from trainable(). Returns the logits over all Vp columns, the mean cross-entropy over the first V
    columns, and the looked-up token embeddings that backward() needs."""
    L, NH, V = config["L"], config["NH"], config["V"]
    B, T = inputs.shape
    # The token lookup is kept out of autograd: its backward would zero-fill a second (Vp, C) gradient
    # every step and add it to the LM head's. backward() scatters into wte.grad in place instead.
    token_embeddings = w["wte"].detach()[inputs].requires_grad_(True)
    x = token_embeddings + w["wpe"][:T]
    for l in range(L):
        h = layernorm(x, w[f"ln1w.{l}"], w[f"ln1b.{l}"])
        qkv = torch.nn.functional.linear(h, w[f"qkvw.{l}"], w[f"qkvb.{l}"])
        y = causal_self_attention(qkv, NH)
        x = x + torch.nn.functional.linear(y, w[f"attprojw.{l}"], w[f"attprojb.{l}"])
        h = layernorm(x, w[f"ln2w.{l}"], w[f"ln2b.{l}"])
        h = gelu_tanh(torch.nn.functional.linear(h, w[f"fcw.{l}"], w[f"fcb.{l}"]))
        x = x + torch.nn.functional.linear(h, w[f"fcprojw.{l}"], w[f"fcprojb.{l}"])
    x = layernorm(x, w["lnfw"], w["lnfb"])
    logits = x @ w["wte"].t()                                       # (B, T, Vp)
    # the padded columns are not tokens: they take no part in the softmax
    loss = torch.nn.functional.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))
    return logits, loss, token_embeddings


def init_params(config, seed, dtype):
    L, C, V, Vp, maxT = config["L"], config["C"], config["V"], config["Vp"], config["maxT"]
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * L)
    params = {}
    for name, shape in parameter_shapes(L, C, Vp, maxT):
        if name in ("ln1w", "ln2w", "lnfw"):
            tensor = torch.ones(shape, dtype=torch.float32)
        elif name in DECAYED:
            std = residual_std if name in ("attprojw", "fcprojw") else 0.02
            tensor = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
        else:
            tensor = torch.zeros(shape, dtype=torch.float32)
        # one file for both trainers: every value exactly representable in bf16
        tensor = tensor.to(torch.bfloat16).to(torch.float32)
        params[name] = tensor
    params["wte"][V:] = 0.0
    return {name: t.to(dtype) for name, t in params.items()}


def make_config(L, NH, C, V, maxT, Vp=None):
    return dict(L=L, NH=NH, C=C, V=V, Vp=Vp if Vp is not None else padded_vocab(V), maxT=maxT)


# ----------------------------------------------------------------------------------------------------
# files

def write_model(path, params, config, dtype_name="fp32"):
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:8] = [MODEL_MAGIC, 3 if dtype_name == "fp32" else 5, config["maxT"], config["V"], config["L"],
                  config["NH"], config["C"], config["Vp"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, _ in parameter_shapes(config["L"], config["C"], config["Vp"], config["maxT"]):
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
            if header[0] != MODEL_MAGIC:
                fail(f"{path}: bad magic {header[0]} (not a model file, expected {MODEL_MAGIC})")
            version = int(header[1])
            if version not in (3, 5):
                fail(f"{path}: unsupported version {version} (3 = fp32, 5 = bf16)")
            maxT, V, L, NH, C, Vp = (int(v) for v in header[2:8])
            if min(maxT, V, L, NH, C, Vp) <= 0 or C % NH != 0 or Vp < V:
                fail(f"{path}: inconsistent shape maxT={maxT} V={V} L={L} NH={NH} C={C} Vp={Vp}")
            config = make_config(L, NH, C, V, maxT, Vp)
            shapes = parameter_shapes(L, C, Vp, maxT)
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


def f32_bits(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


def write_state(path, args, B, T, inputs, targets, logits, loss, grads, config, losses, norms):
    header = np.zeros(HEADER_INTS, dtype=np.int32)
    header[:5] = [STATE_MAGIC, STATE_VERSION, B, T, len(losses)]
    header[5:11] = [f32_bits(v) for v in (args.learning_rate, args.beta1, args.beta2, args.eps,
                                          args.weight_decay, args.grad_clip)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(inputs.to(torch.int32).numpy().tobytes())
        f.write(targets.to(torch.int32).numpy().tobytes())
        f.write(logits.detach().to(torch.float32).contiguous().numpy().tobytes())
        f.write(np.array([loss], dtype=np.float32).tobytes())
        for name, _ in parameter_shapes(config["L"], config["C"], config["Vp"], config["maxT"]):
            f.write(grads[name].to(torch.float32).contiguous().numpy().tobytes())
        f.write(np.array(losses, dtype=np.float32).tobytes())
        f.write(np.array(norms, dtype=np.float32).tobytes())


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
                    if name.split(".")[0] in DECAYED:
                        update.add_(w, alpha=self.wd)
                    w.sub_(update, alpha=self.lr)


def global_norm(w):
    # summed in float64, a slice at a time: an fp32 sum over wte's 38M squares drifts by ~1e-5 relative
    total = 0.0
    for p in w.values():
        for piece in p.grad.view(-1).split(1 << 20):
            total += float(piece.double().square_().sum())
    return math.sqrt(total)


def train_step(params, w, config, inputs, targets, optimizer, grad_clip, keep=False):
    """One forward, backward and AdamW update of w = trainable(params). Returns (loss, grad norm before
    clipping) and, with keep, also the logits and the gradients (file order), taken before the update."""
    for p in w.values():
        p.grad = None
    logits, loss, token_embeddings = forward(w, config, inputs, targets)
    backward(w, loss, token_embeddings, inputs)
    norm = global_norm(w)
    kept = (logits.detach(), stacked_grads(w, params)) if keep else None
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
        config = make_config(args.layers, args.heads, args.channels, args.vocab, args.max_seq_len)
        params = init_params(config, args.seed, torch.float32)
    # batch and learning-rate defaults: those of the preset with this exact shape, else of --config or small
    preset = CONFIGS[args.config or "small"]
    for candidate in CONFIGS.values():
        if make_config(candidate["layers"], candidate["heads"], candidate["channels"], candidate["vocab"],
                       candidate["max_seq_len"]) == config:
            preset = candidate
    for key in ("batch_size", "seq_len", "learning_rate"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    count = sum(p.numel() for p in params.values())
    print(f"model: L={config['L']} NH={config['NH']} C={config['C']} V={config['V']} Vp={config['Vp']} "
          f"maxT={config['maxT']}, {count:,} parameters ({'loaded from ' + args.model if args.model else 'seed %d' % args.seed})")
    if args.model_out:
        write_model(args.model_out, params, config, args.model_dtype)
        print(f"wrote {args.model_out}")

    inputs, targets = make_batch(args, config)
    B, T = inputs.shape
    print(f"batch: B={B} T={T} from {args.tokens or 'random ids (seed %d)' % (args.seed + 1)}; "
          f"lr={args.learning_rate:g} betas=({args.beta1:g}, {args.beta2:g}) eps={args.eps:g} "
          f"wd={args.weight_decay:g} clip={args.grad_clip:g}; threads={torch.get_num_threads()}")

    w = trainable(params)
    optimizer = AdamW(w, args.learning_rate, args.beta1, args.beta2, args.eps, args.weight_decay)
    losses, norms, first = [], [], None
    start = time.perf_counter()
    for step in range(args.steps):
        loss, norm, kept = train_step(params, w, config, inputs, targets, optimizer, args.grad_clip,
                                      keep=(step == 0 and args.state_out is not None))
        if kept:
            first = (kept[0], loss, kept[1])
        losses.append(loss)
        norms.append(norm)
        print(f"step {step + 1:3d}/{args.steps}: loss {loss:.6f}  grad norm {norm:.6f}")
    if args.steps:
        elapsed = time.perf_counter() - start
        print(f"{args.steps} steps in {elapsed:.2f} s: {1000 * elapsed / args.steps:.1f} ms/step")

    if args.state_out:
        logits, loss, grads = first
        write_state(args.state_out, args, B, T, inputs, targets, logits, loss, grads, config, losses, norms)
        print(f"wrote {args.state_out}")

    if args.bench:
        train_step(params, w, config, inputs, targets, optimizer, args.grad_clip)   # warm-up
        start = time.perf_counter()
        for _ in range(args.bench):
            train_step(params, w, config, inputs, targets, optimizer, args.grad_clip)
        seconds = (time.perf_counter() - start) / args.bench
        print(f"pytorch: {1000 * seconds:.1f} ms/step, {B * T / seconds:.1f} tokens/s "
              f"(B={B}, T={T}, {torch.get_num_threads()} threads, mean of {args.bench} steps)")


# ----------------------------------------------------------------------------------------------------
# self-check: the reference is only useful if it is right

def naive_forward_loss(params, config, inputs, targets):
    """The same model with every operation spelled out element by element in float64 Python loops over
    positions, independent of the vectorised code above. Tiny shapes only."""
    L, NH, C, V = config["L"], config["NH"], config["C"], config["V"]
    HS = C // NH
    B, T = inputs.shape
    P = {k: v.double() for k, v in params.items()}

    def ln(row, w, b):
        mean = row.sum() / C
        var = ((row - mean) ** 2).sum() / C
        return (row - mean) / math.sqrt(float(var) + 1e-5) * w + b

    total = 0.0
    for b in range(B):
        x = [P["wte"][int(inputs[b, t])] + P["wpe"][t] for t in range(T)]
        for l in range(L):
            qkv = [P["qkvw"][l] @ ln(x[t], P["ln1w"][l], P["ln1b"][l]) + P["qkvb"][l] for t in range(T)]
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
                out.append(P["attprojw"][l] @ y + P["attprojb"][l])
            x = [x[t] + out[t] for t in range(T)]
            for t in range(T):
                u = P["fcw"][l] @ ln(x[t], P["ln2w"][l], P["ln2b"][l]) + P["fcb"][l]
                g = torch.tensor([0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
                                  for z in u.tolist()], dtype=torch.float64)
                x[t] = x[t] + P["fcprojw"][l] @ g + P["fcprojb"][l]
        for t in range(T):
            logits = (P["wte"][:V] @ ln(x[t], P["lnfw"], P["lnfb"])).tolist()
            top = max(logits)
            lse = top + math.log(sum(math.exp(z - top) for z in logits))
            total += lse - logits[int(targets[b, t])]
    return total / (B * T)


def self_check():
    passed, failed = 0, 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    def rel_err(a, b):
        return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    # 1. vectorised attention against an explicit loop over heads, queries and keys (float64)
    g = torch.Generator().manual_seed(1)
    B, T, NH, HS = 2, 7, 3, 5
    C = NH * HS
    qkv = torch.randn(B, T, 3 * C, generator=g, dtype=torch.float64)
    ref = torch.zeros(B, T, C, dtype=torch.float64)
    for b in range(B):
        for h in range(NH):
            for t in range(T):
                q = qkv[b, t, h * HS:(h + 1) * HS]
                s = torch.stack([(q * qkv[b, u, C + h * HS:C + (h + 1) * HS]).sum() / math.sqrt(HS)
                                 for u in range(t + 1)])
                p = torch.exp(s - s.max())
                p = p / p.sum()
                for u in range(t + 1):
                    ref[b, t, h * HS:(h + 1) * HS] += p[u] * qkv[b, u, 2 * C + h * HS:2 * C + (h + 1) * HS]
    err = rel_err(causal_self_attention(qkv, NH), ref)
    check("attention vs loops (float64)", err < 1e-12, f"max rel err {err:.2e}")

    # 2. the whole model against the element-by-element version (float64, tiny shape, weights made larger
    #    than the init so every op matters, padded rows of wte non-zero to prove they are ignored)
    config = make_config(L=2, NH=2, C=8, V=11, maxT=6)
    params = init_params(config, seed=5, dtype=torch.float64)
    for name, p in params.items():
        p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    inputs = torch.randint(0, config["V"], (2, 5), generator=g)
    targets = torch.randint(0, config["V"], (2, 5), generator=g)
    w = trainable(params)
    _, loss, _ = forward(w, config, inputs, targets)
    naive = naive_forward_loss(params, config, inputs, targets)
    check("model loss vs naive float64 model", abs(float(loss) - naive) < 1e-10 * abs(naive),
          f"{float(loss):.12f} vs {naive:.12f}")

    # 3. gradients against central finite differences (float64), a few entries of every tensor; the padded
    #    wte rows must get exactly zero gradient
    _, loss, token_embeddings = forward(w, config, inputs, targets)
    backward(w, loss, token_embeddings, inputs)
    grads = stacked_grads(w, params)
    worst, h = 0.0, 1e-6
    with torch.no_grad():
        for name, p in params.items():
            flat, grad = p.view(-1), grads[name].reshape(-1)
            rows = p.shape[0] if name != "wte" else config["V"]     # entries that can matter
            limit = rows * (p.numel() // p.shape[0])
            indices = torch.randint(0, limit, (3,), generator=g).tolist()
            if name == "wte":   # rows of tokens in the batch: both the lookup and the LM head use them
                indices += [int(inputs[0, 0]) * config["C"] + 1, int(inputs[1, 2]) * config["C"] + 5]
            for index in indices:
                saved = float(flat[index])
                flat[index] = saved + h
                plus = float(forward(w, config, inputs, targets)[1])
                flat[index] = saved - h
                minus = float(forward(w, config, inputs, targets)[1])
                flat[index] = saved
                numeric = (plus - minus) / (2 * h)
                worst = max(worst, abs(numeric - float(grad[index])) / max(abs(numeric), 1e-3))
    check("gradients vs finite differences (float64, 3-5 entries per tensor)", worst < 1e-6,
          f"worst rel err {worst:.2e}")
    padded = grads["wte"][config["V"]:]
    check("padded wte rows get zero gradient", bool((padded == 0).all()))

    # 4. loss at initialisation is close to log(V): the init logits are small, the softmax nearly uniform
    config = make_config(L=2, NH=4, C=64, V=500, maxT=64)
    params = init_params(config, seed=1337, dtype=torch.float32)
    inputs = torch.randint(0, 500, (3, 37), generator=g)
    targets = torch.randint(0, 500, (3, 37), generator=g)
    logits, loss, _ = forward(trainable(params), config, inputs, targets)
    check("init loss ~ log(V)", abs(float(loss) - math.log(500)) < 0.05,
          f"{float(loss):.4f} vs {math.log(500):.4f}")
    check("init: padded wte rows and their logits are zero",
          bool((params["wte"][500:] == 0).all() and (logits[..., 500:] == 0).all()))
    check("init: every parameter is bf16-representable",
          all(bool((p == p.to(torch.bfloat16).to(torch.float32)).all()) for p in params.values()))
    stds = {n: float(params[n].std()) for n in ("qkvw", "fcprojw")}
    check("init: std 0.02 and 0.02/sqrt(2L)", abs(stds["qkvw"] - 0.02) < 0.002 and
          abs(stds["fcprojw"] - 0.01) < 0.001, f"{stds}")

    # 5. the hand-written AdamW against torch.optim.AdamW (which decays first, then steps: the same math)
    p64 = {n: p.double().clone().requires_grad_(True) for n, p in params.items()}
    twin = {n: p.detach().clone().requires_grad_(True) for n, p in p64.items()}
    ours = AdamW(p64, 1e-3, 0.9, 0.95, 1e-8, 0.1)
    theirs = torch.optim.AdamW([{"params": [twin[n] for n in twin if n in DECAYED], "weight_decay": 0.1},
                                {"params": [twin[n] for n in twin if n not in DECAYED], "weight_decay": 0.0}],
                               lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    for scale in (1.0, 1.0, 0.25):   # the last step as if clipped: gradients scaled by 0.25
        for n in p64:
            grad = torch.randn(p64[n].shape, generator=g, dtype=torch.float64)
            p64[n].grad, twin[n].grad = grad.clone(), grad * scale
        ours.step(scale)
        theirs.step()
    err = max(rel_err(p64[n].detach(), twin[n].detach()) for n in p64)
    check("AdamW vs torch.optim.AdamW (float64, 3 steps, one clipped)", err < 1e-12, f"max rel err {err:.2e}")

    # 6. model files round-trip in both versions; a loaded model gives the same loss
    with tempfile.TemporaryDirectory() as tmp:
        for dtype_name in ("fp32", "bf16"):
            path = os.path.join(tmp, f"model_{dtype_name}.bin")
            write_model(path, params, config, dtype_name)
            loaded, loaded_config = read_model(path)
            same = loaded_config == config and all(torch.equal(loaded[n], params[n]) for n in params)
            check(f"model file round trip ({dtype_name})", same)

    # 7. determinism: the same steps twice give the same bits
    def three_steps():
        ps = init_params(config, seed=7, dtype=torch.float32)
        ws = trainable(ps)
        opt = AdamW(ws, 1e-3, 0.9, 0.95, 1e-8, 0.1)
        out = [train_step(ps, ws, config, inputs, targets, opt, 1.0)[:2] for _ in range(3)]
        return out, torch.cat([p.detach().view(-1) for p in ps.values()])
    first, second = three_steps(), three_steps()
    check("3 training steps are bitwise repeatable", first[0] == second[0] and torch.equal(first[1], second[1]))
    check("training lowers the loss", first[0][2][0] < first[0][0][0], f"{[round(l, 4) for l, _ in first[0]]}")

    print(f"{passed} passed, {failed} failed")
    return failed == 0


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
