"""What a training run needs besides the model and the data: :class:`TrainConfig` (the CLI and TOML files fill it),
made of small parts that check themselves.

Every field keeps one flat name (``lr``, ``ema_decay`` ...) in TOML files, flags and keyword arguments, and lives
in exactly one part (:func:`embforge.fields.flat_fields` says which): ``TrainConfig(lr=1e-4)`` sets
``config.optim.lr``, and ``config.changed(lr=1e-4)`` (or ``dataclasses.replace``) changes it in a copy.

>>> config = TrainConfig(lr=1e-4, ema_decay=0.9)
>>> config.optim.lr, config.averaging.ema_decay, config.optim.batch_size
(0.0001, 0.9, 32)
>>> TrainConfig(lr=0)
Traceback (most recent call last):
...
ValueError: lr must be a finite number > 0, got 0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embforge.fields import PART, check_ranges, flat_fields, parts, setting
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
from embforge.training.anchor import Anchoring
from embforge.training.averaging import Averaging
from embforge.training.sampling import STRATEGIES
from embforge.training.weighting import DynamicWeighting

LAYER_DECAY = finite(0, 1, open_low=True)
_OPT, _SCALE, _EVAL, _OUT, _MODEL = "optimisation", "scale", "evaluation", "output", "model"
_NO_LORA = "a pipeline trains all weights (its stages take no LoRA adapters)"  # About.pipeline


@dataclass
class Optimisation:
    """Steps, batch and learning rate (``TrainConfig.optim``)."""

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

    def __post_init__(self) -> None:
        check_ranges(self)
        check("layer_lr_decay", self.layer_lr_decay, LAYER_DECAY, hint="1 = every layer at the full rate")


@dataclass
class Scale:
    """Memory, precision and devices (``TrainConfig.scale``)."""

    amp: str = setting(
        "auto",
        "mixed precision (default auto: bf16 where the CPU/GPU has it natively)",
        group=_SCALE,
        choices=("auto", "no", "bf16", "fp16"),
    )
    device: str = setting(
        "auto", "cpu, cuda, cuda:1 ... (default auto)", group=_SCALE, value="device", metavar="DEVICE"
    )
    chunk_tokens: int | None = setting(
        None,
        "padded tokens per attention block (default 65536) or padded chunk (default 16384)",
        group=_SCALE,
        range=POSITIVE_INT,
        metavar="TOKENS",
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

    def __post_init__(self) -> None:
        check_ranges(self)
        check_amp(self.amp)


@dataclass
class DataOptions:
    """How the tasks' rows are drawn into batches (``TrainConfig.data``)."""

    sampling: str = "epoch"
    sampling_alpha: float = setting(0.5, range=FINITE)
    # rows shuffled together (a stream's buffer); 0: a whole task (a stream: 10,000)
    shuffle_window: int = setting(
        0,
        "rows shuffled together (default 0: a whole file; stream 10000)",
        range=NON_NEGATIVE_INT,
        metavar="ROWS",
    )
    group_by_length: bool = setting(
        False, "batch texts of similar length together (faster, less random; default off)", switch=True
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.sampling not in STRATEGIES:
            raise ValueError(f"sampling must be one of {', '.join(STRATEGIES)}, got {self.sampling!r}")


@dataclass
class Evaluation:
    """What is measured and logged during training (``TrainConfig.evaluation``)."""

    eval_every: int = setting(  # 0 = at the end only
        0,
        "evaluate every N steps (default 0: at the end only)",
        group=_EVAL,
        range=NON_NEGATIVE_INT,
    )
    metric: str | None = setting(None)  # None: the evaluator's main metric (primary_metric)
    log_every: int = setting(10, range=POSITIVE_INT)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class Checkpointing:
    """Checkpoints, resuming and what stays on disk after the run (``TrainConfig.checkpoints``)."""

    save_every: int = setting(  # 0 = no checkpoints
        200,
        "checkpoint every N steps and at the end (default 200; 0 = no checkpoints, the model is still saved)",
        group=_OUT,
        range=NON_NEGATIVE_INT,
    )
    keep_checkpoints: int = setting(1, range=NON_NEGATIVE_INT)  # 0 = keep them all
    resume: bool = setting(False, "continue from the last checkpoint", group=_OUT, switch=True)
    allow_data_change: bool = setting(  # resume even if the training files changed since the checkpoint
        False,
        "--resume although the training files changed since the checkpoint (default: refused, naming the file)",
        group=_OUT,
        switch=True,
    )
    keep_training_state: bool = setting(  # keep checkpoints/ after the run (embforge.training.artifacts)
        False,
        "keep checkpoints/ (optimizer state, about 3x the model's size) after the run, to --resume it later "
        "(default off: removed)",
        group=_OUT,
        switch=True,
    )

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class LoraOptions:
    """LoRA adapters instead of full fine-tuning (``TrainConfig.lora``; read as a
    :class:`~embforge.modeling.lora.LoraConfig` with :meth:`adapter`)."""

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
        "dropout on the LoRA adapters' input, in [0, 1) (default 0)",
        group=_MODEL,
        range=finite(0, 1, open_high=True),
        metavar="P",
        pipeline=_NO_LORA,
    )
    lora_targets: str = setting(  # or e.g. "query,value" / "q_proj,v_proj"
        "all-linear",
        "modules to adapt: q_proj,v_proj ... (default all-linear)",
        group=_MODEL,
        metavar="MODULES",
        pipeline=_NO_LORA,
    )
    adapter_name: str | None = setting(  # a named task adapter (modeling/adapters.py)
        None,
        "train a named task adapter (e.g. retrieval), added beside the task adapters the model already has and "
        "saved in adapters/NAME (needs --lora-r; default: one unnamed adapter)",
        group=_MODEL,
        metavar="NAME",
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

    def __post_init__(self) -> None:
        check_ranges(self)
        self.adapter()  # validates the fields as LoraConfig does

    def adapter(self) -> LoraConfig:
        """These settings as :func:`~embforge.modeling.lora.apply_lora` takes them."""
        return LoraConfig.from_fields(self)


@dataclass(init=False)
class TrainConfig:
    """Everything a training run needs besides the model and the data. The CLI and TOML files fill it.

    The defaults are the measured recipe for all-MiniLM-L6-v2 on STS-B (see README: CoSENT, lr 5e-5, batch 32).

    Made of parts, each a dataclass that checks itself: :class:`Optimisation` (``optim``), :class:`Scale`
    (``scale``), :class:`DataOptions` (``data``), :class:`Evaluation` (``evaluation``), :class:`Checkpointing`
    (``checkpoints``), :class:`LoraOptions` (``lora``) and the off-by-default features' own
    (:class:`~embforge.training.weighting.DynamicWeighting` ``weighting``, :class:`~embforge.training.averaging.
    Averaging` ``averaging``, :class:`~embforge.training.anchor.Anchoring` ``anchor``; the loop runs them through
    :mod:`embforge.training.extras`). The keyword arguments are the flat field names (``TrainConfig(lr=1e-4)``),
    or whole parts (``TrainConfig(optim=Optimisation(lr=1e-4))``); a flat name given with its part changes that
    part. :meth:`flat` gives the flat fields back.

    ``mini_batch_size`` > 0 runs each micro-step cached (GradCache, :mod:`embforge.training.step`): the batch is
    embedded that many texts at a time, with the loss and gradients of the whole batch. ``gradient_checkpointing``
    recomputes each layer in the backward pass instead of storing its activations.

    Under ``torchrun`` ``batch_size`` is the global batch, split across the ranks. ``gather_negatives`` (default)
    all-gathers the embeddings so that every loss sees the global batch (in-batch negatives from every rank; the
    same gradients as one process); ``False`` gives each rank the loss of its own rows
    (:mod:`embforge.training.distributed`).

    ``ema_decay``/``soup_last`` make the final model an average of weights (:mod:`embforge.training.averaging`);
    ``l2sp``, ``ewc``, ``wise_ft`` and ``lines`` anchor the run to its base (:mod:`embforge.training.anchor`).
    """

    output: str = setting(
        "output", "output folder (default ./output)", group=_OUT, value="folder", metavar="DIR"
    )
    seed: int = setting(
        42,
        "random seed (default 42; overrides every stage's seed of a pipeline file)",
        group=_OPT,
        range=SEED,
    )
    quiet: bool = setting(False, "no progress bars", group=_OUT, switch=True)
    optim: Optimisation = field(default_factory=Optimisation, metadata=PART)
    scale: Scale = field(default_factory=Scale, metadata=PART)
    data: DataOptions = field(default_factory=DataOptions, metadata=PART)
    evaluation: Evaluation = field(default_factory=Evaluation, metadata=PART)
    checkpoints: Checkpointing = field(default_factory=Checkpointing, metadata=PART)
    lora: LoraOptions = field(default_factory=LoraOptions, metadata=PART)
    weighting: DynamicWeighting = field(default_factory=DynamicWeighting, metadata=PART)
    averaging: Averaging = field(default_factory=Averaging, metadata=PART)
    anchor: Anchoring = field(default_factory=Anchoring, metadata=PART)

    def __init__(self, **values: object) -> None:
        given: dict[str, dict[str, object]] = {name: {} for name in _PARTS}
        for key, value in values.items():
            if key not in _HOME:
                raise TypeError(
                    f"TrainConfig has no field {key!r}; its fields: {', '.join(sorted(FLAT_FIELDS))}"
                )
            if key not in _PARTS and _HOME[key] is not None:
                given[str(_HOME[key])][key] = value
        for item in dataclasses.fields(self):
            if item.name in _PARTS:
                value = _part(_PARTS[item.name], values.get(item.name), given[item.name])
            else:
                value = values.get(item.name, item.default)
            object.__setattr__(self, item.name, value)
        check_ranges(self)

    def changed(self, **values: object) -> TrainConfig:
        """A copy with the flat fields (or whole parts) ``values`` set: ``config.changed(lr=1e-4, resume=True)``."""
        return TrainConfig(
            **{**{item.name: getattr(self, item.name) for item in dataclasses.fields(self)}, **values}
        )

    def flat(self) -> dict[str, object]:
        """The flat fields and their values, in declaration order (what a TOML file or the model card lists)."""
        return {
            item.name: getattr(self._holder(owner), item.name) for owner, item in flat_fields(TrainConfig)
        }

    def _holder(self, owner: str | None) -> object:
        return self if owner is None else getattr(self, owner)

    if not TYPE_CHECKING:  # a flat name read or set on the whole config says where it lives now

        def __getattr__(self, name: str) -> object:
            if name in _HOME and name not in _PARTS and _HOME[name] is not None:
                raise AttributeError(f"TrainConfig.{name} is now TrainConfig.{_HOME[name]}.{name}")
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        def __setattr__(self, name: str, value: object) -> None:
            if name in _HOME and name not in _PARTS and _HOME[name] is not None:
                raise AttributeError(f"TrainConfig.{name} is now TrainConfig.{_HOME[name]}.{name}")
            object.__setattr__(self, name, value)


_PARTS: dict[str, type] = parts(TrainConfig)
# every flat field name -> the part that holds it (None: TrainConfig itself); a part's name maps to itself
_HOME: dict[str, str | None] = {
    **{item.name: owner for owner, item in flat_fields(TrainConfig)},
    **{name: name for name in _PARTS},
}
FLAT_FIELDS: frozenset[str] = frozenset(name for name in _HOME if name not in _PARTS)


def _part(cls: type, value: object, changes: dict[str, object]) -> object:
    """Part ``cls`` from ``value`` (an instance, a mapping of its fields, or ``None``: its defaults) with the flat
    fields ``changes`` set."""
    if value is None:
        return cls(**changes)
    if isinstance(value, Mapping):
        return cls(**{**value, **changes})
    if not isinstance(value, cls):
        raise TypeError(f"TrainConfig part must be a {cls.__name__}, got {type(value).__name__}")
    return dataclasses.replace(value, **changes) if changes else value  # type: ignore[type-var]


def planned_steps(sizes: Sequence[int | None], config: TrainConfig) -> int:
    """Optimiser steps of a run over tasks of ``sizes`` rows: ``max_steps``, else ``epochs`` passes over every
    task in batches of ``batch_size`` with ``grad_accum`` batches per step. The one count every schedule uses
    (learning rate, hard-negative ratio)."""
    optim = config.optim
    if optim.max_steps is not None:
        check("max_steps", optim.max_steps, POSITIVE_INT)
        return optim.max_steps
    if any(n is None for n in sizes):
        raise ValueError("a streamed data set of unknown length needs max_steps (--max-steps N)")
    batches_per_epoch = sum(math.ceil((n or 0) / optim.batch_size) for n in sizes)
    return max(1, math.ceil(optim.epochs * batches_per_epoch / optim.grad_accum))


def primary_metric(metrics: Mapping[str, float]) -> str | None:
    """The metric that picks the best checkpoint when none is set: Spearman, else NDCG@10, else accuracy, else
    the first one reported."""
    for name in ("spearman", "ndcg@10", "accuracy"):
        if name in metrics:
            return name
    return next(iter(metrics), None)
