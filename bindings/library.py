"""Builds and loads MILI's Mojo kernel package, keeps MAX's compile cache project-local, maps devices."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

REPO_ROOT = Path(__file__).resolve().parents[1]


def _default_cache_root() -> Path:
    # a source checkout keeps its caches beside the code; an installed package uses MILI's cache dir
    if (REPO_ROOT / "pyproject.toml").is_file():
        return REPO_ROOT
    return Path(os.environ.get("MILI_CACHE_DIR", Path.home() / ".cache" / "mili"))


# MAX reads this when it starts: it must be set before `max` is imported anywhere.
os.environ.setdefault("MODULAR_CACHE_DIR", str(_default_cache_root() / ".modular_cache"))

VIRTUAL_CPU_TARGET = "MILI_VIRTUAL_CPU_TARGET"
"""A portable CPU (x86-64-v3, say) that graphs' host code is compiled for instead of this host's CPU
(max.driver.set_virtual_cpu_target): MAX's compile-cache keys hold the host CPU, GPU graphs' included, so a cache
compiled elsewhere (benchmarks/gpu/bundle.sh) holds here only with the same setting. Unset: this host's
CPU (CPU kernels need it to be fast)."""
PORTABLE_CPUS = {"x86_64": ("generic", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"), "aarch64": ("generic",)}


AMX_CPU = "sapphirerapids"
AMX_FLAGS = {"amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16"}


def amx_cpu_target(cpuinfo: str) -> str:
    """AMX_CPU where /proc/cpuinfo's flags hold AMX_FLAGS (the first Xeon with them all), else "" (the host's CPU).
    MAX and mojo compile for the CPU that LLVM names from the model number, with that model's features only, and a
    virtual machine may report an older model than its CPU (a Xeon with AMX reporting Rocket Lake's): named, AMX
    and AVX512_BF16 are used (linear_amx.mojo)."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return AMX_CPU if AMX_FLAGS <= set(flags) else ""


def _host_cpu_target() -> str:
    if platform.machine() != "x86_64":
        return ""
    try:
        return amx_cpu_target(Path("/proc/cpuinfo").read_text())
    except OSError:
        return ""


def _apply_virtual_cpu_target() -> str:
    """Sets VIRTUAL_CPU_TARGET's CPU in MAX, before any device exists (its compile target latches then); unset, the
    host's CPU as amx_cpu_target names it. Returns the CPU set ("": the host's as LLVM names it). MAX takes any name
    there and fails only when it compiles (LLVM aborts the process on an unknown one), so the name is checked here."""
    cpu = os.environ.get(VIRTUAL_CPU_TARGET, "")
    if cpu:
        allowed = PORTABLE_CPUS.get(platform.machine(), ("generic",))
        if cpu not in allowed:
            raise ValueError(f"{VIRTUAL_CPU_TARGET}={cpu!r} is not a portable CPU target: set one of "
                             f"{', '.join(allowed)} (the hosts that load the compile cache must have it), or unset "
                             "it to compile for this host's CPU")
    else:
        cpu = _host_cpu_target()
    if cpu:
        from max import driver

        driver.set_virtual_cpu_target(cpu)
    return cpu


CPU_TARGET = _apply_virtual_cpu_target()
"""The CPU that graphs' host code and the CPU extension module are compiled for ("": the host's)."""
AMX_TILES = CPU_TARGET == AMX_CPU
"""Whether the CPU kernels are compiled for AMX tiles (4-bit linears of many rows multiply differently there:
reference.linear_int4's amx)."""


def kernels_dir() -> Path:
    """The Mojo sources (`mojo_kernels/`), in the checkout or in the installed package."""
    import mojo_kernels

    return Path(next(iter(mojo_kernels.__path__)))


def _sources_digest(src: Path, pattern: str = "*.mojo") -> str:
    h = hashlib.sha256()
    for path in sorted(src.rglob(pattern)):
        h.update(str(path.relative_to(src)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _mojo() -> str:
    exe = Path(sys.executable).parent / "mojo"
    found = str(exe) if exe.is_file() else shutil.which("mojo")
    if found is None:
        raise RuntimeError(
            "The `mojo` compiler is not installed: pip install 'mojo==1.2.0' (it comes with MILI's "
            "dependencies), or build the kernel package where it is and copy .modular_cache/mili_kernels "
            "here (benchmarks/device_kit.sh)"
        )
    return found


def _build(out: Path, command: list[str]) -> Path:
    """Runs `command + [-o tmp]` unless `out` exists, then moves tmp to `out` (atomic for concurrent builders)."""
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f"building-{os.getpid()}-{threading.get_ident()}" / out.name  # the name: package / module
        tmp.parent.mkdir(exist_ok=True)
        result = subprocess.run([_mojo(), *command, "-o", str(tmp)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"Building the Mojo kernels failed:\n{result.stdout}\n{result.stderr}")
        tmp.replace(out)
        tmp.parent.rmdir()
    return out


@lru_cache(maxsize=1)
def package_path() -> Path:
    """The precompiled kernel package (.mojoc), rebuilt when any Mojo source changed."""
    src = kernels_dir()
    # MAX imports the package by its file name, so the digest goes into the folder name
    out = Path(os.environ["MODULAR_CACHE_DIR"]) / "mili_kernels" / _sources_digest(src) / "mili_kernels.mojoc"
    return _build(out, ["precompile", str(src)])


@lru_cache(maxsize=1)
def eager_cpu_module():
    """The CPU kernels as a Python extension module (bindings/eager/eager_cpu.mojo), built when stale."""
    import importlib.machinery
    import importlib.util

    source = Path(__file__).parent / "eager" / "eager_cpu.mojo"
    key = _sources_digest(kernels_dir()) + source.read_text() + CPU_TARGET
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    out = Path(os.environ["MODULAR_CACHE_DIR"]) / "mili_eager_cpu" / digest / "mili_eager_cpu.so"
    target = ["--target-cpu", CPU_TARGET] if CPU_TARGET else []
    _build(out, ["build", "--emit", "shared-lib", *target, "-I", str(kernels_dir().parent), str(source)])
    loader = importlib.machinery.ExtensionFileLoader("mili_eager_cpu", str(out))
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("mili_eager_cpu", out, loader=loader)
    )
    loader.exec_module(module)
    return module


@lru_cache(maxsize=1)
def _openmp_functions():
    import ctypes

    import torch  # noqa: F401  (loads torch's OpenMP runtime into the global namespace)

    process = ctypes.CDLL(None)
    try:
        return (ctypes.c_void_p * 3)(*[ctypes.cast(getattr(process, name), ctypes.c_void_p).value
                                       for name in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")])
    except AttributeError:
        return None


def openmp_entry_points() -> int:
    """The address of [GOMP_parallel, omp_get_thread_num, omp_get_num_threads] of the OpenMP runtime torch
    loaded (mojo_kernels/utils/parallel.mojo OpenMPEntryPoints; LLVM's and Intel's runtimes export these names
    too), or 0 when there is none: the eager CPU kernels then use Mojo's threads."""
    import ctypes

    functions = _openmp_functions()
    return 0 if functions is None else ctypes.addressof(functions)


@lru_cache(maxsize=1)
def kernel_library():
    from max.graph import KernelLibrary

    library = KernelLibrary()
    library.load_paths([package_path()])
    return library


@lru_cache(maxsize=None)
def session(device_key: str, vendor_blas: bool = False):
    """One MAX inference session per device ("cpu", "cuda:0", ...) and matmul choice: with vendor_blas, on a GPU,
    MAX's matmuls call cuBLAS (the model graph's choice, GpuOptions.vendor_blas); a CPU session runs MAX's own."""
    from max.engine import InferenceSession

    session = InferenceSession(devices=[max_device(device_key)])
    if vendor_blas and device_key != "cpu":
        session._use_vendor_blas("1")
    return session


RUNTIME_TIMER_SLACK_NS = 20_000_000
"""The timer slack MAX's CPU runtime threads get (runtime_timer_slack): 20 ms."""
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


@contextmanager
def runtime_timer_slack() -> Iterator[None]:
    """Threads started inside (Linux) get RUNTIME_TIMER_SLACK_NS of timer slack, which new threads inherit from the
    thread that starts them; this thread's own comes back after. A CPU session's first execute starts a thread that
    waits on a condition variable ~100 µs at a time, ~5,000 wake-ups a second, each taking a core from a worker
    (a batch-1 int4 decode step of Qwen3-0.6B on 2 cores: 1.1-1.35x faster with it woken at most every 20 ms, and no
    later start of a graph after idling)."""
    if sys.platform != "linux":
        yield
        return
    import ctypes

    libc = ctypes.CDLL(None)
    own = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    libc.prctl(_PR_SET_TIMERSLACK, RUNTIME_TIMER_SLACK_NS, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_TIMERSLACK, own, 0, 0, 0)


def max_device(device_key: str):
    from max.driver import CPU, Accelerator

    if device_key == "cpu":
        return CPU()
    if device_key.startswith("cuda"):
        return Accelerator(int(device_key.split(":")[1]) if ":" in device_key else 0)
    raise ValueError(f"device {device_key!r} is not supported: use 'cpu' or 'cuda[:N]'")


def device_ref(device_key: str):
    """The graph-side device of "cpu" / "cuda:N"."""
    from max.graph import DeviceRef

    return DeviceRef.CPU() if device_key == "cpu" else DeviceRef.GPU(int(device_key.split(":")[1]))


def device_key(device) -> str:
    """'cpu' or 'cuda:N' for a torch device."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise ValueError(f"device {device} is not supported by the Mojo kernels: use cpu or cuda")
