"""Imported ONNX models: polygrad against onnxruntime in Python, polygrad-js against onnxruntime-web in Node.

Workloads (issue 34, "Speed"), random weights, exported with torch.onnx (the TorchScript exporter, opset 17,
static shapes, evaluation mode: BatchNormalization folded into the convolutions by the exporter):

  resnet18 b1 / b16   ResNet-18 (tests/torch_arch.py: torchvision's layers and parameter counts), 224x224
  mobilenet_v2 b1     MobileNetV2 (tests/torch_arch.py), 224x224
  bert s128           transformers' BertModel without the pooler, batch 1, sequence 128, all tokens attended:
                      BERT-Small (4 layers, width 512, 8 heads, Google's L-4_H-512_A-8) by default,
                      BERT-base (12 layers, width 768, 12 heads) with --bert-base

Python: each library runs in a worker process of its own (`--worker`), driven over a pipe, so neither's thread
pool slows the other and their rounds alternate (ort, polygrad, polygrad, ort, ...): both see the same load.
onnxruntime: CPUExecutionProvider, intra_op_num_threads = --threads, inter-op 1; polygrad: POLY_THREADS =
--threads, `polygrad.onnx.load(path)` then `forward`. Both libraries' rounds have the same number of calls,
enough for about a quarter second of the slower one (ROUND_S); a figure is the median of every call of the rounds.

Node (polygrad-js/bench/onnx_models.js, reading the manifest this script writes): polygrad-js `Model.load` of
the .pgb saved from the imported model, onnxruntime-web (wasm) on the same .onnx, both with --threads threads,
alternating in one process. `cd polygrad-js/bench && npm install` first (bench/package.json); without it the
Node columns are left out. `--keep DIR` keeps the models, so the Node side runs standalone:
`node polygrad-js/bench/onnx_models.js DIR/manifest.json`.

Load: seconds from the .onnx file to the first result in a fresh worker (the interpreter's start and
imports excluded): polygrad cold (an empty POLY_CACHE_DIR: every kernel compiled) and warm (the same folder
again), onnxruntime's session; in Node, Model.load of the .pgb (its kernels compiled to wasm at load) and
ort-web's session. Every output is checked against onnxruntime's (relative max error printed).

    python benchmarks/bench_onnx.py [--quick] [--only resnet18_b1 ...] [--rounds 5] [--threads 2]
                                    [--bert-base] [--no-js] [--keep DIR]

`--quick`: two rounds and BERT with 2 layers, a smoke run whose figures mean little. The machine is often
shared: read the ratios (measured side by side), not the absolute times, beside the load average printed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
NODE_SCRIPT = os.path.join(ROOT, "polygrad-js", "bench", "onnx_models.js")
NODE_LIBS = os.path.join(ROOT, "polygrad-js", "bench", "node_modules", "onnxruntime-web")
PY_TARGET = 1.5  # polygrad's time at most 1.5x onnxruntime's
JS_TARGET = 1.0  # polygrad-js faster than onnxruntime-web


# ---- the models, exported by the parent process --------------------------------------------------------
def bert_config(base: bool, quick: bool) -> dict:
    if base:
        return {"num_hidden_layers": 2 if quick else 12, "hidden_size": 768, "num_attention_heads": 12}
    return {"num_hidden_layers": 2 if quick else 4, "hidden_size": 512, "num_attention_heads": 8}


def export_models(folder: str, names: list[str], bert: dict) -> list[dict]:
    """Write each model's .onnx and inputs (raw little-endian files) to `folder`; return the manifest."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch_arch
    out = []
    for name in names:
        torch.manual_seed(0)
        rng = np.random.default_rng(0)
        if name.startswith(("resnet18", "mobilenet_v2")):
            arch, batch = name.rsplit("_b", 1)
            net = getattr(torch_arch, arch)()
            inputs = {"x": rng.standard_normal((int(batch), 3, 224, 224)).astype(np.float32)}
            outputs = ["y"]
        else:
            net, inputs = _bert(bert, rng)
            outputs = ["last_hidden_state"]
        path = os.path.join(folder, name + ".onnx")
        torch.onnx.export(net, tuple(torch.from_numpy(v) for v in inputs.values()), path,
                          input_names=list(inputs), output_names=outputs, opset_version=17, dynamo=False)
        entry = {"name": name, "onnx": path, "pgb": os.path.join(folder, name + ".pgb"), "inputs": {}}
        for k, v in inputs.items():
            file = os.path.join(folder, f"{name}.{k}.bin")
            v.tofile(file)
            entry["inputs"][k] = {"file": file, "shape": list(v.shape), "dtype": str(v.dtype)}
        out.append(entry)
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def _bert(cfg: dict, rng: np.random.Generator) -> tuple[Any, dict]:
    import torch
    from transformers import BertConfig, BertModel
    config = BertConfig(intermediate_size=4 * cfg["hidden_size"], **cfg)
    bert = BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):  # keyword arguments: BertModel's positional order changes between versions
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    ids = rng.integers(0, config.vocab_size, (1, 128)).astype(np.int64)
    return Encoder().eval(), {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64)}


def read_inputs(entry: dict) -> dict[str, np.ndarray]:
    return {k: np.fromfile(v["file"], dtype=v["dtype"]).reshape(v["shape"]) for k, v in entry["inputs"].items()}


# ---- worker side: one library, one model, driven over stdin/stdout -----------------------------------
def worker(lib: str, entry: dict, threads: int) -> None:
    """Load, run once (timed together: load to first result), then answer commands, one JSON line each:
    `run N` -> the seconds of N calls; `out PATH` -> saves the first output (.npy); `save PATH` -> .pgb."""
    inputs = read_inputs(entry)
    t0 = time.perf_counter()
    if lib == "ort":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(entry["onnx"], so, providers=["CPUExecutionProvider"])
        run = lambda: session.run(None, inputs)[0]  # noqa: E731
        model = None
    else:
        import polygrad.onnx
        model = polygrad.onnx.load(entry["onnx"])
        out_name = next(iter(model.onnx_outputs))
        run = lambda: model.forward(**inputs)[out_name].numpy()  # noqa: E731
    first = run()
    reply({"load_s": time.perf_counter() - t0})
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "run":
            times = []
            for _ in range(int(arg)):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            reply({"times": times})
        elif cmd == "out":
            np.save(arg, first)
            reply({})
        elif cmd == "save":
            model.save(arg)
            reply({})
        else:
            break


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Worker:
    """A `--worker` process for one library and model."""

    def __init__(self, lib: str, entry: dict, threads: int, cache: str):
        env = dict(os.environ, POLY_THREADS=str(threads), POLY_CACHE_DIR=cache, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([sys.executable, HERE, "--worker", lib, json.dumps(entry), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.load_s = self.read()["load_s"]

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a benchmark worker ended early (exit code {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait()


# A round of one library lasts about this long (at least 2 calls, at most 50): on a 2-vCPU VM the calls right
# after the other library's round ran 1.5-3x slower for a while (polygrad's MobileNetV2, 5 ms a call settled:
# 7-15 ms for the first few calls of a round), so rounds of 3 calls measured mostly that recovery
ROUND_S = 0.25


def bench_python(entry: dict, folder: str, rounds: int, threads: int) -> dict:
    """Cold and warm polygrad loads, then ort and polygrad timed in alternating rounds of the same number of
    calls, each round about ROUND_S long for the slower library."""
    cache = os.path.join(folder, "cache-" + entry["name"])
    shutil.rmtree(cache, ignore_errors=True)  # cold: nothing compiled yet
    cold = Worker("polygrad", entry, threads, cache)
    cold.close()
    workers = {"ort": Worker("ort", entry, threads, cache), "polygrad": Worker("polygrad", entry, threads, cache)}
    try:
        ref_file, out_file = (os.path.join(folder, f"{entry['name']}.{k}.npy") for k in ("ort", "pg"))
        workers["ort"].ask(f"out {ref_file}")
        workers["polygrad"].ask(f"out {out_file}")
        workers["polygrad"].ask(f"save {entry['pgb']}")
        times: dict[str, list[float]] = {"ort": [], "polygrad": []}
        probe = max(float(np.median(w.ask("run 2")["times"])) for w in workers.values())
        calls = min(50, max(2, math.ceil(ROUND_S / max(probe, 1e-6))))
        for k in range(rounds):
            order = ("ort", "polygrad") if k % 2 == 0 else ("polygrad", "ort")
            for lib in order:
                times[lib] += workers[lib].ask(f"run {calls}")["times"]
        ref, out = np.load(ref_file), np.load(out_file)
        return {"ort": float(np.median(times["ort"])), "polygrad": float(np.median(times["polygrad"])),
                "load": {"polygrad cold": cold.load_s, "polygrad warm": workers["polygrad"].load_s,
                         "ort": workers["ort"].load_s},
                "err": float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))}
    finally:
        for w in workers.values():
            w.close()


def bench_node(manifest: str, rounds: int, threads: int) -> dict[str, dict]:
    """polygrad-js against onnxruntime-web: {model: {...}} from the Node script's JSON lines."""
    proc = subprocess.run(["node", NODE_SCRIPT, manifest, "--rounds", str(rounds), "--threads", str(threads),
                           "--json"], stdout=subprocess.PIPE, text=True, check=True)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["name"]] = r
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def fmt_ratio(r: float | None, target: float, strict: bool) -> str:
    if r is None:
        return f"{'-':>8s}{'':>9s}"
    met = r < target if strict else r <= target
    return f"{r:8.2f}{'  met' if met else '  NOT met':>9s}"


def report(rows: dict[str, dict], node: dict[str, dict], threads: int, args: argparse.Namespace) -> None:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    bert = bert_config(args.bert_base, args.quick)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}; {threads} threads each (ort intra-op / POLY_THREADS / ort-web numThreads / "
          f"polygrad-js threads)")
    print(f"bert: BertModel {bert['num_hidden_layers']} layers, width {bert['hidden_size']}, "
          f"{bert['num_attention_heads']} heads, batch 1, sequence 128; median ms of {args.rounds} alternating "
          f"rounds")
    print(f"\n{'model':16s}{'polygrad':>10s}{'ort':>9s}{'pg/ort':>8s}{'<=1.5x':>9s}{'rel err':>10s}"
          f"{'pg-js':>10s}{'ort-web':>9s}{'js/web':>8s}{'<1x':>9s}{'rel err':>10s}")
    for name, r in rows.items():
        n = node.get(name)
        if n and "error" in n:
            print(f"{name}: polygrad-js / ort-web failed: {n['error']}")
            n = None
        js = f"{n['polygrad'] * 1e3:10.1f}{n['ort'] * 1e3:9.1f}" if n else f"{'-':>10s}{'-':>9s}"
        js_err = f"{n['err']:10.1e}" if n else f"{'-':>10s}"
        print(f"{name:16s}{r['polygrad'] * 1e3:10.1f}{r['ort'] * 1e3:9.1f}"
              f"{fmt_ratio(r['polygrad'] / r['ort'], PY_TARGET, False)}{r['err']:10.1e}{js}"
              f"{fmt_ratio(n['polygrad'] / n['ort'] if n else None, JS_TARGET, True)}{js_err}")
    print(f"\nload to first result, s: {'polygrad cold':>14s}{'warm':>8s}{'ort':>8s}{'pg-js':>8s}{'ort-web':>9s}")
    for name, r in rows.items():
        n = (node.get(name) or {}).get("load", {})
        js = "".join(f"{n[k]:8.2f}" if k in n else f"{'-':>8s}" for k in ("polygrad", "ort"))
        print(f"{name:25s}{r['load']['polygrad cold']:14.2f}{r['load']['polygrad warm']:8.2f}"
              f"{r['load']['ort']:8.2f}{js}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
        return
    names = ["resnet18_b1", "resnet18_b16", "mobilenet_v2_b1", "bert_s128"]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=names)
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 6, --quick 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bert-base", action="store_true")
    ap.add_argument("--no-js", action="store_true")
    ap.add_argument("--keep", metavar="DIR", help="write the models here and keep them")
    args = ap.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 6)
    folder = args.keep or tempfile.mkdtemp(prefix="pg-bench-onnx-")
    os.makedirs(folder, exist_ok=True)
    try:
        manifest = export_models(folder, args.only or names, bert_config(args.bert_base, args.quick))
        rows = {}
        for entry in manifest:
            rows[entry["name"]] = bench_python(entry, folder, args.rounds, args.threads)
            print(f"[{entry['name']}] python done", file=sys.stderr)
        node: dict[str, dict] = {}
        if not args.no_js:
            if shutil.which("node") and os.path.isdir(NODE_LIBS):
                node = bench_node(os.path.join(folder, "manifest.json"), args.rounds, args.threads)
            else:
                print("(Node columns left out: no node on PATH or no onnxruntime-web: cd polygrad-js/bench && "
                      "npm install)", file=sys.stderr)
        report(rows, node, args.threads, args)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
