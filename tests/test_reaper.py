"""No process a stage starts outlives it, and no stage outlives the `dvc repro` that launched it (graft.reaper).
Kills happen at a marker the stage writes (never after a guessed time); the checks wait for the outcome."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from graft.reaper import carrying, descendants, start_time
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watcher reads /proc (Linux)")
ENV = dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")


def tagged(tag: str) -> list[int]:
    """Living processes whose command line holds ``tag``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmd and start_time(int(entry)) is not None:
                out.append(int(entry))
    return out


def started_all(tag: str) -> bool:
    """The stage, its child and its grandchild all live (told apart by their ``-c`` code, since a shell between
    DVC and the stage, as ``/bin/sh`` when SHELL is unset, carries the tag too)."""
    argvs = []
    for pid in tagged(tag):
        try:
            argvs.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue
    return (any(b"tests.sleepy_stage" in a for a in argvs)
            and any(len(a) > 2 and a[1] == b"-c" and a[2].startswith(b"import subprocess") for a in argvs)
            and any(len(a) > 2 and a[1] == b"-c" and a[2].startswith(b"import time") for a in argvs))


def wait_for(condition, what: str, limit_s: float = 120.0) -> None:
    """Poll until ``condition()``; the limit only bounds a failing test, it is no timing assumption."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"still waiting after {limit_s:.0f} s: {what}"
        time.sleep(0.05)


def start_stage(tmp_path: Path, mode: str, cwd: Path | None = None):
    tag, marker = f"graft-test-{uuid.uuid4().hex}", tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-m", "tests.sleepy_stage", str(marker), tag, mode], env=ENV,
                            cwd=cwd or REPO)
    wait_for(marker.exists, "the stage to start its children")
    return proc, tag


def test_what_a_killed_stage_started_dies_with_it(tmp_path):
    proc, tag = start_stage(tmp_path, "sleep")
    wait_for(lambda: started_all(tag), "the stage, its child and its grandchild")
    proc.send_signal(signal.SIGKILL)   # no cleanup handler of the stage runs
    proc.wait()
    wait_for(lambda: not tagged(tag), "the stage's child and grandchild to be killed")


def test_what_a_stage_started_does_not_outlive_its_normal_end(tmp_path):
    proc, tag = start_stage(tmp_path, "exit")
    assert proc.wait() == 0
    wait_for(lambda: not tagged(tag), "leftover children to be killed")


def test_a_stage_ends_with_the_dvc_repro_that_launched_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    tag = f"graft-test-{uuid.uuid4().hex}"
    (repo / "dvc.yaml").write_text(f"stages:\n  sleepy:\n    cmd: python -m tests.sleepy_stage started {tag} sleep\n"
                                   "    outs: [never]\n")
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=repo, check=True, env=ENV)
    dvc = subprocess.Popen([sys.executable, "-m", "dvc", "repro"], cwd=repo, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    wait_for((repo / "started").exists, "the stage to start")
    wait_for(lambda: started_all(tag), "the stage, its child and its grandchild")
    dvc.send_signal(signal.SIGKILL)
    dvc.wait()
    wait_for(lambda: not tagged(tag), "the orphaned stage and what it started to be killed")
    assert not (repo / "never").exists()


def test_the_watcher_finds_a_stage_s_processes_by_tree_and_by_token(tmp_path):
    token = f"t-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env=dict(os.environ, GRAFT_STAGE=token))
    try:
        wait_for(lambda: child.pid in carrying(token), "the child's environment to be readable")
        assert child.pid in descendants(os.getpid()) and list(carrying(token)) == [child.pid]
    finally:
        child.kill()
        child.wait()
