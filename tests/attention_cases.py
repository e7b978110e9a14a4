"""Random paged-attention problems with a dense reference (scaled_dot_product_attention per sequence)."""

import math

import torch
import torch.nn.functional as F

from bindings import reference as ref


def attention_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, dtype, page_size=16):
    """Random K/V for each sequence written into shuffled pages of caches of `dtype`, plus the per-sequence dense
    reference. q is drawn in dtype too (under 8-bit caches, float32 values that bfloat16 holds exactly)."""
    pages_per_seq = [math.ceil(c / page_size) for c in context_lens]
    num_pages = sum(pages_per_seq) + 3
    perm = torch.randperm(num_pages).tolist()
    k_cache = ref.to_kv_cache(torch.randn(num_pages, page_size, num_kv_heads, head_dim), dtype)
    v_cache = ref.to_kv_cache(torch.randn(num_pages, page_size, num_kv_heads, head_dim), dtype)
    page_table = torch.zeros(len(context_lens), max(pages_per_seq), dtype=torch.int32)
    q = torch.randn(sum(query_lens), num_heads, head_dim)
    q = q.to(dtype) if dtype in (torch.float32, torch.bfloat16) else q.to(torch.bfloat16).float()
    expected = torch.empty(q.shape, dtype=torch.float32)
    used, q_off = 0, 0
    for b, (ctx, ql) in enumerate(zip(context_lens, query_lens)):
        pages = perm[used : used + pages_per_seq[b]]
        used += pages_per_seq[b]
        page_table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        k = ref.from_kv_cache(k_cache[pages].flatten(0, 1)[:ctx], head_dim)
        v = ref.from_kv_cache(v_cache[pages].flatten(0, 1)[:ctx], head_dim)
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - ql, ctx)[:, None]
        out = F.scaled_dot_product_attention(
            q[q_off : q_off + ql].float().transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=mask, scale=head_dim**-0.5, enable_gqa=True)
        expected[q_off : q_off + ql] = out.transpose(0, 1)
        q_off += ql
    query_start = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    return q, k_cache, v_cache, page_table, torch.tensor(context_lens, dtype=torch.int32), query_start, expected
