#!/usr/bin/env bash
# The GPU suite's results (benchmarks/results/*cuda*.json and gpu-summary.json of CHECKOUT, default: here) copied beside
# its logs in LOGS; with $OUT set (a folder the caller brings back), LOGS packed into $OUT/gpu-suite.tar.gz, replaced
# whole (the caller may stop at any moment), and gpu-summary.json beside it.
# Usage: benchmarks/gpu/collect.sh LOGS [CHECKOUT]
logs=$1 results=${2:-.}/benchmarks/results
cp "$results"/*cuda*.json "$results/gpu-summary.json" "$logs/" 2>/dev/null
[ -n "${OUT:-}" ] || exit 0
tar -czf "$OUT/.gpu-suite.tar.gz" -C "$logs" . && mv "$OUT/.gpu-suite.tar.gz" "$OUT/gpu-suite.tar.gz"
cp "$logs/gpu-summary.json" "$OUT/" 2>/dev/null
exit 0
