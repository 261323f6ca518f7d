"""traces: your own off-policy traces (params.yaml ``data.offpolicy.<name>``) in the ``offpolicy`` schema.

python -m stages.traces --name <key of data.offpolicy>  ->  data/offpolicy/<name>.parquet (source <name>)
Rows come from question/think/answer columns, or from a chat ``messages`` column (the final exchange: the last user
turn and the assistant's reasoning and answer, read with chat.think_markers and answer.format). ``finetune.source:
<name>`` trains on them; held-out evaluation problems among them are refused there, as for every source.
"""
from __future__ import annotations

import argparse

from graft.atomic import write_parquet
from graft.chat import ChatSpec, answer_format
from graft.cli import run_stage
from graft.confine import check_apart
from graft.inputs import InputSpec, describe, read_input
from graft.schema import load_params


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    name = ap.parse_args().name
    data, chat, answer = load_params("data", "chat", "answer")
    if name not in data.offpolicy:
        raise ValueError(f"--name {name} is not a key of params.yaml data.offpolicy {sorted(data.offpolicy)}")
    spec = InputSpec.from_params(data.offpolicy[name], f"data.offpolicy.{name}")
    check_apart({"its output": f"data/offpolicy/{name}.parquet"}, {f"{spec.key}.path": spec.path})
    table = read_input(spec, "offpolicy", ChatSpec.from_params(chat), answer_format(answer), source=name)
    write_parquet(f"data/offpolicy/{name}.parquet", table)
    print(f"traces {name}: {len(table)} rows ({table.problem_id.nunique()} problems) from {describe(spec)}")


if __name__ == "__main__":
    run_stage(main)
