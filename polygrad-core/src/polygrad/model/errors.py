"""The errors a Model raises: misuse, bad inputs, and callables that a captured graph cannot hold.

Stage: shared by every module of polygrad.model. Input: nothing. Output: the exception types
(`polygrad.Model` users catch them; `BundleError`, for files, is polygrad/bundle.py's).
"""
from __future__ import annotations

from polygrad.engine.capture import CaptureError
from polygrad.errors import PolygradError


class ModelError(PolygradError, ValueError):
    """A Model used in a way it cannot serve: disposed, no loss for training, bad fit() arguments."""


class ModelInputError(ModelError):
    """An input or target with a wrong name, shape or dtype (the message says which and what was expected)."""


class ModelCaptureError(CaptureError):
    """The callable did something a captured graph cannot hold (an effectful read, an assignment to a
    parameter or input, a Tensor that is not among the parameters)."""
