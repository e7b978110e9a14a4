"""The GPU matmul settings (bindings/library.py): MILI_GPU_VENDOR_BLAS=1, the model graph's matmuls call cuBLAS on a
GPU (a CPU session never does); MILI_GPU_BATCH1_GRAPH=1, batch-1 steps run on a graph of their own on a GPU. Unset or
0 is off; any other value is refused with what to set."""

from __future__ import annotations

import pytest

from bindings import library


class _FakeSession:
    def __init__(self, devices: list) -> None:
        self.devices, self.vendor_blas = devices, []

    def _use_vendor_blas(self, mode: str) -> None:
        self.vendor_blas.append(mode)


SETTINGS = pytest.mark.parametrize("name, read", [(library.VENDOR_BLAS_SETTING, library.vendor_blas_setting),
                                                 (library.BATCH1_GRAPH_SETTING, library.batch1_graph_setting)])


@SETTINGS
@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True)])
def test_a_setting_reads_unset_0_and_1(monkeypatch: pytest.MonkeyPatch, name: str, read, value: str,
                                       expected: bool) -> None:
    monkeypatch.setenv(name, value)
    assert read() is expected


@SETTINGS
def test_a_bad_value_is_refused_with_what_to_set(monkeypatch: pytest.MonkeyPatch, name: str, read) -> None:
    monkeypatch.setenv(name, "yes")
    with pytest.raises(ValueError, match=rf"{name} is 'yes': set 1 \(.+\) or 0 \(.+\), or unset it"):
        read()


def test_only_a_gpu_session_asked_for_it_takes_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("max.engine.InferenceSession", _FakeSession)
    monkeypatch.setattr(library, "max_device", lambda key: f"device {key}")
    make = library.session.__wrapped__  # the uncached function: the real sessions stay cached
    assert make("cuda:0", True).vendor_blas == ["1"] and make("cuda:0", True).devices == ["device cuda:0"]
    assert make("cuda:0").vendor_blas == [] and make("cuda:0", False).vendor_blas == []
    assert make("cpu", True).vendor_blas == []


def test_a_model_on_the_cpu_does_not_read_them(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    from python_layer.model.loader import load_model

    for name in (library.VENDOR_BLAS_SETTING, library.BATCH1_GRAPH_SETTING):  # GPU-only: a CPU model loads regardless
        monkeypatch.setenv(name, "bad")
    forward = load_model(tiny_checkpoint, device="cpu").forward_fn
    assert forward.vendor_blas is False and forward.batch_one_model is None
