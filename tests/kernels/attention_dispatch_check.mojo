# Which GPU attention kernel takes a batch, run on a CPU (tests/kernels/test_gpu_kernel_helpers.py): the split-KV
# decode kernel only a decode batch (as many tokens as sequences) of a shape it holds, from qkv only rows of 2 lanes
# or more; the tensor-core prefill kernel only a batch with a longer sequence, bfloat16, head_dim 64 or 128. Built
# with --target-accelerator sm_90, as MAX builds a graph's host code for an H100.
from mojo_kernels.core.attention.gpu_decode import decode_supported
from mojo_kernels.core.attention.gpu_prefill import prefill_supported

comptime BF16 = DType.bfloat16


def expect(found: Bool, wanted: Bool, what: String) raises:
    if found != wanted:
        raise Error(what, ": ", found, ", expected ", wanted)


def main() raises:
    for group in [1, 2, 4, 5, 8]:
        expect(decode_supported[BF16](3, 3, 128, group), True, String("decode, group ", group))
        expect(decode_supported[BF16](4, 3, 128, group), False, String("a prefill to decode, group ", group))
    expect(decode_supported[BF16](1, 1, 128, 16), False, "decode, 16 query heads a KV head")
    expect(decode_supported[BF16](1, 1, 128, 3), False, "decode, 3 query heads a KV head (no kernel built)")
    # prefill takes no head count: any grouping
    expect(prefill_supported[BF16, BF16](4, 3, 128), True, "prefill")
    expect(prefill_supported[BF16, BF16](3, 3, 128), False, "a decode to prefill")
    expect(decode_supported[BF16](1, 1, 44, 2), False, "decode, head_dim 44 (not 16-byte lanes)")
    expect(decode_supported[BF16](1, 1, 512, 2), False, "decode, head_dim 512 (over a warp of lanes)")
    expect(decode_supported[BF16](1, 1, 8, 2), True, "decode, head_dim 8 (a lane a row)")
    expect(decode_supported[BF16](1, 1, 8, 2, from_qkv=True), False, "decode from qkv, a lane a row")
    expect(decode_supported[BF16](1, 1, 16, 2, from_qkv=True), True, "decode from qkv, two lanes a row")
    expect(decode_supported[DType.float32](1, 1, 8, 2, from_qkv=True), True, "decode from qkv, float32, two lanes")
    expect(prefill_supported[DType.float32, DType.float32](4, 3, 128), False, "prefill, float32")
    expect(prefill_supported[DType.float32, BF16](4, 3, 128), False, "prefill, float32 over bfloat16 caches")
    expect(prefill_supported[BF16, BF16](4, 3, 96), False, "prefill, head_dim 96")
    print("ok: attention dispatch")
