"""Tensor.from_host_view: a host device's buffer over a caller's read-only array, with no copy.

- The buffer's memory is the array's (a view of a read-only memory map stays the file's pages), and
  kernels compute from it as from any buffer (checked against NumPy).
- Nothing writes it: assign, setitem, a copy in and a custom kernel raise ReadOnlyBufferError, and a
  Model built over it shares it instead of copying it, still read-only.
- Bad input is refused with a typed error: a writable array, a misaligned one, a non-contiguous one.
- A dead adopted buffer never enters the reuse cache (another buffer would write the caller's memory).
- Tensor.numpy of a variable-size Model output copies only its elements, not the buffer's capacity.
"""
from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

from polygrad import Model, Tensor, Variable, device, dtypes
from polygrad.errors import InvalidArgumentError, ReadOnlyBufferError

HOST_DEVICES = [d for d in ("CPU", "X86", "INTERP") if device.Device.available(d)]


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


def _mapped(tmp_path, values: np.ndarray) -> tuple[mmap.mmap, np.ndarray]:
    path = tmp_path / "weights.bin"
    path.write_bytes(values.tobytes())
    with open(path, "rb") as f:
        region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return region, np.frombuffer(region, values.dtype).reshape(values.shape)


@pytest.mark.parametrize("dev", HOST_DEVICES)
def test_a_mapped_file_is_the_buffer_and_computes(tmp_path, dev):
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    region, whole = _mapped(tmp_path, np.concatenate([np.zeros(8, np.float32), w.reshape(-1)]))
    view = whole[8:].reshape(w.shape)  # 32 bytes into the map, as GGUF tensors sit: not on a 64-byte line
    t = Tensor.from_host_view(view, device=dev)
    handle = t._buffer().handle
    assert handle.addr == view.ctypes.data and t._buffer().readonly  # the file's pages: no copy
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose((Tensor(x, device=dev) @ t).numpy(), x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(t[2:5].numpy(), w[2:5])


def test_writes_into_an_adopted_buffer_are_refused():
    t = Tensor.from_host_view(_readonly(np.arange(8, dtype=np.float32)), device="CPU")
    with pytest.raises(ReadOnlyBufferError, match="read-only"):
        t.assign(t + 1)
    with pytest.raises(ReadOnlyBufferError):
        t[1:3].assign(Tensor([5.0, 6.0], device="CPU"))
    with pytest.raises(ReadOnlyBufferError):
        t[0] = 3.0
    with pytest.raises(ReadOnlyBufferError):
        t._buffer().copyin(np.zeros(8, np.float32))
    with pytest.raises(ReadOnlyBufferError):
        t.custom_kernel(fxn=lambda out: out)  # refused before the kernel function is even called
    np.testing.assert_array_equal(t.numpy(), np.arange(8, dtype=np.float32))
    copy = t.contiguous().realize()  # the way to a writable tensor the message names
    copy.assign(copy + 1).realize()
    np.testing.assert_array_equal(copy.numpy(), np.arange(1, 9, dtype=np.float32))


def test_bad_arrays_are_refused_with_what_to_do():
    with pytest.raises(InvalidArgumentError, match="read-only"):
        Tensor.from_host_view(np.zeros(4, np.float32), device="CPU")
    raw = _readonly(np.zeros(20, np.uint8))
    with pytest.raises(InvalidArgumentError, match="multiple of 4"):
        Tensor.from_host_view(raw[1:17].view(np.float32), device="CPU")
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        Tensor.from_host_view(_readonly(np.zeros((4, 4), np.float32)).T, device="CPU")
    with pytest.raises(InvalidArgumentError, match="numpy array"):
        Tensor.from_host_view([1.0, 2.0], device="CPU")


def test_a_dead_adopted_buffer_never_enters_the_reuse_cache():
    arr = _readonly(np.zeros(1 << 16, np.uint8))
    t = Tensor.from_host_view(arr, device="CPU")
    gc.collect()  # first: earlier tests' garbage freed here would enter the cache between the two reads
    before = device.alloc_cache_bytes["total"]
    del t
    gc.collect()
    assert device.alloc_cache_bytes["total"] == before
    held = [h.arr for entries in device._alloc_cache.values() for _, h in entries if hasattr(h, "arr")]
    assert not any(np.shares_memory(a, arr) for a in held)


class _Scaled:
    def __init__(self, w: Tensor):
        self.w = w

    def __call__(self, x: Tensor) -> dict:
        return {"y": x @ self.w.cast(dtypes.float32)}


def test_a_model_shares_an_adopted_state_buffer_and_keeps_it_read_only():
    """uint8 blocks are a Model's state (not trained): the Model uses the adopted buffer where it is."""
    blocks = _readonly(np.arange(64, dtype=np.uint8).reshape(8, 8))
    w = Tensor.from_host_view(blocks, device="CPU")
    model = Model(_Scaled(w), inputs={"x": Tensor.empty(2, 8)}, params={"w": w})
    try:
        slot = next(i for i, s in enumerate(model._p.slots) if s.name == "w")
        assert model._x.bufs[slot] is w._buffer()
        x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
        np.testing.assert_allclose(model.forward(x=x)["y"].numpy(), x @ blocks.astype(np.float32), rtol=1e-5)
        with pytest.raises(ReadOnlyBufferError):
            model.parameters()["w"].assign(Tensor.zeros(8, 8, dtype=dtypes.uint8, device="CPU")).realize()
    finally:
        model.dispose()


def test_numpy_of_a_variable_size_output_copies_only_its_elements():
    n = Variable("n", 1, 4096)
    model = Model(lambda x: {"y": x * 2}, inputs={"x": Tensor.empty(n, 64)})
    try:
        y = model.forward(x=np.ones((3, 64), np.float32))["y"].numpy()
        np.testing.assert_array_equal(y, np.full((3, 64), 2, np.float32))
        base = y
        while isinstance(base.base, np.ndarray):
            base = base.base
        assert base.nbytes == 3 * 64 * 4  # not the 4096-row capacity (1 MiB) it used to copy and keep
    finally:
        model.dispose()
