"""The kernel test cases, shared by the CPU tests (tests/kernels) and the GPU tests (tests/gpu):
each runs a bindings.ops function and its bindings.reference twin on the same fresh random inputs."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from bindings import library, reference as ref
from tests.attention_cases import attention_case


def seed_case(case: object) -> None:
    """Seeds torch for a case: its own draws, fresh each run (tests/conftest.py picks MILI_TEST_SEED and pytest's
    header prints it; the same value draws the same inputs again)."""
    torch.manual_seed((int(os.environ.get("MILI_TEST_SEED", "0")) + zlib.crc32(str(case).encode())) % 2**31)


DTYPES = [torch.float32, torch.bfloat16]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}

NORM_SHAPES = [(1, 64), (7, 1000), (33, 1024), (3000, 1000), (5, 1001)]  # 1001: rows a GPU reads one element a load
HEAD_NORM_SHAPES = [(1, 16, 128), (5, 8, 64), (2048, 8, 128)]
ROPE_CASES = [(1, 16, 8, 128, None), (37, 4, 2, 64, None), (2048, 16, 8, 128, None), (300, 8, 1, 128, YARN)]
QK_CASES = [(1, 16, 8, 128, None), (37, 4, 2, 64, None), (600, 16, 8, 128, None), (9, 8, 1, 128, YARN)]
ACT_SHAPES = [(0, 64), (1, 3072), (5, 301), (2048, 3072)]
ELEMENTWISE_SIZES = [0, 1, 1001, 3 * 4096 + 7, 5 * 16384 + 3]  # the last: 6 CPU chunks, run in parallel
# (context lengths, query lengths) per batch: prefill, extend after a cached prefix, decode over long contexts,
# crossing page boundaries, sequences of different lengths together. On CPU they reach both block strategies
# (direct for few rows per KV head, staged for many) and the split-keys decode.
ATTENTION_BATCHES = [
    ([1], [1]),
    ([37], [37]),
    ([200, 45], [60, 45]),
    ([4096, 17, 1000, 33], [1, 1, 1, 1]),
    ([37, 50, 300, 1], [37, 9, 1, 1]),
    ([3000], [1]),  # one long decode: its keys are split over the CPU workers and merged
    ([450], [1]),  # 2 workers: 4 splits of 4 key blocks, the last one short, claimed by the workers in turn
    ([70, 20], [3, 2]),  # a few queries each (speculative decoding): 1-6 rows per KV head, read directly, masked
    ([620], [600]),  # a long prefill after 20 cached tokens: 64-query tiles on up to 2 cores, a partial last one
]
QKV_ATTENTION_BATCHES = [ATTENTION_BATCHES[i] for i in (0, 2, 3, 4, 5, 7)] + [([100, 2, 700], [1, 1, 1])]
"""Decode batches (the GPU's one-kernel path, long contexts split over blocks), prefill, extension and a mixed batch."""
QKV_ATTENTION_HEADS = [(16, 8, 128), (8, 2, 64), (8, 8, 16), (10, 2, 128)]
"""16: the narrowest row RoPE pairs across bfloat16 lanes; 10 over 2: Qwen3-14B's 5 query heads a KV head."""
# (M, K, N): decode (M <= 32; bfloat16 with vdpbf16ps: <= 64) and prefill kernels (AVX2 int8: panels from 16 rows,
# 17 and 20 here); K past a vector width and a 128-column scale block; N past the decode tile (4 rows) and the prefill
# panel (2 vector widths)
LINEAR_SHAPES = [(1, 37, 5), (1, 1000, 130), (7, 200, 133), (17, 301, 70), (20, 2048, 64), (33, 128, 33), (64, 301, 70),
                 (65, 301, 70), (130, 1024, 96)]
WEIGHT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8]
TILED_LINEAR_SHAPES = [
    (1, 64, 4),
    (1, 1024, 132),
    (7, 192, 36),
    (20, 2048, 64),
    (33, 128, 8),
    (64, 320, 68),
    (65, 320, 68),
    (130, 1024, 96),
]
"""(M, K, N) with N a multiple of 4 and K of 64 (bfloat16 tiles): decode and panel paths, serial and parallel,
partial panels."""
F32_TILED_LINEAR_SHAPES = [(1, 37, 32), (1, 1024, 160), (7, 200, 64), (12, 301, 96), (13, 128, 32), (20, 2048, 64),
                           (64, 301, 96), (130, 1024, 96)]
"""(M, K, N) with N a multiple of 32 (float32 panels, read in place at every M): every row count of the register
tile and a partial last one, one pass over a panel and several, serial and parallel, odd K."""
I8_TILED_LINEAR_SHAPES = [(1, 148, 32), (1, 1024, 160), (7, 192, 64), (20, 2048, 96), (33, 132, 32), (64, 320, 64),
                          (130, 1024, 96)]
"""(M, K, N) with N a multiple of 32 and K of 4 (int8 tiles, read as quad panels): serial and parallel, partial last
blocks of 128 columns."""
I8_TILED_BLOCKS = [((130, 1092, 160), 128), ((100, 1088, 64), 1088), ((72, 576, 32), 192), ((40, 352, 96), 32)]
"""((M, K, N), block_k) of int8 tiles past 64 rows (AMX tiles where the CPU has them, K in chunks of 512 columns):
a last step of 4 columns, a work item of fewer tiles than the others, one block over every chunk (W8A8's per-channel
scales), blocks across chunks' ends; each with a last block of rows of 16 or fewer."""
QUAD_ROW_SHAPES = [(2, 132, 96), (3, 68, 32), (4, 132, 64), (5, 200, 64), (6, 132, 32), (11, 260, 96), (15, 200, 96)]
"""(M, K, N) for 4-bit weights and int8 tiles: with LINEAR_SHAPES' and I8_TILED_LINEAR_SHAPES' M (the passes'
rows, linear.row_passes), every row count of the quad-panel register tiles (12 rows of x with AVX-512)."""
ATTENTION_HEADS = [(8, 8, 64), (16, 8, 128), (8, 2, 128), (16, 2, 128), (4, 2, 44), (10, 2, 128)]
"""GQA ratios 1, 2, 4, 8 and 5 (Qwen3-14B); 44: vector tails."""
EIGHT_BIT_KV = [torch.int8, torch.float8_e4m3fn]
"""CPU only."""


def eight_bit_kv_case(case) -> bool:
    """Whether a kernel_cases() param runs over 8-bit caches (its id names them)."""
    return any(f"-kv_{str(kv).split('.')[-1]}-" in case.id for kv in EIGHT_BIT_KV)

KV_DTYPES = {torch.float32: [torch.float32, torch.bfloat16, *EIGHT_BIT_KV],
             torch.bfloat16: [torch.bfloat16, *EIGHT_BIT_KV]}
"""The caches' dtypes under each activation dtype (ops.KV_DTYPES)."""


def tolerance(dtype: torch.dtype) -> dict:
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)


def assert_caches_match(ours: tuple, theirs: tuple, dtype: torch.dtype, source: torch.dtype, **override) -> None:
    """Caches written from k and v that the kernel and the reference computed in source dtype each in its own way: to
    dtype's tolerance (or override's), or in 8-bit caches at most one step apart (int8 values, adjacent FP8 codes) or
    within override's atol (near zero a source step spans several FP8 codes).
    An int8 row's scale follows its largest |k|, which two orders of summing can round one source step apart; the
    row's values then may differ by as much more as that rescaling moves 127."""
    if dtype not in EIGHT_BIT_KV:
        return assert_matches(ours, theirs, dtype, **override)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        a, b = a.cpu(), b.cpu()
        allowed = 1
        if dtype == torch.int8:
            head_dim = ref.kv_head_dim(a)
            scales = [t[..., head_dim:].contiguous().view(torch.float32) for t in (a, b)]
            torch.testing.assert_close(*scales, rtol=max(1e-5, torch.finfo(source).eps), atol=0)
            rescaled = (scales[0] - scales[1]).abs() / torch.minimum(*scales).clamp_min(torch.finfo(torch.float32).tiny)
            allowed = 1 + (127 * rescaled).ceil().int()
            a, b = a[..., :head_dim], b[..., :head_dim]
            values = a.float() * scales[0], b.float() * scales[1]
            codes = a.int(), b.int()
        else:  # an FP8 code's magnitude bits are ordered as its values: signed, they count steps across zero too
            values = a.float(), b.float()
            bits = a.view(torch.uint8).int(), b.view(torch.uint8).int()
            codes = tuple(torch.where(t >= 128, 128 - t, t) for t in bits)
        excess = ((codes[0] - codes[1]).abs() > allowed) & ((values[0] - values[1]).abs() > override.get("atol", 0))
        assert not excess.any(), f"{int(excess.sum())} values more than the allowed steps and atol apart"


def assert_matches(ours, theirs, dtype: torch.dtype, **override) -> None:
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), **{**tolerance(dtype), **override})


def run_norms(ops, device: str, dtype: torch.dtype, shape: tuple) -> None:
    x = torch.randn(shape, device=device).to(dtype)
    residual = torch.randn(shape, device=device).to(dtype)
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    assert_matches(ops.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), dtype)
    assert_matches(ops.fused_add_rms_norm(x, residual, w, 1e-5), ref.fused_add_rms_norm(x, residual, w, 1e-5), dtype)


def run_head_norm(ops, device: str, dtype: torch.dtype, shape: tuple) -> None:
    x = torch.randn(shape, device=device).to(dtype)
    w = (torch.rand(shape[-1], device=device) + 0.5).to(dtype)
    assert_matches(ops.head_rms_norm(x, w, 1e-6), ref.head_rms_norm(x, w, 1e-6), dtype)


def run_rope(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    tokens, q_heads, kv_heads, head_dim, scaling = case
    q = torch.randn(tokens, q_heads, head_dim, device=device).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    positions = torch.randint(0, 40960, (tokens,), dtype=torch.int32, device=device)
    # float32 angles of positions up to 40960 are only good to about 5e-4
    override = dict(rtol=5e-4, atol=5e-4) if dtype == torch.float32 else {}
    assert_matches(ops.rope(q, k, positions, 1e6, scaling), ref.rope(q, k, positions, 1e6, scaling), dtype, **override)


def run_activations(ops, device: str, dtype: torch.dtype, shape: tuple) -> None:
    x = (3 * torch.randn(shape[0], 2 * shape[1], device=device)).to(dtype)
    for shaped in (x, x.view(1, *x.shape), x[0] if len(x) else x):  # [T, 2I], any leading dims, a single row
        assert_matches(ops.silu_and_mul(shaped), ref.silu_and_mul(shaped), dtype)


def run_elementwise(ops, device: str, dtype: torch.dtype, size: int) -> None:
    x = (4 * torch.randn(size, device=device)).to(dtype)
    for name in ("silu", "gelu", "relu"):
        for shaped in (x, x.view(1, size), x.view(size, 1, 1)):  # any rank: 2-d goes to the kernel as is
            assert_matches(getattr(ops, name)(shaped), getattr(ref, name)(shaped), dtype)


def run_special_values(ops, device: str, dtype: torch.dtype, _: object) -> None:
    """NaN, infinities, signed zeros and huge values come out as torch's; relu bit for bit (but for the sign of a
    zero), and in bfloat16 on every one of the 65,536 bit patterns (its kernel works on the bits)."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([nan, -nan, inf, -inf, 0.0, -0.0, 1e30, -1e30, 100.0, -100.0, 0.5, -0.5], device=device).to(dtype)
    for name in ("silu", "gelu"):
        finite_or_negative = x[x != inf] if name == "gelu" else x  # torch's gelu(inf) is NaN, ours inf
        assert_matches(
            getattr(ops, name)(finite_or_negative), getattr(ref, name)(finite_or_negative), dtype, equal_nan=True
        )
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    if dtype == torch.bfloat16:
        x = torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16).view(dtype)
    ours, theirs, x = ops.relu(x).cpu(), ref.relu(x).cpu(), x.cpu()
    # the sign of a zero result is torch's choice: its CPU relu keeps -0.0, its CUDA relu returns +0.0
    unsigned_zero = lambda t: torch.where(t == 0, torch.zeros_like(t), t).view(bits)
    same = (unsigned_zero(ours) == unsigned_zero(theirs)) | (ours.isnan() & theirs.isnan())
    assert same.all(), (
        f"relu differs from torch at {x[~same][:8].tolist()}: "
        f"{ours[~same][:8].tolist()} vs {theirs[~same][:8].tolist()}"
    )


def run_store_kv(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    tokens, kv_dtype = case
    pages, page_size, kv_heads, head_dim = tokens // 16 + 3, 16, 8, 128
    caches = [ref.to_kv_cache(torch.randn(pages, page_size, kv_heads, head_dim, device=device), kv_dtype)
              for _ in range(2)]
    k = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, device=device).to(dtype)
    slots = torch.randperm(pages * page_size, device=device)[:tokens].to(torch.int32)
    slots[tokens // 2] = -1  # a padding token: not stored
    ours = [c.clone() for c in caches]
    ops.store_kv(k, v, *ours, slots)
    ref.store_kv(k, v, *caches, slots)
    bits = lambda t: t.view(torch.uint8)  # torch.equal takes no float8
    assert torch.equal(bits(ours[0]), bits(caches[0])) and torch.equal(bits(ours[1]), bits(caches[1]))


def rotation_steps(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, head_dim: int) -> dict:
    """The atol of q, k and v normed and rotated from a bfloat16 qkv ({} for float32): bfloat16 normed values are
    rounded before the rotation; summing squares in another order can round one to the neighbouring value, and the
    rotation carries that step (up to 1/32) into a result that may be near zero: two steps of the largest normed
    value."""
    if qkv.dtype != torch.bfloat16:
        return {}
    normed = ref.head_rms_norm(qkv.view(qkv.shape[0], -1, head_dim), torch.maximum(q_norm, k_norm), 1e-6)
    return dict(atol=2 * torch.finfo(qkv.dtype).eps * 2 ** normed.float().abs().max().log2().floor().item())


def run_qk_norm_rope_store(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    tokens, q_heads, kv_heads, head_dim, scaling, kv_dtype = case
    pages, page_size = tokens // 16 + 3, 16
    caches = [ref.to_kv_cache(torch.randn(pages, page_size, kv_heads, head_dim, device=device), kv_dtype)
              for _ in range(2)]
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q_norm, k_norm = (
        (torch.rand(head_dim, device=device) + 0.5).to(dtype),
        (torch.rand(head_dim, device=device) + 0.5).to(dtype),
    )
    positions = torch.randint(0, 4096, (tokens,), dtype=torch.int32, device=device)
    slots = torch.randperm(pages * page_size, device=device)[:tokens].to(torch.int32)
    slots[tokens // 2] = -1  # a padding token: its k and v are not stored
    inv_freq, scale = ref.rope_inv_freq(head_dim, 1e6, scaling)
    ours = [c.clone() for c in caches]
    q = ops.qk_norm_rope_store(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, scale, *ours, slots)
    expected = ref.qk_norm_rope_store(qkv, q_norm, k_norm, 1e-6, positions, inv_freq, scale, *caches, slots)
    steps = rotation_steps(qkv, q_norm, k_norm, head_dim)
    assert_matches(q, expected, dtype, **steps)
    assert_caches_match(tuple(ours), tuple(caches), kv_dtype, dtype, **steps)  # k, v rounded to the caches' dtype


def run_attention(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    (context_lens, query_lens), heads, kv_dtype = case
    q_heads, kv_heads, head_dim = heads
    # q drawn in the caches' dtype too: the reference is exact for it
    q, kc, vc, table, lens, starts, expected = attention_case(
        context_lens, query_lens, q_heads, kv_heads, head_dim, kv_dtype
    )
    args = [t.to(device) for t in (q.to(dtype), kc, vc, table, lens, starts)]
    ours = ops.paged_attention(*args, head_dim**-0.5)
    assert ours.dtype == dtype and ours.shape == q.shape
    tol = tolerance(dtype)
    if kv_dtype == torch.bfloat16 and device == "cpu":
        # prefill tiles and decode rows may weigh the values with softmax weights rounded to bfloat16 (vdpbf16ps), in
        # either activation dtype: that moves an output by at most 2^-9 of the largest |v|, and the weights' float32
        # sum that divides it by as much again (~0.018 for randn values: more than bfloat16's default 0.01)
        tol["atol"] = max(tol["atol"], 2**-8 * ref.from_kv_cache(vc, head_dim).abs().max().item())
    torch.testing.assert_close(ours.float().cpu(), expected, **tol)


def run_qkv_attention(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    """The new tokens' q, k and v from a random qkv (the positions and slots their sequences give them), over a
    cache that holds each sequence's earlier keys."""
    (context_lens, query_lens), (q_heads, kv_heads, head_dim), kv_dtype = case
    _, kc, vc, table, lens, starts, _ = attention_case(context_lens, query_lens, q_heads, kv_heads, head_dim, kv_dtype)
    page_size = kc.shape[1]
    positions = torch.cat([torch.arange(c - q, c) for c, q in zip(context_lens, query_lens)]).to(torch.int32)
    sequence = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))
    slots = (table[sequence, positions // page_size] * page_size + positions % page_size).to(torch.int32)
    qkv = torch.randn(len(positions), (q_heads + 2 * kv_heads) * head_dim).to(dtype)
    q_norm, k_norm = (torch.rand(head_dim) + 0.5).to(dtype), (torch.rand(head_dim) + 0.5).to(dtype)
    inv_freq, rope_scale = ref.rope_inv_freq(head_dim, 1e6, None)
    args = [t.to(device) for t in (qkv, q_norm, k_norm)] + [1e-6, positions.to(device), inv_freq, rope_scale]
    caches = [kc.to(device), vc.to(device)]
    metadata = [t.to(device) for t in (slots, table, lens, starts)] + [head_dim**-0.5]
    expected_caches = [c.clone() for c in caches]
    expected = ref.qkv_attention(*args, *expected_caches, *metadata)
    ours = ops.qkv_attention(*args, *caches, *metadata)
    # over bfloat16 caches, to bfloat16's tolerance: the CPU kernel is exact there only for q in the caches' dtype
    # (run_attention draws q so), and this q is float32
    assert_matches(ours, expected, kv_dtype if kv_dtype not in EIGHT_BIT_KV else torch.bfloat16)
    # the new tokens' k and v, stored
    assert_caches_match(tuple(caches), tuple(expected_caches), kv_dtype, dtype,
                        **rotation_steps(qkv, q_norm, k_norm, head_dim))


def linear_weight(n: int, k: int, weight_dtype: torch.dtype, device: str, block_k: int = 128) -> tuple:
    """(weight, scales, block_k) of a random weight in the format: FP8 and int8 from uniformly random bit
    patterns (every FP8 normal, subnormal and zero; no NaN)."""
    if weight_dtype == torch.float8_e4m3fn:
        bits = torch.randint(0, 256, (n, k), dtype=torch.int32, device=device)
        bits = torch.where((bits & 0x7F) == 0x7F, bits - 1, bits)  # 0x7F / 0xFF are NaN
        weight = bits.to(torch.uint8).view(torch.float8_e4m3fn)
    elif weight_dtype == torch.int8:
        weight = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
    else:
        return torch.randn(n, k, device=device).to(weight_dtype), None, 0
    return weight, torch.rand(n, -(-k // block_k), device=device) * 0.01 + 1e-3, block_k


def _assert_linear_matches(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> None:
    # float32 sums of K products in another order: relative to the output's size, not each element's
    atol = (1e-5 if dtype == torch.float32 else 1e-2) * theirs.float().abs().max().item()
    assert_matches(ours, theirs, dtype, atol=atol)


INT8_BLOCKS = [30, 36, 32]
"""int8 block widths other than 128 (prefill with VNNI: quads of columns need a multiple of 4, else float32 panels)."""


def run_linear(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    (m, k, n), weight_dtype, *block = case
    x = torch.randn(m, k, device=device).to(dtype)
    weight, scales, block_k = linear_weight(n, k, weight_dtype, device, *block)
    _assert_linear_matches(ops.linear(x, weight, scales, block_k), ref.linear(x, weight, scales, block_k), dtype)


def run_linear_tiled(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    (m, k, n), weight_dtype, *block = case
    x = torch.randn(m, k, device=device).to(dtype)
    weight, scales, block_k = linear_weight(n, k, weight_dtype, device, *block)
    tiles = ref.tile_weight(weight)
    assert torch.equal(ref.untile_weight(tiles), weight)
    tiled_scales = ref.tile_scales(scales) if weight.dtype == torch.int8 else scales
    assert torch.equal(ref.linear(x, tiles, tiled_scales, block_k), ref.linear(x, weight, scales, block_k))
    _assert_linear_matches(ops.linear(x, tiles, tiled_scales, block_k), ref.linear(x, weight, scales, block_k), dtype)


def run_linear_pair_panels(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    """A bfloat16 weight as pair panels (K a multiple of 32: on AMX tiles where the CPU has them; else dot products
    of pairs); AVX-512 only, refused with a clear error elsewhere."""
    m, k, n = case
    x = torch.randn(m, k, device=device).to(dtype)
    weight = torch.randn(n, k, device=device).to(torch.bfloat16)
    panels = ref.tile_weight(weight, pairs=True)
    assert torch.equal(ref.untile_weight(panels), weight)
    if library.eager_cpu_module().float32_lanes() < 16:
        with pytest.raises(ValueError, match="bfloat16 pair panels need AVX-512"):
            ops.linear(x, panels)
        return
    _assert_linear_matches(ops.linear(x, panels), ref.linear(x, weight), dtype)


SWIGLU_SHAPES = [(1, 64, 64), (7, 96, 128), (16, 128, 64), (64, 320, 192), (33, 1024, 64), (130, 608, 320),
                 (5, 64, 96), (70, 128, 40)]
"""(M, K, N) of a [gate | up] weight of N rows: N / 2 a multiple of 32 (pair panels combine gate's and up's sums as
they store them; on AMX tiles from 64 rows in chunks of the columns) and not (the product computed first), serial and
parallel, a partial block of rows."""
SWIGLU_LAYOUTS = [(torch.bfloat16, "pairs"), (torch.bfloat16, "tiles"), (torch.float32, "tiles"), (torch.int8, "tiles"),
                  (torch.bfloat16, "dense"), (torch.float8_e4m3fn, "dense")]


def run_linear_swiglu(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    """linear(..., swiglu=True), silu_and_mul of the product in the op itself where the weight is tiled: exactly the
    two ops in turn, and the reference's; pair panels (AVX-512 only) where N / 2 is a multiple of 32 fuse them."""
    (m, k, n), weight_dtype, layout = case
    x = torch.randn(m, k, device=device).to(dtype)
    weight, scales, block_k = linear_weight(n, k, weight_dtype, device, 64)
    if layout != "dense":
        weight = ref.tile_weight(weight, pairs=layout == "pairs")
        scales = ref.tile_scales(scales) if weight_dtype == torch.int8 else scales
    if layout == "pairs" and library.eager_cpu_module().float32_lanes() < 16:
        with pytest.raises(ValueError, match="bfloat16 pair panels need AVX-512"):
            ops.linear(x, weight, swiglu=True)
        return
    ours = ops.linear(x, weight, scales, block_k, swiglu=True)
    assert ours.shape == (m, n // 2)
    assert torch.equal(ours, ops.silu_and_mul(ops.linear(x, weight, scales, block_k)))
    _assert_linear_matches(ours, ref.linear(x, weight, scales, block_k, swiglu=True), dtype)


PAIR_PANEL_SHAPES = [(1, 64, 32), (7, 70, 96), (16, 128, 64), (33, 96, 32), (64, 302, 64), (5, 1024, 32),
                     (40, 800, 160), (70, 800, 160), (81, 608, 96)]
"""(M, K, N): one row to three blocks of 32, a last block of up to 16 rows or more; K whole AMX tile rows or not (70,
302: the dot products), in one chunk of K on the tiles (up to 64 rows) or several with a partial last (70 and 81
rows); a work item's panels all there or not (160)."""
INT4_BLOCKS = [64, 128, 256, 40, 32, 16]
INT4_SHARED_MIN_BLOCKS = [(4, 32), (4, 64), (6, 32), (6, 16)]
"""(bits, block_k) with one min per scale: Q4_0's, GPTQ's symmetric ones as MILI repacks them, Q5_0's, Q6_K's."""
INT4_CODED = [((4, 32), "codes"), ((6, 16), "codes-shared_min"), ((6, 32), "codes"), ((4, 64), "codes-shared_min")]
"""(bits, block_k) with int8 codes times multipliers: Q4_K's (codes of mins too), Q6_K's (one min per scale), Q5_K's
and another block."""


def int4_scales(n: int, k: int, block_k: int, bits: int, form: str) -> tuple:
    """Random tiled scales, mins and multipliers (None unless codes) of a 4-bit [N, K] weight: float16 scales and mins
    of either sign (form "own"), or one min per scale, a zero point's ("shared_min"), or int8 codes of both
    ("codes"; "codes-shared_min": of scales, one min per scale) times multipliers of super-blocks of up to 256
    columns; 0 in the last tile's rows past N (as tile_int4_scales pads them)."""
    blocks = -(-k // block_k)
    scales, mins = (torch.randn(blocks, n) * 0.01).half(), (torch.randn(blocks, n) * 0.05).half()
    supers = None
    if form.startswith("codes"):
        held = -(-blocks // max(1, 256 // block_k))
        scales, mins = torch.randint(-128, 128, (blocks, n), dtype=torch.int8), torch.randint(0, 64, (blocks, n),
                                                                                               dtype=torch.int8)
        supers = ref.tile_supers(torch.stack([torch.rand(n, held) * 1e-4, -torch.rand(n, held) * 1e-3], -1).half())
    tiled_scales, tiled_mins = ref.tile_int4_scales(scales), ref.tile_int4_scales(mins)
    assert torch.equal(ref.untile_int4_scales(tiled_scales, n), scales)
    if form.endswith("shared_min"):
        tiled_mins = torch.full(ref.SHARED_MIN_SHAPE, -(2.0 ** (bits - 1)), dtype=torch.float16)
    return tiled_scales, tiled_mins, supers


def run_linear_int4(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    """Random 4- or 6-bit values (pack_int4's and tile_int4_scales' round trips checked), scales and mins in `form`
    (int4_scales)."""
    (m, k, n), block_k, bits, form = case
    q = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8)
    packed = ref.pack_int4(q, bits)
    assert torch.equal(ref.unpack_int4(packed, n, k), q)
    scales, mins, supers = int4_scales(n, k, block_k, bits, form)
    x = torch.randn(m, k, device=device).to(dtype)
    _assert_linear_matches(ops.linear_int4(x, packed, scales, mins, block_k, n, supers),
                           ref.linear_int4(x, packed, scales, mins, block_k, n, library.AMX_TILES, supers), dtype)


MOE_SHAPES = [(1, 64, 40, 7, 3), (5, 130, 72, 9, 8), (70, 200, 136, 6, 2)]
"""(tokens, hidden, experts' intermediate size, experts, top_k): decode and prefill blocks, experts no token chose."""
MOE_TILED_SHAPES = [(3, 128, 64, 5, 2), (40, 128, 64, 4, 3)]
MOE_FORMATS = ["float32", "bfloat16", "fp8", "int8", "int4", "int4-gguf", "int4-shared-min", "int4-codes",
               "bfloat16-tiled", "int8-tiled"]
MOE_INT4 = {"int4": ((4, 64, "own"), (4, 64, "own")), "int4-gguf": ((4, 32, "own"), (6, 16, "own")),
            "int4-shared-min": ((4, 32, "shared_min"), (6, 16, "shared_min")),
            "int4-codes": ((4, 32, "codes"), (6, 16, "codes-shared_min"))}
"""4-bit experts' (bits, block_k, form of their scales: int4_scales) of gate_up and of down: MILI's, a Q4_K gate_up
with a Q6_K down in float16 scales and mins, one min per scale (Q4_0's gate_up, Q6_K's down), and as the K-quants
hold them (codes)."""


def _expert_weight(n: int, k: int, fmt: str, down: bool) -> tuple[tuple, callable, torch.Tensor]:
    """One expert's [N, K] weight (gate_up's, or down's) in fmt: (its tensors as the kernel takes them, its linear in
    the reference, its values in float32)."""
    if fmt in MOE_INT4:
        bits, block, form = MOE_INT4[fmt][down]
        packed = ref.pack_int4(torch.randint(0, 2**bits, (n, k), dtype=torch.uint8), bits)
        scales, mins, supers = int4_scales(n, k, block, bits, form)
        if supers is None:  # float16 scales, positive
            scales = ref.tile_int4_scales((torch.rand(-(-k // block), n) * 0.32 / 2**bits).half())
        return ((packed, scales, mins, supers),
                lambda x: ref.linear_int4(x, packed, scales, mins, block, n, library.AMX_TILES, supers),
                ref.dequantize_int4(packed, scales, mins, block, n, k, supers))
    dtype = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}.get(fmt.split("-")[0]) or getattr(torch, fmt.split("-")[0])
    weight, scales, block_k = linear_weight(n, k, dtype, "cpu", 64 if fmt == "int8-tiled" else 32)
    if weight.is_floating_point() and weight.dtype != torch.float8_e4m3fn:
        weight = weight * k**-0.5  # unscaled, silu(gate) * up grows as K
    tiled = fmt.endswith("tiled")
    tensors = (ref.tile_weight(weight) if tiled else weight,) + (
        (ref.tile_scales(scales) if tiled else scales,) if block_k else ())
    return tensors, lambda x: ref.linear(x, weight, scales, block_k), ref.dequantize(weight, scales, block_k)


def run_moe(ops, device: str, dtype: torch.dtype, case: tuple) -> None:
    """Random experts in one format, distinct router logits (exact in bfloat16: no ties between experts)."""
    (t, h, inter, e_count, top_k), fmt, normalize = case
    experts = [(_expert_weight(2 * inter, h, fmt, False), _expert_weight(h, inter, fmt, True)) for _ in range(e_count)]
    stack = lambda which: tuple(None if ts[0] is None else torch.stack(ts) for ts in zip(*(ex[which][0]
                                                                                           for ex in experts)))
    x = torch.randn(t, h, device=device).to(dtype)
    logits = (torch.stack([torch.randperm(e_count) for _ in range(t)]).float() * 0.75).to(dtype)
    blocks = [b for _, b, _ in MOE_INT4[fmt]] if fmt in MOE_INT4 else [64 if fmt == "int8-tiled" else 32] * 2
    ours = ops.moe(x, logits, top_k, normalize, inter, stack(0), stack(1), *blocks)
    down_inputs = []

    def down(v: torch.Tensor, e: int) -> torch.Tensor:
        down_inputs.append(v.float().abs().max().item())
        return experts[e][1][1](v)

    theirs = ref.moe(x, logits, top_k, normalize, lambda v, e: experts[e][0][1](v), down)
    if fmt in ("float32", "fp8"):
        _assert_linear_matches(ours, theirs, dtype)
    else:
        # down's input is rounded to bfloat16 or quantized per block from gate_up's sums, which the kernel adds in
        # another order: a value on a rounding boundary may land a step (at most its block's largest / 127) apart
        # there, moving its token's outputs by that step times a down weight. Rare: a few tokens, not most, may show it.
        tight = 3e-3 * theirs.float().abs().max().item()
        step = max(down_inputs) / 127 * max(ex[1][2].abs().max().item() for ex in experts)
        assert_matches(ours, theirs, dtype, atol=max(tight, 2 * step))
        off = (ours.float() - theirs.float()).abs() > tight + tolerance(dtype)["rtol"] * theirs.float().abs()
        tokens_off = int(off.any(dim=1).sum())
        assert tokens_off <= min(2, (t - 1) // 2), f"{tokens_off} of {t} tokens' outputs off by more than {tight:.3g}"


def kernel_cases() -> list:
    """(runner, case) pairs for every op and path, as pytest params. Each runner and dtype is an xdist group, so
    that `pytest -n N --dist loadgroup` compiles each op's graph in one worker only."""
    cases = []
    for dtype in DTYPES:
        d = str(dtype).split(".")[-1]
        cases += [pytest.param(run_norms, dtype, s, id=f"norms-{d}-{s}") for s in NORM_SHAPES]
        cases += [pytest.param(run_head_norm, dtype, s, id=f"head_norm-{d}-{s}") for s in HEAD_NORM_SHAPES]
        cases += [
            pytest.param(run_rope, dtype, c, id=f"rope-{d}-{c[:4]}-{'yarn' if c[4] else 'plain'}") for c in ROPE_CASES
        ]
        cases += [pytest.param(run_activations, dtype, s, id=f"silu_and_mul-{d}-{s}") for s in ACT_SHAPES]
        cases += [pytest.param(run_elementwise, dtype, n, id=f"elementwise-{d}-{n}") for n in ELEMENTWISE_SIZES]
        cases.append(pytest.param(run_special_values, dtype, None, id=f"special_values-{d}"))
        for kv in KV_DTYPES[dtype]:
            kv_id = "" if kv == dtype else "-kv_" + str(kv).split(".")[-1]
            cases += [pytest.param(run_store_kv, dtype, (n, kv), id=f"store_kv-{d}{kv_id}-{n}") for n in (1, 2000)]
            cases += [
                pytest.param(
                    run_qk_norm_rope_store,
                    dtype,
                    (*c, kv),
                    id=f"qk_norm_rope_store-{d}{kv_id}-{c[:4]}-{'yarn' if c[4] else 'plain'}",
                )
                for c in QK_CASES
            ]
            cases += [pytest.param(run_attention, dtype, (b, h, kv), id=f"attention-{d}{kv_id}-{b[0]}x{b[1]}-{h}")
                      for b in ATTENTION_BATCHES for h in ATTENTION_HEADS]
            cases += [
                pytest.param(run_qkv_attention, dtype, (b, h, kv), id=f"qkv_attention-{d}{kv_id}-{b[0]}x{b[1]}-{h}")
                for b in QKV_ATTENTION_BATCHES
                for h in QKV_ATTENTION_HEADS
            ]
        cases += [pytest.param(run_linear, dtype, (s, w), id=f"linear-{d}-{str(w).split('.')[-1]}-{s}")
                  for w in WEIGHT_DTYPES for s in LINEAR_SHAPES]
        cases += [pytest.param(run_linear, dtype, ((40, 301, 70), torch.int8, b), id=f"linear-{d}-int8-blocks_of_{b}")
                  for b in INT8_BLOCKS]
        cases += [pytest.param(run_linear_tiled, dtype, (s, w), id=f"linear_tiled-{d}-{str(w).split('.')[-1]}-{s}")
                  for w in ref.TILED_DTYPES
                  for s in {torch.int8: I8_TILED_LINEAR_SHAPES + QUAD_ROW_SHAPES,
                            torch.float32: F32_TILED_LINEAR_SHAPES}.get(w, TILED_LINEAR_SHAPES)]
        cases += [pytest.param(run_linear_tiled, dtype, (s, torch.int8, b),
                               id=f"linear_tiled-{d}-int8-{s}-blocks_of_{b}") for s, b in I8_TILED_BLOCKS]
        cases += [pytest.param(run_linear_pair_panels, dtype, s, id=f"linear_pair_panels-{d}-{s}")
                  for s in PAIR_PANEL_SHAPES]
        cases += [pytest.param(run_linear_swiglu, dtype, (s, w, layout),
                               id=f"linear_swiglu-{d}-{str(w).split('.')[-1]}-{layout}-{s}")
                  for w, layout in SWIGLU_LAYOUTS for s in SWIGLU_SHAPES
                  if layout == "dense" or ref.can_tile(torch.empty(s[2], s[1], dtype=w), pairs=layout == "pairs")]
        cases += [pytest.param(run_linear_int4, dtype, (s, b, bits, "own"),
                               id=f"linear_int4-{d}-{bits}bits-blocks_of_{b}-{s}")
                  for bits in ref.PACKED_BITS for b in INT4_BLOCKS for s in LINEAR_SHAPES + QUAD_ROW_SHAPES
                  if b != 256 or s[1] > 128]
        cases += [pytest.param(run_linear_int4, dtype, (s, b, bits, "shared_min"),
                               id=f"linear_int4-{d}-{bits}bits-blocks_of_{b}-shared_min-{s}")
                  for bits, b in INT4_SHARED_MIN_BLOCKS for s in LINEAR_SHAPES]
        cases += [pytest.param(run_linear_int4, dtype, (s, b, bits, form),
                               id=f"linear_int4-{d}-{bits}bits-blocks_of_{b}-{form}-{s}")
                  for (bits, b), form in INT4_CODED for s in LINEAR_SHAPES]
        cases += [pytest.param(run_moe, dtype, (s, f, i % 2 == 0), id=f"moe-{d}-{f}-{s}")
                  for f in MOE_FORMATS for i, s in enumerate(MOE_TILED_SHAPES if f.endswith("tiled") else MOE_SHAPES)]
    group = lambda runner, dtype: pytest.mark.xdist_group(f"{runner.__name__}-{dtype}")
    return [pytest.param(*p.values, id=p.id, marks=group(*p.values[:2])) for p in cases]
