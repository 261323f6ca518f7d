"""Checks a `dvc repro` against what its stages declare, from the log that tests/file_audit/sitecustomize.py writes:
every file a stage (or a process it started) reads is one of its deps or outs, every file it writes is inside its
outs, and every params.yaml key it reads is one of its params. Caching is exact only if all three hold."""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path, PurePosixPath

import yaml

from graft.generation import SPEED_ONLY

AUDIT = Path(__file__).resolve().parent / "file_audit"   # put first on PYTHONPATH with FILE_AUDIT_DIR set


def _under(p: str, q: str) -> bool:
    return p == q or p.startswith(q.rstrip("/") + "/")


def _repo_path(repo: Path, path: str) -> str | None:
    try:
        rel = Path(path).relative_to(repo).as_posix()
    except ValueError:
        return None   # site-packages, /proc, the system temp dir: not the project's data
    m = re.match(r"(.*)/__pycache__/([^./]+)\.[^/]*\.pyc$", rel)   # bytecode stands for its source
    return f"{m.group(1)}/{m.group(2)}.py" if m else rel


def _loop_keys(dvc_yaml: dict) -> dict[str, set[str]]:
    """Per stage group, the params its foreach/matrix is generated from: a stage checks that its own item is in the
    list (``graft.sweep.require``); the other items do not change its result."""
    out = {}
    for name, st in dvc_yaml["stages"].items():
        exprs = [st["foreach"]] if "foreach" in st else list(st.get("matrix", {}).values())
        out[name] = {m for e in exprs if isinstance(e, str) for m in re.findall(r"\$\{\s*([\w.]+)\s*\}", e)}
    return out


CHAIN_STATE = re.compile(r"models/chain/[^/]+/[^/]+\.json")


def pinned_models(repo: Path, stage: dict) -> list[str]:
    """Model directories a stage reaches through a declared chain state (graft.chain): the state names the
    directory with its content hash, and graft.chain.read_state refuses other bytes, so the state pins them."""
    out = []
    for d in stage.get("deps", []):
        if CHAIN_STATE.fullmatch(d["path"]) and (repo / d["path"]).is_file():
            out.append(json.loads((repo / d["path"]).read_text())["model"])
    return out


def undeclared(repo: Path, log_dir: Path, ran: set[str]) -> dict[str, list[str]]:
    """stage -> what it touched without declaring it; a stage that ran but logged nothing is reported too (the
    audit would otherwise pass by seeing nothing)."""
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    loops = _loop_keys(yaml.safe_load((repo / "dvc.yaml").read_text()))
    by_cmd = {st["cmd"]: name for name, st in lock.items()}
    outs = {name: [o["path"] for o in st.get("outs", [])] for name, st in lock.items()}
    pinned = {name: pinned_models(repo, st) for name, st in lock.items()}
    bad: dict[str, set[str]] = defaultdict(set)
    seen = set()
    for f in sorted(log_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            stage = by_cmd.get(e["cmd"])
            if stage is None:
                bad[e["cmd"]].add("a process no stage of dvc.lock runs")
                continue
            seen.add(stage)
            if e["kind"] == "param":
                declared = list(lock[stage].get("params", {}).get("params.yaml", {}))
                # speed-only settings change how fast samples come, never which (tested apart): no stage declares
                # them (graft.generation.SPEED_ONLY)
                allowed = declared + sorted(loops.get(stage.split("@")[0], ())) + [f"generation.{k}"
                                                                                   for k in SPEED_ONLY]
                if not any(_under(e["path"].replace(".", "/"), d.replace(".", "/")) for d in allowed):
                    bad[stage].add(f"reads params.yaml {e['path']} (declared: {', '.join(declared)})")
                continue
            p = _repo_path(repo, e["path"])
            if p is None or _under(p, ".graft"):   # resume work directories and wall-time tables
                continue
            kind, mine = e["kind"], outs[stage]
            if kind == "list" and p in (".", "graft", "stages"):   # the import system scanning sys.path
                continue
            # dvclive reads the Git and DVC state (to name an experiment) and keeps scratch files in .dvc/tmp
            if (_under(p, ".git") or _under(p, ".dvc") or p in (".gitignore", ".dvcignore")) and (
                    kind in ("read", "list") or _under(p, ".dvc/tmp")):
                continue
            parent = str(PurePosixPath(p).parent)
            if (".tmp-" in p or ".old-" in p) and any(_under(parent, str(PurePosixPath(o).parent)) for o in mine):
                continue   # an atomic write's temporary, or the old output it swaps out, beside one of its outputs
            others = [o for s, os_ in outs.items() if s != stage for o in os_]
            # a directory of its own: holds some of its outputs and none of another stage's (dvclive's log folder)
            own = any(any(_under(o, q) for o in mine) and not any(_under(o, q) for o in others) for q in (p, parent))
            if kind in ("read", "list"):
                # dvc.yaml: every stage reads the pipeline's output folders from it to refuse symlinked ones before
                # any work (graft.cli.output_roots); it decides whether a stage runs, never what it computes
                if p in ("params.yaml", "dvc.yaml") or any(_under(p, d["path"]) for d in lock[stage].get("deps", [])) \
                        or any(_under(p, o) for o in mine) or (kind == "list" and own) \
                        or any(_under(p, m) for m in pinned[stage]):
                    continue
            elif kind == "write":
                if any(_under(p, o) or _under(o, p) for o in mine):   # an output, or a folder made for one
                    continue
            elif kind == "remove":
                if any(_under(p, o) for o in mine) or own:
                    continue
            bad[stage].add(f"{kind} {p}")
    for stage in sorted(ran - seen):
        bad[stage].add("ran, but the audit saw nothing")
    return {s: sorted(v) for s, v in sorted(bad.items())}
