"""Incremental detokenization for streaming: never emits half of a multi-byte UTF-8 character."""

from __future__ import annotations

from typing import List

from .qwen_tokenizer import QwenTokenizer

_REPLACEMENT = "\ufffd"  # what decoding an incomplete UTF-8 sequence yields


class IncrementalDetokenizer:
    """Feed token ids one at a time; each call returns the text that became final.

    It decodes a small window (from the last emitted character boundary) rather than the whole sequence,
    and holds text back while the window ends in an incomplete character. The pieces joined with
    `flush()` equal `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: QwenTokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: List[int] = []
        self._prefix = 0  # window start: a character boundary already emitted
        self._read = 0  # tokens up to here are emitted

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        emitted = self._decode(self._prefix, self._read)
        window = self._decode(self._prefix, len(self.token_ids))
        if len(window) <= len(emitted) or window.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self.token_ids)
        return window[len(emitted):]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character at the very end decodes as U+FFFD, as in decode())."""
        emitted = self._decode(self._prefix, self._read)
        window = self._decode(self._prefix, len(self.token_ids))
        self._prefix = self._read = len(self.token_ids)
        return window[len(emitted):]
