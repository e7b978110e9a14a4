"""The token embedding table, held in the least memory that gives its rows exactly.

A step only gathers a few rows of the table, so it needs not be in the activation dtype: a 16-bit checkpoint's
table stays 16-bit under float32 activations (widening is exact), and a GGUF file's quantized one stays in its
blocks (QuantizedEmbedding). Qwen3-30B-A3B's table is 1.24 GB in float32, 0.39 GB as Q4_K blocks."""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch


class QuantizedEmbedding(NamedTuple):
    """A table [V, K] as int8 values times scales per row and block of `block` columns, plus mins where the format
    has them: row[j] = values[j] * scales[j // block] (+ mins[j // block]), in float32, as gguf dequantizes."""

    values: torch.Tensor
    scales: torch.Tensor
    mins: Optional[torch.Tensor]
    block: int

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows of ids [T]: [T, K]."""
        ids = ids.long()
        blocks = self.scales.shape[1]
        rows = self.values[ids].float().view(-1, blocks, self.block) * self.scales[ids][..., None]
        if self.mins is not None:
            rows = rows + self.mins[ids][..., None]
        return rows.view(ids.shape[0], -1)


EmbeddingTable = Union[torch.Tensor, QuantizedEmbedding]


def exact_table(table: EmbeddingTable, dtype: torch.dtype) -> EmbeddingTable:
    """table as the model keeps it for rows in dtype: as it is where they widen from it exactly, else in dtype."""
    if isinstance(table, QuantizedEmbedding):
        return table
    if dtype == torch.float32 and table.dtype in (torch.float16, torch.bfloat16):
        return table
    return table.to(dtype)


def gather_rows(table: EmbeddingTable, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The rows of ids [T] in dtype: [T, K]."""
    if isinstance(table, QuantizedEmbedding):
        return table.rows(ids).to(dtype)
    return table[ids.long()].to(dtype)
