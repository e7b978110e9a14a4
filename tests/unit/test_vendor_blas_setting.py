"""MILI_GPU_VENDOR_BLAS (bindings/library.py): the model graph's matmuls call cuBLAS on a GPU when it is 1; a CPU
session never does; any other value is refused with what to set."""

from __future__ import annotations

import pytest

from bindings import library


class _FakeSession:
    def __init__(self, devices: list) -> None:
        self.devices, self.vendor_blas = devices, []

    def _use_vendor_blas(self, mode: str) -> None:
        self.vendor_blas.append(mode)


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True)])
def test_the_setting_reads_unset_0_and_1(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, value)
    assert library.vendor_blas_setting() is expected


def test_a_bad_value_is_refused_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "yes")
    with pytest.raises(ValueError, match=r"MILI_GPU_VENDOR_BLAS is 'yes': set 1 .* or 0 .* or unset it"):
        library.vendor_blas_setting()


def test_only_a_gpu_session_asked_for_it_takes_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("max.engine.InferenceSession", _FakeSession)
    monkeypatch.setattr(library, "max_device", lambda key: f"device {key}")
    make = library.session.__wrapped__  # the uncached function: the real sessions stay cached
    assert make("cuda:0", True).vendor_blas == ["1"] and make("cuda:0", True).devices == ["device cuda:0"]
    assert make("cuda:0").vendor_blas == [] and make("cuda:0", False).vendor_blas == []
    assert make("cpu", True).vendor_blas == []


def test_a_model_on_the_cpu_does_not_read_it(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    from python_layer.model.loader import load_model

    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "bad")  # a GPU-only setting: a CPU model loads regardless
    assert load_model(tiny_checkpoint, device="cpu").forward_fn.vendor_blas is False
