# Intel AMX (Sapphire Rapids and later): 16 x 16 float32 tiles of y computed by TDPBF16PS, 16 x 16 x 32 bfloat16
# products per instruction (16 times vdpbf16ps's work), from tiles of x and weights loaded from memory. The prefill
# linears on bfloat16 weights use it (linear.mojo): x rounded to bfloat16 as the format defines it, the weights
# packed in pairs as for vdpbf16ps. Tiles are registers of the thread that configured them, and Linux hands them to
# a process only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM): amx_ready asks, and a worker configures its tiles
# for each item it runs.
from std.ffi import external_call
from std.memory import stack_allocation
from std.sys import CompilationTarget, llvm_intrinsic

from ..utils.types import Ptr, F32

comptime AMX_BF16 = CompilationTarget._has_feature["amx-bf16"]()
"""Whether the compile target has AMX-BF16 (MAX compiles for the host CPU: bindings/library.py names it)."""
comptime AMX_ROWS = 16
"""Rows of a tile: of x, of y, and of weight pairs (32 columns of x). Also the fewest rows of x that the linears
run on AMX tiles: below, x padded to a block costs more than it saves (a [3072, 1024] bfloat16 weight on an Intel
Xeon VM: 0.61 ms on tiles at 8 rows, 0.36 with the decode tiles; at 16 rows both 0.64; at 32 0.67 / 1.14)."""
comptime AMX_K = 32
"""bfloat16 columns of x per tile row (64 bytes)."""
comptime AMX_BLOCK = 2 * AMX_ROWS
"""Rows of x and of weights per block of y: 2 x 2 tiles of y, each A and B tile used twice."""
comptime _SYS_ARCH_PRCTL = 158
comptime _ARCH_REQ_XCOMP_PERM = 0x1023
comptime _XFEATURE_XTILEDATA = 18


def amx_ready() -> Bool:
    """Asks Linux for this process's AMX tile data (once granted, asking again is a no-op): False on a kernel that
    does not grant it (before Linux 5.16), where the callers use their AVX-512 paths."""
    return external_call["syscall", Int](_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


@always_inline
def _tile[op: StaticString, tile: Int, dtype: DType](p: Ptr[dtype], stride: Int):
    """A tile load or store: `stride` bytes between its rows."""
    llvm_intrinsic[op, NoneType](Int8(tile), p, Int64(stride))


def configure_tiles():
    """Palette 1, all 8 tiles 16 rows of 64 bytes (x: 32 bfloat16, weights: 16 pairs, y: 16 float32)."""
    var config = stack_allocation[64, UInt8, alignment=64]()
    for i in range(64):
        config.unsafe_store(i, 0)
    config.unsafe_store(0, 1)
    for t in range(8):
        config.unsafe_store(16 + 2 * t, UInt8(4 * AMX_ROWS))
        config.unsafe_store(48 + t, UInt8(AMX_ROWS))
    comptime if AMX_BF16:
        llvm_intrinsic["llvm.x86.ldtilecfg", NoneType](config)


def release_tiles():
    comptime if AMX_BF16:
        llvm_intrinsic["llvm.x86.tilerelease", NoneType]()


@always_inline
def amx_bf16_block(y: Ptr[F32], xb: Ptr[DType.bfloat16], pairs: Ptr[DType.uint32], pair_stride: Int, k: Int):
    """y[32, 32] (rows 32 floats apart) = 32 rows of x [32, k] @ the weights' pairs [k / 2, pair_stride] (their first
    32 columns), the tiles configured. xb: x's rows as tiles (x_tile_at's layout), from the block's first row."""
    comptime if AMX_BF16:
        comptime for c in range(4, 8):
            llvm_intrinsic["llvm.x86.tilezero", NoneType](Int8(c))
        for k0 in range(0, k, AMX_K):
            var a = xb.unsafe_offset(k0 * AMX_ROWS)
            _tile["llvm.x86.tileloadd64", 0](a, 2 * AMX_K)
            _tile["llvm.x86.tileloadd64", 1](a.unsafe_offset(AMX_ROWS * k), 2 * AMX_K)
            var b = pairs.unsafe_offset(k0 // 2 * pair_stride)
            _tile["llvm.x86.tileloadd64", 2](b, 4 * pair_stride)
            _tile["llvm.x86.tileloadd64", 3](b.unsafe_offset(AMX_ROWS), 4 * pair_stride)
            llvm_intrinsic["llvm.x86.tdpbf16ps", NoneType](Int8(4), Int8(0), Int8(2))
            llvm_intrinsic["llvm.x86.tdpbf16ps", NoneType](Int8(5), Int8(0), Int8(3))
            llvm_intrinsic["llvm.x86.tdpbf16ps", NoneType](Int8(6), Int8(1), Int8(2))
            llvm_intrinsic["llvm.x86.tdpbf16ps", NoneType](Int8(7), Int8(1), Int8(3))
        _tile["llvm.x86.tilestored64", 4](y, 4 * AMX_BLOCK)
        _tile["llvm.x86.tilestored64", 5](y.unsafe_offset(AMX_ROWS), 4 * AMX_BLOCK)
        _tile["llvm.x86.tilestored64", 6](y.unsafe_offset(AMX_ROWS * AMX_BLOCK), 4 * AMX_BLOCK)
        _tile["llvm.x86.tilestored64", 7](y.unsafe_offset(AMX_ROWS * AMX_BLOCK + AMX_ROWS), 4 * AMX_BLOCK)


@always_inline
def x_tile_at(r: Int, c: Int, k: Int) -> Int:
    """Where x[r, c] lies in x laid out as A tiles: [rows / 16, k / AMX_K, 16, AMX_K], each tile 1 KiB in a row (k a
    multiple of AMX_K), so that a tile load reads consecutive cache lines."""
    return ((r // AMX_ROWS) * (k // AMX_K) + c // AMX_K) * (AMX_ROWS * AMX_K) + (r % AMX_ROWS) * AMX_K + c % AMX_K
