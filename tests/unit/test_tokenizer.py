import hashlib

import pytest
from transformers import AutoTokenizer

from python_layer.tokenizer import CheckpointTokenizer, get_tokenizer
from python_layer.tokenizer.qwen_tokenizer import ASSETS_DIR

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.  Two spaces,\ttab,\nnewline.",
    "你好，世界！今天天气怎么样？",
    "日本語とEnglishの混在テキスト",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "emoji 🎉🚀 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>",
    "<|endoftext|>special tokens mid-text<tool_call>{\"a\": 1}</tool_call>",
    "   leading and trailing spaces   ",
    "",
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(ASSETS_DIR)


def test_vendored_files_keep_their_checksums() -> None:
    expected = {
        "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
    }
    for name, digest in expected.items():
        assert hashlib.sha256((ASSETS_DIR / name).read_bytes()).hexdigest() == digest


def test_known_ids() -> None:
    tok = get_tokenizer()
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [151644, 872, 198, 13048, 151645]
    assert tok.vocab_size == 151669
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (151645, 151643, None)
    assert tok.special_tokens["<|im_start|>"] == 151644 and 151645 in tok.all_special_ids
    assert get_tokenizer() is tok


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(hf_tokenizer, text: str) -> None:
    tok = get_tokenizer()
    ids = tok.encode(text)
    assert ids == hf_tokenizer.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip_special_tokens=skip) == hf_tokenizer.decode(ids, skip_special_tokens=skip)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_checkpoint_tokenizer_files_are_used(tiny_checkpoint) -> None:
    tok = CheckpointTokenizer(tiny_checkpoint)
    assert tok.path == tiny_checkpoint and tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    with pytest.raises(FileNotFoundError):
        CheckpointTokenizer(tiny_checkpoint / "missing")
