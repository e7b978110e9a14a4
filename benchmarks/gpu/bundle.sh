#!/usr/bin/env bash
# `mili bench gpu-bundle`: everything an air-gapped GPU host (x86-64 Linux, Python 3.12, its own CUDA build of torch
# and transformers) needs beyond its image to run MILI's GPU suite (benchmarks/gpu/suite.sh), in $BUNDLE_DIR
# (gpu-bundle/ of the checkout), split into parts of at most --part-size each (pN/, for transfers with a size limit):
# - site: MAX's runtime (max, max-core, their Mojo libraries) installed for that Python, with the one Mojo module
#   `import max.nn` builds (built here for any x86-64-v3 CPU); the `mojo` CLI and lld are left out (~250 MB);
# - peers (unless --no-max-pipeline): what MAX's own Qwen3 pipeline (max[serve]) needs beyond the image, for the
#   suite's MILI-against-MAX steps (benchmarks/peers/max_pipeline.py);
# - mili_kernels/: the kernel package, precompiled here (the host has no `mojo` CLI), and `commit`, the checkout's;
# - graphs.tar.xz (unless --no-graphs): the graphs the suite loads, compiled here for $GPU_ARCH (sm_90a unless set)
#   with MAX's virtual device (benchmarks/gpu/precompile.py), so that the host reads them from MAX's compile cache
#   instead of compiling them (~45 minutes on 2 cores from nothing; graphs of the same kernel package are kept).
#   MAX's cache keys hold the checkout's path and the host CPU the graphs' host code is compiled for: the graphs are
#   compiled in a copy of the checkout at $SUITE_REPO (/tmp/mili-repo), for MILI_VIRTUAL_CPU_TARGET (x86-64-v3),
#   and benchmarks/gpu/background.sh start runs the suite from a copy at that same path, for that same CPU.
#   MAX's pipeline is compiled too, by a Python 3.12 venv at $KIT_DIR/py312 made from python3.12 (or $PYTHON312).
# Run it in MILI's venv (it packs that venv's MAX and uses its mojo). After a change to a .mojo file, run it again.
# On the GPU host, in the checkout with the bundle's parts in $BUNDLE_DIR: benchmarks/gpu/suite.sh (its first step,
# setup, unpacks them into $KIT_DIR), or benchmarks/gpu/background.sh start SECONDS (the suite in the background).
# Usage: benchmarks/gpu/bundle.sh [--part-size 46m] [--python 3.12] [--no-max-pipeline] [--no-graphs]
set -euo pipefail
usage="usage: $0 [--part-size 46m] [--python 3.12] [--no-max-pipeline] [--no-graphs]"
peers=1 graphs=1 py=3.12 part_size=46m
while [ $# -gt 0 ]; do
  case $1 in
    --no-max-pipeline) peers=0; shift ;;
    --no-graphs) graphs=0; shift ;;
    --python) py=$2; shift 2 ;;
    --part-size) part_size=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | cut -c3-; exit 0 ;;
    *) echo "unknown argument $1; $usage" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/../.."
bundle=$(realpath -m "${BUNDLE_DIR:-gpu-bundle}")
kit=${KIT_DIR:-/tmp/mili-kit}
repo=${SUITE_REPO:-/tmp/mili-repo}
export MILI_VIRTUAL_CPU_TARGET=${MILI_VIRTUAL_CPU_TARGET:-x86-64-v3}
python3 -c "import max, mojo" 2>/dev/null || { echo "run it in MILI's venv (MAX and mojo for the bundle)" >&2; exit 1; }
py312=${PYTHON312:-python3.12}
if [ $graphs -eq 1 ] && [ $peers -eq 1 ]; then
  "$py312" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null ||
    { echo "compiling MAX's pipeline needs python3.12 (the host's Python): put it on the PATH, set PYTHON312, or" \
           "pass --no-max-pipeline" >&2; exit 1; }
fi

if ! ls "$bundle"/p*/* >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  target=(--only-binary=:all: --python-version "$py" --implementation cp)
  for glibc in 17 24 27 28 31 34 35; do target+=(--platform "manylinux_2_${glibc}_x86_64"); done
  target+=(--platform manylinux2014_x86_64)
  runtime=("max==26.7.0" "max-core==26.7.0" "max-mojo-libs==26.7.0" "max-shmem-libs==26.7.0"
           "mojo-compiler-mojo-libs==1.2.0" "mojo-compiler==1.2.0" msgspec taskgroup exceptiongroup)
  # max[serve] does not resolve without these pins
  otel=(opentelemetry-api==1.35.0 opentelemetry-sdk==1.35.0 opentelemetry-proto==1.35.0
        opentelemetry-exporter-otlp-proto-grpc==1.35.0 opentelemetry-exporter-otlp-proto-http==1.35.0
        opentelemetry-exporter-otlp-proto-common==1.35.0 opentelemetry-exporter-prometheus==0.56b0
        opentelemetry-semantic-conventions==0.56b0)
  # in the CUDA images MILI is tested on (NVIDIA's PyTorch images) already, in versions max[serve] accepts
  on_image='^(numpy|scipy|grpcio|uvloop|hf_xet|pygments|torch|triton|nvidia_.*)-'

  pip() {  # quiet, but for pip's notes on local index folders that do not exist
    python3 -m pip -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
    return "${PIPESTATUS[0]}"
  }
  install() {  # install TARGET WHEEL...: unpacked for the host's Python, not this one
    local to=$1; shift
    pip install --no-deps --no-compile --ignore-requires-python "${target[@]}" --target "$to" "$@"
  }

  rm -rf "$bundle"/p*
  mkdir -p "$bundle"
  pip download --no-deps "${target[@]}" -d "$work/runtime" "${runtime[@]}"
  install "$work/site" "$work"/runtime/*.whl
  # the CLI's binaries (pip puts them in bin/ and modular/bin/; benchmarks/gpu/unpack.sh puts an empty stand-in for
  # modular/bin/mojo, by which MAX finds its kernel libraries)
  rm -f "$work"/site/bin/{mojo,lld} "$work"/site/modular/bin/{mojo,lld}
  # `import max.nn` builds one Mojo module with that CLI (max/_kv_cache_ops; MAX's flash attention row of
  # the kernel benchmark and MAX's pipeline import it): built here instead, for any x86-64-v3 CPU, where MAX's importer
  # looks for it, finding MAX's libraries relative to itself
  ops="$work/site/max/_kv_cache_ops"
  mkdir -p "$ops/__mojocache__"
  hash=$(python3 -c "import sys, pathlib, mojo.importer as i; print(i._calculate_mojo_source_hash(pathlib.Path(sys.argv[1])))" \
    "$ops")
  mojo build "$ops/kv_cache_ops.mojo" --emit shared-lib --target-cpu x86-64-v3 -Xlinker -rpath \
    -Xlinker '$ORIGIN/../../../modular/lib' -o "$ops/__mojocache__/kv_cache_ops.hash-$hash.so" 2>&1 | { grep -v Crashpad || true; }
  folders=(site)
  if [ $peers -eq 1 ]; then
    pip download "${target[@]}" -d "$work/serve" "max[serve]==26.7.0" "${otel[@]}"
    wheels=()
    for w in "$work"/serve/*.whl; do
      name=$(basename "$w")
      [[ $name =~ ^(max|max_core|max_mojo_libs|max_shmem_libs|mojo.*)- || $name =~ $on_image ]] || wheels+=("$w")
    done
    install "$work/peers" "${wheels[@]}"
    folders+=(peers)
  fi
  n=0
  for folder in "${folders[@]}"; do
    echo "$folder: $(du -sh "$work/$folder" | cut -f1) installed; compressing"
    tar -C "$work" -cf - "$folder" | xz -T0 -9 | split -b "$part_size" -d -a 2 - "$work/$folder.tar.xz."
    for piece in "$work/$folder".tar.xz.*; do
      n=$((n + 1))
      mkdir -p "$bundle/p$n"
      mv "$piece" "$bundle/p$n/"
    done
  done
fi

python3 -c "from bindings import library; library.package_path()"
rm -rf "$bundle/mili_kernels" && cp -r .modular_cache/mili_kernels "$bundle/"
# the commit the suite's results name (the GPU host's copy of the checkout has no git)
echo "$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo -dirty)" \
  >"$bundle/commit"

copy_checkout() {  # this checkout's files, with its kernel package, to $repo
  benchmarks/gpu/copy_checkout.sh "$repo"
  cp -r .modular_cache/mili_kernels "$repo/.modular_cache/"
}

if [ $graphs -eq 1 ]; then
  if [ $peers -eq 1 ]; then
    [ -x "$kit/py312/bin/python3" ] || "$py312" -m venv "$kit/py312"
    # what MAX's worker imports that the host's image holds and the bundle leaves out
    "$kit/py312/bin/python3" -m pip -q install numpy torch==2.13.0 psutil rich 2>&1 | { grep -v "is ignored" || true; }
    PATH=$kit/py312/bin:$PATH KIT_DIR=$kit BUNDLE_DIR=$bundle benchmarks/gpu/unpack.sh site peers
    printf '#!/bin/sh\nPATH=%s/py312/bin:$PATH exec %s/max-python "$@"\n' "$kit" "$kit" >"$kit/max-python312"
    chmod +x "$kit/max-python312"
    export MAX_PYTHON=${MAX_PYTHON:-$kit/max-python312}
  fi
  # graphs compiled before for the same kernel package still hold (a new package changes every key): kept, so that
  # a change to the graphs alone compiles only what changed
  kept=$(mktemp -d)
  ! diff -rq .modular_cache/mili_kernels "$repo/.modular_cache/mili_kernels" >/dev/null 2>&1 ||
    mv "$repo/.modular_cache/.max_cache" "$kept/" 2>/dev/null || true
  copy_checkout
  [ ! -d "$kept/.max_cache" ] || mv "$kept/.max_cache" "$repo/.modular_cache/"
  rmdir "$kept" 2>/dev/null || true
  (cd "$repo" && python3 -m benchmarks.gpu.precompile)
  tar -cJf "$bundle/graphs.tar.xz" -C "$repo/.modular_cache" .max_cache
fi
du -sh "$bundle"/*
