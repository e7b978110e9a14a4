"""benchmarks/gpu/attention_ncu.py, the launches the GPU suite's ncu-attention step reads, run alone on a CPU: each
case's
launches run and MILI's result is checked against the reference; a case the kernel benchmark lacks is refused with the
cases it has."""

from __future__ import annotations


import pytest

from benchmarks.gpu import attention_ncu


def test_the_cases_launch_and_match_the_reference(capsys: pytest.CaptureFixture) -> None:
    cases = ["attention prefill ctx=64 B=1", "attention decode ctx=512 B=1"]
    assert attention_ncu.main(["--device", "cpu", "--dtype", "float32", "--cases", ",".join(cases)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == cases
    assert all(line.endswith("mili  launched twice") for line in lines)


def test_an_unknown_case_is_refused_with_the_ones_there_are() -> None:
    with pytest.raises(SystemExit, match="no such attention case: attention prefill ctx=4096 B=3 .*attention decode "
                                         "ctx=512 B=1"):
        attention_ncu.main(["--device", "cpu", "--cases", "attention prefill ctx=4096 B=3"])
