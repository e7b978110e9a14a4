#!/usr/bin/env bash
# `mili bench gpu [STEP...]`: everything MILI checks on a GPU host, in one run with a time budget: unpack the bundle
# (benchmarks/gpu/bundle.sh), build, the GPU kernel tests, the model on the GPU against transformers, the kernel
# benchmark against PyTorch's own GPU ops, and end to end against MAX's own Qwen3 pipeline and transformers (then
# benchmarks/results/gpu-summary.json).
# Usage: benchmarks/gpu/suite.sh [STEP...]
#   (default: setup build warm tests e2e profile profile-pdl ncu-attention attention-bench gemv-forms profile-batch1
#    profile-cublas model e2e-rest profile-two-ops e2e-cublas)
#   setup        unpack the bundle's parts (in $BUNDLE_DIR/pN, or copied before to $KIT_DIR/parts), and put its kernel
#                package and graphs into the compile cache where none are there yet
#   build        load the kernel package (the bundle's, precompiled where it was built)
#   warm         in the background, while the tests run: MILI's 0.6B graphs as e2e and profile-two-ops load them
#                (flash attention, one op, then two where profile-two-ops runs), once each: seconds where
#                the bundle's precompiled graphs hold; where they do not, the graphs compile here, not inside the
#                timed steps. Every later step but the tests waits for it
#   tests        tests/gpu: every kernel case on cuda (attention through the flash kernels, the default, with two
#                row tiles a prefill block forced, and through the plain ones), replayed decode steps against
#                op-by-op ones, overlapped against read-at-once ones (where replayed steps fail, e2e times MILI op by
#                op first and skips the profiles; where overlapped ones fail, it times MILI without overlap first);
#                GPU_TESTS_K: only the tests that pytest -k selects by it (e.g. "attention or decode or dependent":
#                the cases of the kernels changed since the last GPU run, when time is short)
#   model        the model on cuda against transformers (tests/integration/test_parity.py -k cuda)
#   bench        the kernel benchmark, bfloat16 and float32 (BENCH_ONLY=attention,rope: only the ops whose name has one)
#   attention-bench  the kernel benchmark's attention rows and the fused q/k norm + RoPE + KV store op, bfloat16
#                (ATTENTION_BENCH_ONLY: only the rows whose name has one, e.g. "attention decode")
#   gemv-forms   a batch-1 decode step's 112 matmuls (Qwen3-0.6B's shapes) in MAX's two forms, x W^T (the model's: its
#                split-K GEMV) and W x^T (its vector GEMV), and through cuBLAS (benchmarks/gpu/gemv_forms.py)
#   e2e          benchmarks/gpu/e2e.py (mili bench engine latency and throughput --device cuda, each system started once
#                for both): MILI against MAX's pipeline (E2E_SYSTEMS, default mili,max; mili-eager or mili-sync
#                in place of mili where the tests step failed replayed or overlapped decode steps), MILI with the plain
#                attention kernels if this run's tests step failed a flash case or E2E_FLASH=0, with one row
#                tile a prefill block if it failed a case with two (MAX_PYTHON: a Python with max[serve], by default
#                the bundle's peers), then the summary
#   e2e-rest     the same for E2E_REST_SYSTEMS (default: MILI without overlap, transformers, MILI without device
#                graphs; less the MILI e2e took), then the summary again: each system's figures from its newest run
#                of this suite
#   e2e-cublas   the same for mili-cublas: MILI with MILI_GPU_VENDOR_BLAS=1 (the model's matmuls through cuBLAS), the
#                end-to-end A/B of profile-cublas; only where e2e's MILI is mili (its graph compiles in the step unless
#                the bundle's precompiled graphs hold)
#   profile      where a decode step's time goes at batch 1 and 64 (benchmarks/engine/decode_profile.py: kernels, device
#                busy time against the step's wall time), with the kernels e2e used
#   profile-pdl  the same with MILI_GPU_PDL=1: the norms, decode attention and its split merge launched with Hopper's
#                programmatic dependent launch (mojo_kernels/utils/dependent_launch.mojo), the A/B of that setting;
#                not where this run's tests step failed tests/gpu/test_dependent_launch.py
#   profile-two-ops  the same with the flash kernels and qk_norm_rope_store and attention as two ops
#                (MILI_GPU_QKV_ATTENTION=0): the A/B of the decode kernel that norms, rotates and stores q, k, v itself
#   profile-cublas  the same with MILI_GPU_VENDOR_BLAS=1: the model's matmuls through cuBLAS (MAX's vendor BLAS), the
#                A/B of MAX's own matmul kernels (at batch 64 they took 1.5 of a step's 3.3 ms on the H200); its graph
#                compiles in the step unless the bundle's precompiled graphs hold
#   profile-batch1  the same with MILI_GPU_BATCH1_GRAPH=1: batch-1 steps on a graph of their own whose matmuls are
#                W x^T (MAX's vector GEMV), the end-to-end A/B of gemv-forms; its graph compiles in the step unless
#                the bundle's precompiled graphs hold
#   ncu-attention  Nsight Compute's counters of MILI's attention kernels and SDPA's on the attention benchmark's
#                prefill of 2,048 tokens and decode at 4,096 keys, batch 1 and 64 (benchmarks/gpu/attention_ncu.py): where
#                the warps stall; the card's clocks left as they are (--clock-control none); a case a run, logs
#                ncu-CASE.log
# SUITE_SECONDS (default 520): no step starts later than that after the start, and each step's time limit is cut
# to what is left. Logs and JSON go to $GPU_SUITE_LOGS (/tmp/mili-gpu), packed at the end into $OUT/gpu-suite.tar.gz
# when $OUT is set, with gpu-summary.json beside it. The bundle unpacks into $KIT_DIR (/tmp/mili-kit).
# benchmarks/gpu/background.sh runs it in the background, for hosts reached through commands with a time limit.
set -uo pipefail
if [[ " $* " =~ " "(-h|--help)" " ]]; then  # the header above, as the usage
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | cut -c3-
  exit 0
fi
cd "$(dirname "$0")/../.."
log_dir=${GPU_SUITE_LOGS:-/tmp/mili-gpu}
kit=${KIT_DIR:-/tmp/mili-kit}
mkdir -p "$log_dir" "$kit/parts"
budget=${SUITE_SECONDS:-520}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$kit/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
default_steps="setup build warm tests e2e profile profile-pdl ncu-attention attention-bench gemv-forms profile-batch1
  profile-cublas model e2e-rest profile-two-ops e2e-cublas"
steps=$(echo ${*:-$default_steps})
# pytest-xdist (on the image): one op (and dtype) per worker, so each graph compiles once and in parallel; without it,
# pyproject's -n goes (tests/gpu has no slow tests, and no slow test of test_parity.py runs on cuda)
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12 --dist loadgroup" || echo "-o addopts=")
status=0
summary=()

run() {  # run NAME LIMIT COMMAND...: log to $log_dir/NAME.log; skipped when the suite's time is spent
  local name=$1 limit=$2; shift 2
  local left=$((budget - SECONDS))
  if [ $left -lt 20 ]; then
    summary+=("$name: not run (the suite's time is spent)"); status=1; return
  fi
  [ "$limit" -le $left ] || limit=$left
  echo "== $name (at most $limit s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" >"$log_dir/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$log_dir/$name.log"
  summary+=("$name: rc=$rc in $((SECONDS - start)) s")
  [ $rc -eq 0 ] || status=1
}

warm_pid=
warm() {  # warm: e2e's MILI graph, then profile-two-ops' where that step runs, each loaded once, in the background
  if [ $((budget - SECONDS)) -lt 20 ]; then summary+=("warm: not run (the suite's time is spent)"); return; fi
  echo "== warm (in the background)"
  local load='from benchmarks.common import model_path; from benchmarks.gpu.systems import load_mili
load_mili(model_path(None), "cuda")'
  local variants=1
  [[ " $steps " != *" profile-two-ops "* ]] || variants="1 0"
  warm_started=$SECONDS
  (for qkv in $variants; do
     left=$((budget - SECONDS))
     [ $left -ge 5 ] || exit 124
     MILI_GPU_FLASH_ATTENTION=1 MILI_GPU_QKV_ATTENTION=$qkv timeout "$left" python3 -c "$load" || exit
   done) >"$log_dir/warm.log" 2>&1 &
  warm_pid=$!
}

join_warm() {  # waits for warm's graphs (none to wait for unless it runs); the summary says how long each load took
  [ -n "$warm_pid" ] || return 0
  wait "$warm_pid"
  local rc=$? loads
  loads=$(awk '/loaded its graph in/ {printf "%s%s s", n++ ? ", " : "", $(NF - 1)}' "$log_dir/warm.log")
  summary+=("warm: rc=$rc in $((SECONDS - warm_started)) s (graphs loaded in ${loads:-none})")
  [ $rc -eq 0 ] || { status=1; tail -n 15 "$log_dir/warm.log"; }
  warm_pid=
}

failed() {  # failed PATTERN: this run's tests step failed (or could not set up) a test whose id starts so
  grep -Eq "^(FAILED|ERROR) tests/gpu/$1" "$log_dir/tests.log" 2>/dev/null
}

mili_system() {  # MILI as e2e times it first: mili (decode steps replayed, overlapped), or where this run's tests
  # step failed a test of replayed steps mili-eager (op by op), of overlapped ones mili-sync (read at once)
  if failed "test_decode_graphs.py::test_replay"; then echo mili-eager
  elif failed "test_decode_graphs.py::test_(overlapped|steps_behind)"; then echo mili-sync
  else echo mili
  fi
}

e2e_kernels() {  # for e2e and profile: flash=1 (the flash kernels), 0 where this run's tests step failed a flash
  # kernel case of attention (then they time the plain ones, and the two ops apart; E2E_FLASH chooses); unless set
  # already, MILI_GPU_QKV_ATTENTION=0 (the flash kernels, the two ops apart) where it failed a case of the one-op
  # attention, and MILI_GPU_PREFILL_PAIRS=0 (one row tile a prefill block) where it failed a case of the prefill
  # kernel with two
  if [ -n "${E2E_FLASH:-}" ]; then flash=$E2E_FLASH
  elif failed "test_gpu_ops.py::test_op_matches_reference_on_gpu\[attention"; then flash=0
  else flash=1
  fi
  if [ -z "${MILI_GPU_QKV_ATTENTION:-}" ] && failed "test_gpu_ops.py::test_op_matches_reference_on_gpu\[qkv_attention"
  then export MILI_GPU_QKV_ATTENTION=0
  fi
  if [ -z "${MILI_GPU_PREFILL_PAIRS:-}" ] && failed "test_gpu_ops.py::test_flash_prefill_with_two_row_tiles_a_block"
  then export MILI_GPU_PREFILL_PAIRS=0
  fi
}

e2e() {  # e2e SYSTEMS: the latency and throughput figures of those systems, each started once for both, in a
  # process of its own (on the H200 MAX's pipeline found no GPU memory left beside MILI's, in the same process)
  local max_python=${MAX_PYTHON:-$([ -x "$kit/max-python" ] && echo "$kit/max-python")} system
  for system in ${1//,/ }; do
    MILI_GPU_FLASH_ATTENTION=$flash run "e2e-$system" 900 python3 -m benchmarks.gpu.e2e --device cuda \
      --systems "$system" --max-python "$max_python"
  done
  run summary 60 python3 -m benchmarks.gpu.summary --commit "$(cat "${BUNDLE_DIR:-gpu-bundle}/commit" 2>/dev/null)" --since "$started"
}

profile_decode() {  # profile_decode NAME [LIMIT]: where a decode step's time goes at batch 1 and 64, the steps run
  # as e2e's first MILI runs them, within LIMIT seconds (150: its graph loaded by warm)
  local mili; mili=$(mili_system)
  if [ "$mili" = mili-eager ]; then summary+=("$1: not run (replayed decode steps failed their tests)"); return; fi
  MILI_GPU_FLASH_ATTENTION=$flash run "$1" "${2:-150}" python3 -m benchmarks.engine.decode_profile --device cuda \
    --batches 1,64 $([ "$mili" = mili-sync ] && echo --no-overlap)
}

ncu_attention() {  # Nsight Compute over benchmarks/gpu/attention_ncu.py's launches, a case a run (ncu prints its report
  # when the program ends: a run cut at its limit loses only its case), logs ncu-CASE.log; MAX's pool at 4% of the
  # GPU, since ncu saves and restores the device's memory around each of its passes over a kernel
  local ncu
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
  if [ -z "$ncu" ]; then summary+=("ncu-attention: not run (no ncu on this machine)"); status=1; return; fi
  local args=(--nvtx --clock-control none --kernel-name "regex:attention|flash|mha") section case
  for section in SpeedOfLight Occupancy LaunchStats WarpStateStats SchedulerStats MemoryWorkloadAnalysis \
                 ComputeWorkloadAnalysis SourceCounters; do
    args+=(--section "$section")
  done
  for case in "prefill ctx=2048 B=1" "decode ctx=4096 B=64" "decode ctx=4096 B=1"; do
    MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT=4 MILI_GPU_FLASH_ATTENTION=$flash \
      run "ncu-$(echo "${case% B=*}-b${case#* B=}" | tr ' =' '-')" 120 \
      "$ncu" "${args[@]}" python3 -m benchmarks.gpu.attention_ncu --device cuda --cases "attention $case"
  done
}

started=$(date +%Y%m%d-%H%M%S)
export KIT_DIR=$kit
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
for step in $steps; do
  [ "$step" = tests ] || join_warm  # no step is timed, nor compiles those graphs again, while warm runs
  case $step in
    setup) run setup 120 benchmarks/gpu/unpack.sh ;;
    build) run build 300 python3 -c "from bindings import library; print(library.package_path())" ;;
    warm) warm ;;
    tests) run tests 300 python3 -m pytest -q -p no:cacheprovider $xdist ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} tests/gpu ;;
    model) run model 300 python3 -m pytest -q -p no:cacheprovider $xdist tests/integration/test_parity.py -k cuda ;;
    bench) for dtype in bfloat16 float32; do
             run "bench-$dtype" 300 python3 -m benchmarks.kernels.run --device cuda --dtype "$dtype" --only "${BENCH_ONLY:-}"
           done ;;
    attention-bench) run attention-bench 300 python3 -m benchmarks.kernels.run --device cuda --dtype bfloat16 \
                       --only "${ATTENTION_BENCH_ONLY:-attention,qk_norm_rope_store}" ;;
    gemv-forms) run gemv-forms 120 python3 -m benchmarks.gpu.gemv_forms --device cuda ;;
    e2e) e2e_kernels
         summary+=("e2e: MILI's attention kernels $([ "$flash" = 1 ] && echo flash || echo plain)${MILI_GPU_QKV_ATTENTION:+,\
 MILI_GPU_QKV_ATTENTION=$MILI_GPU_QKV_ATTENTION}${MILI_GPU_PREFILL_PAIRS:+, MILI_GPU_PREFILL_PAIRS=$MILI_GPU_PREFILL_PAIRS}")
         e2e "${E2E_SYSTEMS:-$(mili_system),max}" ;;  # MILI against MAX first
    e2e-cublas) e2e_kernels
                if [ "$(mili_system)" = mili ]; then MILI_GPU_VENDOR_BLAS=1 e2e mili-cublas
                else summary+=("e2e-cublas: not run (e2e's MILI is $(mili_system))")
                fi ;;
    e2e-rest) e2e_kernels
              rest=$(echo mili-sync,transformers,mili-eager | tr , '\n' | grep -vx "$(mili_system)" | paste -sd,)
              e2e "${E2E_REST_SYSTEMS:-$rest}" ;;
    profile) e2e_kernels
             profile_decode profile ;;
    profile-pdl) e2e_kernels
                 if failed "test_dependent_launch.py"; then
                   summary+=("profile-pdl: not run (PDL launches failed their test)")
                 else MILI_GPU_PDL=1 profile_decode profile-pdl
                 fi ;;
    profile-cublas) e2e_kernels
                    MILI_GPU_VENDOR_BLAS=1 profile_decode profile-cublas 420 ;;
    profile-batch1) e2e_kernels
                    MILI_GPU_BATCH1_GRAPH=1 profile_decode profile-batch1 420 ;;
    ncu-attention) e2e_kernels
                   ncu_attention ;;
    profile-two-ops) e2e_kernels
                     if [ "$flash" = 1 ] && [ "${MILI_GPU_QKV_ATTENTION:-}" != 0 ]; then
                       MILI_GPU_QKV_ATTENTION=0 profile_decode profile-two-ops
                     else summary+=("profile-two-ops: not run (e2e did not take the one-op flash attention)")
                     fi ;;
    *) summary+=("$step: unknown step"); status=1 ;;
  esac
done
join_warm
# MAX's compiled graphs at the end, to set beside the bundle's graphs.tar.xz: a name only here was compiled on the host
ls -l "${MODULAR_CACHE_DIR:-.modular_cache}"/.max_cache/mof/mef/*/ >"$log_dir/max-cache.log" 2>&1
benchmarks/gpu/collect.sh "$log_dir"
printf '%s\n' "${summary[@]}"
exit $status
