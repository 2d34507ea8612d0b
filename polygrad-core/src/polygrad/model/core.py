"""The Model class: a captured or loaded Program with its own buffers, composed from the package's stages.

Stage: user API (polygrad-js: model.js). Input: a callable and its declarations (capture.py builds
the Program), or a bundle (format.py reads it). Output: a Model whose entrypoints run on the executor
(executor.py) with checked inputs (data.py), train (training.py, inherited), describe themselves
(summary, parameters) and save to a bundle (format.py, bundle.py), which `Model.load` reads back.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from polygrad import bundle, filemap, limits, runtime_context
from polygrad.atomicfile import write_file
from polygrad.bundle import BundleError
from polygrad.device import canonicalize
from polygrad.distributed import is_main
from polygrad.model.capture import capture_program
from polygrad.model.data import feeds
from polygrad.model.errors import ModelError
from polygrad.model.executor import Executor
from polygrad.model.format import from_manifest, to_manifest
from polygrad.model.optim import initial_optimizer_values
from polygrad.model.program import ROLES, Program, Spec, dtype_name
from polygrad.model.training import TrainingMixin
from polygrad.tensor import Tensor, _buffer_uop
from polygrad.version import __version__


@dataclass
class ModelSummary:
    """What summary() returns: metadata only (nothing executed, no weights read)."""

    inputs: list[dict]
    targets: list[dict]
    outputs: list[dict]
    entrypoints: list[str]
    parameters: list[dict]
    state: list[dict]
    parameter_count: int
    bytes: dict[str, int]
    device: str
    optimizer: dict | None

    def __str__(self) -> str:
        def sig(rows: list[dict]) -> str:
            return ", ".join(f"{r['name']}: {r['dtype']}{list(r['shape'])}" for r in rows) or "-"
        lines = [f"Model on {self.device}", f"  inputs:      {sig(self.inputs)}", f"  targets:     {sig(self.targets)}",
                 f"  outputs:     {sig(self.outputs)}", f"  entrypoints: {', '.join(self.entrypoints)}",
                 f"  parameters:  {self.parameter_count:,} in {len(self.parameters)} tensors"]
        lines += [f"    {p['name']:32s} {p['dtype']:9s} {str(list(p['shape'])):18s} {p['count']:>10,}"
                  for p in self.parameters + self.state]
        lines.append("  bytes:       " + ", ".join(f"{k} {v:,}" for k, v in self.bytes.items() if v))
        if self.optimizer:
            lines.append(f"  optimizer:   {self.optimizer}")
        return "\n".join(lines)

    __repr__ = __str__


class Model(TrainingMixin):
    """A captured graph with its own state: forward/call/train_step/fit, summary, save/load, dispose.

    Besides `inputs`/`targets`/`loss`/`params`:
      caches       {name: Tensor} buffers the entrypoints write and read, kept between calls (a KV cache);
                   the Model's copies start zeroed, and a bundle does not store them.
      entrypoints  {name: (callable, inputs)} more evaluation entrypoints over the same parameters and
                   caches, run with `model.call(name, {...})`.
    An input declared as a Variable (inputs={"pos": Variable("pos", 0, 127)}) is an integer argument:
    the callable receives it bound, and each call passes its value (`model.call("decode", {"pos": 5, ...})`).
    Any dimension of an input may be a Variable; its value comes from the data's shape.
    """

    def __init__(self, obj: Any, inputs: Mapping[str, Any], targets: Mapping[str, Any] | None = None,
                 loss: Callable | None = None, params: Any = None, runtime: Any = None,
                 caches: Mapping[str, Any] | None = None, entrypoints: Mapping[str, Any] | None = None):
        runtime = runtime if runtime is not None else runtime_context.current()
        if runtime is not None:
            runtime.check_alive()
        prog, data, device = capture_program(obj, inputs, targets or {}, loss, params, runtime, caches, entrypoints)
        self._setup(prog, data, runtime, device)

    # ---- building from a program (capture or bundle)
    def _setup(self, prog: Program, data: dict[int, Any], runtime: Any, device: str, adopt: bool = False) -> None:
        self._p = prog
        self._runtime = runtime
        self.device = canonicalize(device)
        self._x: Executor = Executor(prog, data, self.device, runtime, adopt)
        self._opt_pending: dict | None = None
        self._distributed = False
        self._disposed = False

    @classmethod
    def _from_program(cls, prog: Program, data: dict[int, np.ndarray], runtime: Any, device: str,
                      adopt: bool = False) -> "Model":
        """A Model of a captured or stored program and its slots' initial data (adopt: Executor's)."""
        m = cls.__new__(cls)
        m._setup(prog, data, runtime, device, adopt)
        return m

    # ---- state checks
    def _alive(self) -> None:
        if self._disposed:
            raise ModelError("this Model was disposed; build it again or Model.load() the bundle")
        if self._runtime is not None:
            self._runtime.check_alive()

    @property
    def entrypoints(self) -> list[str]:
        return list(self._p.entries)

    @property
    def variables(self) -> dict[str, tuple[int, int]]:
        return dict(self._p.variables)

    # ---- public calls
    def call(self, entrypoint: str, inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one entrypoint; returns its outputs as Tensors that keep this call's values."""
        self._alive()
        if entrypoint not in self._p.entries:
            raise ModelError(f"no entrypoint {entrypoint!r}; this model has {self.entrypoints}")
        fed, env = feeds(self._p, entrypoint, inputs or {}, self.device)
        if entrypoint == "train_step" and self._opt_pending:
            raise ModelError("the optimizer graph is recorded on the first train_step(); call train_step() or fit()")
        self._x.run(entrypoint, fed, env)
        return {k: self._x.take(s, self._p.slots[s].shape, env) for k, s in self._p.entries[entrypoint].outputs.items()}

    def forward(self, **inputs: Any) -> dict[str, Any]:
        """The evaluation forward: `model.forward(x=...)` -> {output name: Tensor}."""
        return self.call("forward", inputs)

    __call__ = forward

    # ---- metadata
    def summary(self) -> ModelSummary:
        """Inputs, outputs, entrypoints, parameters and bytes; executes nothing and reads no weights."""
        self._alive()

        def rows(specs: list[Spec]) -> list[dict]:
            return [{"name": s.name, "dtype": dtype_name(s.dtype), "shape": s.shape} for s in specs]

        def tensors(role: str) -> list[dict]:
            return [{"name": s.name, "dtype": dtype_name(s.dtype), "shape": s.shape, "count": s.size}
                    for s in self._p.slots if s.role == role]
        nbytes = {r: 0 for r in ROLES}
        for s in self._p.slots:
            nbytes[s.role] += s.size * s.dtype.itemsize
        params = tensors("parameter")
        return ModelSummary(rows(self._p.inputs), rows(self._p.targets), rows(self._p.outputs), self.entrypoints,
                            params, tensors("state"), sum(p["count"] for p in params), nbytes, self.device,
                            dict(self._p.optimizer) if self._p.optimizer else None)

    def parameters(self) -> dict[str, Any]:
        """{name: Tensor} views of the parameters and state (they change as the model trains)."""
        self._alive()
        return {s.name: Tensor(_buffer_uop(self._x.bufs[k], s.shape), _runtime=self._runtime)
                for k, s in enumerate(self._p.slots) if s.role in ("parameter", "state")}

    # ---- save / load
    def save(self, path: str | os.PathLike | None = None, include_optimizer: bool = True) -> bytes | None:
        """Write the bundle to `path`, or return its bytes when no path is given.

        include_optimizer=False stores the optimizer's initial state instead of its current one (the
        training entrypoints stay); reapply an optimizer configuration after loading to resume.
        After fit(distributed=True) on several ranks, every rank holds the same weights and only rank 0
        writes `path` (the others return at once; call polygrad.distributed.barrier() before reading it).
        """
        self._alive()
        if path is not None and self._distributed and not is_main():
            return None
        p, bufs = self._p, self._x.bufs
        recorded = "optimizer_step" in p.entries
        initial = initial_optimizer_values(p, bufs, self._runtime) if recorded and not include_optimizer else {}

        def stored(s: int) -> np.ndarray:
            return initial[s] if s in initial else bufs[s].numpy()
        manifest, blobs = to_manifest(p, stored, include_optimizer, __version__)
        if path is None:
            return bundle.write(manifest, blobs)
        # written piece by piece next to the target, then renamed: no half-written bundle (atomicfile.py),
        # and never a second copy of every weight in memory
        write_file(path, lambda f: bundle.write_to(f.write, manifest, blobs))
        return None

    @classmethod
    def load(cls, source: str | os.PathLike | bytes | bytearray | memoryview, runtime: Any = None,
             device: str | None = None, *, max_bytes: int | None = None, max_work: int | None = None) -> "Model":
        """A Model from a bundle path or its bytes, on `runtime` (default: the default runtime) or `device`.

        A bundle may ask for at most `max_bytes` of buffers and `max_work` node evaluations per entrypoint
        call; by default max(256 MiB, 16 x the file's size) and max(2**36, 2**16 x the file's size)
        (polygrad/limits.py, the same in polygrad-js). Raise them for a file you trust that needs more.
        A path is mapped, not read (filemap.py): the copies into the Model's buffers give the file's pages
        back as they go, so the load holds about the Model's memory, not the file beside it.
        """
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = source
        elif isinstance(source, (str, os.PathLike)):
            try:  # mapped, not read: the copies into the buffers give its pages back as they go
                data = filemap.map_file(source)
            except OSError as e:
                raise BundleError(f"cannot read bundle {os.fspath(source)!r}: {e.strerror}") from None
        else:
            raise TypeError(f"Model.load takes a path or bytes, got {type(source).__name__}")
        runtime = runtime if runtime is not None else runtime_context.current()
        if runtime is not None:
            runtime.check_alive()
        dev = canonicalize(device if device is not None else (runtime.device if runtime is not None else None))
        manifest, body = bundle.read(data)
        size = len(memoryview(data).cast("B"))
        max_bytes = limits.default_max_bytes(size) if max_bytes is None else _cap(max_bytes, "max_bytes")
        max_work = limits.default_max_work(size) if max_work is None else _cap(max_work, "max_work")
        prog, stored = from_manifest(manifest, body, max_bytes, max_work)
        return cls._from_program(prog, stored, runtime, dev)

    def export_onnx(self, path: str | os.PathLike | None = None, opset: int = 17) -> bytes | None:
        """Write the forward entrypoint as an ONNX graph (polygrad-onnx's export: a Model built by
        polygrad.models or loaded by polygrad.onnx.load); returns the bytes when no path is given."""
        self._alive()
        try:
            from polygrad_onnx import export  # another distribution, optional: imported when asked for
        except ModuleNotFoundError as e:
            if e.name != "polygrad_onnx":
                raise
            raise ModelError("Model.export_onnx needs the polygrad-onnx distribution: pip install polygrad-onnx "
                             "(or pip install 'polygrad[onnx]')") from None
        return export(self, path, opset=opset)

    # ---- lifetime
    def dispose(self) -> None:
        """Free the model's buffers and programs; later calls raise. Idempotent; returned Tensors stay valid."""
        if self._disposed:
            return
        self._disposed = True
        self._x = None  # type: ignore[assignment]  (the buffers and programs go; every use checks _alive())

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.dispose()

    def __repr__(self) -> str:
        state = " disposed" if self._disposed else ""
        ins = ", ".join(f"{s.name}{list(s.shape)}" for s in self._p.inputs)
        return f"<Model ({ins}) -> ({', '.join(s.name for s in self._p.outputs)}) on {self.device}{state}>"


def _cap(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ModelError(f"Model.load({name}=...) takes a non-negative int, got {value!r:.40}")
    return value
