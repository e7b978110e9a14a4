"""`mili bench serving`'s own parts on the live tiny server: the light client's timings, the CPU meter, the
report rows and the plots (guidellm and llama.cpp's server are benchmark-only installs, not run here)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.server.live_server import MODEL_NAME, LiveServer

from benchmarks.serving import cpu_meter, guidellm_sweep, light_client, plots

SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def test_the_light_client_times_every_streamed_token(server: LiveServer) -> None:
    prompts = [f"prompt {i} " * 5 for i in range(6)]
    timings, wall, cpu = light_client.run_concurrency(server.url, MODEL_NAME, prompts, 12, 3, SAMPLING)
    assert len(timings) == 6 and not [t.error for t in timings if t.error]
    for t in timings:
        # usage counts the tokens; a token whose text is not complete yet (a split UTF-8 sequence) has no chunk
        assert t.output_tokens == 12 and 6 <= len(t.chunk_times) <= 12 and len(t.itls) == len(t.chunk_times) - 1
        assert 0 < t.ttft <= t.e2e <= wall and all(i >= 0 for i in t.itls)
    assert 0 < cpu < wall * 2
    row = light_client.summarize(timings, wall)
    assert row["requests"] == 6 and row["errors"] == 0
    assert row["output_tok_s"] == pytest.approx(72 / wall)
    assert row["ttft_ms_p50"] <= row["ttft_ms_p90"] <= row["ttft_ms_p99"]
    assert row["itl_ms_p50"] <= row["itl_ms_p99"] and row["e2e_s_p50"] <= row["e2e_s_p99"]


def test_the_light_client_reports_a_refused_request(server: LiveServer) -> None:
    timings, _, _ = light_client.run_concurrency(server.url, "no-such-model", ["hi"], 4, 1, SAMPLING)
    assert timings[0].error.startswith("HTTP 404")
    assert light_client.summarize(timings, 1.0)["errors"] == 1


def test_the_cpu_meter_tells_a_busy_process_from_an_idle_one() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)  # past the interpreters' start
        with cpu_meter.CpuMeter({"busy": busy.pid, "idle": idle.pid}, interval=0.1) as meter:
            start = time.time()
            time.sleep(1.5)
            end = time.time()
        # a loop gets at least a third of a core beside the other test worker on 2 busy cores
        assert 0.3 < meter.share("busy", start, end) < 1.2
        assert meter.share("idle", start, end) < 0.1
    finally:
        busy.kill(), idle.kill(), busy.wait(), idle.wait()


def _report(streams: int, start: float, duration: float, ttft: list) -> dict:
    """One benchmark of guidellm 0.8.1's JSON report, with the fields rows_from_report reads."""
    def dist(values: list) -> dict:
        return {"successful": {"percentiles": dict(zip(guidellm_sweep.PERCENTILES, values)), "total_sum": sum(values)}}
    return {"config": {"strategy": {"streams": streams}}, "duration": duration, "start_time": start,
            "end_time": start + duration,
            "metrics": {"request_totals": {"successful": 30, "errored": 1, "incomplete": 1},
                        "output_token_count": {"successful": {"total_sum": 3840.0}},
                        "time_to_first_token_ms": dist(ttft), "inter_token_latency_ms": dist([20.0, 25.0, 40.0]),
                        "request_latency": dist([2.5, 2.8, 3.0])}}


def test_guidellm_rows_and_the_plots(tmp_path: Path) -> None:
    report = {
        "benchmarks": [_report(1, 1000.0, 60.0, [30.0, 35.0, 50.0]), _report(4, 1060.0, 20.0, [90.0, 150.0, 200.0])]
    }
    rows = guidellm_sweep.rows_from_report(report)
    assert [r["concurrency"] for r in rows] == [1, 4] and [r["output_tok_s"] for r in rows] == [64.0, 192.0]
    assert rows[1]["ttft_ms_p90"] == 150.0 and rows[0]["e2e_s_p99"] == 3.0 and rows[0]["errors"] == 2
    assert (rows[1]["_start"], rows[1]["_end"]) == (1060.0, 1080.0)
    spec = guidellm_sweep.scenario("http://x", "m", "/tok", [1, 4], 32, 128, 64, SAMPLING, tmp_path / "o.json", seed=4)
    assert spec["benchmarks"] == [{"profile.streams": 1}, {"profile.streams": 4}]
    assert spec["spec"]["seed"] == {"kind": "static", "value": 4}
    assert spec["spec"]["backend"]["extras"] == {"body": SAMPLING}
    labelled = [dict(r, system=s) for s in ("MILI", "peer") for r in rows]
    for draw in (plots.throughput_latency, plots.ttft_percentiles):
        out = draw(labelled, "test", tmp_path / f"{draw.__name__}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_a_failed_point_is_reported_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks.serving import run
    from benchmarks.serving.servers import Server

    def guidellm_point(server, args, c, work):
        if c == 2:
            raise RuntimeError("guidellm failed (exit 1)")
        return {"output_tok_s": 10.0 * c}

    monkeypatch.setattr(run, "settle", lambda: 0.0)
    monkeypatch.setattr(run.light_client, "run_concurrency", lambda *a: None)
    monkeypatch.setattr(run, "_guidellm_point", guidellm_point)
    args = argparse.Namespace(concurrencies=[1, 2, 4], clients=["guidellm"], offline=False, requests=2)
    rows, failed = run._sweep([Server("peer", "m", "http://x")], args, ["p"] * run._prompt_count(args), tmp_path)
    assert [(r["concurrency"], r["output_tok_s"]) for r in rows] == [(1, 10.0), (4, 40.0)]
    assert failed == [{"system": "peer", "client": "guidellm", "concurrency": 2, "error": "guidellm failed (exit 1)"}]

    # a server that died: its exit code and the end of its log go with the error (its log is deleted after the run)
    log = tmp_path / "peer.log"
    log.write_text("slot 3: out of memory\n")
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    rows, failed = run._sweep([Server("peer", "m", "http://x", dead, log)], args, ["p"] * run._prompt_count(args),
                              tmp_path)
    assert failed[0]["error"] == ("guidellm failed (exit 1)\npeer exited with code 3; the end of its log:\n"
                                  "slot 3: out of memory\n")


def test_no_point_sends_a_prompt_an_earlier_point_sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A prompt sent twice is answered from the prefix cache the second time: every point (the warm-up too) gets
    prompts of its own, the same ones for every server, and guidellm a seed of its own per point."""
    from benchmarks.serving import run
    from benchmarks.serving.servers import Server

    sent, seeds = [], []
    monkeypatch.setattr(run, "settle", lambda: 0.0)
    monkeypatch.setattr(run.light_client, "run_concurrency",
                        lambda url, model, prompts, *a: sent.append((url, "warm-up", list(prompts))))
    monkeypatch.setattr(run, "_light_point",
                        lambda server, args, prompts, c: sent.append((server.url, c, list(prompts))) or {})
    monkeypatch.setattr(run.guidellm_sweep, "run",
                        lambda spec, work, pid: seeds.append(spec["spec"]["seed"]["value"]) or [{"generator_cpu": 0}])
    args = argparse.Namespace(concurrencies=[1, 4, 8], clients=["guidellm", "light"], offline=False, requests=3,
                              model="m", prompt_tokens=8, output_tokens=4)
    prompts = [f"p{i}" for i in range(run._prompt_count(args))]
    rows, failed = run._sweep([Server("a", "m", "a"), Server("b", "m", "b")], args, prompts, tmp_path)
    assert not failed and len(rows) == 2 * 3 * 2 and seeds == [1, 1, 4, 4, 8, 8]
    by_point = {}
    for url, point, texts in sent:
        by_point.setdefault(point, {})[url] = texts
    by_point = {p: [by_point[p]["a"], by_point[p]["b"]] for p in by_point}
    assert [len(by_point[p][0]) for p in ("warm-up", 1, 4, 8)] == [2, 3, 8, 16]
    assert all(texts == by_point[p][0] for p in by_point for texts in by_point[p])  # both servers, the same
    assert sorted(t for p in by_point for t in by_point[p][0]) == sorted(prompts)  # each prompt once


def test_a_light_client_sweep_needs_no_guidellm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--clients light` writes its JSON and plots where guidellm is not installed."""
    from benchmarks.serving import run

    row = {"system": "MILI", "client": "light", "concurrency": 1, "output_tok_s": 10.0, "ttft_ms_p50": 1.0}
    written = {}
    monkeypatch.setattr(run.guidellm_sweep, "GUIDELLM", tmp_path / "no-guidellm")
    monkeypatch.setattr(run, "_prompts", lambda *a: ["p"])
    monkeypatch.setattr(run, "_servers", lambda args, log_dir: [])
    monkeypatch.setattr(run, "_sweep", lambda *a: ([row], []))
    monkeypatch.setattr(run, "write_json", lambda name, meta, rows: written.update(meta=meta) or tmp_path / "s.json")
    for draw in ("throughput_latency", "ttft_percentiles"):
        monkeypatch.setattr(run.plots, draw, lambda rows, title, path: path)
    assert run.main(["--systems", "mili", "--clients", "light", "--concurrencies", "1", "--model", str(tmp_path)]) == 0
    assert written["meta"]["generator"] is None


def test_each_mili_format_gets_its_offline_points_and_its_breakdown(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    """`--mili-weight-dtypes int8,int4`: a server each (started by _servers), an offline run each at every
    concurrency, and a breakdown plot each."""
    from benchmarks.serving import run

    SPEEDS = {"int8": 1.0, "int4": 2.0}
    monkeypatch.setattr(run, "settle", lambda: 0.0)
    monkeypatch.setattr(run, "offline_point",
                        lambda model, dtype, kv, *a: {"output_tok_s": SPEEDS[dtype] if kv == "bfloat16" else 0})
    args = argparse.Namespace(concurrencies=[1, 8], clients=[], offline=True, mili_weight_dtypes=["int8", "int4"],
                              mili_kv_cache_dtype="bfloat16", model="m", output_tokens=4, requests=2)
    rows, failed = run._sweep([], args, ["p"] * 16, tmp_path)
    assert not failed
    assert [(r["system"], r["concurrency"], r["output_tok_s"]) for r in rows] == [
        ("MILI int8", 1, 1.0), ("MILI int4", 1, 2.0), ("MILI int8", 8, 1.0), ("MILI int4", 8, 2.0)]

    started = []
    monkeypatch.setattr(run, "start_mili", lambda model, dtype, kv, log_dir: started.append((dtype, kv)) or dtype)
    servers = list(run._servers(argparse.Namespace(url=None, systems=["mili"], mili_weight_dtypes=["int8", "int4"],
                                                   mili_kv_cache_dtype="int8", model="m"), tmp_path))
    assert servers == ["int8", "int4"] and started == [("int8", "int8"), ("int4", "int8")]

    drawn, written = [], {}
    served = [dict(system=f"MILI {d}", client=c, concurrency=1, output_tok_s=1.0, decode_ms=1.0)
              for d in ("int8", "int4") for c in ("light", "offline")]
    monkeypatch.setattr(run, "_prompts", lambda *a: ["p"])
    monkeypatch.setattr(run, "_servers", lambda args, log_dir: [])
    monkeypatch.setattr(run, "_sweep", lambda *a: (served, []))
    monkeypatch.setattr(run, "write_json", lambda name, meta, rows: written.update(meta=meta) or tmp_path / "s.json")
    for draw in ("throughput_latency", "ttft_percentiles", "breakdown"):
        monkeypatch.setattr(run.plots, draw, lambda rows, title, path: drawn.append((path.name, len(rows))) or path)
    assert run.main(["--systems", "mili", "--clients", "light", "--concurrencies", "1", "--model", str(tmp_path),
                     "--mili-weight-dtypes", "int8,int4"]) == 0
    assert written["meta"]["mili_weight_dtypes"] == ["int8", "int4"]
    assert ("s-breakdown-int4.png", 2) in drawn and ("s-breakdown-int8.png", 2) in drawn


def test_vllms_server_runs_from_its_venv_on_both_cores(monkeypatch, tmp_path: Path) -> None:
    from benchmarks.peers import run as peers
    from benchmarks.serving import run, servers

    python = tmp_path / "python"
    python.touch()
    monkeypatch.setattr(peers, "VLLM_PYTHON", python)
    started = []
    monkeypatch.setattr(servers, "_start",
                        lambda name, model, port, cmd, env, log: started.append((model, cmd, env)) or name)
    args = argparse.Namespace(url=None, systems=["vllm"], vllm_dtypes=["bfloat16", "float32"], vllm_model=None,
                              model="/m", concurrencies=[1, 32])
    assert list(run._servers(args, tmp_path)) == ["vLLM bfloat16", "vLLM float32"]
    model, cmd, env = started[0]
    assert model == "vllm" and cmd[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    assert [cmd[cmd.index(flag) + 1] for flag in ("--model", "--dtype", "--max-num-seqs")] == ["/m", "bfloat16", "32"]
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    started.clear()
    list(run._servers(argparse.Namespace(**{**vars(args), "vllm_model": "/w8a8"}), tmp_path))
    assert all(cmd[cmd.index("--model") + 1] == "/w8a8" for _, cmd, _ in started)
    monkeypatch.setattr(peers, "VLLM_PYTHON", tmp_path / "missing")
    with pytest.raises(SystemExit, match="setup.sh vllm"):
        list(run._servers(args, tmp_path))
