# The k largest logits of each row: the sampler's candidates (Qwen3 samples among its top 20 of 151,936 logits).
# One pass over a row: each vector of logits is compared with the k-th largest seen so far, and the few that pass
# go into a min-heap of k keys. A key orders values as floats do, NaN above +inf (as torch.topk ranks it), and
# equal values by index, the lower first: the result is one exact answer. torch.topk sorts the whole row's
# candidates instead (~0.4 ms a row on one core, where this reads the row once).
from std.memory import bitcast

from ..utils.types import list_ptr, F32, F32_WIDTH, Ptr

comptime I64 = DType.int64


def check_top_k(n: Int, k: Int) raises:
    """The heap starts from the row's first k logits."""
    if k < 1 or k > n:
        raise Error("top_k: k must be in [1, ", n, "], got ", k)


@always_inline
def _key(value: Float32, index: Int) -> UInt64:
    """value's rank among floats (sign-magnitude made monotonic; every NaN the largest), then the lower index
    first."""
    var bits = bitcast[DType.uint32](value)
    var ordered = ~bits if bits >> 31 else bits | 0x80000000
    if not value == value:  # NaN (an ordered compare: != would be false for it)
        ordered = 0xFFFFFFFF
    return (UInt64(ordered) << 32) | UInt64(0xFFFFFFFF - index)


@always_inline
def _index(key: UInt64) -> Int:
    return 0xFFFFFFFF - Int(key & 0xFFFFFFFF)


def _sift_down(heap: Ptr[DType.uint64], k: Int, start: Int):
    """Restores the min-heap below `start`."""
    var at = start
    var key = heap.unsafe_load(at)
    while True:
        var child = 2 * at + 1
        if child >= k:
            break
        if child + 1 < k and heap.unsafe_load(child + 1) < heap.unsafe_load(child):
            child += 1
        if heap.unsafe_load(child) >= key:
            break
        heap.unsafe_store(at, heap.unsafe_load(child))
        at = child
    heap.unsafe_store(at, key)


def top_k_row(row: Ptr[F32], n: Int, k: Int, heap: Ptr[DType.uint64], values: Ptr[F32], indices: Ptr[I64]):
    """values / indices [k] = the row's k largest logits, largest first, and their indices; heap: room for k keys."""
    for i in range(k):
        heap.unsafe_store(i, _key(row.unsafe_load(i), i))
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(heap, k, i)
    # the smallest key's value: logits below it cannot enter (equal ones come later: lower keys)
    var least = row.unsafe_load(_index(heap.unsafe_load(0)))
    var i = k
    while i < n:
        var width = min(F32_WIDTH, n - i)
        var passed = False
        if width == F32_WIDTH:
            var v = row.unsafe_load[width=F32_WIDTH](i)
            passed = (v.gt(least) | ~v.eq(v)).reduce_or()
        else:
            for j in range(width):
                var v = row.unsafe_load(i + j)
                passed = passed or v > least or not v == v
        if passed:
            for j in range(width):
                var key = _key(row.unsafe_load(i + j), i + j)
                if key > heap.unsafe_load(0):
                    heap.unsafe_store(0, key)
                    _sift_down(heap, k, 0)
            least = row.unsafe_load(_index(heap.unsafe_load(0)))
        i += width
    # heap sort: the smallest key goes last
    for last in range(k - 1, -1, -1):
        var key = heap.unsafe_load(0)
        heap.unsafe_store(0, heap.unsafe_load(last))
        _sift_down(heap, last, 0)
        var index = _index(key)
        values.unsafe_store(last, row.unsafe_load(index))
        indices.unsafe_store(last, Int64(index))


def top_k_cpu(values: Ptr[F32], indices: Ptr[I64], logits: Ptr[F32], rows: Int, n: Int, k: Int):
    """values / indices [rows, k] = each row of logits [rows, n]'s k largest, largest first, and their indices.
    The rows run on the calling thread, the sampler's: a row takes tens of µs."""
    var heap = List[UInt64](length=k, fill=0)
    for r in range(rows):
        top_k_row(logits.unsafe_offset(r * n), n, k, list_ptr(heap),
                  values.unsafe_offset(r * k), indices.unsafe_offset(r * k))
