"""Caching is exact only if every stage declares the code it runs, and no more: each stage's deps in dvc.yaml list
exactly the graft/ and stages/ modules its entry point imports, directly or through other graft modules
(scripts/code_deps.py writes and checks them)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def load_code_deps():
    """scripts/code_deps.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("code_deps", REPO / "scripts/code_deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


code_deps = load_code_deps()
closure = code_deps.closure


def test_every_stage_declares_exactly_the_modules_it_imports():
    r = subprocess.run([sys.executable, str(REPO / "scripts/code_deps.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_declared_code_deps_are_each_entry_points_closure():
    """The check's own reading of dvc.yaml, through yaml: every stage's graft/stages deps are its closure."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    wrong = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        declared = {d for d in body.get("deps", []) if re.fullmatch(r"(graft|stages)/[\w/]+\.py", d)}
        needed = closure(code_deps.entry_module(body["cmd"]))
        if declared != needed:
            wrong[name] = {"missing": sorted(needed - declared), "extra": sorted(declared - needed)}
    assert not wrong, wrong


def check_copy(tmp_path, text: str):
    (tmp_path / "dvc.yaml").write_text(text)
    for package in ("graft", "stages"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return subprocess.run([sys.executable, str(REPO / "scripts/code_deps.py"), "--check", "--dvc-yaml",
                           str(tmp_path / "dvc.yaml")], capture_output=True, text=True)


def test_check_names_a_missing_and_an_extra_module_and_write_mends_both(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    mask = text.index("  mask:\n")
    head, tail = text[:mask], text[mask:]
    assert "      - graft/kfac.py\n" in tail and "      - graft/opsd.py\n" not in tail.split("\n\n")[0]
    broken = head + tail.replace("      - graft/kfac.py\n", "      - graft/opsd.py\n", 1)
    r = check_copy(tmp_path, broken)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mask: missing ['graft/kfac.py'], extra ['graft/opsd.py']" in r.stderr, r.stderr
    w = subprocess.run([sys.executable, str(REPO / "scripts/code_deps.py"), "--write", "--dvc-yaml",
                        str(tmp_path / "dvc.yaml")], capture_output=True, text=True)
    assert w.returncode == 0, w.stdout + w.stderr
    assert (tmp_path / "dvc.yaml").read_text() == text   # data deps, params and comments as they were


def test_write_keeps_data_deps_before_the_marker_and_follows_a_new_import(tmp_path):
    text = (REPO / "dvc.yaml").read_text()
    r = check_copy(tmp_path, text)
    assert r.returncode == 0, r.stdout + r.stderr
    # a new lazy import in the mask stage reaches the closure through graft.opsd's own imports
    mask = tmp_path / "stages/mask.py"
    mask.write_text(mask.read_text() + "\n\ndef _later():\n    import graft.opsd  # noqa: F401\n")
    new, changes = code_deps.rewrite(text, tmp_path)
    assert {"graft/opsd.py", "graft/generation.py", "graft/likelihood.py"} <= set(changes["mask"]["missing"]), changes
    assert not changes["mask"]["extra"] and set(changes) == {"mask"}, changes
    body = yaml.safe_load(new)["stages"]["mask"]["deps"]
    assert body[:2] == ["tensors/fisher/retention", "tensors/delta/graft_lr${item.lr}_ep${item.epoch}"], body
    assert body[2:] == sorted(closure("stages/mask.py", tmp_path))


def test_the_import_walk_sees_function_level_imports(tmp_path):
    assert "graft/merging.py" in closure("stages/mask.py")
    assert "graft/fisher.py" in closure("graft/kfac.py")    # through graft.kfac's own import


def test_the_committed_world_is_current_in_dvc_lock():
    """A clone's `dvc repro` must find the committed toy world cached: it is rebuilt bitwise only on the CPU kind that
    built it, so a code dep it declares and dvc.lock disagree on makes every user's first repro (and the real-model
    test) rebuild it. After a change to a module the world imports that does not change what it computes:
    `dvc commit -f world`; after one that does: `dvc repro -f world` and commit its outputs."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["dvc", "status", "world", "--json"], cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout or "{}") == {}, f"dvc.lock's world entry is stale: {r.stdout}"


# stages whose uncached regular outputs are on purpose: the committed world, the incremental evaluation (persistent
# outputs) and the cheap report stages' PNGs
NOT_RUN_CACHED = {"world", "evaluate", "report", "kl_report", "donor_choice"}


def test_every_costly_stage_stays_in_dvcs_run_cache():
    """DVC restores a stage from its run cache (a params set seen before, e.g. after `dvc exp apply` or a switch
    back) only if no regular output is `cache: false` or `persist` (metrics and plots may be: dvc/stage run()).
    A finetune whose loss-curve JSON was a plain uncached output retrained after every switch."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    blocking = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        for out in body.get("outs", []):
            if isinstance(out, dict):
                (path, opts), = out.items()
                if opts and (opts.get("cache") is False or opts.get("persist")):
                    blocking.setdefault(name, []).append(path)
    assert set(blocking) == NOT_RUN_CACHED, blocking


def test_dvc_restores_a_stage_with_an_uncached_plot_but_not_one_with_an_uncached_out(tmp_path):
    """The rule the check above encodes, on DVC itself: switching a param back restores a stage whose loss curve is
    an uncached plot from the run cache, and reruns one whose curve is an uncached plain output."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    write = ("import json,sys,yaml; x=yaml.safe_load(open('params.yaml'))['x']; open(sys.argv[1],'w').write(str(x)); "
             "json.dump([{'step': 1, 'loss': x}], open(sys.argv[2],'w'))")
    def stage(name: str, kind: str) -> dict:
        curve = {f"{name}.json": {"cache": False}}
        plot = {f"{name}.json": {"cache": False, "x": "step", "y": "loss"}}
        return {"cmd": f'python -c "{write}" {name}.txt {name}.json', "params": ["x"],
                "outs": [f"{name}.txt"] + ([curve] if kind == "outs" else []),
                **({"plots": [plot]} if kind == "plots" else {})}

    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"as_plot": stage("a", "plots"),
                                                                  "as_out": stage("b", "outs")}}))

    def repro(x: int) -> str:
        (tmp_path / "params.yaml").write_text(f"x: {x}\n")
        r = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=tmp_path, env=env, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout + r.stderr

    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True)
    repro(1), repro(2)
    back = repro(1)
    assert "Stage 'as_plot' is cached - skipping run" in back, back
    assert "Running stage 'as_out'" in back, back
    assert (tmp_path / "a.json").read_text() == json.dumps([{"step": 1, "loss": 1}])


def test_no_metric_name_is_hidden_behind_its_file_name_in_dvc_exp_show():
    """`dvc exp show` lists a metric under its bare name (post.new_task) only if no other metrics file or params
    file has that name; otherwise every copy is prefixed with its file, which breaks a user's column filter (and
    broke the queued-grid e2e test when donor_choice also wrote post.new_task). Files of one foreach stage share
    their names by design, and so do dvclive's training logs (step, train.loss in every run's live/metrics.json);
    the summaries of different stages must not."""
    from collections import Counter

    from dvc.repo import Repo
    from dvc.utils.flatten import flatten

    with Repo(str(REPO)) as repo:
        owner = {out.fs_path: stage.name.split("@")[0] for stage in repo.index.stages for out in stage.outs
                 if out.metric}
        shown = repo.metrics.show()[""]["data"]
        params = repo.params.show()[""]["data"]
    names = {path: set(flatten(item["data"])) for path, item in shown.items() if "data" in item}
    assert any("/live/" in path for path in names), sorted(names)   # the exemption below still names real files
    names = {path: keys for path, keys in names.items() if "/live/" not in path}
    assert "reports/metrics.json" in names and "post.new_task" in names["reports/metrics.json"], sorted(names)
    by_stage: dict[str, set[str]] = {}
    for path, keys in names.items():
        by_stage.setdefault(owner[os.path.join(str(REPO), path)], set()).update(keys)
    for item in params.values():
        by_stage.setdefault("params", set()).update(flatten(item.get("data", {})))
    count = Counter(n for keys in by_stage.values() for n in keys)
    clashes = {stage: sorted(n for n in keys if count[n] > 1) for stage, keys in by_stage.items()}
    clashes = {s: c for s, c in clashes.items() if c}
    assert not clashes, clashes


TENSOR_STAGES = ("delta_graft", "delta_sft", "delta_post", "delta_candidate", "mask", "merge_fisher", "export",
                 "fisher_share", "diagnostics", "report", "kl_report")


def test_tensor_stages_do_not_depend_on_chat_templates_or_answer_grading():
    """An edit to answer grading or chat rendering reruns no mask, merge, delta or report: the schema reads the names
    it needs from graft/registry.py, which imports nothing."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    leaking = {name: sorted(set(stages[name].get("do", stages[name])["deps"]) & {"graft/grading.py", "graft/chat.py",
                                                                                 "graft/modeling.py"})
               for name in TENSOR_STAGES}
    assert not any(leaking.values()), leaking
    assert code_deps.local_imports(REPO / "graft/registry.py") == set()


def dvc_status_after(tmp_path: Path, edit) -> dict:
    """`dvc status --json` of the committed pipeline (dvc.yaml, dvc.lock) with ``edit`` applied to params.yaml,
    in a repository holding nothing else (every output missing: what differs between two calls is params alone)."""
    repo = tmp_path / "status"
    if not repo.exists():
        repo.mkdir()
        for f in ("dvc.yaml", "dvc.lock"):
            shutil.copy(REPO / f, repo / f)
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        subprocess.run(["dvc", "init", "-q"], cwd=repo, check=True, env=env)
    from graft.params import read_yaml

    params = read_yaml(REPO / "params.yaml")
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["dvc", "status", "--json"], cwd=repo, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout or "{}")


def test_speed_only_settings_rerun_nothing_and_the_random_seed_only_random_masks(tmp_path):
    """generation.batch_size and data_parallel_size change how fast samples come, never which (graft.generation
    SPEED_ONLY): no stage declares them. mask.random.seed is a param of the random masks alone. Controls: top_p
    reruns the sampling stages, the seed every random mask."""
    from graft.generation import SPEED_ONLY

    base = dvc_status_after(tmp_path, lambda p: None)
    for key in SPEED_ONLY:
        assert dvc_status_after(tmp_path, lambda p: p["generation"].update({key: 7})) == base, key
    seeded = dvc_status_after(tmp_path, lambda p: p["mask"]["random"].update(seed=5))
    moved = sorted(k for k in base if seeded.get(k) != base[k])
    assert moved and all(k.startswith("mask@random-") for k in moved), moved
    assert len(moved) == sum(1 for k in base if k.startswith("mask@random-"))
    sampled = dvc_status_after(tmp_path, lambda p: p["generation"].update(top_p=0.9))
    assert {"mine", "evaluate", "fisher_retention"} <= {k for k in base if sampled.get(k) != base[k]}
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    declared = {p for s in stages.values() for p in s.get("do", s).get("params", [])}
    assert not declared & ({"generation", "mask"} | {f"generation.{k}" for k in SPEED_ONLY})
