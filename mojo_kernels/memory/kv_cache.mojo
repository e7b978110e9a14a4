# store_kv: write the new tokens' K and V rows [T, Hkv, D] into the paged caches [pages, page_size, Hkv, D]
# in place, token t at slot slot_mapping[t] = page * page_size + offset (a negative slot is skipped).
from extensibility import register, InputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx
from std.algorithm import vectorize

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, Addr, F32_WIDTH, Ptr, GPU_BLOCK, SERIAL_ELEMENTS, check_same


struct _StoreTokens[dtype: DType](ChunkTask):
    var k_cache: Addr[Self.dtype]
    var v_cache: Addr[Self.dtype]
    var k: Addr[Self.dtype]
    var v: Addr[Self.dtype]
    var slots: Addr[DType.int32]
    var row: Int

    def __init__(out self, k_cache: Ptr[Self.dtype], v_cache: Ptr[Self.dtype], k: Ptr[Self.dtype], v: Ptr[Self.dtype],
                 slots: Ptr[DType.int32], row: Int):
        self.k_cache, self.v_cache, self.k, self.v, self.slots = addr(k_cache), addr(v_cache), addr(k), addr(v), addr(slots)
        self.row = row

    def run(self, t: Int):
        var slot = Int(self.slots.unsafe_load(t))
        if slot < 0:
            return
        var k_cache, v_cache, k, v = ptr(self.k_cache), ptr(self.v_cache), ptr(self.k), ptr(self.v)
        var src = t * self.row
        var dst = slot * self.row

        def copy[width: Int](i: Int) {var k_cache, var v_cache, var k, var v, var src, var dst}:
            k_cache.unsafe_store(dst + i, k.unsafe_load[width=width](src + i))
            v_cache.unsafe_store(dst + i, v.unsafe_load[width=width](src + i))

        vectorize[F32_WIDTH](self.row, copy)


def store_kv_cpu[dtype: DType, R: Runner](
    runner: R, k_cache: Ptr[dtype], v_cache: Ptr[dtype], k: Ptr[dtype], v: Ptr[dtype], slots: Ptr[DType.int32],
    tokens: Int, row: Int,
):
    runner.run(_StoreTokens[dtype](k_cache, v_cache, k, v, slots, row), tokens, tokens * row <= SERIAL_ELEMENTS)


def _store_gpu[dtype: DType](
    k_cache: Ptr[dtype], v_cache: Ptr[dtype], k: Ptr[dtype], v: Ptr[dtype], slots: Ptr[DType.int32], row: Int32
):
    var t = Int(block_idx.x)
    var slot = Int(slots.unsafe_load(t))
    if slot < 0:
        return
    var n = Int(row)
    for i in range(Int(thread_idx.x), n, GPU_BLOCK):
        k_cache.unsafe_store(slot * n + i, k.unsafe_load(t * n + i))
        v_cache.unsafe_store(slot * n + i, v.unsafe_load(t * n + i))


def check_store_kv(tokens: Int, row: Int, cache_row: Int, k_size: Int, v_size: Int, num_slots: Int) raises:
    check_same["store_kv"](cache_row, row, "cache heads * head_dim", "k heads * head_dim")
    check_same["store_kv"](v_size, k_size, "v size", "k size")
    check_same["store_kv"](num_slots, tokens, "slot_mapping size", "tokens")


@register("mili_store_kv")
struct StoreKV:
    @staticmethod
    def execute[dtype: DType, //, target: StaticString](
        k_cache: MutableInputTensor[dtype=dtype, rank=4, ...],
        v_cache: MutableInputTensor[dtype=dtype, rank=4, ...],
        k: InputTensor[dtype=dtype, rank=3, ...],
        v: InputTensor[dtype=dtype, rank=3, ...],
        slot_mapping: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens = k.dim_size[0]()
        var row = k.dim_size[1]() * k.dim_size[2]()
        check_store_kv(tokens, row, k_cache.dim_size[2]() * k_cache.dim_size[3](), k.size(), v.size(), slot_mapping.dim_size[0]())
        if tokens == 0:
            return
        comptime if target == "cpu":
            store_kv_cpu[dtype](MojoThreads(ctx), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), k.unsafe_ptr(), v.unsafe_ptr(),
                              slot_mapping.unsafe_ptr(), tokens, row)
        else:
            ctx.enqueue_function[_store_gpu[dtype]](
                k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), k.unsafe_ptr(), v.unsafe_ptr(), slot_mapping.unsafe_ptr(),
                Int32(row), grid_dim=tokens, block_dim=GPU_BLOCK,
            )
