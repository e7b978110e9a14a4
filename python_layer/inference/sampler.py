"""Token sampling from logits: greedy, temperature, top-k, top-p, min-p, per-request seeds."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .sampling_params import SamplingParams


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep the top_k[b] largest logits of row b (top_k 0: keep all)."""
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).long()
    sorted_logits = logits.sort(dim=-1, descending=True).values
    threshold = sorted_logits.gather(-1, (k - 1)[:, None])
    return logits.masked_fill(logits < threshold, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p[b] (always at least the top one)."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)[:, None]
    drop[:, -1] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p[b] times the top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


class Sampler:
    """Samples one token per row of a batch, each row with its own parameters and generator."""

    def __call__(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[Optional[torch.Generator]]
    ) -> torch.Tensor:
        logits = logits.float()
        tokens = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return tokens
        sub = [params[i] for i in rows]
        x = logits[rows] / torch.tensor([p.temperature for p in sub])[:, None]
        x = apply_top_k(x, torch.tensor([p.top_k for p in sub]))
        x = apply_top_p(x, torch.tensor([p.top_p for p in sub], dtype=torch.float32))
        x = apply_min_p(x, torch.tensor([p.min_p for p in sub], dtype=torch.float32))
        probs = x.softmax(dim=-1)
        for j, i in enumerate(rows):
            tokens[i] = _draw(probs[j], generators[i])
        return tokens

    @staticmethod
    def greedy_sampling(logits: torch.Tensor) -> torch.Tensor:
        """The most likely token of each row: [batch]."""
        return logits.argmax(dim=-1)

    @staticmethod
    def temperature_sampling(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return Sampler.top_k_top_p_sampling(logits, temperature=temperature, top_k=0, top_p=1.0)

    @staticmethod
    def top_k_top_p_sampling(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 50, top_p: float = 0.95) -> torch.Tensor:
        """One sampled token per row of logits [batch, vocab] (temperature 0 is greedy)."""
        logits = logits.float().reshape(-1, logits.shape[-1])
        params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * logits.shape[0]
        return Sampler()(logits, params, [None] * logits.shape[0])
