"""ops.top_k (mojo_kernels/core/top_k.mojo) against reference.top_k: the same values and indices, ties in index
order, NaN and infinities ranked as torch ranks them."""

import pytest
import torch

from bindings import ops, reference


def _same(logits: torch.Tensor, k: int) -> None:
    values, indices = ops.top_k(logits, k)
    want_values, want_indices = reference.top_k(logits, k)
    assert torch.equal(indices, want_indices)
    assert torch.equal(values.nan_to_num(7.0), want_values.nan_to_num(7.0))


@pytest.mark.parametrize("rows, n, k", [(1, 151936, 20), (3, 1000, 1), (5, 37, 37), (2, 101, 17), (4, 50, 3),
                                        (7, 151936, 1024), (2, 9, 8)])
def test_top_k_matches_the_reference(rows: int, n: int, k: int) -> None:
    _same(torch.randn(rows, n) * 3, k)


def test_top_k_ties_nan_and_infinities() -> None:
    logits = torch.randint(-3, 3, (6, 333)).float()
    logits[0, 5] = float("nan")
    logits[1] = float("-inf")
    logits[2, 100] = float("inf")
    logits[3, 7:9] = float("nan")
    logits[4, -1] = -float("nan")  # its sign bit set
    for k in (1, 40, 333):
        _same(logits, k)


def test_top_k_of_rising_rows_enters_every_value() -> None:
    _same(torch.arange(5000).float()[None].repeat(2, 1), 50)


def test_top_k_reads_strided_rows() -> None:
    logits = torch.randn(4, 2000)
    _same(logits[:, ::2], 10)


@pytest.mark.parametrize("k", [0, -1, 334])
def test_top_k_rejects_k_outside_the_row(k: int) -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, 333\]"):
        ops.top_k(torch.randn(2, 333), k)


def test_top_k_takes_float32_rows_on_a_cpu() -> None:
    with pytest.raises(ValueError, match="2-d float32 on a CPU"):
        ops.top_k(torch.randn(2, 50).bfloat16(), 3)
