"""offline_wheelhouse.sh: the folder it writes installs MILI with pip's --no-index (needs network to build it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_wheelhouse_installs_mili_offline(tmp_path: Path) -> None:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    house = tmp_path / "wheels"
    subprocess.run([str(ROOT / "offline_wheelhouse.sh"), str(house), "--python", python, "--split", "100m"], check=True)
    assert not list(house.glob("torch-*")), "torch is left out unless --with-torch"
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(f"cat {house}.part.* | tar -x -C {unpacked}", shell=True, check=True)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"torch=={torch.__version__.split('+')[0]}"], check=True)  # as the README installs it
    subprocess.run([*pip, "--no-index", "--find-links", str(unpacked), "mili"], check=True, cwd=tmp_path)
    check = "import importlib.metadata as m, python_layer, bindings; print(m.version('max'), python_layer.__file__)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], check=True, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.stdout.startswith("26.7.0") and str(venv) in out.stdout
