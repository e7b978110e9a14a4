"""The tiny model on the GPU, loaded once for each module that asks for it (a module runs on one xdist worker)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def cuda_model(tiny_checkpoint: Path):
    from python_layer.model.loader import load_model

    return load_model(tiny_checkpoint, device="cuda", dtype="bfloat16")
