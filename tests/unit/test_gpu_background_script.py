"""benchmarks/gpu/background.sh, checked on a CPU: `start` returns at once and leaves the GPU suite running in a copy
of the checkout, `wait` brings its logs back into $OUT and says when it ended. And benchmarks/gpu/bundle.sh's graphs:
those of the same kernel package are kept, and it says what it lacks before building anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "background.sh"
BUNDLE = SCRIPT.parent / "bundle.sh"


def _background(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        OUT=str(tmp_path / "out"),
        KIT_DIR=str(tmp_path / "kit"),
        BUNDLE_DIR=str(tmp_path / "bundle"),
        GPU_SUITE_LOGS=str(tmp_path / "logs"),
        SUITE_REPO=str(tmp_path / "repo"),
    )
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def _stand_in_checkout(tmp_path: Path) -> Path:
    """A checkout with the GPU scripts alone (start copies the bundle's parts by unpack.sh)."""
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks" / "gpu").mkdir(parents=True)
    for script in (SCRIPT, BUNDLE, SCRIPT.parent / "unpack.sh", SCRIPT.parent / "copy_checkout.sh"):
        shutil.copy(script, checkout / "benchmarks" / "gpu")
    return checkout


def test_start_returns_at_once_and_wait_brings_back_the_runs_logs(tmp_path: Path) -> None:
    began = time.monotonic()
    started = _background(tmp_path, "start", "100", "no-such-step")
    assert started.returncode == 0, started.stderr
    assert "started: suite.sh no-such-step for at most 100 s" in started.stdout
    assert (tmp_path / "repo" / "benchmarks" / "gpu" / "suite.sh").is_file()  # the run's own copy of the checkout
    assert not (tmp_path / "repo" / ".git").exists()
    waited = _background(tmp_path, "wait", "60")
    assert time.monotonic() - began < 60  # ended by the run's end, not by the wait's limit
    assert "no-such-step: unknown step" in waited.stdout
    assert "the suite ended: rc 1" in waited.stdout
    with tarfile.open(tmp_path / "out" / "gpu-suite.tar.gz") as tar:
        assert {"./suite.log", "./suite.rc"} <= set(tar.getnames())


def test_start_copies_what_git_would_track_and_no_virtualenv(tmp_path: Path) -> None:
    """CI's virtualenv lives in the checkout, ignored: copied, its gigabytes once filled CI's disk."""
    checkout = _stand_in_checkout(tmp_path)
    (checkout / ".gitignore").write_text(".ci-venv/\n")
    (checkout / ".ci-venv" / "lib").mkdir(parents=True)
    (checkout / ".ci-venv" / "lib" / "torch.so").write_text("big")
    for args in (["init", "-q"], ["add", ".gitignore", "benchmarks"]):
        subprocess.run(["git", *args], cwd=checkout, check=True)
    (checkout / "untracked.py").write_text("new work")
    env = dict(os.environ, KIT_DIR=str(tmp_path / "kit"), GPU_SUITE_LOGS=str(tmp_path / "logs"),
               SUITE_REPO=str(tmp_path / "repo"), BUNDLE_DIR=str(tmp_path / "bundle"))
    env.pop("OUT", None)
    started = subprocess.run(
        ["bash", str(checkout / "benchmarks" / "gpu" / "background.sh"), "start", "0", "no-such-step"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    copied = {str(path.relative_to(tmp_path / "repo")) for path in (tmp_path / "repo").rglob("*") if path.is_file()}
    assert {".gitignore", "benchmarks/gpu/background.sh", "untracked.py"} <= copied
    assert not any(path.startswith((".ci-venv", ".git/")) for path in copied)


def test_wait_stops_at_its_limit_while_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "suite.log").write_text("== tests (at most 300 s)\n")
    waited = _background(tmp_path, "wait", "2")
    assert "the suite goes on" in waited.stdout
    assert (tmp_path / "out" / "gpu-suite.tar.gz").is_file()


def test_wait_on_a_host_without_a_suite_returns_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    waited = _background(tmp_path, "wait", "60")
    assert waited.returncode == 1 and "no suite running on this host" in waited.stdout
    assert time.monotonic() - began < 30


def test_usage_errors_name_the_verbs(tmp_path: Path) -> None:
    result = _background(tmp_path, "begin", "10")
    assert result.returncode == 2 and "usage:" in result.stderr and "start SECONDS" in result.stderr


def test_bundle_keeps_the_graphs_of_the_same_kernel_package(tmp_path: Path) -> None:
    """A stand-in checkout whose python3 'compiles' one graph a run into the copy's cache and says what it found."""
    checkout = _stand_in_checkout(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    package = checkout / ".modular_cache" / "mili_kernels" / "digest1"
    package.mkdir(parents=True)
    (package / "mili.mojopkg").write_text("1")
    part = tmp_path / "bundle" / "p1" / "site.tar.xz.00"  # parts already built: only the graphs are
    part.parent.mkdir(parents=True)
    part.write_bytes(b"site")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/bash\n[ "$1" = -m ] || exit 0\nmkdir -p .modular_cache/.max_cache\n'
                                     'echo "found: $(ls .modular_cache/.max_cache | tr "\\n" " ")'
                                     ' for $MILI_VIRTUAL_CPU_TARGET"\n'
                                     'touch .modular_cache/.max_cache/graph-$(date +%s%N)\n')
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SUITE_REPO=str(tmp_path / "repo"),
               BUNDLE_DIR=str(tmp_path / "bundle"))
    env.pop("MILI_VIRTUAL_CPU_TARGET", None)

    def bundle() -> tuple[str, list[str]]:
        run = subprocess.run(["bash", str(checkout / "benchmarks" / "gpu" / "bundle.sh"), "--no-max-pipeline"],
                             cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        with tarfile.open(tmp_path / "bundle" / "graphs.tar.xz") as tar:
            packed = sorted(n for n in tar.getnames() if "graph-" in n)
        found, target = run.stdout.splitlines()[0].removeprefix("found:").split(" for ")
        assert target == "x86-64-v3"  # the portable CPU bundle.sh compiles the graphs' host code for
        kernels = tmp_path / "bundle" / "mili_kernels"  # the kernel package, as it is now
        assert [p.relative_to(kernels) for p in kernels.rglob("*.mojopkg")] == [Path(package.name, "mili.mojopkg")]
        return found.split(), packed

    found, packed = bundle()
    assert found == [] and len(packed) == 1
    found, packed = bundle()  # the same package: the first graph is kept, and packed with the second
    assert found == [Path(packed[0]).name] and len(packed) == 2
    package = package.rename(package.with_name("digest2"))  # a new package: every graph compiles again
    found, packed = bundle()
    assert found == [] and len(packed) == 1


def test_start_notes_the_machines_cpu(tmp_path: Path) -> None:
    """For the record: MAX's compile-cache keys hold the CPU that graphs' host code is compiled for, which bundle.sh
    sets to a portable one (test_bundle_keeps_the_graphs_of_the_same_kernel_package checks it)."""
    started = _background(tmp_path, "start", "0", "no-such-step")
    assert started.stdout.startswith("model name: ")
    fields = [line.split(":")[0] for line in (tmp_path / "logs" / "host-cpu.log").read_text().splitlines()]
    assert fields == ["vendor_id", "cpu family", "model", "model name", "flags"]


def test_bundle_says_what_it_needs_before_building_anything(tmp_path: Path) -> None:
    """Outside MILI's venv (no MAX, no mojo to pack the bundle with) or with no python3.12 (the GPU host's Python, for
    MAX's worker), bundle.sh stops at once with what is missing, and builds nothing."""
    checkout = _stand_in_checkout(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname", "realpath"):  # all the script runs before its checks
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, PATH=str(bin_dir), KIT_DIR=str(tmp_path / "kit"))
    env.pop("PYTHON312", None)
    python3 = bin_dir / "python3"

    def bundle() -> subprocess.CompletedProcess:
        script = checkout / "benchmarks" / "gpu" / "bundle.sh"
        return subprocess.run([shutil.which("bash"), str(script)], cwd=checkout,
                              env=env, capture_output=True, text=True, timeout=60)

    python3.write_text("#!/bin/sh\nexit 1\n")  # MAX does not import
    python3.chmod(0o755)
    outside = bundle()
    assert outside.returncode == 1 and "run it in MILI's venv" in outside.stderr
    python3.write_text("#!/bin/sh\nexit 0\n")  # MAX imports, and no python3.12 is on the PATH
    without_312 = bundle()
    assert without_312.returncode == 1 and "needs python3.12" in without_312.stderr
    assert not (checkout / "gpu-bundle").exists() and not (tmp_path / "kit").exists()
