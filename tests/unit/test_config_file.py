"""`mili serve --config FILE`: the design documents' shapes, flags by name, command-line flags winning, and an
error naming the key and the file for anything wrong, before anything loads."""

import json
from pathlib import Path

import pytest

from python_layer.cli import main
from python_layer.model.config import Qwen3Config
from python_layer.model.random_checkpoint import TINY
from python_layer.server import config_file


def write(tmp_path: Path, data, name: str = "mili.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def printed(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    assert main(["serve", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def failure(capsys: pytest.CaptureFixture, *argv: str) -> str:
    assert main(["serve", *argv, "--print-config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err


DESIGN_DOC_INFERENCE = {
    "inference": {"device": "cpu", "dtype": "float32", "max_batch_size": 8},
    "kv_cache": {"page_size": 32, "num_pages": 100},
    "sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20},
}


def test_the_inference_config_sets_the_serve_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    merged = printed(capsys, "--config", write(tmp_path, {**DESIGN_DOC_INFERENCE, "port": 9001, "max-queue-len": 7}))
    assert (merged["device"], merged["dtype"], merged["max_num_seqs"]) == ("cpu", "float32", 8)
    assert (merged["page_size"], merged["kv_pages"], merged["port"], merged["max_queue_len"]) == (32, 100, 9001, 7)
    assert merged["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    assert merged["kv_cache_dtype"] == "auto"
    kv = printed(capsys, "--config", write(tmp_path, {"kv_cache": {"dtype": "bfloat16"}}, "kv.json"))
    assert kv["kv_cache_dtype"] == "bfloat16"


def test_yaml_files_read_the_same(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yaml_text = "inference:\n  max_batch_size: 8\nsampling:\n  top_k: 20\nport: 9001\n"
    merged = printed(capsys, "--config", write(tmp_path, yaml_text, "mili.yaml"))
    assert (merged["max_num_seqs"], merged["port"], merged["sampling"]) == (8, 9001, {"top_k": 20})


def test_command_line_flags_win_over_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, {**DESIGN_DOC_INFERENCE, "port": 9001})
    merged = printed(capsys, "--config", path, "--port", "9002", "--max-num-seqs", "3", "--kv-cache-memory-gb", "1")
    assert (merged["port"], merged["max_num_seqs"], merged["page_size"]) == (9002, 3, 32)
    # a KV sizing flag replaces the file's (the three are exclusive)
    assert (merged["kv_pages"], merged["kv_cache_memory_gb"]) == (None, 1.0)


def test_a_file_is_the_same_as_its_flags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--print-config's output is itself a config file that gives the same configuration."""
    first = printed(capsys, "--config", write(tmp_path, DESIGN_DOC_INFERENCE), "--port", "9003")
    again = printed(capsys, "--config", write(tmp_path, first, "again.json"))
    assert again == first


@pytest.mark.parametrize("data, named", [
    ({"prot": 1}, "'prot'"),
    ({"inference": {"max_batch": 8}}, "'inference.max_batch'"),
    ({"sampling": {"temprature": 1.0}}, "'sampling.temprature'"),
    ({"port": "80"}, "'port'"),
    ({"max_num_seqs": 8.5}, "'max_num_seqs'"),
    ({"inference": {"max_batch_size": True}}, "'inference.max_batch_size'"),
    ({"inference": {"dtype": "float64"}}, "'inference.dtype'"),
    ({"kv_cache": {"page_size": 24}}, "'kv_cache.page_size'"),
    ({"kv_cache": {"page_size": 0}}, "'kv_cache.page_size'"),
    ({"kv_cache": {"num_pages": -1}}, "'kv_cache.num_pages'"),
    ({"kv_cache": {"dtype": "fp4"}}, "'kv_cache.dtype'"),
    ({"inference": {"max_batch_size": 0}}, "'inference.max_batch_size'"),
    ({"sampling": {"top_p": 0}}, "top_p"),
    ({"sampling": {"temperature": -1}}, "temperature"),
    ({"kv_cache": {"num_pages": 10}, "kv_cache_memory_gb": 1}, "both size the KV cache"),
    ({"inference": "cpu"}, "'inference'"),
    ({"hidden_size": "big"}, "'hidden_size'"),
    ({"inference": {"device": "tpu"}}, "'inference.device'"),
    ({"kv_memory_fraction": 0.99}, "'kv_memory_fraction'"),
    ({"max_num_seqs": 4, "inference": {"max_batch_size": 8}}, "sets what 'max_num_seqs'"),
])
def test_a_bad_key_is_named_with_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, data: dict, named: str
) -> None:
    path = write(tmp_path, data)
    err = failure(capsys, "--config", path)
    assert named in err and (path in err or "sampling" in named), err


def test_a_bad_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "not valid JSON" in failure(capsys, "--config", write(tmp_path, "{port: 1"))
    assert "not valid YAML" in failure(capsys, "--config", write(tmp_path, "a: [1", "bad.yaml"))
    assert "mapping" in failure(capsys, "--config", write(tmp_path, "[1, 2]"))
    assert "not found" in failure(capsys, "--config", str(tmp_path / "missing.json"))


def test_bad_flags_are_named_too(capsys: pytest.CaptureFixture) -> None:
    assert "--page-size" in failure(capsys, "--page-size", "12")
    assert "--max-num-seqs" in failure(capsys, "--max-num-seqs", "0")


def test_the_model_config_must_agree_with_the_checkpoint(tmp_path: Path, tiny_checkpoint: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    agreeing = {
        "hidden_size": TINY["hidden_size"],
        "num_hidden_layers": TINY["num_hidden_layers"],
        "hidden_act": "silu",
    }
    merged = printed(capsys, "--model", str(tiny_checkpoint), "--config", write(tmp_path, agreeing))
    assert merged["hidden_size"] == TINY["hidden_size"]
    path = write(tmp_path, {"hidden_size": 4096}, "other.json")
    err = failure(capsys, "--model", str(tiny_checkpoint), "--config", path)
    assert "'hidden_size'" in err and path in err and str(TINY["hidden_size"]) in err


def test_a_model_config_without_a_checkpoint_is_a_random_model_of_that_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("MILI_CACHE_DIR", str(tmp_path / "cache"))
    shape = {k: v for k, v in TINY.items() if k in config_file.MODEL_KEYS}
    path = write(tmp_path, {**shape, "vocab_size": 151936, "rms_norm_eps": 1e-5})
    printed(capsys, "--config", path)
    config = config_file.model_config_for(config_file_args(path), path)
    checkpoint = config_file.ensure_random_model(config)
    written = Qwen3Config.from_pretrained(checkpoint)
    assert {k: getattr(written, k) for k in shape} == shape and written.rms_norm_eps == 1e-5
    assert checkpoint == config_file.random_model_dir(config)  # the same shape, the same model
    assert "vocab_size" in failure(capsys, "--config", write(tmp_path, {**shape, "vocab_size": 150000}, "v.json"))
    assert "num_key_value_heads" in failure(capsys, "--config", write(tmp_path, {"num_key_value_heads": 3}, "h.json"))


def config_file_args(path: str):
    from python_layer.cli import _explicit_flags, serve_parser

    args = serve_parser().parse_args(["--config", path])
    config_file.apply(args, serve_parser(), _explicit_flags(["--config", path]), path)
    return args
