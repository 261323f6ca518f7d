"""world: build the embedded toy world (model family + task data) -> models/world/*, data/world/*.

The world writes to its own fixed folders, whatever ``models`` and ``data`` in params.yaml point at: the default
params point there, and a user's own model and data are never touched by it (nor make it rebuild).
"""
from __future__ import annotations

import json
from pathlib import Path

from graft.atomic import atomic_dir, write_json, write_parquet
from graft.cli import run_stage
from graft.modeling import save_model_dir
from graft.schema_world import load_world_params
from graft.world import build_world

MODELS, DATA = Path("models/world"), Path("data/world")


def main() -> None:
    sections = load_world_params()
    p = sections["world"]
    out_models = {f"pretrain_{i}": MODELS / f"pretrain_{i}" for i in range(len(p.pretrain.checkpoints))}
    out_models.update(base=MODELS / "base", post=MODELS / "post", aligner=MODELS / "aligner")

    def write_model(model, tokenizer, path: Path) -> None:
        with atomic_dir(path) as tmp:
            save_model_dir(model, tokenizer, tmp)

    tables, curves = build_world(p, p.thinking, out_models, write_model)
    for name in sorted(set(tables) - {"hard_pool", "retention"}):
        write_parquet(DATA / f"old_{name}.parquet", tables[name])
    write_parquet(DATA / "hard_pool.parquet", tables["hard_pool"])
    write_parquet(DATA / "retention.parquet", tables["retention"])
    summary = {name: {"steps": len(c), "first_loss": c[0], "final_loss": sum(c[-10:]) / len(c[-10:])}
               for name, c in curves.items()}
    write_json("reports/world.json", summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    run_stage(main)
