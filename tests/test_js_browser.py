"""Browser test: headless Chromium loads the package's ES module build from a page served on 127.0.0.1,
fetches a bundle Python saved, runs forward and one training step; the results must match Python's. Then a
screenshot of the live-training demo (polygrad-js/examples/train-demo.html) must show its loss curve.

Needs `node`, Debian's `chromium` and polygrad-js's dev dependencies (`npm install` in polygrad-js, which
brings playwright-core); skipped otherwise. `.ci/run` installs all three.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from polygrad import Model, Tensor, Variable, nn

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "polygrad-js"
NODE = shutil.which("node")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    NODE is None or CHROMIUM is None or not (JS / "node_modules" / "playwright-core").exists(),
    reason="needs node, chromium and `npm install` in polygrad-js (playwright-core)")


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A served copy of the files the pages need; yields (root dir, base URL)."""
    root = tmp_path_factory.mktemp("site")
    subprocess.run([NODE, str(JS / "tools" / "build.js")], check=True, capture_output=True)
    (root / "dist").mkdir()
    shutil.copy(JS / "dist" / "polygrad.browser.mjs", root / "dist")
    (root / "test").mkdir()
    shutil.copy(JS / "test" / "browser" / "page.html", root / "test")
    (root / "examples").mkdir()
    shutil.copy(JS / "examples" / "train-demo.html", root / "examples")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def drive(url: str, tmp: Path, shot: Path | None = None, wait: str = "window.__result") -> dict:
    out = tmp / "result.json"
    cmd = [NODE, str(JS / "tools" / "browser_run.js"), url, str(out)] + ([str(shot)] if shot else []) + ["--wait", wait]
    env = {**os.environ, "CHROMIUM": CHROMIUM}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


class MLP:
    def __init__(self):
        self.l1, self.l2 = nn.Linear(4, 16), nn.Linear(16, 3)

    def __call__(self, x):
        return {"logits": self.l2(self.l1(x).relu())}


def test_browser_forward_and_training_step_match_python(site, tmp_path):
    root, base = site
    Tensor.manual_seed(11)
    rng = np.random.default_rng(11)
    X = rng.standard_normal((8, 4)).astype(np.float32)
    Y = rng.integers(0, 3, 8).astype(np.int32)
    batch = Variable("batch", 1, 16)
    m = Model(MLP(), inputs={"x": Tensor.empty(batch, 4)}, targets={"y": Tensor.empty(batch, dtype="int32")},
              loss=lambda o, y: o["logits"].sparse_categorical_crossentropy(y))
    (root / "test" / "bundle.pgb").write_bytes(m.save())
    before = m.forward(x=X)["logits"].numpy()
    (loss,) = m.fit({"x": X, "y": Y}, epochs=1, optimizer="adam", lr=0.01, verbose=False)
    after = m.forward(x=X)["logits"].numpy()
    m.dispose()
    (root / "test" / "case.json").write_text(json.dumps({"x": X.ravel().tolist(), "y": Y.tolist(), "lr": 0.01}))
    res = drive(f"{base}/test/page.html", tmp_path)
    r = res["value"]
    assert "error" not in r, (r, res["logs"])
    assert r["simd"] and r["backend"] == "wasm", r
    assert r["shape"] == [8, 3]
    np.testing.assert_allclose(np.array(r["before"]).reshape(8, 3), before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(np.array(r["after"]).reshape(8, 3), after, rtol=1e-5, atol=1e-6)
    assert r["savedBytes"] > 0


def test_demo_page_trains_live_and_plots_its_loss(site, tmp_path):
    root, base = site
    subprocess.run(["python3" if shutil.which("python3") else "python", str(JS / "examples" / "make_demo_bundle.py"),
                    str(root / "examples" / "demo.pgb")], check=True, capture_output=True)
    shot = tmp_path / "train-demo.png"
    res = drive(f"{base}/examples/train-demo.html?steps=60", tmp_path, shot, wait="window.demoLosses")
    assert res.get("demoError") is None, res
    losses = res["value"]
    assert len(losses) == 60 and all(np.isfinite(losses)), losses
    assert losses[-1] < 0.8 * losses[0], losses
    assert res["plotted"] > 200, res  # the curve's blue pixels on the canvas
    assert "done" in res["status"], res["status"]
    assert shot.exists() and shot.stat().st_size > 5000
    keep = ROOT / "polygrad-js" / "examples" / "train-demo.png"
    shutil.copy(shot, keep)  # the latest screenshot, for a look (not committed)
