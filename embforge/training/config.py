"""What a training run needs besides the model and the data: :class:`TrainConfig` (the CLI and TOML files fill it)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embforge.fields import check_ranges, setting
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
    check,
    finite,
)
from embforge.training.anchor import check_anchor
from embforge.training.averaging import check_averaging
from embforge.training.sampling import STRATEGIES

LAYER_DECAY = finite(0, 1, open_low=True)
EMA_DECAY = finite(0, 1, open_high=True)
_OPT, _SCALE, _EVAL, _OUT, _MODEL = "optimisation", "scale", "evaluation", "output", "model"
_NO_LORA = "a pipeline trains all weights (its stages take no LoRA adapters)"  # About.pipeline


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

    output: str = setting(
        "output", "output folder (default ./output)", group=_OUT, value="folder", metavar="DIR"
    )
    epochs: int = setting(1, "epochs (default 1)", group=_OPT, range=POSITIVE_INT)
    max_steps: int | None = setting(
        None,
        "stop after this many optimiser steps (overrides --epochs; default: none)",
        group=_OPT,
        range=POSITIVE_INT,
    )
    batch_size: int = setting(32, "batch size (default 32)", group=_OPT, range=POSITIVE_INT)
    lr: float = setting(5e-5, "peak learning rate (default 5e-5)", group=_OPT, range=POSITIVE, metavar="LR")
    weight_decay: float = setting(0.01, "AdamW weight decay (default 0.01)", group=_OPT, range=NON_NEGATIVE)
    # each layer below the last runs at this times the rate above it; 1 = off
    layer_lr_decay: float = setting(
        1.0,
        "layer-wise learning-rate decay: each layer below the last at D x the rate of the one above, the "
        "embeddings below the first, e.g. 0.8; D in (0, 1] (default 1 = off)",
        group=_OPT,
        range=LAYER_DECAY,
        checked=False,
    )
    warmup_ratio: float = setting(
        0.1,
        "fraction of steps of linear warm-up, 0 to 1 (default 0.1)",
        group=_OPT,
        range=RATIO,
        metavar="FRACTION",
    )
    max_grad_norm: float = setting(  # 0 = no clipping
        1.0, "gradient clipping norm, 0 = off (default 1.0)", group=_OPT, range=NON_NEGATIVE, metavar="NORM"
    )
    grad_accum: int = setting(1, "gradient accumulation steps (default 1)", group=_OPT, range=POSITIVE_INT)
    amp: str = setting(
        "auto",
        "mixed precision (default auto: bf16 where the CPU/GPU has it natively)",
        group=_SCALE,
        choices=("auto", "no", "bf16", "fp16"),
    )
    seed: int = setting(
        42,
        "random seed (default 42; overrides every stage's seed of a pipeline file)",
        group=_OPT,
        range=SEED,
    )
    eval_every: int = setting(  # 0 = at the end only
        0, "evaluate every N steps (default 0: at the end only)", group=_EVAL, range=NON_NEGATIVE_INT
    )
    save_every: int = setting(  # 0 = no checkpoints
        200,
        "checkpoint every N steps and at the end (default 200; 0 = no checkpoints, the model is still saved)",
        group=_OUT,
        range=NON_NEGATIVE_INT,
    )
    keep_checkpoints: int = setting(1, range=NON_NEGATIVE_INT)  # 0 = keep them all
    log_every: int = setting(10, range=POSITIVE_INT)
    group_by_length: bool = setting(
        False, "batch texts of similar length together (faster, less random; default off)", switch=True
    )
    chunk_tokens: int | None = setting(
        None,
        "padded tokens per attention block (default 65536) or padded chunk (default 16384)",
        group=_SCALE,
        range=POSITIVE_INT,
        metavar="TOKENS",
    )
    metric: str | None = None  # None: the evaluator's main metric (primary_metric)
    device: str = setting(
        "auto", "cpu, cuda, cuda:1 ... (default auto)", group=_SCALE, value="device", metavar="DEVICE"
    )
    sampling: str = "epoch"
    # rows shuffled together (a stream's buffer); 0: a whole task (a stream: 10,000)
    shuffle_window: int = setting(
        0,
        "rows shuffled together (default 0: a whole file; stream 10000)",
        range=NON_NEGATIVE_INT,
        metavar="ROWS",
    )
    sampling_alpha: float = setting(0.5, range=FINITE)
    dynamic_weights_every: int = setting(0, range=NON_NEGATIVE_INT)  # 0 = fixed weights
    dynamic_weights_smoothing: float = setting(0.5, range=RATIO)
    dynamic_weights_relative: bool = False
    resume: bool = setting(False, "continue from the last checkpoint", group=_OUT, switch=True)
    allow_data_change: bool = setting(  # resume even if the training files changed since the checkpoint
        False,
        "--resume although the training files changed since the checkpoint (default: refused, naming the file)",
        group=_OUT,
        switch=True,
    )
    quiet: bool = setting(False, "no progress bars", group=_OUT, switch=True)
    keep_training_state: bool = setting(  # keep checkpoints/ after the run (embforge.training.artifacts)
        False,
        "keep checkpoints/ (optimizer state, about 3x the model's size) after the run, to --resume it later "
        "(default off: removed)",
        group=_OUT,
        switch=True,
    )
    mini_batch_size: int = setting(  # 0 = no cached step
        0,
        "cached step (GradCache): embed the batch N rows at a time, loss over the whole batch (default 0 = off)",
        group=_SCALE,
        range=NON_NEGATIVE_INT,
    )
    gradient_checkpointing: bool = setting(
        False,
        "recompute each layer in the backward pass: less activation memory, ~1/3 more compute (default off)",
        group=_SCALE,
        switch=True,
    )
    gather_negatives: bool = setting(  # torchrun: each rank's loss is the global batch's (distributed.py)
        True,
        "under torchrun: every process's loss is the global batch's (all-gathered embeddings: in-batch negatives "
        "from every process, the gradients of one process); default on",
        group=_SCALE,
        switch=True,
        negatable=True,
    )
    lora_r: int = setting(  # LoRA rank; 0 = full fine-tuning (embforge.modeling.lora)
        0,
        "train rank-R LoRA adapters, not all weights (default 0: off; pip install -e '.[peft]')",
        group=_MODEL,
        range=NON_NEGATIVE_INT,
        metavar="RANK",
        pipeline=_NO_LORA,
    )
    lora_alpha: float | None = setting(  # None = 2 * lora_r
        None, "LoRA scaling numerator (default 2 x rank)", group=_MODEL, range=POSITIVE, pipeline=_NO_LORA
    )
    lora_dropout: float = setting(
        0.0,
        "dropout on the LoRA adapters' input, in [0, 1, pipeline=_NO_LORA) (default 0)",
        group=_MODEL,
        range=finite(0, 1, open_high=True),
        metavar="P",
    )
    lora_targets: str = setting(  # or e.g. "query,value" / "q_proj,v_proj"
        "all-linear",
        "modules to adapt: q_proj,v_proj ... (default all-linear)",
        group=_MODEL,
        metavar="MODULES",
        pipeline=_NO_LORA,
    )
    merge_lora: bool = setting(  # fold the adapters into the final model (a plain sentence-transformers folder)
        False,
        "fold the LoRA adapters into the weights of the final model (a plain sentence-transformers folder; default "
        "off)",
        group=_OUT,
        switch=True,
        pipeline=_NO_LORA,
    )
    # weight averaging (embforge.training.averaging, which checks these): the final model is the average
    ema_decay: float | None = setting(
        None,
        "final model = EMA of the weights with this decay in [0, 1), e.g. 0.99 (default off)",
        group=_OPT,
        range=EMA_DECAY,
        checked=False,
    )
    ema_start: int = setting(
        0, "first step the EMA follows (default 0)", group=_OPT, range=NON_NEGATIVE_INT, checked=False
    )
    soup_last: int = setting(
        0,
        "final model = mean of the weights at the last K checkpoint steps (default 0)",
        group=_OPT,
        range=NON_NEGATIVE_INT,
        checked=False,
    )
    soup_every: int = setting(  # 0 = save_every
        0,
        "steps between the soup's members (default: --save-every)",
        group=_OPT,
        range=NON_NEGATIVE_INT,
        checked=False,
    )
    # an anchor to the starting weights (embforge.training.anchor, which checks these)
    l2sp: float = setting(
        0.0,
        "after each step pull lr x L2SP of the way back to the starting weights, e.g. 1000 (default 0: off)",
        group=_OPT,
        range=NON_NEGATIVE,
        checked=False,
    )
    wise_ft: float | None = setting(
        None,
        "final model = (1 - W) x starting + W x fine-tuned weights, W in [0, 1], e.g. 0.5 (default off)",
        group=_OPT,
        range=RATIO,
        checked=False,
    )
    lines: float | None = setting(
        None,
        "final model: each weight keeps (A + (1 - A) x its depth) of its change (LiNeS; embeddings A, last layer "
        "all), A in [0, 1], e.g. 0.5 (default off)",
        group=_OPT,
        range=RATIO,
        checked=False,
    )
    ewc: float = setting(
        0.0,
        "after each step pull each weight lr x EWC x its Fisher importance of the way back, e.g. 1000 (default 0)",
        group=_OPT,
        range=NON_NEGATIVE,
        checked=False,
    )
    ewc_texts: int = 2048  # texts of the run's tasks the starting model's Fisher information is estimated on

    def __post_init__(self) -> None:
        check_ranges(self)
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
