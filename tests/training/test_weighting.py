"""Dynamic task weights follow w <- (1-β) w + β L̄_t / Σ L̄ (embforge/weighting.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embforge.training.weighting import DynamicWeights


def test_weights_follow_the_formula_on_a_scripted_loss_sequence():
    beta, every = 0.3, 6
    dw = DynamicWeights([2.0, 1.0, 1.0], every=every, smoothing=beta, names=["a", "b", "c"])
    rng = np.random.default_rng(0)
    expected = np.array([0.5, 0.25, 0.25])
    window: list[list[float]] = [[], [], []]
    updates = 0
    for step in range(1, 31):
        task = (step - 1) % 3  # scripted: every task twice per window
        loss = float([3.0, 1.0, 0.5][task] * (1 + 0.2 * rng.standard_normal()))
        dw.observe(task, loss)
        window[task].append(loss)
        record = dw.step(step)
        if step % every:
            assert record is None
            continue
        means = np.array([np.mean(w) for w in window])
        expected = (1 - beta) * expected + beta * means / means.sum()
        np.testing.assert_allclose(dw.weights, expected, rtol=1e-12)
        assert record["task_mean_loss"] == pytest.approx(dict(zip("abc", means)))
        assert record["task_weights"] == pytest.approx(dict(zip("abc", expected)))
        window = [[], [], []]
        updates += 1
    assert updates == 5
    assert dw.weights[0] > 0.55 and dw.weights[2] < 0.25  # the hard task gained weight, the easy one lost


def test_unseen_task_keeps_its_weight_and_stale_means_are_reused():
    dw = DynamicWeights([1.0, 1.0, 2.0], every=1, smoothing=1.0)
    dw.observe(0, 3.0)
    dw.observe(1, 1.0)
    dw.step(1)
    # task 2 never seen: target = its own weight 0.5; tasks 0/1 share the other 0.5 by loss 3:1
    np.testing.assert_allclose(dw.weights, [0.375, 0.125, 0.5])
    dw.observe(2, 4.0)
    dw.step(2)
    # now tasks 0/1 keep their last means (3, 1), task 2 has 4: shares 3/8, 1/8, 4/8
    np.testing.assert_allclose(dw.weights, [0.375, 0.125, 0.5])
    dw.observe(2, 12.0)
    dw.step(3)
    np.testing.assert_allclose(dw.weights, [3 / 16, 1 / 16, 12 / 16])


def test_floor_and_state_round_trip():
    dw = DynamicWeights([1.0, 1.0], every=1, smoothing=1.0, floor=0.1)
    dw.observe(0, 100.0)
    dw.observe(1, 0.0)
    dw.step(1)
    assert min(dw.weights) >= 0.09  # floored then renormalised
    again = DynamicWeights([1.0, 1.0], every=1, smoothing=1.0, floor=0.1)
    again.load_state_dict(json.loads(json.dumps(dw.state_dict())))
    assert again.state_dict() == dw.state_dict()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"every": 0}, "every"), ({"every": 1, "smoothing": 2.0}, "smoothing")],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicWeights([1.0], **kwargs)


def test_relative_weights_compare_progress_not_loss_scale():
    """Task a's loss is 10x b's but falls by half; b's does not fall: relative weighting favours b."""
    dw = DynamicWeights([1.0, 1.0], every=2, smoothing=1.0, relative=True, names=["a", "b"])
    plain = DynamicWeights([1.0, 1.0], every=2, smoothing=1.0, names=["a", "b"])
    for step, (a, b) in enumerate([(10.0, 1.0), (5.0, 1.0)], start=1):
        for weights in (dw, plain):
            weights.observe(0, a)
            weights.observe(1, b)
            weights.step(2 * step - 1)
            record = weights.step(2 * step)
    assert record is not None
    # first window: both ratios are 1 -> equal weights; second: ratios 0.5 and 1 -> 1/3 and 2/3
    np.testing.assert_allclose(dw.weights, [1 / 3, 2 / 3])
    np.testing.assert_allclose(plain.weights, [5 / 6, 1 / 6])  # by scale, a dominates
    state = json.loads(json.dumps(dw.state_dict()))
    again = DynamicWeights([1.0, 1.0], every=2, smoothing=1.0, relative=True)
    again.load_state_dict(state)
    assert again.initial == [10.0, 1.0]
