"""Load Qwen3 weights from Hugging Face safetensors checkpoints (one file or sharded with an index), or from the
GGUF file a checkpoint directory of gguf_checkpoints.py links to."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from safetensors import safe_open

from .config import Qwen3Config
from .embedding_table import EmbeddingTable, exact_table
from .hub import resolve_model_dir
from .quantization import Int4Weight, LinearWeight, QuantizedWeight, cat_rows, dense, from_block_scales, quantize
from .gguf_checkpoints import GGUF_FILE, INDEX_FILE as GGUF_INDEX_FILE, GGUFTensors
from .int4_checkpoints import SUFFIXES as INT4_SUFFIXES, Int4Checkpoint
from .w8a8_checkpoints import SCALE_SUFFIX as W8A8_SCALE_SUFFIX, w8a8_weight

SCALE_SUFFIX = "_scale_inv"
"""An FP8 checkpoint's `X.weight_scale_inv` beside each quantized `X.weight`."""
FP8_STORED = "F8_E4M3"
"""safetensors' name for float8_e4m3fn."""
INT8_STORED = "I8"


def expected_weight_shapes(config: Qwen3Config) -> Dict[str, tuple[int, ...]]:
    """Every tensor a Qwen3 checkpoint holds, by its Hugging Face name."""
    c = config
    q_out, kv_out = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes: Dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (q_out, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv_out, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q_out),
            p + "self_attn.q_norm.weight": (c.head_dim,),
            p + "self_attn.k_norm.weight": (c.head_dim,),
        })
        mlps = [p + "mlp."]
        if c.is_sparse(i):
            shapes[p + "mlp.gate.weight"] = (c.num_experts, c.hidden_size)
            mlps = [p + f"mlp.experts.{e}." for e in range(c.num_experts)]
        inner = c.moe_intermediate_size if c.is_sparse(i) else c.intermediate_size
        for mlp in mlps:
            shapes.update({
                mlp + "gate_proj.weight": (inner, c.hidden_size),
                mlp + "up_proj.weight": (inner, c.hidden_size),
                mlp + "down_proj.weight": (c.hidden_size, inner),
            })
        if c.attention_bias:
            shapes.update({
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            })
    return shapes


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """A checkpoint's tensors by name, each read from its file and converted the first time it is asked for, then
    kept until released: a model that releases each layer's tensors once it has converted them holds one layer of
    the checkpoint at a time beside its own weights (reading the whole checkpoint in `dtype` first made a model's
    load peak at the checkpoint in float32 plus its converted weights)."""

    def __init__(
        self, files: Dict[str, Any], dtypes: Dict[str, Optional[torch.dtype]], device: str | torch.device
    ) -> None:
        self._files, self._dtypes, self._device = files, dtypes, device  # dtype None: as stored (FP8)
        self._read: Dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._read:
            tensor = self._files[name].get_tensor(name)
            self._read[name] = tensor.to(device=self._device, dtype=self._dtypes[name] or tensor.dtype)
        return self._read[name]

    def as_stored(self, name: str) -> torch.Tensor:
        """The tensor in the dtype its file holds it in (read again each time: not kept)."""
        return self._files[name].get_tensor(name).to(self._device, copy=True)  # not a view of the mapped file

    def __contains__(self, name: object) -> bool:
        return name in self._dtypes

    def __iter__(self) -> Iterator[str]:
        return iter(self._dtypes)

    def __len__(self) -> int:
        return len(self._dtypes)

    @property
    def cached(self) -> set[str]:
        """The names read and not released."""
        return set(self._read)

    def release(self, prefix: str) -> None:
        """Forgets the tensors read whose names start with prefix (read again if asked for again)."""
        for name in [n for n in self._read if n.startswith(prefix)]:
            del self._read[name]


class WeightLoader:
    """Reads, checks and converts the tensors of a Qwen3 checkpoint."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        config: Qwen3Config,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.model_path = Path(model_path)
        self.config = config
        self.device = device
        self.dtype = dtype
        self.weights = CheckpointTensors({}, {}, device)  # none until load_from_safetensors
        self._shapes: Dict[str, tuple[int, ...]] = {}  # expected_weight_shapes, kept by load_from_safetensors

    def load_from_safetensors(self) -> Mapping[str, torch.Tensor]:
        """Every tensor of `model_path`, its name, shape and dtype checked against the config now, its values read and
        converted to `dtype` on `device` when first asked for (CheckpointTensors; an FP8 checkpoint's float8_e4m3fn
        weights and a W8A8 one's int8 weights stay as they are)."""
        expected = expected_weight_shapes(self.config)
        if (self.model_path / GGUF_FILE).is_symlink():  # also when the file is gone: _load_gguf says so
            return self._load_gguf(expected)
        files = self._safetensors_files()
        block = self.config.fp8_block_size
        handles: Dict[str, Any] = {}
        dtypes: Dict[str, Optional[torch.dtype]] = {}
        int4 = self.config.int4_checkpoint
        w8a8 = self.config.w8a8
        for file in files:
            f = safe_open(str(file), framework="pt")
            for name in f.keys():
                base, _, suffix = name.rpartition(".")
                if int4 and base + ".weight" in expected and suffix in INT4_SUFFIXES:
                    shapes = int4.shapes(*expected[base + ".weight"])
                    if suffix not in shapes:
                        raise ValueError(f"Unexpected tensor {name!r} in {file.name}: not part of a "
                                         f"{int4.method.upper()} checkpoint")
                    self._check_shape(f, name, file, shapes[suffix])
                    handles[name], dtypes[name] = f, torch.float32 if suffix == "scales" else None
                    continue
                if block and name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in expected:
                    n, k = expected[name[: -len(SCALE_SUFFIX)]]
                    self._check_shape(f, name, file, (-(-n // block[0]), -(-k // block[1])))
                    handles[name], dtypes[name] = f, torch.float32
                    continue
                if w8a8 and name.endswith(W8A8_SCALE_SUFFIX) and name[: -len(W8A8_SCALE_SUFFIX)] in expected:
                    self._check_shape(f, name, file, (expected[name[: -len(W8A8_SCALE_SUFFIX)]][0], 1))
                    handles[name], dtypes[name] = f, torch.float32
                    continue
                if name not in expected:
                    if name == "lm_head.weight" and self.config.tie_word_embeddings:
                        continue  # some tied checkpoints store the copy anyway; the embedding is used
                    raise ValueError(
                        f"Unexpected tensor {name!r} in {file.name}: not part of a Qwen3 model with this config"
                    )
                self._check_shape(f, name, file, expected[name])
                stored = f.get_slice(name).get_dtype()
                if stored == FP8_STORED and not block:
                    raise ValueError(f"Tensor {name!r} in {file.name} is float8_e4m3fn, but config.json has no FP8 "
                                     "quantization_config (quant_method 'fp8', weight_block_size) to scale it")
                if stored == INT8_STORED and not w8a8:
                    raise ValueError(f"Tensor {name!r} in {file.name} is int8, but config.json has no W8A8 "
                                     "quantization_config (quant_method 'compressed-tensors') to scale it")
                handles[name], dtypes[name] = f, None if stored in (FP8_STORED, INT8_STORED) else self.dtype
        suffix = W8A8_SCALE_SUFFIX if w8a8 else SCALE_SUFFIX
        unscaled = [n for n, d in dtypes.items() if d is None and n.endswith(".weight") and n + suffix not in dtypes]
        if unscaled:
            raise ValueError(f"Checkpoint {self.model_path} has {'int8' if w8a8 else 'FP8'} weight(s) without "
                             f"{suffix}: {', '.join(unscaled[:3])}")
        missing = [n for n in expected if n not in dtypes and not (int4 and self._int4_tensors(n, int4, dtypes))]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"Checkpoint {self.model_path} lacks tensor(s) {', '.join(missing[:3])}{more}")
        self.weights = CheckpointTensors(handles, dtypes, self.device)
        self._shapes = expected
        return self.weights

    def _load_gguf(self, expected: Dict[str, tuple[int, ...]]) -> Mapping[str, Any]:
        """A GGUF file's tensors (gguf_checkpoints.GGUFTensors), their names and shapes checked against the config."""
        path = self.model_path / GGUF_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} links to a GGUF file that is gone: load the file again by its own path")
        index = json.loads((self.model_path / GGUF_INDEX_FILE).read_text())
        tensors = GGUFTensors(path.resolve(), index, self.config.num_experts)
        for name in tensors:
            if name not in expected:
                raise ValueError(f"Unexpected tensor {tensors[name]!r} in {path.resolve()}: not part of a Qwen3 "
                                 "model with this config")
            if tensors.shape(name) != expected[name]:
                raise ValueError(f"Tensor {tensors[name]!r} in {path.resolve()} has shape {tensors.shape(name)}, "
                                 f"but the config needs {expected[name]}")
        missing = [n for n in expected if n not in tensors]
        if missing:
            raise ValueError(f"GGUF file {path.resolve()} lacks the tensor(s) of {', '.join(missing[:3])}")
        self.weights, self._shapes = tensors, expected
        return tensors

    @staticmethod
    def _int4_tensors(name: str, int4: Int4Checkpoint, present: Mapping[str, Any]) -> bool:
        """Whether a 4-bit checkpoint has every tensor of the projection `name` (X.weight), in its place."""
        base = name[: -len(".weight")]
        return name.endswith(".weight") and all(f"{base}.{s}" in present for s in int4.suffixes)

    def release(self, prefix: str = "") -> None:
        """Forgets the checkpoint's tensors read so far whose names start with prefix (all by default; a GGUF file's
        are mapped, not read)."""
        if isinstance(self.weights, CheckpointTensors):
            self.weights.release(prefix)

    @staticmethod
    def _check_shape(f, name: str, file: Path, shape: tuple[int, ...]) -> None:
        stored = tuple(f.get_slice(name).get_shape())
        if stored != shape:
            raise ValueError(f"Tensor {name!r} in {file.name} has shape {stored}, but the config needs {shape}")

    def load_from_huggingface(self, model_name: str) -> Mapping[str, torch.Tensor]:
        """Load from a Hugging Face Hub id (downloaded, or from the local HF cache when offline)."""
        self.model_path = resolve_model_dir(model_name)
        return self.load_from_safetensors()

    def _safetensors_files(self) -> list[Path]:
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"Model directory {str(self.model_path)!r} does not exist")
        index = self.model_path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = [self.model_path / name for name in sorted(set(weight_map.values()))]
            absent = [f.name for f in files if not f.is_file()]
            if absent:
                raise FileNotFoundError(
                    f"{index.name} names shard(s) that are missing from {self.model_path}: {absent}"
                )
            return files
        files = sorted(self.model_path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(
                f"No *.safetensors weights in {self.model_path}: not a Hugging Face checkpoint directory"
            )
        return files

    def quantize_to_fp8(self) -> Dict[str, QuantizedWeight]:
        """Every linear projection as float8_e4m3fn with a scale per row and block of 128 columns (the block's
        largest |value| / 448). Norms and embeddings stay as they are: the dict holds only the projections."""
        if not self.weights:
            raise RuntimeError("No weights loaded: call load_from_safetensors() first")
        # the name first: testing the shape reads the tensor (CheckpointTensors), and only projections are wanted
        return {name: quantize(self.get_weight(name), "fp8") for name in self.weights
                if "_proj." in name and self.weights[name].dim() == 2}

    def get_linear(self, name: str, packed: bool = True) -> LinearWeight:
        """A linear layer's weight as the checkpoint has it: dense, FP8 or W8A8 int8 with its scales (QuantizedWeight),
        or 4-bit (Int4Weight; packed=False: dequantized exactly into float32); a GGUF file's in the MILI format of
        its type (gguf_checkpoints.py)."""
        if isinstance(self.weights, GGUFTensors):
            tied = name == "lm_head.weight" and self.config.tie_word_embeddings
            return self._gguf_linear(["model.embed_tokens.weight" if tied else name], packed)
        if name + SCALE_SUFFIX in self.weights:
            return from_block_scales(self.weights[name], self.weights[name + SCALE_SUFFIX], self.config.fp8_block_size)
        if name + W8A8_SCALE_SUFFIX in self.weights:
            return w8a8_weight(self.weights[name], self.weights[name + W8A8_SCALE_SUFFIX])
        base = name[: -len(".weight")]
        if base + ".qweight" in self.weights:
            int4 = self.config.int4_checkpoint
            return int4.read({s: self.weights[f"{base}.{s}"] for s in int4.suffixes}, *self._shapes[name], packed)
        return self.get_weight(name)

    def get_linears(self, names: Sequence[str], packed: bool = True) -> LinearWeight:
        """Linear layers' weights stacked along N (q, k, v; gate, up), as get_linear reads each. A 4-bit checkpoint's
        layers with one order of groups are read as one (their tensors all split N along dim 1): repacking each and
        then their stack took half of a 4-bit Qwen3-30B-A3B's load; so are a GGUF file's of one type."""
        if isinstance(self.weights, GGUFTensors) and all(n in self.weights for n in names) and len(
                {self.weights.type_name(n) for n in names}) == 1:
            return self._gguf_linear(names, packed)
        int4 = self.config.int4_checkpoint
        bases = [n[: -len(".weight")] for n in names]
        if int4 and len(names) > 1 and all(b + ".qweight" in self.weights for b in bases) and (
                int4.method == "awq" or all(torch.equal(self.weights[b + ".g_idx"], self.weights[bases[0] + ".g_idx"])
                                            for b in bases)):
            tensors = {s: torch.cat([self.weights[f"{b}.{s}"] for b in bases], dim=1) for s in int4.suffixes[:3]}
            if int4.method == "gptq":
                tensors["g_idx"] = self.weights[bases[0] + ".g_idx"]
            n, k = sum(self._shapes[name][0] for name in names), self._shapes[names[0]][1]
            return int4.read(tensors, n, k, packed)
        return cat_rows([self.get_linear(n, packed) for n in names])

    def _gguf_linear(self, names: Sequence[str], packed: bool) -> LinearWeight:
        weight = self.weights.linear(*names)
        return weight if packed or not isinstance(weight, Int4Weight) else weight.dequantize()

    def get_weight(self, name: str) -> torch.Tensor:
        """A tensor of the checkpoint in `dtype` (FP8 and 4-bit weights dequantized)."""
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            name = "model.embed_tokens.weight"
        if isinstance(self.weights, GGUFTensors):
            return self.weights.dense(name).to(device=self.device, dtype=self.dtype)
        if any(name + s in self.weights for s in (SCALE_SUFFIX, W8A8_SCALE_SUFFIX)) or (
                name[: -len(".weight")] + ".qweight" in self.weights):
            return dense(self.get_linear(name, packed=False), self.dtype)
        if name not in self.weights:
            raise KeyError(
                f"Weight {name!r} not loaded (known: model.embed_tokens.weight, model.layers.N.*, model.norm.weight, "
                "lm_head.weight)"
            )
        return self.weights[name]

    def get_embedding(self) -> EmbeddingTable:
        """The token embedding table in the least memory that gives its rows in `dtype` exactly
        (embedding_table.exact_table): a 16-bit checkpoint's as stored under float32, a GGUF file's in its blocks."""
        name = "model.embed_tokens.weight"
        if isinstance(self.weights, GGUFTensors):
            return exact_table(self.weights.embedding(name), self.dtype)
        return exact_table(self.weights.as_stored(name), self.dtype)

    def get_weight_as_numpy(self, name: str) -> np.ndarray:
        tensor = self.get_weight(name)
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
            tensor = tensor.float()
        return tensor.detach().cpu().numpy()


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """'auto' (bfloat16 on GPUs, float32 on CPUs) / 'float32' / 'bfloat16' / 'float16' (or a torch dtype) -> torch
    dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype {dtype!r} is not supported: use one of auto, float32, bfloat16, float16")
    return table[dtype]
