#!/usr/bin/env bash
# Unpacks the folders of benchmarks/gpu/bundle.sh on the GPU host: the bundle's parts in $BUNDLE_DIR (gpu-bundle/)
# join those copied before to $KIT_DIR/parts, and each FOLDER (default: site peers) whose parts are all there and that is not
# unpacked yet is unpacked into $KIT_DIR (/tmp/mili-kit). A folder whose parts are not all there fails; it unpacks
# once they are. With peers, $KIT_DIR/max-python runs a Python that has max[serve].
# Usage: benchmarks/gpu/unpack.sh [FOLDER...] | --parts-only (copy the bundle's parts, unpack nothing)
set -uo pipefail
kit=${KIT_DIR:-/tmp/mili-kit}
mkdir -p "$kit/parts"
# a part already there with the same bytes stays as it is, another comes by a rename: an unpack reading the parts
# meanwhile (the suite started in the background, while more parts arrive) never reads one half-written
for part in "${BUNDLE_DIR:-gpu-bundle}"/p*/*; do
  [ -f "$part" ] || continue
  to=$kit/parts/$(basename "$part")
  cmp -s "$part" "$to" || { cp "$part" "$kit/parts/.copying-$$" && mv "$kit/parts/.copying-$$" "$to"; } || exit 1
done
[ "${1:-}" != --parts-only ] || exit 0
# the bundle's kernel package and precompiled graphs into a compile cache that has none
cache=${MODULAR_CACHE_DIR:-.modular_cache} bundle=${BUNDLE_DIR:-gpu-bundle}
mkdir -p "$cache"
[ -d "$cache/mili_kernels" ] || [ ! -d "$bundle/mili_kernels" ] || cp -r "$bundle/mili_kernels" "$cache/" || exit 1
[ -d "$cache/.max_cache" ] || [ ! -f "$bundle/graphs.tar.xz" ] || tar -xJf "$bundle/graphs.tar.xz" -C "$cache" || exit 1
folders=${*:-site peers}
for folder in $folders; do
  [ ! -d "$kit/$folder" ] && ls "$kit/parts/$folder".tar.xz.* >/dev/null 2>&1 || continue
  unpacking=$(mktemp -d "$kit/unpacking.XXXX")  # two unpacks at once never share one
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
# ("failed to resolve built-in kernel package paths")
[ ! -d "$kit/site/modular" ] || [ -e "$kit/site/modular/bin/mojo" ] || {
  mkdir -p "$kit/site/modular/bin" && touch "$kit/site/modular/bin/mojo" && chmod +x "$kit/site/modular/bin/mojo"; }
export PYTHONPATH=$kit/site${PYTHONPATH:+:$PYTHONPATH}
# the architecture MAX compiles for here (its compile cache keys hold it): what bundle.sh's GPU_ARCH must be
python3 -c "import max.engine, max.driver as d; n = d.accelerator_count()
print('MAX', n, 'accelerator(s)', *(['of architecture', d.Accelerator().architecture_name] if n else []))" || exit 1
python3 -c "from mojo._package_root import get_package_root as root
assert (root() / 'lib/mojo/builtin_kernels.mojoc').is_file(), f'no MAX kernel libraries under {root()}'" || exit 1
python3 -c "import max.nn" || echo "max.nn does not import: no MAX flash attention row, no MAX pipeline"
