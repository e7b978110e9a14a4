#!/usr/bin/env bash
# The GPU suite in the background, for a GPU host reached through commands with a time limit (a CI job's steps, a
# remote runner's calls): `start` starts benchmarks/gpu/suite.sh detached from the caller and returns at once; each
# `wait` waits for it a while and puts its logs and results so far into $OUT. The suite runs in its own copy of the
# checkout at $SUITE_REPO (/tmp/mili-repo), the path that benchmarks/gpu/bundle.sh compiled its graphs at, so that
# a later command may send the checkout again without disturbing it.
# Usage, on the GPU host, in the checkout with the bundle's parts in $BUNDLE_DIR (gpu-bundle/):
#   benchmarks/gpu/background.sh start SECONDS [STEP...]  copy the bundle's parts to $KIT_DIR/parts, copy the
#       checkout to $SUITE_REPO with the bundle's kernel package and graphs, start suite.sh there with
#       SUITE_SECONDS=SECONDS, and return
#   benchmarks/gpu/background.sh wait SECONDS [FOLDER...]  unpack the bundle's FOLDERs (default: peers) once their
#       parts are all there, then wait until the suite ends or SECONDS pass, putting its logs and results into $OUT
#       every 15 s (a command cut short still brings back the latest)
set -uo pipefail
cd "$(dirname "$0")/../.."
# the graphs' host code for the portable CPU benchmarks/gpu/bundle.sh compiled them for (bindings/library.py)
export MILI_VIRTUAL_CPU_TARGET=${MILI_VIRTUAL_CPU_TARGET:-x86-64-v3}
kit=${KIT_DIR:-/tmp/mili-kit}
repo=${SUITE_REPO:-/tmp/mili-repo}
logs=${GPU_SUITE_LOGS:-/tmp/mili-gpu}
bundle=$(realpath -m "${BUNDLE_DIR:-gpu-bundle}")
usage="usage: $0 start SECONDS [STEP...] | wait SECONDS [FOLDER...]"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
verb=$1 seconds=$2
shift 2

copy_checkout() {  # this checkout's files, with the bundle's kernel package and graphs, to $repo
  benchmarks/gpu/copy_checkout.sh "$repo" || return
  cp -r "$bundle/mili_kernels" "$repo/.modular_cache/" 2>/dev/null || cp -r .modular_cache/mili_kernels "$repo/.modular_cache/" 2>/dev/null
  [ ! -f "$bundle/graphs.tar.xz" ] || tar -xJf "$bundle/graphs.tar.xz" -C "$repo/.modular_cache"
}

host_cpu() {  # the host's CPU, for the record: vendor, family, model, name, flags
  awk -F'\t*: ' '/^(vendor_id|cpu family|model|model name|flags)\t/ && !seen[$1]++ {print $1 ": " $2}' /proc/cpuinfo
}

collect() {  # the suite's logs and results so far into $OUT
  [ -z "${OUT:-}" ] || benchmarks/gpu/collect.sh "$logs" "$repo"
}

case $verb in
  start)
    mkdir -p "$logs"
    KIT_DIR=$kit BUNDLE_DIR=$bundle benchmarks/gpu/unpack.sh --parts-only || exit 1
    copy_checkout
    host_cpu >"$logs/host-cpu.log" && grep "^model name" "$logs/host-cpu.log"
    cd "$repo" || exit 1
    env -u OUT KIT_DIR="$kit" BUNDLE_DIR="$bundle" GPU_SUITE_LOGS="$logs" SUITE_SECONDS="$seconds" setsid -f bash -c \
      'benchmarks/gpu/suite.sh "$@"; echo $? >"$GPU_SUITE_LOGS/suite.rc"' suite "$@" \
      >"$logs/suite.log" 2>&1 </dev/null
    echo "started: suite.sh ${*:-(its default steps)} for at most $seconds s; log $logs/suite.log" ;;
  wait)
    KIT_DIR=$kit BUNDLE_DIR=$bundle benchmarks/gpu/unpack.sh "${@:-peers}" || echo "the bundle's ${*:-peers} did not unpack"
    # a host that was replaced between two commands comes bare: nothing to wait for
    [ -f "$logs/suite.log" ] || { echo "no suite running on this host: send the bundle and start again"; exit 1; }
    start=$SECONDS collected=-15
    while [ ! -f "$logs/suite.rc" ] && [ $((SECONDS - start)) -lt "$seconds" ]; do
      [ $((SECONDS - collected)) -lt 15 ] || { collect; collected=$SECONDS; }
      sleep 1
    done
    collect
    tail -n 60 "$logs/suite.log"
    [ -f "$logs/suite.rc" ] && echo "the suite ended: rc $(cat "$logs/suite.rc")" || echo "the suite goes on" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
