"""The names and signatures the design documents promise (docs 01 and 02) that the engine itself does not use:
thin subclasses and snapshots over the engine's classes, kept here so that engine code carries none of them.
`python_layer` exports these in place of the engine classes they extend."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import List, Optional, Tuple

import torch

from .inference.generate import generate_text
from .inference.request import InferenceRequest
from .inference.sampler import BatchSampler
from .inference.sampling_params import SamplingParams
from .memory.kv_cache_manager import DEFAULT_PAGE_SIZE, PagedKVCache
from .model import qwen3_model
from .model.config import Qwen3Config
from .tokenizer import chat_template, qwen_tokenizer


class RequestPhase(enum.Enum):
    PREFILL = 1  # prompt tokens (or, after a preemption, prompt and output) still to compute
    DECODE = 2  # one new token per step


@dataclass
class RequestMetadata:
    """A request's progress in the design documents' shape; `from_request` snapshots an engine request."""

    request_id: str
    prompt_tokens: List[int]
    max_tokens: int = 128
    generated_tokens: List[int] = field(default_factory=list)
    phase: RequestPhase = RequestPhase.PREFILL
    seq_length: int = 0
    finished: bool = False  # ended before max_tokens (a stop token or string, an abort)

    @classmethod
    def from_request(cls, request: InferenceRequest) -> "RequestMetadata":
        decoding = request.num_tokens - request.num_cached_tokens == 1
        return cls(
            request_id=request.request_id,
            prompt_tokens=request.prompt_token_ids,
            max_tokens=request.max_tokens,
            generated_tokens=request.output_token_ids,
            phase=RequestPhase.DECODE if decoding else RequestPhase.PREFILL,
            seq_length=request.num_tokens,
            finished=request.finished,
        )

    def is_complete(self) -> bool:
        return self.finished or len(self.generated_tokens) >= self.max_tokens

    def tokens_remaining(self) -> int:
        return 0 if self.is_complete() else self.max_tokens - len(self.generated_tokens)


class Sampler(BatchSampler):
    """The engine's batch sampler plus the design documents' one-call static methods."""

    @staticmethod
    def greedy_sampling(logits: torch.Tensor) -> torch.Tensor:
        """The most likely token of each row: [batch]."""
        return logits.argmax(dim=-1)

    @staticmethod
    def temperature_sampling(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        return Sampler.top_k_top_p_sampling(logits, temperature=temperature, top_k=0, top_p=1.0)

    @staticmethod
    def top_k_top_p_sampling(
        logits: torch.Tensor, temperature: float = 1.0, top_k: int = 50, top_p: float = 0.95
    ) -> torch.Tensor:
        """One sampled token per row of logits [batch, vocab] (temperature 0 is greedy)."""
        logits = logits.float().reshape(-1, logits.shape[-1])
        params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * logits.shape[0]
        return Sampler._sample(logits, params, [None] * logits.shape[0])


_CACHE_TYPES = ("k", "v")


class KVCacheAllocator(PagedKVCache):
    """The design documents' page-at-a-time API over the engine's PagedKVCache."""

    def __init__(
        self,
        config: Qwen3Config,
        max_batch_size: int = 64,
        max_seq_length: int = 32768,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        num_pages: Optional[int] = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        # max_batch_size is in the design documents' signature only: the pool is sized by num_pages or max_seq_length
        super().__init__(
            config.num_hidden_layers, num_pages or math.ceil(max_seq_length / page_size),
            config.num_key_value_heads, config.head_dim, page_size, dtype, device,
        )

    def allocate_page(self) -> int:
        pages = self.allocate_pages(1)
        if pages is None:
            raise RuntimeError(f"Insufficient pages in KV cache: all {self.num_pages} pages are in use")
        return pages[0]

    def free_page(self, page_id: int) -> None:
        self.free_pages([page_id])

    def add_page_reference(self, page_id: int) -> None:
        self.add_reference([page_id])

    def _cache(self, cache_type: str, layer: int) -> torch.Tensor:
        if cache_type not in _CACHE_TYPES:
            raise ValueError(f"cache_type must be 'k' or 'v', got {cache_type!r}")
        return (self.k_caches if cache_type == "k" else self.v_caches)[layer]

    def get_page(self, page_id: int, cache_type: str = "k", layer: int = 0) -> torch.Tensor:
        """One page, [page_size, num_kv_heads, head_dim] (a view)."""
        return self._cache(cache_type, layer)[page_id]

    def gather_pages(self, page_ids: List[int], seq_len: int, cache_type: str = "k", layer: int = 0) -> torch.Tensor:
        """The first seq_len tokens held by page_ids, contiguous: [seq_len, num_kv_heads, head_dim]."""
        if seq_len > len(page_ids) * self.page_size:
            raise ValueError(
                f"seq_len {seq_len} exceeds the {len(page_ids)} page(s) given ({len(page_ids) * self.page_size} tokens)"
            )
        cache = self._cache(cache_type, layer)
        return cache[torch.tensor(page_ids, dtype=torch.long)].flatten(0, 1)[:seq_len].clone()

    def write_pages(self, page_ids: List[int], data: torch.Tensor, cache_type: str = "k", layer: int = 0) -> None:
        """Write data [n, num_kv_heads, head_dim] into page_ids, from the first slot of the first page on."""
        if data.shape[0] > len(page_ids) * self.page_size:
            raise ValueError(f"{data.shape[0]} tokens do not fit in {len(page_ids)} page(s) of {self.page_size}")
        cache = self._cache(cache_type, layer)
        for i, p in enumerate(page_ids):
            chunk = data[i * self.page_size : (i + 1) * self.page_size]
            if chunk.shape[0] == 0:
                break
            cache[p, : chunk.shape[0]] = chunk.to(cache.dtype)


class QwenTokenizer(qwen_tokenizer.CheckpointTokenizer):
    """The engine's tokenizer plus the design documents' `batch_encode`."""

    def batch_encode(
        self,
        texts: List[str],
        max_length: Optional[int] = 2048,
        padding: bool = True,
        truncation: bool = True,
        return_tensors: bool = False,
        add_special_tokens: bool = True,
        padding_side: str = "right",
    ) -> dict:
        """{"input_ids", "attention_mask"}: truncated to max_length, padded with the pad id to the longest text.
        With return_tensors, int64 torch tensors (padding is then required)."""
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        ids = self.encode(list(texts), add_special_tokens=add_special_tokens)
        if truncation and max_length is not None:
            ids = [seq[:max_length] for seq in ids]
        masks = [[1] * len(seq) for seq in ids]
        if padding and ids:
            if self.pad_token_id is None:
                raise ValueError("This tokenizer has no pad token: call batch_encode with padding=False")
            longest = max(len(seq) for seq in ids)
            pads = [longest - len(seq) for seq in ids]
            if padding_side == "right":
                ids = [seq + [self.pad_token_id] * n for seq, n in zip(ids, pads)]
                masks = [m + [0] * n for m, n in zip(masks, pads)]
            else:
                ids = [[self.pad_token_id] * n + seq for seq, n in zip(ids, pads)]
                masks = [[0] * n + m for m, n in zip(masks, pads)]
        if return_tensors:
            if not padding and len({len(seq) for seq in ids}) > 1:
                raise ValueError("return_tensors needs padding=True when the texts have different lengths")
            return {
                "input_ids": torch.tensor(ids, dtype=torch.long),
                "attention_mask": torch.tensor(masks, dtype=torch.long),
            }
        return {"input_ids": ids, "attention_mask": masks}


@lru_cache(maxsize=1)
def get_tokenizer() -> QwenTokenizer:
    """The shared vendored Qwen3 tokenizer, with batch_encode (loaded once)."""
    return QwenTokenizer()


class MessageFormatter(chat_template.ChatTemplate):
    """The engine's chat formatter plus the design documents' `parse_response` method."""

    def parse_response(self, text: str) -> Tuple[Optional[str], str]:
        """(reasoning or None, content) of generated text: see chat_template.parse_response."""
        return chat_template.parse_response(text)


class Qwen3Model(qwen3_model.Qwen3CausalLM):
    """The engine's model plus the design documents' one-call `generate`."""

    def generate(
        self, prompt: str, max_tokens: int = 128, temperature: float = 1.0, top_p: float = 0.95, top_k: int = 50
    ) -> str:
        """The text generated after prompt, on a throwaway engine sized for it (see inference/generate.py)."""
        return generate_text(self, prompt, max_tokens, temperature, top_p, top_k)
