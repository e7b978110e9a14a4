# store_kv: write the new tokens' K and V rows [T, Hkv, D] into the paged caches [pages, page_size, Hkv, D]
# in place, token t at slot slot_mapping[t] = page * page_size + offset (a negative slot is skipped). The caches
# may hold another dtype than K and V (a bfloat16 cache under float32 activations, an 8-bit one): the rows are
# rounded to it (kv_format.mojo).
from extensibility import register, InputTensor
from extensibility import _MutableInputTensor as MutableInputTensor
from max.gpu.host import DeviceContext
from max.gpu import thread_idx, block_idx

from ..utils.parallel import ChunkTask, MojoThreads, Runner
from ..utils.types import addr, ptr, Addr, Ptr, GPU_BLOCK, SERIAL_ELEMENTS, check_same
from .kv_format import is_8bit_kv, kv_head_dim, kv_head_len, store_kv_heads


struct _StoreTokens[dtype: DType, cache_type: DType](ChunkTask):
    var k_cache: Addr[Self.cache_type]
    var v_cache: Addr[Self.cache_type]
    var k: Addr[Self.dtype]
    var v: Addr[Self.dtype]
    var slots: Addr[DType.int32]
    var heads: Int
    var head_dim: Int

    def __init__(out self, k_cache: Ptr[Self.cache_type], v_cache: Ptr[Self.cache_type], k: Ptr[Self.dtype],
                 v: Ptr[Self.dtype], slots: Ptr[DType.int32], heads: Int, head_dim: Int):
        self.k_cache, self.v_cache, self.k, self.v, self.slots = addr(k_cache), addr(v_cache), addr(k), addr(v), addr(slots)
        self.heads, self.head_dim = heads, head_dim

    def run(self, t: Int):
        var slot = Int(self.slots.unsafe_load(t))
        if slot < 0:
            return
        var at, src = slot * self.heads * kv_head_len[Self.cache_type](self.head_dim), t * self.heads * self.head_dim
        store_kv_heads(ptr(self.k_cache), at, ptr(self.k), src, self.heads, self.head_dim)
        store_kv_heads(ptr(self.v_cache), at, ptr(self.v), src, self.heads, self.head_dim)


def store_kv_cpu[dtype: DType, cache_type: DType, R: Runner](
    runner: R, k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], k: Ptr[dtype], v: Ptr[dtype],
    slots: Ptr[DType.int32], tokens: Int, heads: Int, head_dim: Int,
):
    var task = _StoreTokens[dtype, cache_type](k_cache, v_cache, k, v, slots, heads, head_dim)
    runner.run(task, tokens, tokens * heads * head_dim <= SERIAL_ELEMENTS)


def _store_gpu[dtype: DType, cache_type: DType](
    k_cache: Ptr[cache_type], v_cache: Ptr[cache_type], k: Ptr[dtype], v: Ptr[dtype], slots: Ptr[DType.int32], row: Int32
):
    var t = Int(block_idx.x)
    var slot = Int(slots.unsafe_load(t))
    if slot < 0:
        return
    var n = Int(row)
    for i in range(Int(thread_idx.x), n, GPU_BLOCK):
        k_cache.unsafe_store(slot * n + i, k.unsafe_load(t * n + i).cast[cache_type]())
        v_cache.unsafe_store(slot * n + i, v.unsafe_load(t * n + i).cast[cache_type]())


def check_store_kv[cache_type: DType](tokens: Int, heads: Int, head_dim: Int, cache_heads: Int, cache_head_len: Int,
                                      k_size: Int, v_size: Int, num_slots: Int) raises:
    check_same["store_kv"](cache_heads, heads, "cache heads", "k heads")
    check_same["store_kv"](kv_head_dim[cache_type](cache_head_len), head_dim, "cache head_dim", "k head_dim")
    check_same["store_kv"](v_size, k_size, "v size", "k size")
    check_same["store_kv"](num_slots, tokens, "slot_mapping size", "tokens")


@register("mili_store_kv")
struct StoreKV:
    @staticmethod
    def execute[dtype: DType, cache_type: DType, //, target: StaticString](
        k_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        v_cache: MutableInputTensor[dtype=cache_type, rank=4, ...],
        k: InputTensor[dtype=dtype, rank=3, ...],
        v: InputTensor[dtype=dtype, rank=3, ...],
        slot_mapping: InputTensor[dtype=DType.int32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var tokens, heads, head_dim = k.dim_size[0](), k.dim_size[1](), k.dim_size[2]()
        check_store_kv[cache_type](tokens, heads, head_dim, k_cache.dim_size[2](), k_cache.dim_size[3](), k.size(),
                                   v.size(), slot_mapping.dim_size[0]())
        if tokens == 0:
            return
        comptime if target == "cpu":
            store_kv_cpu[dtype, cache_type](MojoThreads(ctx), k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), k.unsafe_ptr(), v.unsafe_ptr(),
                              slot_mapping.unsafe_ptr(), tokens, heads, head_dim)
        elif is_8bit_kv[cache_type]():
            raise Error("store_kv: 8-bit KV caches are CPU only")
        else:
            var row = heads * head_dim
            ctx.enqueue_function[_store_gpu[dtype, cache_type]](
                k_cache.unsafe_ptr(), v_cache.unsafe_ptr(), k.unsafe_ptr(), v.unsafe_ptr(), slot_mapping.unsafe_ptr(),
                Int32(row), grid_dim=tokens, block_dim=GPU_BLOCK,
            )
