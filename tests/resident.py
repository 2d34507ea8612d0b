"""What the memory tests' child interpreters start with (Linux /proc): `rss()` the resident set now, `peak()`
its high-water mark (VmHWM), `restart_peak()` the mark reset to the resident set (clear_refs 5), so a peak
read after it is the following code's own. Each test runs its step in a child so the runner's memory does
not count."""

PRELUDE = r"""
import os, sys

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) << 10

def restart_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""
