"""Workloads shared by the benchmarks and the operation-count tests, each with its analytic FLOP count.

Stage: benchmarks/tests. Input: sizes and a seed. Output: zero-argument callables that build (and
realize) one workload with polygrad, plus `*_flops()`: the multiply-adds of its matmuls and
convolutions counted as 2 operations each (elementwise work, softmax and normalisation are left
out: they are a few percent of these workloads). `tests/test_op_counts.py` checks that
`GlobalCounters.global_ops` stays within 1.2x of these counts, so recomputed work cannot hide.
"""
from __future__ import annotations

import numpy as np

MLP_BATCH, MLP_SIZES = 128, (784, 512, 512, 10)
CONV_BATCH = 8


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.02):
    from polygrad import Tensor
    return Tensor((rng.standard_normal(shape) * scale).astype(np.float32)).realize()


def block_params(d: int = 768, seed: int = 0) -> dict:
    """Weights of a pre-norm transformer block (LayerNorm, attention, LayerNorm, gelu MLP of 4d)."""
    rng = np.random.default_rng(seed)
    ones = {k: _w(rng, d, scale=0.1) for k in ("ln1_w", "ln2_w")}
    return dict(ones, ln1_b=_w(rng, d), wqkv=_w(rng, d, 3 * d), bqkv=_w(rng, 3 * d), wo=_w(rng, d, d),
                bo=_w(rng, d), ln2_b=_w(rng, d), w1=_w(rng, d, 4 * d), b1=_w(rng, 4 * d), w2=_w(rng, 4 * d, d),
                b2=_w(rng, d))


def block(x, p: dict, heads: int = 12):
    """One transformer block forward on x (seq, d): x + attn(ln1(x)), then + mlp(ln2(.))."""
    seq, d = x.shape
    hd = d // heads
    h = x.layernorm() * p["ln1_w"] + p["ln1_b"]
    qkv = h @ p["wqkv"] + p["bqkv"]
    q, k, v = [qkv[:, i * d:(i + 1) * d].reshape(seq, heads, hd).permute(1, 0, 2) for i in range(3)]
    a = q.scaled_dot_product_attention(k, v).permute(1, 0, 2).reshape(seq, d)
    x = x + a @ p["wo"] + p["bo"]
    h = x.layernorm() * p["ln2_w"] + p["ln2_b"]
    return x + (h @ p["w1"] + p["b1"]).gelu() @ p["w2"] + p["b2"]


def block_torch(x, p: dict, heads: int = 12):
    """The same block in PyTorch (x and p as torch tensors), the reference for values and speed."""
    import torch.nn.functional as F
    seq, d = x.shape
    hd = d // heads
    h = F.layer_norm(x, (d,)) * p["ln1_w"] + p["ln1_b"]
    qkv = h @ p["wqkv"] + p["bqkv"]
    q, k, v = [qkv[:, i * d:(i + 1) * d].reshape(seq, heads, hd).permute(1, 0, 2) for i in range(3)]
    a = F.scaled_dot_product_attention(q, k, v).permute(1, 0, 2).reshape(seq, d)
    x = x + a @ p["wo"] + p["bo"]
    h = F.layer_norm(x, (d,)) * p["ln2_w"] + p["ln2_b"]
    return x + F.gelu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def block_flops(seq: int = 128, d: int = 768) -> int:
    """qkv, scores, probabilities @ v, output projection, the two MLP matmuls."""
    return 2 * seq * d * 3 * d + 2 * 2 * seq * seq * d + 2 * seq * d * d + 2 * 2 * seq * d * 4 * d


def mlp_adam_step(seed: int = 0):
    """A zero-argument Adam training step of MLP 784-512-512-10 (batch 128, cross-entropy) on fixed data;
    returns (step, model layers)."""
    from polygrad import Context, Tensor, nn
    from polygrad.nn.optim import Adam
    rng = np.random.default_rng(seed)
    layers = [nn.Linear(a, b) for a, b in zip(MLP_SIZES, MLP_SIZES[1:])]
    opt = Adam(nn.get_parameters(layers), lr=1e-3)
    x = Tensor(rng.standard_normal((MLP_BATCH, MLP_SIZES[0])).astype(np.float32))
    y = Tensor(rng.integers(0, MLP_SIZES[-1], MLP_BATCH).astype(np.int32))

    def step():
        with Context(TRAINING=1):
            opt.zero_grad()
            h = x
            for layer in layers[:-1]:
                h = layer(h).relu()
            loss = layers[-1](h).cross_entropy(y)
            loss.backward()
            opt.step(loss)
        return loss
    return step, layers


def mlp_flops() -> int:
    """Forward, weight gradients, and input gradients of the second and third layer."""
    pairs = list(zip(MLP_SIZES, MLP_SIZES[1:]))
    fwd = sum(2 * MLP_BATCH * a * b for a, b in pairs)
    return 2 * fwd + sum(2 * MLP_BATCH * a * b for a, b in pairs[1:])


def convnet_step(seed: int = 0):
    """A zero-argument forward+backward of a small conv net on 8x3x16x16: conv 3->16, relu, conv 16->32,
    relu, 2x2 max pool, linear 2048->10, cross-entropy; it realizes the loss and every gradient."""
    from polygrad import Context, Tensor, nn
    rng = np.random.default_rng(seed)
    c1, c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
    fc = nn.Linear(32 * 8 * 8, 10)
    params = nn.get_parameters([c1, c2, fc])
    Tensor.realize_all(*params)
    x = Tensor(rng.standard_normal((CONV_BATCH, 3, 16, 16)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, CONV_BATCH).astype(np.int32))

    def step():
        with Context(TRAINING=1):
            for p in params:
                p.grad = None
            h = c2(c1(x).relu()).relu().max_pool2d(2)
            loss = fc(h.flatten(1)).cross_entropy(y)
            loss.backward()
            Tensor.realize_all(loss, *[p.grad for p in params])
        return loss
    return step, params


def conv_flops() -> int:
    """Forward and weight gradients of all three layers; input gradients of conv2 and the linear layer."""
    b = CONV_BATCH
    f1, f2, f3 = 2 * b * 16 * 16 * 16 * 3 * 9, 2 * b * 32 * 16 * 16 * 16 * 9, 2 * b * 2048 * 10
    return 2 * (f1 + f2 + f3) + f2 + f3
