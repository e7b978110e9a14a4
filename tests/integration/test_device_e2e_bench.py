"""The end-to-end device benchmark (benchmarks/gpu/e2e.py, `mili bench engine latency|throughput --device cuda`) and
gpu-summary.json, run here on a CPU with the tiny checkpoint: the harness the GPU suite runs, checked where CI
runs. (MAX's own Qwen3 pipeline, its third peer, does not run on a CPU: benchmarks/peers/max_pipeline.py.)"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import common
from benchmarks.gpu import e2e as device_e2e
from benchmarks.gpu import summary as gpu_summary
from benchmarks.gpu import systems as e2e_systems

from bindings.gpu_options import GpuOptions

# one xdist worker for the module (`--dist loadgroup`): its model graphs compile once, not once per worker
pytestmark = pytest.mark.xdist_group("device_e2e_bench")


@pytest.fixture
def small(tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    return ["--device", "cpu", "--model", str(tiny_checkpoint), "--runs", "1", "--kv-cache-gb", "0.05",
            "--max-num-seqs", "8", "--hf-batch-size", "4"]


def _rows(results: Path, kind: str) -> dict:
    (path,) = results.glob(f"{kind}-cpu-*.json")
    return {row["system"]: row for row in json.loads(path.read_text())["rows"]}


def test_latency_figures_of_each_system(small: list[str], tmp_path: Path) -> None:
    device_e2e.latency_main(small + ["--systems", "mili,mili-sync,mili-eager,transformers,mili-turbo",
                                     "--contexts", "16,40", "--new-tokens", "8", "--ttft-len", "30"])
    rows = _rows(tmp_path, "latency")  # one file, written over after every system
    assert sorted(rows) == ["mili", "mili-eager", "mili-sync", "mili-turbo", "transformers"]
    assert (
        "unknown MILI variant 'mili-turbo': choose from mili, mili-sync, mili-eager" in rows.pop("mili-turbo")["error"]
    )
    for row in rows.values():
        assert "error" not in row, row
        assert row["device_graphs"] is False  # a CPU runs the fixed-shape steps but cannot replay them
        assert all(math.isfinite(row[f"decode_b1_ctx{c}_ms_per_token"]) for c in (16, 40))
        assert row["ttft_30_ms"] > 0 and row["bandwidth_floor_ms"] > 0


def test_throughput_runs_the_same_workload_on_each_system(small: list[str], tmp_path: Path) -> None:
    device_e2e.throughput_main(small + ["--systems", "mili,transformers,nothing", "--num-requests", "12",
                                        "--prompt-len", "5", "30", "--output-len", "3", "20"])
    rows = _rows(tmp_path, "throughput")
    assert rows["mili"]["output_tokens"] == rows["transformers"]["output_tokens"] > 12 * 3
    assert rows["mili"]["output_tok_s"] > 0 and rows["transformers"]["output_tok_s"] > 0
    assert rows["nothing"]["error"].startswith("ValueError: unknown system 'nothing'")  # reported; the rest ran


def test_latency_and_throughput_of_each_system_started_once(small: list[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m benchmarks.gpu.e2e` (the GPU suite's e2e step): both figures per system, each system opened once,
    its sequences as long as the longer of the two runs needs; one JSON per kind, as the single runs write."""
    for name in [k for k in os.environ if k.startswith("MILI_GPU_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MILI_GPU_VENDOR_BLAS", "0")
    opened = []
    real_open = device_e2e.open_system
    monkeypatch.setattr(device_e2e, "open_system", lambda name, *a: opened.append(name) or real_open(name, *a))
    assert device_e2e.main(small + ["--systems", "mili,transformers", "--contexts", "16", "--new-tokens", "4",
                                    "--ttft-len", "30", "--num-requests", "6", "--prompt-len", "5", "30",
                                    "--output-len", "3", "40"]) == 0
    assert opened == ["mili", "transformers"]
    (written,) = tmp_path.glob("latency-cpu-*.json")
    assert json.loads(written.read_text())["meta"]["gpu_options"] == dataclasses.asdict(GpuOptions())
    latency, throughput = _rows(tmp_path, "latency"), _rows(tmp_path, "throughput")
    assert sorted(latency) == sorted(throughput) == ["mili", "transformers"]
    assert all(row["ttft_30_ms"] > 0 and "error" not in row for row in latency.values())
    assert throughput["mili"]["output_tokens"] == throughput["transformers"]["output_tokens"] >= 6 * 3
    args = device_e2e.argparse.Namespace(contexts="16", new_tokens=4, ttft_len=30, num_requests=6,
                                         prompt_len=(5, 30), output_len=(3, 40))
    assert device_e2e.max_length(args) == 70  # throughput's 30 + 40 over latency's 16 + 4 + 1 and 30 + 1


def test_max_worker_starts_without_the_interops_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX's worker runs in a Python of its own: the variables Mojo's Python interop sets for this one must not
    reach it (given this venv's PYTHONEXECUTABLE, a Python of another venv loses its packages)."""
    monkeypatch.setenv("PYTHONEXECUTABLE", sys.executable)
    monkeypatch.setenv("MOJO_PYTHON_LIBRARY", "/this/pythons/libpython.so")
    probe = "import os; print(*(os.environ.get(k) for k in ('PYTHONEXECUTABLE', 'MOJO_PYTHON_LIBRARY', 'E2E_PROBE')))"
    monkeypatch.setenv("E2E_PROBE", "kept")
    seen = subprocess.run([sys.executable, "-c", probe], env=e2e_systems.max_worker_env(), capture_output=True,
                          text=True, check=True).stdout.split()
    assert seen == ["None", "None", "kept"]


def test_max_pool_set_for_mili_stays_out_of_maxs_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX's pool size load_model sets for MILI's own MAX never reaches MAX's pipeline worker, which sizes its own;
    one the operator set reaches both."""
    monkeypatch.setattr(e2e_systems, "OPERATOR_POOL_PERCENT", None)
    monkeypatch.setenv(e2e_systems.MAX_POOL_PERCENT, "40")
    assert e2e_systems.MAX_POOL_PERCENT not in e2e_systems.max_worker_env()
    monkeypatch.setattr(e2e_systems, "OPERATOR_POOL_PERCENT", "20")
    assert e2e_systems.max_worker_env()[e2e_systems.MAX_POOL_PERCENT] == "20"


def test_mili_cublas_times_only_a_model_whose_matmuls_call_cublas() -> None:
    """mili-cublas must have loaded its model with MILI_GPU_VENDOR_BLAS=1 (on a GPU), and the other MILI variants
    without: a row named for one setting never holds the figures of the other."""
    plain, cublas = (SimpleNamespace(forward_fn=SimpleNamespace(vendor_blas=v)) for v in (False, True))
    with pytest.raises(ValueError, match="mili-cublas times MILI with its matmuls through cuBLAS: load the model on "
                                         "a GPU with MILI_GPU_VENDOR_BLAS=1"):
        e2e_systems.Mili(plain, "mili-cublas", 8, 64, 0.05, 64)
    with pytest.raises(ValueError, match="mili-sync times MILI with MAX's own matmuls, but the model was loaded with "
                                         "MILI_GPU_VENDOR_BLAS=1: time it as mili-cublas"):
        e2e_systems.Mili(cublas, "mili-sync", 8, 64, 0.05, 64)


def test_gpu_summary_takes_the_latest_runs(tmp_path: Path) -> None:
    def write(name: str, meta: dict, rows: list) -> None:
        (tmp_path / name).write_text(json.dumps(dict(meta=meta, rows=rows)))

    attention = lambda op, ratio: dict(op=op, in_graph_ratio=ratio)
    write("kernels-cuda-bfloat16-20261101-000000.json", {}, [attention("attention prefill ctx=2048 B=1", 9.0)])
    prefill = dict(attention("attention prefill ctx=2048 B=1", 0.9), torch_us=100.0,
                   mojo_in_graph_us_by_prefill_pairs={"0": 120.0, "1": 90.0})
    write("kernels-cuda-bfloat16-20261102-000000.json", {}, [prefill, attention("attention decode ctx=4096 B=8", 0.8)])
    write("latency-cuda-20261102-000000.json", dict(device_name="NVIDIA H100", gpu_settings={"MILI_GPU_PDL": "1"}), [
        dict(system="mili", decode_b1_ctx512_ms_per_token=0.9, bandwidth_floor_ms=0.4, device_graphs=False),
        dict(system="max", decode_b1_ctx512_ms_per_token=1.2), dict(system="transformers", error="RuntimeError: x")])
    out = gpu_summary.summary(tmp_path, "abc123")
    assert out["device"] == "NVIDIA H100" and out["commit"] == "abc123"
    assert (
        out["attention_prefill_2048_ratio_vs_sdpa"] == 0.9 and out["attention_decode_ctx4096_b8_ratio_vs_sdpa"] == 0.8
    )
    assert out["attention_decode_ctx4096_b64_ratio_vs_sdpa"] is None  # not in the run
    assert out["attention_prefill_2048_ratio_vs_sdpa_by_row_tiles_a_block"] == {"1": 1.2, "2": 0.9}
    assert out["decode_b1_ms_per_token"] == 0.9 and out["bandwidth_floor_ms"] == 0.4
    assert out["mili_device_graphs"] is False  # its steps ran op by op: the figure says so beside it
    assert out["max_pipeline_decode_b1_ms_per_token"] == 1.2 and out["transformers_decode_b1_ms_per_token"] is None
    assert out["throughput_tok_s"] is None and out["max_pipeline_throughput_tok_s"] is None  # no throughput run
    assert out["max_pipeline_device_graph_capture"] is None and out["e2e_flash_kernels"] is None  # not in the meta
    assert out["e2e_gpu_settings"] == {"MILI_GPU_PDL": "1"}  # what the e2e figures ran with
    assert out["decode_b1_ms_per_token_cublas"] is None  # not in the run
    # then a run of mili-cublas: its figures beside MILI's, whose settings stay those of MILI's own run
    write("latency-cuda-20261102-000100.json", dict(gpu_settings={"MILI_GPU_VENDOR_BLAS": "1"}), [
        dict(system="mili-cublas", decode_b1_ctx512_ms_per_token=0.8)])
    out = gpu_summary.summary(tmp_path, "abc123")
    assert out["decode_b1_ms_per_token_cublas"] == 0.8 and out["decode_b1_ms_per_token"] == 0.9
    assert out["e2e_gpu_settings"] == {"MILI_GPU_PDL": "1"}


def test_gpu_summary_takes_each_system_from_its_newest_run_of_the_suite(tmp_path: Path) -> None:
    def write(name: str, rows: list) -> None:
        (tmp_path / name).write_text(json.dumps(dict(meta=dict(device_name=name), rows=rows)))

    # an older suite run
    write("throughput-cuda-20261101-000000.json", [dict(system="transformers", output_tok_s=50.0)])
    write("throughput-cuda-20261126-100000.json", [dict(system="mili", output_tok_s=900.0),
                                                   dict(system="max", output_tok_s=800.0)])
    write("throughput-cuda-20261126-100500.json", [dict(system="mili-sync", output_tok_s=700.0),
                                                   dict(system="mili", error="RuntimeError: x")])
    out = gpu_summary.summary(tmp_path, "abc123", since="20261126-095900")
    assert out["throughput_tok_s"] == 900.0 and out["max_pipeline_throughput_tok_s"] == 800.0  # not lost to an error
    assert out["throughput_tok_s_without_overlap"] == 700.0
    assert out["transformers_throughput_tok_s"] is None  # from before `since`
    assert out["device"] == "throughput-cuda-20261126-100500.json"  # the newest run's meta
    assert gpu_summary.summary(tmp_path, "abc123")["transformers_throughput_tok_s"] == 50.0


def test_gpu_summary_writes_the_commit_it_is_given(tmp_path: Path) -> None:
    assert gpu_summary.main(["--results", str(tmp_path), "--commit", "0123abc"]) == 0  # a device's tree has no git
    written = json.loads((tmp_path / "gpu-summary.json").read_text())
    assert written["commit"] == "0123abc" and written["decode_b1_ms_per_token"] is None


def test_decode_profile_splits_the_devices_idle_time_into_launch_gaps_and_waits() -> None:
    """Gaps between a device's kernels (time ranges in us): under 10 us a launch, longer a wait for the host; a kernel
    inside another's span (another stream) leaves no gap; host events do not count."""
    from benchmarks.engine import decode_profile

    cuda = torch.autograd.DeviceType.CUDA
    event = lambda start, end, device=cuda: SimpleNamespace(time_range=SimpleNamespace(start=start, end=end),
                                                            device_type=device)
    events = [event(0, 100), event(102, 200), event(150, 180), event(230, 300), event(303, 310),
              event(400, 900, torch.autograd.DeviceType.CPU)]
    assert decode_profile.device_gaps(events, steps=2) == pytest.approx(
        dict(short_gaps_ms_per_step=(2 + 3) / 2 / 1e3, long_gaps_ms_per_step=30 / 2 / 1e3))


def test_decode_profile_times_the_decode_steps_of_each_batch(tiny_checkpoint: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/engine/decode_profile.py (the GPU suite's view of where a step's time goes), run here on a CPU: the
    steps
    of each batch are timed after its prefill; no CUDA kernel is seen on a CPU; the host's own time per Python
    function (on a CPU the model's execution, inside MAX, is the host's)."""
    from benchmarks.engine import decode_profile

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert decode_profile.main(["--device", "cpu", "--model", str(tiny_checkpoint), "--batches", "1,3",
                                "--context", "20", "--steps", "5", "--kv-cache-gb", "0.05"]) == 0
    (path,) = tmp_path.glob("decode-profile-cpu-*.json")
    written = json.loads(path.read_text())
    rows = [r for r in written["rows"] if "steps" in r]
    assert [(r["batch"], r["steps"], r["overlap"]) for r in rows] == [(1, 5, True), (3, 5, True)]
    host = [r for r in written["rows"] if "host" in r]
    for batch in (1, 3):
        functions = [r for r in host if r["batch"] == batch]
        assert len(functions) == decode_profile.TOP and all(r["us_per_step"] > 0 for r in functions)
        assert "_Model_execute" in functions[0]["host"], functions[0]  # the most of the host's own time
    # the GPU's memory at each stage: on a CPU only the stages' names
    assert [m["stage"] for m in written["meta"]["memory"]] == [
        "before the model", "model loaded (MAX's device, the weights)", "engine made (KV cache, decode steps captured)",
        "profiled"]
    assert all(r["wall_ms_per_step"] > 0 and r["profiled_wall_ms_per_step"] > 0 and r["device_busy_ms_per_step"] == 0
               and r["short_gaps_ms_per_step"] == r["long_gaps_ms_per_step"] == 0 for r in rows)
    assert {r["attention"] for r in rows} == {decode_profile.attention_graph(GpuOptions())}
    for flash, one_op, said in [
        (True, True, "flash kernels, one op (qkv_attention)"),
        (True, False, "flash kernels, two ops"),
        (False, True, "plain kernels, two ops"),
    ]:
        assert decode_profile.attention_graph(GpuOptions(flash_attention=flash, qkv_attention=one_op)) == said
    assert (
        decode_profile.attention_graph(GpuOptions(flash_attention=False, pdl=True))
        == "plain kernels, two ops, PDL launches"
    )
    assert {r["matmuls"] for r in rows} == {"MAX's own"}  # as the model loaded them (tests/gpu: cuBLAS)
