"""Prometheus metrics of a serving engine (vLLM's set, under the `mili_` prefix), on their own registry."""

from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .inference_engine import InferenceEngine
from .request import InferenceRequest
from .step_times import PHASES, STEP_KINDS

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)


class EngineMetrics:
    def __init__(self, model_name: str, registry: Optional[CollectorRegistry] = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def labelled(metric):
            return metric.labels(model_name=model_name)

        self.running = labelled(Gauge("mili_num_requests_running", "Requests in the running batch", labels, registry=r))
        self.waiting = labelled(Gauge("mili_num_requests_waiting", "Requests waiting to run", labels, registry=r))
        self.kv_usage = labelled(Gauge("mili_kv_cache_usage_perc",
                                       "Fraction of KV pages held by requests (1 = full)", labels, registry=r))
        self.prefix_pages = labelled(Gauge("mili_prefix_cache_pages",
                                           "KV pages held by the prefix cache", labels, registry=r))
        self.preemptions = labelled(Counter("mili_num_preemptions", "Requests preempted", labels, registry=r))
        self.prefix_queries = labelled(Counter("mili_prefix_cache_queries",
                                               "Prompt tokens looked up in the prefix cache", labels, registry=r))
        self.prefix_hits = labelled(Counter("mili_prefix_cache_hits",
                                            "Prompt tokens found in the prefix cache", labels, registry=r))
        self.prompt_tokens = labelled(Counter("mili_prompt_tokens", "Prompt tokens processed", labels, registry=r))
        self.generation_tokens = labelled(Counter("mili_generation_tokens", "Tokens generated", labels, registry=r))
        self.ttft = labelled(Histogram("mili_time_to_first_token_seconds", "Time to first token", labels,
                                       buckets=_LATENCY_BUCKETS, registry=r))
        self.itl = labelled(Histogram("mili_inter_token_latency_seconds", "Time between output tokens", labels,
                                      buckets=_LATENCY_BUCKETS, registry=r))
        self.e2e = labelled(Histogram("mili_e2e_request_latency_seconds", "Arrival to finish of a request", labels,
                                      buckets=_LATENCY_BUCKETS, registry=r))
        self._success = Counter("mili_request_success", "Finished requests by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        # where the engine's time goes (step_times.py): rates over a window give the share of each phase
        phase_seconds = Counter("mili_engine_phase_seconds", "Engine thread seconds by phase of its steps",
                                ["model_name", "phase"], registry=r)
        steps = Counter("mili_engine_steps", "Steps run, by kind", ["model_name", "kind"], registry=r)
        step_rows = Counter("mili_engine_step_rows", "Requests computed in steps, by kind", ["model_name", "kind"],
                            registry=r)
        step_tokens = Counter("mili_engine_step_tokens", "Tokens computed in steps, by kind", ["model_name", "kind"],
                              registry=r)
        self._totals = [(phase_seconds.labels(model_name, p), ("seconds", p)) for p in PHASES]
        for kind in STEP_KINDS:
            self._totals += [(steps.labels(model_name, kind), ("steps", kind)),
                             (step_rows.labels(model_name, kind), ("rows", kind)),
                             (step_tokens.labels(model_name, kind), ("tokens", kind))]
        self._model_name = model_name
        self._seen = {"preemptions": 0, "queries": 0, "hits": 0, **{key: 0 for _, key in self._totals}}

    def observe_engine(self, engine: InferenceEngine) -> None:
        """Gauges and cumulative counters read off the engine after a step (engine thread)."""
        scheduler, kv = engine.scheduler, engine.kv_cache
        self.running.set(len(scheduler.running))
        self.waiting.set(len(scheduler.waiting))
        cached = engine.prefix_cache.num_cached_pages if engine.prefix_cache else 0
        self.prefix_pages.set(cached)
        # pages referenced only by the prefix cache are reusable: they do not count as used
        self.kv_usage.set(engine.num_request_pages / kv.num_usable_pages)
        self._add(self.preemptions, "preemptions", scheduler.num_preemptions)
        times = engine.times
        for counter, (field, name) in self._totals:
            self._add(counter, (field, name), getattr(times, field)[name])
        if engine.prefix_cache is not None:
            self._add(self.prefix_queries, "queries", engine.prefix_cache.queried_tokens)
            self._add(self.prefix_hits, "hits", engine.prefix_cache.hit_tokens)

    def _add(self, counter, key, total: float) -> None:
        counter.inc(total - self._seen[key])
        self._seen[key] = total

    def observe_tokens(self, request: InferenceRequest, new_tokens: int) -> None:
        """A request got new tokens (engine thread, right after the step that made them)."""
        if request.token_interval is None:
            self.ttft.observe(request.last_token_time - request.arrival_time)
            self.prompt_tokens.inc(request.num_prompt_tokens)
        else:
            self.itl.observe(request.token_interval / new_tokens)
        self.generation_tokens.inc(new_tokens)

    def observe_finished(self, finish_reason: Optional[str], seconds: float) -> None:
        self._success.labels(model_name=self._model_name, finished_reason=finish_reason or "unknown").inc()
        self.e2e.observe(seconds)
