"""The serving benchmark's breakdown of the engine's time: the counters /metrics exports, as it reads them."""

from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from benchmarks.serving import breakdown
from benchmarks.serving.offline import counters
from python_layer.inference.metrics import EngineMetrics
from python_layer.inference.step_times import StepTimes


def _engine(times: StepTimes, prefix_cache: SimpleNamespace) -> SimpleNamespace:
    scheduler = SimpleNamespace(running=[], waiting=[], num_preemptions=0)
    return SimpleNamespace(scheduler=scheduler, kv_cache=SimpleNamespace(num_usable_pages=8),
                           prefix_cache=prefix_cache, num_request_pages=0, times=times)


def _run_steps(times: StepTimes) -> None:
    request = object()
    with times.forward([(request, 100), (request, 1)], decode=False):
        pass
    for _ in range(3):
        with times.forward([(request, 1)] * 4, decode=True):
            pass
    times.seconds.update(schedule=0.25, prefill=1.0, decode=3.0, sample=0.5, output=0.25)


def test_metrics_export_what_the_breakdown_reads() -> None:
    times = StepTimes()
    lookups = SimpleNamespace(num_cached_pages=0, queried_tokens=50, hit_tokens=10)
    metrics = EngineMetrics("m")
    metrics.observe_engine(_engine(times, lookups))
    before = breakdown.parse_counters(generate_latest(metrics.registry).decode())
    _run_steps(times)
    lookups.queried_tokens, lookups.hit_tokens = 250, 60  # 200 looked up in the window, 50 found
    metrics.observe_engine(_engine(times, lookups))
    after = breakdown.parse_counters(generate_latest(metrics.registry).decode())
    assert after == counters(_engine(times, lookups)) and set(before) == set(after)
    row = breakdown.summarize(before, after, loop_cpu=2.0, wall=10.0)
    assert row["steps_s"] == pytest.approx(0.4) and row["prefill_steps_s"] == pytest.approx(0.1)
    assert row["decode_rows"] == 4 and row["decode_ms"] == pytest.approx(1000) and row["prefill_ms"] == 1000
    assert row["host_ms"] == pytest.approx(1e3 * 1.0 / 4)
    assert row["decode_share"] == pytest.approx(0.3) and row["idle_share"] == pytest.approx(0.5)
    assert row["loop_cpu"] == pytest.approx(0.2) and row["prefix_hit_share"] == pytest.approx(0.25)
    assert breakdown.summarize(after, after, 0.0, 1.0)["prefix_hit_share"] == 0


def test_phases_accumulate_across_steps() -> None:
    times = StepTimes()
    for _ in range(2):
        with times.phase("sample"):
            pass
    with pytest.raises(RuntimeError):
        with times.phase("output"):
            raise RuntimeError("a failed phase still counts its time")
    assert times.seconds["sample"] > 0 and times.seconds["output"] > 0 and times.steps["decode"] == 0
