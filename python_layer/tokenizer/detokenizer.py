"""Incremental detokenization for streaming: never emits half of a multi-byte UTF-8 character."""

from __future__ import annotations

from typing import List

from tokenizers.decoders import DecodeStream

from .qwen_tokenizer import CheckpointTokenizer


class IncrementalDetokenizer:
    """Feed token ids one at a time; each call returns the text that became final.

    tokenizers' DecodeStream (what vLLM's detokenizer uses) decodes each token against the ones before it in one
    Rust call, and holds text back while it ends in an incomplete character. The pieces joined with `flush()`
    equal `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: CheckpointTokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._held: List[int] = []  # the tokens since the last piece: an incomplete character so far

    def add(self, token_id: int) -> str:
        piece = self._stream.step(self.tokenizer.backend, token_id)
        if piece is None:
            self._held.append(token_id)
            return ""
        self._held.clear()
        return piece

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the very end decodes as U+FFFD, as in decode())."""
        text = self.tokenizer.decode(self._held, skip_special_tokens=self.skip_special_tokens) if self._held else ""
        self._stream, self._held = DecodeStream(skip_special_tokens=self.skip_special_tokens), []
        return text
