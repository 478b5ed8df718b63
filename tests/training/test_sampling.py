"""Task sampling strategies, no-duplicate batches and plan determinism (embforge/sampling.py)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from embforge.losses import CoSENTLoss, InfoNCELoss, MatryoshkaLoss, SimCSELoss
from embforge.training.batches import row_texts, uses_in_batch_negatives
from embforge.training.sampling import TaskPlan, epoch_plan, task_probabilities
from embforge.training.state import Progress

SIZES = [100, 400, 1600]
WEIGHTS = [3.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("uniform", [1 / 3, 1 / 3, 1 / 3]),
        ("weight", [0.6, 0.2, 0.2]),
        ("size", [100 / 2100, 400 / 2100, 1600 / 2100]),
        # p ∝ w · n^0.5 = 3·10, 1·20, 1·40
        ("temperature", [30 / 90, 20 / 90, 40 / 90]),
    ],
)
def test_task_frequencies_follow_the_strategy(strategy, expected):
    np.testing.assert_allclose(task_probabilities(SIZES, WEIGHTS, strategy, alpha=0.5), expected)
    counts = Counter()
    for epoch in range(4):  # 4 epochs x 132 batches, fixed seed
        plan = epoch_plan(SIZES, WEIGHTS, 16, seed=7, epoch=epoch, strategy=strategy, alpha=0.5)
        counts.update(b.task for b in plan)
    observed = np.array([counts[t] for t in range(3)], dtype=float)
    result = chisquare(observed, np.array(expected) * observed.sum())
    assert result.pvalue > 0.001, (observed, expected)
    # and a wrong hypothesis is rejected by the same test (so the test has power)
    wrong = np.roll(np.array(expected), 1) if strategy != "uniform" else np.array([0.6, 0.2, 0.2])
    assert chisquare(observed, wrong * observed.sum()).pvalue < 0.001


def test_temperature_alpha_one_is_size_and_zero_is_weight():
    np.testing.assert_allclose(
        task_probabilities(SIZES, [1, 1, 1], "temperature", alpha=1.0),
        task_probabilities(SIZES, WEIGHTS, "size"),
    )
    np.testing.assert_allclose(
        task_probabilities(SIZES, WEIGHTS, "temperature", alpha=0.0),
        task_probabilities(SIZES, WEIGHTS, "weight"),
    )


def test_epoch_strategy_uses_every_row_once():
    plan = epoch_plan([10, 37], [1.0, 5.0], 4, seed=0, epoch=3)
    for task, size in enumerate([10, 37]):
        rows = [r for b in plan if b.task == task for r in b.rows]
        assert sorted(rows) == list(range(size))


def test_cycling_strategy_reshuffles_a_small_task():
    plan = epoch_plan([4, 400], [1, 1], 4, seed=0, epoch=0, strategy="uniform")
    small = [b.rows for b in plan if b.task == 0]
    assert len(small) > 10  # the 1-batch task was drawn ~half the time: it cycles through new passes
    assert all(sorted(rows) == [0, 1, 2, 3] for rows in small)
    assert len(set(small)) > 1  # each pass is a fresh shuffle


def test_plan_is_a_pure_function_of_seed_and_epoch():
    a = epoch_plan(SIZES, WEIGHTS, 8, seed=1, epoch=2, strategy="temperature")
    b = epoch_plan(SIZES, WEIGHTS, 8, seed=1, epoch=2, strategy="temperature")
    c = epoch_plan(SIZES, WEIGHTS, 8, seed=1, epoch=3, strategy="temperature")
    assert a == b
    assert a != c


def test_resume_mid_epoch_with_changed_weights_draws_the_same_batches():
    """A run interrupted at position 50 (having changed weights at 30) continues exactly as the full run."""

    def run(stop: int | None, progress: Progress | None = None) -> tuple[list, Progress]:
        plan = TaskPlan(SIZES, 8, seed=5, epoch=0, strategy="weight")
        progress = progress or Progress()
        taken = []
        while progress.position < len(plan) and progress.position != stop:
            weights = WEIGHTS if progress.position < 30 else [1.0, 1.0, 8.0]
            taken.append(plan.take(progress, weights))
        return taken, progress

    full, _ = run(None)
    first, state = run(50)
    # what a checkpoint keeps: the progress as JSON
    rest, _ = run(None, Progress.from_dict(json.loads(json.dumps(state.to_dict()))))
    assert first + rest == full


def test_unknown_strategy_is_an_error():
    with pytest.raises(ValueError, match="temperature"):
        TaskPlan([3], 2, seed=0, epoch=0, strategy="random")


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.sampled_from([f"t{i}" for i in range(12)]), min_size=2, max_size=120),
    batch_size=st.integers(2, 9),
    seed=st.integers(0, 1000),
    grouped=st.booleans(),
)
def test_no_duplicate_text_inside_an_in_batch_negative_batch(texts, batch_size, seed, grouped):
    # rows are (anchor, positive) pairs over a tiny vocabulary, so duplicates are everywhere
    anchors, positives = texts[::2], texts[1::2]
    n = min(len(anchors), len(positives))
    rows = row_texts([anchors[:n], positives[:n]])
    lengths = [len(a) + len(p) for a, p in zip(anchors, positives)] if grouped else None
    plan = epoch_plan(
        [n],
        [1.0],
        batch_size,
        seed=seed,
        epoch=0,
        lengths=None if lengths is None else [lengths[:n]],
        distinct=[rows],
    )
    for batch in plan:
        seen = [t for r in batch.rows for t in rows[r]]
        assert len(seen) == len(set(seen)), batch
        assert 1 <= len(batch.rows) <= batch_size
    assert sorted(r for b in plan for r in b.rows) == list(range(n))  # nothing lost or repeated


def test_which_losses_get_distinct_batches():
    assert uses_in_batch_negatives(InfoNCELoss())
    assert uses_in_batch_negatives(SimCSELoss())
    assert uses_in_batch_negatives(MatryoshkaLoss(InfoNCELoss(), [8, 16]))
    assert not uses_in_batch_negatives(CoSENTLoss())


def test_a_stream_that_ends_at_a_window_end_gives_each_row_once_an_epoch():
    """128 rows in windows of 32: the epoch ends after the fourth window's batches; the fifth, empty, is read
    after the fourth's last batch, not discovered by drawing a batch of the next pass into this epoch."""
    rows, window = 128, 32
    plan = TaskPlan(
        [None], 8, seed=1, epoch=0, windows=[window], counts=[lambda s, e: max(0, min(e, rows) - s)]
    )
    progress = Progress()
    taken: list[int] = []
    while progress.position < len(plan):
        taken += plan.take(progress, [1.0]).rows
    assert sorted(taken) == list(range(rows)) and progress.position == 16
