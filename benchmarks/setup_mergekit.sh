#!/usr/bin/env bash
# The benchmark's competitor, mergekit, in an environment of its own (.graft/bench/mergekit-venv, git-ignored), so
# that its pins never touch graft's. torch is pinned first: an unpinned torch would pull a multi-GB CUDA build here.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.graft/bench/mergekit-venv
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q "mergekit==0.1.5"
"$venv/bin/mergekit-yaml" --help >/dev/null && echo "mergekit ready: $venv/bin/mergekit-yaml"
