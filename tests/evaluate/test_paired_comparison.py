"""``benchmarks/_paired.py``: two models on the same test items — the difference, its interval, McNemar."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, spearmanr

from tests.conftest import benchmark_module


def _paired():
    return benchmark_module("_paired")


def test_mcnemar_counts_the_items_only_one_model_gets_right():
    paired = _paired()
    a = np.array([1, 1, 1, 0, 0, 1, 1, 1, 1, 1], dtype=float)  # right only with a: items 0, 1, 2
    b = np.array([0, 0, 0, 1, 0, 1, 1, 1, 1, 1], dtype=float)  # right only with b: item 3
    result = paired.compare(a, b, np.zeros(10), "accuracy", resamples=500)
    assert (result["only_model"], result["only_against"]) == (3, 1)
    assert result["difference"] == pytest.approx(20.0)
    assert result["mcnemar_p"] == pytest.approx(binomtest(3, 4).pvalue)  # 0.625
    assert result["low"] <= result["difference"] <= result["high"]


def test_the_same_outcomes_differ_by_nothing_and_are_not_resolved():
    paired = _paired()
    rng = np.random.default_rng(0)
    scores, gold = rng.normal(size=200), rng.normal(size=200)
    result = paired.compare(scores, scores.copy(), gold, "spearman", resamples=200)
    assert result["value"] == pytest.approx(100 * spearmanr(scores, gold).statistic)
    assert result["difference"] == result["low"] == result["high"] == 0.0


def test_a_clear_gain_has_an_interval_above_zero_and_a_small_one_does_not():
    paired = _paired()
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 2, size=2000).astype(float)
    weak = gold + rng.normal(scale=2.0, size=2000)  # a noisy scorer
    strong = gold + rng.normal(scale=0.5, size=2000)
    gain = paired.compare(strong, weak, gold, "ap", resamples=300)
    assert gain["difference"] > 0 and gain["low"] > 0
    nudge = paired.compare(weak + rng.normal(scale=0.05, size=2000), weak, gold, "ap", resamples=300)
    assert nudge["low"] < 0 < nudge["high"]


def test_outcomes_of_different_items_are_refused():
    with pytest.raises(ValueError, match="different items"):
        _paired().compare(np.ones(5), np.ones(4), np.ones(5), "accuracy")


def test_shares_of_several_classifiers_get_the_interval_but_no_mcnemar():
    paired = _paired()
    a, b = np.array([1.0, 0.9, 0.5, 0.0]), np.array([1.0, 0.8, 0.5, 0.1])
    result = paired.compare(a, b, np.zeros(4), "accuracy", resamples=200)
    assert result["difference"] == pytest.approx(0.0)
    assert "mcnemar_p" not in result and result["low"] <= 0 <= result["high"]
