"""Every Mojo op on CPU against its PyTorch reference (bindings/reference.py)."""

import subprocess
import sys
import time

import pytest
import torch

from bindings import gpu_compile_check
from bindings import reference as ref
from tests.attention_cases import attention_case
from tests.kernel_cases import eight_bit_kv_case, kernel_cases, run_attention, seed_case

ops = pytest.importorskip("bindings.ops", reason="MAX is not installed")
from max.dtype import DType

_OWN_GRAPHS = ops.CompiledOp.compiled
_LOADED_TOGETHER: set[torch.dtype] = set()


@pytest.fixture(autouse=True)
def cpu_graphs_together(monkeypatch) -> None:
    """The first CPU graph call of a dtype compiles the CPU graphs of every op in that dtype in one MAX module
    (CompiledOp.load_together: a compile costs ~30 s whatever it holds)."""
    def compiled(op, dtype: torch.dtype, device: str, options=ops.GPU_OPTIONS):
        if device == "cpu" and dtype not in _LOADED_TOGETHER:
            # once, failed or not: after a failed module each op compiles its own graph and says why
            _LOADED_TOGETHER.add(dtype)
            twin = ops._kv_variant(DType.bfloat16)  # under bfloat16 activations the caches' bfloat16 twins are unused
            used = [o for o in ops.ALL_OPS if not (dtype == torch.bfloat16 and o.variant == twin)]
            ops.CompiledOp.load_together(used, dtype, device, options)
        return _OWN_GRAPHS(op, dtype, device, options)
    monkeypatch.setattr(ops.CompiledOp, "compiled", compiled)


@pytest.fixture(params=["eager", "graph"])
def cpu_path(request, monkeypatch) -> str:
    """Run a test through both CPU paths of bindings.ops: the Mojo extension module and MAX graphs."""
    monkeypatch.setattr(ops, "EAGER_CPU", request.param == "eager")
    return request.param


def cpu_cases() -> list:
    """kernel_cases() through both CPU paths of bindings.ops: the Mojo extension module (eager) and MAX graphs. The
    graphs of a dtype compile together (cpu_graphs_together, ~130 s for bfloat16's on a 2-core Zen 3), in the one
    xdist worker that runs them all (their group replaces the op's: xdist joins an item's groups into one name). The
    graphs run bfloat16's cases alone by default (its caches bfloat16 too; every weight dtype): the registration code
    they test is the same in every dtype, and the eager path runs each dtype's kernels (the model graphs over 8-bit
    caches: tests/integration/test_weight_formats.py). `pytest -m slow` runs the other dtypes' graphs too."""
    cases = []
    for c in kernel_cases():
        cases.append(pytest.param("eager", *c.values, id=f"eager-{c.id}", marks=c.marks))
        # the graphs of 8-bit caches and of mili_moe run in the model tests (test_weight_formats.py, test_moe.py)
        fast = c.values[1] == torch.bfloat16 and not eight_bit_kv_case(c) and not c.id.startswith("moe-")
        slow = [] if fast else [pytest.mark.slow]
        marks = [m for m in c.marks if m.name != "xdist_group"]  # the op's group gives way to the graphs' one
        cases.append(pytest.param("graph", *c.values, id=f"graph-{c.id}",
                                  marks=[*marks, pytest.mark.xdist_group("cpu_op_graphs"), *slow]))
    return cases


@pytest.mark.parametrize("cpu_path, runner, dtype, case", cpu_cases(), indirect=["cpu_path"])
def test_op_matches_reference(cpu_path: str, runner, dtype: torch.dtype, case) -> None:
    seed_case(case)
    runner(ops, "cpu", dtype, case)


PARALLEL_CASES = [c for c in kernel_cases() if c.id.split("-")[-1] in ("(3000, 1000)", "(2048, 3072)", "81923", "2000")
                  or c.id.startswith(("rope-float32-(2048", "head_norm-bfloat16-(2048"))]


@pytest.mark.parametrize("threads", ["mojo", "one"])
@pytest.mark.parametrize("runner, dtype, case", PARALLEL_CASES)
def test_eager_threads(threads: str, runner, dtype: torch.dtype, case, monkeypatch) -> None:
    """The extension module's kernels big enough to run in parallel, on Mojo's threads (no OpenMP runtime
    found: OpenMP entry points 0) and on an OpenMP team of one thread (torch.set_num_threads(1))."""
    assert ops._OPENMP != 0, "torch's OpenMP runtime was not found"
    monkeypatch.setattr(ops, "EAGER_CPU", True)
    if threads == "mojo":
        monkeypatch.setattr(ops, "_OPENMP", 0)
    before = torch.get_num_threads()
    torch.set_num_threads(1 if threads == "one" else before)
    try:
        seed_case(case)
        runner(ops, "cpu", dtype, case)
    finally:
        torch.set_num_threads(before)


def test_eager_calls_let_other_threads_run(monkeypatch) -> None:
    """A long kernel runs without the GIL (as torch's ops): the main thread keeps running Python meanwhile."""
    import threading

    monkeypatch.setattr(ops, "EAGER_CPU", True)
    q, kc, vc, table, lens, starts, _ = attention_case([1500], [1500], 8, 8, 64, torch.float32)
    call = lambda: ops.paged_attention(q, kc, vc, table, lens, starts, 0.125)
    call()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    worker = threading.Thread(target=call)
    ticks, last, longest_gap = 0, time.perf_counter(), 0.0
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        ticks, longest_gap, last = ticks + 1, max(longest_gap, now - last), now
    worker.join()
    # holding the GIL would stop this loop for the whole call
    assert longest_gap < seconds / 2, (longest_gap, seconds, ticks)


def test_eager_calls_check_their_arguments() -> None:
    kernel = ops._ELEMENTWISE["relu"].eager_kernel(torch.float32, True)
    x = torch.randn(1, 8)
    with pytest.raises(ValueError, match="expected more than 6 arguments"):
        kernel(ops._OPENMP, x.data_ptr(), 1, 8, x.data_ptr(), 1)
    with pytest.raises(ValueError, match="expected 7 arguments, got 8"):
        kernel(ops._OPENMP, x.data_ptr(), 1, 8, x.data_ptr(), 1, 8, 0)
    with pytest.raises(TypeError, match="integer"):
        kernel(ops._OPENMP, x.data_ptr(), 1, 8, x.data_ptr(), 1, "8")


def _loaded_graphs() -> int:
    return sum(len(op._compiled) for op in ops.ALL_OPS)


def test_eager_cpu_calls_compile_nothing() -> None:
    before = _loaded_graphs()
    ops.head_rms_norm(torch.randn(2, 4, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16), 1e-6)
    run_attention(ops, "cpu", torch.float32, (([20, 3], [20, 1]), (4, 2, 64), torch.float32))
    assert _loaded_graphs() == before


def test_new_sizes_do_not_recompile(monkeypatch) -> None:
    """Symbolic dims: new token / sequence / page counts reuse the one compiled graph per dtype and device (bfloat16:
    the graphs test_op_matches_reference compiles)."""
    monkeypatch.setattr(ops, "EAGER_CPU", False)
    bf16 = torch.bfloat16
    ops.rms_norm(torch.randn(3, 64, dtype=bf16), torch.ones(64, dtype=bf16), 1e-6)
    run_attention(ops, "cpu", bf16, (([20], [20]), (4, 2, 64), bf16))
    before = _loaded_graphs()
    start = time.perf_counter()
    for tokens in (1, 17, 555):
        ops.rms_norm(torch.randn(tokens, 96, dtype=bf16), torch.ones(96, dtype=bf16), 1e-6)
    run_attention(ops, "cpu", bf16, (([300, 5, 70], [1, 5, 70]), (4, 2, 64), bf16))
    assert _loaded_graphs() == before
    assert time.perf_counter() - start < 5, "a call with new sizes took compile time"


def test_bad_inputs_are_rejected(cpu_path: str) -> None:
    # The calls that reach a kernel are bfloat16 (on the graph path, graphs test_op_matches_reference compiles).
    # MAX graphs reject the mismatch at their symbolic dims already, the extension module in the kernel's check
    bf16 = torch.bfloat16
    with pytest.raises(ValueError, match="weight size \\(63\\) must equal hidden size \\(64\\)|dimension 'H'"):
        ops.rms_norm(torch.randn(2, 64, dtype=bf16), torch.ones(63, dtype=bf16), 1e-6)
    with pytest.raises(ValueError, match="3 queries but a context of only 2 tokens"):
        kc = torch.zeros(2, 16, 1, 16, dtype=bf16)
        ops.paged_attention(torch.randn(3, 2, 16, dtype=bf16), kc, kc, torch.zeros(1, 2, dtype=torch.int32),
                            torch.tensor([2], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), 0.25)
    f32_caches_under_bf16 = "torch.float32 caches under torch.bfloat16 activations on cpu are not supported"
    kc16, table = torch.zeros(1, 16, 1, 16), torch.zeros(1, 1, dtype=torch.int32)
    lens, starts = torch.tensor([1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=f32_caches_under_bf16):
        ops.paged_attention(torch.randn(1, 2, 16, dtype=torch.bfloat16), kc16, kc16, table, lens, starts, 0.25)
    with pytest.raises(ValueError, match="cache head_dim \\(12\\) must equal q head_dim \\(16\\)"):  # int8: D + 4
        ops.paged_attention(torch.randn(1, 2, 16, dtype=bf16), kc16.to(torch.int8), kc16.to(torch.int8), table, lens,
                            starts, 0.25)
    with pytest.raises(ValueError, match="K and V caches must have one dtype"):
        ops.paged_attention(torch.randn(1, 2, 16), kc16, kc16.bfloat16(), table, lens, starts, 0.25)
    with pytest.raises(ValueError, match="head_rms_norm: needs \\(3-d torch.float32"):
        ops.head_rms_norm(torch.randn(2, 64), torch.ones(64), 1e-6)  # [T, heads, D] expected
    with pytest.raises(ValueError, match="got \\(2-d torch.float32 on cpu, 2-d torch.float64"):
        ops._ELEMENTWISE["gelu"](torch.empty(1, 4), torch.randn(1, 4, dtype=torch.float64))  # x must have y's dtype
    with pytest.raises(TypeError, match="int32"):
        ops.rope(torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.tensor([0, 1]), 1e4)
    with pytest.raises(IndexError, match="outside the cache"):
        ops.store_kv(torch.randn(1, 1, 8), torch.randn(1, 1, 8), torch.zeros(1, 16, 1, 8), torch.zeros(1, 16, 1, 8),
                     torch.tensor([16], dtype=torch.int32))
    with pytest.raises(ValueError, match=f32_caches_under_bf16):
        ops.store_kv(torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(1, 1, 8, dtype=torch.bfloat16),
                     torch.zeros(1, 16, 1, 8), torch.zeros(1, 16, 1, 8), torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="k and v must have one dtype"):
        ops.store_kv(torch.randn(1, 1, 8), torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.zeros(1, 16, 1, 8),
                     torch.zeros(1, 16, 1, 8), torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="even"):
        ops.silu_and_mul(torch.randn(2, 5))
    with pytest.raises(
        ValueError, match="weight's in_features \\(40\\) must equal x's last dimension \\(32\\)|dimension 'K'"
    ):
        ops.linear(torch.randn(2, 32, dtype=bf16), torch.randn(8, 40, dtype=bf16))
    int8 = torch.ones(8, 200, dtype=torch.int8)
    with pytest.raises(ValueError, match="scales must be \\(8, 2\\)"):
        ops.linear(torch.randn(2, 200), int8, torch.ones(8, 1), 128)
    with pytest.raises(ValueError, match="need scales and a positive block_k"):
        ops.linear(torch.randn(2, 200), int8)
    with pytest.raises(ValueError, match="weights must be one of"):
        ops.linear(torch.randn(2, 200), torch.ones(8, 200, dtype=torch.float16))
    with pytest.raises(
        ValueError, match="bfloat16 weights must be tiled \\[N / 4, K / 32, 4, 32\\] or pair panels "
                          "\\[N / 32, K / 2, 32, 2\\], got tiles of \\[4, 8\\]|dimension"
    ):
        ops.linear(torch.randn(2, 32, dtype=bf16), torch.ones(2, 4, 4, 8, dtype=bf16))
    with pytest.raises(ValueError, match="tiled weights are float32 / bfloat16 / int8 on a CPU"):
        ops.linear(torch.randn(2, 128), torch.ones(2, 2, 4, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="int8 weights must be tiled \\[N / 32, K / 4, 32, 4\\], got tiles of \\[4, "):
        ops.linear(torch.randn(2, 128, dtype=bf16), torch.ones(8, 2, 4, 64, dtype=torch.int8), torch.ones(1, 32), 128)
    tiled_int8 = torch.ones(1, 32, 32, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="scales must be \\(2, 32\\) for a tiled \\(32, 128\\) weight"):
        ops.linear(torch.randn(2, 128, dtype=bf16), tiled_int8, torch.ones(32, 2), 64)
    with pytest.raises(ValueError, match="block_k \\(30\\) must be a multiple of the tiles' 4 columns"):
        ops.linear(torch.randn(2, 128, dtype=bf16), tiled_int8, torch.ones(5, 32), 30)
    with pytest.raises(ValueError, match="N a multiple of 4 and K of 32, got torch.bfloat16 \\(6, 64\\)"):
        ref.tile_weight(torch.ones(6, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="N a multiple of 32 and K of 4, got torch.int8 \\(4, 64\\)"):
        ref.tile_weight(torch.ones(4, 64, dtype=torch.int8))
    packed = torch.zeros(1, 3200, dtype=torch.uint8)  # 4 bits: up to 32 rows, K 193..200
    h = lambda *shape: torch.ones(*shape, dtype=torch.float16)
    x = torch.randn(2, 200, dtype=bf16)
    with pytest.raises(ValueError, match="scales and mins are float16, or int8 codes .*, got torch.float32"):
        ops.linear_int4(x, packed, torch.ones(1, 2, 32), torch.ones(1, 2, 32), 128, 8)
    with pytest.raises(ValueError, match="scales and mins are tiled \\[ceil\\(N / 32\\), blocks, 32\\]"):
        ops.linear_int4(x, packed, h(2, 8), h(2, 8), 128, 8)
    with pytest.raises(ValueError, match="block_k must be a positive multiple of 8, got 60"):
        ops.linear_int4(x, packed, h(1, 4, 32), h(1, 4, 32), 60, 8)
    with pytest.raises(ValueError,
                       match="bytes per tile \\(3200\\) must equal 128 \\(4 bits\\) or 192 \\(6 bits\\) per 8"):
        ops.linear_int4(torch.randn(2, 100, dtype=bf16), packed, h(1, 1, 32), h(1, 1, 32), 128, 8)
    with pytest.raises(ValueError, match="tiles \\(1\\) must equal ceil\\(output columns / 32\\) \\(2\\)"):
        ops.linear_int4(x, packed, h(1, 2, 32), h(1, 2, 32), 128, 40)
    with pytest.raises(ValueError, match="scale blocks \\(3\\) must equal ceil\\(in_features / block_k\\) \\(2\\)"):
        ops.linear_int4(x, packed, h(1, 3, 32), h(1, 3, 32), 128, 8)
    with pytest.raises(ValueError, match="min blocks \\(1\\) must equal scale blocks \\(2\\)"):
        ops.linear_int4(x, packed, h(1, 2, 32), h(1, 1, 32), 128, 8)
    codes = torch.ones(1, 2, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="multipliers of int8 scale codes are \\[ceil\\(N / 32\\), super-blocks "
                                         "\\(1 to 2\\), 2, 32\\] float16 .*, got 1 values for 1 tiles"):
        ops.linear_int4(x, packed, codes, codes, 128, 8)
    with pytest.raises(ValueError, match="int8 scale codes take int8 min codes or one float16 min per scale, not"):
        ops.linear_int4(x, packed, codes, h(1, 2, 32), 128, 8, h(1, 1, 2, 32))
    with pytest.raises(ValueError, match="float16 scales take float16 mins, not int8 codes"):
        ops.linear_int4(x, packed, h(1, 2, 32), codes, 128, 8)
    with pytest.raises(ValueError, match="packed weights are uint8"):
        ops.linear_int4(x, packed.to(torch.int8), h(1, 2, 32), h(1, 2, 32), 128, 8)
    if cpu_path == "graph":  # mili_moe's graphs compile in the model tests (test_moe.py); its checks are shared
        return
    x, logits = torch.randn(3, 64), torch.randn(3, 5)
    gate_up, down = (torch.randn(5, 80, 64),), (torch.randn(5, 64, 40),)
    with pytest.raises(ValueError, match="top_k must be in 1..5"):
        ops.moe(x, logits, 6, True, 40, gate_up, down)
    with pytest.raises(ValueError, match="gate_up's elements per expert \\(5120\\) must equal 2 I x H \\(4096\\)"):
        ops.moe(x, logits, 2, True, 32, gate_up, down)
    with pytest.raises(ValueError, match="gate_up's experts \\(4\\) must equal router logit columns \\(5\\)"):
        ops.moe(x, logits, 2, True, 40, (gate_up[0][:4],), down)
    with pytest.raises(ValueError, match="both tiled or both"):
        ops.moe(x, logits, 2, True, 40, (torch.ones(5, 20, 2, 4, 32, dtype=torch.bfloat16),), down)
    packed = lambda n, k, block: (torch.stack([ref.pack_int4(torch.zeros(n, k, dtype=torch.uint8))] * 5),
                                  *[torch.stack([ref.tile_int4_scales(torch.ones(-(-k // block), n).half())] * 5)] * 2)
    with pytest.raises(ValueError, match="a 4-bit expert's block_k must be a multiple of 8, got 12"):
        ops.moe(x, logits, 2, True, 40, packed(80, 64, 32), packed(64, 40, 12), 32, 12)
    gate_up_mins_of_another_size = (*packed(80, 64, 32)[:2], torch.ones(5, 1, 1, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="gate_up's mins per expert are 192 int8 codes or float16 values, or one "
                                         "float16 min per scale, got 64 bytes"):
        ops.moe(x, logits, 2, True, 40, gate_up_mins_of_another_size, packed(64, 40, 40), 32, 40)


def test_gpu_compile_check_passes() -> None:
    """Every op's GPU path compiles for cuda/sm_90 in MAX's virtual-device mode (no GPU needed): compiled here, or
    recorded as passed for these very sources (by build.sh)."""
    result = subprocess.run([sys.executable, "-m", "bindings.gpu_compile_check", "sm_90"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ops compiled") == 2 or "every op compiled before at these sources" in result.stdout
    assert gpu_compile_check.passed_stamp("sm_90").is_file()


def test_flash_attention_op_is_the_cpu_kernel_on_a_cpu(monkeypatch) -> None:
    """The op mili_paged_attention_flash differs on GPUs only (the split-KV decode and FlashAttention-2 kernels): a
    model graph built with it (the default) runs the same CPU kernel as one built without."""
    monkeypatch.setattr(ops, "EAGER_CPU", False)
    bf16 = torch.bfloat16  # the dtype whose graphs the default run compiles
    q, kc, vc, table, lens, starts, expected = attention_case([300, 40, 7], [1, 1, 7], 16, 8, 128, bf16)
    out = torch.empty_like(q)
    ops._PAGED_ATTENTION_FLASH[ops.SAME](out, q, kc, vc, table, lens, starts, ops._scalar(128**-0.5, q))
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_over_scores_far_apart(dtype: torch.dtype) -> None:
    """Scores spread over tens of units, growing along the keys: each row's running max moves past the slack of
    the AMX tiles' softmax (cpu_amx.MAX_SLACK) again and again, so its accumulator is rescaled, on tiles of every
    path (a long prefill, a short one, ragged GQA rows). q, keys and a power-of-two scale that bfloat16 holds
    exactly: the scores are exact, only the weights' rounding to bfloat16 remains."""
    bf16 = torch.bfloat16
    for context, heads in (([620, 37], (16, 8, 128)), ([90], (10, 2, 64))):
        q, kc, vc, table, lens, starts, _ = attention_case(context, context, *heads, bf16)
        keys = ref.from_kv_cache(kc, heads[2])
        growing = torch.arange(1, keys.shape[0] * keys.shape[1] + 1).view(keys.shape[:2] + (1, 1)).float().sqrt()
        kc = ref.to_kv_cache(keys * growing.to(bf16).float(), bf16)
        q = (q.float() * 4).to(dtype)
        args = (table, lens, starts, 1 / 16)
        expected = ref.paged_attention(q.float(), ref.from_kv_cache(kc, heads[2]), ref.from_kv_cache(vc, heads[2]),
                                       *args)
        ours = ops.paged_attention(q, kc, vc, *args)
        torch.testing.assert_close(ours.float(), expected, rtol=0, atol=2**-7 * vc.float().abs().max().item())
