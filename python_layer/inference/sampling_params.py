"""Per-request sampling parameters, with vLLM's names and defaults."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, NamedTuple


_GREEDY_BELOW = 1e-5


class Bound(NamedTuple):
    """The range of a float parameter: [low, high], or (low, high] when low_open; NaN and inf are never in it."""

    low: float
    high: float
    low_open: bool = False

    @property
    def rule(self) -> str:
        return f"must be a finite number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def admits(self, value: object) -> bool:
        return _is_finite(value) and (self.low < value if self.low_open else self.low <= value) and value <= self.high


# The one table of the float parameters' ranges: SamplingParams checks it and the HTTP API's fields
# (server/protocol.py) are generated from it. Temperature stops at 2 as in OpenAI's API: beyond, sampling is noise.
BOUNDS: Dict[str, Bound] = {
    "temperature": Bound(0, 2),
    "top_p": Bound(0, 1, low_open=True),
    "min_p": Bound(0, 1),
    "presence_penalty": Bound(-2, 2),
    "frequency_penalty": Bound(-2, 2),
    # beyond [0.01, 100] the float32 logits / penalty overflow (a penalty of 5e-324 is 0 in float32: NaN)
    "repetition_penalty": Bound(0.01, 100),
}


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 (anything below 1e-5) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    min_p: float = 0.0
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides positive / multiplies negative logits of prompt and output tokens
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    logprobs: int | None = None  # k: the sampled token's logprob and the top-k alternatives

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            _check(bound.admits(value), name, value, bound.rule)
        _check(_is_int(self.top_k) and (0 <= self.top_k < 2**31 or self.top_k == -1), "top_k", self.top_k,
               "must be an integer in [1, 2**31), or 0 / -1 to disable")
        _check(
            _is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", self.max_tokens, "must be an integer >= 1"
        )
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "must be non-empty strings")
        _check(all(_is_int(t) and 0 <= t < 2**31 for t in self.stop_token_ids), "stop_token_ids", self.stop_token_ids,
               "must be integers in [0, 2**31)")
        _check(self.seed is None or (_is_int(self.seed) and -(2**63) <= self.seed < 2**64), "seed", self.seed,
               "must be None or an integer in [-2**63, 2**64)")
        _check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20), "logprobs",
               self.logprobs, "must be None or an integer in [0, 20]")
        if self.top_k == -1:
            self.top_k = 0

    @property
    def greedy(self) -> bool:
        # below 1e-5, logits / temperature overflows to inf (vLLM draws the same line)
        return self.temperature < _GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name} {rule}, got {value!r}")
