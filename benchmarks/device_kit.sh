#!/usr/bin/env bash
# Packs what a lent GPU machine (no network, Python 3.12, its own torch and transformers) needs beyond its image
# to run MILI, in parts that the device tool carries (64 MiB a call, the checkout's ~13 MiB included):
# - the folder site: MAX's runtime (max, max-core, their Mojo libraries), installed for that Python;
# - with --peers, the folder peers: what MAX's own Qwen3 pipeline (max[serve]) needs and the image lacks or has in
#   another version (transformers 5.12, av, zmq, opentelemetry, ...), for benchmarks/peers/max_pipeline.py.
# Each folder is xz-compressed and split into .devkit/pN/ (one carry each). The `mojo` CLI and lld are left out
# (~250 MB; only `mojo precompile` and `mojo build` run them): the kernel package is precompiled here into
# .modular_cache/mili_kernels, which the work call carries too, and so is the one Mojo module MAX builds when
# imported. After a change to a .mojo file of MILI's, precompile again here (`python -c "from bindings import
# library; library.package_path()"`) and carry it again. Run it in MILI's venv (it uses that venv's mojo).
# Usage: benchmarks/device_kit.sh [--peers] [--python 3.12] [--part-size 46m]
# On the device: benchmarks/gpu_session.sh setup ... unpacks the parts (see its header).
set -euo pipefail
usage="usage: $0 [--peers] [--python 3.12] [--part-size 46m]"
peers=0 py=3.12 part_size=46m
while [ $# -gt 0 ]; do
  case $1 in
    --peers) peers=1; shift ;;
    --python) py=$2; shift 2 ;;
    --part-size) part_size=$2; shift 2 ;;
    *) echo "unknown argument $1; $usage" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
kit=.devkit
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
# on the device image already (KINDS.md of the device tool), in versions max[serve] accepts
on_image='^(numpy|scipy|grpcio|uvloop|hf_xet|pygments|torch|triton|nvidia_.*)-'

pip() {  # quiet, but for pip's notes on local index folders that do not exist
  python3 -m pip -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }
  return "${PIPESTATUS[0]}"
}
install() {  # install TARGET WHEEL...: unpacked for the device's Python, not this one
  local to=$1; shift
  pip install --no-deps --no-compile --ignore-requires-python "${target[@]}" --target "$to" "$@"
}

rm -rf "$kit"/p*  # not .devkit/graphs.tar.xz (gpu_lease.sh precompile)
mkdir -p "$kit"
pip download --no-deps "${target[@]}" -d "$work/runtime" "${runtime[@]}"
install "$work/site" "$work"/runtime/*.whl
# the CLI's binaries (pip puts them in bin/ and modular/bin/; benchmarks/device_unpack.sh puts an empty stand-in for
# modular/bin/mojo, by which MAX finds its kernel libraries)
rm -f "$work"/site/bin/{mojo,lld} "$work"/site/modular/bin/{mojo,lld}
# `import max.nn` builds one Mojo module with that CLI (max/_kv_cache_ops; MAX's flash attention row of
# benchmarks/kernels.py and MAX's pipeline import it): built here instead, for any x86-64-v3 CPU, where MAX's importer
# looks for it, finding MAX's libraries relative to itself
ops="$work/site/max/_kv_cache_ops"
mkdir -p "$ops/__mojocache__"
hash=$(python3 -c "import sys; from pathlib import Path; from mojo.importer import _calculate_mojo_source_hash as h
print(h(Path(sys.argv[1])))" "$ops")
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
    mkdir -p "$kit/p$n"
    mv "$piece" "$kit/p$n/"
  done
done
python3 -c "from bindings import library; print('kernel package:', library.package_path())"
du -sh "$kit"/p* .modular_cache/mili_kernels
[ -f "$kit/graphs.tar.xz" ] || echo "no precompiled graphs: benchmarks/gpu_lease.sh precompile saves the lease their compiles"
# the calls of a lease (benchmarks/gpu_lease.sh): the site's parts packed into as few calls as fit beside the checkout,
# the last starting the work, then the peers' parts while it runs
python3 - "$kit" <<'PY'
import subprocess, sys
from pathlib import Path
room = 64 * 2**20 - sum(Path(f).stat().st_size for f in subprocess.run(
    ["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split() if Path(f).is_file()) - 2**20
# the start call also carries the kernel package and the graphs precompiled for the lease (gpu_lease.sh precompile)
start_carry = [p for p in (".modular_cache/mili_kernels", ".devkit/graphs.tar.xz") if Path(p).exists()]
start_bytes = sum(f.stat().st_size for p in map(Path, start_carry) for f in [p, *p.rglob("*")] if f.is_file())
head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def calls(parts: list[Path], first_room: int) -> list[list[str]]:
    """Parts into calls, largest first, each call's parts within the room (the first call's: first_room)."""
    packed: list[list] = []
    for part in sorted(parts, key=lambda p: -sum(f.stat().st_size for f in p.iterdir())):
        size = sum(f.stat().st_size for f in part.iterdir())
        fit = next((c for c in packed if c[0] + size <= (first_room if c is packed[0] else room)), None)
        if fit is None:
            packed.append(fit := [0, []])
        fit[0] += size
        fit[1].append(str(part))
    return [names for _, names in packed]


parts = sorted(Path(sys.argv[1]).glob("p*"))
site = calls([p for p in parts if any(f.name.startswith("site.") for f in p.iterdir())], room - start_bytes)
peers = calls([p for p in parts if any(f.name.startswith("peers.") for f in p.iterdir())], room)
plan = [(names, "mkdir -p /tmp/mili-kit/parts && cp .devkit/p*/* /tmp/mili-kit/parts/") for names in site[1:]]
plan.append((site[0] + start_carry,
             f"MILI_COMMIT={head} benchmarks/gpu_lease.sh start SECONDS  (the budget left, less ~60 s)"))
plan += [(names, "benchmarks/gpu_lease.sh wait " + ("570" if i == len(peers) - 1 else "1")) for i, names in enumerate(peers)]
plan.append(([], "benchmarks/gpu_lease.sh wait SECONDS  (again until the run ends)"))
for i, (names, command) in enumerate(plan, 1):
    print(f"call {i}: carry {names}  command: {command}")
PY
