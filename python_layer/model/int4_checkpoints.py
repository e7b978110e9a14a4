"""Qwen's 4-bit checkpoints as they are: AWQ (AutoAWQ's GEMM layout) and GPTQ (GPTQModel's and AutoGPTQ's), told
apart by config.json's quantization_config, read into MILI's 4-bit format (quantization.Int4Weight).

AWQ (quant_method "awq", version "gemm", bits 4, zero_point): `qweight` int32 [K, N / 8], each word eight columns
of a row, nibble i (bits 4i .. 4i + 3) holding column 8c + AWQ_ORDER[i]; `qzeros` int32 [K / group, N / 8] packed
alike; `scales` float16 [K / group, N]. w[n, k] = (q[k, n] - z[k / group, n]) * s[k / group, n].

GPTQ (quant_method "gptq", bits 4 or 8): `qweight` int32 [K / P, N] (P = 32 / bits values per word), word r of a
column holding rows P r + i at bits i * bits; `qzeros` int32 [groups, N / P] packed along N alike; `scales` float16
[groups, N]; `g_idx` int32 [K], the group of each input row (desc_act orders them by activation, otherwise
g_idx[k] = k / group). checkpoint_format "gptq" (v1, the classic storage) keeps zero - 1, "gptq_v2" the zero.
w[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n].

4-bit weights whose groups are runs of a multiple of 64 input columns (or one per row) become Int4Weight: scale s
and min -z * s per row and block of 64 columns, in float16 (s exactly; -z * s rounded to float16, as AWQ's and
GPTQ's own float16 kernels round their products). Others (8 bits, groups of 32, a g_idx out of order), and every
weight a dense format asks for, are dequantized exactly into float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch

from .quantization import INT4_BLOCK_K, Int4Weight, LinearWeight, rewrite_projections

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's order of a word's eight columns: nibble i holds column AWQ_ORDER[i]."""
METHODS = ("awq", "gptq")
SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")
"""The tensors of a projection X in these checkpoints, X.qweight ... instead of X.weight (AWQ has no g_idx)."""


@dataclass(frozen=True)
class Int4Checkpoint:
    """What a 4-bit checkpoint's quantization_config says."""

    method: str
    bits: int
    group_size: int  # -1: one group per row
    zero_offset: int  # what the stored zeros lack: 1 for GPTQ's v1 storage

    @classmethod
    def from_config(cls, q: Mapping) -> "Int4Checkpoint":
        method = q.get("quant_method")
        bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
        if method == "awq":
            if q.get("version", "gemm").lower() != "gemm" or not q.get("zero_point", True) or bits != 4:
                raise ValueError(f"AWQ quantization_config {dict(q)} is not supported: MILI reads AutoAWQ's GEMM "
                                 "layout with 4 bits and zero points (version 'gemm', zero_point true)")
        elif method == "gptq":
            if bits not in (4, 8):
                raise ValueError(f"GPTQ quantization_config bits {bits!r} is not supported: use 4 or 8")
            if q.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
                raise ValueError(f"GPTQ checkpoint_format {q['checkpoint_format']!r} is not supported: MILI reads "
                                 "'gptq' (v1) and 'gptq_v2'")
        if not isinstance(group, int) or not (group == -1 or group > 0):
            raise ValueError(f"quantization_config group_size must be a positive integer or -1, got {group!r}")
        offset = 1 if method == "gptq" and q.get("checkpoint_format", "gptq") == "gptq" else 0
        return cls(method, bits, group, offset)

    @property
    def per_word(self) -> int:
        return 32 // self.bits

    @property
    def suffixes(self) -> tuple[str, ...]:
        return SUFFIXES[:3] if self.method == "awq" else SUFFIXES

    def groups(self, k: int) -> int:
        return 1 if self.group_size == -1 else -(-k // self.group_size)

    def _group_columns(self, k: int) -> int:
        return k if self.group_size == -1 else self.group_size

    def shapes(self, n: int, k: int) -> dict[str, tuple[int, ...]]:
        """The tensors of an [N, K] layer, by suffix."""
        g, p = self.groups(k), self.per_word
        if self.method == "awq":
            return {"qweight": (k, n // p), "qzeros": (g, n // p), "scales": (g, n)}
        return {"qweight": (k // p, n), "qzeros": (g, n // p), "scales": (g, n), "g_idx": (k,)}

    def read(self, tensors: Mapping[str, torch.Tensor], n: int, k: int, packed: bool = True) -> LinearWeight:
        """An [N, K] layer from its tensors (by suffix): Int4Weight where its format holds it (packed), else exactly
        in float32."""
        q = _unpack(tensors["qweight"], self.bits, dim=0 if self.method == "gptq" else 1)  # [K, N]
        zeros = _unpack(tensors["qzeros"], self.bits, dim=1).to(torch.int32) + self.zero_offset  # [groups, N]
        if self.method == "awq":
            q, zeros = _awq_columns(q), _awq_columns(zeros)
        scales = tensors["scales"].float()
        block = self._group_columns(k)
        in_order = torch.arange(k, device=scales.device) // block
        group_of = self._g_idx(tensors["g_idx"], k) if "g_idx" in tensors else in_order
        whole_blocks = self.group_size == -1 or block % INT4_BLOCK_K == 0
        if packed and self.bits == 4 and torch.equal(group_of, in_order) and whole_blocks:
            # each group's scale and min repeated over its blocks of INT4_BLOCK_K columns
            blocks = torch.arange(-(-k // INT4_BLOCK_K), device=scales.device) * INT4_BLOCK_K // block
            s, z = scales[blocks], zeros[blocks].float()
            if bool((z == z.flatten()[0]).all()):  # one zero point (GPTQ's sym): held as one min per scale
                return Int4Weight.of(q.t(), s, None, INT4_BLOCK_K, zero=float(z.flatten()[0]))
            return Int4Weight.of(q.t(), s, -z * s, INT4_BLOCK_K)
        return ((q.float() - zeros[group_of].float()) * scales[group_of]).t().contiguous()

    def _g_idx(self, g_idx: torch.Tensor, k: int) -> torch.Tensor:
        g_idx = g_idx.long()
        if g_idx.min() < 0 or g_idx.max() >= self.groups(k):
            raise ValueError(f"g_idx names groups outside 0..{self.groups(k) - 1}")
        return g_idx


def int4_checkpoint(quantization_config: Optional[Mapping]) -> Optional[Int4Checkpoint]:
    """The checkpoint's 4-bit (or GPTQ 8-bit) format, None for others."""
    if quantization_config and quantization_config.get("quant_method") in METHODS:
        return Int4Checkpoint.from_config(quantization_config)
    return None


def _unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 words -> their 32 / bits values (uint8), along `dim`, value i of a word at bits i * bits."""
    # a word's bytes in memory order, lowest first (little-endian, as every machine MILI runs on)
    word_bytes = packed.to(torch.int32).contiguous().view(torch.uint8).view(*packed.shape, 4)
    values = word_bytes if bits == 8 else torch.stack((word_bytes & 15, word_bytes >> 4), dim=-1)
    values = values.reshape(*packed.shape, 32 // bits)  # [..., per_word]
    if dim == 1:
        return values.reshape(packed.shape[0], -1)
    return values.permute(0, 2, 1).reshape(-1, packed.shape[1])


def _pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """_unpack's inverse: values [R, C] (0 .. 2^bits - 1) -> int32 words along `dim`."""
    per_word = 32 // bits
    v = values.to(torch.int64)
    v = v.reshape(v.shape[0], -1, per_word) if dim == 1 else v.reshape(-1, per_word, v.shape[1]).permute(0, 2, 1)
    words = (v << (torch.arange(per_word) * bits)).sum(dim=-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _awq_columns(values: torch.Tensor) -> torch.Tensor:
    """AWQ's unpacked [R, C] (each eight columns in AWQ_ORDER) in column order."""
    inverse = torch.tensor(AWQ_ORDER, device=values.device).argsort()
    return values.reshape(values.shape[0], -1, 8)[:, :, inverse].reshape(values.shape)


def _quantize_groups(weight: torch.Tensor, bits: int, group: int, sym: bool) -> tuple[torch.Tensor, ...]:
    """Round-to-nearest of weight [N, K] per row and group of input columns: q [K, N], zeros and scales [G, N]."""
    n, k = weight.shape
    top = (1 << bits) - 1
    groups = -(-k // group)
    # the last group padded with zeros, which both ranges hold already
    w = torch.nn.functional.pad(weight.float(), (0, groups * group - k)).t().reshape(groups, group, n)
    if sym:
        scales = w.abs().amax(dim=1).clamp(min=1e-8) * 2 / top
        zeros = torch.full_like(scales, (top + 1) // 2)
    else:
        low, high = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
        scales = ((high - low) / top).clamp(min=1e-8)
        zeros = (-low / scales).round().clamp(0, top)
    scales = scales.half().float()  # stored as float16: q is rounded against the stored scale
    q = (w / scales[:, None] + zeros[:, None]).round().clamp(0, top).reshape(groups * group, n)[:k]
    return q.to(torch.uint8), zeros.to(torch.uint8), scales.half()


def write_int4_checkpoint(src: str | Path, dst: str | Path, method: str, bits: int = 4, group_size: int = 128,
                          sym: bool = False, desc_act: bool = False, seed: int = 0) -> Path:
    """A copy of checkpoint `src` with every decoder projection quantized round-to-nearest in `method`'s layout
    ("awq": AutoAWQ GEMM; "gptq": GPTQ v1 with g_idx, a random order of its input columns' groups when desc_act),
    the rest (embeddings, norms, LM head) as it was, float16 as these checkpoints are, and the quantization_config."""
    generator = torch.Generator().manual_seed(seed)

    def projection(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        base = name[: -len(".weight")]
        layer = _quantize_layer(weight, method, bits, group_size, sym, desc_act, generator)
        return {f"{base}.{s}": v for s, v in layer.items()}

    config = (
        {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
         "modules_to_not_convert": None}
        if method == "awq" else
        {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": desc_act,
         "checkpoint_format": "gptq"}
    )
    half = lambda t: t.half() if t.is_floating_point() else t
    return rewrite_projections(src, dst, projection, config, other=half, torch_dtype="float16")


def _quantize_layer(weight: torch.Tensor, method: str, bits: int, group: int, sym: bool, desc_act: bool,
                    generator: torch.Generator) -> dict[str, torch.Tensor]:
    k = weight.shape[1]
    order = torch.randperm(k, generator=generator) if desc_act else torch.arange(k)
    # desc_act: groups are formed over the columns in `order`; g_idx maps each column back to its group
    group = group if group != -1 else k
    q, zeros, scales = _quantize_groups(weight[:, order], bits, group, sym)
    if method == "awq":
        reorder = lambda v: v.reshape(v.shape[0], -1, 8)[:, :, list(AWQ_ORDER)].reshape(v.shape)
        return {"qweight": _pack(reorder(q), 4, 1), "qzeros": _pack(reorder(zeros), 4, 1), "scales": scales}
    q = q[order.argsort()]
    g_idx = (order.argsort() // group).to(torch.int32)
    # v1 storage: zero - 1, in `bits` bits (a zero of 0 is stored as all ones, and read back as 2^bits, as GPTQ does)
    stored = (zeros.to(torch.int32) - 1) & ((1 << bits) - 1)
    return {"qweight": _pack(q, bits, 0), "qzeros": _pack(stored, bits, 1), "scales": scales, "g_idx": g_idx}
