"""The bits per weight the latency benchmark reports for MILI: stored bytes of the layers' weights and LM head (scales
and mins included) over their number of weights, whatever their formats."""

from __future__ import annotations

import torch

from benchmarks.engine.latency import bits_per_weight
from python_layer.model.quantization import quantize, quantize_int4


def test_every_format_counts_its_weights_and_its_scales() -> None:
    torch.manual_seed(0)
    head = quantize_int4(torch.randn(96, 128), bits=6)  # 6 bits + float16 scale and min per 64: 6.5
    int4 = quantize_int4(torch.randn(64, 136))  # 4 bits + float16 scale and min per 64 (3 blocks of 136): ~4.7
    int8 = quantize(torch.randn(40, 256), "int8")  # 8 bits + a float32 scale per 128: 8.25
    norm = torch.ones(64, dtype=torch.bfloat16)

    stored = (96 * 128 * 6 // 8 + 2 * 2 * 2 * 96) + (64 * 136 // 2 + 2 * 2 * 3 * 64) + (40 * 256 + 4 * 2 * 40) + 2 * 64
    weights = 96 * 128 + 64 * 136 + 40 * 256 + 64
    assert bits_per_weight([head, int4, int8, norm]) == round(8 * stored / weights, 2)
    assert bits_per_weight([head]) == 6.5
    assert bits_per_weight([int8]) == 8.25
