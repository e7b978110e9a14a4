#!/usr/bin/env bash
# Copies the checkout this script is in to REPO (replaced whole), with an empty .modular_cache: what git tracks or
# would (a virtualenv in the checkout, CI's .ci-venv, is gigabytes), or, outside git, everything but the caches.
# The GPU suite runs from such a copy at a fixed path: MAX's compile-cache keys hold the kernel package's path.
# Usage: benchmarks/gpu/copy_checkout.sh REPO
set -euo pipefail
repo=$1
cd "$(dirname "$0")/../.."
rm -rf "$repo" && mkdir -p "$repo/.modular_cache"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf -
else
  tar -cf - --exclude=./.git --exclude=./gpu-bundle --exclude=./.modular_cache --exclude=./.ci-venv --exclude=./.venv .
fi | tar -x -C "$repo"
