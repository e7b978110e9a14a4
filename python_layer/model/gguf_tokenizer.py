"""A Qwen3 GGUF file's tokenizer: tokenizer.json and tokenizer_config.json written from its metadata.

llama.cpp's converter stores Qwen's byte-level BPE vocabulary (`tokenizer.ggml.model` gpt2, `tokenizer.ggml.pre`
qwen2) as token strings, merges and token types. They are put back into Qwen's own tokenizer pipeline (the vendored
tokenizer.json's NFC normalizer, split regex and byte-level steps): tokens of type CONTROL become special added
tokens, USER_DEFINED ones (`<think>`, `<tool_call>`) plain added tokens, matched whole as in Qwen's files; the tokens
Qwen's files have keep their flag.
transformers' GGUF conversion is not used: before 5.x it cuts the user-defined tokens into pieces, and it leaves out
the NFC normalizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from ..tokenizer.qwen_tokenizer import ASSETS_DIR

QWEN_SPLITS = ("qwen2", "deepseek-r1-qwen")
"""tokenizer.ggml.pre values whose split is Qwen2's (llama.cpp's llama-vocab.cpp reads both as its QWEN2)."""


def write_tokenizer_files(meta: Mapping[str, object], directory: Path) -> None:
    """tokenizer.json and tokenizer_config.json from a GGUF file's metadata (its `tokenizer.*` values, as gguf's
    ReaderField.contents gives them)."""
    from gguf import TokenType

    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre not in QWEN_SPLITS:
        raise ValueError(f"GGUF tokenizer.ggml.model is {model!r} and tokenizer.ggml.pre {pre!r}: MILI reads Qwen's "
                         f"byte-level BPE vocabulary (model 'gpt2', pre {' or '.join(map(repr, QWEN_SPLITS))})")
    missing = [f"tokenizer.ggml.{k}" for k in ("tokens", "token_type", "merges") if f"tokenizer.ggml.{k}" not in meta]
    if missing:
        raise ValueError(f"GGUF metadata lacks {', '.join(missing)}: not a complete model file")
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta["tokenizer.ggml.token_type"]
    spec = json.loads((ASSETS_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    # llama.cpp marks every <|...|> token CONTROL: Qwen's own tokens keep Qwen's flag (<|fim_pad|> is not special)
    qwen_special = {a["content"]: a["special"] for a in spec["added_tokens"]}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": qwen_special.get(t, kind == TokenType.CONTROL)}
             for i, (t, kind) in enumerate(zip(tokens, types)) if kind in (TokenType.CONTROL, TokenType.USER_DEFINED)]
    spec["added_tokens"] = added
    spec["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    spec["model"]["merges"] = [m.split(" ") for m in meta["tokenizer.ggml.merges"]]
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(index)] if index is not None else None

    config = {
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": token("bos"), "eos_token": token("eos"),
        "pad_token": token("padding"), "unk_token": None, "add_prefix_space": False, "errors": "replace",
        "split_special_tokens": False, "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    }
    if "tokenizer.chat_template" in meta:
        config["chat_template"] = meta["tokenizer.chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2),
                                                      encoding="utf-8")
