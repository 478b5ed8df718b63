"""The training loop: tasks -> batches -> embeddings -> loss -> optimiser step, with eval and atomic checkpoints.

Read :func:`train` top to bottom: mixed precision, gradient accumulation, clipping, evaluation, checkpointing
and resuming are plain lines in one loop.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from embforge.data.sources import plan_window, row_count, window_counter
from embforge.files import append_jsonl
from embforge.modeling.lora import merge_lora, uses_adapters
from embforge.modeling.precision import amp_dtype
from embforge.training.artifacts import clear_finished, finalize_run, mark_finished, resume_finished
from embforge.training.averaging import weight_average
from embforge.training.checkpoints import (
    atomic_dir,
    load_trainer_state,
    save_checkpoint,
    set_rng_state,
    start_run,
)
from embforge.training.config import TrainConfig, planned_steps, primary_metric
from embforge.training.distributed import DataParallel, barrier, init_from_env, is_main, rank_device
from embforge.training.model_card import task_info, write_model_card
from embforge.training.sampling import TaskPlan, TextKeys, uses_in_batch_negatives
from embforge.training.step import cached_step
from embforge.training.tasks import PreparedTask, Task, prepare
from embforge.training.weighting import DynamicWeights

Evaluator = Callable[[Any], dict[str, float]]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _param_groups(modules: list[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for module in modules:
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _adamw(groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    """AdamW with the fused (one kernel for all parameters) update where this torch has it: 7x faster on CPU."""
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # torch < 2.4 on CPU, or a device without a fused kernel
        return torch.optim.AdamW(groups, lr=lr)


def _linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def _prepare(model: Any, tasks: list[Task], config: TrainConfig) -> tuple[list[PreparedTask], dict[str, Any]]:
    """Ready the tasks (rows are read and tokenised per batch) and what the batch plan reads from them: sizes,
    windows (streams), lengths, distinct-text keys — the last two a window at a time."""
    prepared = [prepare(task, model) for task in tasks]
    plan_inputs = {
        "sizes": [row_count(t.data) for t in tasks],
        "windows": [plan_window(t.data, config.shuffle_window or None) for t in tasks],
        "counts": [window_counter(t.data) for t in tasks],
        "lengths": [p.lengths for p in prepared] if config.group_by_length else None,
        # in-batch-negative tasks: no text twice in a batch (a duplicate would be its own false negative)
        "distinct": [
            TextKeys(t.data, t.data.text_columns) if uses_in_batch_negatives(t.loss) else None for t in tasks
        ],
    }
    return prepared, plan_inputs


def train(
    model: Any,
    tasks: list[Task],
    config: TrainConfig,
    *,
    evaluator: Evaluator | None = None,
    on_step: Callable[[int], None] | None = None,
    refresher: Callable[[int, Any], list[Task] | None] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` on ``tasks``; write checkpoints, metrics and the final model to ``config.output``.

    Args:
        model: An :class:`~embforge.encoder.Encoder` (anything with ``tokenize_ids``, ``embed_ids``, ``save``).
        tasks: One or more tasks; each batch comes from one task.
        config: Hyper-parameters and run options.
        evaluator: ``model -> metrics``; run every ``config.eval_every`` steps and at the end. The best value
            of ``config.metric`` (default: :func:`~embforge.training.config.primary_metric`) is kept in
            ``output/best``.
        on_step: Called with the step number after every optimiser step.
        refresher: Called as ``refresher(step, model)`` after every optimiser step; when it returns tasks (the
            same number, the same rows, new texts — e.g. refreshed hard negatives, see
            :class:`embforge.training.refresh.NegativeRefresher`) they replace ``tasks`` from the next step on; the step is
            saved in checkpoints as ``progress["refreshed_at"]``, so that on resume the caller can pass the tasks
            that were in use (:meth:`~embforge.training.refresh.NegativeRefresher.resume`). Its ``close()``, if any, is
            called when training ends.

    Returns:
        A summary: steps, seconds, training pairs/s, final and best metrics.
    """
    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    world = init_from_env()  # under torchrun: join the process group (training/distributed.py)
    device = rank_device(resolve_device(config.device))
    main = is_main()  # rank 0 writes metrics, checkpoints and models
    if world > 1 and refresher is not None:
        raise ValueError("negative refresh during training does not run under torchrun yet; train without it")
    seed_everything(config.seed)
    model.to(device)
    if config.gradient_checkpointing:
        model.gradient_checkpointing(True)
    losses = nn.ModuleList([t.loss for t in tasks]).to(device)
    prepared, plan_inputs = _prepare(model, tasks, config)
    weights = [t.weight for t in tasks]
    dynamic = (
        DynamicWeights(
            weights,
            every=config.dynamic_weights_every,
            smoothing=config.dynamic_weights_smoothing,
            relative=config.dynamic_weights_relative,
            names=[t.name for t in tasks],
        )
        if config.dynamic_weights_every
        else None
    )

    def plan_for(epoch: int) -> TaskPlan:
        return TaskPlan(
            batch_size=config.batch_size,
            seed=config.seed,
            epoch=epoch,
            strategy=config.sampling,
            alpha=config.sampling_alpha,
            **plan_inputs,
        )

    total_steps = planned_steps(plan_inputs["sizes"], config)
    if config.resume:  # a finished run: nothing to do (artifacts.py)
        done = resume_finished(out, total_steps, keep_training_state=config.keep_training_state, main=main)
        if done is not None:
            getattr(refresher, "close", lambda: None)()  # a background refresh it may have started
            return done
    elif main:
        clear_finished(out)
    optimizer = _adamw(_param_groups([model, losses], config.weight_decay), config.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _linear_schedule(int(config.warmup_ratio * total_steps), total_steps)
    )
    dtype = amp_dtype(config.amp, device)
    # padded tokens per attention block / padded chunk; None: the model's defaults (modeling/padding.py)
    chunk_tokens = config.chunk_tokens
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    # what a checkpoint saves and a resume restores, by name
    trainer: dict[str, Any] = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    # EMA or a soup of the last k checkpoints (training/averaging.py); None unless the config asks for one
    average = weight_average(config, total_steps)
    if average is not None:
        trainer["averaging"] = average  # checkpointed and restored with the optimiser

    def backward(loss: torch.Tensor) -> None:  # fp16 loss scaling, and the mean over accumulated micro-steps
        scaler.scale(loss / config.grad_accum).backward()

    progress: dict[str, Any] = {"step": 0, "epoch": 0, "position": 0, "best": None, "pairs": 0}

    checkpoints = out / "checkpoints"
    resume_from = start_run(checkpoints, resume=config.resume, log=out / "metrics.jsonl" if main else None)
    if resume_from is not None:
        state, loss_state, progress = load_trainer_state(resume_from)
        model.load_state_dict(type(model).load(resume_from / "model").state_dict())
        losses.load_state_dict(loss_state)
        for name, part in trainer.items():
            part.load_state_dict(state[name])
        set_rng_state(state["rng"])
        if main:
            _log(out, {"event": "resume", "from": resume_from.name, **progress})
    if dynamic is not None and "dynamic_weights" in progress:
        dynamic.load_state_dict(progress["dynamic_weights"])

    # torchrun: the model in DDP, every rank computing its part of each batch (training/distributed.py)
    parallel = DataParallel(model, gather=config.gather_negatives) if world > 1 else None
    plan = plan_for(progress["epoch"])
    metrics_file = out / "metrics.jsonl" if main else Path(os.devnull)  # the other ranks log nowhere
    bar = tqdm(total=total_steps, initial=progress["step"], disable=config.quiet or not main, desc="train")
    running, started, step_pairs = [], time.perf_counter(), 0
    task_running: dict[str, list[float]] = {}
    last_metrics: dict[str, float] = {}
    model.train()
    while progress["step"] < total_steps:
        optimizer.zero_grad(set_to_none=True)
        for micro in range(config.grad_accum):
            if progress["position"] >= len(plan):
                progress["epoch"] += 1
                progress["position"] = 0
                progress["cursors"] = [0] * len(tasks)
                plan = plan_for(progress["epoch"])
            batch = plan.take(progress, dynamic.weights if dynamic is not None else weights)
            task, rows = prepared[batch.task], batch.rows
            seed = int(
                torch.randint(0, 2**62, ()).item()
            )  # this micro-step's dropout masks (modeling/dropout.py)
            net: Any = model
            if parallel is not None:  # this rank's part of the batch; DDP syncs in the last micro-step
                net, task, rows = parallel.shard(task, rows, sync=micro == config.grad_accum - 1)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                if (
                    config.mini_batch_size
                ):  # GradCache (training/step.py): same loss and gradients, less memory
                    loss = cached_step(
                        net,
                        task,
                        rows,
                        mini_batch_size=config.mini_batch_size,
                        max_tokens=chunk_tokens,
                        dropout_seed=seed,
                        backward=backward,
                    )
                else:
                    embeddings = net(task.inputs(rows), max_tokens=chunk_tokens, dropout_seed=seed)
                    loss = task.loss_fn(embeddings, task.labels(rows))
            if not config.mini_batch_size:
                backward(loss)
            if parallel is not None:  # one value on every rank: the log, this check, the task weights
                loss = parallel.mean(loss)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss became {loss.item()} at step {progress['step'] + 1} "
                    f"(task {tasks[batch.task].name!r}); lower the learning rate or use amp='no'"
                )
            running.append(loss.item())
            task_running.setdefault(tasks[batch.task].name, []).append(running[-1])
            if dynamic is not None:
                dynamic.observe(batch.task, running[-1])
            step_pairs += len(batch.rows)
        if parallel is not None:  # the loss modules' own parameters are not in DDP
            parallel.reduce_loss_gradients(losses)
        scaler.unscale_(optimizer)
        if config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(
                [p for g in optimizer.param_groups for p in g["params"]], config.max_grad_norm
            )
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        progress["step"] += 1
        progress["pairs"] += step_pairs
        step_pairs = 0
        step = progress["step"]
        bar.update(1)
        if average is not None:  # after the last step the model holds the average: evaluated, saved
            average.update(model, step)
        if dynamic is not None:  # loss-share task weights (embforge/weighting.py), saved with the progress
            reweighted = dynamic.step(step)
            progress["dynamic_weights"] = dynamic.state_dict()
            if reweighted is not None:
                append_jsonl(metrics_file, reweighted)
        if step % config.log_every == 0 or step == total_steps:
            mean_loss = float(np.mean(running))
            running = []
            bar.set_postfix(loss=f"{mean_loss:.4f}")
            append_jsonl(
                metrics_file,
                {
                    "step": step,
                    "epoch": progress["epoch"],
                    "loss": mean_loss,
                    "lr": scheduler.get_last_lr()[0],
                    **(
                        {"task_loss": {k: float(np.mean(v)) for k, v in task_running.items()}}
                        if len(tasks) > 1
                        else {}
                    ),
                },
            )
            task_running = {}
        evaluate = evaluator is not None and (
            (config.eval_every and step % config.eval_every == 0) or step == total_steps
        )
        if evaluate and main:  # rank 0 evaluates, the other ranks wait at the barrier below
            assert evaluator is not None
            last_metrics = evaluator(model)
            model.train()
            append_jsonl(metrics_file, {"step": step, "eval": last_metrics})
            metric = config.metric or primary_metric(last_metrics)
            value = last_metrics.get(metric) if metric is not None else None
            if value is not None and (progress["best"] is None or value > progress["best"]["value"]):
                progress["best"] = {"step": step, "metric": metric, "value": value}
                atomic_dir(out / "best", model.save)
        if evaluate:
            barrier()
        fresh = refresher(step, model) if refresher is not None else None
        if fresh is not None:  # refreshed negatives: re-tokenise, re-plan this epoch, keep the position in it
            tasks = fresh
            prepared, plan_inputs = _prepare(model, tasks, config)
            plan = plan_for(progress["epoch"])
            model.train()
            progress["refreshed_at"] = step  # saved below: on resume the refresher restores these tasks
        if main and config.save_every and (step % config.save_every == 0 or step == total_steps):
            save_checkpoint(
                checkpoints,
                model=model,
                losses=losses,
                trainer=trainer,
                progress=progress,
                keep=config.keep_checkpoints,
            )
        if on_step is not None:
            on_step(step)
    bar.close()
    close = getattr(refresher, "close", None)  # a background refresh still running cannot be used any more
    if close is not None:
        close()
    seconds = time.perf_counter() - started
    if main:
        if config.merge_lora and uses_adapters(model):  # checkpoints/ and best/ keep the adapter/ folder
            merge_lora(model)
        model.save(out)
    model.eval()
    summary = {
        "steps": progress["step"],
        "seconds": seconds,
        "pairs_per_second": progress["pairs"] / seconds if seconds > 0 and resume_from is None else None,
        "final": last_metrics,
        "best": progress["best"],
        "averaged": average.describe() if average is not None else None,
    }
    if main:
        if average is not None:
            _log(out, {"event": "averaged", **average.describe()})
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        write_model_card(
            out,
            base_model=getattr(model, "name_or_path", None),
            tasks_info=[task_info(t) for t in tasks],
            config=config,
            eval_results=last_metrics,
            best=progress["best"],
            seconds=seconds,
            steps=progress["step"],
            device=str(device),
        )
        mark_finished(out, steps=progress["step"])  # before the clean-up: a kill there is no restart
        summary["bytes_on_disk"] = finalize_run(out, keep_training_state=config.keep_training_state)
        if not config.quiet:
            print(f"train: saved {out} ({summary['bytes_on_disk'] / 2**20:.0f} MB on disk)", file=sys.stderr)
    barrier()  # torchrun: the other ranks return once rank 0 has saved the model
    return summary


def _log(out: Path, record: dict[str, Any]) -> None:
    append_jsonl(out / "metrics.jsonl", record)
