"""Where a training run is: :class:`Progress`, the loop's counters, saved in every checkpoint as ``progress.json``.

The loop (:mod:`embforge.training.loop`) advances ``step`` and ``pairs``; the batch plan
(:meth:`embforge.training.sampling.TaskPlan.take`) advances ``position`` and ``cursors``; a new epoch resets
both. A resumed run that restores these counters (with the RNG and optimiser states) draws exactly the batches,
and computes exactly the weights, the interrupted run would have.

The file keeps the plain JSON object earlier embforge versions wrote (``step``, ``epoch``, ``position``,
``best``, ``pairs``, ``cursors``, and when used ``dynamic_weights``, ``refreshed_at``, ``run_id``), so their
checkpoints resume; keys this version does not know are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict


class Best(TypedDict):
    """The best evaluation so far: its step, the metric that ranks them and its value."""

    step: int
    metric: str
    value: float


# the keys written always, in their order in the file, and those written only when set
_ALWAYS = ("step", "epoch", "position", "best", "pairs", "cursors")
_WHEN_SET = ("dynamic_weights", "refreshed_at", "run_id")


@dataclass
class Progress:
    """The loop's counters, everything a resumed run needs besides the model and the optimiser.

    >>> progress = Progress(step=3, epoch=1, position=2, cursors=[1, 1], pairs=96)
    >>> Progress.from_dict(progress.to_dict()) == progress
    True
    """

    step: int = 0  # optimiser steps taken
    epoch: int = 0
    position: int = 0  # batches of this epoch's plan taken
    cursors: list[int] = field(default_factory=list)  # per task: its batches taken this epoch
    pairs: int = 0  # training rows seen (for the summary's pairs/s)
    best: Best | None = None
    dynamic_weights: dict[str, Any] | None = None  # loss-share task weights (training/weighting.py)
    refreshed_at: int | None = None  # the step of the last negative refresh (training/refresh.py)
    run_id: str | None = None  # set by the first checkpoint of a run (training/checkpoints.py)
    extra: dict[str, Any] = field(default_factory=dict)  # keys of other versions, kept as read

    def next_epoch(self, tasks: int) -> None:
        """Start the next epoch: its plan from the first batch, no task's batches taken yet."""
        self.epoch += 1
        self.position = 0
        self.cursors = [0] * tasks

    def to_dict(self) -> dict[str, Any]:
        """The JSON object a checkpoint's ``progress.json`` holds."""
        values: dict[str, Any] = {key: getattr(self, key) for key in _ALWAYS}
        values["cursors"] = list(self.cursors)
        values.update({key: getattr(self, key) for key in _WHEN_SET if getattr(self, key) is not None})
        return {**values, **self.extra}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Progress:
        """The progress a ``progress.json`` object describes (any embforge version's)."""
        known = {key: values[key] for key in (*_ALWAYS, *_WHEN_SET) if key in values}
        extra = {key: value for key, value in values.items() if key not in known}
        progress = cls(**known, extra=extra)
        progress.cursors = [int(c) for c in progress.cursors]
        return progress
