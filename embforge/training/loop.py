"""The training loop: tasks -> batches -> embeddings -> loss -> backward -> optimiser step, then log/eval/save.

Read :func:`train` top to bottom, as one would nanoGPT's: the set-up (:mod:`embforge.training.trainer`), then a
loop whose body takes a batch, runs :func:`micro_step` (embed, loss, backward) for each accumulated micro-batch,
steps the optimiser (fp16 unscaling, clipping, the schedule) and hands logging, evaluation, negative refresh and
checkpoints to :func:`after_step`. The loop's state is two dataclasses: the :class:`~embforge.training.state.
Progress` a checkpoint saves and the :class:`~embforge.training.trainer.Trainer` it steps.

The features that are off by default (anchor, weight average, loss-share task weights) are the trainer's
``extras`` (:mod:`embforge.training.extras`): one line calls every one of them at each place. Data parallelism
(``trainer.parallel``, set under torchrun) stays a visible line where it acts, as nanoGPT's ``if ddp`` lines do:
it changes what a micro-step embeds and when gradients are reduced, not what follows a step. The micro-steps'
losses stay on the device until :func:`after_step` logs, evaluates or saves (:meth:`Meter.check`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from embforge.files import append_jsonl
from embforge.modeling.lora import merge_lora, uses_adapters
from embforge.progress import phase
from embforge.protocols import TaskBatches
from embforge.training.artifacts import finalize_run, mark_finished, resume_finished
from embforge.training.checkpoints import atomic_dir, save_checkpoint
from embforge.training.config import TrainConfig, primary_metric
from embforge.training.distributed import barrier
from embforge.training.extras import summary as extras_summary
from embforge.training.feed import Feed
from embforge.training.model_card import task_info, write_model_card
from embforge.training.state import Best, Progress
from embforge.training.step import Forward, cached_step
from embforge.training.tasks import Task
from embforge.training.trainer import Trainable, Trainer, resolve_device, seed_everything, set_up, start

__all__ = ["Evaluator", "TrainConfig", "micro_step", "resolve_device", "seed_everything", "train"]

Evaluator = Callable[[Trainable], dict[str, float]]
Refresher = Callable[[int, Trainable], list[Task] | None]


def train(
    model: Trainable,
    tasks: list[Task],
    config: TrainConfig,
    *,
    evaluator: Evaluator | None = None,
    on_step: Callable[[int], None] | None = None,
    refresher: Refresher | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` on ``tasks``; write checkpoints, metrics and the final model to ``config.output``.

    Args:
        model: A model of any kind (:class:`~embforge.encoder.Encoder`, a cross-encoder, ...): what
            :class:`~embforge.training.trainer.Trainable` describes.
        tasks: One or more tasks; each batch comes from one task.
        config: Hyper-parameters and run options.
        evaluator: ``model -> metrics``; run every ``config.evaluation.eval_every`` steps and at the end. The best value
            of ``config.evaluation.metric`` (default: :func:`~embforge.training.config.primary_metric`) is kept in
            ``output/best``.
        on_step: Called with the step number after every optimiser step.
        refresher: Called as ``refresher(step, model)`` after every optimiser step; when it returns tasks (the
            same number, the same rows, new texts — e.g. refreshed hard negatives, see
            :class:`embforge.training.refresh.NegativeRefresher`) they replace ``tasks`` from the next step on; the
            step is saved in checkpoints as the progress's ``refreshed_at``, so that on resume the caller can pass
            the tasks that were in use (:meth:`~embforge.training.refresh.NegativeRefresher.resume`). Its
            ``close()``, if any, is called when training ends.

    Returns:
        A summary: steps, seconds, training pairs/s, final and best metrics.
    """
    Path(config.output).mkdir(parents=True, exist_ok=True)
    hooks = Hooks(evaluator, on_step, refresher)
    # the device, the seed, the tasks' batches, the optimiser and its schedule (training/trainer.py)
    trainer, feed = set_up(model, tasks, config)
    if trainer.world > 1 and refresher is not None:
        raise ValueError("negative refresh during training does not run under torchrun yet; train without it")
    if (
        config.checkpoints.resume and (done := _finished_run(trainer)) is not None
    ):  # a finished run: nothing to do
        hooks.close()  # a background refresh it may have started
        return done
    progress = start(trainer, feed)  # step 0, or every piece of state from the last checkpoint
    meter = Meter.open(trainer, progress)
    model.train()
    # quiet: no bar, so a run of minutes says once what it does (after PHASE_DELAY seconds; embforge/progress.py)
    with phase(_quiet_line(trainer, feed, progress), enabled=config.quiet and trainer.main):
        while progress.step < trainer.total_steps:
            trainer.optimizer.zero_grad(set_to_none=True)
            for micro in range(config.optim.grad_accum):
                task, batch = feed.take(progress, trainer.task_weights())
                # embed -> loss -> backward (in cached mini-batches with config.scale.mini_batch_size)
                loss = micro_step(trainer, task, batch.rows, sync=micro == config.optim.grad_accum - 1)
                # kept on the device: read (and checked to be finite) when the loop logs, as nanoGPT does
                meter.observe(feed.tasks[batch.task].name, loss, rows=len(batch.rows), step=progress.step + 1)
                for extra in trainer.extras:  # the off-by-default features (training/extras.py)
                    extra.observe(batch.task, loss)
            if trainer.parallel is not None:  # the loss modules' own parameters are not in DDP
                trainer.parallel.reduce_loss_gradients(trainer.losses)
            trainer.scaler.unscale_(trainer.optimizer)  # fp16: the true gradients, for clipping
            if config.optim.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(list(trainer.parameters()), config.optim.max_grad_norm)
            trainer.scaler.step(trainer.optimizer)  # skipped when an fp16 gradient overflowed
            trainer.scaler.update()
            for extra in trainer.extras:  # anchor pulls, weight averages, task weights: at the step's rate
                meter.record(extra.after_step(trainer.model, step=progress.step + 1, lr=trainer.rate()))
            trainer.scheduler.step()
            progress.step += 1
            progress.pairs += meter.take_rows()
            feed = after_step(trainer, feed, progress, meter, hooks)  # log, evaluate, refresh, save
    hooks.close()  # a background refresh still running cannot be used any more
    return finish(trainer, feed, progress, meter)


def micro_step(trainer: Trainer, task: TaskBatches, rows: Sequence[int], *, sync: bool) -> Tensor:
    """Embed ``rows`` of ``task``, compute the loss, back-propagate it; returns the loss, detached.

    With ``config.scale.mini_batch_size`` the three run cached (GradCache, :func:`~embforge.training.step.cached_step`):
    the same loss and gradients in a mini-batch's memory. Under torchrun this rank embeds its part of the batch
    through DDP (:mod:`embforge.training.distributed`), ``sync`` (the accumulation's last micro-step) lets DDP
    all-reduce the gradients, and the loss returned is the mean over the ranks.
    """
    config = trainer.config
    seed = int(torch.randint(0, 2**62, ()).item())  # this micro-step's dropout masks (modeling/dropout.py)
    net = cast("Forward", trainer.model)  # every model kind's forward is a micro-step's (training/step.py)
    if trainer.parallel is not None:  # this rank's part of the batch; DDP syncs in the last micro-step
        net, task, rows = trainer.parallel.shard(task, tuple(rows), sync=sync)
    with trainer.autocast():
        if config.scale.mini_batch_size:  # embed, loss, backward in mini-batches (training/step.py)
            loss = cached_step(
                net,
                task,
                rows,
                mini_batch_size=config.scale.mini_batch_size,
                max_tokens=config.scale.chunk_tokens,
                dropout_seed=seed,
                backward=trainer.backward,
            )
        else:
            embeddings = net(task.inputs(rows), max_tokens=config.scale.chunk_tokens, dropout_seed=seed)
            loss = task.loss_fn(embeddings, task.labels(rows))  # tensors in, a scalar out
    if not config.scale.mini_batch_size:
        trainer.backward(loss)  # fp16 scaling and the mean over accumulated micro-steps
    loss = loss.detach()
    return trainer.parallel.mean(loss) if trainer.parallel is not None else loss


def after_step(trainer: Trainer, feed: Feed, progress: Progress, meter: Meter, hooks: Hooks) -> Feed:
    """What follows an optimiser step: the losses read and checked (when something below needs them), after the
    last step the extras' end (the weight average swapped in, the anchor's mix); the log line, evaluation, the
    negative refresh (its tasks make the feed returned), the checkpoint and ``on_step``."""
    config, step = trainer.config, progress.step
    last = step == trainer.total_steps
    logs = step % config.evaluation.log_every == 0 or last
    evaluates = hooks.evaluator is not None and (_every(config.evaluation.eval_every, step) or last)
    saves = trainer.main and (
        _every(config.checkpoints.save_every, step) or (last and config.checkpoints.save_every)
    )
    meter.bar.update(1)
    trainer.host_memory.after_step()  # resident memory flat in the number of steps (CPU tensors of every shape)
    if logs or evaluates or saves:
        meter.check()  # the losses since the last check, read at once: a NaN stops the run before it is kept
    if last:  # in reverse, as wrappers unwind: the average swapped in, then mixed with the start
        for extra in reversed(trainer.extras):
            extra.at_end(trainer.model)
    if logs:
        meter.log(step=step, epoch=progress.epoch, lr=trainer.rate(), per_task=len(feed.tasks) > 1)
    if evaluates and hooks.evaluator is not None:
        evaluate(trainer, progress, meter, hooks.evaluator)
    fresh = hooks.refresher(step, trainer.model) if hooks.refresher is not None else None
    if fresh is not None:  # refreshed negatives: re-tokenise, re-plan this epoch, keep the position in it
        feed = Feed.build(trainer.model, fresh, config)
        trainer.model.train()
        progress.refreshed_at = step  # saved below: on resume the refresher restores these tasks
    if saves:
        for extra in trainer.extras:  # their part of progress.json (the task weights)
            extra.save_progress(progress)
        save_checkpoint(
            trainer.out / "checkpoints",
            model=trainer.model,
            losses=trainer.losses,
            trainer=trainer.saved(),
            progress=progress,
            keep=config.checkpoints.keep_checkpoints,
            data_files=trainer.data_files,
        )
    if hooks.on_step is not None:
        hooks.on_step(step)
    return feed


def _every(interval: int, step: int) -> bool:
    """Whether ``step`` is a multiple of ``interval`` (0: never)."""
    return bool(interval) and step % interval == 0


def _quiet_line(trainer: Trainer, feed: Feed, progress: Progress) -> str:
    """What a quiet run's loop says when it takes long: its steps, batch, tasks and output folder."""
    total, tasks = trainer.total_steps, len(feed.tasks)
    steps = f"steps {progress.step + 1} to {total}" if progress.step else f"{total} steps"
    return (
        f"train: {steps} of batch {trainer.config.optim.batch_size} over {tasks} task{'s' if tasks != 1 else ''} -> "
        f"{trainer.out} (quiet: no bar) ..."
    )


def evaluate(trainer: Trainer, progress: Progress, meter: Meter, evaluator: Evaluator) -> None:
    """Every rank evaluates (an evaluator splits its encoding over the ranks: :mod:`embforge.evaluate.ranks`);
    rank 0 logs the metrics and keeps the best model in ``output/best``."""
    with phase(f"train: step {progress.step}: evaluating ..."):
        meter.metrics = evaluator(trainer.model)
    trainer.model.train()
    if trainer.main:
        append_jsonl(meter.file, {"step": progress.step, "eval": meter.metrics})
        metric = trainer.config.evaluation.metric or primary_metric(meter.metrics)
        value = meter.metrics.get(metric) if metric is not None else None
        if (
            metric is not None
            and value is not None
            and (progress.best is None or value > progress.best["value"])
        ):
            progress.best = Best(step=progress.step, metric=metric, value=value)
            atomic_dir(trainer.out / "best", trainer.model.save)
    barrier()


@dataclass
class Hooks:
    """What the caller runs inside the loop: the evaluator, ``on_step`` and the negative refresher."""

    evaluator: Evaluator | None = None
    on_step: Callable[[int], None] | None = None
    refresher: Refresher | None = None

    def close(self) -> None:
        """Stop the refresher's background work, if it has a ``close()``."""
        close: Callable[[], None] | None = getattr(self.refresher, "close", None)
        if close is not None:
            close()


@dataclass
class Meter:
    """What the loop measures between log lines (losses, per task too; the rows of the step) and where it
    writes it: ``metrics.jsonl`` (rank 0 only) and the progress bar; and the last evaluation's metrics.

    The micro-steps' losses stay on the device (``pending``) until :meth:`check` reads them all at once — at a log
    line, an evaluation or a checkpoint — so the loop never waits for the device in between."""

    file: Path
    bar: tqdm
    started: float
    losses: list[float] = field(default_factory=list)
    task_losses: dict[str, list[float]] = field(default_factory=dict)
    rows: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    pending: list[tuple[int, str, Tensor]] = field(default_factory=list)  # (step, task, loss) not read yet

    @classmethod
    def open(cls, trainer: Trainer, progress: Progress) -> Meter:
        file = (
            trainer.out / "metrics.jsonl" if trainer.main else Path(os.devnull)
        )  # the other ranks log nowhere
        quiet = trainer.config.quiet or not trainer.main
        bar = tqdm(total=trainer.total_steps, initial=progress.step, disable=quiet, desc="train")
        return cls(file, bar, time.perf_counter())

    def observe(self, task: str, loss: Tensor, *, rows: int, step: int) -> None:
        """A micro-step of optimiser step ``step``: its task, its (detached) loss and its rows."""
        self.pending.append((step, task, loss))
        self.rows += rows

    def check(self) -> None:
        """Read the pending losses from the device (one read for all); an error naming the first step and task
        whose loss is NaN or infinite."""
        if not self.pending:
            return
        values = torch.stack([loss.float() for _, _, loss in self.pending]).tolist()
        for (step, task, _), value in zip(self.pending, values, strict=True):
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"loss became {value} at step {step} (task {task!r}); lower the learning rate or use amp='no'"
                )
            self.losses.append(value)
            self.task_losses.setdefault(task, []).append(value)
        self.pending = []

    def record(self, record: Mapping[str, object] | None) -> None:
        """Append ``record`` (an event of the run, if any) to ``metrics.jsonl``."""
        if record is not None:
            append_jsonl(self.file, record)

    def take_rows(self) -> int:
        """The rows of the step just taken (counted from zero again)."""
        rows, self.rows = self.rows, 0
        return rows

    def log(self, *, step: int, epoch: int, lr: float, per_task: bool) -> None:
        """One ``metrics.jsonl`` line: the mean loss since the last one (and per task), the learning rate."""
        self.check()
        mean_loss = float(np.mean(self.losses))
        record: dict[str, Any] = {"step": step, "epoch": epoch, "loss": mean_loss, "lr": lr}
        if per_task:
            record["task_loss"] = {k: float(np.mean(v)) for k, v in self.task_losses.items()}
        self.bar.set_postfix(loss=f"{mean_loss:.4f}")
        append_jsonl(self.file, record)
        self.losses, self.task_losses = [], {}


def _finished_run(trainer: Trainer) -> dict[str, Any] | None:
    """The summary of a run ``--resume`` finds finished (training/artifacts.py), else None."""
    keep = trainer.config.checkpoints.keep_training_state
    return resume_finished(trainer.out, trainer.total_steps, keep_training_state=keep, main=trainer.main)


def finish(trainer: Trainer, feed: Feed, progress: Progress, meter: Meter) -> dict[str, Any]:
    """Save the final model, the summary and the model card (rank 0); returns the summary."""
    meter.bar.close()
    seconds = time.perf_counter() - meter.started
    model, config, out = trainer.model, trainer.config, trainer.out
    if trainer.main:
        if config.lora.merge_lora and uses_adapters(model):  # checkpoints/ and best/ keep the adapter/ folder
            merge_lora(model)
        model.save(out)
    model.eval()
    summary: dict[str, Any] = {
        "steps": progress.step,
        "seconds": seconds,
        "pairs_per_second": progress.pairs / seconds
        if seconds > 0 and trainer.resumed_from is None
        else None,
        "final": meter.metrics,
        "best": progress.best,
        **extras_summary(trainer.extras),  # averaged, anchored
    }
    if trainer.main:
        for extra in trainer.extras:
            meter.record(extra.end_record())
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        write_model_card(
            out,
            base_model=getattr(model, "name_or_path", None),
            tasks_info=[task_info(t) for t in feed.tasks],
            config=config,
            eval_results=meter.metrics,
            best=progress.best,
            seconds=seconds,
            steps=progress.step,
            device=str(trainer.device),
        )
        mark_finished(out, steps=progress.step)  # before the clean-up: a kill there is no restart
        summary["bytes_on_disk"] = finalize_run(
            out, keep_training_state=config.checkpoints.keep_training_state
        )
        if not config.quiet:
            print(f"train: saved {out} ({summary['bytes_on_disk'] / 2**20:.0f} MB on disk)", file=sys.stderr)
    barrier()  # torchrun: the other ranks return once rank 0 has saved the model
    return summary
