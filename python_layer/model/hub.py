"""Resolve a model reference (a local directory, a GGUF file or a Hugging Face Hub id) to a local directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.txt", "*.jinja")


def resolve_model_dir(name_or_path: str | os.PathLike, allow_patterns: Optional[Sequence[str]] = None) -> Path:
    """A local checkpoint directory, a GGUF file's (gguf_checkpoints.gguf_model_dir), or the snapshot directory of a
    hub id (downloaded or from the HF cache).

    Raises FileNotFoundError when the reference is neither an existing directory nor a fetchable hub id.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        from .gguf_checkpoints import gguf_model_dir

        return gguf_model_dir(path)
    if path.exists():
        raise FileNotFoundError(
            f"Model path {str(path)!r} is a file; pass the checkpoint directory that holds config.json, or a "
            "llama.cpp .gguf file"
        )
    name = str(name_or_path)
    if not _HUB_ID.match(name):
        raise FileNotFoundError(
            f"Model directory {name!r} does not exist (and it is not a Hugging Face Hub id like 'Qwen/Qwen3-0.6B')"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, allow_patterns=list(allow_patterns or CHECKPOINT_FILES)))
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"{name!r} is not a local directory, and the Hugging Face Hub cannot be reached (offline) "
            f"with nothing cached for it: download it on a connected machine (hf download {name}) "
            f"or pass a local checkpoint directory. ({e})"
        ) from e
    except Exception as e:  # the hub client raises many types: repository not found, auth, HTTP errors
        raise FileNotFoundError(f"Could not fetch {name!r} from the Hugging Face Hub: {e}") from e
