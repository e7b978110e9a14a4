"""MILI_GPU_VENDOR_BLAS (bindings/library.py): a GPU session's MAX matmuls call cuBLAS when it is 1; a CPU session never
does; any other value is refused with what to set."""

from __future__ import annotations

import pytest

from bindings import library


class _FakeSession:
    def __init__(self, devices: list) -> None:
        self.devices, self.vendor_blas = devices, []

    def _use_vendor_blas(self, mode: str) -> None:
        self.vendor_blas.append(mode)


@pytest.fixture
def fake_sessions(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("max.engine.InferenceSession", _FakeSession)
    monkeypatch.setattr(library, "max_device", lambda key: f"device {key}")
    return library.session.__wrapped__  # the uncached function: the real sessions stay cached


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True)])
def test_the_setting_reads_unset_0_and_1(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, value)
    assert library.vendor_blas_setting() is expected


def test_a_bad_value_is_refused_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "yes")
    with pytest.raises(ValueError, match=r"MILI_GPU_VENDOR_BLAS is 'yes': set 1 .* or 0 .* or unset it"):
        library.vendor_blas_setting()


def test_a_gpu_session_takes_cublas_only_when_asked(monkeypatch: pytest.MonkeyPatch, fake_sessions) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "1")
    assert fake_sessions("cuda:0").vendor_blas == ["1"]
    assert fake_sessions("cuda:0", vendor_blas=False).vendor_blas == []
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "0")
    assert fake_sessions("cuda:0").vendor_blas == []
    assert fake_sessions("cuda:0", vendor_blas=True).vendor_blas == ["1"]
    assert fake_sessions("cuda:0").devices == ["device cuda:0"]


def test_a_cpu_session_runs_maxs_own_matmuls(monkeypatch: pytest.MonkeyPatch, fake_sessions) -> None:
    monkeypatch.setenv(library.VENDOR_BLAS_SETTING, "bad")  # not even read for a CPU
    assert fake_sessions("cpu").vendor_blas == []
    assert fake_sessions("cpu", vendor_blas=True).vendor_blas == []
