"""ops.sample_top_k (mojo_kernels/core/sampling.mojo) against reference.sample_top_k: the same token for every
row, whatever its top_k, temperature, top-p and min-p."""

import pytest
import torch

from bindings import ops, reference


def _rows(rows: int, n: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, n, generator=g) * 3
    top_k = torch.randint(1, min(n, 64) + 1, (rows,), generator=g, dtype=torch.int32)
    settings = torch.stack([torch.rand(rows, generator=g) * 1.5 + 0.05,  # temperature
                            torch.where(torch.rand(rows, generator=g) < 0.3, 1.0, torch.rand(rows, generator=g)),
                            torch.where(torch.rand(rows, generator=g) < 0.5, 0.0, torch.rand(rows, generator=g) / 4)],
                           dim=1).float()
    return logits, top_k, settings, torch.rand(rows, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("rows, n", [(200, 151936), (300, 50), (64, 7)])
def test_sample_top_k_matches_the_reference(rows: int, n: int) -> None:
    logits, top_k, settings, u = _rows(rows, n, seed=n)
    got, want = ops.sample_top_k(logits, top_k, settings, u), reference.sample_top_k(logits, top_k, settings, u)
    assert (got == want).float().mean() >= 0.99  # float32 exp may round one ulp apart: u on a boundary
    assert all(int(t) in reference.top_k(logits[r : r + 1], int(top_k[r]))[1][0].tolist() for r, t in enumerate(got))


def test_sample_top_k_draws_follow_the_kept_weights() -> None:
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -5.0]]).repeat(4000, 1)
    u = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    top_k = torch.full((4000,), 5, dtype=torch.int32)
    settings = torch.tensor([[0.8, 1.0, 0.0]]).repeat(4000, 1)
    freq = torch.bincount(ops.sample_top_k(logits, top_k, settings, u), minlength=8).float() / 4000
    want = (logits[0] / 0.8).masked_fill(torch.arange(8) >= 5, float("-inf")).softmax(-1)
    torch.testing.assert_close(freq, want, atol=0.03, rtol=0)
    top_p = torch.tensor([[1.0, 0.7, 0.0]]).repeat(4000, 1)  # the nucleus of 0.7: tokens 0-2
    assert set(ops.sample_top_k(logits, top_k, top_p, u).tolist()) == {0, 1, 2}
    min_p = torch.tensor([[1.0, 1.0, 0.3]]).repeat(4000, 1)  # weights exp(x - 2) >= 0.3: tokens 0-2
    assert set(ops.sample_top_k(logits, top_k, min_p, u).tolist()) == {0, 1, 2}


def test_sample_top_k_on_nan_and_infinite_rows() -> None:
    logits = torch.randn(3, 100)
    logits[0, 42] = float("nan")
    logits[1, 7] = float("inf")
    logits[2] = float("-inf")
    tokens = ops.sample_top_k(logits, torch.full((3,), 5, dtype=torch.int32), torch.tensor([[1.0, 0.9, 0.1]] * 3),
                              torch.full((3,), 0.5, dtype=torch.float64))
    assert tokens.tolist() == [42, 7, 0]


def test_sample_top_k_checks_its_arguments() -> None:
    logits, top_k, settings, u = _rows(2, 50, seed=0)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 50\], got 51 in row 1"):
        ops.sample_top_k(logits, torch.tensor([3, 51], dtype=torch.int32), settings, u)
    with pytest.raises(ValueError, match="float64 u"):
        ops.sample_top_k(logits, top_k, settings, u.float())
    with pytest.raises(ValueError, match=r"settings \[rows, 3\]"):
        ops.sample_top_k(logits, top_k, settings[:, :2].contiguous(), u)
