"""bindings/reference.py is the spec of the Mojo kernels: check it against independent implementations."""

import math

import pytest
import torch
from transformers import Qwen3Config as HFQwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

from bindings import reference as ref
from tests.attention_cases import attention_case


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.mark.parametrize("tokens, hidden", [(1, 64), (7, 1000), (33, 1024)])
def test_rms_norm_family_matches_transformers(tokens: int, hidden: int) -> None:
    norm = Qwen3RMSNorm(hidden, eps=1e-6)
    norm.weight.data = torch.randn(hidden)
    x, residual = torch.randn(tokens, hidden), torch.randn(tokens, hidden)
    torch.testing.assert_close(ref.rms_norm(x, norm.weight, 1e-6), norm(x))
    normed, residual_out = ref.fused_add_rms_norm(x, residual, norm.weight, 1e-6)
    torch.testing.assert_close(residual_out, x + residual)
    torch.testing.assert_close(normed, norm(x + residual))
    heads = torch.randn(tokens, 4, hidden)
    torch.testing.assert_close(ref.head_rms_norm(heads, norm.weight, 1e-6), norm(heads))


@pytest.mark.parametrize(
    "rope_scaling", [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}]
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_matches_transformers(rope_scaling, head_dim: int) -> None:
    config = HFQwen3Config(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                           rope_theta=1e6, rope_scaling=rope_scaling, max_position_embeddings=4096)
    rotary = Qwen3RotaryEmbedding(config)
    positions = torch.tensor([0, 1, 17, 500, 4095], dtype=torch.int32)
    q, k = torch.randn(5, 4, head_dim), torch.randn(5, 2, head_dim)
    cos, sin = rotary(q, positions[None].long())
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    q_ref, k_ref = ref.rope(q, k, positions, 1e6, rope_scaling)
    torch.testing.assert_close(q_ref, q_hf[0].transpose(0, 1))
    torch.testing.assert_close(k_ref, k_hf[0].transpose(0, 1))


def test_rope_rejects_unknown_scaling() -> None:
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        ref.rope(
            torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, dtype=torch.int32), 1e4, {"rope_type": "dynamic"}
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations(dtype: torch.dtype) -> None:
    x = torch.randn(9, 2 * 301).to(dtype)
    gate, up = x.float()[:, :301], x.float()[:, 301:]
    torch.testing.assert_close(ref.silu_and_mul(x), (gate * torch.sigmoid(gate) * up).to(dtype))
    torch.testing.assert_close(ref.silu(x), (x.float() * torch.sigmoid(x.float())).to(dtype))
    torch.testing.assert_close(ref.gelu(x), (0.5 * x.float() * (1 + torch.erf(x.float() / math.sqrt(2)))).to(dtype))
    torch.testing.assert_close(ref.relu(x), x.clamp(min=0))


def test_store_kv_writes_each_token_to_its_slot() -> None:
    k_cache, v_cache = torch.zeros(4, 16, 2, 8), torch.zeros(4, 16, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([5, 16 * 3 + 15, 16 * 1], dtype=torch.int32)
    ref.store_kv(k, v, k_cache, v_cache, slots)
    for t, s in enumerate(slots.tolist()):
        torch.testing.assert_close(k_cache[s // 16, s % 16], k[t])
        torch.testing.assert_close(v_cache[s // 16, s % 16], v[t])
    assert int((k_cache != 0).any(dim=(2, 3)).sum()) == 3


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 4), (4, 2), (16, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_sdpa(num_heads: int, num_kv_heads: int, dtype: torch.dtype) -> None:
    # prefill (query = context), extend after a cached prefix, decode over a long context, and a 1-token sequence
    context_lens, query_lens = [37, 50, 300, 1], [37, 9, 1, 1]
    q, kc, vc, table, lens, starts, expected = attention_case(
        context_lens, query_lens, num_heads, num_kv_heads, 64, dtype
    )
    out = ref.paged_attention(q, kc, vc, table, lens, starts, 64**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), expected, **tol)
