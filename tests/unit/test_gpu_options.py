"""GpuOptions (bindings/gpu_options.py): the MILI_GPU_* variables read in one place, 1 on and 0 off, any other value
refused with what to set; the ops take the kernel switches as compile-time parameters; a model on the CPU takes none
of them; only a GPU session asked for it takes cuBLAS."""

from __future__ import annotations

import dataclasses

import pytest

from bindings import library
from bindings.gpu_options import ENVIRONMENT, GpuOptions


def test_every_option_has_a_variable_and_unset_is_the_default() -> None:
    assert sorted(ENVIRONMENT) == sorted(f.name for f in dataclasses.fields(GpuOptions))
    assert GpuOptions.from_environment({}) == GpuOptions()


@pytest.mark.parametrize("field", sorted(ENVIRONMENT))
@pytest.mark.parametrize("value, expected", [("", None), ("0", False), ("1", True)])
def test_a_variable_reads_unset_0_and_1(field: str, value: str, expected) -> None:
    options = GpuOptions.from_environment({ENVIRONMENT[field]: value})
    default = getattr(GpuOptions(), field)
    assert getattr(options, field) == (default if expected is None else expected)


@pytest.mark.parametrize("field", sorted(ENVIRONMENT))
def test_a_bad_value_is_refused_with_what_to_set(field: str) -> None:
    name = ENVIRONMENT[field]
    with pytest.raises(ValueError, match=rf"{name} is 'yes': set 1 or 0, or unset it for the default"):
        GpuOptions.from_environment({name: "yes"})


def test_the_kernel_parameters() -> None:
    assert GpuOptions().kernel_parameters() == {"pdl": False, "prefill_pairs": -1}
    assert GpuOptions(pdl=True, prefill_pairs=True).kernel_parameters() == {"pdl": True, "prefill_pairs": 1}
    assert GpuOptions(prefill_pairs=False).kernel_parameters()["prefill_pairs"] == 0
    assert GpuOptions().runs_qkv_attention and not GpuOptions(flash_attention=False).runs_qkv_attention
    assert not GpuOptions(qkv_attention=False).runs_qkv_attention


def test_the_model_graph_passes_them_to_the_ops(tiny_checkpoint) -> None:
    """Built for a GPU (not compiled): the norms and the attention op carry the model's options as parameters."""
    from python_layer.model.loader import load_model
    from python_layer.model.qwen3_graph import graph_weights, model_graph

    options = GpuOptions(pdl=True, prefill_pairs=False)
    model = load_model(tiny_checkpoint, device="cpu", backend="reference", gpu_options=options)
    text = str(model_graph(model, graph_weights(model), "cuda:0")._mlir_op)
    assert 'symbol = "mili_qkv_attention"' in text and "pdl = true" in text and "prefill_pairs = 0" in text
    two_ops = dataclasses.replace(options, qkv_attention=False)
    model.gpu_options = two_ops
    text = str(model_graph(model, graph_weights(model), "cuda:0")._mlir_op)
    assert 'symbol = "mili_paged_attention_flash"' in text and 'symbol = "mili_qkv_attention"' not in text


class _FakeSession:
    def __init__(self, devices: list) -> None:
        self.devices, self.vendor_blas = devices, []

    def _use_vendor_blas(self, mode: str) -> None:
        self.vendor_blas.append(mode)


def test_only_a_gpu_session_asked_for_it_takes_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("max.engine.InferenceSession", _FakeSession)
    monkeypatch.setattr(library, "max_device", lambda key: f"device {key}")
    make = library.session.__wrapped__  # the uncached function: the cached InferenceSession objects stay
    assert make("cuda:0", True).vendor_blas == ["1"] and make("cuda:0", True).devices == ["device cuda:0"]
    assert make("cuda:0").vendor_blas == [] and make("cuda:0", False).vendor_blas == []
    assert make("cpu", True).vendor_blas == []


def test_a_model_on_the_cpu_takes_none_of_them(tiny_checkpoint) -> None:
    from python_layer.model.loader import load_model

    options = GpuOptions(vendor_blas=True, batch1_graph=True)  # GPU-only: a CPU model loads as without them
    forward = load_model(tiny_checkpoint, device="cpu", gpu_options=options).forward_fn
    assert forward.vendor_blas is False and forward.batch_one_model is None


def test_a_bad_variable_stops_the_model_load(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    from python_layer.model.loader import load_model

    monkeypatch.setenv("MILI_GPU_PDL", "2")
    with pytest.raises(ValueError, match="MILI_GPU_PDL is '2'"):
        load_model(tiny_checkpoint, device="cpu")
