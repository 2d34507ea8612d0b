"""Model.save(path) on disk (issue 28, item 13): a writer killed mid-save leaves `<path>.tmp<pid>`; the
next save to that path removes it (only when its pid no longer runs, only names of that exact
pattern), and the bytes and the rename are flushed to disk (fsync) in that order.

The kill is deterministic: the child process stalls in os.replace (after its temporary file is
written in full) and announces it; the parent then sends SIGKILL.
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from polygrad import Model

pytestmark = pytest.mark.skipif(os.name != "posix", reason="pid liveness and SIGKILL are POSIX")

MODEL = """
from polygrad import Model, Tensor

class Scale:
    def __init__(self):
        self.w = Tensor([2.0, 3.0])

    def __call__(self, x):
        return {"y": x * self.w}

model = Model(Scale(), inputs={"x": Tensor.empty(2)})
"""


def _model() -> Model:
    scope: dict = {}
    exec(MODEL, scope)  # the model the child saves, built the same way here
    return scope["model"]


def _killed_mid_save(path) -> int:
    """Run a child that saves a model to `path` and SIGKILL it once its temporary file is written;
    returns the child's pid."""
    code = MODEL + textwrap.dedent(f"""
        import os, sys, time

        def stall(src, dst):
            print("written", src, flush=True)
            time.sleep(120)
        os.replace = stall
        model.save({str(path)!r})
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("written"), line
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return child.pid


@pytest.fixture
def live_pid():
    """The pid of a process that runs for the whole test."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def test_a_save_killed_mid_write_is_cleaned_by_the_next_save(tmp_path, live_pid):
    path = tmp_path / "m.pgb"
    dead = _killed_mid_save(path)
    left = tmp_path / f"m.pgb.tmp{dead}"
    model = _model()
    try:
        whole = Model.load(left.read_bytes())  # the child wrote its whole bundle before stalling
        assert whole.forward(x=[1.0, 1.0])["y"].numpy().tolist() == [2.0, 3.0]
        whole.dispose()
        kept = {f"m.pgb.tmp{live_pid}": b"another process is saving", f"m.pgb.tmp{dead}x": b"not our pattern",
                f"other.pgb.tmp{dead}": b"another target", f"m.pgb.tmp{dead}.bak": b"not our pattern"}
        for name, data in kept.items():
            (tmp_path / name).write_bytes(data)
        model.save(path)
        assert sorted(os.listdir(tmp_path)) == sorted(["m.pgb", *kept])  # only the dead writer's file went
        for name, data in kept.items():
            assert (tmp_path / name).read_bytes() == data
        loaded = Model.load(path)
        assert loaded.forward(x=[1.0, 1.0])["y"].numpy().tolist() == [2.0, 3.0]
        loaded.dispose()
    finally:
        model.dispose()


def test_repeated_kills_do_not_accumulate_temporaries(tmp_path):
    # 20 kills left 20 temporary files (61 MB for the model): each save now removes the last
    # killed writer's file before writing its own
    path = tmp_path / "m.pgb"
    for _ in range(3):
        dead = _killed_mid_save(path)
        assert os.listdir(tmp_path) == [f"m.pgb.tmp{dead}"]
    model = _model()
    try:
        model.save(path)
    finally:
        model.dispose()
    assert os.listdir(tmp_path) == ["m.pgb"]


def test_stale_temporaries_of_impossible_pids_are_removed_and_folders_kept(tmp_path):
    from polygrad.atomicfile import remove_stale_temporaries
    path = tmp_path / "m.pgb"
    (tmp_path / "m.pgb.tmp0").write_bytes(b"")  # no process has pid 0
    (tmp_path / "m.pgb.tmp99999999999").mkdir()  # not a file: kept
    assert remove_stale_temporaries(path) == [str(tmp_path / "m.pgb.tmp0")]
    assert os.listdir(tmp_path) == ["m.pgb.tmp99999999999"]


def test_save_flushes_the_bytes_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        mode = os.fstat(fd).st_mode
        events.append("fsync file" if stat.S_ISREG(mode) else "fsync folder" if stat.S_ISDIR(mode) else "fsync ?")
        real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        real_replace(src, dst)
    model = _model()  # built first: compiling it may write the kernel cache, whose writes are not the save's
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    try:
        model.save(tmp_path / "m.pgb")
    finally:
        model.dispose()
    assert events == ["fsync file", "replace", "fsync folder"]


def test_a_failed_save_leaves_no_temporary(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    model = _model()
    try:
        with pytest.raises(OSError, match="No space"):
            model.save(tmp_path / "m.pgb")
    finally:
        model.dispose()
    assert os.listdir(tmp_path) == []
