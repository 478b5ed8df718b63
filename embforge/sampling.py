"""Batch plans: which rows of which task make each batch, deterministically from (seed, epoch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PlannedBatch:
    """One batch: a task index and row indices into that task's data."""

    task: int
    rows: tuple[int, ...]


def task_batches(
    size: int,
    batch_size: int,
    rng: np.random.Generator,
    *,
    lengths: Sequence[int] | None = None,
    group_factor: int = 50,
) -> list[tuple[int, ...]]:
    """Shuffle ``range(size)`` into batches; every row appears exactly once (the last batch may be short).

    With ``lengths`` (length-grouped batching), rows are shuffled, cut into mega-batches of
    ``group_factor * batch_size`` rows, sorted by length inside each, and the resulting batches shuffled: batches
    hold texts of similar length (less padding) while staying random across the epoch.
    """
    order = rng.permutation(size)
    if lengths is not None:
        mega = group_factor * batch_size
        order = (
            np.concatenate(
                [sorted(order[i : i + mega], key=lambda r: -lengths[r]) for i in range(0, size, mega)]
            )
            if size
            else order
        )
    batches = [tuple(int(r) for r in order[i : i + batch_size]) for i in range(0, size, batch_size)]
    if lengths is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def epoch_plan(
    sizes: Sequence[int],
    weights: Sequence[float],
    batch_size: int,
    *,
    seed: int,
    epoch: int,
    lengths: Sequence[Sequence[int] | None] | None = None,
) -> list[PlannedBatch]:
    """All batches of one epoch over several tasks, each batch from a single task.

    Every task's rows are used once per epoch. Tasks are interleaved at random, a task's chance of giving the
    next batch being proportional to ``weight × batches left`` (with one task this is just its batches).
    """
    rng = np.random.default_rng([seed, epoch])
    per_task = [
        task_batches(n, batch_size, rng, lengths=None if lengths is None else lengths[t])
        for t, n in enumerate(sizes)
    ]
    left = np.array([len(b) for b in per_task], dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    plan = []
    while left.sum() > 0:
        p = w * left
        task = int(rng.choice(len(sizes), p=p / p.sum())) if len(sizes) > 1 else 0
        k = len(per_task[task]) - int(left[task])
        plan.append(PlannedBatch(task, per_task[task][k]))
        left[task] -= 1
    return plan
