#!/usr/bin/env bash
# A GPU run's results (benchmarks/results/*cuda*.json and gpu-summary.json of CHECKOUT, default: here) copied beside
# its logs in LOGS; with $OUT set (the device tool brings back what is there), LOGS packed into
# $OUT/gpu-session.tar.gz, replaced whole (a call can end at any moment), and gpu-summary.json beside it.
# Usage: benchmarks/gpu_logs_to_out.sh LOGS [CHECKOUT]
logs=$1 results=${2:-.}/benchmarks/results
cp "$results"/*cuda*.json "$results/gpu-summary.json" "$logs/" 2>/dev/null
[ -n "${OUT:-}" ] || exit 0
tar -czf "$OUT/.gpu-session.tar.gz" -C "$logs" . && mv "$OUT/.gpu-session.tar.gz" "$OUT/gpu-session.tar.gz"
cp "$logs/gpu-summary.json" "$OUT/" 2>/dev/null
exit 0
