"""The resident set of this process, for the memory tests (Linux /proc): `rss()` now, `peak()` its high-water
mark (VmHWM), `restart_peak()` the mark reset to the resident set (clear_refs 5), so a peak read after it is the
following code's own. The tests that measure a step run it in a child interpreter, so the runner's own memory
does not count: `PRELUDE` is these functions' source, for the start of such a child program."""
import inspect
import os


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) << 10


def restart_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


PRELUDE = "import os, sys\n\n" + "\n\n".join(inspect.getsource(f) for f in (rss, peak, restart_peak)) + "\n"
