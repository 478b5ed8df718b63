"""The training features that are off by default, behind one extension point: each is an :class:`Extra`, the
trainer holds the ones a config asks for in a list, and the loop calls every one at the same places.

- :class:`Anchored`: L2-SP / EWC pulls toward the starting weights after every step, WiSE-FT / LiNeS at the end
  (:mod:`embforge.training.anchor`, ``TrainConfig.anchor``);
- :class:`Averaged`: an EMA or a soup of the weights, swapped into the model at the end
  (:mod:`embforge.training.averaging`, ``TrainConfig.averaging``);
- :class:`Reweighted`: loss-share task weights (:mod:`embforge.training.weighting`, ``TrainConfig.weighting``).

Where the loop calls them (:mod:`embforge.training.loop`): :meth:`Extra.observe` after each micro-step,
:meth:`Extra.task_weights` when it draws a batch, :meth:`Extra.after_step` after each optimiser step (before the
schedule moves on, so ``lr`` is the step's), :meth:`Extra.at_end` after the last step — in reverse order, as
wrappers unwind: the average is swapped in before the anchor mixes it with the start — then the final evaluation and
save see the result. Checkpoints keep each one's state (:attr:`Extra.state_key` in ``trainer_state.pt``; the task
weights in ``progress.json``, where earlier versions wrote them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from embforge.protocols import TrainableModel
from embforge.training.anchor import Anchor, start_anchor
from embforge.training.averaging import WeightAverage, weight_average
from embforge.training.state import Progress
from embforge.training.weighting import DynamicWeights

if TYPE_CHECKING:
    from embforge.training.config import TrainConfig
    from embforge.training.tasks import Task

Record = dict[str, object]  # a line of metrics.jsonl
State = dict[str, Any]  # what a checkpoint keeps of an extra (tensors, numbers, lists)
SUMMARY_KEYS = ("averaged", "anchored")  # what train_summary.json says of the extras (None: not used)


class Extra:
    """An off-by-default feature of the loop. Each method does nothing here; a feature overrides the ones it uses."""

    state_key: ClassVar[str | None] = (
        None  # its entry of a checkpoint's trainer_state.pt (None: keeps none there)
    )
    summary_key: ClassVar[str | None] = None  # its entry of train_summary.json (one of SUMMARY_KEYS)

    def observe(self, task: int, loss: Tensor) -> None:
        """After each micro-step: the task it drew from and its loss (detached; read it lazily, no sync)."""

    def task_weights(self, weights: list[float]) -> list[float]:
        """The weights the next batch's task is drawn with, given the ones so far."""
        return weights

    def after_step(self, model: TrainableModel, *, step: int, lr: float) -> Record | None:
        """After optimiser step ``step`` (at learning rate ``lr``); a record for ``metrics.jsonl``, if any."""
        return None

    def at_end(self, model: TrainableModel) -> None:
        """After the last step, before the final evaluation and save."""

    def describe(self) -> dict[str, object]:
        """The settings and what was done, for the summary."""
        return {}

    def end_record(self) -> Record | None:
        """A ``metrics.jsonl`` record written when the run finishes, if any."""
        return None

    def state_dict(self) -> State:
        return {}

    def load_state_dict(self, state: State) -> None:
        """Restore what :meth:`state_dict` gave (a resumed run)."""

    def save_progress(self, progress: Progress) -> None:
        """Before a checkpoint: write this feature's part of ``progress.json``, if any."""

    def load_progress(self, progress: Progress) -> None:
        """On resume: read this feature's part of ``progress.json``, if any."""


class Anchored(Extra):
    """An :class:`~embforge.training.anchor.Anchor`: pulled toward after every step, mixed in at the end."""

    state_key = "anchor"
    summary_key = "anchored"

    def __init__(self, anchor: Anchor) -> None:
        self.anchor = anchor

    def after_step(self, model: TrainableModel, *, step: int, lr: float) -> Record | None:
        self.anchor.pull(lr)  # L2-SP / EWC: decay toward the starting weights
        return None

    def at_end(self, model: TrainableModel) -> None:
        self.anchor.mix()  # WiSE-FT / LiNeS: the final weights mixed with the starting ones

    def describe(self) -> dict[str, object]:
        return self.anchor.describe()

    def state_dict(self) -> State:
        return self.anchor.state_dict()

    def load_state_dict(self, state: State) -> None:
        self.anchor.load_state_dict(state)


class Averaged(Extra):
    """A :class:`~embforge.training.averaging.WeightAverage`: folded in after every step, swapped in at the end."""

    state_key = "averaging"
    summary_key = "averaged"

    def __init__(self, average: WeightAverage) -> None:
        self.average = average

    def after_step(self, model: TrainableModel, *, step: int, lr: float) -> Record | None:
        self.average.update(model, step)
        return None

    def at_end(self, model: TrainableModel) -> None:
        self.average.apply(model)  # the final evaluation, checkpoint and model are the average

    def describe(self) -> dict[str, object]:
        return self.average.describe()

    def end_record(self) -> Record | None:
        return {"event": "averaged", **self.average.describe()}

    def state_dict(self) -> State:
        return self.average.state_dict()

    def load_state_dict(self, state: State) -> None:
        self.average.load_state_dict(state)


class Reweighted(Extra):
    """:class:`~embforge.training.weighting.DynamicWeights`: the tasks' losses in, the sampling weights out."""

    def __init__(self, dynamic: DynamicWeights) -> None:
        self.dynamic = dynamic

    def observe(self, task: int, loss: Tensor) -> None:
        self.dynamic.observe(task, loss)

    def task_weights(self, weights: list[float]) -> list[float]:
        return self.dynamic.weights

    def after_step(self, model: TrainableModel, *, step: int, lr: float) -> Record | None:
        return self.dynamic.step(step)  # the new weights every `every` steps, logged

    def save_progress(self, progress: Progress) -> None:
        progress.dynamic_weights = self.dynamic.state_dict()

    def load_progress(self, progress: Progress) -> None:
        if progress.dynamic_weights is not None:
            self.dynamic.load_state_dict(progress.dynamic_weights)


def build_extras(
    model: TrainableModel, tasks: Sequence[Task], config: TrainConfig, *, total_steps: int
) -> list[Extra]:
    """The extras ``config`` asks for, in the order the loop calls them after a step (the anchor pulls the step's
    weights before the average takes them). The anchor copies ``model``'s weights now: before the first step."""
    extras: list[Extra] = []
    anchor = start_anchor(model, tasks, config.anchor, seed=config.seed)
    if anchor is not None:
        extras.append(Anchored(anchor))
    average = weight_average(model, config.averaging, total_steps, save_every=config.checkpoints.save_every)
    if average is not None:
        extras.append(Averaged(average))
    weighting = config.weighting
    if weighting.dynamic_weights_every:
        dynamic = DynamicWeights(
            [t.weight for t in tasks],
            every=weighting.dynamic_weights_every,
            smoothing=weighting.dynamic_weights_smoothing,
            relative=weighting.dynamic_weights_relative,
            names=[t.name for t in tasks],
        )
        extras.append(Reweighted(dynamic))
    return extras


def summary(extras: Sequence[Extra]) -> dict[str, object]:
    """What ``train_summary.json`` says of the extras: one entry per :data:`SUMMARY_KEYS`, ``None`` when unused."""
    described = {extra.summary_key: extra.describe() for extra in extras if extra.summary_key is not None}
    return {key: described.get(key) for key in SUMMARY_KEYS}
