"""Training tasks: a data set, the loss that trains on it, a weight; and their tokenised, ready-to-batch form.

:func:`prepare` tokenises a task once for a model. A prepared task offers what one micro-step needs:

- ``inputs(rows)``: what the model forwards for those rows (texts' token ids, or tokenised pairs);
- ``labels(rows)``: their labels (or None);
- ``loss_fn(outputs, labels)``: the loss of the model's outputs for ``inputs(rows)``;
- ``lengths``: tokens per row (for length-grouped batching).

So a bi-encoder (:class:`PreparedEmbeddingTask`) and a cross-encoder (:class:`PreparedCrossTask`) share one
training loop, and :mod:`embforge.training.step` can run the forward whole or in cached mini-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from embforge.data.tables import DataError, Dataset


@dataclass
class Task:
    """One training task: a data set, the loss that trains on it, and its sampling weight."""

    name: str
    data: Dataset
    loss: Any
    weight: float = 1.0
    prompts: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Check that the data has the columns the loss needs, naming the task, file and column."""
        columns = self.data.text_columns
        loss = self.loss
        where = f"task {self.name!r} (loss {loss.name!r})"
        if len(columns) < loss.min_texts:
            raise DataError(
                f"{self.data.path}:1: {where} needs at least {loss.min_texts} text column(s), "
                f"found {columns or 'none'}"
            )
        if loss.max_texts is not None and len(columns) > loss.max_texts:
            raise DataError(
                f"{self.data.path}:1: {where} takes at most {loss.max_texts} text column(s), found {columns}"
            )
        if loss.needs_labels and self.data.label_column is None:
            raise DataError(
                f"{self.data.path}:1: {where} needs a 'score' or 'label' column; "
                f"found {list(self.data.columns)}"
            )


class PreparedEmbeddingTask:
    """A bi-encoder task's data tokenised once: token ids per text column and the labels as a tensor.

    The model forwards ``inputs(rows)`` — every text column's texts of those rows, column after column — to one
    ``(columns * rows, dim)`` tensor; :meth:`loss_fn` splits it back into columns for the loss.
    """

    def __init__(self, task: Task, model: Any) -> None:
        task.validate()
        if getattr(task.loss, "scores_in", False):
            raise ValueError(
                f"task {task.name!r}: loss {task.loss.name!r} is a cross-encoder loss; a bi-encoder needs an "
                "embedding loss (see embforge.losses.LOSSES)"
            )
        self.task = task
        names = task.data.text_columns
        self.ids = [
            model.tokenize_ids(
                task.data.columns[c], prefix=model.prompt_text(prompt_name=task.prompts.get(c))
            )
            for c in names
        ]
        if task.loss.repeat_single_text:
            self.ids = self.ids * 2
        labels = task.data.labels()
        self.all_labels = None if labels is None else torch.as_tensor(task.loss.prepare_labels(labels))
        self.lengths = [sum(len(col[r]) for col in self.ids) for r in range(len(task.data))]

    def inputs(self, rows: Sequence[int]) -> list[list[int]]:
        return [col[r] for col in self.ids for r in rows]

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        return None if self.all_labels is None else self.all_labels[list(rows)]

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        """The task's loss of the model's outputs for ``inputs(rows)`` (split into one tensor per column)."""
        return self.task.loss(list(outputs.split(len(outputs) // len(self.ids))), labels)


class PreparedCrossTask:
    """A cross-encoder task tokenised once: the pairs ``(first text, other text)`` of every row, and the labels.

    Pointwise losses score ``(sentence1, sentence2)``; grouped losses (``listwise``) score the query with each
    candidate column (or, with a single candidate column, with every positive of the batch: ``rows²`` pairs).
    The model's outputs are pair logits; :meth:`loss_fn` shapes them as the loss expects.
    """

    def __init__(self, task: Task, model: Any) -> None:
        task.validate()
        if not getattr(task.loss, "scores_in", False):
            raise ValueError(
                f"task {task.name!r}: loss {task.loss.name!r} is a bi-encoder loss; a cross-encoder needs one of "
                "bce, ce, cosent, mse, listwise"
            )
        self.task = task
        self.model = model
        self.grouped = bool(task.loss.grouped)
        columns = task.data.text_columns
        self.first = task.data.columns[columns[0]]
        self.others = [task.data.columns[c] for c in columns[1:]]
        self.in_batch = self.grouped and len(self.others) == 1
        self.ids = [model.tokenize_ids(self.first, other) for other in self.others]
        labels = task.data.labels()
        self.all_labels = (
            None if labels is None or self.grouped else torch.as_tensor(task.loss.prepare_labels(labels))
        )
        self.lengths = [sum(len(col[r][0]) for col in self.ids) for r in range(len(task.data))]

    def inputs(self, rows: Sequence[int]) -> list[Any]:
        if self.in_batch:  # every query with every positive of the batch
            queries = [self.first[r] for r in rows]
            positives = [self.others[0][r] for r in rows]
            return self.model.tokenize_ids(
                [q for q in queries for _ in positives], [p for _ in queries for p in positives]
            )
        if self.grouped:
            return [col[r] for r in rows for col in self.ids]
        return [self.ids[0][r] for r in rows]

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        if self.in_batch:
            return torch.arange(len(rows))
        return None if self.all_labels is None else self.all_labels[list(rows)]

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        """The task's loss of the pair logits for ``inputs(rows)``."""
        if self.in_batch:
            n = round(len(outputs) ** 0.5)
            return self.task.loss(outputs[:, 0].view(n, n), labels)
        if self.grouped:
            return self.task.loss(outputs[:, 0].view(-1, len(self.ids)), None)
        return self.task.loss(outputs, labels)


PreparedTask = PreparedEmbeddingTask | PreparedCrossTask


def prepare(task: Task, model: Any) -> PreparedTask:
    """Tokenise ``task`` once for ``model`` (a cross-encoder gets pair inputs, a bi-encoder text inputs)."""
    if hasattr(model, "score_ids"):
        return PreparedCrossTask(task, model)
    return PreparedEmbeddingTask(task, model)
