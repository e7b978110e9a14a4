# Shared helpers of MILI's kernels: pointer aliases, the CPU vector width, argument checks.
from std.sys import simd_width_of

comptime F32 = DType.float32
comptime F32_WIDTH = simd_width_of[DType.float32]()
"""SIMD lanes of float32 on the host CPU (8 with AVX2, 16 with AVX-512)."""

comptime Ptr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]

comptime GPU_BLOCK = 128
"""Threads per block of the row-wise GPU kernels (one row per block)."""

comptime SERIAL_ELEMENTS = 32768
"""Below this many elements the CPU kernels skip the thread pool: its dispatch costs more than the work."""


def check_same[what: StaticString](a: Int, b: Int, a_name: StaticString, b_name: StaticString) raises:
    if a != b:
        raise Error(what, ": ", a_name, " (", a, ") must equal ", b_name, " (", b, ")")
