"""The training loop's set-up: :func:`set_up` makes a :class:`Trainer` (the model, its losses, the optimiser and
what else a checkpoint saves), :func:`start` begins a run at step 0 or resumes it from its last checkpoint.

:mod:`embforge.training.loop` steps what these make.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from embforge.data.identity import first_change
from embforge.files import append_jsonl
from embforge.merge import layer_depths
from embforge.modeling.precision import amp_dtype
from embforge.protocols import TrainableModel
from embforge.training.artifacts import clear_finished
from embforge.training.checkpoints import (
    CheckpointError,
    Stateful,
    load_trainer_state,
    read_data_files,
    set_rng_state,
    start_run,
)
from embforge.training.config import TrainConfig, planned_steps
from embforge.training.distributed import DataParallel, init_from_env, is_main, rank_device
from embforge.training.extras import Extra, build_extras
from embforge.training.feed import Feed
from embforge.training.host_memory import HostMemory
from embforge.training.state import Progress
from embforge.training.tasks import Task


class Trainable(TrainableModel, Protocol):
    """What the loop needs of a model of any kind: a :class:`~embforge.protocols.TrainableModel` whose forward
    is a micro-step's (:class:`~embforge.training.step.Forward`), that moves to a device, recomputes its layers
    on request, and loads weights."""

    def to(self, device: torch.device) -> object: ...

    def eval(self) -> object: ...

    def gradient_checkpointing(self, enabled: bool = True) -> None: ...

    def load_state_dict(self, state: Mapping[str, Tensor], strict: bool = True) -> object: ...


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA when there is one, else the CPU; otherwise the device ``name`` names."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def layer_lr_factors(names: list[str], decay: float) -> dict[str, float]:
    """Layer-wise learning-rate decay: each weight's share of the learning rate, ``decay ** (L - 1 - l)`` for
    layer ``l`` of ``L``, ``decay ** L`` for the embeddings, 1 for the last layer and what follows it (depths from
    :func:`embforge.merge.layer_depths`, the ones LiNeS scales by)."""
    try:
        depths = layer_depths(names)
    except ValueError as error:  # a model without numbered layers (a static embedding table)
        raise ValueError(f"layer_lr_decay: {error}") from None
    layers = round(1 / min(d for d in depths.values() if d > 0))
    return {n: decay ** round((1 - d) * layers) for n, d in depths.items()}


def _param_groups(
    model: TrainableModel | nn.Module, losses: nn.Module, weight_decay: float, layer_decay: float = 1.0
) -> list[dict[str, Any]]:
    """The optimiser's groups: weight decay on matrices only; with ``layer_decay`` < 1 a group per learning-rate
    share of the model's layers (:func:`layer_lr_factors`; the losses' own weights at the full rate). The full-rate
    groups come first, so group 0's rate is the run's."""
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    factors = layer_lr_factors([n for n, _ in trained], layer_decay) if layer_decay != 1.0 else {}
    trained += [(f"losses.{name}", p) for name, p in losses.named_parameters() if p.requires_grad]
    groups: dict[tuple[float, bool], list[nn.Parameter]] = {(1.0, True): [], (1.0, False): []}
    for name, param in trained:
        decays = param.ndim >= 2 and "norm" not in name.lower()
        groups.setdefault((factors.get(name, 1.0), decays), []).append(param)
    return [
        {"params": params, "weight_decay": weight_decay if decays else 0.0, "lr_factor": factor}
        for (factor, decays), params in sorted(groups.items(), key=lambda g: (-g[0][0], not g[0][1]))
    ]


def _adamw(groups: list[dict[str, Any]], lr: float) -> torch.optim.Optimizer:
    """AdamW with the fused (one kernel for all parameters) update where this torch has it: 7x faster on CPU.
    Each group runs at ``lr`` times its ``lr_factor``."""
    groups = [{**g, "lr": lr * g["lr_factor"]} for g in groups]
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


@dataclass
class Trainer:
    """What the loop steps: the model and the tasks' losses, the optimiser with its learning-rate schedule and
    fp16 loss scaler, the off-by-default features a config asks for (``extras``), and where it all runs."""

    model: Trainable
    losses: nn.ModuleList
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    config: TrainConfig
    total_steps: int
    device: torch.device
    dtype: torch.dtype | None  # autocast's, None: full precision (modeling/precision.py)
    weights: list[float]  # the tasks' sampling weights
    world: int = 1  # processes under torchrun
    main: bool = True  # rank 0 writes metrics, checkpoints and models
    # anchor, weight average, loss-share task weights ... as the config asks (training/extras.py)
    extras: list[Extra] = field(default_factory=list)
    parallel: DataParallel | None = None  # torchrun: the model in DDP (training/distributed.py)
    resumed_from: Path | None = None
    # freed heap pages handed back to the system (training/host_memory.py)
    host_memory: HostMemory = field(default_factory=HostMemory)
    data_files: list[list[dict[str, Any]]] = field(
        default_factory=list
    )  # each task's files, as checkpoints keep

    @property
    def out(self) -> Path:
        return Path(self.config.output)

    def saved(self) -> dict[str, Stateful]:
        """What a checkpoint saves and a resume restores besides the model, the losses and the progress."""
        parts: dict[str, Stateful] = {
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
        }
        parts.update({extra.state_key: extra for extra in self.extras if extra.state_key is not None})
        return parts

    def task_weights(self) -> list[float]:
        """The weights the plan draws the next batch's task with (the extras may change them)."""
        weights = self.weights
        for extra in self.extras:
            weights = extra.task_weights(weights)
        return weights

    def rate(self) -> float:
        """The learning rate of the step being taken (of the first parameter group: the run's full rate)."""
        return float(self.scheduler.get_last_lr()[0])

    def parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter the optimiser updates (the model's and the losses' own)."""
        return (p for group in self.optimizer.param_groups for p in group["params"])

    def autocast(self) -> torch.autocast:
        """Mixed precision for the forward and the loss (a no-op in full precision)."""
        dtype = self.dtype or torch.float32
        return torch.autocast(self.device.type, dtype=dtype, enabled=self.dtype is not None)

    def backward(self, loss: Tensor) -> None:
        """Back-propagate a micro-step's loss: scaled for fp16, divided by the micro-steps per optimiser step."""
        self.scaler.scale(loss / self.config.optim.grad_accum).backward()


def set_up(model: Trainable, tasks: list[Task], config: TrainConfig) -> tuple[Trainer, Feed]:
    """Join the process group (torchrun), seed, move the model to its device, ready the tasks and make the
    optimiser, the schedule and the rest of the trainer for a run of :func:`planned_steps` steps."""
    world = init_from_env()  # under torchrun: join the process group (training/distributed.py)
    device = rank_device(resolve_device(config.scale.device))
    seed_everything(config.seed)
    model.to(device)
    if config.scale.gradient_checkpointing:
        model.gradient_checkpointing(True)
    losses = nn.ModuleList([t.loss for t in tasks]).to(device)
    feed = Feed.build(model, tasks, config)
    weights = [t.weight for t in tasks]
    total_steps = planned_steps(feed.inputs.sizes, config)
    optimizer = _adamw(
        _param_groups(model, losses, config.optim.weight_decay, config.optim.layer_lr_decay), config.optim.lr
    )
    warmup = int(config.optim.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _linear_schedule(warmup, total_steps))
    dtype = amp_dtype(config.scale.amp, device)
    trainer = Trainer(
        model,
        losses,
        optimizer,
        scheduler,
        torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
        config,
        total_steps,
        device,
        dtype,
        weights,
        world=world,
        main=is_main(),
        extras=build_extras(model, tasks, config, total_steps=total_steps),  # before the first step
    )
    return trainer, feed


def start(trainer: Trainer, feed: Feed) -> Progress:
    """Begin the run: at step 0, or (``config.checkpoints.resume``) from the last checkpoint, every piece of state restored
    and the training files checked to be the ones it read (:func:`check_data`); under torchrun the model is then
    wrapped in DDP."""
    config, out = trainer.config, trainer.out
    trainer.data_files = feed.files()
    if not config.checkpoints.resume and trainer.main:
        clear_finished(out)  # a new run in a finished run's folder (training/artifacts.py)
    log = out / "metrics.jsonl" if trainer.main else None
    checkpoint = start_run(out / "checkpoints", resume=config.checkpoints.resume, log=log)
    progress = Progress()
    if checkpoint is not None:
        progress = restore(trainer, checkpoint)
        check_data(trainer, checkpoint)
        if log is not None:
            append_jsonl(log, {"event": "resume", "from": checkpoint.name, **progress.to_dict()})
    trainer.resumed_from = checkpoint
    for extra in trainer.extras:  # their part of progress.json (the task weights)
        extra.load_progress(progress)
    if trainer.world > 1:  # every rank computes its part of each batch (training/distributed.py)
        assert isinstance(trainer.model, nn.Module)  # DDP wraps a torch module (every model kind is one)
        trainer.parallel = DataParallel(trainer.model, gather=config.scale.gather_negatives)
    return progress


def check_data(trainer: Trainer, checkpoint: Path) -> None:
    """Refuse to resume from ``checkpoint`` when the training files it records are not the run's files now (one
    replaced, rewritten, deleted or added): the resumed run would not continue at the row it stopped at.
    ``config.checkpoints.allow_data_change`` resumes anyway."""
    recorded = read_data_files(checkpoint)
    change = first_change(recorded, trainer.data_files) if recorded is not None else None
    if change is None or trainer.config.checkpoints.allow_data_change:
        return
    detail = f" ({change.detail})" if change.detail else ""
    raise CheckpointError(
        f"{change.subject}: {change.what} since {checkpoint.name} was saved{detail}; the resumed run would not "
        "continue at the row it stopped at: restore the data, train without --resume to start over, or pass "
        "--allow-data-change to resume anyway"
    )


def restore(trainer: Trainer, checkpoint: Path) -> Progress:
    """Load a checkpoint into ``trainer``: the model, the losses, the optimiser and the rest, the RNG states;
    returns the checkpoint's progress."""
    state, loss_state, progress = load_trainer_state(checkpoint)
    model = trainer.model
    own_class: Any = type(model)  # the class that saved the folder reads it
    model.load_state_dict(own_class.load(checkpoint / "model").state_dict())
    trainer.losses.load_state_dict(loss_state)
    for name, part in trainer.saved().items():
        part.load_state_dict(state[name])
    set_rng_state(state["rng"])
    return progress
