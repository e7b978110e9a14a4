#!/usr/bin/env bash
# Sets up the peers of `mili bench peers`: builds llama-cpp-python from its source distribution (so llama.cpp
# is compiled for this CPU, -DGGML_NATIVE=ON) and converts the benchmark checkpoint to GGUF f32, bf16 and q8_0
# with llama.cpp's own convert_hf_to_gguf.py, taken from the same source distribution as the library.
#
#   . .venv/bin/activate && bash benchmarks/peers/setup.sh [CHECKPOINT_DIR]
#
# CHECKPOINT_DIR defaults to the random-weight Qwen3-0.6B-shaped checkpoint of the benchmarks (built if missing).
# Everything goes under benchmarks/peers/.peers/ (git-ignored):
#   src/      the sdist, extracted (vendor/llama.cpp/ holds convert_hf_to_gguf.py and gguf-py)
#   site/     llama_cpp, diskcache and gguf, installed with pip --target; run.py puts it first on sys.path
#   gguf/<checkpoint name>/{f32,bf16,q8_0}.gguf
# They are installed beside the project's venv, not into it, so the project's own packages (numpy, torch,
# transformers) stay exactly as they are; llama-cpp-python's other dependencies (numpy, jinja2,
# typing-extensions) are already in the venv, so --no-deps installs nothing else.
# Re-running skips whatever is already there. Needs PyPI (the sdist and the build tools), cmake and a C++ compiler.
# LLAMA_CPP_PYTHON_VERSION pins the version (default: the newest); CMAKE_BUILD_PARALLEL_LEVEL the build jobs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="$HERE/.peers"
SITE="$WORK/site"
PY="${PYTHON:-python}"
mkdir -p "$WORK/src" "$SITE"

CKPT="${1:-}"
if [ -z "$CKPT" ]; then
    CKPT="$(cd "$ROOT/benchmarks" && "$PY" -c 'from common import model_path; print(model_path(None))')"
fi
CKPT="$(cd "$CKPT" && pwd)"

# 1. the source distribution
SPEC="llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}"
SDIST="$(ls "$WORK"/src/llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)"
if [ -z "$SDIST" ] || { [ -n "${LLAMA_CPP_PYTHON_VERSION:-}" ] && [[ "$SDIST" != *"-$LLAMA_CPP_PYTHON_VERSION.tar.gz" ]]; }; then
    "$PY" -m pip download --no-binary :all: --no-deps -d "$WORK/src" "$SPEC"
    SDIST="$(ls "$WORK"/src/llama_cpp_python-*.tar.gz | sort -V | tail -1)"
fi
SRC="${SDIST%.tar.gz}"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$WORK/src"
LLAMA_CPP="$SRC/vendor/llama.cpp"
echo "source: $SRC"

# 2. the library, built from that source (LLAVA_BUILD=OFF: the multimodal library is not needed here)
if ! PYTHONPATH="$SITE" "$PY" -c 'import llama_cpp' 2>/dev/null; then
    echo "building llama-cpp-python from source (about 15 minutes on 2 cores)"
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        "$PY" -m pip install -v --no-deps --target "$SITE" "$SDIST"
fi
PYTHONPATH="$SITE" "$PY" -m pip install --no-deps --target "$SITE" --upgrade diskcache "sentencepiece>=0.1.98,<0.3.0" "$LLAMA_CPP/gguf-py" >/dev/null
PYTHONPATH="$SITE" "$PY" -c 'import llama_cpp, gguf; print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__)'

# 3. the GGUFs, written by llama.cpp's converter (it reads config.json, the safetensors and the tokenizer files)
OUT="$WORK/gguf/$(basename "$CKPT")"
mkdir -p "$OUT"
for t in f32 bf16 q8_0; do
    if [ ! -s "$OUT/$t.gguf" ]; then
        PYTHONPATH="$SITE" "$PY" "$LLAMA_CPP/convert_hf_to_gguf.py" "$CKPT" --outtype "$t" --outfile "$OUT/$t.gguf.part"
        mv "$OUT/$t.gguf.part" "$OUT/$t.gguf"
    fi
done
ls -l "$OUT"
echo "done: mili bench peers --model $CKPT"
