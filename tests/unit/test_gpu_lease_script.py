"""benchmarks/gpu_lease.sh, checked on a CPU: `start` returns at once and leaves gpu_session.sh running in a copy
of the checkout, `wait` brings its logs back into $OUT and says when it ended."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_lease.sh"


def _lease(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(tmp_path / "out"), KIT_DIR=str(tmp_path / "kit"), DEVKIT=str(tmp_path / "devkit"),
               GPU_SESSION_LOGS=str(tmp_path / "logs"), LEASE_REPO=str(tmp_path / "repo"), MILI_COMMIT="abc1234")
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def _stand_in_checkout(tmp_path: Path) -> Path:
    """A checkout with the lease's scripts alone (start copies the kit's parts by device_unpack.sh)."""
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    for script in (SCRIPT, SCRIPT.parent / "device_unpack.sh"):
        shutil.copy(script, checkout / "benchmarks")
    return checkout


def test_start_returns_at_once_and_wait_brings_back_the_runs_logs(tmp_path: Path) -> None:
    began = time.monotonic()
    started = _lease(tmp_path, "start", "100", "no-such-step")
    assert started.returncode == 0, started.stderr
    assert "started: gpu_session.sh no-such-step for at most 100 s" in started.stdout
    assert (tmp_path / "repo" / "benchmarks" / "gpu_session.sh").is_file()  # the run's own copy of the checkout
    assert not (tmp_path / "repo" / ".git").exists()
    waited = _lease(tmp_path, "wait", "60")
    assert time.monotonic() - began < 60  # ended by the run's end, not by the wait's limit
    assert "no-such-step: unknown step" in waited.stdout
    assert "the run ended: rc 1" in waited.stdout
    with tarfile.open(tmp_path / "out" / "gpu-session.tar.gz") as tar:
        assert {"./session.log", "./session.rc"} <= set(tar.getnames())


def test_start_copies_what_git_would_track_and_no_virtualenv(tmp_path: Path) -> None:
    """CI's virtualenv lives in the checkout, ignored: copied, its gigabytes once filled CI's disk."""
    checkout = _stand_in_checkout(tmp_path)
    (checkout / ".gitignore").write_text(".ci-venv/\n")
    (checkout / ".ci-venv" / "lib").mkdir(parents=True)
    (checkout / ".ci-venv" / "lib" / "torch.so").write_text("big")
    for args in (["init", "-q"], ["add", ".gitignore", "benchmarks"]):
        subprocess.run(["git", *args], cwd=checkout, check=True)
    (checkout / "untracked.py").write_text("new work")
    env = dict(os.environ, KIT_DIR=str(tmp_path / "kit"), GPU_SESSION_LOGS=str(tmp_path / "logs"),
               LEASE_REPO=str(tmp_path / "repo"), DEVKIT=str(tmp_path / "devkit"))
    env.pop("OUT", None)
    started = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu_lease.sh"), "start", "0", "no-such-step"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    copied = {str(path.relative_to(tmp_path / "repo")) for path in (tmp_path / "repo").rglob("*") if path.is_file()}
    assert {".gitignore", "benchmarks/gpu_lease.sh", "untracked.py"} <= copied
    assert not any(path.startswith((".ci-venv", ".git/")) for path in copied)


def test_wait_stops_at_its_limit_while_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "session.log").write_text("== tests (at most 300 s)\n")
    waited = _lease(tmp_path, "wait", "2")
    assert "the run goes on" in waited.stdout
    assert (tmp_path / "out" / "gpu-session.tar.gz").is_file()


def test_wait_on_a_machine_without_a_run_returns_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    waited = _lease(tmp_path, "wait", "60")
    assert waited.returncode == 1 and "no run on this machine" in waited.stdout
    assert time.monotonic() - began < 30


def test_usage_errors_name_the_verbs(tmp_path: Path) -> None:
    result = _lease(tmp_path, "begin", "10")
    assert result.returncode == 2 and "usage:" in result.stderr and "start SECONDS" in result.stderr


def test_precompile_keeps_the_graphs_of_the_same_kernel_package(tmp_path: Path) -> None:
    """A stand-in checkout whose python3 'compiles' one graph a run into the copy's cache and says what it found."""
    checkout = _stand_in_checkout(tmp_path)
    package = checkout / ".modular_cache" / "mili_kernels" / "digest1"
    package.mkdir(parents=True)
    (package / "mili.mojopkg").write_text("1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/bash\nmkdir -p .modular_cache/.max_cache\n'
                                     'echo "found: $(ls .modular_cache/.max_cache | tr "\\n" " ")'
                                     ' for $MILI_VIRTUAL_CPU_TARGET"\n'
                                     'touch .modular_cache/.max_cache/graph-$(date +%s%N)\n')
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", LEASE_REPO=str(tmp_path / "repo"),
               DEVKIT=str(tmp_path / "devkit"))

    def precompile() -> tuple[str, list[str]]:
        run = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu_lease.sh"), "precompile"], cwd=checkout,
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        with tarfile.open(tmp_path / "devkit" / "graphs.tar.xz") as tar:
            packed = sorted(n for n in tar.getnames() if "graph-" in n)
        found, target = run.stdout.splitlines()[0].removeprefix("found:").split(" for ")
        assert target == "x86-64-v3"  # the portable CPU gpu_lease.sh compiles the graphs' host code for
        return found.split(), packed

    found, packed = precompile()
    assert found == [] and len(packed) == 1
    found, packed = precompile()  # the same package: the first graph is kept, and packed with the second
    assert found == [Path(packed[0]).name] and len(packed) == 2
    package.rename(package.with_name("digest2"))  # a new package: every graph compiles again
    found, packed = precompile()
    assert found == [] and len(packed) == 1


def test_start_notes_the_machines_cpu(tmp_path: Path) -> None:
    """For the record: MAX's compile-cache keys hold the CPU that graphs' host code is compiled for, which the lease
    sets to a portable one (test_precompile_keeps_the_graphs_of_the_same_kernel_package checks it)."""
    started = _lease(tmp_path, "start", "0", "no-such-step")
    assert started.stdout.startswith("model name: ")
    fields = [line.split(":")[0] for line in (tmp_path / "logs" / "host-cpu.log").read_text().splitlines()]
    assert fields == ["vendor_id", "cpu family", "model", "model name", "flags"]


def test_prepare_says_what_it_needs_before_building_anything(tmp_path: Path) -> None:
    """Outside MILI's venv (no MAX, no mojo to pack the kit with) or with no python3.12 (the machine's Python, for
    MAX's worker), prepare stops at once with what is missing, and builds nothing."""
    checkout = _stand_in_checkout(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))  # all the script runs before its checks
    env = dict(os.environ, PATH=str(bin_dir), KIT_DIR=str(tmp_path / "kit"))
    env.pop("PYTHON312", None)
    python3 = bin_dir / "python3"

    def prepare() -> subprocess.CompletedProcess:
        script = checkout / "benchmarks" / "gpu_lease.sh"
        return subprocess.run([shutil.which("bash"), str(script), "prepare"], cwd=checkout,
                              env=env, capture_output=True, text=True, timeout=60)

    python3.write_text("#!/bin/sh\nexit 1\n")  # MAX does not import
    python3.chmod(0o755)
    outside = prepare()
    assert outside.returncode == 1 and "prepare runs in MILI's venv" in outside.stderr
    python3.write_text("#!/bin/sh\nexit 0\n")  # MAX imports, and no python3.12 is on the PATH
    without_312 = prepare()
    assert without_312.returncode == 1 and "needs python3.12" in without_312.stderr
    assert not (checkout / ".devkit").exists() and not (tmp_path / "kit").exists()
