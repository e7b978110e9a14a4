#!/usr/bin/env bash
# Checks the Mojo/MAX toolchain, precompiles the kernel package (mojo_kernels/ -> .mojoc, rebuilt when a
# source changes), builds the CPU kernels' Python extension module (bindings/eager_cpu.mojo) and compiles
# every op's GPU path for cuda/sm_90 in MAX's virtual-device mode (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")"
python - <<'PY'
import importlib.metadata as md, sys
want = {"max": "26.7.0", "mojo": "1.2.0"}
have = {name: md.version(name) for name in want}
bad = {n: v for n, v in have.items() if v != want[n]}
if bad:
    sys.exit(f"toolchain mismatch: need {want}, found {have} (pip install -e . installs the right ones)")
print("toolchain:", ", ".join(f"{n} {v}" for n, v in have.items()))
PY
python -c "from bindings import library; print('kernel package:', library.package_path())"
python -c "from bindings import library; print('CPU extension module:', library.eager_cpu_module().__file__)"
python -m bindings.gpu_compile_check "${GPU_ARCH:-sm_90}"
