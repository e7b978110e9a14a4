"""Plain-PyTorch reference of every MILI op: the specification the Mojo kernels are tested against.

Conventions shared by all ops:
- Activations are `[T, ...]`: the tokens of every sequence of a step concatenated (ragged, no padding).
- K/V caches are `[num_pages, page_size, num_kv_heads, kv_head_len(head_dim, dtype)]`, one pair per layer: float32,
  bfloat16, float8_e4m3fn or int8 (to_kv_cache).
- Integer tensors (positions, page tables, lengths, offsets, slot mappings) are int32.
- Reductions and softmax run in float32 whatever the input dtype; outputs have the input dtype.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual_out = x + residual; returns (rms_norm(residual_out), residual_out)."""
    residual_out = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(residual_out, weight, eps), residual_out


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's q/k norm: RMSNorm of x[T, heads, head_dim] over head_dim with a weight[head_dim] shared by heads."""
    return rms_norm(x, weight, eps)


def rope_inv_freq(
    head_dim: int, theta: float, rope_scaling: Optional[dict] = None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the cos/sin scale ("attention factor") of rotate-half RoPE.

    `rope_scaling` None or rope_type "default" is plain RoPE; rope_type "yarn" follows the YaRN paper as
    transformers implements it (factor, original_max_position_embeddings, beta_fast, beta_slow, mscale,
    mscale_all_dim, attention_factor, truncate).
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type != "yarn":
        raise ValueError(f"rope_scaling.rope_type {rope_type!r} is not supported: use 'default' or 'yarn'")
    return _yarn_inv_freq(head_dim, theta, scaling)


def _yarn_inv_freq(head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    factor = float(scaling["factor"])
    original_max = scaling["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attention_factor)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    theta: float,
    rope_scaling: Optional[dict] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half (NeoX) RoPE of q[T, Hq, D] and k[T, Hkv, D] at positions[T]; returns new (q, k)."""
    inv_freq, scale = rope_inv_freq(q.shape[-1], theta, rope_scaling)
    return rope_with_table(q, k, positions, inv_freq, scale)


def rope_with_table(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rope with its inverse frequencies [D / 2] and cos / sin scale given (rope_inv_freq makes them)."""
    angles = positions.float()[:, None] * inv_freq.to(q.device)[None, :]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    cos, sin = angles.cos() * scale, angles.sin() * scale

    def apply(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)

    return apply(q), apply(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU: x[T, 2I] = [gate | up] -> silu(gate) * up, [T, I]."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def moe_route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts (transformers' Qwen3MoeTopKRouter): the top_k of softmax(logits [T, E]) in float32, as
    (weights [T, top_k] float32, ids [T, top_k] int32), largest first; normalize: the weights rescaled to sum to 1."""
    weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def moe(x: torch.Tensor, logits: torch.Tensor, top_k: int, normalize: bool,
        gate_up: Callable[[torch.Tensor, int], torch.Tensor],
        down: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """A sparse MLP [T, H] in x's dtype: over each token's experts e (moe_route), the sum in float32 of its weight
    times down(silu_and_mul(gate_up(x, e)), e), where gate_up(x, e) [.., 2I] and down(h, e) [.., H] are expert e's
    linears."""
    weights, ids = moe_route(logits, top_k, normalize)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in ids.unique().tolist():
        rows, slots = (ids == e).nonzero(as_tuple=True)
        y = down(silu_and_mul(gate_up(x[rows], e)), e).float() * weights[rows, slots, None]
        out.index_add_(0, rows, y)
    return out.to(x.dtype)


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of each row's k largest logits, largest first: NaN above every number (as torch.topk),
    equal values in index order."""
    values, indices = torch.sort(logits.float(), dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def sample_top_k(logits: torch.Tensor, k: torch.Tensor, settings: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row r's token drawn among its k[r] largest logits with settings[r] = (temperature, top_p, min_p) and the
    uniform u[r]: weights exp((x - x_max) / temperature); top-p drops the least likely while their mass stays within
    1 - top_p of the total, min-p the weights below min_p (never the top one); then the first kept candidate in
    token-id order whose cumulative weight (float64) exceeds u[r] times the kept total (the sampler's draw)."""
    tokens = []
    for r in range(logits.shape[0]):
        values, ids = top_k(logits[r : r + 1], int(k[r]))
        values, ids = values[0], ids[0]
        temperature, top_p, min_p = settings[r].tolist()
        if not torch.isfinite(values[0]):
            tokens.append(int(ids[0]))
            continue
        w = torch.exp((values - values[0]) / temperature).double()
        keep = (w.flip(0).cumsum(0).flip(0) > (1 - top_p) * w.sum()) & (w >= min_p)
        keep[0] = True
        w, ids = w[keep], ids[keep]
        order = ids.argsort()
        w, ids = w[order], ids[order]
        cdf = w.cumsum(0)
        drawn = int(torch.searchsorted(cdf, float(u[r]) * cdf[-1:], right=True).clamp(max=len(ids) - 1))
        tokens.append(int(ids[drawn]))
    return torch.tensor(tokens, dtype=torch.long)


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x.float()).to(x.dtype)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU."""
    return F.gelu(x.float()).to(x.dtype)


def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


KV_SCALE_BYTES = 4
"""An int8 cache's head row ends in its scale, the 4 bytes of a float32 (mojo_kernels/memory/kv_format.mojo)."""
FP8_MAX = 448.0


def kv_head_len(head_dim: int, dtype: torch.dtype) -> int:
    """Elements a head takes in a cache row of this dtype."""
    return head_dim + KV_SCALE_BYTES if dtype == torch.int8 else head_dim


def kv_head_dim(cache: torch.Tensor) -> int:
    """The head_dim of a cache [pages, page_size, kv_heads, kv_head_len]."""
    return cache.shape[3] - KV_SCALE_BYTES if cache.dtype == torch.int8 else cache.shape[3]


def to_kv_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Head rows x[..., D] as a cache of `dtype` holds them: rounded to float32 / bfloat16; float8_e4m3fn saturated
    to +-448 (no scale); int8 q = round(x * 127 / max |x|) per head, followed by the scale max |x| / 127 as a
    float32's bytes."""
    if dtype == torch.int8:
        x = x.float()
        largest = x.abs().amax(dim=-1, keepdim=True)
        inverse = torch.full_like(largest, 127) / largest  # as the kernel: 127 / largest, then a product
        q = torch.round(x * torch.where(largest > 0, inverse, 0)).to(torch.int8)
        return torch.cat([q, (largest / 127).view(torch.int8)], dim=-1)
    if dtype == torch.float8_e4m3fn:
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def from_kv_cache(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Cache head rows [..., kv_head_len] as float32 [..., head_dim]."""
    if rows.dtype == torch.int8:
        return rows[..., :head_dim].float() * rows[..., head_dim:].contiguous().view(torch.float32)
    return rows.float()


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k/v[T, Hkv, D] into the caches in place; token t goes to slot s = page * page_size + offset.
    A negative slot means "do not store" (a padding token)."""
    num_pages, page_size = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(num_pages * page_size, *k_cache.shape[2:])[slots] = to_kv_cache(k[keep], k_cache.dtype)
    v_cache.view(num_pages * page_size, *v_cache.shape[2:])[slots] = to_kv_cache(v[keep], v_cache.dtype)


def qk_norm_rope_store(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    eps: float,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Qwen3's attention inputs from the fused projection qkv[T, (Hq + 2 Hkv) * D]: returns q[T, Hq, D] normed and
    rotated; k normed and rotated, and v, are stored into the caches (store_kv)."""
    kv_heads, head_dim = k_cache.shape[2], kv_head_dim(k_cache)
    q_heads = qkv.shape[1] // head_dim - 2 * kv_heads
    q, k, v = qkv.view(qkv.shape[0], -1, head_dim).split([q_heads, kv_heads, kv_heads], dim=1)
    q, k = rope_with_table(head_rms_norm(q, q_norm, eps), head_rms_norm(k, k_norm, eps), positions, inv_freq, scale)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def qkv_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float, positions: torch.Tensor,
                  inv_freq: torch.Tensor, rope_scale: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor, page_table: torch.Tensor, context_lens: torch.Tensor,
                  query_start: torch.Tensor, scale: float) -> torch.Tensor:
    """Qwen3's attention from the fused projection qkv: qk_norm_rope_store (k and v stored into the caches), then
    paged_attention of its q."""
    q = qk_norm_rope_store(qkv, q_norm, k_norm, eps, positions, inv_freq, rope_scale, k_cache, v_cache, slot_mapping)
    return paged_attention(q, k_cache, v_cache, page_table, context_lens, query_start, scale)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    context_lens: torch.Tensor,
    query_start: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of ragged queries q[T, Hq, D] over paged K/V; returns [T, Hq, D].

    Sequence b owns queries query_start[b]:query_start[b+1] and context_lens[b] cached tokens (its new
    tokens included, already stored), in pages page_table[b, :]. Query i of a sequence of q_len queries
    sits at position context_len - q_len + i and sees keys 0..that position. Hq may be a multiple of Hkv (GQA).
    """
    page_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], q.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.empty_like(q)
    starts, lens = query_start.tolist(), context_lens.tolist()
    for b, context_len in enumerate(lens):
        q_begin, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_begin
        if q_len == 0:
            continue
        pages = page_table[b, : (context_len + page_size - 1) // page_size].long()
        k = from_kv_cache(k_cache[pages].flatten(0, 1)[:context_len], head_dim)
        v = from_kv_cache(v_cache[pages].flatten(0, 1)[:context_len], head_dim)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[q_begin:q_end].float(), k) * scale
        query_pos = torch.arange(context_len - q_len, context_len, device=q.device)[:, None]
        key_pos = torch.arange(context_len, device=q.device)[None, :]
        scores.masked_fill_(key_pos > query_pos, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[q_begin:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def dequantize(weight: torch.Tensor, scales: Optional[torch.Tensor] = None, block_k: int = 0) -> torch.Tensor:
    """A weight [N, K] as float32: float32 / bfloat16 as they are; float8_e4m3fn / int8 times scales[N, ceil(K /
    block_k)], one per row and block of block_k columns."""
    w = weight.float()
    if weight.dtype in (torch.float8_e4m3fn, torch.int8):
        w = w * scales.float().repeat_interleave(block_k, dim=1)[:, : w.shape[1]]
    return w


def effective_x(x: torch.Tensor, weight: torch.Tensor, block_k: int = 0) -> torch.Tensor:
    """x [M, K] in float32 as the linear kernel multiplies it by `weight`, as llama.cpp does for bf16 and q8_0:
    rounded to bfloat16 for bfloat16 weights; for int8 weights quantized to int8 per row and block of block_k
    columns (q = round(x * 127 / largest |x|), times largest |x| / 127); x itself for the others."""
    x = x.float()
    if weight.dtype == torch.bfloat16:
        return x.to(torch.bfloat16).float()
    if weight.dtype != torch.int8:
        return x
    return quantized_x(x, block_k)


def quantized_x(x: torch.Tensor, block_k: int) -> torch.Tensor:
    """x [M, K] in float32 quantized to int8 per row and block of block_k columns and back (effective_x of int8
    and 4-bit weights)."""
    x = x.float()
    m, k = x.shape
    blocks = torch.nn.functional.pad(x, (0, -k % block_k)).view(m, -1, block_k)
    largest = blocks.abs().amax(dim=2, keepdim=True)
    inverse = torch.full_like(largest, 127) / largest  # not 127 / largest: torch takes that as 127 * (1 / largest)
    q = torch.round(blocks * torch.where(largest > 0, inverse, 0))
    return (q * (largest / 127)).view(m, -1)[:, :k]


TILE_ROWS = 4
"""Weight rows per tile of a bfloat16 weight in the CPU linear kernel's tiled layout
(mojo_kernels/core/linear.mojo: NR)."""
TILE_BYTES = 64
"""Bytes of a bfloat16 row per run of the tiled layout (linear.mojo: TILE_BYTES)."""
I8_TILE_ROWS, I8_TILE_COLUMNS = 32, 4
"""An int8 weight's tiles: quads of its rows, 32 rows in turn (linear.mojo: the quad panels vpdpbusd reads)."""
F32_TILE_ROWS = 32
"""A float32 weight's tiles: panels of 32 rows, each column's 32 values in turn (linear.mojo: F32_TILE_ROWS)."""
TILED_DTYPES = (torch.float32, torch.bfloat16, torch.int8)
PAIR_TILE_ROWS, PAIR_TILE_COLUMNS = 32, 2
"""A bfloat16 weight as pair panels: its column pairs, 32 rows in turn (linear.mojo: PAIR_TILE_ROWS, the words AMX
tiles read; AVX-512 CPUs only)."""
AMX_COLUMNS = 32
"""bfloat16 columns of an AMX tile row: the kernels read pair panels on the tiles when K is a multiple of it."""
AMX_INT4_ROWS = 64
"""Rows of x from which the CPU kernels' 4-bit linears run on AMX tiles where they have them (linear_int4.mojo)."""


def tile_rows(dtype: torch.dtype, pairs: bool = False) -> int:
    if pairs:
        return PAIR_TILE_ROWS
    return {torch.int8: I8_TILE_ROWS, torch.float32: F32_TILE_ROWS}.get(dtype, TILE_ROWS)


def tile_columns(dtype: torch.dtype, pairs: bool = False) -> int:
    if pairs:
        return PAIR_TILE_COLUMNS
    return {torch.int8: I8_TILE_COLUMNS, torch.float32: 1}.get(dtype, TILE_BYTES // dtype.itemsize)


def can_tile(weight: torch.Tensor, pairs: bool = False) -> bool:
    """Whether tile_weight takes this weight: float32 / bfloat16 / int8 (pairs: bfloat16), N a multiple of tile_rows
    and K of tile_columns (every Qwen3 projection)."""
    dtypes = (torch.bfloat16,) if pairs else TILED_DTYPES
    return (weight.dim() == 2 and weight.dtype in dtypes and weight.shape[0] % tile_rows(weight.dtype, pairs) == 0
            and weight.shape[1] % tile_columns(weight.dtype, pairs) == 0)


def tile_weight(weight: torch.Tensor, pairs: bool = False) -> torch.Tensor:
    """A weight [N, K] in the CPU linear kernel's tiled layout [N / R, K / C, R, C] (R = tile_rows rows, C =
    tile_columns columns): each R rows as C-column runs of each row in turn, the order the kernel reads them in.
    An int8 weight's scales go with it as tile_scales makes them (block_k a multiple of C). pairs: a bfloat16 weight
    as pair panels (R 32, C 2)."""
    if not can_tile(weight, pairs):
        kind = "a bfloat16" if pairs else "a float32 / bfloat16 / int8"
        raise ValueError(
            f"tile_weight: needs {kind} [N, K] weight with N a multiple of {tile_rows(weight.dtype, pairs)} and K of "
            f"{tile_columns(weight.dtype, pairs)}, got {weight.dtype} {tuple(weight.shape)}"
        )
    n, k = weight.shape
    r, c = tile_rows(weight.dtype, pairs), tile_columns(weight.dtype, pairs)
    return weight.reshape(n // r, r, k // c, c).transpose(1, 2).contiguous()


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """A tiled int8 weight's scales: [K / block_k, N] from [N, K / block_k], so that a tile's scales of a block are one
    run of memory (the kernel's vectors of them, as the 4-bit format's)."""
    return scales.t().contiguous()


def untile_weight(tiles: torch.Tensor) -> torch.Tensor:
    """tile_weight's [N, K] weight back from its tiles."""
    n_tiles, k_tiles, rows, cols = tiles.shape
    return tiles.transpose(1, 2).reshape(n_tiles * rows, k_tiles * cols).contiguous()


def linear(
    x: torch.Tensor, weight: torch.Tensor, scales: Optional[torch.Tensor] = None, block_k: int = 0,
    swiglu: bool = False,
) -> torch.Tensor:
    """effective_x(x) [M, K] @ dequantize(weight)[N, K]^T in float32, in x's dtype; a 4-d weight is tiled
    (tile_weight; an int8 one's scales by tile_scales). swiglu: silu_and_mul of that [M, N / 2] (gate's rows of the
    weight first, then up's)."""
    if weight.dim() == 4:
        if weight.dtype == torch.int8:
            scales = scales.t()
        weight = untile_weight(weight)
    y = torch.matmul(effective_x(x, weight, block_k), dequantize(weight, scales, block_k).t()).to(x.dtype)
    return silu_and_mul(y) if swiglu else y


INT4_TILE_ROWS, INT4_GROUP = 32, 8
"""A 4-bit weight's tiles: 32 rows, read 8 columns at a time (mojo_kernels/core/linear_int4.mojo)."""
PACKED_BITS = (4, 6)
"""Bits of pack_int4's values: 4 (the int4 layers), 6 (the LM head under them)."""


_NIBBLES, _PAIRS = 0x0F0F0F0F, 0x03030303
"""Masks of a word's 4 low nibbles and 4 low bit pairs."""


def pack_int4(q: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Values q [N, K] (0..2^bits - 1) as the 4-bit linear kernel reads them: uint8 [ceil(N / 32), ceil(K / 8) *
    32 * bits], tiles of 32 rows (0 past N), each as groups of 8 columns (0 past K). A group: the 32 rows' 4-byte
    lanes, byte c of row r's lane holding column c in its low nibble and column 4 + c in its high one (128 bytes:
    the int8 quads vpdpbusd reads, once masked or shifted); with 6 bits then each 16 rows' 32 bytes of high bit
    pairs, byte j holding those of lane bytes j (bits 0-3) and 32 + j (bits 4-7), a lane byte's 4 bits those of its
    low-nibble column (0-1) and of its high-nibble column (2-3)."""
    if bits not in PACKED_BITS:
        raise ValueError(f"pack_int4: bits must be one of {PACKED_BITS}, got {bits}")
    n, k = q.shape
    tiles, groups = -(-n // INT4_TILE_ROWS), -(-k // INT4_GROUP)
    q = q.to(torch.uint8)
    if (tiles * INT4_TILE_ROWS, groups * INT4_GROUP) != (n, k):
        q = torch.nn.functional.pad(q, (0, groups * INT4_GROUP - k, 0, tiles * INT4_TILE_ROWS - n))
    # as int32 words, a lane's 4 bytes at once: columns 0-3 and 4-7 of each group of each row
    quads = q.contiguous().view(torch.int32).view(tiles, INT4_TILE_ROWS, groups, 2)
    lo, hi = quads[..., 0], quads[..., 1]
    lanes = ((lo & _NIBBLES) | ((hi & _NIBBLES) << 4)).transpose(1, 2)  # [tiles, groups, rows]
    if bits == 4:
        return lanes.contiguous().view(torch.uint8).view(tiles, -1)
    high = ((lo >> 4) & _PAIRS) | (((hi >> 4) & _PAIRS) << 2)  # a lane byte's 4 high bits
    halves = high.transpose(1, 2).reshape(tiles, groups, 2, 2, INT4_TILE_ROWS // 4)  # lane bytes 0-31, 32-63
    pairs = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).reshape(tiles, groups, -1)
    return torch.cat([lanes, pairs], dim=2).view(torch.uint8).reshape(tiles, -1)


def packed_bits(packed: torch.Tensor, k: int) -> int:
    """The bits of pack_int4's values from its bytes per tile and the columns K."""
    return packed.shape[-1] // (-(-k // INT4_GROUP) * INT4_TILE_ROWS)


def unpack_int4(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """pack_int4's q [N, K] (uint8) back from its tiles."""
    bits = packed_bits(packed, k)
    groups = packed.view(packed.shape[0], -1, INT4_TILE_ROWS * bits)
    lanes = groups[:, :, : INT4_TILE_ROWS * 4].reshape(*groups.shape[:2], INT4_TILE_ROWS, 4)
    q = torch.stack((lanes & 15, lanes >> 4), dim=3)  # [tiles, groups, rows, half, 4]
    if bits == 6:
        pairs = groups[:, :, INT4_TILE_ROWS * 4 :].reshape(*groups.shape[:2], 2, 32)
        high = torch.stack((pairs & 15, pairs >> 4), dim=3).reshape(*groups.shape[:2], INT4_TILE_ROWS, 4)
        q = q | (torch.stack((high & 3, high >> 2), dim=3) << 4)
    return q.permute(0, 2, 1, 3, 4).reshape(packed.shape[0] * INT4_TILE_ROWS, -1)[:n, :k]


def tile_int4_scales(t: torch.Tensor) -> torch.Tensor:
    """A 4-bit weight's scales (or mins) [ceil(K / block_k), N], a row per block of block_k columns, as the kernel
    reads them: [ceil(N / 32), ceil(K / block_k), 32], each tile's together (0 past row N)."""
    blocks, n = t.shape
    tiles = -(-n // INT4_TILE_ROWS)
    t = torch.nn.functional.pad(t, (0, tiles * INT4_TILE_ROWS - n))
    return t.view(blocks, tiles, INT4_TILE_ROWS).permute(1, 0, 2).contiguous()


def tile_supers(multipliers: torch.Tensor) -> torch.Tensor:
    """A 4-bit weight's multipliers of its codes, [N, S, 2] (a row's scale and min multiplier of each of S
    super-blocks), as the kernel reads them: [ceil(N / 32), S, 2, 32], each tile's together (0 past row N)."""
    n, held, _ = multipliers.shape
    tiles = -(-n // INT4_TILE_ROWS)
    t = torch.nn.functional.pad(multipliers, (0, 0, 0, 0, 0, tiles * INT4_TILE_ROWS - n))
    return t.view(tiles, INT4_TILE_ROWS, held, 2).permute(0, 2, 3, 1).contiguous()


def untile_int4_scales(t: torch.Tensor, n: int) -> torch.Tensor:
    """tile_int4_scales' t [ceil(K / block_k), N] back."""
    return t.permute(1, 0, 2).reshape(t.shape[1], -1)[:, :n]


SHARED_MIN_SHAPE = (1, 1, 1)
"""A 4-bit weight's mins as one value z, each block's min z times its scale (a zero point's -zero): the kernels read
no mins."""


def coded_scales(codes: torch.Tensor, supers: torch.Tensor, which: int) -> torch.Tensor:
    """A 4-bit weight's int8 scale (which 0) or min (1) codes, tiled [ceil(N / 32), blocks, 32], times their rows'
    float16 multipliers supers [ceil(N / 32), S, 2, 32], each over a super-block of ceil(blocks / S) blocks: float32
    [ceil(N / 32), blocks, 32] (llama.cpp's K-quants: a sub-block's scale d * sc, its min dmin * m)."""
    blocks, held = codes.shape[1], supers.shape[1]
    multipliers = supers[:, :, which].float().repeat_interleave(-(-blocks // held), dim=1)[:, :blocks]
    return codes.float() * multipliers


def int4_block_values(scales: torch.Tensor, mins: torch.Tensor,
                      supers: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A 4-bit weight's scales and mins tiled as tile_int4_scales' in float32: float16 values, or int8 codes
    (coded_scales); mins also SHARED_MIN_SHAPE, one value times each scale (exact where it is a power of two)."""
    values = scales.float() if scales.dtype != torch.int8 else coded_scales(scales, supers, 0)
    if tuple(mins.shape) == SHARED_MIN_SHAPE:
        return values, values * mins.float()
    return values, mins.float() if mins.dtype != torch.int8 else coded_scales(mins, supers, 1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, block_k: int, n: int,
                    k: int, supers: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A 4-bit weight [N, K] in float32: q * scales + mins, scales and mins per block of block_k columns and row,
    tiled by tile_int4_scales (int4_block_values)."""
    expand = lambda t: untile_int4_scales(t, n).t().repeat_interleave(block_k, dim=1)[:, :k]
    values, lows = int4_block_values(scales, mins, supers)
    return unpack_int4(packed, n, k).float() * expand(values) + expand(lows)


def linear_int4(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, block_k: int,
                n: int, amx: bool = False, supers: Optional[torch.Tensor] = None) -> torch.Tensor:
    """quantized_x(x) [M, K] @ dequantize_int4(...)[N, K]^T in float32, in x's dtype (x quantized to int8 per row and
    block of block_k columns, as for int8 weights); block_k a multiple of 8. amx: as the kernels compiled with AMX
    tiles (bindings.library.AMX_TILES) compute it: from AMX_INT4_ROWS rows of x on, x and the dequantized weight
    rounded to bfloat16 (llama.cpp's GPU backends also dequantize for large batches, past the int8 sums' per-block
    cost)."""
    w = dequantize_int4(packed, scales, mins, block_k, n, x.shape[1], supers)
    if amx and x.shape[0] >= AMX_INT4_ROWS:
        return torch.matmul(x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float().t()).to(x.dtype)
    return torch.matmul(quantized_x(x, block_k), w.t()).to(x.dtype)
