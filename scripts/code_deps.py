"""Write or check the code deps of every dvc.yaml stage: the graft/ and stages/ modules its entry point imports.

Caching is exact only if a stage declares every module it runs, and no more (an extra module reruns the stage for an
edit it cannot see). DVC cannot build a deps list from a variable (treeverse/dvc#8171, #7151), so the lists are
written here from each entry point's import closure, below a marker line after the stage's data deps:

    python scripts/code_deps.py --write    # rewrite the lists in dvc.yaml (comments and data deps kept)
    python scripts/code_deps.py --check    # exit 1 naming each stage's missing and extra modules

The closure follows every ``import graft.x`` / ``from graft.x import y`` / ``from stages import x`` anywhere in a file
(module level or inside a function: a stage's lazy import still runs), plus each package's ``__init__.py``, which
runs before any module of the package. dvc.lock lists deps sorted by path, so the order written here changes no
hash.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("graft", "stages")
MARKER = "# code: the modules the entry point imports (scripts/code_deps.py --write)"
CODE_DEP = re.compile(r"^-\s+((?:graft|stages)/[\w/]+\.py)\s*$")
ENTRY = re.compile(r"python -m (stages\.\w+)")


def local_imports(path: Path, repo: Path = REPO) -> set[str]:
    """graft/stages modules a file imports anywhere (module level or inside functions), as repo-relative paths."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                candidate = Path(*name.split(".")).with_suffix(".py")
                if (repo / candidate).exists():
                    found.add(candidate.as_posix())
    return found


def closure(entry: str, repo: Path = REPO) -> set[str]:
    """Every graft/stages module that running ``entry`` (a repo-relative .py path) can import, itself included."""
    todo, seen = [entry], set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        # importing a module runs its package's __init__ first, and whatever that imports
        top = Path(mod).parts[0]
        inits = {f"{top}/__init__.py"} if top in PACKAGES else set()
        todo += sorted((local_imports(repo / mod, repo) | inits) - seen)
    return seen


def entry_module(cmd: str) -> str:
    """The entry point file of a stage's command (``python -m stages.mask ...`` -> stages/mask.py)."""
    m = ENTRY.search(cmd)
    if m is None:
        raise ValueError(f"no `python -m stages.<name>` in the command {cmd!r}")
    return m.group(1).replace(".", "/") + ".py"


def rewrite(text: str, repo: Path = REPO) -> tuple[str, dict[str, dict[str, list[str]]]]:
    """dvc.yaml's text with every stage's code deps replaced by its entry point's closure, and per stage the
    modules that were missing from or extra in the old list. Everything else (data deps, comments) stays."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    changes: dict[str, dict[str, list[str]]] = {}
    stage, cmd, i = None, None, 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"^  (\w+):", line):
            stage, cmd = m.group(1), None
        if m := re.match(r"^\s+cmd:\s*(.*)$", line):
            cmd = m.group(1)
        m = re.match(r"^(\s+)deps:\s*$", line)
        if not m:
            out.append(line)
            i += 1
            continue
        if stage is None or cmd is None:
            raise ValueError(f"dvc.yaml line {i + 1}: a deps list before its stage's cmd")
        indent = len(m.group(1))
        out.append(line)
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
            block.append(lines[i])
            i += 1
        trailing: list[str] = []
        while block and not block[-1].strip():   # blank lines before the next key stay where they are
            trailing.insert(0, block.pop())
        items = [b for b in block if b.strip()]
        item_indent = " " * (len(items[0]) - len(items[0].lstrip())) if items else " " * (indent + 2)
        old = {c.group(1) for b in items if (c := CODE_DEP.match(b.strip()))}
        kept = [b for b in items if not CODE_DEP.match(b.strip()) and b.strip() != MARKER]
        wanted = sorted(closure(entry_module(cmd), repo))
        out += kept + [f"{item_indent}{MARKER}\n"] + [f"{item_indent}- {mod}\n" for mod in wanted] + trailing
        missing, extra = sorted(set(wanted) - old), sorted(old - set(wanted))
        if missing or extra:
            changes[stage] = {"missing": missing, "extra": extra}
    return "".join(out), changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="rewrite the code deps in dvc.yaml")
    what.add_argument("--check", action="store_true", help="exit 1 if any stage's code deps are not its closure")
    ap.add_argument("--dvc-yaml", type=Path, default=REPO / "dvc.yaml")
    args = ap.parse_args(argv)
    text = args.dvc_yaml.read_text()
    new, changes = rewrite(text, args.dvc_yaml.resolve().parent)
    if args.write:
        if new != text:
            tmp = args.dvc_yaml.with_name(f".{args.dvc_yaml.name}.tmp")
            tmp.write_text(new)
            tmp.replace(args.dvc_yaml)
        for stage, c in changes.items():
            print(f"{stage}: +{len(c['missing'])} -{len(c['extra'])} {c}")
        print(f"code deps written for every stage ({len(changes)} changed)")
        return 0
    if new != text:
        for stage, c in changes.items():
            print(f"{stage}: missing {c['missing']}, extra {c['extra']}", file=sys.stderr)
        if not changes:
            print("dvc.yaml's code deps are the closures but not as --write lays them out (marker, order)",
                  file=sys.stderr)
        print("run: python scripts/code_deps.py --write", file=sys.stderr)
        return 1
    print("every stage declares exactly the modules it imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
