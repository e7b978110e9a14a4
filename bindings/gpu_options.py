"""How MILI runs on a GPU where no measurement has settled it yet: one frozen object, built once (by `mili serve`'s
launcher, or by load_model from the environment), that the model graph is built with. The kernel switches reach the
Mojo ops as compile-time parameters (ops.custom's `parameters`); none is read anywhere else. On a CPU none applies.

Each field has an environment variable (ENVIRONMENT), for the GPU suite's A/B runs: benchmarks/gpu/README.md lists
them with what each has measured so far."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional


@dataclass(frozen=True)
class GpuOptions:
    flash_attention: bool = True
    """The split-KV decode kernel and the tensor-core FlashAttention-2 prefill kernel; off: the plain kernels (a block
    per query token and head), and qk_norm_rope_store and attention as two ops."""
    qkv_attention: bool = True
    """With the flash kernels, one op for q/k norms, RoPE, the K/V store and attention (the decode kernel does all of
    it); off: qk_norm_rope_store and the flash attention op apart."""
    prefill_pairs: Optional[bool] = None
    """Row tiles a block of the prefill kernel: None chooses by the step's row tiles against the GPU's SMs, True
    always two, False always one."""
    pdl: bool = False
    """The decode step's norms, decode attention and its split merge launch with Hopper's programmatic dependent
    launch."""
    vendor_blas: bool = False
    """The model graph's matmuls call cuBLAS (MAX's vendor BLAS) instead of MAX's own kernels."""
    batch1_graph: bool = False
    """Steps of one token of one sequence run on a graph of their own whose matmuls are W @ x^T (MAX's vector GEMV)."""

    @property
    def runs_qkv_attention(self) -> bool:
        """Whether the model graph runs qkv_attention (else qk_norm_rope_store, then paged_attention)."""
        return self.flash_attention and self.qkv_attention

    def kernel_parameters(self) -> dict[str, int | bool]:
        """The compile-time parameters of the ops that launch the decode step's kernels."""
        return {"pdl": self.pdl, "prefill_pairs": -1 if self.prefill_pairs is None else int(self.prefill_pairs)}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> "GpuOptions":
        """The options the MILI_GPU_* variables set (1 on, 0 off; unset: the default). Any other value is an error
        naming the variable and what it may be."""
        values = {}
        for field in fields(cls):
            name = ENVIRONMENT[field.name]
            value = environ.get(name, "")
            if value not in ("", "0", "1"):
                raise ValueError(f"{name} is {value!r}: set 1 or 0, or unset it for the default ({field.default})")
            if value:
                values[field.name] = value == "1"
        return cls(**values)


ENVIRONMENT = {
    "flash_attention": "MILI_GPU_FLASH_ATTENTION",
    "qkv_attention": "MILI_GPU_QKV_ATTENTION",
    "prefill_pairs": "MILI_GPU_PREFILL_PAIRS",
    "pdl": "MILI_GPU_PDL",
    "vendor_blas": "MILI_GPU_VENDOR_BLAS",
    "batch1_graph": "MILI_GPU_BATCH1_GRAPH",
}
