"""MAX's memory pool on a GPU leaves room for what torch holds (the weights and the KV cache): the percent, the
callers that size it before the model loads (load_model, the launcher, InferenceEngine.from_pretrained), and an
operator's own setting, which stays. The GPU's size is faked here; the setting itself held on an H200."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from bindings.gpu_options import GpuOptions
from python_layer import InferenceEngine
from python_layer.cli import build_parser
from python_layer.memory.kv_cache_manager import DEFAULT_KV_CACHE_GB, DEFAULT_MAX_KV_PAGES, kv_page_bytes
from python_layer.model import device_memory, loader
from python_layer.model.config import Qwen3Config
from python_layer.model.device_memory import MAX_POOL_PERCENT, leave_room_beside_max_pool, max_pool_percent
from python_layer.model.weight_loader import expected_weight_shapes
from python_layer.server import launcher

GiB = 2**30


class Stop(Exception):
    """Ends a load once the pool is sized: no weights, no graph."""


@pytest.fixture
def gpu_of(monkeypatch: pytest.MonkeyPatch):
    """A GPU of `gib` GiB as torch reports it; the pool setting unset."""
    monkeypatch.delenv(MAX_POOL_PERCENT, raising=False)

    def fake(gib: float) -> None:
        properties = type("Properties", (), {"total_memory": int(gib * GiB)})()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)

    return fake


def test_the_pool_is_the_gpu_less_torchs_memory_and_headroom() -> None:
    assert max_pool_percent(80 * GiB, 40 * GiB) == 40  # (80 - 40 - 8) / 80
    assert max_pool_percent(141 * GiB, 41.2 * GiB) == 65
    assert max_pool_percent(80 * GiB, 79 * GiB) == 5  # never below 5%: the graphs need some
    assert max_pool_percent(141 * GiB, 1 * GiB) == 90  # never above MAX's own default


def test_a_gpu_gets_its_pool_set_and_an_operators_setting_stays(gpu_of, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_of(80)
    assert leave_room_beside_max_pool("cpu", 40 * GiB) is None
    assert MAX_POOL_PERCENT not in device_memory.os.environ
    assert leave_room_beside_max_pool("cuda:0", 40 * GiB) == 40
    assert device_memory.os.environ[MAX_POOL_PERCENT] == "40"
    monkeypatch.setenv(MAX_POOL_PERCENT, "20")
    assert leave_room_beside_max_pool("cuda", 1 * GiB) is None
    assert device_memory.os.environ[MAX_POOL_PERCENT] == "20"


@pytest.fixture
def sized(monkeypatch: pytest.MonkeyPatch) -> list:
    """(device, torch bytes) of each pool sizing load_model asks for; the load stops there."""
    seen = []

    def record(device: str, torch_bytes: float) -> None:
        seen.append((device, torch_bytes))
        raise Stop

    monkeypatch.setattr(loader, "leave_room_beside_max_pool", record)
    return seen


def test_load_model_leaves_room_for_the_weights_and_the_kv_cache(tiny_checkpoint: Path, sized: list) -> None:
    """Before the weights load: the weights in the activations' dtype plus the KV cache of num_kv_pages pages, else of
    kv_cache_memory_gb, else the engine's default."""
    config = Qwen3Config.from_pretrained(tiny_checkpoint)
    weights = sum(math.prod(s) for s in expected_weight_shapes(config).values()) * 2  # bfloat16
    page = kv_page_bytes(config, 32, torch.bfloat16)
    for kv, expected in [(dict(num_kv_pages=100), 100 * page),
                         (dict(kv_cache_memory_gb=0.5), (GiB // 2 // page) * page),
                         ({}, min(DEFAULT_MAX_KV_PAGES, int(DEFAULT_KV_CACHE_GB * GiB // page)) * page)]:
        with pytest.raises(Stop):
            loader.load_model(tiny_checkpoint, dtype="bfloat16", page_size=32, **kv)
        assert sized.pop() == ("cpu", weights + expected)
    with pytest.raises(ValueError, match="kv_cache_memory_gb must be > 0"):
        loader.load_model(tiny_checkpoint, kv_cache_memory_gb=0)


def test_the_server_and_from_pretrained_size_the_pool_for_their_kv_cache(tiny_checkpoint: Path, sized: list) -> None:
    config = Qwen3Config.from_pretrained(tiny_checkpoint)
    page = kv_page_bytes(config, 16, torch.bfloat16)  # the CPU's "auto" cache
    weights = sum(math.prod(s) for s in expected_weight_shapes(config).values()) * 4

    def serve(*flags: str) -> None:
        args = build_parser().parse_args(["serve", "--model", str(tiny_checkpoint), *flags])
        args.random_model = None  # as `mili serve` sets it without a config file
        launcher.make_loader(args, GpuOptions())(None)

    for flags, expected in [(["--kv-pages", "300"], 300 * page), (["--kv-cache-memory-gb", "1"], (GiB // page) * page)]:
        with pytest.raises(Stop):
            serve(*flags)
        assert sized.pop() == ("cpu", weights + expected)
    with pytest.raises(Stop):
        serve("--kv-memory-fraction", "0.01")  # of the memory free before the weights load
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert sized.pop()[1] - weights == pytest.approx(0.01 * available, rel=0.2)
    with pytest.raises(Stop):
        InferenceEngine.from_pretrained(tiny_checkpoint, num_kv_pages=70, page_size=16)
    assert sized.pop() == ("cpu", weights + 70 * page)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU")
def test_a_gpu_asked_for_where_there_is_none_is_named(tiny_checkpoint: Path) -> None:
    with pytest.raises(RuntimeError, match="device 'cuda': torch sees no CUDA GPU here .*use device 'cpu'"):
        loader.load_model(tiny_checkpoint, device="cuda")
