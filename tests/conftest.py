"""Shared fixtures: random-weight Qwen3 checkpoints built once per test session with transformers."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported: the tests never touch the network

import random
from pathlib import Path

import pytest
import torch

from python_layer.model.random_checkpoint import QWEN3_0_6B_SHAPE, TINY, build_random_checkpoint

# Three shapes for parity with transformers: GQA 2:1 with head_dim != hidden/heads and tied embeddings;
# multi-head (no GQA) with untied embeddings; GQA 8:1 with YaRN rope scaling, untied, attention over 128-dim heads.
PARITY_SHAPES = {
    "tiny_gqa2_tied": TINY,
    "mha_untied": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
                       num_key_value_heads=6, head_dim=16, tie_word_embeddings=False),
    "gqa8_untied_yarn": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                             num_key_value_heads=1, head_dim=128, tie_word_embeddings=False,
                             max_position_embeddings=256,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
}


def pytest_configure(config: pytest.Config) -> None:
    """The run's seed of the kernel cases' random inputs (tests/kernel_cases.py seed_case): MILI_TEST_SEED, else a
    fresh one, set here before any xdist worker starts so that all of them draw from it."""
    os.environ.setdefault("MILI_TEST_SEED", str(random.randrange(2**31)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"kernel cases drawn with MILI_TEST_SEED={os.environ['MILI_TEST_SEED']} (set it to draw them again)"


@pytest.fixture(scope="session", autouse=True)
def _isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the models the tests generate out of the user's home."""
    os.environ.setdefault("MILI_CACHE_DIR", str(tmp_path_factory.mktemp("mili_cache")))
    torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def checkpoints_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoints_dir: Path) -> Path:
    return build_random_checkpoint(checkpoints_dir / "tiny", seed=0, **TINY)


# a shape's tests share its graphs: one xdist worker runs them (`--dist loadgroup`), so that each compiles once
@pytest.fixture(scope="session", params=[pytest.param(s, marks=pytest.mark.xdist_group(f"parity_{s}"))
                                         for s in sorted(PARITY_SHAPES)])
def parity_checkpoint(request: pytest.FixtureRequest, checkpoints_dir: Path, tiny_checkpoint: Path) -> Path:
    if request.param == "tiny_gqa2_tied":
        return tiny_checkpoint
    return build_random_checkpoint(checkpoints_dir / request.param, seed=1, **PARITY_SHAPES[request.param])


@pytest.fixture(scope="session")
def qwen3_0_6b_checkpoint(checkpoints_dir: Path) -> Path:
    """Qwen3-0.6B's exact shapes with random bfloat16 weights (1.2 GB): for slow tests and benchmarks."""
    return build_random_checkpoint(
        checkpoints_dir / "qwen3-0.6b-random", seed=0, dtype=torch.bfloat16, **QWEN3_0_6B_SHAPE
    )


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint: Path):
    from python_layer import InferenceEngine

    return InferenceEngine.from_pretrained(tiny_checkpoint)
