"""Where the tokens of one step sit in the paged KV cache, as the flat int32 tensors the forward takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Sequence

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    """B sequences, T new tokens in all (all int32)."""

    query_start: torch.Tensor  # [B + 1] offsets of each sequence's new tokens in the flat batch
    context_lens: torch.Tensor  # [B] tokens in the cache after this step (cached prefix + new tokens)
    page_table: torch.Tensor  # [B, max_pages] page ids of each sequence
    slot_mapping: torch.Tensor  # [T] cache slot (page * page_size + offset) of each new token


class SequenceChunk(NamedTuple):
    """The new tokens of one sequence in a step: `token_ids` at positions start.. of a sequence that owns
    `page_ids` (covering at least start + len(token_ids) tokens)."""

    token_ids: Sequence[int]
    start: int
    page_ids: Sequence[int]


class StepInputs(NamedTuple):
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata


def int32_tensor(values: Sequence | np.ndarray, device: torch.device) -> torch.Tensor:
    """values (numbers, equal-length lists of them, or an int32 array) as an int32 tensor on device. numpy builds
    it: torch.tensor from a list costs several times more, and a step makes seven of these."""
    tensor = torch.from_numpy(np.asarray(values, dtype=np.int32))
    return tensor if device.type == "cpu" else tensor.to(device)


def build_step_inputs(chunks: Sequence[SequenceChunk], page_size: int, device: torch.device | str,
                      page_table_width: int = 0) -> StepInputs:
    """The forward's inputs for a ragged batch of sequence chunks: the one place that lays them out. The page
    table is as wide as the longest sequence's pages, or page_table_width when given (fixed-shape inputs)."""
    input_ids: List[int] = []
    positions: List[int] = []
    slots: List[int] = []
    query_start, context_lens = [0], []
    for token_ids, start, pages in chunks:
        end = start + len(token_ids)
        input_ids += token_ids
        positions += range(start, end)
        slots += [pages[p // page_size] * page_size + p % page_size for p in range(start, end)]
        query_start.append(query_start[-1] + len(token_ids))
        context_lens.append(end)
    max_pages = max(len(pages) for _, _, pages in chunks)
    if page_table_width:
        if max_pages > page_table_width:
            raise ValueError(f"a sequence holds {max_pages} KV pages, more than the page table's {page_table_width}")
        max_pages = page_table_width
    page_table = np.zeros((len(chunks), max_pages), dtype=np.int32)  # filled row by row: wide tables are mostly 0
    for row, (_, _, pages) in zip(page_table, chunks):
        row[: len(pages)] = pages
    device = torch.device(device)
    i32 = lambda values: int32_tensor(values, device)
    attn = AttentionMetadata(i32(query_start), i32(context_lens), i32(page_table), i32(slots))
    return StepInputs(i32(input_ids), i32(positions), attn)
