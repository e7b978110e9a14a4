import random

import pytest

from python_layer.tokenizer import IncrementalDetokenizer, get_tokenizer

TEXTS = [
    "你好，世界！这是一个测试。",
    "emoji 🎉🚀👨‍👩‍👧‍👦 and 🇯🇵 flags",
    "mixed 日本語 text with ü, é and ∑ symbols",
    "<|im_start|>assistant\n<think>\nok\n</think>\n\n答案是 42 ✅<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_pieces_join_to_full_decode_without_broken_characters(text: str, skip_special_tokens: bool) -> None:
    tok = get_tokenizer()
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    pieces = [detok.add(t) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip_special_tokens)
    assert all("\ufffd" not in p for p in pieces)
    if any("\ufffd" in tok.decode([t]) for t in ids):  # some character is split over tokens
        assert "" in pieces[:-1], "a character split over tokens must be held back"


FAMILY = "👨\u200d👩\u200d👧"  # the zero-width joiner U+200D (3 UTF-8 bytes) spans two byte-level tokens


def test_character_split_over_tokens_is_held_back_until_complete() -> None:
    tok = get_tokenizer()
    ids = tok.encode(FAMILY)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(t) for t in ids]
    assert "" in pieces and all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == FAMILY


def test_flush_emits_an_incomplete_tail_like_decode() -> None:
    tok = get_tokenizer()
    ids = tok.encode("ok " + FAMILY)
    cut = next(i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tok)
    text = "".join(detok.add(t) for t in ids[:cut]) + detok.flush()
    assert text == tok.decode(ids[:cut])


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_ids_join_to_full_decode(skip_special_tokens: bool) -> None:
    """A random-weight model samples any id: special ones, split characters, and ids past the tokenizer's
    vocabulary (Qwen3's embedding has 151,936 rows, its tokenizer 151,669 tokens)."""
    tok = get_tokenizer()
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(151_600, 151_936) if rng.random() < 0.2 else rng.randrange(151_600)
               for _ in range(rng.randint(1, 30))]
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
        text = "".join(detok.add(t) for t in ids) + detok.flush()
        assert text == tok.decode(ids, skip_special_tokens=skip_special_tokens), ids


def test_tokens_after_a_flush_start_afresh() -> None:
    tok = get_tokenizer()
    first, second = tok.encode("ok " + FAMILY[:2]), tok.encode(" 你好")
    detok = IncrementalDetokenizer(tok)
    head = "".join(detok.add(t) for t in first) + detok.flush()
    tail = "".join(detok.add(t) for t in second) + detok.flush()
    assert (head, tail) == (tok.decode(first), tok.decode(second))
