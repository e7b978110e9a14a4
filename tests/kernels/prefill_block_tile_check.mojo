# The GPU prefill kernel's block -> (sequence, row tile) map, run on a CPU (tests/kernels/test_gpu_kernel_helpers.py):
# on random ragged batches (prefills alone, decodes with a few prefills, empty sequences), every row tile of every
# sequence gets exactly one of a KV head's prefill_blocks, a sequence's last row tile first; the other blocks get
# the row tile past their sequence's last, which the kernel returns on.
from std.math import ceildiv
from std.random import random_ui64, seed

from mojo_kernels.core.attention.gpu_prefill import BLOCK_ROWS, prefill_block_tile, prefill_blocks


def block_tile(mut starts: List[Int32], group: Int, i: Int) -> Tuple[Int, Int]:
    var p = starts.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
    var batch = len(starts) - 1
    if group == 1:
        return prefill_block_tile[1](p, batch, i)
    if group == 2:
        return prefill_block_tile[2](p, batch, i)
    if group == 4:
        return prefill_block_tile[4](p, batch, i)
    return prefill_block_tile[8](p, batch, i)


def main() raises:
    seed(7)
    var blocks_checked = 0
    for trial in range(3000):
        var batch = Int(random_ui64(1, 40))
        var group = 1 << Int(random_ui64(0, 3))
        var kind = Int(random_ui64(0, 2))
        var starts = List[Int32](length=batch + 1, fill=0)
        for b in range(batch):
            var n = Int(random_ui64(1, 300))
            if kind == 1:  # decodes and a few prefills
                n = 1 if random_ui64(0, 9) > 0 else Int(random_ui64(1, 2100))
            elif kind == 2:  # empty sequences too
                n = Int(random_ui64(0, 70))
            starts[b + 1] = starts[b] + Int32(n)
        var blocks = prefill_blocks(Int(starts[batch]), batch, group)
        var seen = List[Int](length=batch, fill=0)
        var last = List[Int](length=batch, fill=Int.MAX)
        for i in range(blocks):
            var b, tile = block_tile(starts, group, i)
            if b < 0 or b >= batch:
                raise Error(String("trial ", trial, ": block ", i, " -> sequence ", b))
            var tiles = ceildiv(Int(starts[b + 1] - starts[b]) * group, BLOCK_ROWS)
            if tile == tiles:
                continue
            if tile < 0 or tile > tiles or tile >= last[b]:
                raise Error(String("trial ", trial, ": block ", i, " -> sequence ", b, ", row tile ", tile))
            last[b] = tile
            seen[b] += 1
        for b in range(batch):
            var tiles = ceildiv(Int(starts[b + 1] - starts[b]) * group, BLOCK_ROWS)
            if seen[b] != tiles:
                raise Error(String("trial ", trial, ": sequence ", b, " got ", seen[b], " blocks for ", tiles, " row tiles"))
        blocks_checked += blocks
    print("ok:", blocks_checked, "blocks")
