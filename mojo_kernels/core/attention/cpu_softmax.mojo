# The online softmax of the CPU attention (cpu.mojo, cpu_amx.mojo) over one key block's scores of a row.
from std.math import exp, iota

from ...utils.types import F32, F32_WIDTH, Ptr

comptime KEY_BLOCK = 32
"""Keys scored together before one softmax rescale."""
comptime MASKED = Float32(-1.0e30)


@always_inline
def softmax_block(s: Ptr[F32], s_off: Int, n: Int, m_at: Int, l_at: Int) -> Float32:
    """Online softmax over the scores s[s_off : s_off + n] of one row: turns them into weights exp(s - m_new),
    updates the row's running max s[m_at] and sum s[l_at], and returns the factor its accumulator must be scaled by."""
    var maxima = SIMD[F32, F32_WIDTH](MASKED)
    var i = 0
    while i + F32_WIDTH <= n:
        maxima = max(maxima, s.unsafe_load[width=F32_WIDTH](s_off + i))
        i += F32_WIDTH
    var block_max = maxima.reduce_max()
    for j in range(i, n):
        block_max = max(block_max, s.unsafe_load(s_off + j))
    var m_old = s.unsafe_load(m_at)
    var m_new = max(m_old, block_max)
    var sums = SIMD[F32, F32_WIDTH](0)
    var j = 0
    while j + F32_WIDTH <= n:
        var p = exp(s.unsafe_load[width=F32_WIDTH](s_off + j) - m_new)
        s.unsafe_store(s_off + j, p)
        sums += p
        j += F32_WIDTH
    var total = sums.reduce_add()
    while j < n:
        var p = exp(s.unsafe_load(s_off + j) - m_new)
        s.unsafe_store(s_off + j, p)
        total += p
        j += 1
    var keep = exp(m_old - m_new)
    s.unsafe_store(m_at, m_new)
    s.unsafe_store(l_at, s.unsafe_load(l_at) * keep + total)
    return keep


@always_inline
def register_weights(s: SIMD[F32, KEY_BLOCK], j0: Int, n_keys: Int, last: Int, buf: Ptr[F32], m_at: Int,
                     l_at: Int) -> Tuple[SIMD[F32, KEY_BLOCK], Float32]:
    """A staged block's softmax for one row, on its scores held in registers: its weights (0 for keys past its last
    visible one and past n_keys; all 0 if it sees none) and its accumulator's rescale factor (1 then). Nothing is
    stored but the running max and sum: no scores masked by scalar stores and read back twice. On an Intel Xeon VM,
    whose products bound these tiles, both took the same time (one prompt of 512 tokens at Qwen3-0.6B's heads:
    float32 tiles, and the bfloat16 pairs built for Zen 4)."""
    var visible = min(n_keys, last - j0 + 1)
    if visible <= 0:
        return (SIMD[F32, KEY_BLOCK](0), Float32(1))
    var masked = s
    if visible < KEY_BLOCK:
        masked = iota[F32, KEY_BLOCK]().lt(Float32(visible)).select(s, SIMD[F32, KEY_BLOCK](MASKED))
    var m_old = buf.unsafe_load(m_at)
    var m_new = max(m_old, masked.reduce_max())
    var p = exp(masked - m_new)
    var keep = exp(m_old - m_new)
    buf.unsafe_store(m_at, m_new)
    buf.unsafe_store(l_at, buf.unsafe_load(l_at) * keep + p.reduce_add())
    return (p, keep)
