# The GPU prefill kernel's block -> row tiles map, run on a CPU (tests/kernels/test_gpu_kernel_helpers.py): on
# random ragged batches (prefills alone, decodes with a few prefills, empty sequences), with one and with two row
# tiles a block, every row tile of every sequence goes to exactly one of a KV head's prefill_blocks, a block's
# first tile is its sequence's heaviest left (the last row tiles first) and with two its second is that tile's
# mirror; 1 to 8 query heads a KV head. Where the masked key tiles start, that two blocks' shared memory fits an
# SM, prefill_tiles_per_block's choice and the choice forced by GpuOptions.prefill_pairs.
from std.math import ceildiv
from std.random import random_ui64, seed

from mojo_kernels.core.attention.gpu_prefill import (
    BLOCK_KEYS, BLOCK_ROWS, prefill_block_tile, prefill_blocks, prefill_diagonal_start, prefill_row_tile,
    prefill_shared_bytes, prefill_tiles_per_block,
)


def check_blocks() raises -> Int:
    seed(7)
    var blocks_checked = 0
    for trial in range(3000):
        var batch = Int(random_ui64(1, 40))
        var group = Int(random_ui64(1, 8))
        var kind = Int(random_ui64(0, 2))
        var per_block = Int(random_ui64(1, 2))
        var starts = List[Int32](length=batch + 1, fill=0)
        for b in range(batch):
            var n = Int(random_ui64(1, 300))
            if kind == 1:  # decodes and a few prefills
                n = 1 if random_ui64(0, 9) > 0 else Int(random_ui64(1, 2100))
            elif kind == 2:  # empty sequences too
                n = Int(random_ui64(0, 70))
            starts[b + 1] = starts[b] + Int32(n)
        var blocks = prefill_blocks(Int(starts[batch]), batch, group, per_block)
        var seen = List[List[Bool]]()
        var heaviest_left = List[Int]()
        for b in range(batch):
            var tiles = ceildiv(Int(starts[b + 1] - starts[b]) * group, BLOCK_ROWS)
            seen.append(List[Bool](length=tiles, fill=False))
            heaviest_left.append(tiles - 1)
        for i in range(blocks):
            var b, j, tiles = prefill_block_tile(
                starts.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin](), batch, i, per_block, group
            )
            if b < 0 or b >= batch or tiles != len(seen[b]):
                raise Error(String("trial ", trial, ": block ", i, " -> sequence ", b, " of ", tiles, " row tiles"))
            var first = -1
            for k in range(per_block):
                var tile = prefill_row_tile(j, k, tiles, per_block)
                if tile < 0:
                    break
                var expected = heaviest_left[b] if k == 0 else tiles - 1 - first
                if tile != expected or seen[b][tile]:
                    raise Error(String("trial ", trial, ": block ", i, " (sequence ", b, ", ", j, "th) tile ", k,
                                       " is ", tile, ", expected ", expected, " not taken before"))
                seen[b][tile] = True
                if k == 0:
                    first = tile
                    heaviest_left[b] -= 1
        for b in range(batch):
            for t in range(len(seen[b])):
                if not seen[b][t]:
                    raise Error(String("trial ", trial, ": sequence ", b, "'s row tile ", t, " got no block"))
        blocks_checked += blocks
    return blocks_checked


def check_choice() raises:
    if prefill_tiles_per_block(256, 132, -1) != 2 or prefill_tiles_per_block(128, 132, -1) != 1:
        raise Error("two row tiles a block only where there are more row tiles than SMs")
    if prefill_tiles_per_block(256, 132, 0) != 1 or prefill_tiles_per_block(8, 132, 1) != 2:
        raise Error("prefill_pairs (0: one row tile a block, 1: two) not followed")


def check_diagonal() raises:
    """The key tiles before prefill_diagonal_start hold no key after the block's first row's position; the one
    at it holds one (else it could have run unmasked too)."""
    for first in range(5000):
        var start = prefill_diagonal_start(first)
        if start % BLOCK_KEYS != 0 or start - 1 > first or start + BLOCK_KEYS - 1 <= first:
            raise Error(String("first row at ", first, ": the masked key tiles start at ", start))


def check_shared_memory() raises:
    """Two blocks' shared memory fits an H100's / H200's SM (228 KB, 1 KB of it reserved a block), as the launch's
    two blocks an SM (its registers) and prefill_tiles_per_block's count of them assume."""
    comptime SM_SHARED = 228 * 1024
    var need = 2 * (prefill_shared_bytes[128]() + 1024)
    if need > SM_SHARED:
        raise Error(String("two prefill blocks take ", need, " bytes of shared memory, an SM has ", SM_SHARED))


def main() raises:
    var blocks = check_blocks()
    check_diagonal()
    check_shared_memory()
    check_choice()
    print("ok:", blocks, "blocks")
