"""Test instrumentation, active only when FILE_AUDIT_DIR is set and this folder is on PYTHONPATH: every path a
pipeline stage (``python -m stages.<name>``) or a process it starts reads, lists, writes or renames is logged, one
JSON line per event, to FILE_AUDIT_DIR/<pid>.jsonl. Python's audit hooks see every open, listing and rename made
from Python; the native readers (pyarrow's Parquet, safetensors) are wrapped as they are imported, since their
opens happen in C++/Rust. tests/test_pipeline_e2e.py checks the log against each stage's declared deps and outs."""
from __future__ import annotations

import json
import os
import sys

_DIR = os.environ.get("FILE_AUDIT_DIR")


def _stage_cmd() -> str | None:
    argv = sys.orig_argv[1:]
    if len(argv) >= 2 and argv[0] == "-m" and argv[1].startswith("stages."):
        os.environ["FILE_AUDIT_STAGE"] = " ".join(["python", *argv])   # inherited by what the stage starts
    return os.environ.get("FILE_AUDIT_STAGE")


def _install(cmd: str) -> None:
    import importlib.abc
    import importlib.util

    log = open(os.path.join(_DIR, f"{os.getpid()}.jsonl"), "a", buffering=1)
    root = os.path.join(os.getcwd(), "")   # the repository: DVC starts every stage there
    busy = [False]

    def note(kind: str, path) -> None:
        if busy[0] or isinstance(path, int):
            return
        busy[0] = True
        try:
            p = path if kind == "param" else os.path.abspath(os.fsdecode(path))
            if kind != "param" and not p.startswith(root):   # the libraries' own files are not the project's
                return
            log.write(json.dumps({"cmd": cmd, "kind": kind, "path": p}) + "\n")
        except (TypeError, ValueError):
            pass
        finally:
            busy[0] = False

    def hook(event: str, args) -> None:
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and flags is not None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if path is not None:
                note("write" if writes else "read", path)
        elif event in ("os.listdir", "os.scandir"):
            note("list", args[0] if args and args[0] is not None else ".")
        elif event in ("os.rename", "os.replace"):
            note("write", args[1])
        elif event in ("os.remove", "os.rmdir") and args[1] is None:   # with a dir_fd: inside an rmtree
            note("remove", args[0])
        elif event == "os.mkdir":
            note("write", args[0])

    sys.addaudithook(hook)

    import shutil

    def rmtree(path, *a, _fn=shutil.rmtree, **k):   # one event for the tree (its walk opens names by dir_fd)
        note("remove", path)
        busy[0] = True
        try:
            return _fn(path, *a, **k)
        finally:
            busy[0] = False
    shutil.rmtree = rmtree

    def wrap_reader(fn, kind="read"):
        def reader(source, *a, **k):
            if isinstance(source, (str, os.PathLike)):
                note(kind, source)
            return fn(source, *a, **k)
        return reader

    patches = {
        "pyarrow.parquet": lambda m: [setattr(m, n, wrap_reader(getattr(m, n))) for n in ("read_table", "ParquetFile")]
        + [setattr(m, "write_table", _wrap_write(m.write_table, note))],
        "safetensors": lambda m: setattr(m, "safe_open", wrap_reader(m.safe_open)),
        "graft.schema": lambda m: setattr(m, "load_all", _wrap_params(m.load_all, note)),
        "pyarrow": lambda m: setattr(m, "OSFile", _logged_osfile(m.OSFile, note)),   # pandas writes Parquet with it
    }

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name not in patches:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module, _run=run, _name=name):
                _run(module)
                patches[_name](module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


def _wrap_params(load_all, note):
    """params.yaml as the stage reads it: each Section is tagged with its dotted path and logs every key read from
    it (a read of all values, such as items(), logs every key; iterating over the keys reads none)."""
    import graft.params as gp

    sec = gp.Section
    if not getattr(sec, "_audited", False):
        get_item, get = dict.__getitem__, dict.get

        def key(self, k):
            where = self.__dict__.get("_audit")
            if where is not None:
                note("param", f"{where}.{k}")

        def every(self):
            for k in dict.keys(self):
                key(self, k)

        def getitem(self, k):
            key(self, k)
            return get_item(self, k)

        def whole(name):
            fn = getattr(dict, name)

            def method(self, *a, **kw):
                every(self)
                return fn(self, *a, **kw)
            return method
        sec.__getitem__ = getitem
        sec.get = lambda self, k, default=None: (key(self, k), get(self, k, default))[1]
        sec.__contains__ = lambda self, k: (key(self, k), dict.__contains__(self, k))[1]
        # the key set is fixed by the schema; reading values through these reads every key
        for name in ("items", "values", "copy", "__eq__", "__repr__"):
            setattr(sec, name, whole(name))
        sec._audited = True

    def tag(value, where):
        if isinstance(value, sec):
            value.__dict__["_audit"] = where
            for k, v in dict.items(value):
                tag(v, f"{where}.{k}")
        elif isinstance(value, list):
            for v in value:
                tag(v, where)

    def wrapped(*a, **k):
        out = load_all(*a, **k)
        for name, v in dict.items(out):
            tag(v, name)
        return out
    return wrapped


def _logged_osfile(cls, note):
    class OSFile(cls):
        def __init__(self, path, mode="r", *a, **k):
            note("read" if mode == "r" else "write", path)
    return OSFile


def _wrap_write(fn, note):
    def write_table(table, where, *a, **k):
        if isinstance(where, (str, os.PathLike)):
            note("write", where)
        return fn(table, where, *a, **k)
    return write_table


if _DIR:
    _cmd = _stage_cmd()
    if _cmd is not None:
        _install(_cmd)
