"""Typed errors users can catch; every message says what to do next."""


class PolygradError(Exception):
    """Base class of every error polygrad raises on purpose."""


class DeviceError(PolygradError, ValueError):
    """A device name, ordinal or target that cannot be used."""


class UnknownDeviceError(DeviceError):
    """No installed backend has this name."""


class DeviceUnavailableError(DeviceError):
    """The backend is installed but its probe failed (no compiler, no driver, ...)."""


class CompileError(PolygradError, RuntimeError):
    """A kernel failed to compile; the message holds the compiler's output."""


class PluginError(PolygradError):
    """A backend plugin is malformed or built for another plugin API version."""


class SettingError(PolygradError, ValueError):
    """A setting's value that cannot be used (POLY_THREADS=abc, BEAM=-1), or a setting declared twice with
    different meanings; the message names the variable and the values it takes."""


class UnknownSettingError(SettingError, KeyError):
    """A setting name nobody declared (DEBGU for DEBUG); the message lists the known names and suggests
    the closest one. A KeyError too, as a missing key of a table."""

    __str__ = BaseException.__str__  # KeyError would quote the whole message


class CapabilityError(PolygradError):
    """can_run() cannot prove support for a query statically."""


class RuntimeOwnershipError(PolygradError, ValueError):
    """Operands belong to different runtimes, or to a disposed one."""


class TrainingModeError(PolygradError, RuntimeError):
    """An optimizer step was asked for outside training mode (wrap it in `with Context(TRAINING=1):`)."""


class StateDictError(PolygradError, ValueError):
    """A state dict does not fit a model: missing, unexpected or wrongly shaped entries."""


class SafetensorsError(PolygradError, ValueError):
    """A safetensors file is corrupt, truncated or uses a dtype polygrad cannot hold."""


class LinAlgError(PolygradError, ValueError):
    """A linear-algebra input that has no answer: singular, not square, or not positive definite."""


class VariableError(PolygradError, ValueError):
    """A symbolic size Variable used wrongly: bound outside its bounds or to a non-integer, realized
    while unbound, bound to two values at once, or two variables sharing one name in a kernel."""


class ShapeError(PolygradError, ValueError, RuntimeError):
    """Shapes that cannot combine (broadcast, reshape, matmul, cat...); the message names both shapes. Also a
    RuntimeError, which torch and tinygrad raise for these, and a ValueError, as before."""


class DTypeError(PolygradError, TypeError, RuntimeError):
    """An unknown dtype name or an impossible conversion (an in-place float result into an int tensor...).
    A TypeError, and a RuntimeError as torch and tinygrad raise for casts they refuse."""


class InvalidArgumentError(PolygradError, ValueError, RuntimeError):
    """An argument value an operation cannot use: an empty list of tensors, a negative class count, a padding
    of the wrong length, a negative shift, an unknown mode name... Both a ValueError (NumPy's and tinygrad's
    habit) and a RuntimeError (torch's), so programs written for either catch it."""


class DimensionError(PolygradError, IndexError, RuntimeError):
    """A dimension out of range for the tensor, or named twice where each may appear once. An IndexError, as
    torch raises for out-of-range dims, and a RuntimeError, as torch raises for repeated ones."""


class DistributedError(PolygradError, RuntimeError):
    """A collective across processes that cannot complete: ranks that disagree on a tensor's shape or dtype
    (the message names them), a rank that did not join within POLY_DIST_TIMEOUT seconds (it died, hangs or
    took another path), a multi-process launch without mpi4py, or a bad op or root."""


class QuantizationError(PolygradError, ValueError):
    """A weight that cannot be kept in a block format: an unknown format, a non-float tensor, rows that are
    not whole blocks, blocks of the wrong shape, or a captured Model (quantize its module before building it)."""


class ReadOnlyBufferError(PolygradError, ValueError):
    """A write (an assign, a setitem, a copy in, a custom kernel) into a buffer that adopted read-only host
    memory (Tensor.from_host_view: a memory-mapped file's pages); write into a copy (`t.contiguous()` or
    `Tensor(t.numpy())`) instead."""
