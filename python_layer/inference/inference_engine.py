"""InferenceEngine: requests in, tokens out, several requests batched together in every step."""

from __future__ import annotations

import itertools
import os
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..memory.radix_cache import RadixAttentionCache
from ..model.qwen3_model import DEFAULT_BACKEND, Qwen3Model
from ..tokenizer.detokenizer import IncrementalDetokenizer
from ..tokenizer.qwen_tokenizer import QwenTokenizer, tokenizer_for_checkpoint
from .model_runner import ModelRunner
from .request import InferenceRequest, RequestOutput
from .sampler import Sampler, TokenLogprobs
from .scheduler import ContinuousBatchScheduler
from .sampling_params import SamplingParams

Prompt = Union[str, List[int]]


class InferenceEngine:
    """Runs Qwen3 on a paged KV cache with continuous batching (see scheduler.py): each `step` computes one
    ragged batch of decode tokens and prompt chunks, then samples the requests that reached their last token.
    With prefix caching on, requests reuse the KV pages of earlier requests that share their prefix."""

    def __init__(
        self,
        model: Qwen3Model,
        tokenizer: Optional[QwenTokenizer] = None,
        num_kv_pages: Optional[int] = None,
        kv_cache_memory_gb: float = 2.0,
        page_size: int = 16,
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        debug_checks: bool = False,
    ) -> None:
        self.model = model
        config = model.config
        self.tokenizer = tokenizer or tokenizer_for_checkpoint(model.model_path)
        if num_kv_pages is None:
            bytes_per_page = 2 * config.num_hidden_layers * page_size * config.num_key_value_heads * config.head_dim * model.dtype.itemsize
            num_kv_pages = max(1, min(4096, int(kv_cache_memory_gb * 2**30 // bytes_per_page)))
        self.kv_cache = model.new_kv_cache(num_kv_pages, page_size)
        limit = min(config.max_position_embeddings, num_kv_pages * page_size)
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds what this engine can hold: {limit} tokens "
                f"(max_position_embeddings {config.max_position_embeddings}, KV pool {num_kv_pages} pages of {page_size}); "
                "lower max_model_len or give more num_kv_pages / kv_cache_memory_gb"
            )
        self.max_model_len = max_model_len or limit
        self.eos_token_ids = set(config.eos_token_ids) | ({self.tokenizer.eos_token_id} - {None})
        self.prefix_cache = RadixAttentionCache(self.kv_cache) if enable_prefix_caching else None
        self.scheduler = ContinuousBatchScheduler(self.kv_cache, self.prefix_cache, max_num_seqs, max_num_batched_tokens)
        self.runner = ModelRunner(model, self.kv_cache)
        self.sampler = Sampler()
        self.debug_checks = debug_checks
        self._ids = itertools.count()

    @classmethod
    def from_pretrained(
        cls,
        model_path: Optional[str | os.PathLike] = None,
        device: str = "cpu",
        dtype: str | torch.dtype = "auto",
        backend: str = DEFAULT_BACKEND,
        **engine_args,
    ) -> "InferenceEngine":
        """Load a checkpoint directory or hub id (None: MILI's built-in random-weight test model)."""
        if model_path is None:
            from ..model.random_checkpoint import builtin_model_path

            model_path = builtin_model_path()
        return cls(Qwen3Model.from_pretrained(model_path, device=device, dtype=dtype, backend=backend), **engine_args)

    @property
    def requests(self) -> Dict[str, InferenceRequest]:
        """The unfinished requests by id."""
        return self.scheduler.requests

    @property
    def num_request_pages(self) -> int:
        """KV pages held by running requests (pages held only by the prefix cache can be reused)."""
        return len({p for request in self.scheduler.running for p in request.page_ids})

    # ---- requests -------------------------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None) -> str:
        """Queue a prompt (text, or token ids); returns its request id. Raises ValueError for a bad prompt."""
        params = params or SamplingParams()
        text, token_ids = self.check_prompt(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        max_total = min(self.max_model_len, len(token_ids) + params.max_tokens)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        detokenizer = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        request = InferenceRequest(request_id, text, token_ids, params, detokenizer, max_total, generator)
        if params.logprobs is not None:
            request.logprobs = []
        return self.scheduler.add_request(request)

    def check_prompt(self, prompt: Prompt) -> tuple[Optional[str], List[int]]:
        """(text or None, token ids) of a prompt; ValueError naming the problem when it cannot run here."""
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

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its KV pages (a finished or unknown request is ignored)."""
        self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_request_status(self, request_id: str) -> dict:
        return self.scheduler.get_request_status(request_id)

    def get_completed_result(self, request_id: str) -> Optional[RequestOutput]:
        return self.scheduler.get_completed_result(request_id)

    # ---- stepping -------------------------------------------------------------------------------------------

    def step(self) -> List[RequestOutput]:
        """Run one batch; returns the outputs of every request that got a new token (finished ones have
        finish_reason). A step that only computed prompt chunks returns nothing."""
        batch = self.scheduler.get_next_batch()
        if not batch:
            return []
        logits, sampling = self.runner.run(batch.items)
        for request, num_computed in batch.items:
            self.scheduler.update_request(request, num_computed)
        outputs = []
        if sampling:
            sampled = self.sampler(logits, [r.params for r in sampling], [r.generator for r in sampling],
                                   [(r.prompt_token_ids, r.output_token_ids) for r in sampling])
            for request, token, logprobs in zip(sampling, sampled.token_ids, sampled.logprobs):
                self._append_token(request, token, logprobs)
                outputs.append(request.output())
        if self.debug_checks:
            self.scheduler.check_page_accounting()
        return outputs

    def _append_token(self, request: InferenceRequest, token: int, logprobs: Optional[TokenLogprobs]) -> None:
        request.output_token_ids.append(token)
        if request.logprobs is not None:
            request.logprobs.append(logprobs)
        searched = len(request.text)
        request.text += request.detokenizer.add(token)
        params = request.params
        reason = None
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif len(request.output_token_ids) >= params.max_tokens or request.num_tokens >= request.max_total_tokens:
            reason = "length"
        if reason is not None:
            request.text += request.detokenizer.flush()
        stop_at = _find_stop(request.text, params.stop, searched)
        if stop_at is not None:
            request.text, reason = request.text[:stop_at], "stop"
        if reason is not None:
            self.scheduler.finish_request(request, reason)

    # ---- offline API ----------------------------------------------------------------------------------------

    def generate(
        self, prompts: Union[Prompt, Sequence[Prompt]], params: Union[SamplingParams, Sequence[SamplingParams], None] = None
    ) -> List[RequestOutput]:
        """Generate for every prompt (batched together); outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p in zip(prompts, params_list):
                ids.append(self.add_request(prompt, p))
        except ValueError:
            for request_id in ids:
                self.abort(request_id)
            raise
        results: Dict[str, RequestOutput] = {}
        while len(results) < len(ids):
            outputs = self.step()
            if not outputs and not self.has_unfinished_requests():
                raise RuntimeError("requests were aborted before they finished")
            for out in outputs:
                if out.finished:
                    results[out.request_id] = out
        return [results[i] for i in ids]


def _find_stop(text: str, stops: List[str], new_from: int) -> Optional[int]:
    """Where the first stop string that ends in text[new_from:] starts (earlier text was searched before)."""
    found = [i for i in (text.find(s, max(0, new_from - len(s) + 1)) for s in stops) if i >= 0]
    return min(found) if found else None
