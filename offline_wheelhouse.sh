#!/usr/bin/env bash
# Everything an offline machine (an air-gapped GPU box) needs to install MILI: MILI's own wheel built from this
# checkout, MAX, Mojo and every dependency pip resolves, for the target's Python version and CPU, in one folder.
# torch is left out unless --with-torch: a GPU box has its own CUDA build, and PyPI's is several GB.
# --split SIZE also writes the folder as DIR.part.NN pieces of SIZE (for transfers with a size limit).
# On the offline machine:  pip install --no-index --find-links DIR mili
#   (from pieces:  mkdir DIR && cat DIR.part.* | tar -x -C DIR  first)
# Usage: ./offline_wheelhouse.sh DIR [--python 3.12] [--arch x86_64] [--with-torch] [--split 40m]
set -euo pipefail
usage="usage: $0 DIR [--python 3.12] [--arch x86_64] [--with-torch] [--split 40m]"
out="" py=3.12 arch=x86_64 with_torch=0 split=""
while [ $# -gt 0 ]; do
  case $1 in
    --python) py=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --with-torch) with_torch=1; shift ;;
    --split) split=$2; shift 2 ;;
    -*) echo "unknown option $1; $usage" >&2; exit 2 ;;
    *) out=$(realpath -m "$1"); shift ;;
  esac
done
[ -n "$out" ] || { echo "$usage" >&2; exit 2; }
cd "$(dirname "$0")"
mkdir -p "$out"
python3 -m pip wheel -q --no-deps -w "$out" .
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
python3 - "$with_torch" >"$requirements" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if sys.argv[1] == "1" or re.split(r"[<>=!~ ;\[]", d)[0] != "torch"))
PY
platforms=(--platform "manylinux2014_$arch")
for glibc in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${glibc}_$arch"); done
python3 -m pip download -q --only-binary=:all: --python-version "$py" --implementation cp "${platforms[@]}" \
  -d "$out" -r "$requirements"
echo "$(ls "$out" | wc -l) wheels, $(du -sh "$out" | cut -f1), in $out"
if [ -n "$split" ]; then
  rm -f "$out".part.*
  tar -C "$out" -cf - . | split -b "$split" -d - "$out.part."
  echo "pieces: $(ls "$out".part.* | tr '\n' ' ')"
fi
