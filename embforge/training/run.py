"""A training run described by data: which model, which files and loss, which hyper-parameters.

The CLI and TOML files build a :class:`RunSpec`; :func:`run` turns it into an encoder, tasks and an evaluator and
calls :func:`embforge.training.loop.train`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embforge.data.tables import read_table
from embforge.modeling.resolve import DEFAULT_MODEL
from embforge.training.loop import TrainConfig, train
from embforge.training.tasks import Task

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class RunSpec:
    """A single-stage run: model + training files + loss + :class:`TrainConfig`."""

    model: str = DEFAULT_MODEL
    train: list[str] = field(default_factory=list)
    eval: str | None = None
    loss: str = "cosent"
    loss_options: dict[str, Any] = field(default_factory=dict)
    columns: str | dict[str, str] | None = None
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None
    max_seq_length: int | None = None
    model_type: str = "bi"  # "bi" (Encoder) or "cross" (CrossEncoder; losses bce, ce, cosent, mse, listwise)
    # retrieval training (BEIR or SciFact folder): mined negatives, optionally refreshed ANCE-style
    retrieval_train: str | None = None
    retrieval_split: str = "train"
    retrieval_eval_split: str | None = None
    num_negatives: int = 1
    mine_method: str = "dense"
    refresh_negatives_every: int = 0
    hard_ratio_start: float = 0.3
    hard_ratio_end: float = 0.9
    config: TrainConfig = field(default_factory=TrainConfig)


_SPEC_FIELDS = {f.name for f in dataclasses.fields(RunSpec)} - {"config"}
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def spec_from_dict(values: dict[str, Any], *, source: str = "config") -> RunSpec:
    """Build a :class:`RunSpec` from flat keys (RunSpec and TrainConfig fields); unknown keys are an error."""
    unknown = set(values) - _SPEC_FIELDS - _CONFIG_FIELDS
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"valid keys: {', '.join(sorted(_SPEC_FIELDS | _CONFIG_FIELDS))}"
        )
    spec_values = {k: v for k, v in values.items() if k in _SPEC_FIELDS}
    if isinstance(spec_values.get("train"), str):
        spec_values["train"] = [spec_values["train"]]
    config = TrainConfig(**{k: v for k, v in values.items() if k in _CONFIG_FIELDS})
    return RunSpec(**spec_values, config=config)


def load_toml(path: str | Path) -> dict[str, Any]:
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def build_tasks(spec: RunSpec, model: Any) -> list[Task]:
    """One task per training file, all with the spec's loss."""
    from embforge.losses import get_loss

    if not spec.train:
        raise ValueError("no training data: pass --train FILE (or train = [...] in the config file)")
    tasks = []
    for path in spec.train:
        data = read_table(path, columns=spec.columns)
        labels = data.labels()
        num_labels = int(labels.max()) + 1 if labels is not None and data.label_column == "label" else None
        loss = get_loss(
            spec.loss,
            dim=model.dim,
            num_labels=num_labels,
            matryoshka_dims=spec.matryoshka_dims,
            matryoshka_weights=spec.matryoshka_weights,
            **spec.loss_options,
        )
        task = Task(Path(path).stem, data, loss)
        task.validate()
        tasks.append(task)
    return tasks


def run(spec: RunSpec) -> dict[str, Any]:
    """Load the model, build tasks and the evaluator, train, and return the training summary."""
    from embforge.encoder import Encoder
    from embforge.evaluate.sts import sts_evaluator

    if spec.model_type not in ("bi", "cross"):
        raise ValueError(f"model_type must be 'bi' or 'cross', got {spec.model_type!r}")
    if spec.model_type == "cross":
        from embforge.training.cross import run_cross

        return run_cross(spec)
    model = Encoder.load(spec.model, max_seq_length=spec.max_seq_length)
    if spec.matryoshka_dims and max(spec.matryoshka_dims) > model.dim:
        raise ValueError(
            f"matryoshka_dims: {max(spec.matryoshka_dims)} is larger than the model's dimension {model.dim}"
        )
    tasks = build_tasks(spec, model) if spec.train or not spec.retrieval_train else []
    evaluator = sts_evaluator(read_table(spec.eval, columns=spec.columns)) if spec.eval else None
    refresher = None
    if spec.retrieval_train:
        tasks, refresher, retrieval_eval = _retrieval_setup(spec, model, tasks)
        evaluator = retrieval_eval or evaluator
    return train(model, tasks, spec.config, evaluator=evaluator, refresher=refresher)


def _retrieval_setup(spec: RunSpec, model: Any, tasks: list[Task]) -> tuple[list[Task], Any, Any]:
    """Mined-negative retrieval task (+ ANCE refresh hook, + retrieval evaluator) from ``spec.retrieval_*``."""
    import math

    from embforge.cli.retrieval import load_data
    from embforge.evaluate.retrieval import retrieval_evaluator
    from embforge.losses import get_loss
    from embforge.training.refresh import retrieval_training

    data = load_data(spec.retrieval_train, spec.retrieval_split)
    rows = sum(1 for rel in data.qrels.values() for grade in rel.values() if grade > 0)
    steps = spec.config.max_steps or math.ceil(
        spec.config.epochs * math.ceil(rows / spec.config.batch_size) / spec.config.grad_accum
    )
    loss = get_loss("infonce" if spec.loss == "cosent" else spec.loss, dim=model.dim, **spec.loss_options)
    tasks, refresher = retrieval_training(
        model,
        data=data,
        loss=loss,
        num_negatives=spec.num_negatives,
        method=spec.mine_method,
        refresh_every=spec.refresh_negatives_every,
        hard_ratio_start=spec.hard_ratio_start,
        hard_ratio_end=spec.hard_ratio_end,
        total_steps=steps,
        output=spec.config.output,
        other_tasks=tasks,
        resume=spec.config.resume,
    )
    evaluator = None
    if spec.retrieval_eval_split:
        evaluator = retrieval_evaluator(load_data(spec.retrieval_train, spec.retrieval_eval_split))
        if spec.config.metric == "spearman":
            spec.config.metric = "ndcg@10"
    return tasks, refresher, evaluator
