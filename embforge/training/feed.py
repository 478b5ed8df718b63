"""The tasks as the training loop draws from them: prepared for the model, and one epoch's batch plan at a time.

:meth:`Feed.take` is the loop's "next batch": it starts the next epoch (a new :class:`~embforge.training.sampling.
TaskPlan`) when the current one is used up, and advances the run's :class:`~embforge.training.state.Progress`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from embforge.data.identity import identity
from embforge.data.sources import plan_window, row_count, source_files, window_counter
from embforge.training.batches import TextKeys, uses_in_batch_negatives
from embforge.training.config import TrainConfig
from embforge.training.sampling import PlannedBatch, TaskPlan
from embforge.training.state import Progress
from embforge.training.tasks import PreparedTask, Task, TokenLengths, prepare

if TYPE_CHECKING:
    from embforge.protocols import TrainableModel


@dataclass
class PlanInputs:
    """What the batch plan reads from the tasks: their sizes, shuffle windows (streams) and row counts (streams of
    unknown length), and, a window at a time, token lengths (length grouping) and distinct-text keys."""

    sizes: list[int | None]
    windows: list[int | None]
    counts: list[Callable[[int, int], int] | None]
    lengths: list[TokenLengths] | None
    distinct: list[TextKeys | None]

    def plan(self, config: TrainConfig, epoch: int) -> TaskPlan:
        """The batch plan of ``epoch``."""
        return TaskPlan(
            self.sizes,
            config.optim.batch_size,
            seed=config.seed,
            epoch=epoch,
            strategy=config.data.sampling,
            alpha=config.data.sampling_alpha,
            lengths=self.lengths,
            distinct=self.distinct,
            windows=self.windows,
            counts=self.counts,
        )


@dataclass
class Feed:
    """The run's tasks, prepared for the model (rows read and tokenised per batch), and the epoch's plan."""

    tasks: list[Task]
    prepared: list[PreparedTask]
    inputs: PlanInputs
    config: TrainConfig
    plan: TaskPlan | None = None  # made at the first batch, for the epoch the progress is in

    @classmethod
    def build(cls, model: TrainableModel, tasks: list[Task], config: TrainConfig) -> Feed:
        """Ready ``tasks`` for ``model`` and read what the plan needs of them."""
        prepared = [prepare(task, model) for task in tasks]
        inputs = PlanInputs(
            sizes=[row_count(t.data) for t in tasks],
            windows=[plan_window(t.data, config.data.shuffle_window or None) for t in tasks],
            counts=[window_counter(t.data) for t in tasks],
            lengths=[p.lengths for p in prepared] if config.data.group_by_length else None,
            # in-batch-negative tasks: no text twice in a batch (a duplicate would be its own false negative)
            distinct=[
                TextKeys(t.data, t.data.text_columns) if uses_in_batch_negatives(t.loss) else None
                for t in tasks
            ],
        )
        return cls(tasks, prepared, inputs, config)

    def files(self) -> list[list[dict[str, Any]]]:
        """Each task's files with their size and modification time (what a checkpoint records, so that a resume
        reading other data is refused: :mod:`embforge.data.identity`)."""
        return identity([source_files(task.data) for task in self.tasks])

    def take(self, progress: Progress, weights: Sequence[float]) -> tuple[PreparedTask, PlannedBatch]:
        """The next batch (its prepared task and rows), starting the next epoch when this one is used up."""
        if self.plan is None:
            self.plan = self.inputs.plan(self.config, progress.epoch)
        if self.plan.ended(progress):  # the windows this epoch went through re-cut first (a resume)
            progress.next_epoch(len(self.tasks))
            self.plan = self.inputs.plan(self.config, progress.epoch)
        batch = self.plan.take(progress, weights)
        return self.prepared[batch.task], batch
