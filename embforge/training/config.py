"""What a training run needs besides the model and the data: :class:`TrainConfig` (the CLI and TOML files fill it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embforge.modeling.lora import LoraConfig
from embforge.modeling.precision import check_amp
from embforge.ranges import (
    FINITE,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    RATIO,
    SEED,
    Range,
    check,
    check_fields,
    finite,
)
from embforge.training.anchor import check_anchor
from embforge.training.averaging import check_averaging
from embforge.training.sampling import STRATEGIES

LAYER_DECAY = finite(0, 1, open_low=True)

# the numeric fields' ranges (the averaging and anchor fields are checked by their modules)
_RANGES: dict[str, Range] = {
    "epochs": POSITIVE_INT,
    "max_steps": POSITIVE_INT,  # or None: epochs
    "batch_size": POSITIVE_INT,
    "lr": POSITIVE,
    "weight_decay": NON_NEGATIVE,
    "warmup_ratio": RATIO,
    "max_grad_norm": NON_NEGATIVE,  # 0 = no clipping
    "grad_accum": POSITIVE_INT,
    "seed": SEED,
    "eval_every": NON_NEGATIVE_INT,  # 0 = at the end only
    "save_every": NON_NEGATIVE_INT,  # 0 = no checkpoints
    "keep_checkpoints": NON_NEGATIVE_INT,  # 0 = keep them all
    "log_every": POSITIVE_INT,
    "chunk_tokens": POSITIVE_INT,  # or None: the default
    "shuffle_window": NON_NEGATIVE_INT,  # 0 = a whole task
    "sampling_alpha": FINITE,
    "dynamic_weights_every": NON_NEGATIVE_INT,  # 0 = fixed weights
    "dynamic_weights_smoothing": RATIO,
    "mini_batch_size": NON_NEGATIVE_INT,  # 0 = no cached step
    "lora_r": NON_NEGATIVE_INT,  # 0 = full fine-tuning
    "lora_alpha": POSITIVE,  # or None: 2 * lora_r
    "lora_dropout": finite(0, 1, open_high=True),
}


@dataclass
class TrainConfig:
    """Everything a training run needs besides the model and the data. The CLI and TOML files fill it.

    The defaults are the measured recipe for all-MiniLM-L6-v2 on STS-B (see README: CoSENT, lr 5e-5, batch 32).

    ``mini_batch_size`` > 0 runs each micro-step cached (GradCache, :mod:`embforge.training.step`): the batch is
    embedded that many texts at a time, with the loss and gradients of the whole batch. ``gradient_checkpointing``
    recomputes each layer in the backward pass instead of storing its activations.

    Under ``torchrun`` ``batch_size`` is the global batch, split across the ranks. ``gather_negatives`` (default)
    all-gathers the embeddings so that every loss sees the global batch (in-batch negatives from every rank; the
    same gradients as one process); ``False`` gives each rank the loss of its own rows
    (:mod:`embforge.training.distributed`).

    ``ema_decay`` (an EMA of the weights from step ``ema_start``) or ``soup_last`` (the uniform mean of the
    weights at the last k steps ``soup_every`` apart) make the final model an average of weights
    (:mod:`embforge.training.averaging`). ``l2sp`` (decay toward the starting weights after every step), ``ewc``
    (the same, each weight at a rate set by the starting model's Fisher information), ``wise_ft`` (the final
    model mixed with the starting weights) and ``lines`` (each weight's change scaled by its depth) anchor the run to its base
    (:mod:`embforge.training.anchor`).
    """

    output: str = "output"
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 32
    lr: float = 5e-5
    weight_decay: float = 0.01
    layer_lr_decay: float = 1.0  # each layer below the last runs at this times the rate above it; 1 = off
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    grad_accum: int = 1
    amp: str = "auto"
    seed: int = 42
    eval_every: int = 0
    save_every: int = 200
    keep_checkpoints: int = 1
    log_every: int = 10
    group_by_length: bool = False
    chunk_tokens: int | None = None
    metric: str | None = None  # None: the evaluator's main metric (primary_metric)
    device: str = "auto"
    sampling: str = "epoch"
    shuffle_window: int = 0  # rows shuffled together (a stream's buffer); 0: a whole task (a stream: 10,000)
    sampling_alpha: float = 0.5
    dynamic_weights_every: int = 0
    dynamic_weights_smoothing: float = 0.5
    dynamic_weights_relative: bool = False
    resume: bool = False
    allow_data_change: bool = False  # resume even if the training files changed since the checkpoint
    quiet: bool = False
    keep_training_state: bool = False  # keep checkpoints/ after the run (embforge.training.artifacts)
    mini_batch_size: int = 0
    gradient_checkpointing: bool = False
    gather_negatives: bool = True  # torchrun: each rank's loss is the global batch's (distributed.py)
    lora_r: int = 0  # LoRA rank; 0 = full fine-tuning (embforge.modeling.lora)
    lora_alpha: float | None = None  # None = 2 * lora_r
    lora_dropout: float = 0.0
    lora_targets: str = "all-linear"  # or e.g. "query,value" / "q_proj,v_proj"
    merge_lora: bool = False  # fold the adapters into the final model (a plain sentence-transformers folder)
    # weight averaging (embforge.training.averaging): the final model is the average
    ema_decay: float | None = None  # EMA of the weights, e.g. 0.99; None = off
    ema_start: int = 0  # first step the EMA follows
    soup_last: int = 0  # uniform mean of the weights at the last k checkpoint steps; 0 = off
    soup_every: int = 0  # steps between the soup's members; 0 = save_every
    # an anchor to the starting weights (embforge.training.anchor)
    l2sp: float = 0.0  # decoupled L2-SP: after each step pull lr * l2sp of the way back to the start; 0 = off
    wise_ft: float | None = None  # WiSE-FT: final model = (1 - w) * start + w * fine-tuned; None = off
    lines: float | None = None  # LiNeS: each weight keeps (a + (1 - a) * its depth) of its change; None = off
    ewc: float = 0.0  # decoupled EWC: each weight pulled back lr * ewc * its Fisher importance; 0 = off
    ewc_texts: int = 2048  # texts of the run's tasks the starting model's Fisher information is estimated on

    def __post_init__(self) -> None:
        check_fields(self, _RANGES, optional=frozenset({"max_steps", "chunk_tokens", "lora_alpha"}))
        check("layer_lr_decay", self.layer_lr_decay, LAYER_DECAY, hint="1 = every layer at the full rate")
        if self.sampling not in STRATEGIES:
            raise ValueError(f"sampling must be one of {', '.join(STRATEGIES)}, got {self.sampling!r}")
        check_amp(self.amp)
        LoraConfig.from_fields(self)  # validates the lora_* fields
        check_averaging(self)
        check_anchor(self)


def planned_steps(sizes: Sequence[int | None], config: TrainConfig) -> int:
    """Optimiser steps of a run over tasks of ``sizes`` rows: ``max_steps``, else ``epochs`` passes over every
    task in batches of ``batch_size`` with ``grad_accum`` batches per step. The one count every schedule uses
    (learning rate, hard-negative ratio)."""
    if config.max_steps is not None:
        check("max_steps", config.max_steps, POSITIVE_INT)
        return config.max_steps
    if any(n is None for n in sizes):
        raise ValueError("a streamed data set of unknown length needs max_steps (--max-steps N)")
    batches_per_epoch = sum(math.ceil((n or 0) / config.batch_size) for n in sizes)
    return max(1, math.ceil(config.epochs * batches_per_epoch / config.grad_accum))


def primary_metric(metrics: Mapping[str, float]) -> str | None:
    """The metric that picks the best checkpoint when none is set: Spearman, else NDCG@10, else accuracy, else
    the first one reported."""
    for name in ("spearman", "ndcg@10", "accuracy"):
        if name in metrics:
            return name
    return next(iter(metrics), None)
