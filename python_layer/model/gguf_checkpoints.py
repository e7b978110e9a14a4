"""llama.cpp's GGUF files of Qwen3 and Qwen3-MoE (general.architecture qwen3 / qwen3moe) as they are.

A file gets a checkpoint directory of its own (gguf_model_dir), made once under MILI's cache: config.json and
generation_config.json from its metadata, the tokenizer files of its vocabulary and chat template (gguf_tokenizer),
the index of its tensors, and `model.gguf`, a link to the file, whose tensors WeightLoader reads
(GGUFTensors).

Its quantized tensors become MILI's formats with the same values, block by block (gguf's own dequantize is the
reference): Q8_0 int8 with a scale per 32 columns (QuantizedWeight); Q4_0, Q4_1, Q4_K 4-bit values and Q5_0, Q5_1,
Q5_K, Q6_K 6-bit ones (their 5 or 6 bits) with a scale and a min per 32 (Q6_K: 16) columns (Int4Weight): w = q *
scale + min, the K-quants' scale d * sc and min -dmin * m rounded to float16 as Int4Weight keeps them (2^-11 of a
scale at most). F32, F16 and BF16 tensors are read as they are, and the other types (Q2_K, Q3_K, the IQ formats)
dequantized by gguf into float32. The token embedding stays in its blocks, exactly (embedding_table.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Dict, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from .config import GGUF_METHOD
from .embedding_table import EmbeddingTable, QuantizedEmbedding
from .gguf_tokenizer import write_tokenizer_files
from .quantization import Int4Weight, LinearWeight, QuantizedWeight

GGUF_FILE = "model.gguf"
"""The link to the file in its checkpoint directory."""
INDEX_FILE = "gguf_tensors.json"
"""Its tensors' types, shapes and offsets (read_index), read once: gguf's reader parses the whole vocabulary (~15 s)."""
ARCHITECTURES = {"qwen3": "qwen3", "qwen3moe": "qwen3_moe"}
"""general.architecture -> model_type."""
END_TOKENS = ("<|im_end|>", "<|endoftext|>")
LAYOUT_VERSION = 3
"""Part of a directory's cache key: a new version makes new directories."""

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "ffn_gate_inp": "mlp.gate"}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
"""A sparse layer's experts, stacked in one tensor [experts, out, in]."""


def gguf_model_dir(path: Path) -> Path:
    """The checkpoint directory of the GGUF file at path, made on first use (keyed by the file's path, size and
    modification time)."""
    from .random_checkpoint import cache_dir

    path = path.resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{LAYOUT_VERSION}".encode()).hexdigest()[:16]
    directory = cache_dir() / "gguf" / f"{path.stem}-{key}"
    if (directory / "config.json").is_file():
        return directory
    staging = directory.with_name(f"{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _write_checkpoint_files(path, staging)
        os.replace(staging, directory)
    except OSError:
        if not (directory / "config.json").is_file():  # not another process's directory that won the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _write_checkpoint_files(path: Path, directory: Path) -> None:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except ValueError as e:  # gguf's reader says what it found wrong, tersely
        raise ValueError(f"{path} cannot be read as a GGUF file ({e}): pass a .gguf file llama.cpp wrote") from e
    index = _index(reader)
    meta = {name: field.contents() for name, field in reader.fields.items()}
    config, generation = config_from_metadata(meta, {name: shape for name, (_, shape, _) in index.items()})
    config["quantization_config"]["weight_dtype"] = _weight_dtype({t for name, (t, _, _) in index.items()
                                                                   if name.startswith("blk.")})
    (directory / INDEX_FILE).write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer_files(meta, directory)
    # llama.cpp ends a generation at these tokens too where the vocabulary has them
    tokens = meta["tokenizer.ggml.tokens"]
    stops = [tokens.index(t) for t in END_TOKENS if t in tokens]
    generation["eos_token_id"] = list(dict.fromkeys(generation["eos_token_id"] + stops))
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (directory / GGUF_FILE).symlink_to(path)


def _weight_dtype(types: set[str]) -> str:
    """What --weight-dtype auto gives a file whose layers hold tensors of these types: int4 where some are 4 to 6
    bits, int8 where some are Q8_0, else dense."""
    if types & (_DECODERS.keys() - {"Q8_0"}):
        return "int4"
    return "int8" if "Q8_0" in types else "dense"


def _shape(tensor) -> tuple[int, ...]:
    """A tensor's shape as PyTorch orders it (GGUF lists the fastest-moving dimension first)."""
    return tuple(int(n) for n in reversed(tensor.shape))


def config_from_metadata(meta: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict, dict]:
    """config.json and generation_config.json of a Qwen3 / Qwen3-MoE GGUF's metadata and tensor shapes."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF general.architecture is {arch!r}: MILI serves Qwen3 models (architecture "
                         f"{' or '.join(map(repr, ARCHITECTURES))})")
    def key(name: str, default: object = None) -> object:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}: not a complete {arch} model file")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    if "token_embd.weight" not in shapes:
        raise ValueError("GGUF file lacks token_embd.weight: not a complete model file")
    config = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 1_000_000.0)),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": GGUF_METHOD},
    }
    if meta.get(f"{arch}.rope.scaling.type") == "yarn":
        config["rope_scaling"] = {"rope_type": "yarn", "factor": float(key("rope.scaling.factor")),
                                  "original_max_position_embeddings": int(key("rope.scaling.original_context_length"))}
    if arch == "qwen3moe":
        config.update(num_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
                      moe_intermediate_size=int(key("expert_feed_forward_length")),
                      # llama.cpp's qwen3moe renormalises the top-k weights unless the file says otherwise
                      norm_topk_prob=bool(key("expert_weights_norm", True)))
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    config["eos_token_id"] = eos[0]
    config["bos_token_id"] = meta.get("tokenizer.ggml.bos_token_id")
    generation = {"eos_token_id": [int(t) for t in dict.fromkeys(eos) if t is not None]}
    for name, ours in (("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"), ("min_p", "min_p")):
        if f"general.sampling.{name}" in meta:
            generation[ours] = meta[f"general.sampling.{name}"]
    return config, generation


class GGUFTensors(Mapping[str, str]):
    """A GGUF file's tensors by their Hugging Face names (an expert's `...mlp.experts.{e}.gate_proj.weight` is row e
    of its layer's stack) -> their GGUF names; `linear(name)` reads one in MILI's format, `dense(name)` as float32.
    index: each GGUF tensor's (type, shape as PyTorch orders it, offset of its data in the file), read_index's."""

    def __init__(self, path: Path, index: Mapping[str, tuple[str, Sequence[int], int]], num_experts: int = 0) -> None:
        self.path, self._index = path, {name: (t, tuple(shape), offset) for name, (t, shape, offset) in index.items()}
        self._file = np.memmap(path, dtype=np.uint8, mode="r")
        self._names: Dict[str, tuple[str, Optional[int]]] = {}
        for name in self._index:
            hf = _hf_name(name)
            if hf is not None:
                self._names[hf] = (name, None)
            elif name.startswith("blk.") and name.split(".")[2] in _EXPERTS:
                _, layer, kind, _ = name.split(".")
                for e in range(num_experts):
                    self._names[f"model.layers.{layer}.mlp.experts.{e}.{_EXPERTS[kind]}.weight"] = (name, e)
            else:
                raise ValueError(f"Unexpected tensor {name!r} in {path}: not part of a Qwen3 model")

    @classmethod
    def read(cls, path: Path, num_experts: int = 0) -> "GGUFTensors":
        return cls(path, read_index(path), num_experts)

    def __getitem__(self, name: str) -> str:
        return self._names[name][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        gguf_name, expert = self._names[name]
        shape = self._index[gguf_name][1]
        return shape if expert is None else shape[1:]

    def type_name(self, name: str) -> str:
        return self._index[self[name]][0]

    def _stored(self, name: str) -> np.ndarray:
        """The tensor as stored: float32 / float16 values, else its rows of blocks [..., bytes of a row] (an expert's
        rows only)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        gguf_name, expert = self._names[name]
        qtype, shape, offset = self._index[gguf_name]
        dtype = {"F32": np.float32, "F16": np.float16}.get(qtype)
        if dtype is None:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
            dtype, shape = np.uint8, (*shape[:-1], shape[-1] // block * size)
        data = self._file[offset:offset + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
        return data[expert] if expert is not None else data

    def dense(self, name: str) -> torch.Tensor:
        """The tensor's values in float32 (quantized types dequantized by gguf)."""
        from gguf import GGMLQuantizationType, dequantize

        qtype, data = self.type_name(name), self._stored(name)
        if qtype in ("F32", "F16"):
            values = np.array(data, dtype=np.float32)  # a copy: the file is mapped read-only
        else:
            values = dequantize(data, GGMLQuantizationType[qtype])
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(self.shape(name))

    def embedding(self, name: str) -> EmbeddingTable:
        """The table as the file holds it: float32, float16 or bfloat16 values, the blocks of a type MILI decodes
        (QuantizedEmbedding), else dequantized by gguf into float32."""
        qtype, data = self.type_name(name), self._stored(name)
        if qtype in _DECODERS:
            return _DECODERS[qtype](torch.from_numpy(np.array(data)), self.shape(name)[1]).embedding()
        if qtype in ("F16", "BF16"):
            values = torch.from_numpy(np.array(data))  # a copy: the file is mapped read-only
            return values if qtype == "F16" else values.view(torch.bfloat16).reshape(self.shape(name))
        return self.dense(name)

    def linear(self, *names: str) -> LinearWeight:
        """Projections' weights [N, K] stacked along N (q, k, v; gate, up: one type, one K), in the MILI format of the
        same values (the module's docstring), else dense float32. Read as one: each part decoded and packed, then their
        stack unpacked and packed again, took twice the time."""
        qtype, k = self.type_name(names[0]), self.shape(names[0])[1]
        if any((self.type_name(n), self.shape(n)[1]) != (qtype, k) for n in names):
            raise ValueError(f"{', '.join(names)}: not one GGUF type and input size, read them one by one")
        decode = _DECODERS.get(qtype)
        if decode is None:
            return torch.cat([self.dense(n) for n in names])
        rows = np.concatenate([self._stored(n).reshape(self.shape(n)[0], -1) for n in names])  # a copy: read-only file
        return decode(torch.from_numpy(rows), k).linear(k)


def read_index(path: Path) -> Dict[str, tuple[str, tuple[int, ...], int]]:
    """Each tensor of the GGUF file at path: (type, shape as PyTorch orders it, offset of its data)."""
    from gguf import GGUFReader

    return _index(GGUFReader(path))


def _index(reader) -> Dict[str, tuple[str, tuple[int, ...], int]]:
    return {t.name: (t.tensor_type.name, _shape(t), int(t.data_offset)) for t in reader.tensors}


def _hf_name(name: str) -> Optional[str]:
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return None


# Each decoder takes a tensor's rows of blocks (uint8 [N, blocks * block bytes]) and K, and returns the weight.

def _f16(raw: torch.Tensor) -> torch.Tensor:
    """float16 values of byte pairs [..., 2] (little-endian, as GGUF stores them) as float32 [...]."""
    return raw.contiguous().view(torch.float16)[..., 0].float()


_LOW4, _LOW2 = 0x0F0F0F0F, 0x03030303
"""Masks of each byte's low 4 and low 2 bits in a word of 4 bytes."""


def _byte_fields(raw: torch.Tensor, shifts: Sequence[int], mask: int) -> list[torch.Tensor]:
    """(raw >> shift) & mask of each byte of raw [..., bytes] (a multiple of 4) for each shift, 4 bytes a word."""
    words = raw.contiguous().view(torch.int32)
    return [((words >> shift) & mask).view(torch.uint8) for shift in shifts]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16 bytes] -> [..., 32] values: low nibbles first, then high ones (the order of Q4_0 .. Q5_1's blocks)."""
    return torch.cat(_byte_fields(qs, (0, 4), _LOW4), dim=-1)


def _bits(raw: torch.Tensor, count: int) -> torch.Tensor:
    """Bit j of a little-endian bit field [..., bytes] for j < count: [..., count] (0 / 1)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((raw[..., :, None] >> shifts) & 1).flatten(-2)[..., :count]


class _Blocks(NamedTuple):
    """A tensor's values as its type decodes them: q [N, blocks, block] (uint8; Q8_0's int8) and scale [N, blocks],
    w = scale * (q - zero), or where the type has mins (zero None) scale * q + low; bits: those of MILI's format for q
    (4, 6: Int4Weight; 8: QuantizedWeight); codes: a K-quant's scale and min codes [N, blocks] (int8; mins None with
    a zero) and their multipliers [N, super-blocks, 2] (float16), of which scale and low are the products."""

    q: torch.Tensor
    scale: torch.Tensor
    low: Optional[torch.Tensor]
    zero: Optional[int]
    bits: int
    codes: Optional[tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]] = None

    def linear(self, k: int) -> LinearWeight:
        """The weight [N, K] in MILI's format of the same values (Int4Weight's mins: low, or one, -zero, per scale)."""
        n, _, block = self.q.shape
        q = self.q.reshape(n, -1)[:, :k]
        if self.bits == 8:
            return QuantizedWeight(q.contiguous(), self.scale, block)
        if self.codes is not None:
            scale_codes, min_codes, multipliers = self.codes
            return Int4Weight.coded(q, scale_codes.t(), None if min_codes is None else min_codes.t(), multipliers,
                                    block, self.bits, self.zero)
        return Int4Weight.of(q, self.scale.t(), None if self.low is None else self.low.t(), block, self.bits,
                             self.zero)

    def embedding(self) -> QuantizedEmbedding:
        """The table kept as these blocks: gguf's values exactly (its dequantize's float32 products)."""
        n, _, block = self.q.shape
        values = (self.q.to(torch.int16) - (self.zero or 0)).to(torch.int8).reshape(n, -1)
        return QuantizedEmbedding(values, self.scale.contiguous(), None if self.low is None else self.low.contiguous(),
                                  block)


def _q8_0(rows: torch.Tensor, k: int) -> _Blocks:
    b = rows.view(rows.shape[0], -1, 34)
    return _Blocks(b[..., 2:].contiguous().view(torch.int8), _f16(b[..., :2]), None, 0, 8)


def _q4_0(rows: torch.Tensor, k: int) -> _Blocks:
    b = rows.view(rows.shape[0], -1, 18)
    return _Blocks(_nibbles(b[..., 2:]), _f16(b[..., :2]), None, 8, 4)


def _q4_1(rows: torch.Tensor, k: int) -> _Blocks:
    b = rows.view(rows.shape[0], -1, 20)
    return _Blocks(_nibbles(b[..., 4:]), _f16(b[..., :2]), _f16(b[..., 2:4]), None, 4)


def _five_bits(b: torch.Tensor, start: int) -> torch.Tensor:
    """Q5_0 / Q5_1's values: 4 low bits as _nibbles at start + 4, the fifth of each value in the 4 bytes at start."""
    return _nibbles(b[..., start + 4:]) | (_bits(b[..., start:start + 4], 32) << 4)


def _q5_0(rows: torch.Tensor, k: int) -> _Blocks:
    b = rows.view(rows.shape[0], -1, 22)
    return _Blocks(_five_bits(b, 2), _f16(b[..., :2]), None, 16, 6)


def _q5_1(rows: torch.Tensor, k: int) -> _Blocks:
    b = rows.view(rows.shape[0], -1, 24)
    return _Blocks(_five_bits(b, 4), _f16(b[..., :2]), _f16(b[..., 2:4]), None, 6)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's eight 6-bit scales and mins of a super-block's 12 bytes [..., 12] (ggml's get_scale_min_k4)."""
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc.float(), mn.float()


def _k_quant(rows: torch.Tensor, k: int, block_bytes: int, bits: int) -> _Blocks:
    """Q4_K (block_bytes 144) and Q5_K (176): super-blocks of 256 as eight sub-blocks of 32, each w = d * sc * q -
    dmin * m; q's low nibbles in 4 runs of 32 bytes (sub-blocks 2j, 2j + 1: the low and high nibbles of run j), Q5_K's
    fifth bits in 32 bytes before them (bit j of byte i: sub-block j's value i)."""
    n = rows.shape[0]
    b = rows.view(n, -1, block_bytes)
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    qs = b[..., block_bytes - 128:].reshape(n, -1, 4, 32)
    q = torch.stack(_byte_fields(qs, (0, 4), _LOW4), dim=3).reshape(n, -1, 32)
    if bits == 5:
        high = b[..., 16:48]
        q = q | (((high[..., None, :] >> torch.arange(8, dtype=torch.uint8)[:, None]) & 1) << 4).reshape(n, -1, 32)
    scale, low = d[..., None] * sc, -(dmin[..., None] * mn)
    codes = (sc.to(torch.int8).reshape(n, -1), mn.to(torch.int8).reshape(n, -1), torch.stack([d, -dmin], dim=-1))
    return _Blocks(q, scale.reshape(n, -1), low.reshape(n, -1), None, 4 if bits == 4 else 6, codes)


def _q6_k(rows: torch.Tensor, k: int) -> _Blocks:
    """Super-blocks of 256 as sixteen sub-blocks of 16, w = d * sc * (q - 32), sc int8: q's low nibbles in 128 bytes
    (two halves of 64: values 0-31 low nibbles of bytes 0-31, 32-63 of bytes 32-63, 64-95 high of 0-31, 96-127 high
    of 32-63), their high bit pairs in 64 bytes (two halves of 32: values 0-31 bits 0-1, 32-63 2-3, 64-95 4-5, 96-127
    6-7)."""
    n = rows.shape[0]
    b = rows.view(n, -1, 210)
    ql, qh = b[..., :128].reshape(n, -1, 2, 2, 32), b[..., 128:192].reshape(n, -1, 2, 32)
    low = torch.stack(_byte_fields(ql, (0, 4), _LOW4), dim=3).reshape(n, -1, 2, 4, 32)
    high = torch.stack(_byte_fields(qh, (0, 2, 4, 6), _LOW2), dim=3)
    q = (low | (high << 4)).reshape(n, -1, 16)
    d, sc = _f16(b[..., 208:210]), b[..., 192:208].contiguous().view(torch.int8)
    codes = (sc.reshape(n, -1), None, torch.stack([d, torch.zeros_like(d)], dim=-1))
    return _Blocks(q, (d[..., None] * sc.float()).reshape(n, -1), None, 32, 6, codes)


_DECODERS: Dict[str, Callable[[torch.Tensor, int], _Blocks]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q6_K": _q6_k,
    "Q4_K": lambda rows, k: _k_quant(rows, k, 144, 4), "Q5_K": lambda rows, k: _k_quant(rows, k, 176, 5),
}
