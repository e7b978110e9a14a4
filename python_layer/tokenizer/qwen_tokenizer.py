"""Qwen3 byte-level BPE tokenizer on the `tokenizers` library (real Qwen3 files vendored in assets/)."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

from tokenizers import Tokenizer

ASSETS_DIR = Path(__file__).parent / "assets"


class CheckpointTokenizer:
    """`CheckpointTokenizer()` uses the vendored Qwen3 files; `CheckpointTokenizer(dir)` a checkpoint's own
    tokenizer.json + tokenizer_config.json (a Hugging Face Hub id works too)."""

    def __init__(self, model_name: str | os.PathLike = "qwen3") -> None:
        self.path = _tokenizer_dir(model_name)
        self._tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        config_path = self.path / "tokenizer_config.json"
        self.config: dict = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.chat_template: Optional[str] = self.config.get("chat_template")
        if self.chat_template is None and (self.path / "chat_template.jinja").is_file():
            self.chat_template = (self.path / "chat_template.jinja").read_text(encoding="utf-8")
        self.eos_token: Optional[str] = _token_content(self.config.get("eos_token"))
        self.pad_token: Optional[str] = _token_content(self.config.get("pad_token"))
        self.bos_token: Optional[str] = _token_content(self.config.get("bos_token"))
        self.eos_token_id = self.token_to_id(self.eos_token)
        self.pad_token_id = self.token_to_id(self.pad_token)
        self.bos_token_id = self.token_to_id(self.bos_token)
        self.special_tokens: dict[str, int] = {
            t.content: i for i, t in self._tokenizer.get_added_tokens_decoder().items() if t.special
        }
        self.all_special_ids = sorted(self.special_tokens.values())

    @property
    def vocab_size(self) -> int:
        """Number of tokens including added ones (151,669 for Qwen3; the model's embedding is larger)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> Tokenizer:
        """The tokenizers.Tokenizer underneath (for tokenizers' own streaming decoder)."""
        return self._tokenizer

    def token_to_id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self._tokenizer.token_to_id(token)

    def encode(self, text: Union[str, List[str]], add_special_tokens: bool = True) -> Union[List[int], List[List[int]]]:
        """Token ids of a text, or of each text of a list. Special tokens written in the text are recognized."""
        if isinstance(text, str):
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return [e.ids for e in self._tokenizer.encode_batch(list(text), add_special_tokens=add_special_tokens)]

    def decode(self, tokens: Union[Sequence[int], Any], skip_special_tokens: bool = True) -> str:
        ids = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)



def _token_content(token: Any) -> Optional[str]:
    return token.get("content") if isinstance(token, dict) else token


def _tokenizer_dir(model_name: str | os.PathLike) -> Path:
    if model_name in (None, "qwen3", "Qwen3"):
        return ASSETS_DIR
    from ..model.hub import resolve_model_dir

    path = resolve_model_dir(model_name, allow_patterns=["tokenizer*", "*.jinja", "*.json"])
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(f"No tokenizer.json in {str(path)!r}")
    return path


def tokenizer_for_checkpoint(model_dir: str | os.PathLike) -> CheckpointTokenizer:
    """The checkpoint's own tokenizer files when it has them, else the vendored Qwen3 tokenizer."""
    path = Path(model_dir).resolve()
    return _checkpoint_tokenizer(str(path)) if (path / "tokenizer.json").is_file() else get_tokenizer()


@lru_cache(maxsize=8)
def _checkpoint_tokenizer(path: str) -> CheckpointTokenizer:
    # engines of one checkpoint share it: loading tokenizer.json takes about a second
    return CheckpointTokenizer(path)


@lru_cache(maxsize=1)
def get_tokenizer() -> CheckpointTokenizer:
    """The shared vendored Qwen3 tokenizer (loaded once)."""
    return CheckpointTokenizer()
