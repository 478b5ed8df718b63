"""Batch plans for one or many tasks: which task gives each batch, and which of its rows.

Every batch comes from a single task. A plan is a pure function of ``(seed, epoch, sizes, strategy, ...)`` plus
the task weights in force when each batch is drawn, so a resumed run that restores ``(epoch, position,
cursors, weights)`` draws exactly the batches the interrupted run would have drawn.

Task sampling strategies (``strategy=``):

=============== ============================================ ===========================================
strategy        probability of task *t* for the next batch   rows
=============== ============================================ ===========================================
``epoch``       ∝ ``weight_t × batches of t left``           every row once per epoch (the default)
``uniform``     ``1 / T``                                    each task cycles through its shuffled rows
``weight``      ∝ ``weight_t``                               cycles
``size``        ∝ ``n_t``                                    cycles
``temperature`` ∝ ``weight_t × n_tᵅ`` (α = 1: size, 0: flat)  cycles
=============== ============================================ ===========================================

Tasks whose loss uses in-batch negatives get ``distinct`` row texts: a batch never holds the same text twice,
because a duplicate would be scored as a negative of itself (a false negative).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STRATEGIES = ("epoch", "uniform", "weight", "size", "temperature")


@dataclass(frozen=True)
class PlannedBatch:
    """One batch: a task index and row indices into that task's data."""

    task: int
    rows: tuple[int, ...]


def task_probabilities(
    sizes: Sequence[int], weights: Sequence[float], strategy: str, *, alpha: float = 0.5
) -> np.ndarray:
    """Probability of each task for the next batch under a cycling ``strategy`` (not ``epoch``).

    >>> task_probabilities([100, 400], [1, 1], "temperature", alpha=0.5).round(3).tolist()
    [0.333, 0.667]
    """
    n = np.asarray(sizes, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if strategy == "uniform":
        p = np.ones_like(n)
    elif strategy == "weight":
        p = w.copy()
    elif strategy == "size":
        p = n.copy()
    elif strategy == "temperature":
        p = w * n**alpha
    else:
        raise ValueError(f"sampling strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    p[n == 0] = 0.0
    if p.sum() <= 0 or (p < 0).any():
        raise ValueError(f"task weights must be >= 0 with at least one > 0, got {list(weights)}")
    return p / p.sum()


def _order(size: int, rng: np.random.Generator, lengths: Sequence[int] | None, mega: int) -> list[int]:
    order = rng.permutation(size)
    if lengths is not None and size:
        order = np.concatenate(
            [sorted(order[i : i + mega], key=lambda r: -lengths[r]) for i in range(0, size, mega)]
        )
    return [int(r) for r in order]


def _cut(
    order: list[int], batch_size: int, keys: Sequence[Sequence[Hashable]] | None
) -> list[tuple[int, ...]]:
    """Cut ``order`` into batches; with ``keys``, no two rows in one batch share a key (rows that would are
    moved to the next batch that has room for them, so every row is still used once)."""
    if keys is None:
        return [tuple(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    batches: list[tuple[int, ...]] = []
    pending = list(order)
    while pending:
        batch: list[int] = []
        seen: set[Hashable] = set()
        deferred: list[int] = []
        for i, row in enumerate(pending):
            row_keys = set(keys[row])
            if seen.isdisjoint(row_keys):
                batch.append(row)
                seen |= row_keys
                if len(batch) == batch_size:
                    deferred.extend(pending[i + 1 :])
                    break
            else:
                deferred.append(row)
        batches.append(tuple(batch))
        pending = deferred
    return batches


def task_batches(
    size: int,
    batch_size: int,
    rng: np.random.Generator,
    *,
    lengths: Sequence[int] | None = None,
    distinct: Sequence[Sequence[Hashable]] | None = None,
    group_factor: int = 50,
) -> list[tuple[int, ...]]:
    """Shuffle ``range(size)`` into batches; every row appears exactly once (some batches may be short).

    With ``lengths`` (length-grouped batching), rows are shuffled, cut into mega-batches of
    ``group_factor * batch_size`` rows, sorted by length inside each, and the resulting batches shuffled: batches
    hold texts of similar length (less padding) while staying random across the epoch. With ``distinct``
    (the texts of each row), no text occurs twice in a batch.
    """
    order = _order(size, rng, lengths, group_factor * batch_size)
    batches = _cut(order, batch_size, distinct)
    if lengths is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class TaskPlan:
    """The batches of one epoch over several tasks, drawn one at a time.

    Each task has a queue of batches (its rows shuffled, pass after pass for the cycling strategies); the
    task of the batch at ``position`` is picked with a uniform number fixed by ``(seed, epoch, position)`` and
    the current weights, and the task's queue gives the rows at its cursor. The epoch has as many batches as
    one pass over every task (so ``steps per epoch`` does not depend on the strategy).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: int,
        *,
        seed: int,
        epoch: int,
        strategy: str = "epoch",
        alpha: float = 0.5,
        lengths: Sequence[Sequence[int] | None] | None = None,
        distinct: Sequence[Sequence[Sequence[Hashable]] | None] | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"sampling strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sizes = [int(n) for n in sizes]
        self.batch_size = batch_size
        self.seed, self.epoch, self.strategy, self.alpha = seed, epoch, strategy, alpha
        self.lengths = lengths
        self.distinct = distinct
        self.queues = [self._pass(t, 0) for t in range(len(self.sizes))]
        self.passes = [1] * len(self.sizes)
        self.length = sum(len(q) for q in self.queues)
        self.draws = np.random.default_rng([seed, epoch, 1 << 20]).random(self.length)

    def _pass(self, task: int, k: int) -> list[tuple[int, ...]]:
        rng = np.random.default_rng([self.seed, self.epoch, task, k])
        return task_batches(
            self.sizes[task],
            self.batch_size,
            rng,
            lengths=None if self.lengths is None else self.lengths[task],
            distinct=None if self.distinct is None else self.distinct[task],
        )

    def __len__(self) -> int:
        return self.length

    def probabilities(self, weights: Sequence[float], cursors: Sequence[int]) -> np.ndarray:
        """Probability of each task for the next batch, given the weights and the batches already taken."""
        if self.strategy != "epoch":
            return task_probabilities(self.sizes, weights, self.strategy, alpha=self.alpha)
        left = np.array([len(q) - c for q, c in zip(self.queues, cursors)], dtype=np.float64)
        p = np.asarray(weights, dtype=np.float64) * np.maximum(left, 0)
        if p.sum() <= 0:  # only zero-weight tasks have batches left: take them in turn
            p = np.maximum(left, 0)
        return p / p.sum()

    def batch(self, position: int, cursors: Sequence[int], weights: Sequence[float]) -> PlannedBatch:
        """The batch at ``position`` when task ``t`` has already given ``cursors[t]`` batches this epoch."""
        if not 0 <= position < self.length:
            raise IndexError(f"position {position} outside the epoch's {self.length} batches")
        p = self.probabilities(weights, cursors)
        task = min(int(np.searchsorted(np.cumsum(p), self.draws[position], side="right")), len(p) - 1)
        while p[task] == 0:  # float round-off at the top end of the cumulative sum
            task -= 1
        cursor = cursors[task]
        while cursor >= len(self.queues[task]):  # cycling strategies: the task's next shuffled pass
            self.queues[task] = self.queues[task] + self._pass(task, self.passes[task])
            self.passes[task] += 1
        return PlannedBatch(task, self.queues[task][cursor])

    def take(self, progress: dict[str, Any], weights: Sequence[float]) -> PlannedBatch:
        """The next batch for a trainer's ``progress`` (``position`` and ``cursors``), advancing both."""
        cursors = progress.setdefault("cursors", [0] * len(self.sizes))
        planned = self.batch(progress["position"], cursors, weights)
        progress["position"] += 1
        cursors[planned.task] += 1
        return planned


def epoch_plan(
    sizes: Sequence[int], weights: Sequence[float], batch_size: int, **plan_options: Any
) -> list[PlannedBatch]:
    """All batches of one epoch with fixed ``weights``: ``plan_options`` are :class:`TaskPlan`'s (``seed`` and
    ``epoch``, optionally ``strategy``, ``alpha``, ``lengths``, ``distinct``).

    With the default ``strategy="epoch"`` every task's rows are used once, a task's chance of giving the next
    batch being proportional to ``weight × batches left`` (with one task this is just its batches).
    """
    plan = TaskPlan(sizes, batch_size, **plan_options)
    progress: dict[str, Any] = {"position": 0}
    return [plan.take(progress, weights) for _ in range(len(plan))]


def uses_in_batch_negatives(loss: Any) -> bool:
    """Whether a loss scores each row against the other rows of its batch (its ``in_batch_negatives`` flag;
    see :class:`embforge.losses.base.EmbeddingLoss`), so duplicates in a batch are false negatives."""
    return bool(getattr(loss, "in_batch_negatives", False))


def row_texts(columns: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Per row, the texts of all its text columns (the keys that must stay distinct inside a batch)."""
    return [tuple(dict.fromkeys(texts)) for texts in zip(*columns)] if columns else []
