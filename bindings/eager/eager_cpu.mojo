# MILI's CPU kernels as a Python extension module (`mili_eager_cpu`): bindings/ops.py calls them directly on
# torch tensors, without the ~100 µs of a MAX graph execution per call. They run the very functions the MAX
# custom ops run on CPU, after the same shape checks, on the process's OpenMP threads (torch's: see
# mojo_kernels/utils/parallel.mojo) instead of Mojo's runtime.
#
# Calling convention (bindings/ops.py CompiledOp): one function per op and dtype, e.g. `rms_norm_float32`,
# called with METH_FASTCALL (no argument tuple); its arguments are integers: the address of the process's
# OpenMP entry points (utils/parallel.mojo; 0: none), then the op's tensors in the order of the MAX op (outputs
# first), each as its address followed by its sizes. Python checks ranks, dtypes, devices and contiguity first.
from std.os import abort
from std.python import Python, PythonObject
from std.python._cpython import PyObjectPtr, PyThreadState
from std.python.bindings import PythonModuleBuilder
from std.utils.index import IndexList

from mojo_kernels.core.activations import (
    check_silu_and_mul, elementwise_cpu, silu_and_mul_cpu, SILU, GELU, RELU
)
from mojo_kernels.core.attention.common import check_attention
from mojo_kernels.core.attention.cpu import attention_cpu
from mojo_kernels.core.attention.qkv_attention import check_qkv_attention, qkv_attention_cpu
from mojo_kernels.core.linear import (
    check_linear, check_linear_tiled, linear_cpu, linear_tiled_op, F32_TILED, I8_TILED, I8_TILED_EXPERTS,
)
from mojo_kernels.core.linear_amx import AMX
from mojo_kernels.core.linear_int4 import check_linear_int4, int4_scales, linear_int4_cpu
from mojo_kernels.core.moe import check_moe, check_moe_params, moe_dense_cpu, moe_int4_cpu
from mojo_kernels.core.normalization import check_norm, norm_rows_cpu
from mojo_kernels.core.qk_norm_rope import check_qk_norm_rope_store, qk_norm_rope_store_cpu
from mojo_kernels.core.rope import check_rope, rope_cpu
from mojo_kernels.core.sampling import check_sample_top_k, sample_top_k_cpu
from mojo_kernels.core.top_k import check_top_k, top_k_cpu
from mojo_kernels.memory.kv_cache import check_store_kv, store_kv_cpu
from mojo_kernels.utils.parallel import OpenMP
from mojo_kernels.utils.types import BF16_DOT, F16, F32, F32_WIDTH, Ptr

comptime I32 = DType.int32
comptime PyArgs = Pointer[PyObjectPtr, MutUntrackedOrigin]


struct Tensor[dtype: DType, rank: Int](ImplicitlyCopyable):
    var address: Int
    var dims: IndexList[Self.rank]

    def __init__(out self, address: Int, dims: IndexList[Self.rank]):
        self.address = address
        self.dims = dims

    def ptr(self) -> Ptr[Self.dtype]:
        return Ptr[Self.dtype](unsafe_from_address=self.address)

    def size(self) -> Int:
        var n = 1
        comptime for i in range(Self.rank):
            n *= self.dims[i]
        return n


struct Args:
    """Reads the call's integer arguments in order; `done` then lets other Python threads run (as torch's ops
    do) while the op checks sizes and runs its kernel, which touch no Python object."""

    var items: PyArgs
    var count: Int
    var at: Int
    var saved_thread: Optional[Pointer[PyThreadState, MutUntrackedOrigin]]
    """Set while the GIL is released (PyEval_SaveThread's result)."""

    def __init__(out self, items: PyArgs, count: Int):
        self.items = items
        self.count = count
        self.at = 0
        self.saved_thread = None

    def int(mut self) raises -> Int:
        if self.at >= self.count:
            raise Error("expected more than ", self.count, " arguments")
        ref cpython = Python().cpython()
        var value = Int(cpython.PyLong_AsSsize_t(self.items[unsafe_offset=self.at]))
        if value == -1 and cpython.PyErr_Occurred():
            raise Error("argument ", self.at, " is not an integer")
        self.at += 1
        return value

    def tensor[dtype: DType, rank: Int](mut self) raises -> Tensor[dtype, rank]:
        var address = self.int()
        var dims = IndexList[rank]()
        comptime for i in range(rank):
            dims[i] = self.int()
        return Tensor[dtype, rank](address, dims)

    def done(mut self, op: StaticString) raises:
        if self.at != self.count:
            raise Error(op, ": expected ", self.at, " arguments, got ", self.count)
        self.saved_thread = Python().cpython().PyEval_SaveThread()

    def hold_gil(mut self):
        if self.saved_thread:
            Python().cpython().PyEval_RestoreThread(self.saved_thread)
            self.saved_thread = None


def _fastcall[op: def(mut Args) raises thin -> None](py_self: PyObjectPtr, items: PyArgs, count: Int) abi("C") -> PyObjectPtr:
    """A METH_FASTCALL function running `op`: None, or NULL with a ValueError set when it raises."""
    ref cpython = Python().cpython()
    var args = Args(items, count)
    try:
        op(args)
    except e:
        args.hold_gil()
        if not cpython.PyErr_Occurred():
            var message = String(e)
            cpython.PyErr_SetString(cpython.get_error_global("PyExc_ValueError"), message.as_c_string_span().ptr().unsafe_origin_cast[ImmutAnyOrigin]())
        return PyObjectPtr()
    args.hold_gil()
    var none = cpython.Py_None()
    cpython.Py_IncRef(none)
    return none


def _scalar(mut args: Args) raises -> Float32:
    return args.tensor[F32, 1]().ptr().unsafe_load(0)


def rms_norm[dtype: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, w = args.tensor[dtype, 2](), args.tensor[dtype, 2](), args.tensor[dtype, 1]()
    var eps = _scalar(args)
    args.done("rms_norm")
    check_norm["rms_norm"](w.dims[0], x.dims[1], "hidden size", x.size(), x.size())
    norm_rows_cpu[dtype, False](runner, y.ptr(), y.ptr(), x.ptr(), x.ptr(), w.ptr(), x.dims[0], x.dims[1], eps)


def fused_add_rms_norm[dtype: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, res_out, x, res = args.tensor[dtype, 2](), args.tensor[dtype, 2](), args.tensor[dtype, 2](), args.tensor[dtype, 2]()
    var w = args.tensor[dtype, 1]()
    var eps = _scalar(args)
    args.done("fused_add_rms_norm")
    check_norm["fused_add_rms_norm"](w.dims[0], x.dims[1], "hidden size", res.size(), x.size())
    norm_rows_cpu[dtype, True](runner, y.ptr(), res_out.ptr(), x.ptr(), res.ptr(), w.ptr(), x.dims[0], x.dims[1], eps)


def head_rms_norm[dtype: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, w = args.tensor[dtype, 3](), args.tensor[dtype, 3](), args.tensor[dtype, 1]()
    var eps = _scalar(args)
    args.done("head_rms_norm")
    check_norm["head_rms_norm"](w.dims[0], x.dims[2], "head_dim", x.size(), x.size())
    norm_rows_cpu[dtype, False](runner, y.ptr(), y.ptr(), x.ptr(), x.ptr(), w.ptr(), x.dims[0] * x.dims[1], x.dims[2], eps)


def rope[dtype: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var q_out, k_out, q, k = args.tensor[dtype, 3](), args.tensor[dtype, 3](), args.tensor[dtype, 3](), args.tensor[dtype, 3]()
    var positions, inv_freq = args.tensor[I32, 1](), args.tensor[F32, 1]()
    var scale = _scalar(args)
    args.done("rope")
    check_rope(q.dims[0], q.dims[2], k.dims[0], k.dims[2], positions.dims[0], inv_freq.dims[0])
    if q.dims[0] > 0:
        rope_cpu[dtype](runner, q_out.ptr(), k_out.ptr(), q.ptr(), k.ptr(), positions.ptr(), inv_freq.ptr(), scale, q.dims[0], q.dims[1],
                        k.dims[1], q.dims[2])


def silu_and_mul[dtype: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x = args.tensor[dtype, 2](), args.tensor[dtype, 2]()
    args.done("silu_and_mul")
    check_silu_and_mul(x.dims[1], y.dims[1])
    silu_and_mul_cpu[dtype](runner, y.ptr(), x.ptr(), x.dims[0], y.dims[1])


def elementwise[dtype: DType, kind: Int](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x = args.tensor[dtype, 2](), args.tensor[dtype, 2]()
    args.done("elementwise activation")
    elementwise_cpu[dtype, kind](runner, y.ptr(), x.ptr(), x.size())


def store_kv[dtype: DType, cache_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var k, v = args.tensor[dtype, 3](), args.tensor[dtype, 3]()
    var k_cache, v_cache = args.tensor[cache_type, 4](), args.tensor[cache_type, 4]()
    var slots = args.tensor[I32, 1]()
    args.done("store_kv")
    check_store_kv[cache_type](k.dims[0], k.dims[1], k.dims[2], k_cache.dims[2], k_cache.dims[3], k.size(), v.size(),
                               slots.dims[0])
    if k.dims[0] > 0:
        store_kv_cpu[dtype, cache_type](runner, k_cache.ptr(), v_cache.ptr(), k.ptr(), v.ptr(), slots.ptr(), k.dims[0],
                                        k.dims[1], k.dims[2])


def paged_attention[dtype: DType, cache_type: DType](mut args: Args) raises:
    _ = args.int()  # OpenMP entry points: attention keeps Mojo's threads (few long work items, a worker per core)
    var output, q = args.tensor[dtype, 3](), args.tensor[dtype, 3]()
    var k_cache, v_cache = args.tensor[cache_type, 4](), args.tensor[cache_type, 4]()
    var page_table, context_lens, query_start = args.tensor[I32, 2](), args.tensor[I32, 1](), args.tensor[I32, 1]()
    var scale = _scalar(args)
    args.done("paged_attention")
    var batch = context_lens.dims[0]
    check_attention[cache_type](batch, q.dims[1], q.dims[2], k_cache.dims[2], k_cache.dims[3], k_cache.size(),
                                v_cache.size(), page_table.dims[0], query_start.dims[0])
    if q.dims[0] > 0:
        attention_cpu[dtype, cache_type](output.ptr(), q.ptr(), k_cache.ptr(), v_cache.ptr(), page_table.ptr(), context_lens.ptr(),
                             query_start.ptr(), scale, batch, page_table.dims[1], q.dims[1], k_cache.dims[2], q.dims[2],
                             k_cache.dims[1])


def qk_norm_rope_store[dtype: DType, cache_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var q, qkv = args.tensor[dtype, 3](), args.tensor[dtype, 2]()
    var q_norm, k_norm = args.tensor[dtype, 1](), args.tensor[dtype, 1]()
    var eps = _scalar(args)
    var positions, inv_freq = args.tensor[I32, 1](), args.tensor[F32, 1]()
    var scale = _scalar(args)
    var k_cache, v_cache, slots = args.tensor[cache_type, 4](), args.tensor[cache_type, 4](), args.tensor[I32, 1]()
    args.done("qk_norm_rope_store")
    check_qk_norm_rope_store[cache_type](qkv.dims[0], qkv.dims[1], q.dims[0], q.dims[1], q.dims[2], k_cache.dims[2],
                                         k_cache.dims[3], q_norm.dims[0], k_norm.dims[0], positions.dims[0],
                                         inv_freq.dims[0], slots.dims[0])
    if qkv.dims[0] > 0:
        qk_norm_rope_store_cpu[dtype, cache_type](runner, q.ptr(), k_cache.ptr(), v_cache.ptr(), qkv.ptr(), q_norm.ptr(), k_norm.ptr(),
                                      positions.ptr(), inv_freq.ptr(), slots.ptr(), eps, scale, qkv.dims[0], q.dims[1],
                                      k_cache.dims[2], q.dims[2])


def qkv_attention[dtype: DType, cache_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var output, qkv = args.tensor[dtype, 3](), args.tensor[dtype, 2]()
    var q_norm, k_norm = args.tensor[dtype, 1](), args.tensor[dtype, 1]()
    var eps = _scalar(args)
    var positions, inv_freq = args.tensor[I32, 1](), args.tensor[F32, 1]()
    var rope_scale = _scalar(args)
    var k_cache, v_cache, slots = args.tensor[cache_type, 4](), args.tensor[cache_type, 4](), args.tensor[I32, 1]()
    var page_table, context_lens, query_start = args.tensor[I32, 2](), args.tensor[I32, 1](), args.tensor[I32, 1]()
    var scale = _scalar(args)
    args.done("qkv_attention")
    var tokens, batch = qkv.dims[0], context_lens.dims[0]
    check_qkv_attention[cache_type](tokens, qkv.dims[1], output.dims[0], output.dims[1], output.dims[2],
                                    k_cache.dims[2], k_cache.dims[3], k_cache.size(), v_cache.size(), q_norm.dims[0],
                                    k_norm.dims[0], positions.dims[0], inv_freq.dims[0], slots.dims[0], batch,
                                    page_table.dims[0], query_start.dims[0])
    if tokens > 0:  # attention on Mojo's threads, as paged_attention
        qkv_attention_cpu[dtype, cache_type](
            runner, output.ptr(), k_cache.ptr(), v_cache.ptr(), qkv.ptr(), q_norm.ptr(), k_norm.ptr(), eps,
            positions.ptr(), inv_freq.ptr(), rope_scale, slots.ptr(), page_table.ptr(), context_lens.ptr(),
            query_start.ptr(), scale, tokens, batch, page_table.dims[1], output.dims[1], k_cache.dims[2],
            output.dims[2], k_cache.dims[1],
        )


def linear[a_type: DType, w_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, w = args.tensor[a_type, 2](), args.tensor[a_type, 2](), args.tensor[w_type, 2]()
    var scales = args.tensor[F32, 2]()
    var block_k = args.tensor[I32, 1]().ptr().unsafe_load(0)
    args.done("linear")
    check_linear[w_type](x.dims[0], x.dims[1], w.dims[0], w.dims[1], y.dims[0], y.dims[1], scales.dims[0], scales.dims[1],
                         Int(block_k))
    linear_cpu[a_type, w_type](runner, y.ptr(), x.ptr(), w.ptr(), scales.ptr(), x.dims[0], w.dims[0], x.dims[1], Int(block_k))


def linear_tiled[a_type: DType, w_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, w = args.tensor[a_type, 2](), args.tensor[a_type, 2](), args.tensor[w_type, 4]()
    var scales = args.tensor[F32, 2]()
    var block_k = Int(args.tensor[I32, 1]().ptr().unsafe_load(0))
    args.done("linear_tiled")
    check_linear_tiled[w_type](x.dims[0], x.dims[1], w.dims[0], w.dims[1], w.dims[2], w.dims[3], y.dims[0], y.dims[1],
                               scales.dims[0], scales.dims[1], block_k)
    linear_tiled_op[a_type, w_type](runner, y.ptr(), x.ptr(), w.ptr(), scales.ptr(), x.dims[0], w.dims[0] * w.dims[2],
                                    x.dims[1], y.dims[1], block_k, w.dims[2])


def linear_int4[a_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, w = args.tensor[a_type, 2](), args.tensor[a_type, 2](), args.tensor[DType.uint8, 2]()
    var scales, mins = args.tensor[DType.uint8, 3](), args.tensor[DType.uint8, 3]()
    var supers = args.tensor[F16, 4]()
    var block_k = Int(args.tensor[I32, 1]().ptr().unsafe_load(0))
    args.done("linear_int4")
    var bits = check_linear_int4(x.dims[0], x.dims[1], y.dims[1], w.dims[0], w.dims[1], y.dims[0], scales.dims,
                                 mins.dims, block_k)
    var form = int4_scales["linear_int4"](scales.dims[2], mins.dims[2], mins.size(), supers.size(), w.dims[0],
                                          scales.dims[1])
    linear_int4_cpu[a_type](runner, y.ptr(), x.ptr(), w.ptr(), scales.ptr(), mins.ptr(), supers.ptr(), x.dims[0],
                            y.dims[1], x.dims[1], block_k, bits, form)


def moe[a_type: DType, w_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, logits = args.tensor[a_type, 2](), args.tensor[a_type, 2](), args.tensor[a_type, 2]()
    var gate_up, gate_up_scales = args.tensor[w_type, 2](), args.tensor[F32, 2]()
    var down, down_scales = args.tensor[w_type, 2](), args.tensor[F32, 2]()
    var params = args.tensor[I32, 1]()
    var p = params.ptr()
    args.done("moe")
    check_moe(x.dims[0], x.dims[1], y.dims[0], y.dims[1], logits.dims[0], logits.dims[1], gate_up.dims[0],
              down.dims[0], params.dims[0])
    check_moe_params(logits.dims[1], Int(p.unsafe_load(1)), Int(p.unsafe_load(4)))
    moe_dense_cpu[a_type, w_type](runner, y.ptr(), x.ptr(), logits.ptr(), gate_up.ptr(), gate_up_scales.ptr(),
                                  down.ptr(), down_scales.ptr(), x.dims[0], x.dims[1], logits.dims[1], gate_up.dims[1],
                                  gate_up_scales.dims[1], down.dims[1], down_scales.dims[1], p)


def moe_int4[a_type: DType](mut args: Args) raises:
    var runner = OpenMP(args.int())
    var y, x, logits = args.tensor[a_type, 2](), args.tensor[a_type, 2](), args.tensor[a_type, 2]()
    var gate_up, gate_up_scales = args.tensor[DType.uint8, 2](), args.tensor[DType.uint8, 2]()
    var gate_up_mins, gate_up_supers = args.tensor[DType.uint8, 2](), args.tensor[F16, 2]()
    var down, down_scales = args.tensor[DType.uint8, 2](), args.tensor[DType.uint8, 2]()
    var down_mins, down_supers = args.tensor[DType.uint8, 2](), args.tensor[F16, 2]()
    var params = args.tensor[I32, 1]()
    var p = params.ptr()
    args.done("moe_int4")
    check_moe(x.dims[0], x.dims[1], y.dims[0], y.dims[1], logits.dims[0], logits.dims[1], gate_up.dims[0],
              down.dims[0], params.dims[0])
    check_moe_params(logits.dims[1], Int(p.unsafe_load(1)), Int(p.unsafe_load(4)))
    moe_int4_cpu[a_type](runner, y.ptr(), x.ptr(), logits.ptr(), gate_up.ptr(), gate_up_scales.ptr(), gate_up_mins.ptr(),
                         gate_up_supers.ptr(), down.ptr(), down_scales.ptr(), down_mins.ptr(), down_supers.ptr(),
                         x.dims[0], x.dims[1], logits.dims[1], gate_up.dims[1], gate_up_scales.dims[1], down.dims[1],
                         down_scales.dims[1], gate_up_mins.dims[1], down_mins.dims[1], gate_up_supers.dims[1],
                         down_supers.dims[1], p)


def top_k(mut args: Args) raises:
    _ = args.int()  # the OpenMP entry points: the rows run on the calling thread (top_k_cpu)
    var values, indices, logits = args.tensor[F32, 2](), args.tensor[DType.int64, 2](), args.tensor[F32, 2]()
    args.done("top_k")
    var k = values.dims[1]
    check_top_k(logits.dims[1], k)
    if values.dims[0] != logits.dims[0] or indices.dims[0] != logits.dims[0] or indices.dims[1] != k:
        raise Error("top_k: values and indices must be [rows, k] for logits [rows, n]")
    top_k_cpu(values.ptr(), indices.ptr(), logits.ptr(), logits.dims[0], logits.dims[1], k)


def sample_top_k(mut args: Args) raises:
    _ = args.int()  # the OpenMP entry points: the rows run on the calling thread (sample_top_k_cpu)
    var tokens, logits = args.tensor[DType.int64, 1](), args.tensor[F32, 2]()
    var top_k, settings, u = args.tensor[I32, 1](), args.tensor[F32, 2](), args.tensor[DType.float64, 1]()
    args.done("sample_top_k")
    var rows = logits.dims[0]
    if tokens.dims[0] != rows or top_k.dims[0] != rows or settings.dims[0] != rows or settings.dims[1] != 3 \
            or u.dims[0] != rows:
        raise Error("sample_top_k: tokens, top_k, u [rows] and settings [rows, 3] for logits [rows, n]")
    var largest_k = check_sample_top_k(logits.dims[1], top_k.ptr(), rows)
    sample_top_k_cpu(tokens.ptr(), logits.ptr(), rows, logits.dims[1], top_k.ptr(), settings.ptr(), u.ptr(),
                     largest_k)


def int8_tiled() raises -> PythonObject:
    return PythonObject(I8_TILED)


def int8_experts_tiled() raises -> PythonObject:
    return PythonObject(I8_TILED_EXPERTS)


def float32_tiled() raises -> PythonObject:
    return PythonObject(F32_TILED)


def bf16_pair_panels() raises -> PythonObject:
    return PythonObject(AMX or BF16_DOT)


def float32_lanes() raises -> PythonObject:
    return PythonObject(F32_WIDTH)


def _add_ops(mut m: PythonModuleBuilder) raises:
    m.def_function[int8_tiled]("int8_tiled", docstring="Whether the linear kernels read int8 weights fastest tiled.")
    m.def_function[int8_experts_tiled]("int8_experts_tiled", docstring=(
        "Whether the MoE kernels read int8 experts fastest tiled."))
    m.def_function[float32_tiled]("float32_tiled", docstring=(
        "Whether the linear kernels read float32 weights fastest tiled (as panels)."))
    m.def_function[bf16_pair_panels]("bf16_pair_panels", docstring=(
        "Whether the linear kernels read bfloat16 weights fastest as pair panels (AMX tiles or vdpbf16ps)"))
    m.def_function[float32_lanes]("float32_lanes", docstring="float32 lanes of the kernels' vectors (16: AVX-512)")
    # names must be static strings: one line per op and dtype
    m.def_py_c_function(_fastcall[rms_norm[DType.float32]], "rms_norm_float32")
    m.def_py_c_function(_fastcall[rms_norm[DType.bfloat16]], "rms_norm_bfloat16")
    m.def_py_c_function(_fastcall[fused_add_rms_norm[DType.float32]], "fused_add_rms_norm_float32")
    m.def_py_c_function(_fastcall[fused_add_rms_norm[DType.bfloat16]], "fused_add_rms_norm_bfloat16")
    m.def_py_c_function(_fastcall[head_rms_norm[DType.float32]], "head_rms_norm_float32")
    m.def_py_c_function(_fastcall[head_rms_norm[DType.bfloat16]], "head_rms_norm_bfloat16")
    m.def_py_c_function(_fastcall[rope[DType.float32]], "rope_with_table_float32")
    m.def_py_c_function(_fastcall[rope[DType.bfloat16]], "rope_with_table_bfloat16")
    m.def_py_c_function(_fastcall[silu_and_mul[DType.float32]], "silu_and_mul_float32")
    m.def_py_c_function(_fastcall[silu_and_mul[DType.bfloat16]], "silu_and_mul_bfloat16")
    m.def_py_c_function(_fastcall[elementwise[DType.float32, SILU]], "silu_float32")
    m.def_py_c_function(_fastcall[elementwise[DType.bfloat16, SILU]], "silu_bfloat16")
    m.def_py_c_function(_fastcall[elementwise[DType.float32, GELU]], "gelu_float32")
    m.def_py_c_function(_fastcall[elementwise[DType.bfloat16, GELU]], "gelu_bfloat16")
    m.def_py_c_function(_fastcall[elementwise[DType.float32, RELU]], "relu_float32")
    m.def_py_c_function(_fastcall[elementwise[DType.bfloat16, RELU]], "relu_bfloat16")
    m.def_py_c_function(_fastcall[store_kv[DType.float32, DType.float32]], "store_kv_float32")
    m.def_py_c_function(_fastcall[store_kv[DType.bfloat16, DType.bfloat16]], "store_kv_bfloat16")
    m.def_py_c_function(_fastcall[store_kv[DType.float32, DType.bfloat16]], "store_kv_float32_kv_bfloat16")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.float32, DType.float32]], "qk_norm_rope_store_float32")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.bfloat16, DType.bfloat16]], "qk_norm_rope_store_bfloat16")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.float32, DType.bfloat16]], "qk_norm_rope_store_float32_kv_bfloat16")
    m.def_py_c_function(_fastcall[paged_attention[DType.float32, DType.float32]], "paged_attention_float32")
    m.def_py_c_function(_fastcall[paged_attention[DType.bfloat16, DType.bfloat16]], "paged_attention_bfloat16")
    m.def_py_c_function(_fastcall[paged_attention[DType.float32, DType.bfloat16]], "paged_attention_float32_kv_bfloat16")
    m.def_py_c_function(_fastcall[qkv_attention[DType.float32, DType.float32]], "qkv_attention_float32")
    m.def_py_c_function(_fastcall[qkv_attention[DType.bfloat16, DType.bfloat16]], "qkv_attention_bfloat16")
    m.def_py_c_function(_fastcall[qkv_attention[DType.float32, DType.bfloat16]], "qkv_attention_float32_kv_bfloat16")
    m.def_py_c_function(_fastcall[store_kv[DType.float32, DType.int8]], "store_kv_float32_kv_int8")
    m.def_py_c_function(_fastcall[store_kv[DType.float32, DType.uint8]], "store_kv_float32_kv_uint8")
    m.def_py_c_function(_fastcall[store_kv[DType.bfloat16, DType.int8]], "store_kv_bfloat16_kv_int8")
    m.def_py_c_function(_fastcall[store_kv[DType.bfloat16, DType.uint8]], "store_kv_bfloat16_kv_uint8")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.float32, DType.int8]], "qk_norm_rope_store_float32_kv_int8")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.float32, DType.uint8]], "qk_norm_rope_store_float32_kv_uint8")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.bfloat16, DType.int8]], "qk_norm_rope_store_bfloat16_kv_int8")
    m.def_py_c_function(_fastcall[qk_norm_rope_store[DType.bfloat16, DType.uint8]], "qk_norm_rope_store_bfloat16_kv_uint8")
    m.def_py_c_function(_fastcall[paged_attention[DType.float32, DType.int8]], "paged_attention_float32_kv_int8")
    m.def_py_c_function(_fastcall[paged_attention[DType.float32, DType.uint8]], "paged_attention_float32_kv_uint8")
    m.def_py_c_function(_fastcall[paged_attention[DType.bfloat16, DType.int8]], "paged_attention_bfloat16_kv_int8")
    m.def_py_c_function(_fastcall[paged_attention[DType.bfloat16, DType.uint8]], "paged_attention_bfloat16_kv_uint8")
    m.def_py_c_function(_fastcall[qkv_attention[DType.float32, DType.int8]], "qkv_attention_float32_kv_int8")
    m.def_py_c_function(_fastcall[qkv_attention[DType.float32, DType.uint8]], "qkv_attention_float32_kv_uint8")
    m.def_py_c_function(_fastcall[qkv_attention[DType.bfloat16, DType.int8]], "qkv_attention_bfloat16_kv_int8")
    m.def_py_c_function(_fastcall[qkv_attention[DType.bfloat16, DType.uint8]], "qkv_attention_bfloat16_kv_uint8")
    m.def_py_c_function(_fastcall[linear[DType.float32, DType.float32]], "linear_float32_float32")
    m.def_py_c_function(_fastcall[linear[DType.float32, DType.bfloat16]], "linear_float32_bfloat16")
    m.def_py_c_function(_fastcall[linear[DType.float32, DType.uint8]], "linear_float32_uint8")
    m.def_py_c_function(_fastcall[linear[DType.float32, DType.int8]], "linear_float32_int8")
    m.def_py_c_function(_fastcall[linear[DType.bfloat16, DType.float32]], "linear_bfloat16_float32")
    m.def_py_c_function(_fastcall[linear[DType.bfloat16, DType.bfloat16]], "linear_bfloat16_bfloat16")
    m.def_py_c_function(_fastcall[linear[DType.bfloat16, DType.uint8]], "linear_bfloat16_uint8")
    m.def_py_c_function(_fastcall[linear[DType.bfloat16, DType.int8]], "linear_bfloat16_int8")
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.float32]], "linear_tiled_float32_float32")
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.bfloat16]], "linear_tiled_float32_bfloat16")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.float32]], "linear_tiled_bfloat16_float32")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.bfloat16]], "linear_tiled_bfloat16_bfloat16")
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.int8]], "linear_tiled_float32_int8")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.int8]], "linear_tiled_bfloat16_int8")
    # the same kernels: they tell silu_and_mul by the output's half width
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.float32]], "linear_tiled_swiglu_float32_float32")
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.bfloat16]], "linear_tiled_swiglu_float32_bfloat16")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.float32]], "linear_tiled_swiglu_bfloat16_float32")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.bfloat16]],
                        "linear_tiled_swiglu_bfloat16_bfloat16")
    m.def_py_c_function(_fastcall[linear_tiled[DType.float32, DType.int8]], "linear_tiled_swiglu_float32_int8")
    m.def_py_c_function(_fastcall[linear_tiled[DType.bfloat16, DType.int8]], "linear_tiled_swiglu_bfloat16_int8")
    m.def_py_c_function(_fastcall[linear_int4[DType.float32]], "linear_int4_float32")
    m.def_py_c_function(_fastcall[linear_int4[DType.bfloat16]], "linear_int4_bfloat16")
    m.def_py_c_function(_fastcall[moe[DType.float32, DType.float32]], "moe_float32_float32")
    m.def_py_c_function(_fastcall[moe[DType.float32, DType.bfloat16]], "moe_float32_bfloat16")
    m.def_py_c_function(_fastcall[moe[DType.float32, DType.uint8]], "moe_float32_uint8")
    m.def_py_c_function(_fastcall[moe[DType.float32, DType.int8]], "moe_float32_int8")
    m.def_py_c_function(_fastcall[moe_int4[DType.float32]], "moe_int4_float32")
    m.def_py_c_function(_fastcall[moe[DType.bfloat16, DType.float32]], "moe_bfloat16_float32")
    m.def_py_c_function(_fastcall[moe[DType.bfloat16, DType.bfloat16]], "moe_bfloat16_bfloat16")
    m.def_py_c_function(_fastcall[moe[DType.bfloat16, DType.uint8]], "moe_bfloat16_uint8")
    m.def_py_c_function(_fastcall[moe[DType.bfloat16, DType.int8]], "moe_bfloat16_int8")
    m.def_py_c_function(_fastcall[moe_int4[DType.bfloat16]], "moe_int4_bfloat16")
    m.def_py_c_function(_fastcall[top_k], "top_k_float32")
    m.def_py_c_function(_fastcall[sample_top_k], "sample_top_k_float32")


@export
def PyInit_mili_eager_cpu() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_eager_cpu")
        _add_ops(m)
        return m.finalize()
    except e:
        abort(String("failed to create the mili_eager_cpu module: ", e))
