"""polygrad/filemap.py: a copy out of a read-only file map gives the map's pages back and keeps every value; a
map that may hold writes (a private, copy-on-write one) is never given back, since its pages would read as the
file again; Model.load takes a path, an empty file and a pipe as before."""
from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import pytest

from polygrad import BundleError, Model, Tensor, dtypes, filemap
from polygrad.device import Buffer

N = (3 << 20) + 5  # float32 values: several copy chunks, and a length no page divides


def _file(tmp_path, values: np.ndarray) -> str:
    path = str(tmp_path / "values.bin")
    values.tofile(path)
    return path


def test_a_copy_from_a_read_only_map_holds_the_file_values(tmp_path):
    values = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    data = filemap.map_file(_file(tmp_path, values))
    assert isinstance(data, mmap.mmap)
    part = np.frombuffer(data, np.float32, N - 7, offset=28)  # starts inside a page
    buf = Buffer("CPU", N - 7, dtypes.float32)
    buf.copyin(part)
    np.testing.assert_array_equal(buf.numpy(), values[7:])
    np.testing.assert_array_equal(part, values[7:])  # given back pages read the file again: the same values


def test_a_private_map_that_holds_writes_is_never_given_back(tmp_path):
    """A copy-on-write map's written pages exist nowhere else: giving them back would turn them into the file's
    bytes again (fails when copy_dropping drops pages of a writable map)."""
    values = np.arange(N, dtype=np.float32)
    with open(_file(tmp_path, values), "rb") as f:
        private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    written = np.frombuffer(private, np.float32)
    written[:] = -1.0
    buf = Buffer("CPU", N, dtypes.float32)
    buf.copyin(written)
    assert (buf.numpy() == -1.0).all()
    assert (written == -1.0).all()


def test_load_takes_an_empty_file_a_folder_and_a_pipe(tmp_path):
    empty = tmp_path / "empty.pgb"
    empty.write_bytes(b"")
    with pytest.raises(BundleError, match="0 bytes is shorter than the 64-byte header"):
        Model.load(empty)
    with pytest.raises(BundleError, match="cannot read bundle"):
        Model.load(tmp_path)

    class Scale:
        def __init__(self):
            self.w = Tensor(np.arange(4, dtype=np.float32))

        def __call__(self, x):
            return x * self.w

    blob = Model(Scale(), inputs={"x": Tensor.empty(4)}).save()
    if not hasattr(os, "mkfifo"):
        return
    fifo = str(tmp_path / "pipe.pgb")
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "wb").write(blob))
    writer.start()
    model = Model.load(fifo)  # not a file that maps: read as a stream
    writer.join()
    (y,) = model.forward(x=np.ones(4, np.float32)).values()
    np.testing.assert_array_equal(y.numpy(), np.arange(4, dtype=np.float32))
