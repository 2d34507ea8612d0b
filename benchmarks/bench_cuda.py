"""Issue 35's speed table on one device, beside torch on the same device, each row checked against a reference.

Rows (each prints polygrad's figure, torch's, their ratio, and the check that passed or failed):
- matmul N x N x N in fp32 (torch without TF32), fp16 and bf16: TFLOP/s, best of several synchronised runs;
  a 64 x 64 corner checked against NumPy in float64; the row names the opts the kernel was lowered with
  (TILE: shared-memory tiles, TC: tensor cores); and a row "fp32 with TF32 opted in" (POLY_ALLOW_TF32=1,
  beside torch with allow_tf32=True): checked against NumPy's product of the operands rounded to TF32
  where it ran on tensor cores (TC:8), against the exact product where the device has none;
- on sm_90 and newer, matmul N in fp16 and bf16 on warpgroup tensor cores (wgmma, opt-in POLY_CUDA_WGMMA=1,
  read when the device opens: measured in a child process that opens it so), checked as the rows above and
  failed unless the kernel was lowered for wgmma (opts TC:64);
- conv2d 3x3 64 -> 64 channels, batch 8, 56x56, padding 1 (a ResNet stage), forward and both gradients:
  TFLOP/s of the three products, beside torch (cuDNN, TF32 off); output and gradients checked against NumPy
  in float64; the row names each kernel's opts (TILE: the implicit GEMM through shared-memory tiles);
- the 784-512-512-10 MLP Adam step at batch 128 (polygrad under TinyJit): ms a step; the losses of the
  first steps and the weights after them checked against the same steps in NumPy;
- a GPT-2-small training step (12 layers, 768 wide, 12 heads, vocabulary 50257) at batch 8 x 512 tokens,
  random weights, built from polygrad's own ops (nn.Embedding, layernorm, scaled_dot_product_attention,
  tanh GELU, cross-entropy, Adam) under TinyJit: ms a step; the first loss checked against a NumPy forward,
  and the losses of the first steps against the same steps in torch when it is installed;
- launch overhead: a JIT replay of 40 tiny kernels in microseconds a kernel, run as one CUDA graph and as one
  launch each (POLY_CUDA_GRAPH=0), beside torch launching the same kernels eagerly; checked against NumPy;
- GPT-2-small greedy decode (polygrad-hf's decoder with a KV cache, loaded from the same random weights
  written as a checkpoint to a temporary folder): tokens/s; the logits of the first decode steps checked
  against a NumPy forward over the whole sequence. torch's figure is the same model in torch with a
  concatenated KV cache (no transformers needed).

Run on a GPU machine: `python benchmarks/bench_cuda.py` (scripts/cuda_check.sh runs it; no network needed);
`--rows matmul --matmul-n N` for the matmuls alone.
torch is measured in the same process when it is installed with CUDA; otherwise a line says why not and the
polygrad rows still print with their NumPy checks. `--tiny` shrinks every size (matmul 64, a 2-layer
64-wide GPT-2 on 2 x 16 tokens) so that the script's code runs on the CPU device in a test
(tests/test_bench_cuda.py). Exit status 1 when a check fails, 2 when the device is missing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

MLP_SIZES, MLP_BATCH = (784, 512, 512, 10), 128
MLP_STEPS = 3  # checked steps (the JIT's compile, capture and first replay); then timed ones


@dataclass(frozen=True)
class GPTShape:
    layers: int
    width: int
    heads: int
    vocab: int
    positions: int
    batch: int
    seq: int
    prompt: int  # decode: prompt length and new tokens
    new_tokens: int


GPT2_SMALL = GPTShape(12, 768, 12, 50257, 1024, 8, 512, 32, 32)
GPT2_TINY = GPTShape(2, 64, 4, 97, 64, 2, 16, 4, 4)


@dataclass
class Row:
    name: str
    polygrad: float  # in `unit`; higher is better when `higher` is True
    unit: str
    check: str  # what was compared and the error found
    ok: bool
    torch: float | None = None
    higher: bool = True
    note: str = ""

    def line(self, torch_label: str) -> str:
        if self.torch is None:
            beside = f"torch: {self.note or 'not measured'}"
        else:
            ratio = self.polygrad / self.torch if self.higher else self.torch / self.polygrad
            label = f"{torch_label} ({self.note})" if self.note else torch_label
            beside = f"{label} {self.torch:.4g} {self.unit} (polygrad at {ratio:.0%} of torch's speed)"
        verdict = "ok" if self.ok else "CHECK FAILED"
        return f"{self.name}: polygrad {self.polygrad:.4g} {self.unit}; {beside}; {self.check}: {verdict}"


# ---- torch on the same device (None with the reason when it cannot run there)

def load_torch(device: str):
    """(torch module, torch device name) or (None, why not)."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed ({exc})"
    if device.upper().startswith("CUDA"):
        if not torch.cuda.is_available():
            return None, f"torch {torch.__version__} has no usable CUDA (built for {torch.version.cuda or 'CPU'})"
        torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32, as polygrad's default
        torch.backends.cudnn.allow_tf32 = False
        return torch, "cuda"
    return torch, "cpu"


def torch_sync(torch, tdev: str) -> None:
    if tdev == "cuda":
        torch.cuda.synchronize()


def best_time(run, sync, repeats: int) -> float:
    """The fastest of `repeats` synchronised calls of run(), in seconds (one untimed call first)."""
    run()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-12))


# ---- matmul

def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), still stored as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def lowered_opts(run, dev) -> str:
    """Run run() once and name the opts its last compiled kernel was lowered with (TILE: shared-memory
    tiles, TC: tensor cores), so that a figure says which kernel it measured; "cached" when nothing compiled."""
    from polygrad.codegen.lower import lower
    from polygrad.engine import programs
    asts = []
    compile_program = programs.get_program
    programs.get_program = lambda ast, device: asts.append(ast) or compile_program(ast, device)
    try:
        run()
    finally:
        programs.get_program = compile_program
    if not asts:
        return "cached"
    return " ".join(f"{o.kind.value}:{o.amount}" for o in lower(asts[-1], dev.capabilities).opts) or "none"


def tf32_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 as cvt.rna.tf32.f32 does (10 mantissa bits, to nearest, ties away
    from zero), still stored as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    finite = (bits & 0x7F800000) != 0x7F800000
    bits = np.where(finite, (bits + 0x1000) & 0xFFFFE000, bits)
    return bits.astype(np.uint32).view(np.float32)


MATMUL_KINDS = ("fp32", "tf32", "fp16", "bf16")


def matmul_rows(n: int, device: str, torch, tdev: str, repeats: int, kinds=MATMUL_KINDS) -> list[Row]:
    from polygrad import Context, Device, Tensor, dtypes
    rng = np.random.default_rng(0)
    rows = []
    for name in kinds:
        a32, b32 = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
        if name == "fp16":
            a_np, b_np = a32.astype(np.float16).astype(np.float32), b32.astype(np.float16).astype(np.float32)
        else:
            a_np, b_np = (bf16_round(a32), bf16_round(b32)) if name == "bf16" else (a32, b32)
        dt = {"fp32": dtypes.float32, "tf32": dtypes.float32, "fp16": dtypes.float16, "bf16": dtypes.bfloat16}[name]
        a = Tensor(a_np, device=device).cast(dt).realize()
        b = Tensor(b_np, device=device).cast(dt).realize()
        out = {}

        def run():
            out["c"] = (a @ b).realize()
        dev = Device[device]
        with Context(POLY_ALLOW_TF32=int(name == "tf32")):
            opts = lowered_opts(run, dev)
            secs = best_time(run, dev.synchronize, repeats)
            corner = out["c"][:64, :64].cast(dtypes.float32).numpy()
        label, a_ref, b_ref = name, a_np, b_np
        if name == "tf32":
            on_cores = "TC:8" in opts.split()
            label = "fp32 with TF32 opted in (POLY_ALLOW_TF32=1)"
            a_ref, b_ref = (tf32_round(a_np), tf32_round(b_np)) if on_cores else (a_np, b_np)
        err = rel_err(corner, a_ref[:64].astype(np.float64) @ b_ref[:, :64].astype(np.float64))
        limit = 1e-5 if name in ("fp32", "tf32") else 1e-2  # 16-bit outputs round to 2^-11 / 2^-8 of their size
        what = "NumPy float64 of the TF32-rounded operands" if a_ref is not a_np else "NumPy float64"
        row = Row(f"matmul {n} {label} (opts {opts})", 2 * n ** 3 / secs / 1e12, "TFLOP/s",
                  f"64x64 corner vs {what}, rel err {err:.1e} (limit {limit:.0e})", err < limit)
        if torch is not None:
            tdt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
            ta = torch.tensor(a_np, device=tdev).to(tdt)
            tb = torch.tensor(b_np, device=tdev).to(tdt)
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"  # torch's TF32 only beside polygrad's
            try:
                row.torch = 2 * n ** 3 / best_time(lambda: ta @ tb, lambda: torch_sync(torch, tdev), repeats) / 1e12
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
            if name == "tf32":
                row.note = "torch with allow_tf32=True"
        rows.append(row)
    return rows


WGMMA_OPTS = "TC:64"  # Opt(TC, k, gpu_opts.WGMMA_DEPTH): the kernel of polygrad_backend_cuda/wgmma.py


def wgmma_rows(n: int, device: str, repeats: int, require_wgmma: bool = True) -> list[Row]:
    """The fp16 and bf16 matmul rows on warpgroup tensor cores: this script again in a child process with
    POLY_CUDA_WGMMA=1 (the device declares wgmma when it opens), its rows read back from a JSON file; a row
    whose kernel was not lowered for wgmma fails its check. None on a device without wgmma (before sm_90),
    unless require_wgmma is False (the test of this plumbing on the host device)."""
    import subprocess
    from polygrad import Device
    arch = getattr(Device[device].capabilities, "arch", "") or ""
    digits = "".join(c for c in arch if c.isdigit())
    if require_wgmma and (not device.upper().startswith("CUDA") or not digits or int(digits) < 90):
        print(f"matmul on wgmma: not run, device {device} ({arch or 'no arch'}) has no warpgroup tensor cores")
        return []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--device", device, "--rows", "matmul", "--kinds",
               "fp16,bf16", "--matmul-n", str(n), "--repeats", str(repeats), "--rows-json", path]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "POLY_CUDA_WGMMA": "1"},
                              timeout=600)
        if not os.path.exists(path):
            return [Row(f"matmul {n} fp16/bf16 on wgmma", 0.0, "TFLOP/s",
                        f"the child process failed (exit {proc.returncode}): {proc.stderr[-400:]}", False)]
        with open(path) as f:
            rows = [Row(**r) for r in json.load(f)]
    for row in rows:
        used = WGMMA_OPTS in row.name
        row.name = row.name.replace(f"matmul {n} ", f"matmul {n} on wgmma (POLY_CUDA_WGMMA=1) ", 1)
        if not used:
            row.ok, row.check = False, f"{row.check}; the kernel was not lowered for wgmma ({WGMMA_OPTS})"
    return rows


# ---- a convolution's training kernels

CONV_SHAPE = (8, 64, 56, 56, 64, 3)  # batch, in channels, height, width, out channels, window (padding 1)
CONV_TINY = (2, 16, 8, 8, 16, 3)


def numpy_conv_step(x: np.ndarray, w: np.ndarray, g: np.ndarray):
    """conv2d with padding k // 2 and stride 1 in float64, and the gradients of sum(y * g) for x and w."""
    k = w.shape[-1]
    p = k // 2
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))  # n, c, h, w, ky, kx
    y = np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64), optimize=True)
    dw = np.einsum("nchwij,nohw->ocij", win, g.astype(np.float64), optimize=True)
    gp = np.pad(g.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    gwin = np.lib.stride_tricks.sliding_window_view(gp, (k, k), axis=(2, 3))
    dx = np.einsum("nohwij,ocij->nchw", gwin, w[:, :, ::-1, ::-1].astype(np.float64), optimize=True)
    return y, dx, dw


def conv_row(tiny: bool, device: str, torch, tdev: str, repeats: int) -> Row:
    """A 3x3 convolution (padding 1) forward and its two gradients (input and weight), as in a ResNet
    stage: TFLOP/s of the three products (3 x 2 n o h w c k k), best of several synchronised runs; the
    output and both gradients checked against NumPy in float64; the row names the opts of each kernel."""
    from polygrad import Context, Device, Tensor
    n, c, h, wd, o, k = CONV_TINY if tiny else CONV_SHAPE
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    w_np = (rng.standard_normal((o, c, k, k)) / math.sqrt(c * k * k)).astype(np.float32)
    g_np = rng.standard_normal((n, o, h, wd)).astype(np.float32)
    x = Tensor(x_np, device=device, requires_grad=True).realize()
    w = Tensor(w_np, device=device, requires_grad=True).realize()
    g = Tensor(g_np, device=device).realize()
    out = {}

    def run():
        x.grad = w.grad = None
        with Context(TRAINING=1):
            y = x.conv2d(w, padding=k // 2)
            (y * g).sum().backward()
            out["y"], out["dx"], out["dw"] = y.realize(), x.grad.realize(), w.grad.realize()
    from polygrad.codegen.lower import lower
    from polygrad.engine import programs
    asts = []
    compile_program = programs.get_program
    programs.get_program = lambda ast, dev: asts.append(ast) or compile_program(ast, dev)
    try:
        run()
    finally:
        programs.get_program = compile_program
    dev = Device[device]
    opts = "; ".join(f"{a.arg.name} {' '.join(f'{o.kind.value}:{o.amount}' for o in lower(a, dev.capabilities).opts)}"
                     for a in asts if a.arg.name.startswith("r_")) or "cached"
    secs = best_time(run, dev.synchronize, repeats)
    flops = 3 * 2 * n * o * h * wd * c * k * k
    ys, dxs, dws = numpy_conv_step(x_np, w_np, g_np)
    err = max(rel_err(out["y"].numpy(), ys), rel_err(out["dx"].numpy(), dxs), rel_err(out["dw"].numpy(), dws))
    limit = 1e-4
    row = Row(f"conv2d 3x3 {c}->{o} batch {n} {h}x{wd} forward + both gradients (opts {opts})", flops / secs / 1e12,
              "TFLOP/s", f"y, dx, dw vs NumPy float64, max rel err {err:.1e} (limit {limit:.0e})", err < limit)
    if torch is not None:
        tx = torch.tensor(x_np, device=tdev, requires_grad=True)
        tw = torch.tensor(w_np, device=tdev, requires_grad=True)
        tg = torch.tensor(g_np, device=tdev)

        def trun():
            tx.grad = tw.grad = None
            (torch.nn.functional.conv2d(tx, tw, padding=k // 2) * tg).sum().backward()
        row.torch = flops / best_time(trun, lambda: torch_sync(torch, tdev), repeats) / 1e12
    return row


# ---- the MLP Adam step

def mlp_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(MLP_SIZES, MLP_SIZES[1:]):
        bound = 1 / math.sqrt(fan_in)
        weights.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
        weights.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    x = rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32)
    y = rng.integers(0, MLP_SIZES[-1], MLP_BATCH).astype(np.int32)
    return weights, x, y


def numpy_adam(params: list[np.ndarray], grads: list[np.ndarray], state: dict, lr: float,
               b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
    """One Adam step in float64 (torch's formulation), in place."""
    state["t"] = state.get("t", 0) + 1
    t = state["t"]
    for i, (p, g) in enumerate(zip(params, grads)):
        m = state[("m", i)] = b1 * state.get(("m", i), 0) + (1 - b1) * g
        v = state[("v", i)] = b2 * state.get(("v", i), 0) + (1 - b2) * g * g
        p -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)


def numpy_mlp_steps(weights, x, y, steps: int, lr: float):
    """(losses, weights after `steps` Adam steps) of the ReLU MLP with mean cross-entropy, in float64."""
    params = [w.astype(np.float64) for w in weights]
    state: dict = {}
    losses = []
    for _ in range(steps):
        acts = [x.astype(np.float64)]
        for i in range(0, len(params), 2):
            z = acts[-1] @ params[i] + params[i + 1]
            acts.append(np.maximum(z, 0) if i + 2 < len(params) else z)
        logits = acts[-1]
        shifted = logits - logits.max(1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        losses.append(-logp[np.arange(len(y)), y].mean())
        delta = np.exp(logp)
        delta[np.arange(len(y)), y] -= 1
        delta /= len(y)
        grads: list[np.ndarray] = [np.empty(0)] * len(params)
        for i in range(len(params) - 2, -1, -2):
            grads[i], grads[i + 1] = acts[i // 2].T @ delta, delta.sum(0)
            if i:
                delta = (delta @ params[i].T) * (acts[i // 2] > 0)
        numpy_adam(params, grads, state, lr)
    return losses, params


def mlp_row(device: str, torch, tdev: str, repeats: int) -> Row:
    from polygrad import Context, Device, Tensor, TinyJit, nn
    weights, x_np, y_np = mlp_data()
    lr = 1e-3
    params = [Tensor(w, device=device, requires_grad=True) for w in weights]
    opt = nn.optim.Adam(params, lr=lr)
    x, y = Tensor(x_np, device=device), Tensor(y_np, device=device)

    def step(x, y):
        opt.zero_grad()
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            h = h.relu() if i + 2 < len(params) else h
        loss = h.sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step(loss)
        return loss

    jitted = TinyJit(step)
    with Context(TRAINING=1):
        losses = [float(jitted(x, y).item()) for _ in range(MLP_STEPS)]
        got = [p.numpy() for p in params]
        dev = Device[device]
        secs = best_time(lambda: jitted(x, y), dev.synchronize, repeats)
    want_losses, want = numpy_mlp_steps(weights, x_np, y_np, MLP_STEPS, lr)
    loss_err = rel_err(losses, want_losses)
    # Adam moves an element by about lr whatever its gradient's size, so a gradient within rounding of 0,
    # or a ReLU input within rounding of 0, moves a few weights by a fraction of lr either way (torch
    # float32 does too); the updates as a whole are compared instead of their largest element.
    move_err = max(float(np.linalg.norm(g - w) / np.linalg.norm(w - w0))
                   for g, w, w0 in zip(got, want, weights))
    row = Row("MLP 784-512-512-10 Adam step, batch 128", secs * 1e3, "ms",
              f"{MLP_STEPS} steps vs NumPy float64: losses rel err {loss_err:.1e} (limit 1e-4), weight updates "
              f"rel err {move_err:.1e} (norm, limit 1e-2)", loss_err < 1e-4 and move_err < 1e-2, higher=False)
    if torch is not None:
        tw = [torch.tensor(w, device=tdev, requires_grad=True) for w in weights]
        topt = torch.optim.Adam(tw, lr=lr)
        tx, ty = torch.tensor(x_np, device=tdev), torch.tensor(y_np, device=tdev).long()

        def torch_step():
            topt.zero_grad()
            h = tx
            for i in range(0, len(tw), 2):
                h = h @ tw[i] + tw[i + 1]
                h = h.relu() if i + 2 < len(tw) else h
            torch.nn.functional.cross_entropy(h, ty).backward()
            topt.step()
        row.torch = best_time(torch_step, lambda: torch_sync(torch, tdev), repeats) * 1e3
    return row


# ---- GPT-2: weights, a NumPy/torch forward, polygrad's training step and decode

def gpt2_weights(shape: GPTShape, seed: int = 0) -> dict[str, np.ndarray]:
    """Random GPT-2 weights under Hugging Face's names and layouts (Conv1D weights are (in, out))."""
    rng = np.random.default_rng(seed)
    E, F = shape.width, 4 * shape.width

    def normal(*dims, std=0.02):
        return (rng.standard_normal(dims) * std).astype(np.float32)
    w = {"transformer.wte.weight": normal(shape.vocab, E),
         "transformer.wpe.weight": normal(shape.positions, E, std=0.01),
         "transformer.ln_f.weight": 1 + normal(E, std=0.1), "transformer.ln_f.bias": normal(E)}
    for i in range(shape.layers):
        p = f"transformer.h.{i}."
        w.update({p + "ln_1.weight": 1 + normal(E, std=0.1), p + "ln_1.bias": normal(E),
                  p + "ln_2.weight": 1 + normal(E, std=0.1), p + "ln_2.bias": normal(E),
                  p + "attn.c_attn.weight": normal(E, 3 * E), p + "attn.c_attn.bias": normal(3 * E),
                  p + "attn.c_proj.weight": normal(E, E), p + "attn.c_proj.bias": normal(E),
                  p + "mlp.c_fc.weight": normal(E, F), p + "mlp.c_fc.bias": normal(F),
                  p + "mlp.c_proj.weight": normal(F, E), p + "mlp.c_proj.bias": normal(E)})
    return w


def _keep(x, fn_np: str, fn_torch: str):
    """x.<reduction>(-1) with the reduced axis kept, in NumPy or torch."""
    if isinstance(x, np.ndarray):
        return getattr(x, fn_np)(-1, keepdims=True)
    return getattr(x, fn_torch)(-1, keepdim=True)


def _cat(a, b):
    """a and b joined along the sequence axis of a (batch, heads, sequence, head_dim) cache."""
    return np.concatenate([a, b], 2) if isinstance(a, np.ndarray) else sys.modules["torch"].cat([a, b], 2)


def reference_forward(w: dict, ids, shape: GPTShape, past: list | None = None):
    """GPT-2's forward in NumPy or torch (whichever `w` holds): (logits [B, T, V], per-layer (k, v) cache).
    `past` continues a sequence whose first positions are cached."""
    xp = np if isinstance(w["transformer.wte.weight"], np.ndarray) else sys.modules["torch"]
    B, T = ids.shape
    H, D = shape.heads, shape.width // shape.heads
    start = 0 if past is None else past[0][0].shape[2]

    def norm(x, name):
        y = x - _keep(x, "mean", "mean")
        return y / xp.sqrt(_keep(y * y, "mean", "mean") + 1e-5) * w[name + ".weight"] + w[name + ".bias"]

    def heads(t):
        return t.reshape(B, T, H, D).swapaxes(1, 2)
    causal = np.triu(np.full((T, start + T), -1e30, np.float32), start + 1)
    mask = causal if xp is np else xp.tensor(causal, device=ids.device)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][start:start + T]
    cache = []
    for i in range(shape.layers):
        p = f"transformer.h.{i}."
        qkv = norm(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (heads(qkv[..., j * shape.width:(j + 1) * shape.width]) for j in range(3))
        if past is not None:
            k, v = _cat(past[i][0], k), _cat(past[i][1], v)
        cache.append((k, v))
        s = q @ k.swapaxes(-1, -2) / math.sqrt(D) + mask
        e = xp.exp(s - _keep(s, "max", "amax"))
        att = (e / _keep(e, "sum", "sum")) @ v
        x = x + att.swapaxes(1, 2).reshape(B, T, shape.width) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = norm(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = 0.5 * h * (1 + xp.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h * h * h)))
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return norm(x, "transformer.ln_f") @ w["transformer.wte.weight"].T, cache


def numpy_loss(w: dict, ids: np.ndarray, targets: np.ndarray, shape: GPTShape) -> float:
    logits, _ = reference_forward({k: v.astype(np.float64) for k, v in w.items()}, ids, shape)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


class PolygradGPT2:
    """GPT-2 in polygrad's own ops, trainable: every weight a Tensor with requires_grad."""

    def __init__(self, w: dict[str, np.ndarray], shape: GPTShape, device: str):
        from polygrad import Tensor, nn
        self.shape = shape
        self.params = {k: Tensor(v, device=device, requires_grad=True) for k, v in w.items()}
        self.wte = nn.Embedding(shape.vocab, shape.width, device=device)
        self.wte.weight = self.params["transformer.wte.weight"]
        self.wpe = self.params["transformer.wpe.weight"]

    def _norm(self, x, name):
        return x.layernorm(eps=1e-5) * self.params[name + ".weight"] + self.params[name + ".bias"]

    def __call__(self, ids):
        P, (B, T), E, H = self.params, ids.shape, self.shape.width, self.shape.heads
        x = self.wte(ids) + self.wpe[:T]
        for i in range(self.shape.layers):
            p = f"transformer.h.{i}."
            qkv = self._norm(x, p + "ln_1") @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
            q, k, v = (qkv[:, :, j * E:(j + 1) * E].reshape(B, T, H, E // H).transpose(1, 2) for j in range(3))
            att = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, E)
            x = x + att @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
            h = self._norm(x, p + "ln_2") @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"]
            x = x + h.gelu(approximate="tanh") @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
        return self._norm(x, "transformer.ln_f") @ self.wte.weight.T


def gpt2_train_row(shape: GPTShape, w: dict, device: str, torch, tdev: str, repeats: int) -> Row:
    from polygrad import Context, Device, Tensor, TinyJit, nn
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, shape.vocab, (shape.batch, shape.seq + 1)).astype(np.int32)
    ids_np, targets_np = tokens[:, :-1], tokens[:, 1:]
    lr, steps = 3e-4, 3
    model = PolygradGPT2(w, shape, device)
    opt = nn.optim.Adam(list(model.params.values()), lr=lr)
    ids, targets = Tensor(ids_np, device=device), Tensor(targets_np, device=device)

    def step(ids, targets):
        opt.zero_grad()
        logits = model(ids)
        loss = logits.reshape(-1, shape.vocab).sparse_categorical_crossentropy(targets.reshape(-1))
        loss.backward()
        opt.step(loss)
        return loss

    jitted = TinyJit(step)
    with Context(TRAINING=1):
        losses = [float(jitted(ids, targets).item()) for _ in range(steps)]
        secs = best_time(lambda: jitted(ids, targets), Device[device].synchronize, repeats)
    want0 = numpy_loss(w, ids_np, targets_np, shape)
    err0 = abs(losses[0] - want0) / abs(want0)
    check, ok = f"first loss vs NumPy forward, rel err {err0:.1e}", err0 < 1e-4
    row = Row(f"GPT-2 training step ({shape.layers}x{shape.width}, batch {shape.batch} x {shape.seq})",
              secs * 1e3, "ms", check, ok, higher=False)
    if torch is None:
        row.check += " (torch missing: the later steps' losses are unchecked)"
        return row
    tw = {k: torch.tensor(v, device=tdev, requires_grad=True) for k, v in w.items()}
    topt = torch.optim.Adam(list(tw.values()), lr=lr)
    tids = torch.tensor(ids_np, device=tdev).long()
    ttargets = torch.tensor(targets_np, device=tdev).long()

    def torch_step():
        topt.zero_grad()
        logits, _ = reference_forward(tw, tids, shape)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, shape.vocab), ttargets.reshape(-1))
        loss.backward()
        topt.step()
        return loss
    want = [float(torch_step().item()) for _ in range(steps)]
    err = rel_err(losses, want)
    row.check += f"; {steps} steps' losses vs torch, rel err {err:.1e} (limit 1e-4)"
    row.ok = ok and err < 1e-4
    row.torch = best_time(torch_step, lambda: torch_sync(torch, tdev), repeats) * 1e3
    return row


def write_checkpoint(w: dict, shape: GPTShape, folder: str, device: str) -> None:
    """config.json + model.safetensors of `w`, as Hugging Face saves a GPT2LMHeadModel."""
    from polygrad import Tensor
    from polygrad.nn.safetensors import safe_save
    config = {"model_type": "gpt2", "vocab_size": shape.vocab, "n_embd": shape.width, "n_layer": shape.layers,
              "n_head": shape.heads, "n_positions": shape.positions, "layer_norm_epsilon": 1e-5,
              "activation_function": "gelu_new", "tie_word_embeddings": True}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    safe_save({k: Tensor(v, device=device) for k, v in w.items()}, os.path.join(folder, "model.safetensors"))


def gpt2_decode_row(shape: GPTShape, w: dict, device: str, torch, tdev: str) -> Row:
    from polygrad_hf import load_hf
    prompt = np.random.default_rng(2).integers(0, shape.vocab, (1, shape.prompt)).astype(np.int32)
    with tempfile.TemporaryDirectory() as folder:
        write_checkpoint(w, shape, folder, device)
        model = load_hf(folder, max_batch=1, max_seq_len=shape.prompt + shape.new_tokens, device=device)
    try:
        rates, checked = [], []
        for round_ in range(2):  # the first compiles and is checked, the second is timed
            logits = model.forward(input_ids=prompt)["logits"].numpy()[0, -1]
            tokens = []
            t0 = time.perf_counter()
            for i in range(shape.new_tokens):
                tokens.append(int(np.argmax(logits)))
                out = model.call("decode", {"input_ids": np.array([[tokens[-1]]], np.int32), "pos": shape.prompt + i})
                logits = out["logits"].numpy()[0, -1]
                if round_ == 0 and i < 3:
                    checked.append((list(tokens), logits))
            rates.append(shape.new_tokens / (time.perf_counter() - t0))
    finally:
        model.dispose()
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    err = max(rel_err(logits, reference_forward(w64, np.concatenate([prompt, [toks]], 1), shape)[0][0, -1])
              for toks, logits in checked)
    row = Row(f"GPT-2 decode ({shape.layers}x{shape.width}, prompt {shape.prompt}, {shape.new_tokens} new tokens)",
              rates[-1], "tok/s", f"first 3 decode steps' logits vs NumPy forward, rel err {err:.1e} (limit 1e-4)",
              err < 1e-4)
    if torch is not None:
        row.torch = torch_decode_rate(torch, tdev, w, shape, prompt)
    return row


def torch_decode_rate(torch, tdev: str, w: dict, shape: GPTShape, prompt: np.ndarray) -> float:
    tw = {k: torch.tensor(v, device=tdev) for k, v in w.items()}
    rates = []
    with torch.no_grad():
        for _ in range(2):
            logits, past = reference_forward(tw, torch.tensor(prompt, device=tdev).long(), shape)
            torch_sync(torch, tdev)
            t0 = time.perf_counter()
            for _ in range(shape.new_tokens):
                token = logits[:, -1].argmax(-1, keepdim=True)
                logits, past = reference_forward(tw, token, shape, past)
            torch_sync(torch, tdev)
            rates.append(shape.new_tokens / (time.perf_counter() - t0))
    return rates[-1]


# ---- launch overhead

LAUNCH_KERNELS = 40


def launch_rows(device: str, torch, tdev: str, repeats: int) -> list[Row]:
    """A JIT replay of LAUNCH_KERNELS tiny kernels (sin of 1024 floats, each realized): microseconds a
    kernel, i.e. launch overhead, with the kernels run as one CUDA graph (POLY_CUDA_GRAPH=1, the default)
    and as one driver launch each (POLY_CUDA_GRAPH=0); beside torch running the same kernels eagerly.
    Checked against NumPy."""
    from polygrad import Device, Tensor, jit
    x0 = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    want = x0.astype(np.float64)
    for _ in range(LAUNCH_KERNELS):
        want = np.sin(want)
    t_torch = None
    if torch is not None:
        tx = torch.from_numpy(x0).to(tdev)

        def torch_run():
            y = tx
            for _ in range(LAUNCH_KERNELS):
                y = torch.sin(y)
            return y
        t_torch = best_time(torch_run, lambda: torch_sync(torch, tdev), repeats * 10) / LAUNCH_KERNELS * 1e6
    dev = Device[device]
    rows = []
    saved = os.environ.get("POLY_CUDA_GRAPH")
    try:
        for graphs, how in (("1", "CUDA graphs"), ("0", "one launch each (POLY_CUDA_GRAPH=0)")):
            os.environ["POLY_CUDA_GRAPH"] = graphs  # read when the replay's plan is made (its first replay)

            @jit
            def chain(x):
                for _ in range(LAUNCH_KERNELS):
                    x = x.sin().realize()
                return x
            x = Tensor(x0, device=device).realize()
            for _ in range(3):  # warm-up, capture, first replay (the plan is made)
                out = chain(x)
            err = rel_err(out.numpy(), want)
            t = best_time(lambda: chain(x), dev.synchronize, repeats * 10) / LAUNCH_KERNELS * 1e6
            rows.append(Row(f"launch: {LAUNCH_KERNELS}-kernel JIT replay, {how}", t, "us/kernel",
                            f"output vs NumPy rel err {err:.1e}", err < 1e-5, t_torch, higher=False,
                            note="eager, one launch a kernel"))
    finally:
        if saved is None:
            os.environ.pop("POLY_CUDA_GRAPH", None)
        else:
            os.environ["POLY_CUDA_GRAPH"] = saved
    return rows


# ---- the table

ROWS = ("matmul", "matmul_wgmma", "conv", "mlp", "gpt2_train", "gpt2_decode", "launch")


def device_name(device: str) -> str:
    if device.upper().startswith("CUDA"):
        try:
            import subprocess
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=30).stdout.strip().splitlines()
            return out[0] if out else "a CUDA GPU (nvidia-smi gave no name)"
        except (OSError, subprocess.SubprocessError) as exc:
            return f"a CUDA GPU (nvidia-smi failed: {exc})"
    import platform
    return f"{device} ({platform.processor() or platform.machine()})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="CUDA", help="polygrad device (default CUDA)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, so the script runs quickly on the CPU device")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--matmul-n", type=int, default=None, help="matmul size (default 4096, 64 with --tiny)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs a row (default 10, 2 with --tiny)")
    ap.add_argument("--kinds", default=",".join(MATMUL_KINDS), help=f"matmul rows, of {','.join(MATMUL_KINDS)}")
    ap.add_argument("--rows-json", default=None, help="also write the rows to this JSON file (wgmma_rows reads it)")
    a = ap.parse_args(argv)
    wanted = a.rows.split(",")
    unknown = sorted(set(wanted) - set(ROWS))
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {','.join(ROWS)}")
    kinds = a.kinds.split(",")
    if set(kinds) - set(MATMUL_KINDS):
        ap.error(f"unknown matmul kinds {sorted(set(kinds) - set(MATMUL_KINDS))}; choose from {','.join(MATMUL_KINDS)}")
    from polygrad import Device
    if a.device.upper().startswith("CUDA") and not Device.cuda_available():
        from polygrad.device import registry
        print(f"no CUDA device: {registry.probe('CUDA').reason}")
        return 2
    shape = GPT2_TINY if a.tiny else GPT2_SMALL
    n = a.matmul_n or (64 if a.tiny else 4096)
    repeats = a.repeats or (2 if a.tiny else 10)
    torch, tdev = load_torch(a.device)
    label = f"torch {torch.__version__} on {tdev}" if torch is not None else "torch"
    print(f"device: {device_name(a.device)}; polygrad device {a.device}; "
          f"{label if torch is not None else 'torch not measured: ' + tdev}")
    rows: list[Row] = []

    def show(new: list[Row]) -> None:
        for row in new:
            if torch is None:
                row.note = tdev
            print(row.line(label), flush=True)
        rows.extend(new)
    if "matmul" in wanted:
        show(matmul_rows(n, a.device, torch, tdev, repeats, kinds))
    if "matmul_wgmma" in wanted:
        show(wgmma_rows(n, a.device, repeats))
    if "conv" in wanted:
        show([conv_row(a.tiny, a.device, torch, tdev, repeats)])
    if "mlp" in wanted:
        show([mlp_row(a.device, torch, tdev, repeats)])
    if {"gpt2_train", "gpt2_decode"} & set(wanted):
        w = gpt2_weights(shape)
        if "gpt2_train" in wanted:
            show([gpt2_train_row(shape, w, a.device, torch, tdev, repeats)])
        if "gpt2_decode" in wanted:
            show([gpt2_decode_row(shape, w, a.device, torch, tdev)])
    if "launch" in wanted:
        show(launch_rows(a.device, torch, tdev, repeats))
    if a.rows_json:
        with open(a.rows_json, "w") as f:
            json.dump([vars(r) for r in rows], f)
    failed = [r.name for r in rows if not r.ok]
    print("RESULT:", f"checks failed: {failed}" if failed else f"all {len(rows)} rows checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
