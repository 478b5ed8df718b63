"""``embforge train --model-type cross``: build a cross-encoder, its tasks and evaluator from a :class:`RunSpec`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embforge.data.tables import Dataset, read_table
from embforge.training.tasks import Task


def cross_evaluator(data: Dataset) -> Any:
    """STS correlations for scored pairs, pair classification (incl. Spearman) for 0/1 labels."""
    from embforge.evaluate.pairs import evaluate_pairs
    from embforge.evaluate.sts import evaluate_sts

    if data.label_column == "label":
        return lambda model: evaluate_pairs(model, data)
    return lambda model: evaluate_sts(model, data)


def run_cross(spec: Any) -> dict[str, Any]:
    """Train a cross-encoder on ``spec.train`` with the cross loss ``spec.loss`` (default ``bce``)."""
    from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
    from embforge.losses.cross import get_cross_loss
    from embforge.training.loop import train

    if not spec.train:
        raise ValueError("no training data: pass --train FILE (or train = [...] in the config file)")
    if spec.matryoshka_dims:
        raise ValueError("matryoshka_dims applies to bi-encoders only; drop it with --model-type cross")
    loss_name = spec.loss
    num_labels = None
    if not is_cross_encoder_folder(spec.model):
        num_labels = 2 if loss_name in ("ce", "softmax") else 1
    model = CrossEncoder.load(spec.model, num_labels=num_labels, max_seq_length=spec.max_seq_length)
    tasks = []
    for path in spec.train:
        task = Task(
            Path(path).stem,
            read_table(path, columns=spec.columns),
            get_cross_loss(loss_name, **spec.loss_options),
        )
        task.validate()
        tasks.append(task)
    evaluator = cross_evaluator(read_table(spec.eval, columns=spec.columns)) if spec.eval else None
    return train(model, tasks, spec.config, evaluator=evaluator)
