"""world: build the embedded toy world (model family + task data) -> models/world/*, data/world/*."""
from __future__ import annotations

import json
from pathlib import Path

from graft.atomic import atomic_dir, write_json, write_parquet
from graft.modeling import save_model_dir
from graft.params import ParamsError
from graft.schema_world import load_world_params
from graft.world import build_world


def main() -> None:
    sections = load_world_params()
    p, chat, models, data = (sections[k] for k in ("world", "chat", "models", "data"))
    out_models = {f"pretrain_{i}": Path(d) for i, d in enumerate(models.pretrain_checkpoints)}
    out_models.update(base=Path(models.base), post=Path(models.post), aligner=Path(models.aligner))

    def write_model(model, tokenizer, path: Path) -> None:
        with atomic_dir(path) as tmp:
            save_model_dir(model, tokenizer, tmp)

    tables, curves = build_world(p, chat.thinking, out_models, write_model)
    suites = set(tables) - {"hard_pool", "retention"}
    if set(data.old_suites) != suites:
        raise ParamsError(f"params.yaml: data.old_suites must name the world's suites {sorted(suites)}")
    for name in sorted(suites):
        write_parquet(data.old_suites[name], tables[name])
    write_parquet(data.hard_pool, tables["hard_pool"])
    write_parquet(data.retention, tables["retention"])
    summary = {name: {"steps": len(c), "first_loss": c[0], "final_loss": sum(c[-10:]) / len(c[-10:])}
               for name, c in curves.items()}
    write_json("reports/world.json", summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
