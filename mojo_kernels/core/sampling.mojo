# One token per row of logits drawn among its top_k candidates, with temperature, top-p and min-p: the sampler's
# work on a CPU in one call (python_layer/inference/sampler.py does the same with ~30 torch ops, each paying for
# caches the model's step left cold: ~4 ms a batch-1 step). Per row: the top_k (top_k.mojo), weights
# exp((x - x_max) / temperature), top-p drops the least likely while their mass stays within 1 - top_p, min-p
# drops weights below min_p (the top one's is 1), then the draw walks the kept candidates in token-id order, as
# a draw over the whole vocabulary would (sampler._draw: the first whose cumulative weight passes u x the total).
from std.math import exp

from .top_k import top_k_row
from ..utils.types import list_ptr, F32, Ptr

comptime F64 = DType.float64
comptime I64 = DType.int64


def check_sample_top_k(n: Int, top_k: Ptr[DType.int32], rows: Int) raises -> Int:
    """The largest top_k of the rows; each must be in [1, n]."""
    var largest = 1
    for r in range(rows):
        var k = Int(top_k.unsafe_load(r))
        if k < 1 or k > n:
            raise Error("sample_top_k: top_k must be in [1, ", n, "], got ", k, " in row ", r)
        largest = max(largest, k)
    return largest


def _by_token(indices: Ptr[I64], weights: Ptr[F64], count: Int):
    """Sorts the first `count` candidates by token id (insertion: count is top_k, tens)."""
    for i in range(1, count):
        var index, weight = indices.unsafe_load(i), weights.unsafe_load(i)
        var j = i
        while j > 0 and indices.unsafe_load(j - 1) > index:
            indices.unsafe_store(j, indices.unsafe_load(j - 1))
            weights.unsafe_store(j, weights.unsafe_load(j - 1))
            j -= 1
        indices.unsafe_store(j, index)
        weights.unsafe_store(j, weight)


def sample_top_k_row(
    row: Ptr[F32], n: Int, k: Int, temperature: Float32, top_p: Float32, min_p: Float32, u: Float64,
    heap: Ptr[DType.uint64], values: Ptr[F32], indices: Ptr[I64], weights: Ptr[F64],
) -> Int64:
    """The token drawn for one row; heap, values, indices and weights: room for k each."""
    top_k_row(row, n, k, heap, values, indices)
    var top = values.unsafe_load(0)
    if not (top - top == 0):  # NaN (ranked first), +inf (it wins) or every logit -inf: the top candidate
        return indices.unsafe_load(0)
    var total: Float64 = 0
    for i in range(k):
        var w = Float64(exp((values.unsafe_load(i) - top) / temperature))
        weights.unsafe_store(i, w)
        total += w
    # top-p: the least likely go while their mass stays within 1 - top_p (the top one always stays)
    var kept = k
    var dropped: Float64 = 0
    while kept > 1:
        dropped += weights.unsafe_load(kept - 1)
        if dropped > (1 - Float64(top_p)) * total:
            break
        kept -= 1
    # min-p: weights below min_p (the top one's weight is 1)
    while kept > 1 and weights.unsafe_load(kept - 1) < Float64(min_p):
        kept -= 1
    _by_token(indices, weights, kept)
    var kept_total: Float64 = 0
    for i in range(kept):
        kept_total += weights.unsafe_load(i)
    var target, cumulative = u * kept_total, Float64(0)
    for i in range(kept):
        cumulative += weights.unsafe_load(i)
        if cumulative > target:
            return indices.unsafe_load(i)
    for i in range(kept - 1, -1, -1):  # u * total rounded up to the total: the last candidate that has weight
        if weights.unsafe_load(i) > 0:
            return indices.unsafe_load(i)
    return indices.unsafe_load(kept - 1)


def sample_top_k_cpu(
    tokens: Ptr[I64], logits: Ptr[F32], rows: Int, n: Int, top_k: Ptr[DType.int32], settings: Ptr[F32],
    u: Ptr[F64], largest_k: Int,
):
    """tokens[rows] drawn from logits [rows, n]: row r among its top_k[r] best with settings[r] = (temperature,
    top_p, min_p) and the uniform u[r] in [0, 1). On the calling thread, the sampler's."""
    var heap = List[UInt64](length=largest_k, fill=0)
    var values = List[Float32](length=largest_k, fill=0)
    var indices = List[Int64](length=largest_k, fill=0)
    var weights = List[Float64](length=largest_k, fill=0)
    for r in range(rows):
        var s = settings.unsafe_offset(3 * r)
        tokens.unsafe_store(r, sample_top_k_row(
            logits.unsafe_offset(r * n), n, Int(top_k.unsafe_load(r)), s.unsafe_load(0), s.unsafe_load(1),
            s.unsafe_load(2), u.unsafe_load(r), list_ptr(heap),
            list_ptr(values),
            list_ptr(indices),
            list_ptr(weights),
        ))
