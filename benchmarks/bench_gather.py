"""Embedding / gather speed (issue 10 item 5) on CPU, with torch CPU as the yardstick.

Embedding(50257, 768) (GPT-2's token table) looked up for 128 tokens, forward alone and forward +
backward (the weight's gradient), plus a gather along the last axis and advanced indexing.

Run: python -m pytest benchmarks/bench_gather.py --benchmark-only -q
"""
import numpy as np
import pytest

from polygrad import Tensor, nn

torch = pytest.importorskip("torch")

VOCAB, DIM, TOKENS = 50257, 768, 128


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    idx = rng.integers(0, VOCAB, TOKENS).astype(np.int32)
    g = rng.standard_normal((TOKENS, DIM)).astype(np.float32)
    return w, idx, g


def _layer(w):
    emb = nn.Embedding(VOCAB, DIM)
    emb.weight = Tensor(w, device="CPU", requires_grad=True).realize()
    return emb


def test_embedding_forward_polygrad(benchmark, data):
    w, idx, _ = data
    emb, ix = _layer(w), Tensor(idx, device="CPU").realize()
    out = benchmark.pedantic(lambda: emb(ix).realize(), rounds=5, warmup_rounds=1)
    np.testing.assert_array_equal(out.numpy(), w[idx])


def test_embedding_forward_torch(benchmark, data):
    w, idx, _ = data
    emb = torch.nn.Embedding.from_pretrained(torch.tensor(w))
    ix = torch.tensor(idx, dtype=torch.int64)
    benchmark(lambda: emb(ix))


def test_embedding_forward_backward_polygrad(benchmark, data):
    w, idx, g = data
    emb, ix, gt = _layer(w), Tensor(idx, device="CPU").realize(), Tensor(g, device="CPU").realize()

    def step():
        emb.weight.grad = None
        (emb(ix) * gt).sum().backward()
        return emb.weight.grad.realize()
    grad = benchmark.pedantic(step, rounds=5, warmup_rounds=1)
    ref = np.zeros_like(w)
    np.add.at(ref, idx, g)
    np.testing.assert_allclose(grad.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_embedding_forward_backward_torch(benchmark, data):
    w, idx, g = data
    weight = torch.tensor(w, requires_grad=True)
    ix, gt = torch.tensor(idx, dtype=torch.int64), torch.tensor(g)

    def step():
        weight.grad = None
        (torch.nn.functional.embedding(ix, weight) * gt).sum().backward()
        return weight.grad
    benchmark(step)


def test_gather_last_axis_polygrad(benchmark, data):
    w, idx, _ = data
    x = Tensor(w[:TOKENS], device="CPU").realize()
    lab = Tensor((idx % DIM).reshape(-1, 1), device="CPU").realize()
    out = benchmark(lambda: x.gather(1, lab).realize())
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(w[:TOKENS], (idx % DIM).reshape(-1, 1), 1))


def test_gather_last_axis_torch(benchmark, data):
    w, idx, _ = data
    x, lab = torch.tensor(w[:TOKENS]), torch.tensor((idx % DIM).reshape(-1, 1), dtype=torch.int64)
    benchmark(lambda: x.gather(1, lab))


def test_advanced_index_rows_polygrad(benchmark, data):
    w, idx, _ = data
    x, ix = Tensor(w, device="CPU").realize(), Tensor(idx, device="CPU").realize()
    out = benchmark.pedantic(lambda: x[ix].realize(), rounds=5, warmup_rounds=1)
    np.testing.assert_array_equal(out.numpy(), w[idx])


def test_advanced_index_rows_torch(benchmark, data):
    w, idx, _ = data
    x, ix = torch.tensor(w), torch.tensor(idx, dtype=torch.int64)
    benchmark(lambda: x[ix])
