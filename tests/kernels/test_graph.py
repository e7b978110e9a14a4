"""bindings.graph: the ops chained in one MAX graph (as the model uses them), with Python-float constants."""

import pytest
import torch

from bindings import reference as ref
from tests.attention_cases import attention_case

graph = pytest.importorskip("bindings.graph", reason="MAX is not installed")

from bindings import library
from max.driver import Buffer
from max.dtype import DType
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def test_attention_block_graph_matches_reference() -> None:
    torch.manual_seed(0)
    hidden, q_heads, kv_heads, head_dim = 96, 4, 2, 64
    context_lens, query_lens = [40, 21], [40, 3]  # a prefill and an extension of a cached prefix
    q_ref, k_cache, v_cache, table, lens, starts, _ = attention_case(
        context_lens, query_lens, q_heads, kv_heads, head_dim, torch.float32
    )
    tokens = sum(query_lens)
    x = torch.randn(tokens, hidden)
    w_norm, w_q, w_k = torch.rand(hidden) + 0.5, torch.rand(head_dim) + 0.5, torch.rand(head_dim) + 0.5
    w_qkv = torch.randn((q_heads + 2 * kv_heads) * head_dim, hidden) / hidden**0.5
    positions = torch.cat([torch.arange(c - n, c) for c, n in zip(context_lens, query_lens)]).to(torch.int32)
    slots = torch.cat([torch.tensor([int(table[b, p // 16]) * 16 + p % 16 for p in range(c - n, c)])
                       for b, (c, n) in enumerate(zip(context_lens, query_lens))]).to(torch.int32)

    cpu = DeviceRef.CPU()
    f32 = lambda *dims: TensorType(DType.float32, list(dims), cpu)
    i32 = lambda *dims: TensorType(DType.int32, list(dims), cpu)
    cache_t = BufferType(DType.float32, ["P", 16, kv_heads, head_dim], cpu)
    types = [
        f32("T", hidden),
        f32(hidden),
        f32(head_dim),
        f32(head_dim),
        f32((q_heads + 2 * kv_heads) * head_dim, hidden),
        cache_t,
        cache_t,
        i32("T"),
        i32("T"),
        i32("B", "M"),
        i32("B"),
        i32("B1"),
    ]
    with Graph("attention_block", input_types=types, kernel_library=library.kernel_library()) as g:
        gx, gw, gwq, gwk, gqkv, kc, vc, gpos, gslots, gtable, glens, gstarts = g.inputs
        h = graph.rms_norm(gx.tensor, gw.tensor, 1e-6)
        qkv = ops.matmul(h, ops.transpose(gqkv.tensor, 0, 1))
        q = ops.reshape(qkv[:, : q_heads * head_dim], [-1, q_heads, head_dim])
        k = ops.reshape(qkv[:, q_heads * head_dim : (q_heads + kv_heads) * head_dim], [-1, kv_heads, head_dim])
        v = ops.reshape(qkv[:, (q_heads + kv_heads) * head_dim :], [-1, kv_heads, head_dim])
        q, k = graph.rope(graph.head_rms_norm(q, gwq.tensor, 1e-6), graph.head_rms_norm(k, gwk.tensor, 1e-6),
                          gpos.tensor, 1e6, YARN)
        graph.store_kv(k, v, kc.buffer, vc.buffer, gslots.tensor)
        out = graph.paged_attention(
            q, kc.buffer, vc.buffer, gtable.tensor, glens.tensor, gstarts.tensor, head_dim**-0.5
        )
        g.output(graph.silu_and_mul(ops.reshape(out, [-1, q_heads * head_dim])))
    model = library.session("cpu").load(g)
    ours_k, ours_v = k_cache.clone(), v_cache.clone()
    args = [x, w_norm, w_q, w_k, w_qkv, ours_k, ours_v, positions, slots, table, lens, starts]
    result = torch.from_dlpack(model.execute(*[Buffer.from_dlpack(a) for a in args])[0])

    h = ref.rms_norm(x, w_norm, 1e-6)
    q, k, v = (h @ w_qkv.T).split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = ref.head_rms_norm(q.reshape(tokens, q_heads, head_dim), w_q, 1e-6)
    k = ref.head_rms_norm(k.reshape(tokens, kv_heads, head_dim), w_k, 1e-6)
    q, k = ref.rope(q, k, positions, 1e6, YARN)
    ref.store_kv(k, v.reshape(tokens, kv_heads, head_dim), k_cache, v_cache, slots)
    out = ref.paged_attention(q, k_cache, v_cache, table, lens, starts, head_dim**-0.5)
    expected = ref.silu_and_mul(out.reshape(tokens, q_heads * head_dim))

    torch.testing.assert_close(ours_k, k_cache, rtol=1e-5, atol=1e-5)  # the caches were updated in place
    torch.testing.assert_close(ours_v, v_cache, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result, expected, rtol=1e-4, atol=1e-5)
