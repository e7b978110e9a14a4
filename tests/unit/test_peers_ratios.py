"""The peers runner's speed ratios: the ratio of the medians, and the median of the per-round ratios."""

from __future__ import annotations

import argparse


from benchmarks.peers.run import ratio_rows


def _row(system: str, fmt: str, prefill: list[float], decode_b1: list[float]) -> dict:
    med = lambda v: sorted(v)[len(v) // 2]
    return dict(system=system, format=fmt, prefill_s=med(prefill), prefill_runs=prefill,
                decode_b1_tok_s=127 / med(decode_b1), decode_b1_runs_s=decode_b1)


def test_ratios_of_medians_and_of_rounds() -> None:
    # the VM slows down in round 3 for both systems: the medians come from different rounds, the pairs do not
    mili_f32 = _row("mili", "float32", [2.0, 1.0, 3.0], [10.0, 10.5, 20.0])
    mili_bf16 = _row("mili", "bfloat16", [1.5, 1.6, 1.4], [9.0, 6.0, 11.0])
    llama_f32 = _row("llama.cpp", "f32", [2.2, 1.1, 3.6], [11.0, 10.0, 21.0])
    llama_bf16 = _row("llama.cpp", "bf16", [3.0, 3.0, 3.0], [30.0, 30.0, 30.0])
    f32, bf16, best = ratio_rows([mili_f32, mili_bf16, llama_f32, llama_bf16], argparse.Namespace(batches="1"))

    assert f32["comparison"] == "mili float32 / llama.cpp f32"
    assert abs(f32["prefill"] - 2.2 / 2.0) < 1e-9 and abs(f32["decode_b1"] - 11.0 / 10.5) < 1e-9
    assert abs(f32["prefill_paired"] - 1.1) < 1e-9  # rounds 1.1, 1.1, 1.2
    assert abs(f32["decode_b1_paired"] - 1.05) < 1e-9  # rounds 1.1, 0.952, 1.05
    assert bf16["comparison"] == "mili bfloat16 / llama.cpp bf16" and abs(bf16["decode_b1_paired"] - 30 / 9) < 1e-9
    # best: each round's fastest format of each system
    assert best["comparison"] == "mili best / llama.cpp best"
    assert abs(best["prefill_paired"] - 2.2 / 1.5) < 1e-9  # rounds 2.2 / 1.5, 1.1 / 1.0, 3.0 / 1.4
    assert abs(best["decode_b1_paired"] - 10.0 / 6.0) < 1e-9  # rounds 11 / 9, 10 / 6, 21 / 11


def test_kv_caches_and_vllm_pair_by_bits() -> None:
    """MILI's KV caches meet llama.cpp's of the same bits (bfloat16 its default f16, int8 / fp8 its q8_0), and MILI's
    weights vLLM's in the same dtype (whatever MILI's activations), int4 an AWQ / GPTQ checkpoint's own format, int8
    a W8A8 one's."""
    runs = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    rows = [_row("mili", "int4 kv bfloat16", *runs), _row("mili", "int4 kv int8", *runs),
            _row("mili", "int4 kv fp8", *runs), _row("mili", "bfloat16", *runs),
            _row("mili", "bfloat16 act bfloat16", *runs), _row("mili", "int8", *runs),
            _row("llama.cpp", "q4_0", *runs), _row("llama.cpp", "q4_0 kv q8_0", *runs),
            _row("vllm", "awq", *runs), _row("vllm", "bfloat16", *runs), _row("vllm", "compressed-tensors", *runs)]
    names = [r["comparison"] for r in ratio_rows(rows, argparse.Namespace(batches="1"))]
    assert names == ["mili int4 kv bfloat16 / llama.cpp q4_0", "mili int4 kv int8 / llama.cpp q4_0 kv q8_0",
                     "mili int4 kv fp8 / llama.cpp q4_0 kv q8_0", "mili int4 kv bfloat16 / vllm awq",
                     "mili int4 kv int8 / vllm awq", "mili int4 kv fp8 / vllm awq", "mili bfloat16 / vllm bfloat16",
                     "mili bfloat16 act bfloat16 / vllm bfloat16",
                     "mili int8 / vllm compressed-tensors", "mili best / llama.cpp best"]


def test_mili_on_a_gguf_file_pairs_with_llama_cpp_on_the_same_file() -> None:
    runs = [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]
    rows = [_row("mili", "gguf q4_k_m kv bfloat16", *runs), _row("mili", "gguf q8_0", *runs),
            _row("llama.cpp", "q4_0", *runs), _row("llama.cpp", "q4_k_m", *runs), _row("llama.cpp", "q8_0", *runs)]
    names = [r["comparison"] for r in ratio_rows(rows, argparse.Namespace(batches="1"))]
    assert names == ["mili gguf q4_k_m kv bfloat16 / llama.cpp q4_k_m", "mili gguf q8_0 / llama.cpp q8_0",
                     "mili best / llama.cpp best"]
