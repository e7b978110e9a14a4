"""Registers, spills and shared memory of MILI's GPU kernels as ptxas compiles them for an H100: no GPU needed.

`python -m bindings.gpu_resources [sm_90a]` prints them for the attention kernels, whose launch sizes assume them
(gpu_decode.mojo's decode_blocks_per_sm: with 2 query heads a KV head 4 blocks of 128 threads an SM, so at most 128
registers a thread). Each kernel is compiled to PTX by `mojo run` (max.gpu.host.compile._compile_code) and assembled
by ptxas -v, from the `nvidia-cuda-nvcc-cu12` wheel (the test extra) or the PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bindings import library

ROOT = Path(__file__).resolve().parents[1]

KERNELS = {
    "decode, bfloat16, 1 query head a KV head, from qkv":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 1, True]"),
    "decode, bfloat16, 2 query heads a KV head, from qkv (Qwen3-0.6B)":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 2, True]"),
    "decode, bfloat16, 2 query heads a KV head":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 2, False]"),
    "decode, bfloat16, 4 query heads a KV head, from qkv (Qwen3-8B)":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 4, True]"),
    "decode, bfloat16, 5 query heads a KV head, from qkv (Qwen3-14B)":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 5, True]"),
    "decode, bfloat16, 8 query heads a KV head, from qkv (Qwen3-32B)":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.bfloat16, DType.bfloat16, 8, True]"),
    "decode, float32, 2 query heads a KV head, from qkv":
        ("mojo_kernels.core.attention.gpu_decode", "_decode_attention_gpu[DType.float32, DType.float32, 2, True]"),
    "prefill, bfloat16, head_dim 128":
        ("mojo_kernels.core.attention.gpu_prefill", "_prefill_attention_gpu[128]"),
    "split merge, bfloat16": ("mojo_kernels.core.attention.gpu", "merge_splits_gpu[DType.bfloat16]"),
}


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_bytes: int  # stores and loads
    shared_bytes: int


def ptxas() -> str:
    """The ptxas of the nvidia-cuda-nvcc-cu12 wheel, else the one on the PATH."""
    try:
        import nvidia.cuda_nvcc

        found = Path(next(iter(nvidia.cuda_nvcc.__path__))) / "bin" / "ptxas"
        if found.exists():
            return str(found)
    except ImportError:
        pass
    on_path = shutil.which("ptxas")
    if on_path is None:
        raise RuntimeError("no ptxas: pip install nvidia-cuda-nvcc-cu12 (in the test extra) or put CUDA's on the PATH")
    return on_path


def _mojo_print(imports: str, printed: str, gpu: str = "sm_90") -> str:
    """What `print(printed)` prints in a Mojo program with `imports`, built for an accelerator as MAX builds a graph's
    kernels (without one, has_nvidia_gpu_accelerator() is false and PDL's instructions are left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "program.mojo"
        program.write_text(f"{imports}\n\n\ndef main() raises:\n    print({printed})\n")
        built = subprocess.run([library._mojo(), "run", "--target-accelerator", gpu, "-I", str(ROOT), str(program)],
                               capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        raise RuntimeError(f"{printed}: mojo failed\n{built.stdout}{built.stderr}")
    return built.stdout


def decode_blocks_per_sm(groups: tuple[int, ...] = (1, 2, 4, 5, 8)) -> dict[int, int]:
    """gpu_decode.mojo's decode_blocks_per_sm for each number of query heads a KV head, as the kernel computes it."""
    printed = _mojo_print("from mojo_kernels.core.attention.gpu_decode import decode_blocks_per_sm",
                          ", ".join(f"decode_blocks_per_sm({g})" for g in groups))
    return dict(zip(groups, map(int, printed.split())))


def kernel_resources(module: str, kernel: str, arch: str = "sm_90a") -> Resources:
    """ptxas -v's figures for `kernel` (a kernel function of `module` with its parameters, as Mojo spells it)."""
    gpu = arch.removesuffix("a")
    asm = _mojo_print(f"from max.gpu.host.compile import _compile_code, get_gpu_target\n"
                      f"from {module} import {kernel.split('[')[0]}",
                      f"_compile_code[{kernel}, target=get_gpu_target[\"{gpu}\"]()]().asm", gpu)
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(asm)
        assembled = subprocess.run([ptxas(), f"-arch={arch}", "-v", str(ptx), "-o", os.devnull],
                                   capture_output=True, text=True, timeout=600)
    if assembled.returncode != 0:
        raise RuntimeError(f"{kernel}: ptxas failed\n{assembled.stderr}")
    info = assembled.stderr
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))
    registers = int(re.search(r"Used (\d+) registers", info).group(1))
    shared = re.search(r"(\d+) bytes smem", info)
    return Resources(registers, spills, int(shared.group(1)) if shared else 0)


def main(arch: str = "sm_90a") -> int:
    print(f"| kernel ({arch}) | registers | spilled bytes | shared bytes |\n|---|---|---|---|")
    for name, (module, kernel) in KERNELS.items():
        r = kernel_resources(module, kernel, arch)
        print(f"| {name} | {r.registers} | {r.spill_bytes} | {r.shared_bytes} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
