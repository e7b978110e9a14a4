"""Weights copied onto transparent huge pages: the same values, 2 MiB aligned, and on huge pages where the OS
grants them."""

import re
from pathlib import Path

import pytest
import torch

from python_layer.memory.huge_pages import HUGE_PAGE, huge_pages_supported, on_huge_pages, zeros_on_huge_pages


def _anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def _thp_mode() -> str:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return re.search(r"\[(\w+)\]", setting.read_text())[1] if setting.is_file() else "never"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_a_copy_on_huge_pages_holds_the_same_values(dtype: torch.dtype) -> None:
    source = (torch.randn(1501, 2003) * 50).to(dtype).t()  # 6-12 MB, not a multiple of 2 MiB, not contiguous
    copy = on_huge_pages(source)
    assert torch.equal(copy, source) and copy.dtype == dtype and copy.is_contiguous()
    assert copy.data_ptr() % HUGE_PAGE == 0 or not huge_pages_supported()
    small = torch.randn(7, 33)
    assert torch.equal(on_huge_pages(small), small)
    assert torch.equal(zeros_on_huge_pages((3, 2 << 20), torch.float32), torch.zeros(3, 2 << 20))


@pytest.mark.skipif(not huge_pages_supported() or _thp_mode() == "never",
                    reason="this OS grants no transparent huge pages (Linux with THP 'always' or 'madvise' does)")
def test_the_copy_sits_on_huge_pages() -> None:
    copy = on_huge_pages(torch.randn(5, 1 << 20))  # 20 MiB: ten whole huge pages
    assert _anon_huge_kb(copy.data_ptr()) >= 8 * HUGE_PAGE // 1024  # the kernel may refuse a page or two
