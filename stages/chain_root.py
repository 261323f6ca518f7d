"""chain_root: where every chain starts (graft.chain): the post model, the old task's retention prompts, no update.

python -m stages.chain_root  ->  models/chain/<method>/post.json (the state naming models.post, for every chain and
    joint SFT), reports/chain/report/post/scores.parquet (no scores yet),
    data/chain/post/ (the retention prompts of the first step's Fisher, and empty tables of training rows and
    held-out problems), tensors/chain/delta/post and tensors/chain/masked/<kind>/post (markers: no update before the
    first step)
The first step's stages name these through its ``after: post``, as every later step names the one before it. With no
chain steps this is all the chain does.
"""
from __future__ import annotations

import pandas as pd

from graft.atomic import atomic_dir, write_json, write_parquet
from graft.chain import CHAINS, DATA, JOINT, REPORTS, ROOT, SCORES, delta_dir, masked_dir, state_file, write_state
from graft.cli import run_stage
from graft.inputs import InputSpec, read_input
from graft.hashing import content_hash
from graft.registry import SWEPT_MASKS
from graft.schema import load_all
from graft.tables import SCHEMAS
from stages.chain_data import QUESTIONS, TRAINS, write_step_data


def main() -> None:
    p = load_all()
    post, data = p["models"].post, p["data"]
    retention = read_input(InputSpec.from_params(data.retention, "data.retention"), "problems")
    prompts = pd.DataFrame({"problem_id": retention["problem_id"], "question": retention["question"], "task": "old"})
    empty_train = pd.DataFrame({c: pd.Series(dtype=object) for c in SCHEMAS["offpolicy"]})
    empty_heldout = pd.DataFrame({c: pd.Series(dtype=object) for c in ("problem_id", "question", "answer")})
    none = lambda cols: pd.DataFrame({c: pd.Series(dtype=object) for c in cols})  # noqa: E731
    write_step_data(DATA / ROOT, empty_train, empty_heldout, prompts, none(QUESTIONS), none(TRAINS))
    sha = content_hash(post)
    for method in (*CHAINS, JOINT):
        write_state(state_file(method, ROOT), post, sha)
    write_parquet(REPORTS / "report" / ROOT / "scores.parquet", pd.DataFrame({c: pd.Series(dtype=object)
                                                                               for c in SCORES}))
    for path in [delta_dir(ROOT), *(masked_dir(kind, ROOT) for kind in SWEPT_MASKS)]:
        with atomic_dir(path) as tmp:   # what a step's update directory holds, for the step before the first: none
            write_json(tmp / "root.json", {"update": None, "why": "no step before the first: nothing was added"})
    print(f"chain_root: {len(CHAINS)} chains and joint SFT start at {post}; {len(prompts)} retention prompts of the old task")


if __name__ == "__main__":
    run_stage(main)
