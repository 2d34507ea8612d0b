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
