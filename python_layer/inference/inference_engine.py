"""InferenceEngine: requests in, tokens out, several requests batched together in every step."""

from __future__ import annotations

import os
import time
import warnings
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ContextManager, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..memory.kv_cache_manager import DEFAULT_PAGE_SIZE, kv_page_bytes, kv_pages_for
from ..memory.radix_cache import RadixAttentionCache
from ..model.decode_graphs import DecodeGraphs
from ..model.device_memory import MAX_POOL_PERCENT
from ..model.loader import load_model
from ..model.qwen3_model import DEFAULT_BACKEND, Qwen3CausalLM
from ..tokenizer.detokenizer import IncrementalDetokenizer
from ..tokenizer.qwen_tokenizer import CheckpointTokenizer, tokenizer_for_checkpoint
from .model_runner import ModelRunner
from .request import InferenceRequest, RequestDelta, RequestOutput, RequestStatus, new_request_id
from .sampler import BatchSampler, DeviceTokens, SamplerOutput, TokenLogprobs, logits_only, to_device
from .scheduler import ContinuousBatchScheduler
from .step_times import StepTimes
from .sampling_params import SamplingParams

Prompt = Union[str, List[int]]


@dataclass
class _Launched:
    """A step given to the device: the requests that sample in it, and their tokens (sampled and read, or still
    on their way from the device; one of the two is set)."""

    requests: List[InferenceRequest]
    sampled: Optional[SamplerOutput] = None
    unread: Optional[DeviceTokens] = None


class InferenceEngine:
    """Runs Qwen3 on a paged KV cache with continuous batching (see scheduler.py): each `step` computes one
    ragged batch of decode tokens and prompt chunks, then samples the requests that reached their last token.
    With prefix caching on, requests reuse the KV pages of earlier requests that share their prefix. On a GPU
    the steps that only decode replay device graphs (model/decode_graphs.py; device_graphs=False turns that off).
    The KV cache holds num_kv_pages pages, or as many as kv_cache_memory_gb GiB hold, or by default 2 GiB's worth up to
    4096 pages."""

    def __init__(
        self,
        model: Qwen3CausalLM,
        tokenizer: Optional[CheckpointTokenizer] = None,
        num_kv_pages: Optional[int] = None,
        kv_cache_memory_gb: Optional[float] = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        max_finished_requests: int = 1024,
        debug_checks: bool = False,
        device_graphs: bool = True,
        overlap: bool = True,
    ) -> None:
        self.model = model
        config = model.config
        self.tokenizer = tokenizer or tokenizer_for_checkpoint(model.model_path)
        num_kv_pages = kv_pages_for(
            kv_page_bytes(config, page_size, model.kv_cache_dtype), num_kv_pages, kv_cache_memory_gb
        )
        self.kv_cache = model.new_kv_cache(num_kv_pages, page_size)
        # on a GPU the compiled graph replays its decode steps as device graphs (device_graphs=False: off, for
        # debugging)
        graphs = device_graphs and model.backend == "mojo" and model.device.type != "cpu"
        if graphs and num_kv_pages < 2:
            raise ValueError(
                "device graphs reserve one KV page for padding: give at least 2 pages (or device_graphs=False)"
            )
        pad_page = self.kv_cache.reserve_page() if graphs else None
        limit = min(config.max_position_embeddings, self.kv_cache.num_usable_pages * page_size)
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds what this engine can hold: {limit} tokens "
                f"(max_position_embeddings {config.max_position_embeddings}, "
                f"KV pool {self.kv_cache.num_usable_pages} pages of {page_size}); "
                "lower max_model_len or give more num_kv_pages / kv_cache_memory_gb"
            )
        self.max_model_len = max_model_len or limit
        self.eos_token_ids = set(config.eos_token_ids) | ({self.tokenizer.eos_token_id} - {None})
        self.prefix_cache = RadixAttentionCache(self.kv_cache) if enable_prefix_caching else None
        self.scheduler = ContinuousBatchScheduler(
            self.kv_cache, self.prefix_cache, max_num_seqs, max_num_batched_tokens
        )
        decode_graphs = None
        if graphs:
            decode_graphs = DecodeGraphs(
                model.forward_fn, self.kv_cache, max_num_seqs, self.kv_cache.pages_for(self.max_model_len), pad_page
            )
            try:
                decode_graphs.warm_up()
            except Exception as e:  # serve anyway, as --no-device-graphs would
                warnings.warn(
                    f"decode steps run op by op, not as device graphs: {e} (if out of memory: MAX's pool "
                    "left room for the KV cache load_model was told of; tell it this engine's, or set "
                    f"{MAX_POOL_PERCENT} lower)",
                    RuntimeWarning,
                    stacklevel=2,
                )
                decode_graphs = None
        self.runner = ModelRunner(model, self.kv_cache, decode_graphs)
        self.sampler = BatchSampler()
        self.debug_checks = debug_checks
        self.overlap = overlap  # with decode graphs: see step()
        self._in_flight: Optional[_Launched] = None
        self.times = StepTimes()
        self.finished: "OrderedDict[str, InferenceRequest]" = OrderedDict()  # the latest finished, for /status
        self.max_finished_requests = max_finished_requests

    @classmethod
    def from_pretrained(
        cls,
        model_path: Optional[str | os.PathLike] = None,
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        backend: str = DEFAULT_BACKEND,
        weight_dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        **engine_args,
    ) -> "InferenceEngine":
        """`load_model(model_path, device, dtype, backend, weight_dtype=..., kv_cache_dtype=...)` (None: the built-in
        random-weight model) in an engine; on a GPU MAX's memory pool leaves room for the engine's KV cache."""
        model = load_model(
            model_path,
            device=device,
            dtype=dtype,
            backend=backend,
            weight_dtype=weight_dtype,
            kv_cache_dtype=kv_cache_dtype,
            num_kv_pages=engine_args.get("num_kv_pages"),
            kv_cache_memory_gb=engine_args.get("kv_cache_memory_gb"),
            page_size=engine_args.get("page_size", DEFAULT_PAGE_SIZE),
        )
        return cls(model, **engine_args)

    @property
    def requests(self) -> Dict[str, InferenceRequest]:
        """The unfinished requests by id."""
        return self.scheduler.requests

    @property
    def num_request_pages(self) -> int:
        """KV pages held by running requests (pages held only by the prefix cache can be reused)."""
        return len({p for request in self.scheduler.running for p in request.page_ids})

    # ---- requests -------------------------------------------------------------------------------------------

    def add_request(
        self, prompt: Prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None
    ) -> str:
        """Queue a prompt (text, or token ids); returns its request id. Raises ValueError for a bad prompt."""
        text, token_ids = self.check_prompt(prompt)
        return self.submit(self.new_request(token_ids, params or SamplingParams(), request_id, text))

    def check_prompt(self, prompt: Prompt) -> tuple[Optional[str], List[int]]:
        """(text or None, token ids) of a prompt; ValueError naming the problem when it cannot run here. The
        front door: what passes is trusted from here on."""
        if isinstance(prompt, str):
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            text, token_ids = None, list(prompt)
            vocab = self.model.config.vocab_size
            bad = [t for t in token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be in [0, {vocab}): got {bad[:5]}")
        else:
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens, but the model's context (max_model_len) is "
                f"{self.max_model_len} tokens including at least one generated token: shorten the prompt"
            )
        return text, token_ids

    def new_request(
        self,
        token_ids: List[int],
        params: SamplingParams,
        request_id: Optional[str] = None,
        prompt: Optional[str] = None,
    ) -> InferenceRequest:
        """A request for prompt token ids that `check_prompt` passed (safe to call off the engine thread)."""
        max_total = min(self.max_model_len, len(token_ids) + params.max_tokens)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        detokenizer = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        return InferenceRequest(
            request_id or new_request_id(), prompt, list(token_ids), params, detokenizer, max_total, generator
        )

    def submit(self, request: InferenceRequest) -> str:
        """Queue a request made by `new_request`."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        return self.scheduler.add_request(request)

    def abort(self, request_id: str) -> Optional[RequestDelta]:
        """Stop a request now and free its KV pages; returns its last delta (None for a finished or unknown id)."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        return self._finish(request, "abort", request.held_text)

    def has_unfinished_requests(self) -> bool:
        """Whether a request is unfinished or a step's tokens are still to be read."""
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None

    def get_request(self, request_id: str) -> Optional[InferenceRequest]:
        """An unfinished request, or one of the latest `max_finished_requests` finished ones."""
        return self.requests.get(request_id) or self.finished.get(request_id)

    def get_request_status(self, request_id: str) -> dict:
        """The design documents' {"status": "processing" | "completed" | "not_found", ...}."""
        request = self.get_request(request_id)
        return request.status_dict() if request is not None else {"status": "not_found"}

    def get_completed_result(self, request_id: str) -> Optional[RequestOutput]:
        request = self.finished.get(request_id)
        return request.output() if request is not None else None

    # ---- stepping -------------------------------------------------------------------------------------------

    def step(self) -> List[RequestDelta]:
        """Run one batch; returns what is new for every request that got a new token (the last delta of a
        finished one has its finish_reason). A step that only computed prompt chunks returns nothing.

        With overlap on (decode graphs), a decode step whose rows need nothing but their logits (no logprobs, no
        penalties) is left running on the device, and the next call gives the device the decode step after it
        (its input ids are the tokens still on the device) before it reads this one's tokens: the host's work on
        a step's tokens then runs while the device computes the next step, as in SGLang's and MAX's overlap
        schedulers. Rows whose request ends on a token read late (an EOS, a stop string, an abort) were computed
        once for nothing and are dropped."""
        launched, self._in_flight = self._in_flight, None
        with self._torch_stream():
            if launched is None:
                with self.times.phase("schedule"):
                    batch = self.scheduler.get_next_batch()
                if not batch:
                    return []
                launched = self._launch(batch.items)
                if launched.unread is not None:
                    self._in_flight = launched
                    return []
            else:
                self._in_flight = self._launch_following(launched)
            return self._complete(launched)

    def _launch(self, items: List[Tuple[InferenceRequest, int]]) -> _Launched:
        """Give the device a scheduled batch. Its tokens are left unread when overlap can go on from it."""
        decode_only = self.runner.only_decodes(items)  # before update_request moves num_cached_tokens on
        with self.times.forward(items, decode_only):
            logits, sampling = self.runner.run(items)
        for request, num_computed in items:
            self.scheduler.update_request(request, num_computed)
        if decode_only and self._overlaps() and all(logits_only(r.params) for r in sampling):
            return _Launched(sampling, unread=self._sample_on_device(logits, sampling))
        if not sampling:
            return _Launched([], sampled=SamplerOutput([], []))
        with self.times.phase("sample"):
            sampled = self.sampler(logits, [r.params for r in sampling], [r.generator for r in sampling], sampling)
        return _Launched(sampling, sampled=sampled)

    def _launch_following(self, launched: _Launched) -> Optional[_Launched]:
        """The decode step after an unread one, for those of its requests that surely go on (None where there
        are none, where waiting requests could be admitted instead, or where the free pages are short)."""
        scheduler = self.scheduler
        if launched.unread is None or (scheduler.waiting and len(scheduler.running) < scheduler.max_num_seqs):
            return None
        rows = [
            i
            for i, r in enumerate(launched.requests)
            if r.status == RequestStatus.RUNNING and r.num_tokens + 1 < r.max_total_tokens
        ]
        requests = [launched.requests[i] for i in rows]
        if not requests or not scheduler.pages.grow_from_free_pages(requests, 1):
            return None
        input_ids = launched.unread.on_device
        if len(rows) < len(input_ids):
            input_ids = input_ids[to_device(rows, torch.long, input_ids.device)]
        with self.times.forward([(r, 1) for r in requests], decode=True):
            logits = self.runner.run_following(requests, input_ids)
        for request in requests:
            scheduler.update_request(request, 1)
        return _Launched(requests, unread=self._sample_on_device(logits, requests))

    def _complete(self, launched: _Launched) -> List[RequestDelta]:
        """Read a launched step's tokens and hand them to their requests (none to those that ended meanwhile)."""
        if launched.unread is not None:
            with self.times.phase("sample"):
                token_ids, logprobs = launched.unread.tolist(), [None] * len(launched.requests)
        else:
            token_ids, logprobs = launched.sampled.token_ids, launched.sampled.logprobs
        now = time.perf_counter()
        with self.times.phase("output"):
            deltas = [
                self._append_token(request, token, lp, now)
                for request, token, lp in zip(launched.requests, token_ids, logprobs)
                if request.status == RequestStatus.RUNNING
            ]
        if self.debug_checks:
            self.scheduler.check_page_accounting()
        return deltas

    def _sample_on_device(self, logits: torch.Tensor, requests: List[InferenceRequest]) -> DeviceTokens:
        with self.times.phase("sample"):
            return self.sampler.on_device(logits, [r.params for r in requests], [r.generator for r in requests])

    def _overlaps(self) -> bool:
        graphs = self.runner.decode_graphs
        return self.overlap and graphs is not None and graphs.can_overlap

    def _torch_stream(self) -> ContextManager:
        graphs = self.runner.decode_graphs
        return graphs.torch_stream() if graphs is not None else nullcontext()

    def _append_token(
        self, request: InferenceRequest, token: int, logprobs: Optional[TokenLogprobs], now: float
    ) -> RequestDelta:
        request.token_ids.append(token)
        if request.last_token_time is not None:
            request.token_interval = now - request.last_token_time
        request.last_token_time = now
        if request.logprobs is not None:
            request.logprobs.append(logprobs)
        params = request.params
        reason = None
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif request.num_output_tokens >= params.max_tokens or request.num_tokens >= request.max_total_tokens:
            reason = "length"
        text = request.held_text + request.detokenizer.add(token)
        if reason is not None:
            text += request.detokenizer.flush()
        keep = 0
        if params.stop:
            stop_at = _find_stop(text, params.stop)
            if stop_at is not None:
                text, reason = text[:stop_at], "stop"
            # hold back the tail that could still be the start of a stop string
            keep = min(len(text), max(len(s) for s in params.stop) - 1)
        lp = None if logprobs is None else [logprobs]
        if reason is not None:
            return self._finish(request, reason, text, [token], lp)
        request.held_text = text[len(text) - keep :]
        return self._delta(request, [token], text[: len(text) - keep], lp)

    def _finish(
        self,
        request: InferenceRequest,
        reason: str,
        text: str,
        token_ids: Sequence[int] = (),
        logprobs: Optional[list] = None,
    ) -> RequestDelta:
        self.scheduler.finish_request(request, reason)
        request.held_text = ""
        self.finished[request.request_id] = request
        while len(self.finished) > self.max_finished_requests:
            self.finished.popitem(last=False)
        return self._delta(request, list(token_ids), text, logprobs)

    @staticmethod
    def _delta(request: InferenceRequest, token_ids: List[int], text: str, logprobs: Optional[list]) -> RequestDelta:
        if text:
            request.text_pieces.append(text)
        return RequestDelta(request.request_id, token_ids, text, logprobs, request.finish_reason)

    # ---- offline API ----------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
    ) -> List[RequestOutput]:
        """Generate for every prompt (batched together); outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        checked = [self.check_prompt(p) for p in prompts]  # a bad prompt anywhere: nothing is queued
        requests = [
            self.new_request(ids, p or SamplingParams(), prompt=text) for (text, ids), p in zip(checked, params_list)
        ]
        for request in requests:
            self.submit(request)
        while not all(r.finished for r in requests):
            self.step()
        while self._in_flight is not None and not self.scheduler.has_unfinished_requests():
            self.step()  # rows computed for nothing: leave the device idle, not busy behind the caller's back
        return [r.output() for r in requests]


def _find_stop(text: str, stops: List[str]) -> Optional[int]:
    """Where the first stop string in text starts (text is the held-back tail plus the new piece: a stop string
    that ends in the new piece lies wholly inside it)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
