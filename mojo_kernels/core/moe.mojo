# Qwen3-MoE's sparse MLP (transformers' Qwen3MoeSparseMoeBlock; bindings/reference.moe): for each token t,
#   y[t] = sum over its experts e of weight[t, e] * down_e(silu(gate_e(x[t])) * up_e(x[t]))
# its experts the top_k of softmax(logits[t]) (the router's), their weights those probabilities, rescaled to sum to 1
# when `normalize`. The experts' gate_up [E, 2I, H] and down [E, H, I] weights are stacks, one expert after the
# other, of the linear kernels' weights in one format: linear.mojo's (float32, bfloat16, int8, FP8 bits; [N, K] or
# tiled) for mili_moe, linear_int4.mojo's packed 4- or 6-bit ones for mili_moe_int4 (gate_up's and down's bits and
# blocks their own).
# CPU: route every token; group its (token, slot) pairs by expert; then, each expert some token chose on one thread,
# gather its tokens' rows of x into one block and run that block through the expert's gate_up, silu_and_mul and
# down on the linear kernels (so each chosen expert's weights are streamed once a step, for all its tokens, and the
# others not at all: a decode step reads top_k experts a token; a prefill runs each expert's linears on its block
# of rows), into a row per pair; then sum each token's rows times their weights in float32.
# GPU: none yet (a qwen3_moe model refuses to load on a GPU).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from std.algorithm import vectorize
from std.math import ceildiv, exp

from ..utils.parallel import ChunkTask, MojoThreads, OnThisThread, Runner
from ..utils.types import (
    addr, ptr, list_ptr, convert_row, load_f32, narrow, Addr, F16, F32, F32_WIDTH, Ptr, SERIAL_ELEMENTS, check_same,
    is_fp8,
)
from .activations import silu_and_mul_cpu
from .linear import linear_cpu
from .linear_int4 import int4_scales, linear_int4_cpu, GROUP, Int4Scales, TILE_ROWS, tile_bits

comptime MOE_PARAMS = 6
"""The int32 params of both ops: block_k (gate_up's), top_k, normalize (0 / 1), tiled (0 / 1; mili_moe), I (each
expert's intermediate size), down's block_k (a GGUF file's Q4_K gate_up and Q6_K down block 32 and 16 columns)."""


struct _Experts[w_type: DType, tiled: Bool, packed: Bool](ImplicitlyCopyable):
    """The experts' weights (see the top), each expert's `*_size` elements (scales: `*_scale_size`) apart, in blocks of
    `*_block_k` columns; packed: linear_int4.mojo's format (w_type uint8, `*_bits` 4 or 6, scales, mins and
    multipliers as bytes, `*_apart` bytes apart, held as `*_form` says), else linear.mojo's (mins and supers unread)."""

    comptime s_type = DType.uint8 if Self.packed else F32

    var gate_up: Addr[Self.w_type]
    var gate_up_scales: Addr[Self.s_type]
    var gate_up_mins: Addr[Self.s_type]
    var gate_up_supers: Addr[Self.s_type]
    var down: Addr[Self.w_type]
    var down_scales: Addr[Self.s_type]
    var down_mins: Addr[Self.s_type]
    var down_supers: Addr[Self.s_type]
    var gate_up_size: Int
    var gate_up_scale_size: Int
    var down_size: Int
    var down_scale_size: Int
    var hidden: Int
    var inter: Int
    var gate_up_block_k: Int
    var down_block_k: Int
    var gate_up_int4: _Int4Stack
    var down_int4: _Int4Stack

    def __init__(out self, gate_up: Ptr[Self.w_type], gate_up_scales: Ptr[Self.s_type], gate_up_mins: Ptr[Self.s_type],
                 gate_up_supers: Ptr[Self.s_type], down: Ptr[Self.w_type], down_scales: Ptr[Self.s_type],
                 down_mins: Ptr[Self.s_type], down_supers: Ptr[Self.s_type], gate_up_size: Int, gate_up_scale_size: Int,
                 down_size: Int, down_scale_size: Int, hidden: Int, inter: Int, gate_up_block_k: Int,
                 down_block_k: Int, gate_up_int4: _Int4Stack, down_int4: _Int4Stack):
        self.gate_up, self.gate_up_scales, self.gate_up_mins = addr(gate_up), addr(gate_up_scales), addr(gate_up_mins)
        self.down, self.down_scales, self.down_mins = addr(down), addr(down_scales), addr(down_mins)
        self.gate_up_supers, self.down_supers = addr(gate_up_supers), addr(down_supers)
        self.gate_up_size, self.gate_up_scale_size = gate_up_size, gate_up_scale_size
        self.down_size, self.down_scale_size = down_size, down_scale_size
        self.hidden, self.inter = hidden, inter
        self.gate_up_block_k, self.down_block_k = gate_up_block_k, down_block_k
        self.gate_up_int4, self.down_int4 = gate_up_int4, down_int4

    def run[a_type: DType, R: Runner, first: Bool](self, runner: R, y: Ptr[a_type], x: Ptr[a_type], m: Int, e: Int):
        """y[m, 2I] = x @ gate_up[e]^T (first), else y[m, H] = x @ down[e]^T."""
        var w, scales, mins, supers = ptr(self.down), ptr(self.down_scales), ptr(self.down_mins), ptr(self.down_supers)
        var size, scale_size, n, k = self.down_size, self.down_scale_size, self.hidden, self.inter
        var block_k, int4 = self.down_block_k, self.down_int4
        comptime if first:
            w, scales, mins = ptr(self.gate_up), ptr(self.gate_up_scales), ptr(self.gate_up_mins)
            supers = ptr(self.gate_up_supers)
            size, scale_size, n, k = self.gate_up_size, self.gate_up_scale_size, 2 * self.inter, self.hidden
            block_k, int4 = self.gate_up_block_k, self.gate_up_int4
        w, scales = w.unsafe_offset(e * size), scales.unsafe_offset(e * scale_size)
        comptime if Self.packed:
            mins, supers = mins.unsafe_offset(e * int4.mins_apart), supers.unsafe_offset(e * int4.supers_apart)
            linear_int4_cpu[a_type](runner, y, x, rebind[Ptr[DType.uint8]](w), rebind[Ptr[DType.uint8]](scales),
                                    rebind[Ptr[DType.uint8]](mins), rebind[Ptr[DType.uint8]](supers).unsafe_bitcast[Float16](),
                                    m, n, k, block_k, int4.bits, int4.form)
        else:
            linear_cpu[a_type, Self.w_type, R, Self.tiled](runner, y, x, w, rebind[Ptr[F32]](scales), m, n, k,
                                                           block_k)


@fieldwise_init
struct _Int4Stack(ImplicitlyCopyable):
    """A stack of 4-bit experts' bits, the form of their scales and mins (linear_int4.Int4Scales), and the bytes
    between two experts' mins and multipliers."""

    var bits: Int
    var form: Int4Scales
    var mins_apart: Int
    var supers_apart: Int


comptime _DENSE = _Int4Stack(0, Int4Scales(False, False, 0), 0, 0)
"""What dense experts give _Experts for their 4-bit stacks (unread)."""


def _route[a_type: DType](logits: Ptr[a_type], t: Int, e_count: Int, top_k: Int, normalize: Bool,
                          ids: Ptr[DType.int32], weights: Ptr[F32]):
    """ids / weights [t, top_k]: each token's top_k experts by softmax(logits) (largest first, the lower index among
    equals) and their probabilities (rescaled to sum to 1 when normalize)."""
    var probs = List[Float32](length=e_count, fill=0)
    for i in range(t):
        var row = logits.unsafe_offset(i * e_count)
        var largest = row.unsafe_load(0).cast[F32]()
        for e in range(1, e_count):
            largest = max(largest, row.unsafe_load(e).cast[F32]())
        var total = Float32(0)
        for e in range(e_count):
            probs[e] = exp(row.unsafe_load(e).cast[F32]() - largest)
            total += probs[e]
        var chosen = Float32(0)
        for j in range(top_k):
            var best = -1
            for e in range(e_count):
                if probs[e] >= 0 and (best < 0 or probs[e] > probs[best]):
                    best = e
            ids.unsafe_store(i * top_k + j, Int32(best))
            weights.unsafe_store(i * top_k + j, probs[best] / total)
            chosen += probs[best] / total
            probs[best] = -1  # taken
        if normalize:
            for j in range(top_k):
                weights.unsafe_store(i * top_k + j, weights.unsafe_load(i * top_k + j) / chosen)


struct _ExpertRows[a_type: DType, w_type: DType, tiled: Bool, packed: Bool](ChunkTask):
    """Item i: the i-th chosen expert's rows (its block of the pairs grouped by expert, from `start`): its tokens' rows
    of x gathered into one block and run through its gate_up, silu_and_mul and down on this thread, into those
    rows of expert_out [pairs, H]."""

    var expert_out: Addr[Self.a_type]
    var x: Addr[Self.a_type]
    var experts: _Experts[Self.w_type, Self.tiled, Self.packed]
    var order: Addr[DType.int32]
    var start: Addr[DType.int32]
    var chosen: Addr[DType.int32]
    var top_k: Int

    def __init__(out self, expert_out: Ptr[Self.a_type], x: Ptr[Self.a_type], experts: _Experts[Self.w_type, Self.tiled,
                 Self.packed], order: Ptr[DType.int32], start: Ptr[DType.int32], chosen: Ptr[DType.int32], top_k: Int):
        self.expert_out, self.x, self.experts = addr(expert_out), addr(x), experts
        self.order, self.start, self.chosen, self.top_k = addr(order), addr(start), addr(chosen), top_k

    def run(self, item: Int):
        var h, inter = self.experts.hidden, self.experts.inter
        var e = Int(ptr(self.chosen).unsafe_load(item))
        var first = Int(ptr(self.start).unsafe_load(e))
        var rows = Int(ptr(self.start).unsafe_load(e + 1)) - first
        var xe = List[Scalar[Self.a_type]](unsafe_uninit_length=rows * h)
        var gate_up = List[Scalar[Self.a_type]](unsafe_uninit_length=rows * 2 * inter)
        var act = List[Scalar[Self.a_type]](unsafe_uninit_length=rows * inter)
        for r in range(rows):
            var token = Int(ptr(self.order).unsafe_load(first + r)) // self.top_k
            convert_row(list_ptr(xe), r * h, ptr(self.x), token * h, h)
        var here = OnThisThread()
        self.experts.run[Self.a_type, OnThisThread, True](here, list_ptr(gate_up), list_ptr(xe), rows, e)
        silu_and_mul_cpu[Self.a_type](here, list_ptr(act), list_ptr(gate_up), rows, inter)
        self.experts.run[Self.a_type, OnThisThread, False](here, ptr(self.expert_out).unsafe_offset(first * h),
                                                              list_ptr(act), rows, e)


struct _WeightedSums[dtype: DType](ChunkTask):
    """Item t: y[t] = the sum of token t's rows of expert_out times their weights, in float32, its rows in the order
    they lie in expert_out (by expert, as transformers adds them up)."""

    var y: Addr[Self.dtype]
    var expert_out: Addr[Self.dtype]
    var rows: Addr[DType.int32]
    var weights: Addr[F32]
    var top_k: Int
    var h: Int

    def __init__(out self, y: Ptr[Self.dtype], expert_out: Ptr[Self.dtype], rows: Ptr[DType.int32], weights: Ptr[F32],
                 top_k: Int, h: Int):
        self.y, self.expert_out, self.rows, self.weights = addr(y), addr(expert_out), addr(rows), addr(weights)
        self.top_k, self.h = top_k, h

    def run(self, t: Int):
        var y, out, rows, weights = ptr(self.y), ptr(self.expert_out), ptr(self.rows), ptr(self.weights)
        var top_k, h = self.top_k, self.h

        def body[width: Int](i: Int) {var y, var out, var rows, var weights, var top_k, var h, var t}:
            var acc = SIMD[F32, width](0)
            for j in range(t * top_k, (t + 1) * top_k):
                var row = Int(rows.unsafe_load(j))
                acc = load_f32[Self.dtype, width](out, row * h + i).fma(weights.unsafe_load(row), acc)
            y.unsafe_store(t * h + i, narrow[Self.dtype, width](acc))

        vectorize[F32_WIDTH](h, body)


def moe_cpu[a_type: DType, w_type: DType, tiled: Bool, packed: Bool, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], logits: Ptr[a_type], experts: _Experts[w_type, tiled, packed], t: Int,
    e_count: Int, top_k: Int, normalize: Bool,
):
    if t == 0:
        return
    var pairs = t * top_k
    var ids = List[Int32](length=pairs, fill=0)
    var weights = List[Float32](length=pairs, fill=0)
    _route(logits, t, e_count, top_k, normalize, list_ptr(ids), list_ptr(weights))
    # the (token, slot) pairs grouped by expert: expert e's are order[start[e] : start[e + 1]]
    var start = List[Int32](length=e_count + 1, fill=0)
    for p in range(pairs):
        start[Int(ids[p]) + 1] += 1
    var chosen = List[Int32]()
    for e in range(e_count):
        if start[e + 1] > 0:
            chosen.append(Int32(e))
        start[e + 1] += start[e]
    var filled = List[Int](length=e_count, fill=0)
    var order = List[Int32](length=pairs, fill=0)
    for p in range(pairs):
        var e = Int(ids[p])
        order[Int(start[e]) + filled[e]] = Int32(p)
        filled[e] += 1
    # each token's rows of out (in expert order) and every row's weight
    var token_rows = List[Int32](length=pairs, fill=0)
    var row_weights = List[Float32](length=pairs, fill=0)
    var taken = List[Int](length=t, fill=0)
    for row in range(pairs):
        var p = Int(order[row])
        var token = p // top_k
        token_rows[token * top_k + taken[token]] = Int32(row)
        taken[token] += 1
        row_weights[row] = weights[p]
    # the experts, not their linears, are what the threads share: no join per linear, and the gathers and sums run
    # on every thread
    var out = List[Scalar[a_type]](unsafe_uninit_length=pairs * experts.hidden)
    runner.run(_ExpertRows[a_type, w_type, tiled, packed](list_ptr(out), x, experts, list_ptr(order), list_ptr(start),
                                                          list_ptr(chosen), top_k), len(chosen), False)
    runner.run(_WeightedSums[a_type](y, list_ptr(out), list_ptr(token_rows), list_ptr(row_weights), top_k,
                                     experts.hidden), t, pairs * experts.hidden <= SERIAL_ELEMENTS)
    _ = order^  # the tasks read them through pointers: kept alive until they are done
    _ = start^
    _ = chosen^
    _ = token_rows^
    _ = row_weights^
    _ = out^


def check_moe(t: Int, h: Int, y_t: Int, y_h: Int, logit_rows: Int, e_count: Int, gate_up_experts: Int,
              down_experts: Int, params: Int) raises:
    """params: the params tensor's length; check its values with check_moe_params."""
    check_same["moe"](y_t, t, "output rows", "x rows")
    check_same["moe"](y_h, h, "output columns", "x columns")
    check_same["moe"](logit_rows, t, "router logit rows", "x rows")
    check_same["moe"](gate_up_experts, e_count, "gate_up's experts", "router logit columns")
    check_same["moe"](down_experts, e_count, "down's experts", "router logit columns")
    check_same["moe"](params, MOE_PARAMS, "params", "6 (block_k, top_k, normalize, tiled, I, down's block_k)")


def check_moe_params(e_count: Int, top_k: Int, inter: Int) raises:
    if top_k < 1 or top_k > e_count:
        raise Error("moe: top_k must be in 1..", e_count, " (the experts), got ", top_k)
    if inter < 1:
        raise Error("moe: the experts' intermediate size must be positive, got ", inter)


def check_moe_sizes[scaled: Bool](h: Int, inter: Int, gate_up_block_k: Int, down_block_k: Int, gate_up_size: Int,
                                  gate_up_scale_size: Int, down_size: Int, down_scale_size: Int) raises:
    """An expert's elements in linear.mojo's formats ([N, K] or tiled: N * K), and its scales'."""
    check_same["moe"](gate_up_size, 2 * inter * h, "gate_up's elements per expert", "2 I x H")
    check_same["moe"](down_size, h * inter, "down's elements per expert", "H x I")
    comptime if scaled:
        _check_scale_sizes(h, inter, gate_up_block_k, down_block_k, gate_up_scale_size, down_scale_size)


def _check_scale_sizes(h: Int, inter: Int, gate_up_block_k: Int, down_block_k: Int, gate_up_scale_size: Int,
                       down_scale_size: Int) raises:
    """An expert's scales: a row per output and block of block_k inputs."""
    _check_block[1](gate_up_block_k)
    _check_block[1](down_block_k)
    check_same["moe"](gate_up_scale_size, 2 * inter * ceildiv(h, gate_up_block_k), "gate_up's scales per expert",
                      "2 I x ceil(H / block_k)")
    check_same["moe"](down_scale_size, h * ceildiv(inter, down_block_k), "down's scales per expert",
                      "H x ceil(I / down's block_k)")


def _check_block[rows: Int](block_k: Int) raises:
    if block_k <= 0:
        raise Error("moe: block_k must be positive, got ", block_k)
    if rows > 1 and block_k % GROUP != 0:
        raise Error("moe: a 4-bit expert's block_k must be a multiple of ", GROUP, ", got ", block_k)


def packed_bits(n: Int, k: Int, bytes: Int) raises -> Int:
    """The bits (4 or 6) of a packed weight [N, K] of `bytes` bytes (linear_int4.mojo's layout)."""
    var tiles = ceildiv(n, TILE_ROWS)
    var bits = tile_bits(k, bytes // tiles) if bytes % tiles == 0 else 0
    if bits != 0:
        return bits
    raise Error("moe: a packed expert [", n, ", ", k, "] has ", bytes, " bytes, neither 4 nor 6 bits of ",
                "bindings.reference.pack_int4")


def moe_dense_cpu[a_type: DType, w_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], logits: Ptr[a_type], gate_up: Ptr[w_type], gate_up_scales: Ptr[F32],
    down: Ptr[w_type], down_scales: Ptr[F32], t: Int, h: Int, e_count: Int, gate_up_size: Int, gate_up_scale_size: Int,
    down_size: Int, down_scale_size: Int, params: Ptr[DType.int32],
) raises:
    """mili_moe on a CPU (params: MOE_PARAMS), after check_moe."""
    var block_k, top_k, inter = Int(params.unsafe_load(0)), Int(params.unsafe_load(1)), Int(params.unsafe_load(4))
    var normalize, tiled = params.unsafe_load(2) != 0, params.unsafe_load(3) != 0
    var down_block_k = Int(params.unsafe_load(5))
    comptime scaled = w_type == DType.int8 or is_fp8[w_type]()
    check_moe_sizes[scaled](h, inter, block_k, down_block_k, gate_up_size, gate_up_scale_size, down_size,
                            down_scale_size)
    # dense weights have no scales (the graph passes one placeholder): no expert moves past it
    var gate_up_scales_apart, down_scales_apart = (gate_up_scale_size, down_scale_size) if scaled else (0, 0)
    comptime if not is_fp8[w_type]():
        if tiled:
            var experts = _Experts[w_type, True, False](
                gate_up, gate_up_scales, gate_up_scales, gate_up_scales, down, down_scales, down_scales, down_scales,
                gate_up_size, gate_up_scales_apart, down_size, down_scales_apart, h, inter, block_k, down_block_k,
                _DENSE, _DENSE,
            )
            moe_cpu(runner, y, x, logits, experts, t, e_count, top_k, normalize)
            return
    var experts = _Experts[w_type, False, False](
        gate_up, gate_up_scales, gate_up_scales, gate_up_scales, down, down_scales, down_scales, down_scales,
        gate_up_size, gate_up_scales_apart, down_size, down_scales_apart, h, inter, block_k, down_block_k, _DENSE,
        _DENSE,
    )
    moe_cpu(runner, y, x, logits, experts, t, e_count, top_k, normalize)


def moe_int4_cpu[a_type: DType, R: Runner](
    runner: R, y: Ptr[a_type], x: Ptr[a_type], logits: Ptr[a_type], gate_up: Ptr[DType.uint8],
    gate_up_scales: Ptr[DType.uint8], gate_up_mins: Ptr[DType.uint8], gate_up_supers: Ptr[F16], down: Ptr[DType.uint8],
    down_scales: Ptr[DType.uint8], down_mins: Ptr[DType.uint8], down_supers: Ptr[F16], t: Int, h: Int, e_count: Int,
    gate_up_size: Int, gate_up_scale_bytes: Int, down_size: Int, down_scale_bytes: Int, gate_up_min_bytes: Int,
    down_min_bytes: Int, gate_up_supers_size: Int, down_supers_size: Int, params: Ptr[DType.int32],
) raises:
    """mili_moe_int4 on a CPU (params: MOE_PARAMS, tiled unused), after check_moe; each expert's scales, mins (2
    bytes: one float16 min per scale) and multipliers (a [1, 1] placeholder unless its scales are codes)
    `*_bytes` / `*_size` apart."""
    var block_k, top_k, inter = Int(params.unsafe_load(0)), Int(params.unsafe_load(1)), Int(params.unsafe_load(4))
    var normalize, down_block_k = params.unsafe_load(2) != 0, Int(params.unsafe_load(5))
    _check_block[TILE_ROWS](block_k)
    _check_block[TILE_ROWS](down_block_k)
    var gate_up_int4 = _int4_stack["gate_up"](2 * inter, h, block_k, gate_up_size, gate_up_scale_bytes,
                                              gate_up_min_bytes, gate_up_supers_size)
    var down_int4 = _int4_stack["down"](h, inter, down_block_k, down_size, down_scale_bytes, down_min_bytes,
                                        down_supers_size)
    var experts = _Experts[DType.uint8, False, True](
        gate_up, gate_up_scales, gate_up_mins, gate_up_supers.unsafe_bitcast[UInt8](), down, down_scales, down_mins,
        down_supers.unsafe_bitcast[UInt8](), gate_up_size, gate_up_scale_bytes, down_size, down_scale_bytes, h, inter,
        block_k, down_block_k, gate_up_int4, down_int4,
    )
    moe_cpu(runner, y, x, logits, experts, t, e_count, top_k, normalize)


def _int4_stack[what: StaticString](n: Int, k: Int, block_k: Int, size: Int, scale_bytes: Int, min_bytes: Int,
                                    supers_size: Int) raises -> _Int4Stack:
    """An expert's 4-bit [n, k] weight of `size` bytes, its scales' and mins' bytes and its multipliers' elements
    checked, and the stack they make."""
    var tiles, k_blocks = ceildiv(n, TILE_ROWS), ceildiv(k, block_k)
    var codes = tiles * TILE_ROWS * k_blocks  # bytes of a code per row and block
    if scale_bytes != codes and scale_bytes != 2 * codes:
        raise Error("moe: ", what, "'s scales per expert are ", codes, " int8 codes or float16 values ([ceil(N / 32),",
                    " ceil(K / block_k), 32]), got ", scale_bytes, " bytes")
    if min_bytes != 2 and min_bytes != codes and min_bytes != 2 * codes:
        raise Error("moe: ", what, "'s mins per expert are ", codes, " int8 codes or float16 values, or one float16 ",
                    "min per scale, got ", min_bytes, " bytes")
    var form = int4_scales["moe"](scale_bytes // k_blocks // tiles, min_bytes // k_blocks // tiles, min_bytes,
                                  supers_size, tiles, k_blocks)
    return _Int4Stack(packed_bits(n, k, size), form, min_bytes, supers_size * 2 if form.coded else 0)


@register("mili_moe")
struct Moe:
    @staticmethod
    def execute[a_type: DType, w_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        logits: InputTensor[dtype=a_type, rank=2, ...],
        gate_up: InputTensor[dtype=w_type, rank=2, ...],
        gate_up_scales: InputTensor[dtype=DType.float32, rank=2, ...],
        down: InputTensor[dtype=w_type, rank=2, ...],
        down_scales: InputTensor[dtype=DType.float32, rank=2, ...],
        params: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime if target == "cpu":
            var t, h, e_count = x.dim_size[0](), x.dim_size[1](), logits.dim_size[1]()
            var p = params.unsafe_ptr()
            check_moe(t, h, y.dim_size[0](), y.dim_size[1](), logits.dim_size[0](), e_count, gate_up.dim_size[0](),
                      down.dim_size[0](), params.dim_size[0]())
            check_moe_params(e_count, Int(p.unsafe_load(1)), Int(p.unsafe_load(4)))
            moe_dense_cpu[a_type, w_type](
                MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), logits.unsafe_ptr(), gate_up.unsafe_ptr(),
                gate_up_scales.unsafe_ptr(), down.unsafe_ptr(), down_scales.unsafe_ptr(), t, h, e_count,
                gate_up.dim_size[1](), gate_up_scales.dim_size[1](), down.dim_size[1](), down_scales.dim_size[1](), p,
            )
        else:
            raise Error("moe: the mixture-of-experts kernels are CPU only so far")


@register("mili_moe_int4")
struct MoeInt4:
    @staticmethod
    def execute[a_type: DType, //, target: StaticString](
        y: OutputTensor[dtype=a_type, rank=2, ...],
        x: InputTensor[dtype=a_type, rank=2, ...],
        logits: InputTensor[dtype=a_type, rank=2, ...],
        gate_up: InputTensor[dtype=DType.uint8, rank=2, ...],
        gate_up_scales: InputTensor[dtype=DType.uint8, rank=2, ...],
        gate_up_mins: InputTensor[dtype=DType.uint8, rank=2, ...],
        gate_up_supers: InputTensor[dtype=DType.float16, rank=2, ...],
        down: InputTensor[dtype=DType.uint8, rank=2, ...],
        down_scales: InputTensor[dtype=DType.uint8, rank=2, ...],
        down_mins: InputTensor[dtype=DType.uint8, rank=2, ...],
        down_supers: InputTensor[dtype=DType.float16, rank=2, ...],
        params: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        comptime if target == "cpu":
            var t, h, e_count = x.dim_size[0](), x.dim_size[1](), logits.dim_size[1]()
            var p = params.unsafe_ptr()
            check_moe(t, h, y.dim_size[0](), y.dim_size[1](), logits.dim_size[0](), e_count, gate_up.dim_size[0](),
                      down.dim_size[0](), params.dim_size[0]())
            check_moe_params(e_count, Int(p.unsafe_load(1)), Int(p.unsafe_load(4)))
            moe_int4_cpu[a_type](
                MojoThreads(ctx), y.unsafe_ptr(), x.unsafe_ptr(), logits.unsafe_ptr(), gate_up.unsafe_ptr(),
                gate_up_scales.unsafe_ptr(), gate_up_mins.unsafe_ptr(), gate_up_supers.unsafe_ptr(), down.unsafe_ptr(),
                down_scales.unsafe_ptr(), down_mins.unsafe_ptr(), down_supers.unsafe_ptr(), t, h, e_count,
                gate_up.dim_size[1](), gate_up_scales.dim_size[1](), down.dim_size[1](), down_scales.dim_size[1](),
                gate_up_mins.dim_size[1](), down_mins.dim_size[1](), gate_up_supers.dim_size[1](),
                down_supers.dim_size[1](), p,
            )
        else:
            raise Error("moe: the mixture-of-experts kernels are CPU only so far")
