#!/usr/bin/env bash
# Sets up `mili bench serving`:
#   1. guidellm (the load generator) in its own venv, benchmarks/serving/.loadgen/ (it pins versions of its own);
#   2. llama.cpp for the peer server: benchmarks/peers/setup.sh builds llama.cpp's tools (llama-server among them)
#      from source and writes the checkpoint's GGUFs.
#
#   . .venv/bin/activate && bash benchmarks/serving/setup.sh [CHECKPOINT_DIR]
#
# CHECKPOINT_DIR defaults to MILI's built-in model. GUIDELLM_VERSION pins guidellm (default 0.8.1).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python}"

if [ ! -x "$HERE/.loadgen/bin/guidellm" ]; then
    python3 -m venv "$HERE/.loadgen"
    "$HERE/.loadgen/bin/pip" install "guidellm==${GUIDELLM_VERSION:-0.8.1}"
fi
"$HERE/.loadgen/bin/guidellm" --version

CKPT="${1:-$(cd "$ROOT" && "$PY" -c 'from python_layer.model.random_checkpoint import builtin_model_path; print(builtin_model_path())')}"
bash "$ROOT/benchmarks/peers/setup.sh" "$CKPT"
"$ROOT/benchmarks/peers/.peers/build/bin/llama-server" --version
echo "done: mili bench serving --model $CKPT"
