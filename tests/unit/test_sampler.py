import pytest
import torch

from python_layer.inference.sampler import BatchSampler, SamplerOutput, TokenHistory, apply_penalties
from python_layer.inference.sampling_params import BOUNDS, SamplingParams


def _draws(logits: torch.Tensor, params: SamplingParams, n: int = 2000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([BatchSampler()(logits[None], [params], [g]).token_ids[0] for _ in range(n)])


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0, -5.0])


def test_greedy_and_mixed_parameters_in_one_batch() -> None:
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.0)]
    out = BatchSampler()(logits, params, [None, None, torch.Generator().manual_seed(1), None])
    assert isinstance(out, SamplerOutput) and out.logprobs == [None] * 4
    tokens = out.token_ids
    assert tokens[0] == logits[0].argmax() and tokens[1] == logits[1].argmax() and tokens[3] == logits[3].argmax()


def test_greedy_is_torch_argmax_on_ties_nan_and_strided_rows() -> None:
    logits = torch.randn(6, 151936)
    logits[1, [7, 9000]] = 50.0  # a tie: the first one
    logits[2, 12345] = float("nan")  # a NaN wins, as in torch.argmax
    logits[3] = float("-inf")
    for rows in (logits, logits[::2], logits.t().contiguous().t()):
        greedy = [SamplingParams(temperature=0.0)] * rows.shape[0]
        assert BatchSampler()(rows, greedy, [None] * rows.shape[0]).token_ids == rows.argmax(dim=-1).tolist()


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


def _seeded_run(logits: torch.Tensor, params: list[SamplingParams], n: int = 200) -> list[int]:
    """Row 0's tokens over n steps, drawn from its own seeded generator, beside whatever rows 1.. are."""
    generators = [torch.Generator().manual_seed(3)] + [None] * (len(params) - 1)
    return [BatchSampler()(logits, params, generators).token_ids[0] for _ in range(n)]


def test_top_k_rows_draw_among_candidates_as_the_full_vocabulary_would() -> None:
    # a batch whose sampled rows all have a top_k draws among the max(top_k) best of each row; a row without
    # top_k sends the whole batch down the full-vocabulary path: a seeded row draws the same tokens either way
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(0)) * 2
    row = SamplingParams(temperature=0.9, top_k=6, top_p=0.9, min_p=0.05)
    alone = _seeded_run(logits, [row])
    beside_full_vocabulary = _seeded_run(logits.repeat(2, 1), [row, SamplingParams(temperature=1.0)])
    assert alone == beside_full_vocabulary and len(set(alone)) > 1
    assert set(alone) <= set(logits[0].topk(6).indices.tolist())


@pytest.mark.parametrize("top_k", [4, 1000])  # 1000: above the vocabulary, every token stays
def test_candidate_draws_follow_the_truncated_softmax(top_k: int) -> None:
    draws = _draws(LOGITS, SamplingParams(temperature=0.8, top_k=top_k), n=4000)
    freq = torch.bincount(draws, minlength=8).float() / len(draws)
    kept = (LOGITS / 0.8).masked_fill(torch.arange(8) >= top_k, float("-inf"))  # LOGITS is sorted descending
    torch.testing.assert_close(freq, kept.softmax(-1), atol=0.03, rtol=0)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.2}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"seed": 1.5}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"top_k": 2**40}, "top_k"),
    ({"stop_token_ids": [2**40]}, "stop_token_ids"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"frequency_penalty": 2.1}, "frequency_penalty"),
    ({"frequency_penalty": float("inf")}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"repetition_penalty": 5e-324}, "repetition_penalty"),
    ({"repetition_penalty": 1e300}, "repetition_penalty"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"logprobs": 1.5}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
])
def test_invalid_sampling_parameters_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"SamplingParams.{field} "):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_temperature_must_be_a_finite_number(value: float) -> None:
    with pytest.raises(ValueError, match=r"SamplingParams.temperature must be a finite number in \[0, 2\]"):
        SamplingParams(temperature=value)


def test_the_bounds_table_is_what_sampling_params_checks() -> None:
    for name, bound in BOUNDS.items():
        SamplingParams(**{name: bound.high})
        with pytest.raises(ValueError, match=f"SamplingParams.{name} "):
            SamplingParams(**{name: bound.high + 0.5})
        if bound.low_open:
            with pytest.raises(ValueError, match=f"SamplingParams.{name} "):
                SamplingParams(**{name: bound.low})
        else:
            SamplingParams(**{name: bound.low})


def test_sampling_params_normalization() -> None:
    p = SamplingParams(stop="END", top_k=-1)
    assert p.stop == ["END"] and p.top_k == 0 and not p.greedy and SamplingParams(temperature=0).greedy
    assert not p.has_penalties and p.logprobs is None
    assert SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1.5, logprobs=20).has_penalties


def test_temperatures_too_small_to_divide_by_are_greedy() -> None:
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.9]])
    for temperature in (5e-324, 1e-300, 9e-6):
        params = SamplingParams(temperature=temperature, top_k=2)
        assert params.greedy and BatchSampler()(logits, [params], [None]).token_ids == [1]
    assert not SamplingParams(temperature=1e-5).greedy


GREEDY = SamplingParams(temperature=0.0)


def _greedy(logits: list[float], params: SamplingParams, prompt: list[int], output: list[int]) -> int:
    return BatchSampler()(torch.tensor([logits]), [params], [None], [TokenHistory(prompt, output)]).token_ids[0]


def test_repetition_penalty_on_positive_negative_and_prompt_only_tokens() -> None:
    # 3.0 / 2 = 1.5 < 2.0: a repeated positive logit is divided and loses the argmax
    assert _greedy([3.0, 2.0, 0.0], SamplingParams(temperature=0, repetition_penalty=2.0), [2], [0]) == 1
    # the same from a prompt-only token; a token in neither is untouched
    assert _greedy([3.0, 2.0, 0.0], SamplingParams(temperature=0, repetition_penalty=2.0), [0], []) == 1
    assert _greedy([3.0, 2.0, 0.0], SamplingParams(temperature=0, repetition_penalty=2.0), [2], [2]) == 0
    # negative logits are multiplied: -1.0 * 2 = -2.0 < -1.5
    assert _greedy([-1.0, -1.5, -9.0], SamplingParams(temperature=0, repetition_penalty=2.0), [0], []) == 1
    # a penalty < 1 rewards: -1.5 * 0.5 = -0.75 > -1.0
    assert _greedy([-1.0, -1.5, -9.0], SamplingParams(temperature=0, repetition_penalty=0.5), [], [1]) == 1


def test_frequency_penalty_counts_output_occurrences_and_presence_does_not() -> None:
    logits, prompt, output = [3.0, 2.0, 0.0], [1, 1, 1], [0, 0, 0]
    # frequency: 3.0 - 0.4 * 3 = 1.8 < 2.0; presence: 3.0 - 0.4 = 2.6 > 2.0 (and prompt tokens count for neither)
    assert _greedy(logits, SamplingParams(temperature=0, frequency_penalty=0.4), prompt, output) == 1
    assert _greedy(logits, SamplingParams(temperature=0, presence_penalty=0.4), prompt, output) == 0
    assert _greedy(logits, SamplingParams(temperature=0, presence_penalty=1.5), prompt, output) == 1
    assert _greedy(logits, SamplingParams(temperature=0, frequency_penalty=2.0), prompt, []) == 0
    # negative penalties encourage repetition
    assert _greedy([2.0, 3.0, 0.0], SamplingParams(temperature=0, presence_penalty=-1.5), [], [0]) == 0


def test_all_penalties_match_a_hand_computed_row() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0, -0.5], [2.0, -1.0, 0.5, 1.0, -0.5]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25), SamplingParams()]
    histories = [TokenHistory([1, 4], [0, 2, 0, 4])] * 2
    # token 0: output x2 -> 2/2 - 0.5*2 - 0.25; 1: prompt only -> -1*2; 2: output x1 -> 0.5/2 - 0.5 - 0.25;
    # 3: in neither -> untouched; 4: prompt and output x1 -> -0.5*2 - 0.5 - 0.25. Row 1 has no penalties.
    expected = torch.tensor([[-0.25, -2.0, -0.5, 1.0, -1.75], [2.0, -1.0, 0.5, 1.0, -0.5]])
    torch.testing.assert_close(apply_penalties(logits, params, histories), expected)
    assert apply_penalties(logits, [SamplingParams()] * 2, None) is logits


def test_penalties_are_per_row_and_leave_the_logits_alone() -> None:
    logits = torch.tensor([[3.0, 2.0, 0.0]] * 4)
    raw = logits.clone()
    penalized = SamplingParams(temperature=0, frequency_penalty=1.5)
    sampled = SamplingParams(temperature=1.0, top_k=1, presence_penalty=2.0)
    params = [penalized, GREEDY, sampled, SamplingParams(temperature=1.0, top_k=1)]
    histories = [TokenHistory([], [0])] * 4
    generators = [None, None, torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    assert BatchSampler()(logits, params, generators, histories).token_ids == [1, 0, 1, 0]
    assert torch.equal(logits, raw)


def test_penalties_need_histories() -> None:
    logits = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="histories"):
        BatchSampler()(logits, [GREEDY, SamplingParams(temperature=0, presence_penalty=0.5)], [None, None])
    assert BatchSampler()(logits, [GREEDY, GREEDY], [None, None]).token_ids == [0, 0]


def test_logprobs_are_of_the_raw_logits() -> None:
    logits = torch.randn(3, 30)  # row 0 is penalized, scaled and truncated: its logprobs still are of the raw row
    params = [SamplingParams(temperature=0.5, top_k=3, repetition_penalty=1.7, logprobs=5),
              SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0)]
    out = BatchSampler()(
        logits, params, [torch.Generator().manual_seed(0), None, None], [TokenHistory([1, 2], [3])] * 3
    )
    expected = torch.log_softmax(logits, dim=-1)
    first, second, third = out.logprobs
    assert third is None and second is not None and first is not None
    assert second.token_id == out.token_ids[1] == int(logits[1].argmax()) and second.top == []
    assert second.logprob == pytest.approx(float(expected[1, second.token_id]), abs=1e-6)
    assert first.token_id == out.token_ids[0]
    assert first.logprob == pytest.approx(float(expected[0, first.token_id]), abs=1e-6)
    assert len(first.top) == 5
    assert [t for t, _ in first.top] == expected[0].topk(5).indices.tolist()
    torch.testing.assert_close(torch.tensor([v for _, v in first.top]), expected[0].topk(5).values)
    assert all(a[1] >= b[1] for a, b in zip(first.top, first.top[1:]))


def test_cpu_sampling_runs_on_one_torch_thread_and_restores_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    real_softmax = torch.Tensor.softmax
    monkeypatch.setattr(
        torch.Tensor, "softmax",
        lambda self, *a, **k: seen.append(torch.get_num_threads()) or real_softmax(self, *a, **k),
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        BatchSampler()(torch.randn(2, 40), [SamplingParams(top_p=0.9)] * 2, [None, None])  # torch's path
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
