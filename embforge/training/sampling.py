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
because a duplicate would be scored as a negative of itself (a false negative); one task's batches are cut by
:mod:`embforge.training.batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embforge.training.batches import Sliced, window_batches
from embforge.training.state import Progress

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


class _TaskOrder:
    """One task's batches in one epoch: pass after pass (cycling strategies), each pass window after window.

    A window is cut (shuffled, grouped by length, texts kept distinct, split into batches) when a batch in it is
    first asked for; only that window's batches are kept. ``cursor`` counts the task's batches this epoch, so
    asking for an earlier one replays the cuts from the start of the epoch (the plan stays a pure function).
    """

    def __init__(self, plan: TaskPlan, task: int) -> None:
        self.plan, self.task = plan, task
        self.restart()

    def restart(self) -> None:
        self.pass_, self.window, self.first = 0, -1, 0  # the cut window and its first cursor
        self.batches: Sequence[tuple[int, ...]] = ()
        self.cut_batches = 0  # batches of pass 0's windows cut so far
        self.cut_rows = 0
        self.pass_ended = False  # pass 0 is cut to its end
        self.last_size = 0
        self.ahead = False  # a stream's full window used up: read the next one before counting the pass
        self.last_drawn = -1  # the cursor drawn() was last told of

    def get(self, cursor: int) -> tuple[int, ...]:
        if cursor < self.first:
            self.restart()
        while cursor >= self.first + len(self.batches):
            self._next_window()
        return self.batches[cursor - self.first]

    def _next_window(self) -> None:
        self.ahead = False
        self.first += len(self.batches)
        k = self.window + 1
        start, size = self.plan.window_span(self.task, k)
        if size == 0:  # the pass is over: the next one (cycling strategies)
            if k == 0:
                raise ValueError(f"task {self.task} has no rows")
            self.pass_ended = True
            self.pass_, k = self.pass_ + 1, 0
            start, size = self.plan.window_span(self.task, 0)
        self.window, self.last_size = k, size
        self.batches = self.plan.cut(self.task, self.pass_, k, start, size)
        if self.pass_ == 0:
            self.cut_batches += len(self.batches)
            self.cut_rows += size

    def drawn(self, cursor: int) -> None:
        """Batch ``cursor`` was drawn: after the last batch of a stream's full window, the pass is counted only once
        the next window is read (:meth:`pass_batches`; not now, while that batch's rows are still to be fetched)."""
        if cursor == self.last_drawn:
            return
        self.last_drawn = cursor
        full = self.last_size == self.plan.windows[self.task] and self.plan.sizes[self.task] is None
        self.ahead = full and self.pass_ == 0 and cursor + 1 == self.first + len(self.batches)

    def pass_batches(self) -> float:
        """Batches in the task's first pass: exact for the windows cut, estimated (no deferrals) for the rest."""
        if self.ahead and not self.pass_ended:  # a stream ending at a window's end: the next window is empty
            self.ahead = False
            self.pass_ended = self.plan.window_span(self.task, self.window + 1)[1] == 0
        if self.pass_ended or self.pass_ > 0:
            return self.cut_batches
        size, window, b = self.plan.sizes[self.task], self.plan.windows[self.task], self.plan.batch_size
        if size is None:  # a stream of unknown length: one more window, unless the last one was short
            assert window is not None
            return self.cut_batches + (-(-window // b) if self.last_size == window or self.window < 0 else 0)
        left = size - self.cut_rows
        if window is None:
            return self.cut_batches + -(-left // b)
        full, rest = divmod(left, window)
        return self.cut_batches + full * -(-window // b) + -(-rest // b)


class TaskPlan:
    """The batches of one epoch over several tasks, drawn one at a time.

    Each task has a queue of batches (its rows shuffled, pass after pass for the cycling strategies); the
    task of the batch at ``position`` is picked with a uniform number fixed by ``(seed, epoch, position)`` and
    the current weights, and the task's queue gives the rows at its cursor. The epoch has as many batches as
    one pass over every task (so ``steps per epoch`` does not depend on the strategy).

    ``windows[t]`` (default: none) cuts task *t*'s pass into windows of that many consecutive rows, each shuffled
    and batched on its own: the plan then reads (keys, lengths) one window at a time, which a stream needs and
    which keeps a corpus-sized task's plan small. ``sizes[t]`` is ``None`` for a stream of unknown length; then
    ``counts[t](start, end)`` says how many rows a window holds (0 past the end). ``lengths[t]`` and
    ``distinct[t]`` are read by slices (``keys[start:end]``), a window at a time.
    """

    def __init__(
        self,
        sizes: Sequence[int | None],
        batch_size: int,
        *,
        seed: int,
        epoch: int,
        strategy: str = "epoch",
        alpha: float = 0.5,
        lengths: Sequence[Sliced[int] | None] | None = None,
        distinct: Sequence[Sliced[Sequence[Hashable]] | None] | None = None,
        windows: Sequence[int | None] | None = None,
        counts: Sequence[Callable[[int, int], int] | None] | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"sampling strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.sizes = [None if n is None else int(n) for n in sizes]
        self.windows = list(windows) if windows is not None else [None] * len(self.sizes)
        self.counts = list(counts) if counts is not None else [None] * len(self.sizes)
        for t, (size, window) in enumerate(zip(self.sizes, self.windows)):
            if size is None and (window is None or self.counts[t] is None):
                raise ValueError(f"task {t}: a source of unknown size needs a window and a row count")
        if None in self.sizes and strategy in ("size", "temperature"):
            raise ValueError(f"sampling {strategy!r} needs every task's size; a stream's size is not known")
        self.batch_size = batch_size
        self.seed, self.epoch, self.strategy, self.alpha = seed, epoch, strategy, alpha
        self.lengths = lengths
        self.distinct = distinct
        self._draw_rng = np.random.default_rng([seed, epoch, 1 << 20])
        self.draws = np.empty(0)
        self.orders = [_TaskOrder(self, t) for t in range(len(self.sizes))]
        for order in self.orders:  # the first window of every task: exact batch counts from the start
            order.get(0)

    def window_span(self, task: int, k: int) -> tuple[int, int]:
        """``(first row, rows)`` of window ``k`` of ``task`` (0 rows: past the end)."""
        size, window = self.sizes[task], self.windows[task]
        if window is None:
            assert size is not None
            return 0, size if k == 0 else 0
        start = k * window
        if size is not None:
            return start, max(0, min(window, size - start))
        count = self.counts[task]
        assert count is not None
        return start, count(start, start + window)

    def cut(self, task: int, k_pass: int, k: int, start: int, size: int) -> Sequence[tuple[int, ...]]:
        """The batches of window ``k`` of pass ``k_pass`` of ``task`` (rows ``start..start+size``)."""
        whole = self.windows[task] is None
        rng = np.random.default_rng(
            [self.seed, self.epoch, task, k_pass] if whole else [self.seed, self.epoch, task, k_pass, k]
        )
        lengths = None if self.lengths is None or self.lengths[task] is None else self.lengths[task]
        distinct = None if self.distinct is None or self.distinct[task] is None else self.distinct[task]
        batches = window_batches(
            size,
            self.batch_size,
            rng,
            lengths=None if lengths is None else lengths[start : start + size],
            distinct=None if distinct is None else distinct[start : start + size],
        )
        if start == 0:
            return batches
        return [tuple(start + r for r in batch) for batch in batches]

    def __len__(self) -> int:
        return int(sum(order.pass_batches() for order in self.orders))

    def _draw(self, position: int) -> float:
        if position >= len(self.draws):  # the same stream of numbers, drawn further
            more = max(position + 1 - len(self.draws), len(self.draws), 1024)
            self.draws = np.concatenate([self.draws, self._draw_rng.random(more)])
        return float(self.draws[position])

    def probabilities(self, weights: Sequence[float], cursors: Sequence[int]) -> np.ndarray:
        """Probability of each task for the next batch, given the weights and the batches already taken."""
        if self.strategy != "epoch":
            sizes = [1 if n is None else n for n in self.sizes]
            return task_probabilities(sizes, weights, self.strategy, alpha=self.alpha)
        left = np.array([o.pass_batches() - c for o, c in zip(self.orders, cursors)], dtype=np.float64)
        p = np.asarray(weights, dtype=np.float64) * np.maximum(left, 0)
        if p.sum() <= 0:  # only zero-weight tasks have batches left: take them in turn
            p = np.maximum(left, 0)
        return p / p.sum()

    def seek(self, cursors: Sequence[int]) -> None:
        """Cut each task's windows up to the one holding its last batch taken (``cursors[t] - 1``).

        What the plan knows of the epoch (its length, each task's batches left, which weigh the task draw) grows as
        windows are cut, so it is part of where the epoch is: a plan made afresh on ``--resume`` (or after a
        negative refresh) first re-cuts the windows the interrupted one had cut, reading them again, and then
        knows exactly what that one knew. A no-op when the plan drew those batches itself.
        """
        for order, cursor in zip(self.orders, cursors):
            if cursor > 0:
                order.get(cursor - 1)
                order.drawn(cursor - 1)

    def ended(self, progress: Progress) -> bool:
        """Whether ``progress`` has taken every batch of this epoch."""
        self.seek(progress.cursors)
        return progress.position >= len(self)

    def batch(self, position: int, cursors: Sequence[int], weights: Sequence[float]) -> PlannedBatch:
        """The batch at ``position`` when task ``t`` has already given ``cursors[t]`` batches this epoch."""
        self.seek(cursors)
        if not 0 <= position < len(self):
            raise IndexError(f"position {position} outside the epoch's {len(self)} batches")
        p = self.probabilities(weights, cursors)
        task = min(int(np.searchsorted(np.cumsum(p), self._draw(position), side="right")), len(p) - 1)
        while p[task] == 0:  # float round-off at the top end of the cumulative sum
            task -= 1
        rows = self.orders[task].get(cursors[task])
        self.orders[task].drawn(cursors[task])
        return PlannedBatch(task, rows)

    def take(self, progress: Progress, weights: Sequence[float]) -> PlannedBatch:
        """The next batch for a trainer's ``progress`` (its ``position`` and ``cursors``), advancing both."""
        if not progress.cursors:
            progress.cursors = [0] * len(self.sizes)
        planned = self.batch(progress.position, progress.cursors, weights)
        progress.position += 1
        progress.cursors[planned.task] += 1
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
    progress = Progress()
    return [plan.take(progress, weights) for _ in range(len(plan))]
