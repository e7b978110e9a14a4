"""CPU tensors on transparent huge pages (2 MiB). A batch-1 decode step streams every weight byte once; with 4
KiB pages that is a TLB miss every 4 KiB, each a two-level page walk under a hypervisor. Huge pages took the
batch-1 step to 0.96-0.97x its time on the 2-core VM (benchmarks/RESULTS.md)."""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 << 20


def huge_pages_supported() -> bool:
    """Whether this OS lets a process ask for transparent huge pages (Linux's madvise(MADV_HUGEPAGE))."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, its whole 2 MiB spans on transparent huge pages where the kernel
    grants them (a tail under 2 MiB stays on small pages: no memory is rounded up). Under 2 MiB, or where the
    OS has no such pages: plain torch.zeros."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGE or not huge_pages_supported():
        return torch.zeros(shape, dtype=dtype)
    # private anonymous memory (zero-filled): shared memory follows the shmem THP setting, usually off
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = -torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE
    # advised before the first touch: the pages fault in huge when the tensor is first written
    region.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // HUGE_PAGE * HUGE_PAGE)
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes, offset=offset)  # keeps `region` alive
    return flat.view(dtype).view(shape)


def on_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor copied onto huge pages (zeros_on_huge_pages); other devices' tensors come back as they are."""
    if tensor.device.type != "cpu":
        return tensor
    return zeros_on_huge_pages(tuple(tensor.shape), tensor.dtype).copy_(tensor)
