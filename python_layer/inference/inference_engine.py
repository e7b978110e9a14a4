"""InferenceEngine: requests in, tokens out, several requests batched together in every step."""

from __future__ import annotations

import itertools
import os
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Union

import torch

from ..model.qwen3_model import Qwen3Model
from ..tokenizer.detokenizer import IncrementalDetokenizer
from ..tokenizer.qwen_tokenizer import QwenTokenizer, tokenizer_for_checkpoint
from .model_runner import ModelRunner
from .request import InferenceRequest, RequestOutput, RequestStatus
from .sampler import Sampler
from .sampling_params import SamplingParams

Prompt = Union[str, List[int]]


class InferenceEngine:
    """Runs Qwen3 on a paged KV cache. Each `step` computes, in one ragged batch, the whole prompt of every
    newly admitted request and one token of every running one. A request is admitted when the pool has pages
    for its prompt plus all of its output, so a running request never runs out of pages."""

    def __init__(
        self,
        model: Qwen3Model,
        tokenizer: Optional[QwenTokenizer] = None,
        num_kv_pages: Optional[int] = None,
        kv_cache_memory_gb: float = 2.0,
        page_size: int = 16,
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 64,
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
        self.max_num_seqs = max_num_seqs
        self.eos_token_ids = set(config.eos_token_ids) | ({self.tokenizer.eos_token_id} - {None})
        self.runner = ModelRunner(model, self.kv_cache)
        self.sampler = Sampler()
        self.waiting: Deque[InferenceRequest] = deque()
        self.running: List[InferenceRequest] = []
        self.requests: Dict[str, InferenceRequest] = {}
        self._ids = itertools.count()

    @classmethod
    def from_pretrained(
        cls,
        model_path: Optional[str | os.PathLike] = None,
        device: str = "cpu",
        dtype: str | torch.dtype = "float32",
        backend: str = "reference",
        **engine_args,
    ) -> "InferenceEngine":
        """Load a checkpoint directory or hub id (None: MILI's built-in random-weight test model)."""
        if model_path is None:
            from ..model.random_checkpoint import builtin_model_path

            model_path = builtin_model_path()
        return cls(Qwen3Model.from_pretrained(model_path, device=device, dtype=dtype, backend=backend), **engine_args)

    # ---- requests -------------------------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, params: Optional[SamplingParams] = None, request_id: Optional[str] = None) -> str:
        """Queue a prompt (text, or token ids); returns its request id. Raises ValueError for a bad prompt."""
        params = params or SamplingParams()
        text, token_ids = self._tokenize(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        max_total = min(self.max_model_len, len(token_ids) + params.max_tokens)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        detokenizer = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=params.skip_special_tokens)
        request = InferenceRequest(request_id, text, token_ids, params, detokenizer, max_total, generator)
        self.requests[request_id] = request
        self.waiting.append(request)
        return request_id

    def _tokenize(self, prompt: Prompt) -> tuple[Optional[str], List[int]]:
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
        request = self.requests.get(request_id)
        if request is None or request.status == RequestStatus.FINISHED:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, "abort")

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- stepping -------------------------------------------------------------------------------------------

    def step(self) -> List[RequestOutput]:
        """Run one batch; returns the outputs of every request it advanced (finished ones have finish_reason)."""
        batch = [(r, 1) for r in self.running] + [(r, r.num_tokens) for r in self._admit()]
        if not batch:
            return []
        logits = self.runner.run(batch)
        tokens = self.sampler(logits, [r.params for r, _ in batch], [r.generator for r, _ in batch])
        outputs = []
        for (request, num_new), token in zip(batch, tokens.tolist()):
            request.num_cached_tokens += num_new
            self._append_token(request, token)
            outputs.append(request.output())
        return outputs

    def _admit(self) -> List[InferenceRequest]:
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            pages = self.kv_cache.allocate_pages(self.kv_cache.pages_for(request.max_total_tokens))
            if pages is None:
                break
            self.waiting.popleft()
            request.page_ids, request.status = pages, RequestStatus.RUNNING
            self.running.append(request)
            admitted.append(request)
        return admitted

    def _append_token(self, request: InferenceRequest, token: int) -> None:
        request.output_token_ids.append(token)
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
            self._finish(request, reason)

    def _finish(self, request: InferenceRequest, reason: str) -> None:
        request.finish_reason, request.status = reason, RequestStatus.FINISHED
        if request in self.running:
            self.running.remove(request)
        self.kv_cache.free_pages(request.page_ids)
        request.page_ids = []
        del self.requests[request.request_id]

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
