"""The training loop: tasks -> batches -> embeddings -> loss -> backward -> optimiser step, then log/eval/save.

Read :func:`train` top to bottom, as one would nanoGPT's: the set-up (:mod:`embforge.training.trainer`), then a
loop whose body takes a batch, runs :func:`micro_step` (embed, loss, backward) for each accumulated micro-batch,
steps the optimiser (fp16 unscaling, clipping, the schedule) and hands logging, evaluation, negative refresh and
checkpoints to :func:`after_step`. The loop's state is two dataclasses: the :class:`~embforge.training.state.
Progress` a checkpoint saves and the :class:`~embforge.training.trainer.Trainer` it steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
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
        evaluator: ``model -> metrics``; run every ``config.eval_every`` steps and at the end. The best value
            of ``config.metric`` (default: :func:`~embforge.training.config.primary_metric`) is kept in
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
    if config.resume and (done := _finished_run(trainer)) is not None:  # a finished run: nothing to do
        hooks.close()  # a background refresh it may have started
        return done
    progress = start(trainer, feed)  # step 0, or every piece of state from the last checkpoint
    meter = Meter.open(trainer, progress)
    model.train()
    # quiet: no bar, so a run of minutes says once what it does (after PHASE_DELAY seconds; embforge/progress.py)
    with phase(_quiet_line(trainer, feed, progress), enabled=config.quiet and trainer.main):
        while progress.step < trainer.total_steps:
            trainer.optimizer.zero_grad(set_to_none=True)
            for micro in range(config.grad_accum):
                task, batch = feed.take(progress, trainer.task_weights())
                # embed -> loss -> backward (in cached mini-batches with config.mini_batch_size)
                loss = micro_step(trainer, task, batch.rows, sync=micro == config.grad_accum - 1)
                name = feed.tasks[batch.task].name
                value = _finite(loss, step=progress.step + 1, task=name)
                meter.observe(name, value, rows=len(batch.rows))
                if trainer.dynamic is not None:
                    trainer.dynamic.observe(batch.task, value)
            if trainer.parallel is not None:  # the loss modules' own parameters are not in DDP
                trainer.parallel.reduce_loss_gradients(trainer.losses)
            trainer.scaler.unscale_(trainer.optimizer)  # fp16: the true gradients, for clipping
            if config.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(list(trainer.parameters()), config.max_grad_norm)
            trainer.scaler.step(trainer.optimizer)  # skipped when an fp16 gradient overflowed
            trainer.scaler.update()
            if trainer.anchor is not None:  # L2-SP: decay toward the starting weights (training/anchor.py)
                trainer.anchor.pull(float(trainer.scheduler.get_last_lr()[0]))
            trainer.scheduler.step()
            progress.step += 1
            progress.pairs += meter.take_rows()
            feed = after_step(trainer, feed, progress, meter, hooks)  # log, evaluate, refresh, save
    hooks.close()  # a background refresh still running cannot be used any more
    return finish(trainer, feed, progress, meter)


def micro_step(trainer: Trainer, task: TaskBatches, rows: Sequence[int], *, sync: bool) -> Tensor:
    """Embed ``rows`` of ``task``, compute the loss, back-propagate it; returns the loss, detached.

    With ``config.mini_batch_size`` the three run cached (GradCache, :func:`~embforge.training.step.cached_step`):
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
        if config.mini_batch_size:  # embed, loss, backward in mini-batches (training/step.py)
            loss = cached_step(
                net,
                task,
                rows,
                mini_batch_size=config.mini_batch_size,
                max_tokens=config.chunk_tokens,
                dropout_seed=seed,
                backward=trainer.backward,
            )
        else:
            embeddings = net(task.inputs(rows), max_tokens=config.chunk_tokens, dropout_seed=seed)
            loss = task.loss_fn(embeddings, task.labels(rows))  # tensors in, a scalar out
    if not config.mini_batch_size:
        trainer.backward(loss)  # fp16 scaling and the mean over accumulated micro-steps
    loss = loss.detach()
    return trainer.parallel.mean(loss) if trainer.parallel is not None else loss


def after_step(trainer: Trainer, feed: Feed, progress: Progress, meter: Meter, hooks: Hooks) -> Feed:
    """What follows an optimiser step: the weight average, the loss-share task weights, the log line, evaluation,
    the negative refresh (its tasks make the feed returned), the checkpoint and ``on_step``."""
    config, step = trainer.config, progress.step
    last = step == trainer.total_steps
    meter.bar.update(1)
    trainer.host_memory.after_step()  # resident memory flat in the number of steps (CPU tensors of every shape)
    if trainer.average is not None:  # after the last step the model holds the average: evaluated, saved
        trainer.average.update(trainer.model, step)
    if trainer.anchor is not None and last:  # WiSE-FT: the final weights mixed with the starting ones
        trainer.anchor.mix()
    if trainer.dynamic is not None:  # loss-share task weights, saved with the progress
        reweighted = trainer.dynamic.step(step)
        progress.dynamic_weights = trainer.dynamic.state_dict()
        if reweighted is not None:
            append_jsonl(meter.file, reweighted)
    if step % config.log_every == 0 or last:
        lr = float(trainer.scheduler.get_last_lr()[0])
        meter.log(step=step, epoch=progress.epoch, lr=lr, per_task=len(feed.tasks) > 1)
    if hooks.evaluator is not None and ((config.eval_every and step % config.eval_every == 0) or last):
        evaluate(trainer, progress, meter, hooks.evaluator)
    fresh = hooks.refresher(step, trainer.model) if hooks.refresher is not None else None
    if fresh is not None:  # refreshed negatives: re-tokenise, re-plan this epoch, keep the position in it
        feed = Feed.build(trainer.model, fresh, config)
        trainer.model.train()
        progress.refreshed_at = step  # saved below: on resume the refresher restores these tasks
    if trainer.main and config.save_every and (step % config.save_every == 0 or last):
        save_checkpoint(
            trainer.out / "checkpoints",
            model=trainer.model,
            losses=trainer.losses,
            trainer=trainer.saved(),
            progress=progress,
            keep=config.keep_checkpoints,
            data_files=trainer.data_files,
        )
    if hooks.on_step is not None:
        hooks.on_step(step)
    return feed


def _quiet_line(trainer: Trainer, feed: Feed, progress: Progress) -> str:
    """What a quiet run's loop says when it takes long: its steps, batch, tasks and output folder."""
    total, tasks = trainer.total_steps, len(feed.tasks)
    steps = f"steps {progress.step + 1} to {total}" if progress.step else f"{total} steps"
    return (
        f"train: {steps} of batch {trainer.config.batch_size} over {tasks} task{'s' if tasks != 1 else ''} -> "
        f"{trainer.out} (quiet: no bar) ..."
    )


def evaluate(trainer: Trainer, progress: Progress, meter: Meter, evaluator: Evaluator) -> None:
    """Rank 0 evaluates (the other ranks wait), logs the metrics and keeps the best model in ``output/best``."""
    if trainer.main:
        with phase(f"train: step {progress.step}: evaluating ..."):
            meter.metrics = evaluator(trainer.model)
        trainer.model.train()
        append_jsonl(meter.file, {"step": progress.step, "eval": meter.metrics})
        metric = trainer.config.metric or primary_metric(meter.metrics)
        value = meter.metrics.get(metric) if metric is not None else None
        if (
            metric is not None
            and value is not None
            and (progress.best is None or value > progress.best["value"])
        ):
            progress.best = Best(step=progress.step, metric=metric, value=value)
            atomic_dir(trainer.out / "best", trainer.model.save)
    barrier()


def _finite(loss: Tensor, *, step: int, task: str) -> float:
    """The loss as a number; an error naming the step and the task when it is NaN or infinite."""
    if not torch.isfinite(loss):
        raise FloatingPointError(
            f"loss became {loss.item()} at step {step} (task {task!r}); lower the learning rate or use amp='no'"
        )
    return loss.item()


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
    writes it: ``metrics.jsonl`` (rank 0 only) and the progress bar; and the last evaluation's metrics."""

    file: Path
    bar: tqdm
    started: float
    losses: list[float] = field(default_factory=list)
    task_losses: dict[str, list[float]] = field(default_factory=dict)
    rows: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def open(cls, trainer: Trainer, progress: Progress) -> Meter:
        file = (
            trainer.out / "metrics.jsonl" if trainer.main else Path(os.devnull)
        )  # the other ranks log nowhere
        quiet = trainer.config.quiet or not trainer.main
        bar = tqdm(total=trainer.total_steps, initial=progress.step, disable=quiet, desc="train")
        return cls(file, bar, time.perf_counter())

    def observe(self, task: str, loss: float, *, rows: int) -> None:
        self.losses.append(loss)
        self.task_losses.setdefault(task, []).append(loss)
        self.rows += rows

    def take_rows(self) -> int:
        """The rows of the step just taken (counted from zero again)."""
        rows, self.rows = self.rows, 0
        return rows

    def log(self, *, step: int, epoch: int, lr: float, per_task: bool) -> None:
        """One ``metrics.jsonl`` line: the mean loss since the last one (and per task), the learning rate."""
        mean_loss = float(np.mean(self.losses))
        record: dict[str, Any] = {"step": step, "epoch": epoch, "loss": mean_loss, "lr": lr}
        if per_task:
            record["task_loss"] = {k: float(np.mean(v)) for k, v in self.task_losses.items()}
        self.bar.set_postfix(loss=f"{mean_loss:.4f}")
        append_jsonl(self.file, record)
        self.losses, self.task_losses = [], {}


def _finished_run(trainer: Trainer) -> dict[str, Any] | None:
    """The summary of a run ``--resume`` finds finished (training/artifacts.py), else None."""
    keep = trainer.config.keep_training_state
    return resume_finished(trainer.out, trainer.total_steps, keep_training_state=keep, main=trainer.main)


def finish(trainer: Trainer, feed: Feed, progress: Progress, meter: Meter) -> dict[str, Any]:
    """Save the final model, the summary and the model card (rank 0); returns the summary."""
    meter.bar.close()
    seconds = time.perf_counter() - meter.started
    model, config, out = trainer.model, trainer.config, trainer.out
    if trainer.main:
        if config.merge_lora and uses_adapters(model):  # checkpoints/ and best/ keep the adapter/ folder
            merge_lora(model)
        model.save(out)
    model.eval()
    average = trainer.average.describe() if trainer.average is not None else None
    summary: dict[str, Any] = {
        "steps": progress.step,
        "seconds": seconds,
        "pairs_per_second": progress.pairs / seconds
        if seconds > 0 and trainer.resumed_from is None
        else None,
        "final": meter.metrics,
        "best": progress.best,
        "averaged": average,
        "anchored": trainer.anchor.describe() if trainer.anchor is not None else None,
    }
    if trainer.main:
        if average is not None:
            append_jsonl(out / "metrics.jsonl", {"event": "averaged", **average})
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
        summary["bytes_on_disk"] = finalize_run(out, keep_training_state=config.keep_training_state)
        if not config.quiet:
            print(f"train: saved {out} ({summary['bytes_on_disk'] / 2**20:.0f} MB on disk)", file=sys.stderr)
    barrier()  # torchrun: the other ranks return once rank 0 has saved the model
    return summary
