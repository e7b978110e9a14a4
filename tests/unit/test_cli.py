import subprocess
import sys
from pathlib import Path

import pytest

from python_layer import InferenceEngine
from python_layer.cli import main
from python_layer.model.random_checkpoint import BUILTIN, builtin_model_path
from python_layer.model.config import Qwen3Config


def test_generate_on_a_checkpoint(tiny_checkpoint: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(
        [
            "generate",
            "--model",
            str(tiny_checkpoint),
            "--prompt",
            "Hi",
            "--prompt",
            "Hello there",
            "--max-tokens",
            "4",
            "--ignore-eos",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.err.count("4 generated, finish_reason=length") == 2


def test_generate_on_the_builtin_model(capsys: pytest.CaptureFixture) -> None:
    assert main(["generate", "--prompt", "Hi", "--max-tokens", "3", "--ignore-eos"]) == 0
    assert "3 generated" in capsys.readouterr().err
    config = Qwen3Config.from_pretrained(builtin_model_path())
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (
        BUILTIN["hidden_size"],
        BUILTIN["num_hidden_layers"],
        151936,
    )


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"]) == 1
    assert "does not exist" in capsys.readouterr().err

    def load(*args, **kwargs):
        raise AssertionError("the model loaded before the sampling settings were checked")

    monkeypatch.setattr(InferenceEngine, "from_pretrained", load)
    assert main(["generate", "--prompt", "x", "--max-tokens", "0"]) == 1
    assert "max_tokens" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["generate", "--prompt", "x"]])
def test_a_wrong_model_directory_is_one_message_without_a_traceback(tmp_path: Path, command: list) -> None:
    missing = tmp_path / "missing"
    done = subprocess.run([sys.executable, "-m", "python_layer.cli", *command, "--model", str(missing)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, done.stderr
    assert "mili: error: " in done.stderr and "does not exist" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_generating_the_builtin_model_keeps_stdout_to_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    """Scripts take the path from stdout (benchmarks/serving/setup.sh); the first use's message goes to stderr."""
    monkeypatch.setenv("MILI_CACHE_DIR", str(tmp_path))
    path = builtin_model_path()
    captured = capsys.readouterr()
    assert captured.out == "" and "generating the built-in" in captured.err
    assert (path / "config.json").is_file() and path.is_relative_to(tmp_path)
