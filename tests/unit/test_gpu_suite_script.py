"""benchmarks/gpu/suite.sh, the GPU suite (`mili bench gpu`), checked on a CPU: its time budget, the packing of its
logs into $OUT, and the unpacking of benchmarks/gpu/bundle.sh's parts (here a small stand-in bundle)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "suite.sh"


def _suite(tmp_path: Path, *steps: str, seconds: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, SUITE_SECONDS=str(seconds), OUT=str(tmp_path / "out"), KIT_DIR=str(tmp_path / "kit"),
               GPU_SUITE_LOGS=str(tmp_path / "logs"), BUNDLE_DIR=str(tmp_path / "bundle"))
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True, timeout=300)


def _stand_in(tmp_path: Path, monkeypatch, command: str, script: str) -> Path:
    """A `command` (python3, ncu) first on the PATH, that runs the shell `script` in the real one's place."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    path = folder / command
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return path


def _write_parts(bundle: Path, folder: str, files: dict[str, str], pieces: int) -> None:
    """The folder as bundle.sh writes it: a tar, xz-compressed, split into gpu-bundle/pN/FOLDER.tar.xz.NN."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = raw.getvalue()
    size = len(blob) // pieces + 1
    for i in range(pieces):
        part = bundle / f"p{i + 1}"
        part.mkdir(parents=True)
        (part / f"{folder}.tar.xz.{i:02d}").write_bytes(blob[i * size : (i + 1) * size])


def test_steps_past_the_time_budget_are_not_started_and_the_logs_come_back(tmp_path: Path) -> None:
    result = _suite(tmp_path, "build", "tests", seconds=0)
    assert result.returncode == 1
    assert "build: not run (the suite's time is spent)" in result.stdout
    assert "tests: not run (the suite's time is spent)" in result.stdout
    assert (tmp_path / "out" / "gpu-suite.tar.gz").is_file()


def test_setup_unpacks_the_kit_and_a_python_for_max_pipeline(tmp_path: Path) -> None:
    _write_parts(tmp_path / "bundle", "peers", {"kit_marker.py": "WHERE = 'peers'\n"}, pieces=2)
    result = _suite(tmp_path, "setup")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "setup: rc=0" in result.stdout
    assert (tmp_path / "kit" / "peers" / "kit_marker.py").is_file()
    probe = subprocess.run([str(tmp_path / "kit" / "max-python"), "-c", "import kit_marker; print(kit_marker.WHERE)"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "peers", probe.stderr
    with tarfile.open(tmp_path / "out" / "gpu-suite.tar.gz") as tar:
        assert "./setup.log" in tar.getnames()


def test_setup_fails_while_a_part_is_missing_then_unpacks_once_it_came(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    _write_parts(bundle, "site", {"site_marker.py": ""}, pieces=2)
    (bundle / "p2" / "site.tar.xz.01").rename(tmp_path / "late-part")
    assert _suite(tmp_path, "setup").returncode == 1
    assert not (tmp_path / "kit" / "site").exists()
    (tmp_path / "late-part").rename(bundle / "p2" / "site.tar.xz.01")  # carried in a later call
    assert _suite(tmp_path, "setup").returncode == 0
    assert (tmp_path / "kit" / "site" / "site_marker.py").is_file()


def test_end_to_end_times_the_plain_attention_kernels_after_a_flash_kernel_case_failed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    failed = "FAILED tests/gpu/test_gpu_ops.py::test_op_matches_reference_on_gpu[attention-bfloat16-x]\n"
    (logs / "tests.log").write_text(failed)
    assert "e2e: MILI's attention kernels plain" in _suite(tmp_path, "e2e", seconds=0).stdout
    assert "profile-two-ops: not run (e2e did not take the one-op flash attention)" in _suite(
        tmp_path, "profile-two-ops", seconds=0).stdout
    # the one-op attention of the model graph (the decode kernel norms, rotates and stores q, k, v itself): the flash
    # kernels still, the two ops apart
    (logs / "tests.log").write_text(failed.replace("[attention", "[qkv_attention"))
    result = _suite(tmp_path, "e2e", "profile-two-ops", seconds=0).stdout
    assert "e2e: MILI's attention kernels flash, MILI_GPU_QKV_ATTENTION=0\n" in result
    assert "profile-two-ops: not run (e2e did not take the one-op flash attention)" in result
    (logs / "tests.log").write_text(
        "FAILED tests/gpu/test_gpu_ops.py::test_op_matches_reference_on_gpu[relu-x]\n"
        "FAILED tests/gpu/test_gpu_ops.py::test_plain_attention_kernels_match_reference_on_gpu"
        "[attention-bfloat16-x]\n"
    )
    result = _suite(tmp_path, "e2e", "profile-two-ops", seconds=0).stdout
    assert "e2e: MILI's attention kernels flash\n" in result
    assert "profile-two-ops: not run (the suite's time is spent)" in result  # it would run: its budget is spent


def test_the_two_op_profile_runs_where_the_one_op_attention_is_asked_for(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "logs").mkdir()
    monkeypatch.setenv("MILI_GPU_QKV_ATTENTION", "1")  # the default, set: the A/B still runs
    assert (
        "profile-two-ops: not run (the suite's time is spent)" in _suite(tmp_path, "profile-two-ops", seconds=0).stdout
    )
    monkeypatch.setenv("MILI_GPU_QKV_ATTENTION", "0")  # e2e ran the two ops: nothing to compare
    assert "profile-two-ops: not run (e2e did not take the one-op flash attention)" in _suite(
        tmp_path, "profile-two-ops", seconds=0).stdout


def test_end_to_end_takes_one_row_tile_a_prefill_block_after_a_case_with_two_failed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tests.log").write_text("FAILED tests/gpu/test_gpu_ops.py::test_flash_prefill_with_two_row_tiles_a_block"
                                    "_matches_reference_on_gpu[attention-bfloat16-x]\n")
    assert "e2e: MILI's attention kernels flash, MILI_GPU_PREFILL_PAIRS=0" in _suite(tmp_path, "e2e", seconds=0).stdout
    (logs / "tests.log").write_text("")
    assert "e2e: MILI's attention kernels flash\n" in _suite(tmp_path, "e2e", seconds=0).stdout


def _e2e_runs(output: str) -> list[str]:
    """The systems of the e2e runs the suite's summary names, in order."""
    return re.findall(r"^e2e-([\w-]+): not run", output, re.M)


def test_end_to_end_times_mili_as_the_decode_step_tests_passed_it(tmp_path: Path, monkeypatch) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    steps = ("e2e", "e2e-rest", "profile", "profile-two-ops")
    result = _suite(tmp_path, *steps, seconds=0).stdout
    # each system in a process of its own: e2e's, then e2e-rest's
    assert _e2e_runs(result) == ["mili", "max", "mili-sync", "transformers", "mili-eager"]
    assert "profile: not run (the suite's time is spent)" in result
    # overlapped steps failed: MILI first with its steps replayed but read at once, profiled so
    (logs / "tests.log").write_text(
        "FAILED tests/gpu/test_decode_graphs.py::test_overlapped_decode_steps_give_the_tokens_of_steps_read_at_once\n")
    result = _suite(tmp_path, *steps, seconds=0).stdout
    assert _e2e_runs(result) == ["mili-sync", "max", "transformers", "mili-eager"]
    _stand_in(tmp_path, monkeypatch, "python3", "echo ran python3 \"$@\"\n")  # only says it ran
    _suite(tmp_path, "profile", seconds=300)
    assert "--batches 1,64 --no-overlap" in (logs / "profile.log").read_text()
    # replayed steps failed (or their model did not come up): MILI op by op first, no profiles of replayed steps
    for line in ("FAILED tests/gpu/test_decode_graphs.py::test_replay_with_arrivals_and_aborts - AssertionError\n",
                 "ERROR tests/gpu/test_decode_graphs.py::test_replayed_decode_steps_give_the_tokens_of_steps_run"
                 "_op_by_op - RuntimeError\n"):
        (logs / "tests.log").write_text(line)
        result = _suite(tmp_path, *steps, seconds=0).stdout
        assert _e2e_runs(result) == ["mili-eager", "max", "mili-sync", "transformers"]
        assert "profile: not run (replayed decode steps failed their tests)" in result
        assert "profile-two-ops: not run (replayed decode steps failed their tests)" in result


def test_every_decode_step_test_names_the_fallback_it_sets() -> None:
    """The fallbacks above match tests/gpu/test_decode_graphs.py's tests by name: each of its tests must match the
    replay or the overlap pattern, and each pattern a test."""
    names = re.findall(r"^def (test_\w+)", (SCRIPT.parents[2] / "tests/gpu/test_decode_graphs.py").read_text(), re.M)
    replay = [n for n in names if re.match(r"test_replay", n)]
    overlap = [n for n in names if re.match(r"test_(overlapped|steps_behind)", n)]
    assert replay and overlap and sorted(replay + overlap) == sorted(names), names
    script = SCRIPT.read_text()
    assert 'failed "test_decode_graphs.py::test_replay"' in script
    assert 'failed "test_decode_graphs.py::test_(overlapped|steps_behind)"' in script


def test_warm_loads_the_model_graphs_while_the_tests_run_and_later_steps_wait_for_it(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """warm loads e2e's graph (flash, one op), then profile-two-ops' (two ops) where that step runs, in the background;
    the tests step runs beside it, and the next step starts only once they are loaded."""
    loaded = tmp_path / "loaded"
    # a python3 that 'loads' a graph in 2 s, and otherwise says which graphs were loaded
    python3 = _stand_in(
        tmp_path, monkeypatch, "python3",
        'case "$*" in\n'
        '  *load_mili*) sleep 2; echo "flash=$MILI_GPU_FLASH_ATTENTION qkv=$MILI_GPU_QKV_ATTENTION" >>"$LOADED"\n'
        '               echo "MILI loaded its graph in 1.5 s" >&2 ;;\n'
        '  "-c import xdist") exit 1 ;;\n'
        '  *) echo "$2 $3 $4 after: $(paste -sd, "$LOADED" 2>/dev/null)" ;;\n'
        "esac\n")
    monkeypatch.setenv("LOADED", str(loaded))
    result = _suite(tmp_path, "warm", "tests", "attention-bench", "profile-two-ops")
    logs = tmp_path / "logs"
    assert loaded.read_text() == "flash=1 qkv=1\nflash=1 qkv=0\n"
    assert "pytest -q -p after: \n" in (logs / "tests.log").read_text()  # beside warm, not after it
    assert (logs / "attention-bench.log").read_text() == (
        "benchmarks.kernels.run --device cuda after: flash=1 qkv=1,flash=1 qkv=0\n")
    assert re.search(r"warm: rc=0 in \d+ s \(graphs loaded in 1\.5 s, 1\.5 s\)", result.stdout), result.stdout
    loaded.unlink()  # without profile-two-ops, its graph is not loaded
    result = _suite(tmp_path, "warm", "tests", "attention-bench")
    assert loaded.read_text() == "flash=1 qkv=1\n"
    assert (logs / "attention-bench.log").read_text() == "benchmarks.kernels.run --device cuda after: flash=1 qkv=1\n"
    assert re.search(r"warm: rc=0 in \d+ s \(graphs loaded in 1\.5 s\)", result.stdout), result.stdout
    # a graph that fails to load fails the suite, and the summary shows warm's log
    python3.write_text("#!/bin/sh\necho 'RuntimeError: no GPU' >&2\nexit 1\n")
    result = _suite(tmp_path, "warm")
    assert result.returncode == 1
    assert "warm: rc=1" in result.stdout and "RuntimeError: no GPU" in result.stdout


def test_the_pdl_profile_launches_with_pdl_unless_its_test_failed(tmp_path: Path, monkeypatch) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # a python3 that says what it ran and with which PDL setting
    _stand_in(tmp_path, monkeypatch, "python3", "echo \"ran $2 $3 $4 MILI_GPU_PDL=$MILI_GPU_PDL\"\n")
    monkeypatch.delenv("MILI_GPU_PDL", raising=False)
    _suite(tmp_path, "profile", "profile-pdl")
    assert (logs / "profile.log").read_text() == "ran benchmarks.engine.decode_profile --device cuda MILI_GPU_PDL=\n"
    assert (
        logs / "profile-pdl.log"
    ).read_text() == "ran benchmarks.engine.decode_profile --device cuda MILI_GPU_PDL=1\n"
    (logs / "tests.log").write_text("FAILED tests/gpu/test_dependent_launch.py::test_pdl_launches_give_the_tokens"
                                    "_of_plain_ones - AssertionError\n")
    assert "profile-pdl: not run (PDL launches failed their test)" in _suite(tmp_path, "profile-pdl").stdout


@pytest.mark.parametrize("step, setting", [("profile-cublas", "MILI_GPU_VENDOR_BLAS"),
                                           ("profile-batch1", "MILI_GPU_BATCH1_GRAPH")])
def test_a_matmul_profile_takes_its_setting_with_time_to_compile(tmp_path: Path, monkeypatch, step: str,
                                                                 setting: str) -> None:
    (tmp_path / "logs").mkdir()
    _stand_in(tmp_path, monkeypatch, "python3", f"echo \"ran $2 {setting}=${setting}\"\n")
    monkeypatch.delenv(setting, raising=False)
    result = _suite(tmp_path, "profile", step, seconds=600)
    assert "== profile (at most 150 s)" in result.stdout and f"== {step} (at most 420 s)" in result.stdout
    logs = tmp_path / "logs"
    assert (logs / "profile.log").read_text() == f"ran benchmarks.engine.decode_profile {setting}=\n"
    assert (logs / f"{step}.log").read_text() == f"ran benchmarks.engine.decode_profile {setting}=1\n"


def test_the_cublas_end_to_end_run_is_mili_with_cublas_in_a_process_of_its_own(tmp_path: Path, monkeypatch) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    _stand_in(tmp_path, monkeypatch, "python3", "echo \"ran $* MILI_GPU_VENDOR_BLAS=$MILI_GPU_VENDOR_BLAS\"\n")
    monkeypatch.delenv("MILI_GPU_VENDOR_BLAS", raising=False)
    assert _suite(tmp_path, "e2e-cublas").returncode == 0
    said = (logs / "e2e-mili-cublas.log").read_text()
    assert said.startswith("ran -m benchmarks.gpu.e2e --device cuda --systems mili-cublas ")
    assert said.endswith(" MILI_GPU_VENDOR_BLAS=1\n")
    (logs / "tests.log").write_text("FAILED tests/gpu/test_decode_graphs.py::test_replay_with_arrivals_and_aborts\n")
    assert "e2e-cublas: not run (e2e's MILI is mili-eager)" in _suite(tmp_path, "e2e-cublas").stdout


def test_ncu_reads_the_attention_launches_with_the_clocks_left_alone(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "logs").mkdir()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no ncu
    assert "ncu-attention: not run (no ncu on this machine)" in _suite(tmp_path, "ncu-attention").stdout
    # an ncu that says how it was called, on a PATH of /usr/bin and /bin
    _stand_in(tmp_path, monkeypatch, "ncu", "echo \"pool=$MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT $*\"\n")
    result = _suite(tmp_path, "ncu-attention")
    # a case a run, so that a run cut at its limit loses only its case
    for log, case in [("prefill-ctx-2048-b1", "prefill ctx=2048 B=1"), ("decode-ctx-4096-b64", "decode ctx=4096 B=64"),
                      ("decode-ctx-4096-b1", "decode ctx=4096 B=1")]:
        assert f"ncu-{log}: rc=0" in result.stdout, result.stdout
        said = (tmp_path / "logs" / f"ncu-{log}.log").read_text()
        assert said.startswith("pool=4 --nvtx --clock-control none --kernel-name regex:attention|flash|mha --section ")
        assert "--section WarpStateStats" in said and "--section SourceCounters" in said
        assert said.endswith(f" python3 -m benchmarks.gpu.attention_ncu --device cuda --cases attention {case}\n")


def test_the_tests_step_runs_what_gpu_tests_k_selects(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "logs").mkdir()
    # a python3 that gives each argument in brackets
    _stand_in(tmp_path, monkeypatch, "python3", "[ \"$1\" = -c ] && exit 1\nprintf '[%s]' \"$@\"\n")
    monkeypatch.setenv("GPU_TESTS_K", "attention or decode")
    _suite(tmp_path, "tests")
    log = tmp_path / "logs" / "tests.log"
    # no xdist here (the stand-in fails `-c import xdist`): pyproject's -n goes with its addopts
    assert log.read_text() == "[-m][pytest][-q][-p][no:cacheprovider][-o][addopts=][-k][attention or decode][tests/gpu]"
    monkeypatch.delenv("GPU_TESTS_K")
    _suite(tmp_path, "tests")
    assert log.read_text() == "[-m][pytest][-q][-p][no:cacheprovider][-o][addopts=][tests/gpu]"


def test_the_gemv_forms_step_times_the_matmul_forms_on_the_gpu(tmp_path: Path, monkeypatch) -> None:
    _stand_in(tmp_path, monkeypatch, "python3", "echo \"ran $*\"\n")
    assert _suite(tmp_path, "gemv-forms").returncode == 0
    assert (tmp_path / "logs" / "gemv-forms.log").read_text() == "ran -m benchmarks.gpu.gemv_forms --device cuda\n"
