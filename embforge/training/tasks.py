"""Training tasks: a data set, the loss that trains on it, a weight; and their tokenised, ready-to-batch form.

The trainer asks the model for a prepared task (``model.prepare_task(task)``), which must offer:

- ``lengths``: tokens per row (for length-grouped batching);
- ``loss(model, rows, chunk_tokens) -> Tensor``: the loss of one batch of rows.

So a bi-encoder (:class:`PreparedEmbeddingTask`) and a cross-encoder share one training loop.
"""

from __future__ import annotations

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
    """A bi-encoder task's data tokenised once: token ids per text column and the labels as a tensor."""

    def __init__(self, task: Task, model: Any) -> None:
        task.validate()
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
        self.labels = None if labels is None else torch.as_tensor(task.loss.prepare_labels(labels))
        self.lengths = [sum(len(col[r]) for col in self.ids) for r in range(len(task.data))]

    def loss(self, model: Any, rows: tuple[int, ...], chunk_tokens: int) -> Tensor:
        flat = [col[r] for col in self.ids for r in rows]
        embeddings = list(model.embed_ids(flat, max_tokens=chunk_tokens).split(len(rows)))
        labels = None if self.labels is None else self.labels[list(rows)].to(embeddings[0].device)
        return self.task.loss(embeddings, labels)
