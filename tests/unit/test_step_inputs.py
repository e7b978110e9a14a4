"""The forward's inputs for a ragged batch (model/attention_metadata.py) and the decode buckets they are padded to."""

import pytest
import torch

from python_layer.model.attention_metadata import SequenceChunk, build_step_inputs
from python_layer.model.decode_graphs import bucket_sizes


def test_step_inputs_lay_out_a_ragged_batch() -> None:
    # a 3-token prompt chunk after 2 cached tokens, then one decode token at position 17 of a 2-page sequence
    step = build_step_inputs([SequenceChunk([11, 12, 13], 2, [5]), SequenceChunk([21], 17, [7, 3])], 16, "cpu")
    assert step.input_ids.tolist() == [11, 12, 13, 21] and step.positions.tolist() == [2, 3, 4, 17]
    assert step.attn.query_start.tolist() == [0, 3, 4] and step.attn.context_lens.tolist() == [5, 18]
    assert step.attn.page_table.tolist() == [[5, 0], [7, 3]]
    assert step.attn.slot_mapping.tolist() == [5 * 16 + 2, 5 * 16 + 3, 5 * 16 + 4, 3 * 16 + 1]
    assert all(t.dtype == torch.int32 for t in [step.input_ids, step.positions, *vars(step.attn).values()])


def test_a_fixed_page_table_width_pads_and_refuses_longer_sequences() -> None:
    chunks = [SequenceChunk([1], 20, [4, 9])]
    assert build_step_inputs(chunks, 16, "cpu", page_table_width=4).attn.page_table.tolist() == [[4, 9, 0, 0]]
    with pytest.raises(ValueError, match="holds 2 KV pages, more than the page table's 1"):
        build_step_inputs(chunks, 16, "cpu", page_table_width=1)


@pytest.mark.parametrize("max_batch, buckets", [(1, [1]), (2, [1, 2]), (5, [1, 2, 4, 5]),
                                                (64, [1, 2, 4, 8, 16, 32, 64]), (48, [1, 2, 4, 8, 16, 32, 48])])
def test_decode_buckets_are_powers_of_two_up_to_the_largest_batch(max_batch: int, buckets: list) -> None:
    assert bucket_sizes(max_batch) == buckets


def test_decode_buckets_need_a_batch() -> None:
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        bucket_sizes(0)
