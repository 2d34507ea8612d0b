"""Model: a captured graph that owns its state, trains with fit(), and saves to a portable .pgb bundle.

Stage: user API over the capture layer. Input: a callable (an object with Tensor attributes, or a
function with explicit `params=`), declared inputs/targets and a loss; or a bundle. Output: a Model
whose entrypoints are lists of device-independent kernels over one buffer table, the same structure
that `save()` writes and `Model.load()` reads (docs/bundle-format.md), so a captured model and a
loaded one run through the same code, on any installed backend.

One module per concern, laid out as polygrad-js is, each importing only modules listed before it
(no import cycle, function-level imports included: tests/test_tensor_layout.py):

  program.py    the Program: slots with roles, kernels, entrypoints of calls  (js: manifest.js's types)
  errors.py     ModelError, ModelInputError, ModelCaptureError                (js: errors.js)
  signature.py  declared inputs, targets, Variables, params, caches -> Specs
  table.py      recorded launches -> slots and calls
  executor.py   Program + buffers -> entrypoints run, results handed out      (js: runtime.js)
  data.py       caller data -> checked feeds and Variable values              (js: data.js)
  optim.py      optimizer configuration; its step recorded into the Program   (js: optim.js)
  format.py     Program <-> bundle manifest, every field of a file checked    (js: manifest.js)
  capture.py    a callable run under engine/capture.py -> Program
  training.py   train_step() and fit()
  core.py       the Model class composing them                                (js: model.js)

Entrypoints: "forward" (evaluation), "loss" (training forward + backward: the loss and the gradients),
"optimizer_step" and "train_step" ("loss" then "optimizer_step") once an optimizer is configured, and
any extra evaluation entrypoints given with `entrypoints=` (a KV-cache "decode", for instance).

>>> from polygrad import Model, Tensor
>>> class Scale:
...     def __init__(self): self.w = Tensor([2.0])
...     def __call__(self, x): return {"y": x * self.w}
>>> m = Model(Scale(), inputs={"x": Tensor.empty(3)})
>>> m.forward(x=[1, 2, 3])["y"].numpy().tolist()
[2.0, 4.0, 6.0]
>>> m2 = Model.load(m.save()); m.dispose()
>>> m2.forward(x=[1, 1, 1])["y"].numpy().tolist()
[2.0, 2.0, 2.0]
>>> m2.dispose()
"""
from polygrad.bundle import BundleError
from polygrad.model.core import Model, ModelSummary
from polygrad.model.errors import ModelCaptureError, ModelError, ModelInputError

__all__ = ["BundleError", "Model", "ModelCaptureError", "ModelError", "ModelInputError", "ModelSummary"]
