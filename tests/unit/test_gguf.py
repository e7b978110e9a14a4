"""llama.cpp's GGUF files (python_layer/model/gguf_checkpoints.py): each tensor type read into MILI's formats with
gguf-py's values, the config and tokenizer from the metadata, and clear errors for files MILI cannot serve."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from python_layer.model.config import Qwen3Config
from python_layer.model.embedding_table import QuantizedEmbedding, gather_rows
from python_layer.model.gguf_checkpoints import GGUFTensors, config_from_metadata
from python_layer.model.gguf_tokenizer import write_tokenizer_files
from python_layer.model.hub import resolve_model_dir
from python_layer.model.quantization import Int4Weight, QuantizedWeight
from python_layer.model.random_checkpoint import build_random_checkpoint
from python_layer.model.weight_loader import WeightLoader
from python_layer.tokenizer.qwen_tokenizer import CheckpointTokenizer
from tests.gguf_files import K_QUANT_SCALES, tensor_data, write_gguf

GGUF_SHAPES = dict(hidden_size=256, intermediate_size=288, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=48, tie_word_embeddings=True)
"""K 256 for the K-quants' super-blocks; head_dim not hidden / heads; N not multiples of 64."""
CODED = ("Q4_K", "Q5_K", "Q6_K")
"""The K-quants: int8 codes of scales (and mins) times a float16 per super-block, as stored."""
FORMATS = {"Q8_0": (QuantizedWeight, 8, 32), "Q4_0": (Int4Weight, 4, 32), "Q4_1": (Int4Weight, 4, 32),
           "Q5_0": (Int4Weight, 6, 32), "Q5_1": (Int4Weight, 6, 32), "Q4_K": (Int4Weight, 4, 32),
           "Q5_K": (Int4Weight, 6, 32), "Q6_K": (Int4Weight, 6, 16)}


@pytest.fixture(scope="module")
def gguf_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_checkpoint(tmp_path_factory.mktemp("gguf") / "src", seed=4, dtype=torch.bfloat16,
                                   **GGUF_SHAPES)


def _gguf_file(path: Path, tensors: dict[str, tuple[np.ndarray, str]]) -> GGUFTensors:
    """A file of the tensors {GGUF name: (data as gguf-py writes it, type)}, read back."""
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=None if qtype == "F32" else gguf.GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFTensors.read(path)


def _one_tensor_file(path: Path, qtype: str, n: int = 7, k: int = 512) -> GGUFTensors:
    """A file holding one projection [n, k] of random values (or random blocks) in qtype."""
    return _gguf_file(path, {"blk.0.attn_q.weight": (tensor_data(torch.randn(n, k) * 0.05, qtype, seed=n + k), qtype)})


@pytest.mark.parametrize("qtype", sorted(FORMATS))
def test_each_type_reads_into_mili_format_with_gguf_values(tmp_path: Path, qtype: str) -> None:
    tensors = _one_tensor_file(tmp_path / "one.gguf", qtype)
    name = "model.layers.0.self_attn.q_proj.weight"
    weight, (kind, bits, block) = tensors.linear(name), FORMATS[qtype]
    assert isinstance(weight, kind) and weight.block_k == block
    assert (weight.bits if kind is Int4Weight else 8) == bits
    if kind is Int4Weight:  # a zero point's mins are one min per scale: no float16 per block
        assert weight.zero == {"Q4_0": 8, "Q5_0": 16, "Q6_K": 32}.get(qtype)
        assert (weight.supers is not None) == (qtype in CODED)
        assert weight.scales.dtype == (torch.int8 if qtype in CODED else torch.float16)
    ours, theirs = weight.dequantize(), tensors.dense(name)
    assert ours.shape == theirs.shape == (7, 512)
    assert torch.equal(ours, theirs)


SYMMETRIC = ("Q8_0", "Q4_0", "Q5_0", "Q6_K")
"""Types without mins (w = d * (q - zero)): their embedding tables keep none."""


@pytest.mark.parametrize("qtype", [*sorted(FORMATS), "F32", "F16", "BF16", "Q3_K"])
def test_embedding_table_keeps_the_file_form_and_gives_gguf_rows_exactly(tmp_path: Path, qtype: str) -> None:
    vocab, k = 37, 256 if qtype in K_QUANT_SCALES else 96
    tensors = _gguf_file(tmp_path / "embed.gguf", {
        "token_embd.weight": (tensor_data(torch.randn(vocab, k) * 0.05, qtype, seed=vocab), qtype)})
    name = "model.embed_tokens.weight"
    table, theirs = tensors.embedding(name), tensors.dense(name)
    ids = torch.tensor([36, 0, 5, 5, 17], dtype=torch.int32)
    assert torch.equal(gather_rows(table, ids, torch.float32), theirs[ids.long()])
    assert torch.equal(gather_rows(table, ids, torch.bfloat16), theirs[ids.long()].bfloat16())
    if qtype in FORMATS:
        assert isinstance(table, QuantizedEmbedding) and table.block == FORMATS[qtype][2]
        assert (table.mins is None) == (qtype in SYMMETRIC)
        held = sum(t.numel() * t.element_size() for t in table if isinstance(t, torch.Tensor))
        assert held <= theirs.numel() * 1.5  # of float32's 4 bytes a value
    else:
        assert table.dtype == {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                               "Q3_K": torch.float32}[qtype]


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q3_K", "Q2_K"])
def test_other_types_read_as_float32(tmp_path: Path, qtype: str) -> None:
    tensors = _one_tensor_file(tmp_path / "one.gguf", qtype, k=256 if qtype in K_QUANT_SCALES else 64)
    weight = tensors.linear("model.layers.0.self_attn.q_proj.weight")
    assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float32 and torch.isfinite(weight).all()


def test_config_and_tokenizer_come_from_the_metadata(gguf_source: Path, tmp_path: Path) -> None:
    path = write_gguf(gguf_source, tmp_path / "model.gguf", {}, default="Q8_0")
    directory = resolve_model_dir(path)
    assert resolve_model_dir(path) == directory  # made once
    ours, theirs = Qwen3Config.from_pretrained(directory), Qwen3Config.from_pretrained(gguf_source)
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "tie_word_embeddings"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)
    assert ours.gguf_weight_dtype == "int8" and 151645 in ours.eos_token_ids and 151643 in ours.eos_token_ids
    tokenizer, vendored = CheckpointTokenizer(directory), CheckpointTokenizer()
    vocab = tokenizer.backend.get_vocab()
    assert all(vocab[t] == i for t, i in vendored.backend.get_vocab().items())  # and the file's [PAD...] tokens
    assert tokenizer.special_tokens == vendored.special_tokens
    # Qwen's NFC normalizer: "e" + U+0301 is "é"
    text = "<|im_start|>user\nHello, 世界! cafe\u0301 def f(x):\n    return x ** 2<|im_end|><think>\n\n</think>"
    assert tokenizer.encode(text) == vendored.encode(text)
    assert tokenizer.encode("<think>") == [151667]  # the file's user-defined tokens stay whole
    assert tokenizer.decode(vendored.encode(text), skip_special_tokens=False) == vendored.decode(
        vendored.encode(text), skip_special_tokens=False)
    assert tokenizer.chat_template == vendored.chat_template and tokenizer.eos_token == "<|im_end|>"
    path.unlink()
    with pytest.raises(FileNotFoundError, match="links to a GGUF file that is gone"):
        WeightLoader(directory, ours).load_from_safetensors()


def test_tokens_llama_cpp_marks_control_keep_qwens_flags(tmp_path: Path) -> None:
    """llama.cpp's converter marks every <|...|> token CONTROL, <|fim_pad|> too, which Qwen's files leave unspecial."""
    tokens = ["a", "b", "ab", "<|im_end|>", "<|fim_pad|>", "<think>", "<|mine|>", "[PAD7]"]
    write_tokenizer_files({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
                           "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1, 1, 1, 3, 3, 4, 3, 5],
                           "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.eos_token_id": 3}, tmp_path)
    tokenizer = CheckpointTokenizer(tmp_path)
    assert tokenizer.special_tokens == {"<|im_end|>": 3, "<|mine|>": 6} and tokenizer.eos_token_id == 3
    assert tokenizer.encode("ab<|fim_pad|>a<think><|mine|>") == [2, 4, 0, 5, 6]
    assert tokenizer.chat_template is None


def test_files_mili_cannot_serve_say_why(gguf_source: Path, tmp_path: Path) -> None:
    meta = {"general.architecture": "llama", "llama.block_count": 2}
    with pytest.raises(ValueError, match="general.architecture is 'llama'"):
        config_from_metadata(meta, {"token_embd.weight": (10, 4)})
    with pytest.raises(ValueError, match="GGUF metadata lacks qwen3.embedding_length"):
        config_from_metadata({"general.architecture": "qwen3", "qwen3.attention.head_count": 2}, {})
    with pytest.raises(ValueError, match="tokenizer.ggml.model is 'llama' and tokenizer.ggml.pre 'default'"):
        write_tokenizer_files({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"}, tmp_path)
    with pytest.raises(ValueError, match="GGUF metadata lacks tokenizer.ggml.token_type, tokenizer.ggml.merges"):
        write_tokenizer_files({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
                               "tokenizer.ggml.tokens": ["a"]}, tmp_path)
    (tmp_path / "text.gguf").write_text("not a GGUF file")
    with pytest.raises(ValueError, match="cannot be read as a GGUF file"):
        resolve_model_dir(tmp_path / "text.gguf")
    with pytest.raises(ValueError, match="Unexpected tensor 'blk.0.attn_qkv.weight'"):
        _gguf_file(tmp_path / "odd.gguf", {"blk.0.attn_qkv.weight": (np.zeros((4, 32), np.float32), "F32")})
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    with pytest.raises(FileNotFoundError, match="or a llama.cpp .gguf file"):
        resolve_model_dir(text)


def test_projections_of_one_type_read_as_one(tmp_path: Path) -> None:
    tensors = _gguf_file(tmp_path / "two.gguf", {
        f"blk.0.{name}.weight": (tensor_data(torch.randn(5 + seed, 256), qtype, seed), qtype)
        for seed, (name, qtype) in enumerate([("attn_q", "Q4_K"), ("attn_k", "Q4_K"), ("attn_v", "Q6_K")])})
    q, k, v = (f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    both = tensors.linear(q, k)
    assert isinstance(both, Int4Weight) and both.out_features == 11
    assert torch.equal(both.dequantize(), torch.cat([tensors.linear(q).dequantize(), tensors.linear(k).dequantize()]))
    with pytest.raises(ValueError, match="not one GGUF type"):
        tensors.linear(q, v)
