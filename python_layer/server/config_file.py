"""`mili serve --config FILE` (JSON, or YAML for a .yaml / .yml file): the serve options in the design documents'
two shapes, and every `mili serve` flag by its own name:

    {"inference": {"device": "cpu", "dtype": "float32", "max_batch_size": 64},
     "kv_cache": {"page_size": 16, "num_pages": 1024},
     "sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
     "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, ...,
     "port": 8080, "max_num_batched_tokens": 4096, "served_model_name": "qwen3"}

- `sampling`: server-side defaults of the requests that leave those fields out (over generation_config.json's);
- the model config (the Model Config JSON keys at the top level) describes the served model: with `model` (a
  checkpoint) it must agree with its config.json; without, MILI serves random weights of that shape, as it does
  the built-in model;
- flags given on the command line win over the file.
Everything is checked before anything loads: an unknown key, a wrong type or an impossible value is an error that
names the key and the file."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

from ..model.config import Qwen3Config

SECTIONS: Dict[str, Dict[str, str]] = {
    "inference": {
        "device": "device",
        "dtype": "dtype",
        "max_batch_size": "max_num_seqs",
        "weight_dtype": "weight_dtype",
    },
    "kv_cache": {"page_size": "page_size", "num_pages": "kv_pages", "dtype": "kv_cache_dtype"},
}
"""The inference config's keys and the flags (argparse dests) they set."""
SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int}
MODEL_KEYS = {"hidden_size": int, "intermediate_size": int, "num_hidden_layers": int, "num_attention_heads": int,
              "num_key_value_heads": int, "head_dim": int, "vocab_size": int, "max_position_embeddings": int,
              "hidden_act": str, "rms_norm_eps": float, "rope_theta": float, "tie_word_embeddings": bool}
PAGE_SIZES = tuple(2**i for i in range(9))
"""KV page sizes the paged-attention kernels are built and tested for: powers of two up to 256 tokens."""
KV_SIZING = ("kv_pages", "kv_cache_memory_gb", "kv_memory_fraction")
"""One of these sizes the KV cache: one given on the command line replaces the file's."""
NOT_IN_FILE = ("config", "print_config", "func", "command")


def _type_name(kind: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[kind]


def _check_type(value: Any, kind: type, where: str) -> Any:
    ok = (isinstance(value, bool) if kind is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
          isinstance(value, kind) and not isinstance(value, bool))
    if not ok:
        raise ValueError(f"{where} must be {_type_name(kind)}, got {value!r}")
    return float(value) if kind is float else value


def _flag_kinds(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.dest not in NOT_IN_FILE and a.dest != "help"}


def _action_kind(action: argparse.Action) -> type:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return bool
    return action.type or str


def read(path: str) -> Dict[str, Any]:
    """The file's top-level mapping."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    text = file.read_text(encoding="utf-8")
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"config file {path} is not valid YAML: {e}") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"config file {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option names to values, got {type(data).__name__}")
    return data


def _add(flags: Dict[str, tuple[Any, str]], dest: str, value: Any, where: str) -> None:
    """A flag's value from the file; null leaves the flag at its default (as --print-config writes unset ones)."""
    if dest in flags:
        raise ValueError(f"{where} sets what {flags[dest][1]} sets already")
    if value is not None:
        flags[dest] = (value, where)


def apply(args: argparse.Namespace, parser: argparse.ArgumentParser, explicit: Iterable[str], path: str) -> None:
    """Sets the file's options on args (the flags not given on the command line), args.sampling_defaults and
    args.model_config; raises ValueError naming the key and the file."""
    actions = _flag_kinds(parser)
    explicit = set(explicit)
    flags: Dict[str, tuple[Any, str]] = {}  # dest -> (value, where)
    sampling: Dict[str, Any] = {}
    model: Dict[str, Any] = {}
    for key, value in read(path).items():
        where = f"'{key}' in {path}"
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ValueError(f"{where} must be a mapping of {sorted(SECTIONS[key])}")
            for sub, sub_value in value.items():
                dest = SECTIONS[key].get(sub)
                if dest is None:
                    raise ValueError(f"unknown key '{key}.{sub}' in {path}: {key} takes {sorted(SECTIONS[key])}")
                _add(flags, dest, sub_value, f"'{key}.{sub}' in {path}")
        elif key == "sampling":
            if not isinstance(value, dict):
                raise ValueError(f"{where} must be a mapping of {sorted(SAMPLING_KEYS)}")
            for sub, sub_value in value.items():
                if sub not in SAMPLING_KEYS:
                    raise ValueError(f"unknown key 'sampling.{sub}' in {path}: sampling takes {sorted(SAMPLING_KEYS)}")
                sampling[sub] = _check_type(sub_value, SAMPLING_KEYS[sub], f"'sampling.{sub}' in {path}")
        elif key in MODEL_KEYS:
            model[key] = _check_type(value, MODEL_KEYS[key], where)
        else:
            dest = key.replace("-", "_")
            if dest not in actions:
                raise ValueError(f"unknown key '{key}' in {path}: it takes the inference config's sections "
                                 f"{sorted(SECTIONS) + ['sampling']}, the model config's keys and mili serve's flags "
                                 "by name (see mili serve --help)")
            _add(flags, dest, value, where)
    given_sizing = [d for d in KV_SIZING if d in flags]
    if len(given_sizing) > 1:
        raise ValueError(f"{' and '.join(flags[d][1] for d in given_sizing)} both size the KV cache: keep one")
    for dest, (value, where) in flags.items():
        action = actions[dest]
        value = _check_type(value, _action_kind(action), where)
        if action.choices is not None and value not in action.choices:
            raise ValueError(f"{where} must be one of {list(action.choices)}, got {value!r}")
        if dest in explicit or (dest in KV_SIZING and explicit & set(KV_SIZING)):
            continue
        setattr(args, dest, value)  # kv_pages, then kv_memory_fraction, take precedence over kv_cache_memory_gb
    args.sampling_defaults = sampling
    args.model_config = model
    args.config_sources = {dest: where for dest, (_, where) in flags.items() if dest not in explicit}
    check_sampling(sampling, path)


def check_sampling(sampling: Dict[str, Any], path: str) -> None:
    """The request checks' ranges (SamplingParams), so a default never makes every request fail."""
    from ..inference.sampling_params import SamplingParams

    try:
        SamplingParams(**sampling)
    except ValueError as e:
        raise ValueError(f"'sampling' in {path}: {e}") from e


def check_options(args: argparse.Namespace) -> None:
    """Impossible values of the serve options, named by where they came from (a flag or a key of the file)."""
    sources: Dict[str, str] = getattr(args, "config_sources", {})
    where = lambda dest: sources.get(dest, "--" + dest.replace("_", "-"))
    positive = ("max_num_seqs", "max_num_batched_tokens", "kv_pages", "max_model_len", "page_size", "replicas")
    for dest in positive:
        value = getattr(args, dest, None)
        if value is not None and value < 1:
            raise ValueError(f"{where(dest)} must be a positive integer, got {value}")
    for dest in ("max_queue_len", "shutdown_timeout"):
        if getattr(args, dest) < 0:
            raise ValueError(f"{where(dest)} must be >= 0, got {getattr(args, dest)}")
    if not 0 <= args.port < 65536:
        raise ValueError(f"{where('port')} must be a TCP port (0-65535), got {args.port}")
    if args.page_size not in PAGE_SIZES:
        raise ValueError(f"{where('page_size')} must be a power of two up to 256 (the page sizes the attention "
                         f"kernels support), got {args.page_size}")
    if args.kv_cache_memory_gb is not None and not args.kv_cache_memory_gb > 0:
        raise ValueError(f"{where('kv_cache_memory_gb')} must be > 0, got {args.kv_cache_memory_gb}")
    if args.kv_memory_fraction is not None and not 0 < args.kv_memory_fraction <= 0.95:
        raise ValueError(f"{where('kv_memory_fraction')} must be in (0, 0.95], got {args.kv_memory_fraction}")
    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        raise ValueError(f"{where('device')} must be cpu, cuda or cuda:N, got {args.device!r}")


def model_config_for(args: argparse.Namespace, path: str) -> Optional[Qwen3Config]:
    """The served model's config when the file gives a model config: checked against the checkpoint's
    config.json, or (no checkpoint) the random-weight model's shape; None when the file gives none."""
    wanted: Dict[str, Any] = getattr(args, "model_config", {})
    if not wanted:
        return None
    if args.model:
        actual = Qwen3Config.from_pretrained(args.model)
        for key, value in wanted.items():
            if getattr(actual, key) != value:
                raise ValueError(
                    f"'{key}' in {path} is {value!r}, but {args.model}/config.json says "
                    f"{getattr(actual, key)!r}: remove it from the file or serve a checkpoint of that shape"
                )
        return actual
    from ..model.random_checkpoint import BUILTIN, QWEN3_VOCAB

    if wanted.get("vocab_size", QWEN3_VOCAB) != QWEN3_VOCAB:
        raise ValueError(f"'vocab_size' in {path} is {wanted['vocab_size']}: a random-weight model uses Qwen3's "
                         f"tokenizer, vocab_size {QWEN3_VOCAB} (or give a checkpoint as 'model')")
    try:
        return Qwen3Config(**{**BUILTIN, **wanted})
    except ValueError as e:
        raise ValueError(f"the model config in {path}: {e}") from e


def random_model_dir(config: Qwen3Config) -> Path:
    """Where the random-weight checkpoint of config's shape lives (ensure_random_model writes it)."""
    from ..model.random_checkpoint import cache_dir

    shape = {k: getattr(config, k) for k in MODEL_KEYS}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"mili-random-qwen3-{digest}"


def ensure_random_model(config: Qwen3Config) -> Path:
    """The random-weight checkpoint of config's shape, generated on first use (as the built-in model is)."""
    from ..model.random_checkpoint import build_random_checkpoint

    path = random_model_dir(config)
    if not (path / "config.json").is_file():
        build_random_checkpoint(path, seed=1234, **{k: getattr(config, k) for k in MODEL_KEYS})
    return path


def merged(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Dict[str, Any]:
    """The merged configuration as a config file would give it (--print-config)."""
    out: Dict[str, Any] = {dest: getattr(args, dest) for dest in _flag_kinds(parser)}
    sizing = next((d for d in KV_SIZING if out[d] is not None), None)  # the one that sizes the KV cache
    out.update({d: None for d in KV_SIZING if d != sizing})
    if out.get("api_key"):
        out["api_key"] = "(set)"
    out["sampling"] = dict(getattr(args, "sampling_defaults", {}))
    out.update(getattr(args, "model_config", {}))
    return out
