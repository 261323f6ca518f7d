"""No process a stage starts outlives it, and no stage outlives the ``dvc repro`` that launched it.

A SIGKILLed stage cannot clean up after itself: vLLM's EngineCore and Worker processes (gigabytes, still
allocating) and torchrun ranks would go on running under init, and a stage whose ``dvc repro`` was killed would go on
writing outputs that no lock records. So every stage (``graft.cli.run_stage``) starts this watcher, a separate small
interpreter (nothing but the standard library) that

- SIGKILLs the stage's descendants once the stage is gone, however it ended: those it has seen (it records them
  from /proc every quarter second while the stage lives) and those carrying the stage's token in their environment
  (``GRAFT_STAGE``, set before anything is started, so a process started a moment before the kill, or orphaned by
  its own parent's death, is found too);
- when the stage was launched by DVC (``DVC_STAGE`` is set), watches the DVC process that launched it, and when
  that dies first, SIGKILLs the stage and its descendants (the stage's outputs are written atomically, so a kill
  leaves the old output or none).

Processes are identified by pid and start time, so a reused pid is never touched. Linux only (/proc); elsewhere the
watcher is not started.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.25
TOKEN = "GRAFT_STAGE"   # identity only: what it holds never changes a result


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses); None if the
    process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None if it is gone."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":   # a zombie has exited: nothing left to stop
        return None
    return int(fields[19])


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every living descendant of ``root``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_of(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        t = start_time(pid)
        if t is not None and pid not in out:
            out[pid] = t
            todo += children.get(pid, [])
    return out


def kill_all(procs: dict[int, int]) -> None:
    for pid, t in procs.items():
        if pid != os.getpid() and start_time(pid) == t:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def carrying(token: str) -> dict[int, int]:
    """pid -> start time of every process whose environment holds ``GRAFT_STAGE=token``."""
    needle = f"{TOKEN}={token}".encode()
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            t = start_time(int(entry))
            if needle in env and t is not None:
                out[int(entry)] = t
    return out


def kill_tree(known: dict[int, int], token: str) -> None:
    """Kill what was seen, then whatever still carries the token (a dying process may have just started another)."""
    kill_all(known)
    for _ in range(5):
        left = carrying(token)
        left.pop(os.getpid(), None)
        if not left:
            return
        kill_all(left)
        time.sleep(0.05)


def dvc_launcher(pid: int) -> int | None:
    """The nearest ancestor of ``pid`` that is a DVC process (the stage's parent, or a shell's parent)."""
    for _ in range(4):
        pid = parent_of(pid) or 0
        if pid <= 1:
            return None
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if any(Path(a.decode(errors="replace")).name in ("dvc", "dvc.exe") or a == b"dvc" for a in argv[:3]):
            return pid
    return None


def watch(stage: int, stage_t: int, launcher: int | None, launcher_t: int | None, token: str) -> None:
    known: dict[int, int] = {}
    while True:
        if start_time(stage) != stage_t:
            kill_tree(known, token)
            return
        known.update(descendants(stage))
        if launcher_t is not None and start_time(launcher) != launcher_t:   # dvc is gone: so is its stage
            kill_all({stage: stage_t})
            kill_tree(known, token)
            return
        time.sleep(POLL_S)


_started = False


def start_watcher() -> None:
    """Start the watcher of this process (once per process, at the start of a stage)."""
    global _started
    if _started or not Path("/proc/self/stat").exists():
        return
    _started = True
    me = os.getpid()
    me_t = start_time(me)
    token = f"{me}-{me_t}"
    os.environ[TOKEN] = token   # every process the stage starts from now on inherits it
    launcher = dvc_launcher(me) if os.environ.get("DVC_STAGE") else None
    # dvc's start time is read here, not by the watcher: a dvc killed before the watcher's interpreter is up (a busy
    # machine) would otherwise leave it nothing to compare, and the stage would outlive it
    launcher_t = start_time(launcher) if launcher else None
    # a fresh interpreter, isolated from the stage's imports and memory; it ignores the terminal's Ctrl-C (the stage
    # gets it and ends; the watcher then cleans up) and exits once the stage has
    subprocess.Popen([sys.executable, "-I", "-S", __file__, str(me), str(me_t), str(launcher or 0),
                      str(launcher_t or 0), token],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) or None, int(sys.argv[4]) or None, sys.argv[5])
