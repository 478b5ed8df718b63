"""Dynamic task weights: tasks whose loss stays high get sampled more often.

Every ``every`` optimiser steps the weights move toward each task's share of the recent mean loss:

.. math::

    \\bar L_t = \\text{mean loss of task } t \\text{ over the last window}, \\qquad
    w_t \\leftarrow (1 - \\beta)\\, w_t + \\beta\\, \\frac{\\bar L_t}{\\sum_s \\bar L_s}

with ``β = smoothing`` and the weights first normalised to sum to 1. With ``relative=True`` each task's mean is
first divided by its own first window's mean (``\\bar L_t / \\bar L_t^{(0)}``, the "loss ratio" of DWA-style
schemes), so that tasks are compared by how far their loss has come down rather than by its scale — otherwise a
CoSENT task (loss ~7) outweighs an InfoNCE task (~0.6) whatever their progress. A task that gave no batch in the window
keeps its previous mean (or, if it has none yet, its current weight as its target), so rarely sampled tasks
are not starved; a loss that is not finite is left out (the loop reports it at its next log line). Weights never drop below ``floor`` (then are renormalised) so every task keeps being seen.
The state is a plain dict saved with the trainer's progress, so a resumed run continues the same schedule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from embforge.fields import check_ranges, setting
from embforge.ranges import NON_NEGATIVE_INT, RATIO


@dataclass
class DynamicWeighting:
    """Loss-share task weights as a run asks for them (``TrainConfig.weighting``; ``every`` 0: fixed weights)."""

    dynamic_weights_every: int = setting(0, range=NON_NEGATIVE_INT)  # 0 = fixed weights
    dynamic_weights_smoothing: float = setting(0.5, range=RATIO)
    dynamic_weights_relative: bool = False

    def __post_init__(self) -> None:
        check_ranges(self)


class DynamicWeights:
    """Loss-share task weights updated every ``every`` steps with smoothing ``β``.

    Example:
        >>> dw = DynamicWeights([1.0, 1.0], every=2, smoothing=0.5)
        >>> dw.observe(0, 3.0); dw.observe(1, 1.0)
        >>> dw.step(1) is None, dw.step(2)["task_weights"]
        (True, {'0': 0.625, '1': 0.375})
    """

    def __init__(
        self,
        weights: Sequence[float],
        *,
        every: int,
        smoothing: float = 0.5,
        floor: float = 0.0,
        relative: bool = False,
        names: Sequence[str] | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"dynamic weights: every must be >= 1 step, got {every}")
        if not 0.0 <= smoothing <= 1.0:
            raise ValueError(f"dynamic weights: smoothing must be in [0, 1], got {smoothing}")
        if not 0.0 <= floor * len(weights) < 1.0:
            raise ValueError(
                f"dynamic weights: floor × tasks must be in [0, 1), got {floor} × {len(weights)}"
            )
        total = float(sum(weights))
        if total <= 0 or min(weights) < 0:
            raise ValueError(f"task weights must be >= 0 with a positive sum, got {list(weights)}")
        self.weights = [float(w) / total for w in weights]
        self.every = every
        self.smoothing = smoothing
        self.floor = floor
        self.relative = relative
        self.initial: list[float | None] = [None] * len(weights)
        self.names = list(names) if names is not None else [str(i) for i in range(len(weights))]
        self.sums = [0.0] * len(weights)
        self.counts = [0] * len(weights)
        self.means: list[float | None] = [None] * len(weights)
        self.pending: list[tuple[int, float | Tensor]] = []  # losses not read yet

    def observe(self, task: int, loss: float | Tensor) -> None:
        """Record one batch's loss for ``task`` (a tensor is read when the weights next need it, all at once: no
        device sync per batch)."""
        self.pending.append((task, loss))

    def _fold(self) -> None:
        """Add the pending losses to their task's window (one read of the device for all of them)."""
        tensors = [loss.detach().float() for _, loss in self.pending if isinstance(loss, Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else [])
        for task, loss in self.pending:
            value = next(read) if isinstance(loss, Tensor) else float(loss)
            if math.isfinite(value):
                self.sums[task] += value
                self.counts[task] += 1
        self.pending = []

    def step(self, step: int) -> dict[str, object] | None:
        """After optimiser step ``step``: update the weights when it is a multiple of ``every``.

        Returns:
            ``None`` between updates, else a record for ``metrics.jsonl``: step, the window's mean losses and
            the new weights (both by task name).
        """
        if step % self.every:
            return None
        self._fold()
        for t, (total, count) in enumerate(zip(self.sums, self.counts)):
            if count:
                self.means[t] = total / count
                if self.initial[t] is None:
                    self.initial[t] = self.means[t]
        progress = [
            None if m is None else m / i if self.relative and i else m
            for m, i in zip(self.means, self.initial)
        ]
        known = [m for m in progress if m is not None]
        if known and sum(known) > 0:
            total_known = sum(known)
            share_known = sum(w for w, m in zip(self.weights, progress) if m is not None)
            # tasks not seen yet aim at their current weight; the seen ones share the rest by loss
            target = [
                w if m is None else share_known * m / total_known for w, m in zip(self.weights, progress)
            ]
            beta = self.smoothing
            new = [(1 - beta) * w + beta * g for w, g in zip(self.weights, target)]
            new = [max(w, self.floor) for w in new]
            self.weights = [w / sum(new) for w in new]
        self.sums = [0.0] * len(self.sums)
        self.counts = [0] * len(self.counts)
        return {
            "step": step,
            "task_weights": dict(zip(self.names, self.weights)),
            "task_mean_loss": {n: m for n, m in zip(self.names, self.means) if m is not None},
        }

    def state_dict(self) -> dict[str, list[float] | list[int] | list[float | None]]:
        """JSON-able state (weights, the current window and the last means)."""
        self._fold()
        return {
            "weights": self.weights,
            "sums": self.sums,
            "counts": self.counts,
            "means": self.means,
            "initial": self.initial,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["weights"]) != len(self.weights):
            raise ValueError(
                f"dynamic-weight state has {len(state['weights'])} tasks, this run has {len(self.weights)}"
            )
        self.weights = [float(w) for w in state["weights"]]
        self.sums = [float(s) for s in state["sums"]]
        self.counts = [int(c) for c in state["counts"]]
        self.means = [None if m is None else float(m) for m in state["means"]]
        self.initial = [
            None if m is None else float(m) for m in state.get("initial", [None] * len(self.weights))
        ]
