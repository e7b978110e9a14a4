import json
from pathlib import Path

import huggingface_hub.constants
import pytest

from python_layer.model.config import QWEN3_PRESETS, Qwen3Config


def test_from_pretrained_reads_config_and_generation_config(tiny_checkpoint: Path) -> None:
    c = Qwen3Config.from_pretrained(tiny_checkpoint)
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (64, 4, 2, 32)
    assert c.head_dim != c.hidden_size // c.num_attention_heads
    assert c.rope_theta == 1_000_000.0 and c.rope_scaling is None and c.tie_word_embeddings
    assert c.eos_token_ids == [151645, 151643]
    assert c.generation_defaults == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def test_transformers4_style_config_json(tmp_path: Path) -> None:
    """Published Qwen3 config.json files carry rope_theta / rope_scaling at the top level."""
    d = {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_theta": 1000000,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        "eos_token_id": 151645,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "sliding_window": None,
    }
    (tmp_path / "config.json").write_text(json.dumps(d))
    c = Qwen3Config.from_pretrained(tmp_path)
    assert c.rope_scaling["factor"] == 4.0 and c.rope_theta == 1e6 and c.eos_token_ids == [151645]


def test_dict_round_trip() -> None:
    c = Qwen3Config(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=48,
                    rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096})
    assert Qwen3Config.from_dict(c.to_dict()) == c
    assert Qwen3Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_presets_have_published_numbers() -> None:
    p = QWEN3_PRESETS
    assert set(p) == {"Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B"}
    small = p["Qwen3-0.6B"]
    assert (small.num_hidden_layers, small.hidden_size, small.intermediate_size) == (28, 1024, 3072)
    assert (small.num_attention_heads, small.num_key_value_heads, small.head_dim, small.vocab_size) == (
        16,
        8,
        128,
        151936,
    )
    assert small.max_position_embeddings == 40960 and small.rms_norm_eps == 1e-6 and small.tie_word_embeddings
    assert (p["Qwen3-4B"].num_hidden_layers, p["Qwen3-4B"].hidden_size, p["Qwen3-4B"].num_attention_heads) == (
        36,
        2560,
        32,
    )
    assert (p["Qwen3-32B"].num_hidden_layers, p["Qwen3-32B"].num_attention_heads, p["Qwen3-32B"].intermediate_size) == (
        64,
        64,
        25600,
    )
    assert not p["Qwen3-8B"].tie_word_embeddings and p["Qwen3-1.7B"].tie_word_embeddings
    assert all(c.rope_theta == 1e6 and c.num_key_value_heads == 8 for c in p.values())


@pytest.mark.parametrize("bad, field", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"num_attention_heads": 6, "num_key_value_heads": 4}, "num_key_value_heads"),
    ({"head_dim": 33}, "head_dim"),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"num_hidden_layers": "28"}, "num_hidden_layers"),
])
def test_validation_names_the_bad_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Qwen3Config(**bad)


def test_other_model_types_are_rejected() -> None:
    with pytest.raises(ValueError, match="model_type is 'llama'"):
        Qwen3Config.from_dict({"model_type": "llama"})


def test_missing_directory_and_missing_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Qwen3Config.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="No config.json"):
        Qwen3Config.from_pretrained(tmp_path)


def test_hub_id_offline_with_nothing_cached_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="offline") as raised:
        Qwen3Config.from_pretrained("Qwen/Qwen3-0.6B")
    assert "hf download Qwen/Qwen3-0.6B" in str(raised.value)  # the CLI huggingface_hub installs (not huggingface-cli)


def test_hub_id_resolves_from_the_local_hub_cache(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real hub path: an id already in the Hugging Face cache loads offline."""
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-Tiny"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in ("config.json", "generation_config.json"):
        (snapshot / f).write_bytes((tiny_checkpoint / f).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert Qwen3Config.from_pretrained("Qwen/Qwen3-Tiny") == Qwen3Config.from_pretrained(tiny_checkpoint)
