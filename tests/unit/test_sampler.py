import pytest
import torch

from python_layer.inference.sampler import Sampler
from python_layer.inference.sampling_params import SamplingParams


def _draws(logits: torch.Tensor, params: SamplingParams, n: int = 2000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([int(Sampler()(logits[None], [params], [g])[0]) for _ in range(n)])


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -5.0])


def test_greedy_and_mixed_parameters_in_one_batch() -> None:
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.0)]
    tokens = Sampler()(logits, params, [None, None, torch.Generator().manual_seed(1), None])
    assert tokens[0] == logits[0].argmax() and tokens[1] == logits[1].argmax() and tokens[3] == logits[3].argmax()
    assert Sampler.greedy_sampling(logits).tolist() == logits.argmax(-1).tolist()


def test_temperature_sampling_follows_the_softmax() -> None:
    draws = _draws(LOGITS, SamplingParams(temperature=0.7), n=4000)
    freq = torch.bincount(draws, minlength=8).float() / len(draws)
    torch.testing.assert_close(freq, (LOGITS / 0.7).softmax(-1), atol=0.03, rtol=0)


def test_top_k_top_p_min_p_keep_only_their_sets() -> None:
    assert set(_draws(LOGITS, SamplingParams(top_k=3)).tolist()) == {0, 1, 2}
    probs = LOGITS.softmax(-1)  # 0.43, 0.26, 0.16, ...: the nucleus of 0.7 is tokens 0-2
    assert probs[:2].sum() < 0.7 <= probs[:3].sum()
    assert set(_draws(LOGITS, SamplingParams(top_p=0.7)).tolist()) == {0, 1, 2}
    allowed = set((probs >= 0.2 * probs.max()).nonzero().flatten().tolist())
    assert set(_draws(LOGITS, SamplingParams(min_p=0.2)).tolist()) == allowed


def test_seed_makes_sampling_reproducible() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    assert _draws(LOGITS, params, n=50, seed=7).tolist() == _draws(LOGITS, params, n=50, seed=7).tolist()
    assert _draws(LOGITS, params, n=50, seed=7).tolist() != _draws(LOGITS, params, n=50, seed=8).tolist()


def test_design_document_static_methods() -> None:
    logits = torch.randn(3, 20)
    assert Sampler.top_k_top_p_sampling(logits, temperature=0.0).tolist() == logits.argmax(-1).tolist()
    tokens = Sampler.top_k_top_p_sampling(logits, temperature=0.7, top_k=2, top_p=1.0)
    top2 = logits.topk(2).indices
    assert all(t in row for t, row in zip(tokens.tolist(), top2.tolist()))
    assert Sampler.temperature_sampling(logits, 1.0).shape == (3,)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.2}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": 1.5}, "seed"),
])
def test_invalid_sampling_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field} "):
        SamplingParams(**kwargs)


def test_sampling_params_normalization() -> None:
    p = SamplingParams(stop="END", top_k=-1)
    assert p.stop == ["END"] and p.top_k == 0 and not p.greedy and SamplingParams(temperature=0).greedy
