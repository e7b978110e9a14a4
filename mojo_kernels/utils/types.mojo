# Shared helpers of MILI's kernels: pointer aliases, the CPU vector width, argument checks.
from std.collections import Array
from std.memory import bitcast
from std.sys import CompilationTarget, llvm_intrinsic, simd_width_of

comptime F32 = DType.float32
comptime F16 = DType.float16
comptime F32_WIDTH = simd_width_of[DType.float32]()
"""SIMD lanes of float32 on the host CPU (8 with AVX2, 16 with AVX-512)."""
comptime BF16_DOT = CompilationTarget._has_feature["avx512bf16"]() and not CompilationTarget._has_feature["avx512fp16"]()
"""AVX512_BF16's vdpbf16ps: 32 bfloat16 products summed in pairs into 16 float32 lanes per instruction. On AMD's
CPUs (Zen 4, Zen 5). Not on Intel's, which have AVX512_FP16 beside it and run vdpbf16ps on one port: there the float32
FMAs on widened weights are faster (Qwen3-0.6B's shape on an Intel Xeon VM with AMX, decode at batch 8: 99-102
against 88 tok/s, batch 1: 20-21 against 19; on one without AMX tiles, prefill of 512 tokens 2.9-3.1 against
4.2-4.3 s, batch 8 56-57 against 52-53 tok/s)."""

comptime BF16_CONVERT = CompilationTarget._has_feature["avx512bf16"]() and F32_WIDTH == 16
"""vcvtneps2bf16: 16 float32 rounded to bfloat16 in one instruction, on every CPU with AVX512_BF16 (Intel's too),
where the rounding on the bits takes six."""

comptime Ptr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]
comptime Addr[dtype: DType] = Pointer[Scalar[dtype], MutUntrackedOrigin]
"""A Ptr kept in a struct field (a field's type may not hold AnyOrigin): the ChunkTasks' pointers."""


@always_inline
def addr[dtype: DType](p: Ptr[dtype]) -> Addr[dtype]:
    return p.unsafe_origin_cast[MutUntrackedOrigin]()


@always_inline
def ptr[dtype: DType](a: Addr[dtype]) -> Ptr[dtype]:
    return a.unsafe_origin_cast[MutAnyOrigin]()


@always_inline
def list_ptr[dtype: DType](mut values: List[Scalar[dtype]]) -> Ptr[dtype]:
    """A list's elements as a Ptr: the kernels' scratch buffers (the list must outlive the pointer's use)."""
    return values.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()


def aligned_16[dtype: DType](*pointers: Ptr[dtype]) -> Bool:
    """Whether every pointer is on a 16-byte boundary (a GPU's vector loads need it)."""
    for p in pointers:
        if Int(p) % 16 != 0:
            return False
    return True


comptime GPU_BLOCK = 128
"""Threads per block of the row-wise GPU kernels (one row per block)."""

comptime SERIAL_ELEMENTS = 32768
"""Up to this many elements the memory-bound CPU kernels run on the calling thread alone: handing work to
awake workers costs a few µs (a 1024-wide RMSNorm row takes ~0.2 µs). torch's grain size is the same."""
comptime SERIAL_TRANSCENDENTAL = 8192
"""The same for kernels with an exp or erf per element (silu, gelu): four times the work per element."""


def check_same[what: StaticString](a: Int, b: Int, a_name: StaticString, b_name: StaticString) raises:
    if a != b:
        raise Error(what, ": ", a_name, " (", a, ") must equal ", b_name, " (", b, ")")


@always_inline
def load_f32[dtype: DType, width: Int](p: Ptr[dtype], i: Int) -> SIMD[F32, width]:
    """`width` values at p[i] as float32. bfloat16 is loaded as uint16 bits and widened with a shift: on CPUs
    without AVX512_BF16 (AMD Zen 3, most Intel before Sapphire Rapids) that is several times faster than `.cast`, and
    than loading bfloat16 vectors, which LLVM may then convert element by element (decode attention 1.6x slower)."""
    comptime if dtype == DType.bfloat16:
        var bits = p.unsafe_bitcast[UInt16]().unsafe_load[width=width](i)
        return bitcast[F32, width](bits.cast[DType.uint32]() << 16)
    else:
        return p.unsafe_load[width=width](i).cast[F32]()


@always_inline
def narrow[dtype: DType, width: Int](v: SIMD[F32, width]) -> SIMD[dtype, width]:
    """float32 -> dtype; to bfloat16 by round-to-nearest-even (NaN stays NaN): vcvtneps2bf16 where the CPU has it
    (which flushes float32 subnormals, below 1.2e-38, to zero), else on the bits."""
    comptime if dtype == DType.bfloat16 and BF16_CONVERT and width % F32_WIDTH == 0:
        var out = SIMD[dtype, width]()
        comptime for i in range(0, width, F32_WIDTH):
            var part = llvm_intrinsic["llvm.x86.avx512bf16.cvtneps2bf16.512", SIMD[DType.bfloat16, F32_WIDTH]](
                v.slice[F32_WIDTH, offset=i]()
            )
            out = out.insert[offset=i](rebind[SIMD[dtype, F32_WIDTH]](part))
        return out
    elif dtype == DType.bfloat16:
        var bits = bitcast[DType.uint32, width](v)
        var rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).cast[DType.uint16]()
        var quiet_nan = SIMD[DType.uint16, width](0x7FC0)
        return rebind[SIMD[dtype, width]](bitcast[DType.bfloat16, width](v.ne(v).select(quiet_nan, rounded)))
    else:
        return v.cast[dtype]()


@always_inline
def convert_row[src_type: DType, dst_type: DType](dst: Ptr[dst_type], dst_at: Int, src: Ptr[src_type], src_at: Int, n: Int):
    """dst[dst_at : dst_at + n] = src[src_at : src_at + n] in dst's dtype (rounded to nearest even): a row into a KV
    cache that may hold another dtype than the activations."""
    var i = 0
    while i + F32_WIDTH <= n:
        dst.unsafe_store(dst_at + i, narrow[dst_type, F32_WIDTH](load_f32[src_type, F32_WIDTH](src, src_at + i)))
        i += F32_WIDTH
    while i < n:
        dst.unsafe_store(dst_at + i, narrow[dst_type, 1](load_f32[src_type, 1](src, src_at + i)))
        i += 1


@always_inline
def zero_f32(p: Ptr[F32], at: Int, n: Int):
    """p[at : at + n] = 0, by vectors."""
    var i = 0
    while i + F32_WIDTH <= n:
        p.unsafe_store(at + i, SIMD[F32, F32_WIDTH](0))
        i += F32_WIDTH
    while i < n:
        p.unsafe_store(at + i, 0)
        i += 1


@always_inline
def largest_abs[dtype: DType](p: Ptr[dtype], at: Int, n: Int) -> Float32:
    """max |p[at + i]| over i < n, as float32 (0 when n is 0). Four chains of vector maxima: one is bound by vmaxps's
    latency."""
    var big = Array[SIMD[F32, F32_WIDTH], 4](fill=0)
    var i = 0
    while i + 4 * F32_WIDTH <= n:
        comptime for c in range(4):
            big[c] = max(big[c], abs(load_f32[dtype, F32_WIDTH](p, at + i + c * F32_WIDTH)))
        i += 4 * F32_WIDTH
    while i + F32_WIDTH <= n:
        big[0] = max(big[0], abs(load_f32[dtype, F32_WIDTH](p, at + i)))
        i += F32_WIDTH
    var largest = max(max(big[0], big[1]), max(big[2], big[3])).reduce_max()
    for t in range(i, n):
        largest = max(largest, abs(load_f32[dtype, 1](p, at + t)[0]))
    return largest


comptime FP8_SCALE = Float32(256)
"""2^8: what widen leaves out of an FP8 value."""


@always_inline
def is_fp8[dtype: DType]() -> Bool:
    """FP8 e4m3 values, as float8_e4m3fn or as their uint8 bits (MAX graphs refuse float8 tensors on CPU)."""
    return dtype == DType.float8_e4m3fn or dtype == DType.uint8


@always_inline
def widen[dtype: DType, width: Int](p: Ptr[dtype], i: Int) -> SIMD[F32, width]:
    """`width` stored values at p[i] as float32, FP8 ones times 2^-8 (FP8_SCALE goes into their scale): the sign to
    bit 15 and the 7 exponent and mantissa bits to bits 7..13 make a float16 that is the e4m3 value times 2^-8,
    normals and subnormals alike. Its conversion to float32 (F16C) is exact and, unlike the same trick on float32
    bits, makes no float32 subnormals, which cost a CPU microcode assist per instruction (3x slower on random FP8
    weights)."""
    comptime if is_fp8[dtype]():
        var b = p.unsafe_bitcast[UInt8]().unsafe_load[width=width](i).cast[DType.uint16]()
        return bitcast[DType.float16, width](((b & 0x80) << 8) | ((b & 0x7F) << 7)).cast[F32]()
    elif dtype == DType.int8:
        return p.unsafe_load[width=width](i).cast[F32]()
    else:
        return load_f32[dtype, width](p, i)


@always_inline
def round_even[width: Int](v: SIMD[F32, width]) -> SIMD[F32, width]:
    """To the nearest integer, ties to even (as torch.round; one vroundps, where __round__'s ties away are several)."""
    return llvm_intrinsic["llvm.roundeven", SIMD[F32, width]](v)


@always_inline
def dot_bf16(
    acc: SIMD[F32, F32_WIDTH], a: SIMD[DType.bfloat16, 2 * F32_WIDTH], b: SIMD[DType.bfloat16, 2 * F32_WIDTH],
) -> SIMD[F32, F32_WIDTH]:
    """acc plus the products of a and b, summed in pairs (vdpbf16ps)."""
    comptime if BF16_DOT and F32_WIDTH == 16:
        return llvm_intrinsic["llvm.x86.avx512bf16.dpbf16ps.512", SIMD[F32, F32_WIDTH]](acc, a, b)
    else:  # each 32-bit lane holds a pair: its low half shifted up and its high half masked are float32 as they are
        var ua, ub = bitcast[DType.uint32, F32_WIDTH](a), bitcast[DType.uint32, F32_WIDTH](b)
        comptime high = UInt32(0xFFFF0000)
        var lows = bitcast[F32, F32_WIDTH](ua << 16).fma(bitcast[F32, F32_WIDTH](ub << 16), acc)
        return bitcast[F32, F32_WIDTH](ua & high).fma(bitcast[F32, F32_WIDTH](ub & high), lows)
