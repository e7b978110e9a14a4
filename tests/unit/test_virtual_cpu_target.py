"""MILI_VIRTUAL_CPU_TARGET (bindings/library.py): the CPU that MAX compiles graphs' host code for, so that a compile
cache holds on another host; checked before MAX sees it (MAX takes any name and LLVM aborts on an unknown one)."""

from __future__ import annotations

import os
import subprocess
import sys

from bindings import library


def _import_library(value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MILI_VIRTUAL_CPU_TARGET=value)
    probe = "from bindings import library; from max import driver; print(repr(driver.get_virtual_cpu_target()))"
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          cwd=library.REPO_ROOT, timeout=120)


def test_a_portable_cpu_reaches_max_and_unset_keeps_the_hosts() -> None:
    assert _import_library("x86-64-v3").stdout.strip() == "'x86-64-v3'"
    assert _import_library("").stdout.strip() == repr(library._host_cpu_target())


def test_a_cpu_with_amx_is_named_for_it_whatever_model_it_reports() -> None:
    amx = "avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8"
    assert library.amx_cpu_target(f"processor\t: 0\nmodel\t\t: 167\nflags\t\t: fpu sse2 {amx}\n") == "sapphirerapids"
    assert library.amx_cpu_target("flags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni\n") == ""  # Zen 4
    assert library.amx_cpu_target("flags\t\t: fpu sse2 amx_tile amx_int8\n") == ""  # no AMX-BF16
    assert library.amx_cpu_target("") == ""


def test_a_cpu_that_is_not_portable_is_refused_with_what_to_set() -> None:
    for value in ("native", "znver4x"):
        result = _import_library(value)
        assert result.returncode != 0
        assert f"MILI_VIRTUAL_CPU_TARGET='{value}' is not a portable CPU target" in result.stderr
        assert "x86-64-v3" in result.stderr and "or unset it" in result.stderr
