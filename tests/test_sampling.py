"""Token selection rules, on hand-made logits."""

from __future__ import annotations

import numpy as np
import pytest

from anychip_models.sampling import SamplingParams, apply_repetition_penalty, sample


def draws(logits, n=2000, **kw):
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=kw.pop("temperature", 1.0), **kw)
    return np.bincount([sample(np.asarray(logits, float), params, rng, []) for _ in range(n)], minlength=len(logits))


def test_greedy_picks_the_largest_logit():
    assert sample(np.array([0.1, 3.0, 2.9]), SamplingParams(), np.random.default_rng(0), []) == 1


def test_top_k_and_top_p_cut_the_tail():
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    assert set(np.nonzero(draws(logits, top_k=2))[0]) == {0, 1}
    assert set(np.nonzero(draws(logits, top_p=0.7))[0]) == {0, 1}      # 0.5 + 0.3 reaches 0.7
    assert set(np.nonzero(draws(logits, top_p=0.5))[0]) == {0}
    counts = draws(logits)
    assert np.allclose(counts / counts.sum(), [0.5, 0.3, 0.15, 0.05], atol=0.04)


def test_temperature_sharpens():
    logits = np.log([0.6, 0.4])
    cold, hot = draws(logits, temperature=0.2), draws(logits, temperature=5.0)
    assert cold[0] / cold.sum() > 0.85 and 0.4 < hot[0] / hot.sum() < 0.6


def test_repetition_penalty_lowers_seen_tokens_either_sign():
    out = apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert sample(np.array([2.0, 1.5]), SamplingParams(repetition_penalty=2.0), np.random.default_rng(0), [0]) == 1


@pytest.mark.parametrize("field,value", [("top_k", -1), ("top_p", 0.0), ("top_p", 1.1), ("temperature", -0.5),
                                         ("repetition_penalty", 0.0), ("max_new_tokens", 0), ("stop", [""])])
def test_invalid_parameters_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value}).validate()
