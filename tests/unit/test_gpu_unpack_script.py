"""benchmarks/gpu/unpack.sh's copy of the bundle's parts, checked on a CPU: a part already there with the same bytes is
never written again (an unpack once read one while a later copy wrote it over, and failed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "unpack.sh"


def _copy_parts(tmp_path: Path) -> None:
    env = dict(os.environ, KIT_DIR=str(tmp_path / "kit"), BUNDLE_DIR=str(tmp_path / "bundle"))
    done = subprocess.run(["bash", str(SCRIPT), "--parts-only"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_part_with_the_same_bytes_stays_and_a_changed_one_is_replaced(tmp_path: Path) -> None:
    carried = tmp_path / "bundle" / "p1" / "site.tar.xz.00"
    carried.parent.mkdir(parents=True)
    carried.write_bytes(b"first")
    _copy_parts(tmp_path)
    part = tmp_path / "kit" / "parts" / "site.tar.xz.00"
    first = part.stat().st_ino
    with part.open("rb") as reading:  # an unpack holding it open
        _copy_parts(tmp_path)
        assert part.stat().st_ino == first
        carried.write_bytes(b"second")
        _copy_parts(tmp_path)
        assert reading.read() == b"first"  # the reader's file was replaced by a rename, not rewritten under it
    assert part.read_bytes() == b"second"
    assert sorted(p.name for p in part.parent.iterdir()) == ["site.tar.xz.00"]  # no temporary copy left
