"""Weight formats of the linear layers: dense float32 / bfloat16; float8_e4m3fn / int8 values with a float32
scale per row and block of BLOCK_K columns (the layout of the `mili_linear` kernel, bindings/reference.linear); 4-bit
values with a float16 scale and min per row and block of INT4_BLOCK_K columns (`mili_linear_int4`,
bindings/reference.linear_int4).

Qwen's FP8 checkpoints scale 128 x 128 blocks (`weight_scale_inv` [ceil(N / 128), ceil(K / 128)]); loading
repeats each scale over the block's rows, which is exact."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence, Union

import torch
from safetensors.torch import load_file, save_file

from bindings import library, reference

BLOCK_K = 128
INT4_BLOCK_K = 64
"""int4's block: its float16 scale and min add 0.5 bit a weight, as Q4_0's scale per 32 does, for 3% less error than
Q4_0 on Gaussian weights (a float32 scale and min per 128, the same bytes, had 9% more: benchmarks/RESULTS.md)."""
WEIGHT_DTYPES = ("float32", "bfloat16", "fp8", "int8", "int4")
"""--weight-dtype choices ("auto": the checkpoint's FP8 when it has it, else the activation dtype)."""
FP8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
_QUANTIZED = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
_LARGEST = {torch.float8_e4m3fn: FP8_E4M3_MAX, torch.int8: 127.0}


class QuantizedWeight(NamedTuple):
    """A linear layer's weight [N, K] as float8_e4m3fn or int8 values times scales[N, ceil(K / block_k)]."""

    weight: torch.Tensor
    scales: torch.Tensor
    block_k: int

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return reference.dequantize(self.weight, self.scales, self.block_k).to(dtype)


class Int4Weight(NamedTuple):
    """A linear layer's weight [N, K] as 4-bit values q (0..15; 6-bit, 0..63, for the LM head under 4-bit layers)
    packed by reference.pack_int4: w = q * scales + mins, scales and mins float16 per row and block of block_k
    columns (a multiple of 8), tiled by reference.tile_int4_scales; mins [1, 1, 1]: one min per scale for every block
    (a zero point's, reference.SHARED_MIN_SHAPE). With supers (a GGUF file's K-quants), scales and mins (unless
    one per scale) are int8 codes times their rows' multipliers of a super-block (reference.coded_scales)."""

    packed: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor
    block_k: int
    in_features: int
    out_features: int
    supers: Optional[torch.Tensor] = None

    @classmethod
    def of(cls, q: torch.Tensor, scales: torch.Tensor, mins: Optional[torch.Tensor], block_k: int, bits: int = 4,
           zero: Optional[float] = None) -> "Int4Weight":
        """The weight of values q [N, K] and scales and mins [ceil(K / block_k), N] (refused where float16
        overflows); zero: each block's min is -zero times its scale, held as one value (_zero_point_min), and mins
        is not read (None)."""
        n, k = q.shape
        tile = lambda t: reference.tile_int4_scales(_half_scales(t))
        held = tile(mins) if zero is None else _zero_point_min(zero)
        return cls(reference.pack_int4(q, bits), tile(scales), held, block_k, k, n)

    @classmethod
    def coded(cls, q: torch.Tensor, scale_codes: torch.Tensor, min_codes: Optional[torch.Tensor],
              multipliers: torch.Tensor, block_k: int, bits: int, zero: Optional[float] = None) -> "Int4Weight":
        """The weight of values q [N, K], int8 scale and min codes [ceil(K / block_k), N] and each row's float16
        multipliers of them, [N, S, 2] for S super-blocks (reference.coded_scales); zero: each block's min is -zero
        times its scale, held as one value, and min_codes is not read (None)."""
        n, k = q.shape
        tile = lambda t: reference.tile_int4_scales(t.to(torch.int8))
        held = tile(min_codes) if zero is None else _zero_point_min(zero)
        return cls(reference.pack_int4(q, bits), tile(scale_codes), held, block_k, k, n,
                   reference.tile_supers(multipliers.to(torch.float16)))

    @property
    def bits(self) -> int:
        return reference.packed_bits(self.packed, self.in_features)

    @property
    def zero(self) -> Optional[float]:
        """Where every block's min is -zero times its scale (mins held as one value), zero; else None."""
        return -float(self.mins) if tuple(self.mins.shape) == reference.SHARED_MIN_SHAPE else None

    def values(self) -> torch.Tensor:
        """q [N, K]."""
        return reference.unpack_int4(self.packed, self.out_features, self.in_features)

    def plain(self) -> "Int4Weight":
        """The weight with a float16 scale and min per block: codes and a zero point's min multiplied out (refused
        where float16 overflows)."""
        scales, mins = (_half_scales(t) for t in reference.int4_block_values(self.scales, self.mins, self.supers))
        return self._replace(scales=scales, mins=mins, supers=None)

    def block_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """scales and mins [ceil(K / block_k), N] (float16, plain())."""
        plain = self.plain()
        return tuple(reference.untile_int4_scales(t, self.out_features) for t in (plain.scales, plain.mins))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return reference.dequantize_int4(self.packed, self.scales, self.mins, self.block_k, self.out_features,
                                         self.in_features, self.supers).to(dtype)


def _zero_point_min(zero: float) -> torch.Tensor:
    """A zero point's mins, each block's -zero times its scale, held as one value (reference.SHARED_MIN_SHAPE)."""
    return torch.full(reference.SHARED_MIN_SHAPE, -zero, dtype=torch.float16)


LinearWeight = Union[torch.Tensor, QuantizedWeight, Int4Weight]
INT4_STEPS = (-1.0, -0.5, 0.0, 0.5, 1.0)
"""The ranges quantize_int4 tries per block: (max - min) / (2^bits - 1 + step), each refined by least squares."""
INT4_ROWS_AT_ONCE = 256
"""Rows quantize_int4 fits at a time: its temporaries stay in cache (a 3072 x 1024 weight 4x faster than whole)."""


def parse_weight_dtype(name: str) -> str:
    name = {"fp32": "float32", "bf16": "bfloat16", "float8_e4m3fn": "fp8", "q8": "int8", "q4": "int4"}.get(name, name)
    if name != "auto" and name not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype {name!r} is not supported: use one of auto, {', '.join(WEIGHT_DTYPES)}")
    return name


def quantize(weight: torch.Tensor, weight_dtype: str, block_k: int = BLOCK_K) -> QuantizedWeight:
    """weight [N, K] as fp8 / int8 with a scale per row and block: the block's largest |value| maps to the
    format's largest value (448 / 127)."""
    qtype = _QUANTIZED[weight_dtype]
    n, k = weight.shape
    blocks = -(-k // block_k)
    w = torch.nn.functional.pad(weight.float(), (0, blocks * block_k - k)).view(n, blocks, block_k)
    scales = w.abs().amax(dim=2).clamp(min=1e-12) / _LARGEST[qtype]
    q = w / scales[:, :, None]
    largest = _LARGEST[qtype]
    q = (q.round() if qtype == torch.int8 else q).clamp(-largest, largest)
    return QuantizedWeight(q.to(qtype).view(n, blocks * block_k)[:, :k].contiguous(), scales, block_k)


def quantize_int4(weight: torch.Tensor, block_k: int = INT4_BLOCK_K, bits: int = 4) -> Int4Weight:
    """weight [N, K] as 4-bit (or 6-bit) values with a scale and a min per row and block (w ~ q * scale + min). For
    each block, q is tried for several ranges around its min..max, the scale and min of each fitted by least squares
    (as llama.cpp's K-quants choose theirs), and the fit with the least squared error kept."""
    n, k = weight.shape
    levels = 2**bits - 1
    parts = [_fit_int4(weight[i : i + INT4_ROWS_AT_ONCE], block_k, levels) for i in range(0, n, INT4_ROWS_AT_ONCE)]
    q, scales, mins = (torch.cat(t) for t in zip(*parts))
    return Int4Weight.of(q, scales.t(), mins.t(), block_k, bits)


def _half_scales(t: torch.Tensor) -> torch.Tensor:
    """t (a 4-bit weight's scales or mins) in float16, as the kernel reads them; refused where float16 overflows."""
    half = t.to(torch.float16).contiguous()
    if not torch.isfinite(half).all():
        raise ValueError(f"weights too large for int4's float16 scales (|scale or min| up to {t.abs().max():.3g}, "
                         "float16 holds 65504): use --weight-dtype int8 or bfloat16")
    return half


def _fit_int4(weight: torch.Tensor, block_k: int, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    blocks = -(-k // block_k)
    w = weight.float()
    if k % block_k:  # the last block padded with its last column: its min and max stay, its fit barely moves
        w = torch.nn.functional.pad(w[None], (0, blocks * block_k - k), mode="replicate")[0]
    w = w.view(n, blocks, block_k)
    low, high = w.amin(dim=2, keepdim=True), w.amax(dim=2, keepdim=True)
    spread = (high - low).clamp(min=1e-12)
    offset, w_mean = w - low, w.mean(dim=2, keepdim=True)
    centred = w - w_mean
    w_var = (centred * centred).mean(dim=2, keepdim=True).double()
    best_err = torch.full_like(w_var, float("inf"))
    best_factor, best_scale, best_min = torch.zeros_like(low), low.clone(), low.clone()
    q = torch.empty_like(w)
    for step in INT4_STEPS:
        factor = (levels + step) / spread
        torch.mul(offset, factor, out=q).round_().clamp_(0, levels)
        # each block's least-squares scale and min and its squared error, block_k * (var(w) - cov(q, w)^2 / var(q)),
        # from its sums: q's are exact (integers), the rest in float64 (the error is a difference of near values)
        q_mean = q.sum(dim=2, keepdim=True).double() / block_k
        q_var = (q * q).sum(dim=2, keepdim=True).double() / block_k - q_mean * q_mean
        cov = (q * centred).sum(dim=2, keepdim=True).double() / block_k
        fitted = q_var > 0
        scale = torch.where(fitted, cov / q_var.clamp(min=1e-30), torch.zeros_like(cov))
        err = block_k * torch.where(fitted, w_var - cov * scale, w_var)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_factor = torch.where(better, factor, best_factor)
        best_scale = torch.where(better, scale.float(), best_scale)
        best_min = torch.where(better, (w_mean - scale * q_mean).float(), best_min)
    torch.mul(offset, best_factor, out=q).round_().clamp_(0, levels)
    return q.view(n, blocks * block_k)[:, :k].to(torch.uint8), best_scale[:, :, 0], best_min[:, :, 0]


def from_block_scales(weight: torch.Tensor, scale_inv: torch.Tensor, block_size: Sequence[int]) -> QuantizedWeight:
    """A Qwen FP8 checkpoint's weight [N, K] and `weight_scale_inv` [ceil(N / bn), ceil(K / bk)] (w = weight *
    scale_inv over each bn x bk block) in the per-row layout."""
    block_n, block_k = block_size
    scales = scale_inv.float().repeat_interleave(block_n, dim=0)[: weight.shape[0]].contiguous()
    return QuantizedWeight(weight, scales, block_k)


def quantize_fp8_blocks(
    weight: torch.Tensor, block_size: Sequence[int] = (BLOCK_K, BLOCK_K)
) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] as Qwen's FP8 checkpoints store it: float8_e4m3fn values and `weight_scale_inv`
    [ceil(N / bn), ceil(K / bk)], each block's largest |value| mapped to 448."""
    bn, bk = block_size
    n, k = weight.shape
    rows, cols = -(-n // bn), -(-k // bk)
    w = torch.nn.functional.pad(weight.float(), (0, cols * bk - k, 0, rows * bn - n)).view(rows, bn, cols, bk)
    scale_inv = w.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_E4M3_MAX
    q = (w / scale_inv[:, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale_inv


def write_fp8_checkpoint(
    src: str | os.PathLike, dst: str | os.PathLike, block_size: Sequence[int] = (BLOCK_K, BLOCK_K)
) -> Path:
    """A copy of the checkpoint `src` in the layout of Qwen's FP8 releases: every decoder projection as
    float8_e4m3fn with its `weight_scale_inv`, the rest as it was, and config.json's quantization_config."""
    def projection(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scale_inv = quantize_fp8_blocks(weight, block_size)
        return {name: q, name + "_scale_inv": scale_inv}

    return rewrite_projections(src, dst, projection, {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                      "quant_method": "fp8", "weight_block_size": list(block_size)})


def rewrite_projections(src: str | os.PathLike, dst: str | os.PathLike,
                        projection: Callable[[str, torch.Tensor], dict[str, torch.Tensor]], quantization_config: dict,
                        other: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                        torch_dtype: Optional[str] = None) -> Path:
    """A copy of the checkpoint `src` at `dst` with each decoder projection's weight `name` replaced by the tensors
    projection(name, weight) returns, every other tensor by other(tensor), and config.json's quantization_config
    (and torch_dtype) set: how the tests and benchmarks write quantized checkpoints of a checkpoint's weights."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.suffix == ".safetensors":
            tensors = {}
            for name, t in load_file(file).items():
                if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                    tensors.update(projection(name, t))
                else:
                    tensors[name] = other(t)
            save_file(tensors, dst / file.name, metadata={"format": "pt"})
        elif file.name != "model.safetensors.index.json" and file.is_file():
            shutil.copyfile(file, dst / file.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config
    if torch_dtype:  # under the keys the source has (transformers 5 writes `dtype`), so that they agree
        keys = [key for key in ("dtype", "torch_dtype") if key in config] or ["torch_dtype"]
        config.update(dict.fromkeys(keys, torch_dtype))
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def lm_head_dtype(weight_dtype: str) -> str:
    """The LM head's format under layers in weight_dtype: 6 bits under 4-bit layers (as llama.cpp's 4-bit files keep
    theirs at Q6_K: a quarter of Qwen3-0.6B's weights, its logits' accuracy), else the layers' own."""
    return "int6" if weight_dtype == "int4" else weight_dtype


def convert(weight: LinearWeight, weight_dtype: str, dense_dtype: torch.dtype) -> LinearWeight:
    """weight in `weight_dtype` (dense formats in dense_dtype when weight_dtype is not one of them; "int6": the
    6-bit form of int4, the LM head's under 4-bit layers)."""
    if weight_dtype in ("int4", "int6"):
        bits = int(weight_dtype[3:])
        if isinstance(weight, Int4Weight) and weight.bits == bits:
            return weight
        return quantize_int4(dense(weight, torch.float32), bits=bits)
    if weight_dtype in _QUANTIZED:
        if isinstance(weight, QuantizedWeight) and weight.weight.dtype == _QUANTIZED[weight_dtype]:
            return weight
        return quantize(dense(weight, torch.float32), weight_dtype)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(weight_dtype, dense_dtype)
    return dense(weight, dtype)


def dense(weight: LinearWeight, dtype: torch.dtype) -> torch.Tensor:
    """weight as a dense tensor in dtype (quantized formats dequantized)."""
    return weight.to(dtype) if isinstance(weight, torch.Tensor) else weight.dequantize(dtype)


def reblocked(weight: Int4Weight, block_k: int, bits: int) -> Int4Weight:
    """weight with the same values in blocks of block_k columns (a divisor of its own) and `bits` (at least its own):
    each block's scale and min repeated over the smaller blocks it holds."""
    if weight.block_k % block_k or bits < weight.bits:
        raise ValueError(f"a {weight.bits}-bit weight in blocks of {weight.block_k} cannot be held in {bits} bits "
                         f"in blocks of {block_k}")
    blocks = -(-weight.in_features // block_k)
    scales, mins = (t.repeat_interleave(weight.block_k // block_k, dim=0)[:blocks] for t in weight.block_scales())
    return Int4Weight.of(weight.values(), scales, mins, block_k, bits, weight.zero)


def common_int4(parts: Sequence[Int4Weight]) -> list[Int4Weight]:
    """4-bit / 6-bit weights in one layout holding each one's values: the most bits, the common divisor of their
    blocks (a GGUF's Q4_K q / k with its Q6_K v)."""
    bits, block_k = max(p.bits for p in parts), math.gcd(*(p.block_k for p in parts))
    return [p if (p.bits, p.block_k) == (bits, block_k) else reblocked(p, block_k, bits) for p in parts]


def cat_rows(parts: Sequence[LinearWeight]) -> LinearWeight:
    """Weights of several layers stacked along N (q, k, v; gate, up), in the format they share: 4-bit weights of
    different bits or blocks in the one that holds them all (common_int4), other mixes dense in float32."""
    if len(parts) == 1:
        return parts[0]
    if any(type(p) is not type(parts[0]) for p in parts):
        return torch.cat([dense(p, torch.float32) for p in parts])
    if isinstance(parts[0], Int4Weight):
        if any(p.in_features != parts[0].in_features for p in parts):
            raise ValueError("cannot stack 4-bit weights of different input sizes")
        parts = common_int4(parts)
        scales, mins = zip(*(p.block_scales() for p in parts))
        zeros = {p.zero for p in parts}  # one zero point for all: kept so
        zero = zeros.pop() if len(zeros) == 1 else None
        return Int4Weight.of(torch.cat([p.values() for p in parts]), torch.cat(scales, dim=1), torch.cat(mins, dim=1),
                             parts[0].block_k, parts[0].bits, zero)
    if isinstance(parts[0], QuantizedWeight):
        if any(p.block_k != parts[0].block_k or p.weight.dtype != parts[0].weight.dtype for p in parts):
            raise ValueError("cannot stack quantized weights of different formats or block sizes")
        return QuantizedWeight(
            torch.cat([p.weight for p in parts]), torch.cat([p.scales for p in parts]), parts[0].block_k
        )
    return torch.cat(list(parts))


def stack_experts(experts: Sequence[LinearWeight],
                  empty: Optional[Callable[[tuple[int, ...], torch.dtype], torch.Tensor]] = None) -> LinearWeight:
    """The experts' weights (one format and shape) stacked along a new first dimension: a dense weight [E, ...], a
    quantized one with each of its tensors so (expert() takes one back). empty(shape, dtype): the memory of each stack
    (None: torch.empty on the experts' device)."""
    if isinstance(experts[0], Int4Weight) and len({(e.zero, _layout(e)) for e in experts}) > 1:
        experts = [e.plain() for e in experts]  # a zero point's and others', codes and others
    first = experts[0]
    if any(type(e) is not type(first) or _layout(e) != _layout(first) for e in experts):
        raise ValueError("cannot stack experts' weights of different formats or shapes")

    def stack(ts: list[torch.Tensor]) -> torch.Tensor:
        shape = (len(ts), *ts[0].shape)
        out = torch.empty(shape, dtype=ts[0].dtype, device=ts[0].device) if empty is None else empty(shape, ts[0].dtype)
        return torch.stack(ts, out=out)

    if isinstance(first, torch.Tensor):
        return stack(list(experts))
    return type(first)(*(stack([e[i] for e in experts]) if isinstance(f, torch.Tensor) else f
                         for i, f in enumerate(first)))


def _layout(weight: LinearWeight) -> tuple:
    tensors = [weight] if isinstance(weight, torch.Tensor) else weight
    return tuple((t.dtype, t.shape) if isinstance(t, torch.Tensor) else t for t in tensors)


def expert(weights: LinearWeight, e: int) -> LinearWeight:
    """Expert e's weight of stack_experts' weights."""
    if isinstance(weights, torch.Tensor):
        return weights[e]
    return type(weights)(*(f[e] if isinstance(f, torch.Tensor) else f for f in weights))


def linear(x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    """x @ weight^T in PyTorch as MILI's CPU kernel computes it (reference.linear), for the reference backend."""
    if isinstance(weight, QuantizedWeight):
        return reference.linear(x, weight.weight, weight.scales, weight.block_k)
    if isinstance(weight, Int4Weight):
        return reference.linear_int4(x, weight.packed, weight.scales, weight.mins, weight.block_k,
                                     weight.out_features, library.AMX_TILES, weight.supers)
    if weight.dtype == x.dtype:
        return x @ weight.T
    return reference.linear(x, weight)
