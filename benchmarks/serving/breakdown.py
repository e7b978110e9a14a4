"""Where a served step's time goes, over one benchmark window: MILI's /metrics (the engine thread's seconds by
phase and its steps by kind, python_layer/inference/step_times.py) read before and after, and the CPU of the
server's main thread, its event loop (HTTP, JSON, SSE, tokenizing prompts)."""

from __future__ import annotations

from typing import Dict, Tuple

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from python_layer.inference.step_times import PHASES, STEP_KINDS

Counters = Dict[Tuple[str, str], float]
COLUMNS = ["steps_s", "decode_rows", "prefill_steps_s", "decode_ms", "prefill_ms", "host_ms"] + [
    f"{phase}_share" for phase in PHASES] + ["idle_share", "loop_cpu", "prefix_hit_share"]
"""steps_s: steps a second; decode_rows: mean requests in a decode step; decode_ms / prefill_ms: the model's time
per step of that kind; host_ms: schedule + sample + output + deliver per step; <phase>_share: the phase's share of
the window's wall time on the engine thread; idle_share: the rest (waiting for requests, untimed bookkeeping);
loop_cpu: cores the event loop took; prefix_hit_share: the prompt tokens the prefix cache answered (a benchmark
whose prompts are all new reads 0)."""
_LABEL = {"mili_engine_phase_seconds_total": "phase", "mili_engine_steps_total": "kind",
          "mili_engine_step_rows_total": "kind", "mili_prefix_cache_queries_total": None,
          "mili_prefix_cache_hits_total": None}


def engine_counters(url: str) -> Counters:
    """(metric, phase or kind) -> value of the mili_engine_* counters a MILI server exports now."""
    return parse_counters(httpx.get(f"{url}/metrics", timeout=10).text)


def parse_counters(text: str) -> Counters:
    """The mili_engine_* and prefix-cache counters of a /metrics text."""
    return {(s.name, s.labels[_LABEL[s.name]] if _LABEL[s.name] else ""): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name in _LABEL}


def event_loop_cpu_seconds(pid: int) -> float:
    """user + system seconds of a process's main thread (uvicorn's event loop)."""
    thread = next(t for t in psutil.Process(pid).threads() if t.id == pid)
    return thread.user_time + thread.system_time


def summarize(before: Counters, after: Counters, loop_cpu: float, wall: float) -> dict:
    """The COLUMNS over a window of `wall` seconds; loop_cpu: the event loop's CPU seconds in it."""
    def added(name: str, label: str) -> float:
        return after.get((name, label), 0.0) - before.get((name, label), 0.0)

    seconds = {p: added("mili_engine_phase_seconds_total", p) for p in PHASES}
    steps = {k: added("mili_engine_steps_total", k) for k in STEP_KINDS}
    total_steps = max(sum(steps.values()), 1.0)
    host = sum(seconds[p] for p in ("schedule", "sample", "output", "deliver"))
    row = {"steps_s": total_steps / wall,
           "decode_rows": added("mili_engine_step_rows_total", "decode") / max(steps["decode"], 1.0),
           "prefill_steps_s": steps["prefill"] / wall,
           "decode_ms": 1e3 * seconds["decode"] / max(steps["decode"], 1.0),
           "prefill_ms": 1e3 * seconds["prefill"] / max(steps["prefill"], 1.0),
           "host_ms": 1e3 * host / total_steps,
           "loop_cpu": loop_cpu / wall}
    row.update({f"{p}_share": seconds[p] / wall for p in PHASES})
    row["idle_share"] = 1 - sum(seconds.values()) / wall
    queried = added("mili_prefix_cache_queries_total", "")
    row["prefix_hit_share"] = added("mili_prefix_cache_hits_total", "") / queried if queried else 0.0
    return row
