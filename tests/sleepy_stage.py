"""A stage for the process-cleanup tests: it starts a child that starts a grandchild (as a stage starts vLLM's
EngineCore, which starts its workers), then writes a marker and either sleeps (to be killed) or returns."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from graft.cli import run_stage


def main() -> None:
    marker, tag, mode = sys.argv[1:4]
    grandchild = f"import time; time.sleep(600)  # {tag}"
    subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                      f"{grandchild!r}]); time.sleep(600)  # {tag}"])
    Path(marker).write_text("started")
    if mode == "sleep":
        time.sleep(600)


if __name__ == "__main__":
    run_stage(main)
