# The GPU attention kernels' split of a sequence's keys (split_keys), run on a CPU
# (tests/kernels/test_gpu_kernel_helpers.py): on random contexts, split counts and row multiples, the splits cover
# keys 0 ..< n in order, each key once; split 0 is never empty; every split but the last non-empty one holds at
# least the fewest keys, a multiple of the block's rows; and the empty ones (a short context in a wide page table)
# all come last, as begin = end = n.
from std.random import random_ui64, seed

from mojo_kernels.core.attention.common import split_keys


def check_splits() raises -> Int:
    seed(11)
    var checked = 0
    for trial in range(20000):
        var n = Int(random_ui64(1, 9000)) if trial % 4 else Int(random_ui64(1, 70))
        var splits = Int(random_ui64(1, 64))
        var fewest = 32 if trial % 3 == 0 else (64 if trial % 3 == 1 else 512)
        var multiple = 1 << Int(random_ui64(0, 7))
        var next_key = 0
        var seen_empty = False
        for s in range(splits):
            var begin, end = split_keys(n, splits, s, fewest, multiple)
            var where = String("trial ", trial, " (n ", n, ", ", splits, " splits, fewest ", fewest, ", multiple ",
                               multiple, ") split ", s, ": ", begin, " ..< ", end)
            if begin == end:
                if s == 0 or begin != n:
                    raise Error(where, ": an empty split must be a later one, at n")
                seen_empty = True
                continue
            if seen_empty or begin != next_key or end < begin:
                raise Error(where, ": not the next keys in order")
            if end < n and ((end - begin) < fewest or (end - begin) % multiple != 0):
                raise Error(where, ": a split before the last holds too few keys or not a multiple")
            next_key = end
            checked += 1
        if next_key != n:
            raise Error(String("trial ", trial, ": the splits end at key ", next_key, " of ", n))
    return checked


def main() raises:
    print("ok:", check_splits(), "splits checked")
