#!/usr/bin/env bash
# A lease's work as one long run: benchmarks/gpu_session.sh started in a session of its own, which outlives the
# device tool's call (10 minutes at most) and runs on while later calls carry the rest of the kit and bring back
# its logs. The device tool sends the checkout again with every call, so the run works in a copy of it.
# Usage, on the device machine, in the checkout the tool sent:
#   benchmarks/gpu_lease.sh start SECONDS [STEP...]  copy the carried kit parts, copy the checkout to $LEASE_REPO
#       (/tmp/mili-repo), start gpu_session.sh there with SESSION_SECONDS=SECONDS (and MILI_COMMIT), and return
#   benchmarks/gpu_lease.sh wait SECONDS [FOLDER...]  unpack the kit's FOLDERs (default: peers) once carried now,
#       then wait until the run ends or SECONDS pass, putting its logs and results into $OUT every 15 s (a call cut
#       short still brings back the latest)
# Before the lease, here (no GPU needed):
#   benchmarks/gpu_lease.sh precompile  the graphs the lease loads, compiled for $GPU_ARCH (sm_90a) in a copy of the
#       checkout at $LEASE_REPO (MAX's cache key holds the kernel package's path) by benchmarks/gpu_precompile.py, into
#       .devkit/graphs.tar.xz (compiled graphs shrink ~40x), which `start` unpacks into the run's compile cache; the
#       copy's compiled graphs are kept while the kernel package is the same one (~35 minutes on 2 cores from none).
#       The key holds the CPU the graphs' host code is compiled for: MILI_VIRTUAL_CPU_TARGET, x86-64-v3 unless set,
#       here and in the run `start` begins, so that it matches whatever the machine's CPU is (start notes that CPU)
#   benchmarks/gpu_lease.sh prepare  all of it in one go, in MILI's venv: benchmarks/device_kit.sh --peers (unless
#       .devkit has its parts), a venv at $KIT_DIR/py312 from python3.12 (or $PYTHON312) with numpy, torch, psutil
#       and rich for MAX's worker (the kit's wheels are the machine's Python's, and so is what they import from its
#       image), the kit unpacked into $KIT_DIR, then precompile with MAX_PYTHON (unless set) the kit's max-python
#       under that venv, so that MAX's pipeline compiles too (~45 minutes from none)
# The calls of a 15-minute lease (benchmarks/device_kit.sh --peers prints the parts): `start` in the call that
# carries the site's last part, .modular_cache/mili_kernels and .devkit/graphs.tar.xz, then `wait` with the peers'
# parts, then `wait` again until the run ends. Between two calls the machine stays only ~30 s.
set -uo pipefail
cd "$(dirname "$0")/.."
# the graphs' host code for a portable CPU, here and on the machine alike (bindings/library.py), so that MAX's cache
# keys, which hold the host CPU, match there
export MILI_VIRTUAL_CPU_TARGET=${MILI_VIRTUAL_CPU_TARGET:-x86-64-v3}
kit=${KIT_DIR:-/tmp/mili-kit}
repo=${LEASE_REPO:-/tmp/mili-repo}
logs=${GPU_SESSION_LOGS:-/tmp/mili-gpu}
usage="usage: $0 start SECONDS [STEP...] | wait SECONDS [FOLDER...] | precompile | prepare"
[ $# -ge 2 ] || [[ "${1:-}" =~ ^(precompile|prepare)$ ]] || { echo "$usage" >&2; exit 2; }
verb=$1 seconds=${2:-0}
shift $(($# < 2 ? $# : 2))

copy_checkout() {  # this checkout's files, with its precompiled kernel package, to $repo
  rm -rf "$repo" && mkdir -p "$repo/.modular_cache"
  # only what git tracks or would: a virtualenv in the checkout (CI's .ci-venv) is gigabytes
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf -
  else
    tar -cf - --exclude=./.git --exclude=./.devkit --exclude=./.modular_cache --exclude=./.ci-venv --exclude=./.venv .
  fi | tar -x -C "$repo"
  cp -r .modular_cache/mili_kernels "$repo/.modular_cache/" 2>/dev/null
}

host_cpu() {  # the machine's CPU, for the record: vendor, family, model, name, flags
  awk -F'\t*: ' '/^(vendor_id|cpu family|model|model name|flags)\t/ && !seen[$1]++ {print $1 ": " $2}' /proc/cpuinfo
}

collect() {  # the run's logs and results so far into $OUT
  [ -z "${OUT:-}" ] || benchmarks/gpu_logs_to_out.sh "$logs" "$repo"
}

case $verb in
  start)
    mkdir -p "$logs"
    KIT_DIR=$kit benchmarks/device_unpack.sh --parts-only || exit 1
    copy_checkout
    [ ! -f "${DEVKIT:-.devkit}/graphs.tar.xz" ] || tar -xJf "${DEVKIT:-.devkit}/graphs.tar.xz" -C "$repo/.modular_cache"
    host_cpu >"$logs/host-cpu.log" && grep "^model name" "$logs/host-cpu.log"
    cd "$repo" || exit 1
    env -u OUT KIT_DIR="$kit" GPU_SESSION_LOGS="$logs" SESSION_SECONDS="$seconds" setsid -f bash -c \
      'benchmarks/gpu_session.sh "$@"; echo $? >"$GPU_SESSION_LOGS/session.rc"' gpu_session "$@" \
      >"$logs/session.log" 2>&1 </dev/null
    echo "started: gpu_session.sh ${*:-(its default steps)} for at most $seconds s; log $logs/session.log" ;;
  wait)
    KIT_DIR=$kit benchmarks/device_unpack.sh "${@:-peers}" || echo "the kit's ${*:-peers} did not unpack"
    # a machine that went back between two calls comes again bare: nothing to wait for
    [ -f "$logs/session.log" ] || { echo "no run on this machine (a fresh one?): carry the kit and start again"; exit 1; }
    start=$SECONDS collected=-15
    while [ ! -f "$logs/session.rc" ] && [ $((SECONDS - start)) -lt "$seconds" ]; do
      [ $((SECONDS - collected)) -lt 15 ] || { collect; collected=$SECONDS; }
      sleep 1
    done
    collect
    tail -n 60 "$logs/session.log"
    [ -f "$logs/session.rc" ] && echo "the run ended: rc $(cat "$logs/session.rc")" || echo "the run goes on" ;;
  precompile)
    graphs=$(realpath -m "${DEVKIT:-.devkit}")/graphs.tar.xz
    # graphs compiled before for the same kernel package still hold (a new package changes every key): kept, so that
    # a change to the graphs alone compiles only what changed
    kept=$(mktemp -d)
    ! diff -rq .modular_cache/mili_kernels "$repo/.modular_cache/mili_kernels" >/dev/null 2>&1 ||
      mv "$repo/.modular_cache/.max_cache" "$kept/" 2>/dev/null
    copy_checkout
    [ ! -d "$kept/.max_cache" ] || mv "$kept/.max_cache" "$repo/.modular_cache/"
    rmdir "$kept" 2>/dev/null
    (cd "$repo" && python3 benchmarks/gpu_precompile.py) || exit 1
    mkdir -p "$(dirname "$graphs")" && tar -cJf "$graphs" -C "$repo/.modular_cache" .max_cache && du -sh "$graphs" ;;
  prepare)
    python3 -c "import max, mojo" 2>/dev/null ||
      { echo "prepare runs in MILI's venv (MAX and mojo for the kit)" >&2; exit 1; }
    py312=${PYTHON312:-python3.12}
    "$py312" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null ||
      { echo "prepare needs python3.12 (the machine's Python) for MAX's worker: put it on the PATH or set PYTHON312" >&2
        exit 1; }
    ls .devkit/p*/* >/dev/null 2>&1 || benchmarks/device_kit.sh --peers || exit 1  # it writes .devkit
    [ -x "$kit/py312/bin/python3" ] || "$py312" -m venv "$kit/py312" || exit 1
    # what MAX imports that the device image holds and the kit leaves out
    "$kit/py312/bin/python3" -m pip -q install numpy torch==2.13.0 psutil rich 2>&1 | grep -v "is ignored: it is neither"
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
    # device_unpack.sh checks MAX's import with the kit's Python, as the machine's python3 runs it there
    PATH=$kit/py312/bin:$PATH KIT_DIR=$kit benchmarks/device_unpack.sh site peers || exit 1
    printf '#!/bin/sh\nPATH=%s/py312/bin:$PATH exec %s/max-python "$@"\n' "$kit" "$kit" >"$kit/max-python312"
    chmod +x "$kit/max-python312"
    MAX_PYTHON=${MAX_PYTHON:-$kit/max-python312} bash benchmarks/gpu_lease.sh precompile ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
