"""What this host's processor is: one description, detected once, that sizes the host backends' kernels.

Stage: device probe (the CPU and X86 backends reach it through backend_api when they open). Input:
/proc/cpuinfo (vendor, model, flags), sysfs cache folders (L1d/L2/L3; cpuid where sysfs is missing is
left to a declaration, see below), the core count, a table of documented microarchitectures (FMA
units and latency) and the POLY_CPU setting, which overrides any field. Output: a `CpuDescription`, and
`host_fields(...)`: the Capabilities fields a host backend fills from it (caches, FMA units, staging
budget, and the tile choices a stored calibration made for this processor).

Why derived heuristics first and calibration second: the heuristics in codegen/host_opts.py need few
numbers (vector lanes and registers, FMA latency x throughput, L2 size, cores) and each has a reason
that holds on any x86 machine, so a new machine gets sensible tiles at once, deterministically, with
no timing in the first run and nothing that differs between two runs of one machine. Timings (a
calibration) on a shared cloud machine are noisy and cost seconds, so they are opt-in
(`python -m polygrad calibrate`, polygrad/calibrate.py): they choose among the few tile shapes the
heuristics already produce and are stored per processor model, flags and compiler, for machines where
the documented numbers are not enough (an unknown microarchitecture, a compiler that prefers another
tile).

FMA units are taken from the table below where the vendor documents them; elsewhere the description
says "assumed" (1 unit, latency 4) and POLY_CPU (or a calibration) should settle it: polygrad does not
run a timed FMA loop at device open, since it would need a compiled kernel before the device exists.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any

from polygrad.config import cache_dir as config_cache_dir
from polygrad.config import process_value
from polygrad.diskcache import cache_dir, read_entry, write_entry
from polygrad.errors import SettingError

# microarchitectures whose vector FMA issue rate and latency are documented (vendor optimisation
# manuals): (vendor, cpu family, models, name, FMAs per cycle on 512-bit vectors, on 256-bit ones,
# latency in cycles). The 512-bit rate applies only where the CPU has AVX-512.
FMA_TABLE: tuple[tuple[str, int, frozenset[int], str, int, int, int], ...] = (
    ("AuthenticAMD", 0x17, frozenset(range(0x00, 0x30)), "Zen / Zen+", 0, 1, 5),
    ("AuthenticAMD", 0x17, frozenset(range(0x30, 0x100)), "Zen 2", 0, 2, 5),
    ("AuthenticAMD", 0x19, frozenset([*range(0x10, 0x20), *range(0x60, 0x80), *range(0xa0, 0xb0)]),
     "Zen 4", 1, 2, 4),
    ("AuthenticAMD", 0x19, frozenset([*range(0x00, 0x10), *range(0x20, 0x60)]), "Zen 3", 0, 2, 4),
    ("AuthenticAMD", 0x1a, frozenset(range(0x00, 0x100)), "Zen 5", 2, 2, 4),
    ("GenuineIntel", 6, frozenset([0x3c, 0x3f, 0x45, 0x46, 0x3d, 0x47, 0x4f, 0x56]),
     "Haswell / Broadwell", 0, 2, 5),
    ("GenuineIntel", 6, frozenset([0x4e, 0x5e, 0x8e, 0x9e, 0xa5, 0xa6, 0x97, 0x9a, 0xb7, 0xba, 0xbf, 0xaa, 0xac]),
     "Skylake client and later cores", 0, 2, 4),
    ("GenuineIntel", 6, frozenset([0x7d, 0x7e, 0x8c, 0x8d, 0xa7]),
     "Ice Lake / Tiger Lake / Rocket Lake client", 1, 2, 4),
    ("GenuineIntel", 6, frozenset([0x55, 0x6a, 0x6c, 0x8f, 0xcf, 0xad, 0xae]),
     "Xeon Scalable (Skylake-SP and later)", 2, 2, 4),
)
# Xeon Scalable parts with one 512-bit FMA unit (port 0+1 fused only): Bronze, Silver, some Gold 5xxx
ONE_FMA_XEON = ("Bronze", "Silver")
ASSUMED_FMA = (1, 4)  # units, latency: the safe guess for an undocumented microarchitecture
# One core's streaming read rate from memory (GB/s) and what splitting a launch among threads costs beyond
# its parts' work (ns), where nothing declares them: the split of a memory-bound kernel
# (codegen/host_opts.thread_parts) weighs one against the other. Measured on the 2-vCPU AMD EPYC Zen 4 VM:
# Qwen2-0.5B's Q4_0 decode matvecs read 16-17 GB/s at one thread. The C pool's own handoff
# (polygrad_backend_cpu/runtime.py, the worker spinning on a free core) is small: the worker starts its
# part 0.15-0.25 us after the launch, the launch returns 0.07-0.1 us after the part ends. A split kernel
# costs more (benchmarks/profile_threads.py, a decode step's launches in launch plans, weights cold, 42 runs
# at load 0.8-2.2): the 64.5 KB k/v matvec took 8.1 us in 2 parts against 6.2 whole, 4.6 us beyond its
# halves (quartiles 4.3-5.1; 2 parts faster in 7 runs of 42), the 445 KB q/o matvec 29.7 against 32.8
# (12 us beyond; faster in 36 of 42). The worker reads the activation the launcher's core wrote, and its
# half of the outputs goes back; the cause was not isolated
ASSUMED_READ_GBS = 16.0
ASSUMED_HANDOFF_NS = 4500
STAGE_MAX_BYTES = 512 * 1024  # staged panels live on the launch's stack (renderer/linearize.STAGE_MAX_BYTES)
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class CpuDescription:
    """The processor the host backends compile for. `sources` says, per field, where its value came
    from: "cpuinfo", "sysfs", "table: <microarchitecture>", "assumed", "declared (POLY_CPU)"."""

    vendor: str = ""
    model_name: str = ""
    family: int = 0
    model: int = 0
    flags: tuple[str, ...] = ()
    vector_bits: int = 128           # the widest vectors -march=native compiles for: 512, 256 or 128
    vector_registers: int = 16       # 32 with AVX-512, else 16
    fma_units: int = ASSUMED_FMA[0]  # vector FMAs a core issues per cycle at vector_bits
    fma_units_256: int = ASSUMED_FMA[0]  # the same at 256 bits (X86 capped to AVX2, AVX2-only CPUs)
    fma_latency: int = ASSUMED_FMA[1]    # cycles from an FMA's inputs to its result
    microarchitecture: str = ""
    l1d_bytes: int = 32 << 10        # per core
    l2_bytes: int = 512 << 10        # per core
    l3_bytes: int = 16 << 20         # the largest cache, shared
    cores: int = 1
    read_gbs: float = ASSUMED_READ_GBS  # one core's streaming read rate from memory, GB/s
    thread_handoff_ns: int = ASSUMED_HANDOFF_NS  # a launch split among threads costs this beyond its parts
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def lanes(self) -> int:
        """float32 lanes of a vector."""
        return self.vector_bits // 32

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, "default")

    def fma_units_at(self, bits: int) -> int:
        """Vector FMAs per cycle on vectors of `bits` (an X86 backend capped below the widest)."""
        return self.fma_units if bits >= self.vector_bits else self.fma_units_256

    def key(self) -> dict[str, Any]:
        """What a calibration is keyed by: the processor model and its flags (not its caches or cores,
        which a VM may report differently from run to run)."""
        return {"vendor": self.vendor, "model_name": self.model_name, "family": self.family, "model": self.model,
                "flags": list(self.flags), "vector_bits": self.vector_bits}


DECLARABLE = {f.name: f.type for f in fields(CpuDescription) if f.name != "sources"}
POSITIVE = ("vector_bits", "vector_registers", "fma_units", "fma_units_256", "fma_latency", "l1d_bytes", "l2_bytes",
            "l3_bytes", "cores", "read_gbs", "thread_handoff_ns")


def describe_cpu() -> CpuDescription:
    """This host's processor, detected once per process, with POLY_CPU's fields over it."""
    return _described(process_value("POLY_CPU"))


@lru_cache(maxsize=None)
def _described(declared: str) -> CpuDescription:
    desc = detect_cpu()
    if declared.strip():
        desc = declare(desc, parse_declared(declared))
    return desc


def detect_cpu() -> CpuDescription:
    """The description read from this machine alone (no POLY_CPU)."""
    info = _cpuinfo()
    flags = tuple(sorted(info.get("flags", info.get("Features", "")).split()))
    sources: dict[str, str] = {}
    vendor = info.get("vendor_id", "")
    family = _int(info.get("cpu family", "0"))
    model = _int(info.get("model", "0"))
    if info:
        sources.update(dict.fromkeys(("vendor", "model_name", "family", "model", "flags"), "cpuinfo"))
    if "avx512f" in flags:
        bits, regs = 512, 32
    elif "avx" in flags or "avx2" in flags:
        bits, regs = 256, 16
    else:
        bits, regs = 128, 16  # SSE2 (every x86-64) or NEON/ASIMD
    sources["vector_bits"] = sources["vector_registers"] = "cpuinfo flags"
    arch, units, units_256, latency = _fma_row(vendor, family, model, info.get("model name", ""), bits)
    fma_from = f"table: {arch}" if arch else "assumed (undocumented microarchitecture: declare it with POLY_CPU)"
    for name in ("fma_units", "fma_units_256", "fma_latency"):
        sources[name] = fma_from
    caches = _sysfs_caches()
    desc = CpuDescription(vendor=vendor, model_name=info.get("model name", ""), family=family, model=model,
                          flags=flags, vector_bits=bits, vector_registers=regs, fma_units=units,
                          fma_units_256=units_256, fma_latency=latency, microarchitecture=arch,
                          cores=os.cpu_count() or 1)
    sources["cores"] = "os.cpu_count"
    sources["read_gbs"] = sources["thread_handoff_ns"] = "assumed (measured on a Zen 4 VM: declare it with POLY_CPU)"
    for name, size in caches.items():
        desc = replace(desc, **{name: size})
        sources[name] = "sysfs"
    return replace(desc, sources=tuple(sorted(sources.items())))


def _int(text: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return 0


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo ({} where there is none)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    if out:
                        break
                    continue
                name, _, value = line.partition(":")
                out.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return out


def _fma_row(vendor: str, family: int, model: int, model_name: str, bits: int) -> tuple[str, int, int, int]:
    """(microarchitecture, FMA units at `bits`, at 256 bits, latency) from FMA_TABLE; ("", assumed) if absent."""
    for row_vendor, row_family, models, arch, units_512, units_256, latency in FMA_TABLE:
        if vendor == row_vendor and family == row_family and model in models:
            if units_512 == 2 and any(word in model_name for word in ONE_FMA_XEON):
                units_512 = 1
            units = units_512 if bits >= 512 and units_512 else units_256
            return arch, units, units_256, latency
    return "", ASSUMED_FMA[0], ASSUMED_FMA[0], ASSUMED_FMA[1]


def _sysfs_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """{"l1d_bytes", "l2_bytes", "l3_bytes"} found in sysfs (cpu0's view: L1d and L2 are per core on
    every x86 part we know; L3 is the largest level, shared)."""
    out: dict[str, int] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return out
    for entry in entries:
        folder = os.path.join(root, entry)
        try:
            level = _read(folder, "level")
            kind = _read(folder, "type")
            size = _size(_read(folder, "size"))
        except OSError:
            continue
        if not size:
            continue
        if level == "1" and kind in ("Data", "Unified"):
            out["l1d_bytes"] = size
        elif level == "2":
            out["l2_bytes"] = size
        elif level in ("3", "4"):
            out["l3_bytes"] = max(out.get("l3_bytes", 0), size)
    if out and "l3_bytes" not in out:
        out["l3_bytes"] = max(out.values())  # no L3: the largest level is the one outputs stream past
    return out


def _read(folder: str, name: str) -> str:
    with open(os.path.join(folder, name)) as f:
        return f.read().strip()


def _size(text: str) -> int:
    """Bytes of a sysfs size ("32K", "1024K", "32M")."""
    text = text.upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text.rstrip("KMG")
    return int(digits) * scale if digits.isdigit() else 0


def parse_declared(text: str) -> dict[str, Any]:
    """POLY_CPU's fields: inline JSON (`{"l2_bytes": 2097152}`) or the path of a JSON file holding one
    object. SettingError naming the bad field (or file) if it cannot be used."""
    raw = text.strip()
    if not raw.startswith("{"):
        try:
            with open(raw) as f:
                raw = f.read()
        except OSError as e:
            raise SettingError(f"POLY_CPU={text!r} is neither inline JSON nor a readable file ({e}); set it to "
                               "a JSON object of CPU fields, e.g. '{\"l2_bytes\": 2097152}', or a file "
                               "holding one") from None
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise SettingError(f"POLY_CPU is not valid JSON ({e}); set it to a JSON object of CPU fields, "
                           "e.g. '{\"l2_bytes\": 2097152}'") from None
    if not isinstance(obj, dict):
        raise SettingError(f"POLY_CPU must hold a JSON object of CPU fields, not {type(obj).__name__}")
    known = ", ".join(sorted(DECLARABLE))
    for name, value in obj.items():
        if name not in DECLARABLE:
            raise SettingError(f"POLY_CPU field {name!r} is not a CPU description field; use one of {known}")
        want = DECLARABLE[name]
        if want in ("int", int):
            ok = isinstance(value, int) and not isinstance(value, bool) and (name not in POSITIVE or value > 0)
            need = "a positive whole number" if name in POSITIVE else "a whole number"
        elif want in ("float", float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            need = "a positive number"
        elif name == "flags":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            need = "a list of flag names"
        else:
            ok = isinstance(value, str)
            need = "a text"
        if name == "vector_bits" and ok and value not in (128, 256, 512):
            ok, need = False, "128, 256 or 512"
        if not ok:
            raise SettingError(f"POLY_CPU field {name!r} = {value!r} must be {need}")
    return obj


def declare(desc: CpuDescription, declared: dict[str, Any]) -> CpuDescription:
    """`desc` with the declared fields over it (each marked as declared)."""
    values = {k: tuple(sorted(v)) if k == "flags" else v for k, v in declared.items()}
    sources = dict(desc.sources)
    sources.update({k: "declared (POLY_CPU)" for k in declared})
    return replace(desc, **values, sources=tuple(sorted(sources.items())))


# ---------------------------------------------------------------------------------------------------
# what a host backend's Capabilities take from the description (and a stored calibration)


def host_fields(desc: CpuDescription, device: str, code_generator: str, vector_bits: int, tile_vectors: int,
                stage: bool) -> dict[str, Any]:
    """Capabilities fields of a host device compiling for `desc` with `vector_bits` vectors: caches,
    FMA units and latency, the staging budget (half the L2, for a panel of B that stays there while
    every row tile of A streams past it, at most the stack's STAGE_MAX_BYTES; 0 without `stage`) and
    the register tile's vectors per row (`tile_vectors`, the code generator's choice), each replaced by
    a stored calibration for this processor and `code_generator` when one exists."""
    _code_generators[device] = code_generator
    stage_bytes = min(desc.l2_bytes // 2, STAGE_MAX_BYTES) if stage else 0
    out = {"l1_bytes": desc.l1d_bytes, "l2_bytes": desc.l2_bytes, "l3_bytes": desc.l3_bytes,
           "fma_units": desc.fma_units_at(vector_bits),
           "fma_latency": desc.fma_latency, "stage_bytes": stage_bytes, "tile_vectors": tile_vectors,
           "read_gbs": float(desc.read_gbs), "thread_handoff_ns": desc.thread_handoff_ns, "tuning": "heuristic"}
    tuned = load_calibration(desc, device, code_generator)
    if tuned is not None:
        out["tile_vectors"] = int(tuned["tile_vectors"])
        out["stage_bytes"] = int(tuned["stage_bytes"]) if stage else 0
        out["tuning"] = "calibrated"
    return out


_code_generators: dict[str, str] = {}  # device -> the code generator it named when it opened


def code_generator_of(device: str) -> str:
    """The code generator an opened host device keys its calibration by ("" if it has not opened)."""
    return _code_generators.get(device, "")


def calibration_key(desc: CpuDescription, device: str, code_generator: str) -> str:
    """The name of this processor's calibration entry for `device` built by `code_generator`."""
    text = json.dumps({"v": CALIBRATION_VERSION, "device": device, "code_generator": code_generator,
                       **desc.key()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _calibration_path(desc: CpuDescription, device: str, code_generator: str, create: bool = False) -> str:
    """Where the entry lives; a device opening only looks (`create` False: no folder made, nothing probed)."""
    folder = cache_dir("calibration") if create else os.path.join(config_cache_dir(), "calibration")
    return os.path.join(folder, f"{calibration_key(desc, device, code_generator)}.json")


def load_calibration(desc: CpuDescription, device: str, code_generator: str) -> dict[str, Any] | None:
    """The stored winners for this processor model, flags and code generator, or None (none stored, or
    one stored for another processor: the key, repeated in the entry, must match)."""
    data = read_entry(_calibration_path(desc, device, code_generator))
    if data is None:
        return None
    try:
        obj = json.loads(data)
        if obj["cpu"] != desc.key() or obj["device"] != device or obj["code_generator"] != code_generator:
            return None
        int(obj["tile_vectors"]), int(obj["stage_bytes"])
    except (ValueError, KeyError, TypeError):
        return None
    return obj


def store_calibration(desc: CpuDescription, device: str, code_generator: str, winners: dict[str, Any]) -> str:
    """Write `winners` (tile_vectors, stage_bytes, timings) as this processor's calibration; its path."""
    path = _calibration_path(desc, device, code_generator, create=True)
    entry = {"cpu": desc.key(), "device": device, "code_generator": code_generator, **winners}
    write_entry(path, json.dumps(entry, sort_keys=True).encode())
    return path
