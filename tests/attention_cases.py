"""Random paged-attention problems with a dense reference (scaled_dot_product_attention per sequence)."""

import math

import torch
import torch.nn.functional as F


def attention_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, dtype, page_size=16):
    """Random K/V for each sequence written into shuffled pages, plus the per-sequence dense reference."""
    pages_per_seq = [math.ceil(c / page_size) for c in context_lens]
    num_pages = sum(pages_per_seq) + 3
    perm = torch.randperm(num_pages).tolist()
    k_cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim).to(dtype)
    page_table = torch.zeros(len(context_lens), max(pages_per_seq), dtype=torch.int32)
    q = torch.randn(sum(query_lens), num_heads, head_dim).to(dtype)
    expected = torch.empty(q.shape, dtype=torch.float32)
    used, q_off = 0, 0
    for b, (ctx, ql) in enumerate(zip(context_lens, query_lens)):
        pages = perm[used : used + pages_per_seq[b]]
        used += pages_per_seq[b]
        page_table[b, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:ctx].float()
        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:ctx].float()
        mask = torch.arange(ctx)[None, :] <= torch.arange(ctx - ql, ctx)[:, None]
        out = F.scaled_dot_product_attention(
            q[q_off : q_off + ql].float().transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=mask, scale=head_dim**-0.5, enable_gqa=True)
        expected[q_off : q_off + ql] = out.transpose(0, 1)
        q_off += ql
    query_start = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    return q, k_cache, v_cache, page_table, torch.tensor(context_lens, dtype=torch.int32), query_start, expected
