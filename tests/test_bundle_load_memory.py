"""A bundle's memory: Model.load(path) holds its weights once (the Model's buffers: the file is mapped, and its
pages go back as the copies into the buffers read them), and Model.save(path) once beside the Model's (the
host copies of its buffers; the file is written piece by piece). The checks run in a child interpreter, so the
test runner's own memory does not count."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import resident

from polygrad import Model, Tensor

LOAD_PEAK_SCRIPT = resident.PRELUDE + r"""
from polygrad import Model

restart_peak()
before = rss()
model = Model.load(sys.argv[1])
print(peak() - before, rss() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_loading_a_bundle_holds_its_weights_once(tmp_path):
    """Model.load(path)'s peak and what stays: the Model's buffers, and of the file's map at most a chunk
    (filemap.COPY_CHUNK) at a time: at most 1.05 x a 64 MiB bundle plus 16 MiB (83 MiB). Measured a peak of
    74 MiB, 66 after (AMD EPYC); 130 / 66 when the whole file was read first (its bytes beside the buffers),
    195 when each stored array was also copied out of them."""
    class Wide:
        def __init__(self):
            self.w = Tensor(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))

        def __call__(self, x):
            return x @ self.w

    path = str(tmp_path / "wide.pgb")
    Model(Wide(), inputs={"x": Tensor.empty(1, 4096)}).save(path)
    size = os.path.getsize(path)
    out = subprocess.run([sys.executable, "-c", LOAD_PEAK_SCRIPT, path], capture_output=True, text=True, check=True,
                         timeout=600, env={**os.environ, "POLY_CACHE_DIR": str(tmp_path / "cache")}).stdout.split()
    peak, after = int(out[-2]), int(out[-1])
    assert peak <= 1.05 * size + (16 << 20), (size, peak)
    assert after <= 1.05 * size + (16 << 20), (size, after)


SAVE_PEAK_SCRIPT = resident.PRELUDE + r"""
import numpy as np
from polygrad import Model, Tensor

class Wide:
    def __init__(self):
        self.w = Tensor(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))

    def __call__(self, x):
        return x @ self.w

model = Model(Wide(), inputs={"x": Tensor.empty(1, 4096)})
restart_peak()
before = rss()
model.save(sys.argv[1])
print(os.path.getsize(sys.argv[1]), peak() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_saving_a_bundle_holds_its_weights_once_more_at_most(tmp_path):
    """Model.save(path)'s peak beyond the Model: the host copies of its buffers and no whole-file bytes (the
    blobs are views of those copies, the file written piece by piece): at most 1.3 x a 64 MiB bundle plus
    8 MiB; the file is the same bytes Model.save() returns. Measured 64 MiB (AMD EPYC); 4 copies before (a
    blob's bytes, the data section, its bytes() and the joined file: 256 MiB)."""
    path = str(tmp_path / "wide.pgb")
    out = subprocess.run([sys.executable, "-c", SAVE_PEAK_SCRIPT, path], capture_output=True, text=True, check=True,
                         timeout=600, env={**os.environ, "POLY_CACHE_DIR": str(tmp_path / "cache")}).stdout.split()
    size, peak = int(out[-2]), int(out[-1])
    assert peak <= 1.3 * size + (8 << 20), (size, peak)
    m = Model.load(path)
    assert m.save() == open(path, "rb").read()
