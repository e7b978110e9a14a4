# Intel AMX (Sapphire Rapids and later): 16 x 16 tiles of y computed from tiles of x and of weights loaded from
# memory, 16 x 16 x 32 bfloat16 products per TDPBF16PS (float32 sums; 16 times vdpbf16ps's work) or 16 x 16 x 64
# int8 ones per TDPBSSD (exact int32 sums). The prefill linears use them (linear.mojo): bfloat16 weights packed in
# pairs against x rounded to bfloat16, int8 weights in their stored quad panels against x quantized per block, as
# each format defines its effective x; 4-bit weights dequantized into bfloat16 pairs (linear_int4.mojo). Tiles are
# registers of the thread that configured them, and Linux hands them to a process only when it asks (arch_prctl
# ARCH_REQ_XCOMP_PERM): use_amx asks, and a worker configures its tiles for each item it runs.
from std.ffi import external_call
from std.math import ceildiv
from std.memory import stack_allocation
from std.sys import CompilationTarget, llvm_intrinsic, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions

from ..utils.types import Ptr

comptime AMX = CompilationTarget._has_feature["amx-bf16"]() and CompilationTarget._has_feature["amx-int8"]()
"""Whether the compile target has AMX (MAX compiles for the host CPU: bindings/library.py names it)."""
comptime AMX_ROWS = 16
"""Rows of a tile: of x, of y, and of weight words (bfloat16 pairs, int8 quads). Also the fewest rows of x that
the linears run on AMX tiles: below, x padded to a block costs more than it saves (a [3072, 1024] bfloat16 weight on
an Intel Xeon VM: 0.61 ms on tiles at 8 rows, 0.36 with the decode tiles; at 16 rows both 0.64; at 32 0.67 / 1.14)."""
comptime AMX_BYTES = 64
"""Bytes of a tile row: the columns of x per step (32 bfloat16, 64 int8)."""
comptime AMX_BLOCK = 2 * AMX_ROWS
"""Rows of x and of weights per block of y: 2 x 2 tiles of y, each tile of x and of weights used twice."""
comptime AMX_AHEAD = 16384
"""Bytes of weights asked for ahead of the tiles' first pass over them, as they stream from memory."""
comptime _SYS_ARCH_PRCTL = 158
comptime _ARCH_REQ_XCOMP_PERM = 0x1023
comptime _XFEATURE_XTILEDATA = 18


@always_inline
def amx_k[x_type: DType]() -> Int:
    """Columns of x per tile row."""
    return AMX_BYTES // size_of[x_type]()


@always_inline
def amx_padded[x_type: DType](k: Int) -> Int:
    """k columns of x rounded up to whole tile rows."""
    return ceildiv(k, amx_k[x_type]()) * amx_k[x_type]()


@always_inline
def amx_rows(m: Int) -> Int:
    """m rows of x rounded up to whole blocks."""
    return ceildiv(m, AMX_BLOCK) * AMX_BLOCK


def amx_granted() -> Bool:
    """Whether the target has AMX tiles and Linux hands this process their data (arch_prctl; once granted, asking
    again is a no-op; before Linux 5.16 it is refused and the callers use their AVX-512 paths)."""
    comptime if AMX:
        return external_call["syscall", Int](_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    else:
        return False


def use_amx[x_type: DType](m: Int, block_k: Int) -> Bool:
    """Whether a linear of m rows of x (x_type: bfloat16, or int8 quantized per block of block_k columns, which must
    hold whole tile rows) runs on AMX tiles: m is at least AMX_ROWS and amx_granted."""
    if m < AMX_ROWS or (x_type == DType.int8 and block_k % amx_k[x_type]() != 0):
        return False
    return amx_granted()


@always_inline
def _tile[op: StaticString, tile: Int, dtype: DType](p: Ptr[dtype], stride: Int):
    """A tile load or store: `stride` bytes between its rows."""
    llvm_intrinsic[op, NoneType](Int8(tile), p, Int64(stride))


def configure_tiles():
    """Palette 1, all 8 tiles 16 rows of 64 bytes: tiles 0-1 x, 2-3 weights, 4-7 a 32 x 32 block of y."""
    var config = stack_allocation[64, UInt8, alignment=64]()
    for i in range(64):
        config.unsafe_store(i, 0)
    config.unsafe_store(0, 1)
    for t in range(8):
        config.unsafe_store(16 + 2 * t, UInt8(AMX_BYTES))
        config.unsafe_store(48 + t, UInt8(AMX_ROWS))
    comptime if AMX:
        llvm_intrinsic["llvm.x86.ldtilecfg", NoneType](config)


def release_tiles():
    comptime if AMX:
        llvm_intrinsic["llvm.x86.tilerelease", NoneType]()


@always_inline
def amx_zero():
    """The block of y to 0."""
    comptime if AMX:
        comptime for t in range(4, 8):
            llvm_intrinsic["llvm.x86.tilezero", NoneType](Int8(t))


@always_inline
def amx_steps[x_type: DType, w_type: DType, ahead: Int = 0](
    x: Ptr[x_type], x_step: Int, x_stride: Int, x_pitch: Int, w: Ptr[DType.uint32], w_stride: Int, steps: Int,
):
    """Adds `steps` x 64 bytes of columns to the block of y: 32 rows of x against 32 columns of weight words
    (bfloat16 pairs or int8 quads as w_type says). x: the first tile of x (x_stride bytes between its rows), its
    second one x_pitch elements on, each step's tiles x_step elements on; w: the first weight word of the block's 32
    columns, w_stride words between word rows. ahead: bytes past each step's weights asked for meanwhile (weights
    streamed from memory whose word rows lie next to each other: the hardware prefetchers alone left a batch-1 step
    at 0.88x the decode tiles' speed)."""
    comptime if AMX:
        comptime op = "llvm.x86.tdpbf16ps" if w_type == DType.bfloat16 else "llvm.x86.tdpbssd"
        for s in range(steps):
            var a = x.unsafe_offset(s * x_step)
            _tile["llvm.x86.tileloadd64", 0](a, x_stride)
            _tile["llvm.x86.tileloadd64", 1](a.unsafe_offset(x_pitch), x_stride)
            var b = w.unsafe_offset(s * AMX_ROWS * w_stride)
            _prefetch_step[ahead](b, w_stride)
            _tile["llvm.x86.tileloadd64", 2](b, 4 * w_stride)
            _tile["llvm.x86.tileloadd64", 3](b.unsafe_offset(AMX_ROWS), 4 * w_stride)
            llvm_intrinsic[op, NoneType](Int8(4), Int8(0), Int8(2))
            llvm_intrinsic[op, NoneType](Int8(5), Int8(0), Int8(3))
            llvm_intrinsic[op, NoneType](Int8(6), Int8(1), Int8(2))
            llvm_intrinsic[op, NoneType](Int8(7), Int8(1), Int8(3))


@always_inline
def amx_steps_16[x_type: DType, w_type: DType, ahead: Int = 0](
    x: Ptr[x_type], x_step: Int, x_stride: Int, w: Ptr[DType.uint32], w_stride: Int, steps: Int,
):
    """amx_steps for 16 rows of x, into the top half of the block of y (tiles 4-5). Its steps alternate between two
    sets of tiles (x in 0 or 1, weights in 2-3 or 6-7): tiles are not renamed, so a step's loads into the tiles the
    last step multiplies would wait for its products (one row of x streaming bfloat16 weights from memory: 1.2x the
    time)."""
    comptime if AMX:
        for s in range(steps):
            var a, b = x.unsafe_offset(s * x_step), w.unsafe_offset(s * AMX_ROWS * w_stride)
            _prefetch_step[ahead](b, w_stride)
            if s % 2 == 0:
                _step_16[x_type, w_type, 0, 2, 3](a, x_stride, b, w_stride)
            else:
                _step_16[x_type, w_type, 1, 6, 7](a, x_stride, b, w_stride)


@always_inline
def _prefetch_step[ahead: Int](b: Ptr[DType.uint32], w_stride: Int):
    """Asks for a step's weight word rows (16 of w_stride words from b) `ahead` bytes on; nothing when ahead is 0."""
    comptime if ahead > 0:
        var next = b.unsafe_bitcast[UInt8]().unsafe_offset(ahead)
        for line in range(0, 4 * AMX_ROWS * w_stride, 64):
            prefetch[PrefetchOptions().for_read().medium_locality()](next.unsafe_offset(line))


@always_inline
def _step_16[x_type: DType, w_type: DType, xt: Int, wt0: Int, wt1: Int](
    a: Ptr[x_type], x_stride: Int, b: Ptr[DType.uint32], w_stride: Int,
):
    comptime op = "llvm.x86.tdpbf16ps" if w_type == DType.bfloat16 else "llvm.x86.tdpbssd"
    _tile["llvm.x86.tileloadd64", xt](a, x_stride)
    _tile["llvm.x86.tileloadd64", wt0](b, 4 * w_stride)
    _tile["llvm.x86.tileloadd64", wt1](b.unsafe_offset(AMX_ROWS), 4 * w_stride)
    llvm_intrinsic[op, NoneType](Int8(4), Int8(xt), Int8(wt0))
    llvm_intrinsic[op, NoneType](Int8(5), Int8(xt), Int8(wt1))


@always_inline
def _block_tiles[op: StaticString, dtype: DType, tiles: Int = 4](y: Ptr[dtype], row: Int):
    """The block of y (tiles 4-7; tiles 2: its top half, 4-5) loaded from (op: tileloadd64) or stored into
    (tilestored64) y[32, 32], `row` elements between its rows."""
    comptime if AMX:
        comptime assert size_of[dtype]() == 4, "tiles of y hold 32-bit sums"
        _tile[op, 4](y, 4 * row)
        _tile[op, 5](y.unsafe_offset(AMX_ROWS), 4 * row)
        comptime if tiles == 4:
            _tile[op, 6](y.unsafe_offset(AMX_ROWS * row), 4 * row)
            _tile[op, 7](y.unsafe_offset(AMX_ROWS * row + AMX_ROWS), 4 * row)


@always_inline
def amx_block[x_type: DType, dtype: DType](
    rows: Int, sums: Ptr[dtype], first: Bool, x: Ptr[x_type], kp: Int, w: Ptr[DType.uint32], steps: Int,
    streamed: Bool, tail: Ptr[DType.uint32], with_tail: Bool,
):
    """A block of `rows` rows of x (16 or fewer: on half the tiles) against a panel's 32 columns of weight words: the
    block's sums in sums[32, 32] (first: from 0) plus `steps` tile rows of x and of the words (PANEL words a word row:
    bfloat16 pairs or int8 quads, as x_type), then, with_tail, the next step of x against `tail`'s words, stored back.
    x: as tiles (x_tile_at, kp columns). streamed: the words come from memory (AMX_AHEAD bytes asked for ahead)."""
    if rows <= AMX_ROWS:
        _amx_block[half=True](sums, first, x, kp, w, steps, streamed, tail, with_tail)
    else:
        _amx_block[half=False](sums, first, x, kp, w, steps, streamed, tail, with_tail)


@always_inline
def _amx_block[x_type: DType, dtype: DType, //, half: Bool](
    sums: Ptr[dtype], first: Bool, x: Ptr[x_type], kp: Int, w: Ptr[DType.uint32], steps: Int, streamed: Bool,
    tail: Ptr[DType.uint32], with_tail: Bool,
):
    amx_start[half=half](sums, first)
    if streamed:
        _amx_block_steps[half, AMX_AHEAD](x, kp, w, steps)
    else:
        _amx_block_steps[half, 0](x, kp, w, steps)
    if with_tail:
        _amx_block_steps[half, 0](x.unsafe_offset(steps * AMX_ROWS * amx_k[x_type]()), kp, tail, 1)
    comptime if half:
        amx_store_16(sums)
    else:
        amx_store(sums)


@always_inline
def _amx_block_steps[x_type: DType, //, half: Bool, ahead: Int](
    x: Ptr[x_type], kp: Int, w: Ptr[DType.uint32], steps: Int
):
    comptime tile = AMX_ROWS * amx_k[x_type]()
    comptime if half:
        amx_steps_16[x_type, x_type, ahead](x, tile, AMX_BYTES, w, AMX_BLOCK, steps)
    else:
        amx_steps[x_type, x_type, ahead](x, tile, AMX_BYTES, AMX_ROWS * kp, w, AMX_BLOCK, steps)


@always_inline
def amx_store[dtype: DType](y: Ptr[dtype], row: Int = AMX_BLOCK):
    """The block of y (float32 or int32) into y[32, 32], `row` elements between its rows."""
    _block_tiles["llvm.x86.tilestored64"](y, row)


@always_inline
def amx_store_16[dtype: DType](y: Ptr[dtype]):
    """The top half of the block of y (amx_steps_16's) into y[16, 32], rows 32 apart."""
    _block_tiles["llvm.x86.tilestored64", tiles=2](y, AMX_BLOCK)


@always_inline
def amx_load[dtype: DType](y: Ptr[dtype], row: Int):
    """The block of y from y[32, 32] (amx_store's layout), to add to."""
    _block_tiles["llvm.x86.tileloadd64"](y, row)


@always_inline
def amx_start[dtype: DType, half: Bool = False](y: Ptr[dtype], first: Bool):
    """The block of y (half: its top half, amx_steps_16's) for a chunk of K: 0 for the first chunk, else the sums
    of the chunks before (float32 or int32) from y[32, 32] (amx_store's layout, rows 32 apart)."""
    if first:
        amx_zero()
    else:
        _block_tiles["llvm.x86.tileloadd64", tiles=2 if half else 4](y, AMX_BLOCK)


@always_inline
def x_tile_at[x_type: DType](r: Int, c: Int, k: Int) -> Int:
    """Where x[r, c] lies in x laid out as tiles: [rows / 16, k / amx_k, 16, amx_k], each tile 1 KiB in a row (k a
    multiple of amx_k), so that a tile load reads consecutive cache lines."""
    comptime cols = amx_k[x_type]()
    return ((r // AMX_ROWS) * (k // cols) + c // cols) * (AMX_ROWS * cols) + (r % AMX_ROWS) * cols + c % cols
