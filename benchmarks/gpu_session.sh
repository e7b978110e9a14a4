#!/usr/bin/env bash
# Everything MILI checks on a GPU machine, in one run: build, the GPU kernel tests, the model on the GPU against
# transformers, the kernel benchmark against PyTorch's own GPU ops, and end to end against MAX's own Qwen3 pipeline
# and transformers (then benchmarks/results/gpu-summary.json). Logs and JSON go to $OUT (default /tmp/mili-gpu).
# Needs MAX/Mojo importable (on an offline box: ./offline_wheelhouse.sh, see README).
# Usage: benchmarks/gpu_session.sh [STEP...]   steps: build tests model bench e2e (default: all, in that order), and
#   flash: the parity and device-graph tests and the attention benchmark again with the split-KV decode and
#   FlashAttention-2 kernels (MILI_GPU_FLASH_ATTENTION=1, opt-in until they pass on a GPU; `tests` covers their
#   kernel cases)
#   BENCH_ONLY=attention benchmarks/gpu_session.sh bench   benchmarks only the ops whose name contains that
#   MAX_PYTHON=/path/to/python (a Python with max[serve]) for MAX's pipeline in e2e; E2E_SYSTEMS to pick systems
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/mili-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
steps=${*:-build tests model bench e2e}
# pytest-xdist, where installed: one op (and dtype) per worker, so each graph compiles once and in parallel
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8 --dist loadgroup")
status=0
run() {  # run NAME TIMEOUT COMMAND...: log to $out/NAME.log, keep going after a failure
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "== $name: rc=$rc in $((SECONDS - start)) s"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
for step in $steps; do
  case $step in
    build) run build 600 python3 -c "from bindings import library; print(library.package_path())" ;;
    tests) run tests 900 python3 -m pytest -q -p no:cacheprovider $xdist tests/gpu ;;
    model) run model 900 python3 -m pytest -q -p no:cacheprovider $xdist tests/integration/test_parity.py -k cuda ;;
    bench) for dtype in bfloat16 float32; do
             run "bench-$dtype" 900 python3 benchmarks/kernels.py --device cuda --dtype "$dtype" --only "${BENCH_ONLY:-}"
             cp benchmarks/results/kernels-cuda-"$dtype"-*.json "$out/" 2>/dev/null
           done ;;
    flash) export MILI_GPU_FLASH_ATTENTION=1
             run flash-tests 900 python3 -m pytest -q -p no:cacheprovider $xdist tests/gpu/test_decode_graphs.py
             run flash-model 900 python3 -m pytest -q -p no:cacheprovider $xdist tests/integration/test_parity.py -k cuda
             run flash-bench 900 python3 benchmarks/kernels.py --device cuda --dtype bfloat16 --only attention
             cp benchmarks/results/kernels-cuda-bfloat16-*.json "$out/" 2>/dev/null
             unset MILI_GPU_FLASH_ATTENTION ;;
    e2e) systems=${E2E_SYSTEMS:-mili,mili-eager,transformers,max}
         run latency 1200 python3 benchmarks/latency.py --device cuda --systems "$systems" --max-python "${MAX_PYTHON:-}"
         run throughput 1800 python3 benchmarks/throughput.py --device cuda --systems "$systems" --max-python "${MAX_PYTHON:-}"
         run summary 60 python3 benchmarks/gpu_summary.py
         cp benchmarks/results/latency-cuda*.json benchmarks/results/throughput-cuda*.json benchmarks/results/gpu-summary.json "$out/" 2>/dev/null ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
