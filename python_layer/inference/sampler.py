"""Token sampling from logits: penalties, greedy, temperature, top-k, top-p, min-p, per-request seeds, logprobs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from bindings import ops

from .sampling_params import SamplingParams

MAX_TOP_K_CANDIDATES = 1024  # batches whose sampled rows all have top_k up to this never sort the vocabulary


class History(Protocol):
    """A request's tokens so far (InferenceRequest is one): read only for rows with penalties."""

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_token_ids(self) -> Sequence[int]: ...


class TokenHistory(NamedTuple):
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob) of the k most likely tokens, most likely first


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # None for rows whose params.logprobs is None


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


def to_device(values: Sequence | torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values as a tensor on device, copied without waiting for the device: torch's plain copy from pageable
    memory waits for the whole stream, which would stall the host behind a step still in flight."""
    t = torch.as_tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)


def _per_row(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    return to_device(values, torch.float32, like.device)


def _token_counts(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab] count of each token id in each list."""
    flat = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long, device=device)
    rows = torch.arange(len(token_lists), device=device).repeat_interleave(
        torch.tensor([len(tokens) for tokens in token_lists], device=device))
    return torch.bincount(rows * vocab + flat, minlength=len(token_lists) * vocab).view(-1, vocab)


def apply_penalties(
    logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[History] | None
) -> torch.Tensor:
    """vLLM's repetition (prompt and output tokens), frequency and presence (output tokens) penalties, applied
    to a copy of the rows that ask for them; logits itself is returned when no row does."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    if histories is None:
        raise ValueError("repetition, frequency and presence penalties need the token histories")
    sub = [params[i] for i in rows]
    vocab, device, index = logits.shape[-1], logits.device, torch.tensor(rows, device=logits.device)
    output_counts = _token_counts([histories[i].output_token_ids for i in rows], vocab, device)
    seen = (output_counts > 0) | (_token_counts([histories[i].prompt_token_ids for i in rows], vocab, device) > 0)
    repetition = torch.where(seen, _per_row([p.repetition_penalty for p in sub], logits)[:, None], 1.0)
    x = logits[index]
    x = torch.where(x > 0, x / repetition, x * repetition)
    x = x - _per_row([p.frequency_penalty for p in sub], x)[:, None] * output_counts
    x = x - _per_row([p.presence_penalty for p in sub], x)[:, None] * (output_counts > 0)
    return logits.index_put((index,), x)


def _uniforms(generators: Sequence[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One uniform in [0, 1) per row (float64), from the row's own generator if it has one: a seeded request draws
    the same whatever else is in the batch."""
    u = torch.rand(len(generators), dtype=torch.float64, device=device)  # what unseeded rows draw
    seeded = [i for i, g in enumerate(generators) if g is not None]
    if seeded:  # each seeded row's own draw, from its generator on the host
        draws = torch.cat([torch.rand(1, dtype=torch.float64, generator=generators[i]) for i in seeded])
        u.index_copy_(0, to_device(seeded, torch.long, device), to_device(draws, torch.float64, device))
    return u


def _draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row by inverse transform sampling: the first token whose cumulative probability (float64)
    exceeds the row's uniform times its total. One uniform per row, where torch.multinomial took ~4 ms per
    152k-token row on a CPU and an exponential race needs a vocabulary of them."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    # right=True: a token of probability 0 spans no interval and is never drawn
    drawn = torch.searchsorted(cdf, _uniforms(generators, probs.device)[:, None] * cdf[:, -1:], right=True)
    return drawn.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _logprobs(
    logits: torch.Tensor, params: Sequence[SamplingParams], tokens: torch.Tensor
) -> list[TokenLogprobs | None]:
    """The sampled token's logprob and the top-k alternatives of the rows that ask for them."""
    out: list[TokenLogprobs | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    logprobs = logits[rows].log_softmax(dim=-1)
    chosen_ids = tokens[rows]
    chosen = logprobs.gather(-1, chosen_ids[:, None]).squeeze(-1).tolist()
    top = logprobs.topk(max(params[i].logprobs for i in rows), dim=-1)
    top_ids, top_values = top.indices.tolist(), top.values.tolist()
    for j, (i, token) in enumerate(zip(rows, chosen_ids.tolist())):
        k = params[i].logprobs
        out[i] = TokenLogprobs(token, chosen[j], list(zip(top_ids[j][:k], top_values[j][:k])))
    return out


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest logit (the first one of ties, or a NaN). On a CPU numpy's vectorized argmax
    takes ~6 µs for Qwen3's 151,936 logits where torch's takes ~80 µs."""
    if logits.device.type == "cpu":
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def logits_only(params: SamplingParams) -> bool:
    """Whether a row's token needs nothing but its logits: no logprobs back, no penalties (no token history)."""
    return params.logprobs is None and not params.has_penalties


class DeviceTokens:
    """A step's sampled tokens, kept on the device (the next step can read its input ids there) and copied to
    the host behind the step's work: `tolist` waits for that copy alone, not for whatever the device was given
    after it. On a GPU create it on the stream that computed the tokens."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.on_device = tokens.to(torch.int32)
        self._ready = None
        if tokens.device.type == "cpu":
            self._host = self.on_device
        else:
            self._host = torch.empty(self.on_device.shape, dtype=torch.int32, pin_memory=True)
            self._host.copy_(self.on_device, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def tolist(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()


@contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Sampling on a CPU runs on one torch thread: torch's OpenMP workers spin-wait after a parallel region and
    take the cores from the MAX kernels of the next step (built-in model, batch 8: 14.6 -> 10.2 ms per step)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class BatchSampler:
    """Samples one token per row of a batch, each row with its own parameters, generator and history."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        histories: Sequence[History] | None = None,
    ) -> SamplerOutput:
        """histories: each row's tokens so far, needed by rows with penalties.
        Logprobs are of the raw logits (before penalties, temperature and truncation)."""
        if all(p.greedy and logits_only(p) for p in params):
            return SamplerOutput(_argmax(logits.float()).tolist(), [None] * len(params))  # the common decode step
        with _one_cpu_thread(logits.device):
            logits = logits.float()
            tokens = self._sample(apply_penalties(logits, params, histories), params, generators)
            return SamplerOutput(tokens.tolist(), _logprobs(logits, params, tokens))

    def on_device(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator | None]) -> DeviceTokens:
        """The tokens of rows that need nothing but their logits (`logits_only`), left on the device: nothing
        here waits for the device, so the host can go on while it computes."""
        with _one_cpu_thread(logits.device):
            return DeviceTokens(self._sample(logits.float(), params, generators))

    @staticmethod
    def _sample(
        logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
    ) -> torch.Tensor:
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if not rows:
            return _argmax(logits)
        sub = [params[i] for i in rows]
        index = None if len(rows) == len(params) else to_device(rows, torch.long, logits.device)
        x = logits if index is None else logits[index]  # every filter below makes a new tensor
        generators = [generators[i] for i in rows]
        candidates = None
        top_k_rows = all(0 < p.top_k <= MAX_TOP_K_CANDIDATES for p in sub)
        if top_k_rows and x.is_cpu:
            # the filters and the draw below in one kernel call (mojo_kernels/core/sampling.mojo): each torch op
            # here pays for the caches the model's step left cold
            drawn = ops.sample_top_k(x, torch.tensor([min(p.top_k, x.shape[-1]) for p in sub], dtype=torch.int32),
                                     torch.tensor([(p.temperature, p.top_p, p.min_p) for p in sub]),
                                     _uniforms(generators, x.device))
            return drawn if index is None else _argmax(logits).index_copy_(0, index, drawn)
        top_k = to_device([p.top_k for p in sub], torch.long, x.device)
        if top_k_rows:
            # every row keeps at most its top_k best: filter and draw among the max(top_k) best of each row
            x, candidates = x.topk(min(max(p.top_k for p in sub), x.shape[-1]), dim=-1)  # k from the host: no sync
            x = x.masked_fill(torch.arange(x.shape[-1], device=x.device) >= top_k[:, None], float("-inf"))
        elif any(p.top_k > 0 for p in sub):
            x = apply_top_k(x, top_k)
        x = x / _per_row([p.temperature for p in sub], x)[:, None]
        # each filter sorts or normalizes its rows: skip those no row asks for
        if any(p.top_p < 1 for p in sub):
            x = apply_top_p(x, _per_row([p.top_p for p in sub], x))
        if any(p.min_p > 0 for p in sub):
            x = apply_min_p(x, _per_row([p.min_p for p in sub], x))
        if candidates is not None:  # in token id order, as on the full vocabulary: a seed draws the same either way
            candidates, order = candidates.sort(dim=-1)
            x = x.gather(-1, order)
        drawn = _draw(x.softmax(dim=-1), generators)
        drawn = drawn if candidates is None else candidates.gather(-1, drawn[:, None]).squeeze(-1)
        return drawn if index is None else _argmax(logits).index_copy_(0, index, drawn)  # greedy rows too
