"""The README and benchmarks/RESULTS.md as users read them: a short opening with both set-up commands, results
tables that name their machine, commit and command, README figures that are RESULTS.md's, and no notes about how
the project is worked on."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text()


def test_the_readme_opens_with_both_commands_in_at_most_30_lines() -> None:
    opening = README.split("\n## ")[0].splitlines()
    assert len(opening) <= 30, len(opening)
    commands = [line for line in opening if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and commands[0].endswith("&& mili serve") and commands[1].endswith("python -m pytest")


def _sections(text: str) -> list[str]:
    return text.split("\n## ")[1:]


def test_results_are_current_tables_that_name_machine_commit_and_command() -> None:
    assert len(RESULTS.splitlines()) <= 500
    tables = [s for s in _sections(RESULTS) if "\n|---" in s]
    assert len(tables) >= 10
    for section in tables:
        title = section.splitlines()[0]
        assert re.search(r"\b[0-9a-f]{7}\b", section), f"{title}: no commit"
        assert "`mili " in section, f"{title}: no command"
        assert re.search(r"EPYC|Zen|Xeon|H100|H200|machine", section), f"{title}: no machine"


def test_the_readmes_result_figures_are_results_md_figures() -> None:
    results = README.split("\n## Results")[1].split("\n## ")[0]
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert len(rows) >= 8
    for row in rows:
        for figure in re.findall(r"\d[\d,]*\.\d+|\d{2,}[\d,]*", row.split("](")[0]):
            assert figure in RESULTS, f"{figure} of README's row {row[:60]!r} is not in RESULTS.md"


def test_links_to_results_sections_exist() -> None:
    anchors = {re.sub(r"[^a-z0-9 -]", "", s.splitlines()[0].lower()).replace(" ", "-") for s in _sections(RESULTS)}
    for anchor in re.findall(r"RESULTS\.md#([a-z0-9-]+)", README):
        assert anchor in anchors, anchor


WORKING_NOTES = re.compile("|".join([
    r"\blea" r"se[sd]?\b", r"\blea" r"sing\b", r"device" r" time", r"\b(this|next|a|each|last|the) sess" r"ion\b",
    r"\bsess" r"ions\b", r"\.dev" r"kit"]), re.I)


def test_no_tracked_file_speaks_of_how_the_project_is_worked_on() -> None:
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    found = []
    for name in files:
        if name.startswith(("benchmarks/results/", "python_layer/tokenizer/assets/")):
            continue
        path = ROOT / name
        if not path.is_file() or path.suffix in (".png",):
            continue
        for number, line in enumerate(path.read_text(errors="ignore").splitlines(), 1):
            if WORKING_NOTES.search(line):
                found.append(f"{name}:{number}: {line.strip()[:80]}")
    assert not found, "\n".join(found)
