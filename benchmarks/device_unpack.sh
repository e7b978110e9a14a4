#!/usr/bin/env bash
# Unpacks benchmarks/device_kit.sh's folders on a GPU machine: the parts carried in $DEVKIT (.devkit) join those
# copied before to $KIT_DIR/parts, and each FOLDER (default: site peers) whose parts are all there and that is not
# unpacked yet is unpacked into $KIT_DIR (/tmp/mili-kit). A folder whose parts are not all there fails; it unpacks
# once they are. With peers, $KIT_DIR/max-python runs a Python that has max[serve].
# Usage: benchmarks/device_unpack.sh [FOLDER...] | --parts-only (copy the carried parts, unpack nothing)
set -uo pipefail
kit=${KIT_DIR:-/tmp/mili-kit}
mkdir -p "$kit/parts"
# a part already there with the same bytes stays as it is, another comes by a rename: an unpack reading the parts
# meanwhile (the run a lease's call started, while a later call carries more) never reads one half-written
for part in "${DEVKIT:-.devkit}"/p*/*; do
  [ -f "$part" ] || continue
  to=$kit/parts/$(basename "$part")
  cmp -s "$part" "$to" || { cp "$part" "$kit/parts/.copying-$$" && mv "$kit/parts/.copying-$$" "$to"; } || exit 1
done
[ "${1:-}" != --parts-only ] || exit 0
folders=${*:-site peers}
for folder in $folders; do
  [ ! -d "$kit/$folder" ] && ls "$kit/parts/$folder".tar.xz.* >/dev/null 2>&1 || continue
  unpacking=$(mktemp -d "$kit/unpacking.XXXX")  # two unpacks at once (a lease's later call) never share one
  cat "$kit/parts/$folder".tar.xz.* | xz -d | tar -x -C "$unpacking" || { rm -rf "$unpacking"; exit 1; }
  mv "$unpacking/$folder" "$kit/$folder"
  rm -rf "$unpacking"
done
if [ -d "$kit/peers" ]; then
  printf '#!/bin/sh\nPYTHONPATH=%s/peers:%s/site:$PYTHONPATH exec python3 "$@"\n' "$kit" "$kit" >"$kit/max-python"
  chmod +x "$kit/max-python"
fi
[[ " $folders " == *" site "* ]] || exit 0
# MAX finds its own kernel libraries (modular/lib/mojo) beside modular/bin/mojo (mojo/_package_root.py): the kit
# leaves that CLI out, so an empty stand-in marks the place; without it every graph with a kernel fails to load
# ("failed to resolve built-in kernel package paths", the first H100 lease of the kit)
[ ! -d "$kit/site/modular" ] || [ -e "$kit/site/modular/bin/mojo" ] || {
  mkdir -p "$kit/site/modular/bin" && touch "$kit/site/modular/bin/mojo" && chmod +x "$kit/site/modular/bin/mojo"; }
export PYTHONPATH=$kit/site${PYTHONPATH:+:$PYTHONPATH}
# the architecture MAX compiles for there (its compile cache keys hold it): what gpu_precompile.py's GPU_ARCH must be
python3 -c "import max.engine, max.driver as d; n = d.accelerator_count()
print('MAX', n, 'accelerator(s)', *(['of architecture', d.Accelerator().architecture_name] if n else []))" || exit 1
python3 -c "from mojo._package_root import get_package_root as root
assert (root() / 'lib/mojo/builtin_kernels.mojoc').is_file(), f'no MAX kernel libraries under {root()}'" || exit 1
python3 -c "import max.nn" || echo "max.nn does not import: no MAX flash attention row, no MAX pipeline"
