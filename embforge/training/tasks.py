"""Training tasks: a data set, the loss that trains on it, a weight; and their tokenised, ready-to-batch form.

:func:`prepare` readies a task for a model. A prepared task offers what one micro-step needs:

- ``inputs(rows)``: what the model forwards for those rows (texts' token ids, or tokenised pairs), read from the
  task's data (in memory, memory-mapped or streamed: :mod:`embforge.data.sources`) and tokenised per batch;
- ``labels(rows)``: their labels (or None); for a loss that names a ``guide`` model (``gist``), the guide's
  embeddings of those rows' texts (:class:`GuideEmbeddings`);
- ``loss_fn(outputs, labels)``: the loss of the model's outputs for ``inputs(rows)``;
- ``lengths``: tokens per row, computed for the rows asked for (for length-grouped batching).

So a bi-encoder (:class:`PreparedEmbeddingTask`) and a cross-encoder (:class:`PreparedCrossTask`) share one
training loop, and :mod:`embforge.training.step` can run the forward whole or in cached mini-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from embforge.data.sources import RowSource
from embforge.data.tables import DataError, Dataset
from embforge.kinds import is_single_vector, kind_record, load_any, load_named
from embforge.losses.base import BaseLoss, EmbeddingLoss
from embforge.losses.cross import CrossLoss
from embforge.protocols import PairIds, TextTokenizing

if TYPE_CHECKING:
    from collections.abc import Callable

    from embforge.cross_encoder import CrossEncoder
    from embforge.protocols import DeviceLike, Embedder, TrainableModel

_Loss = TypeVar("_Loss", bound=BaseLoss)


@dataclass
class Task:
    """One training task: a data set, the loss that trains on it, and its sampling weight."""

    name: str
    data: Dataset | RowSource
    loss: BaseLoss  # an EmbeddingLoss (bi-encoders) or a CrossLoss (cross-encoders)
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
            # the losses whose labels are a teacher's scores: `embforge score` writes them
            from embforge.distill.targets import SCORE_LOSSES

            hint = (
                f"; add a teacher's scores of each row's candidates with `embforge score --teacher MODEL --data "
                f"{self.data.path} --output scored.jsonl` and train on that file"
                if loss.name in SCORE_LOSSES
                else ""
            )
            raise DataError(
                f"{self.data.path}:1: {where} needs a 'score' or 'label' column; "
                f"found {list(self.data.columns)}{hint}"
            )


def checked_loss(task: Task, kind: type[_Loss], wrong_kind: str) -> _Loss:
    """``task``'s loss once the task is valid (:meth:`Task.validate`) and its loss is of ``kind`` (the kind the
    model trains with); else a ``ValueError`` naming the task and loss, ``wrong_kind`` saying what is wrong."""
    task.validate()
    if not isinstance(task.loss, kind):
        raise ValueError(f"task {task.name!r}: loss {task.loss.name!r} {wrong_kind}")
    return task.loss


class _RowBatches:
    """A task's rows fetched by batch from its data (the last batch is kept: ``inputs`` and ``labels`` of the
    same rows read them once), and its labels: all prepared once for an in-memory table, per batch otherwise."""

    def __init__(self, task: Task, *, with_labels: bool = True) -> None:
        self.task = task
        self.data = task.data
        self._last: tuple[tuple[int, ...], dict[str, list]] | None = None
        self.label_name = task.data.label_column if with_labels else None
        self.all_labels: Tensor | None = None
        if (
            isinstance(task.data, Dataset) and self.label_name is not None
        ):  # whole-table label preparation (a scale from the data's maximum)
            labels = task.data.labels()
            self.all_labels = None if labels is None else torch.as_tensor(task.loss.prepare_labels(labels))

    def fetch(self, rows: Sequence[int]) -> dict[str, list]:
        key = tuple(rows)
        if self._last is None or self._last[0] != key:
            self._last = (key, self.data.take(key))
        return self._last[1]

    def batch_labels(self, rows: Sequence[int]) -> Tensor | None:
        if self.label_name is None:
            return None
        if self.all_labels is not None:
            return self.all_labels[list(rows)]
        dtype = np.float32 if self.label_name == "score" else np.int64
        values = np.asarray(self.fetch(rows)[self.label_name], dtype=dtype)
        return torch.as_tensor(self.task.loss.prepare_labels(values))


class TokenLengths:
    """Tokens per row of a prepared task, computed for the rows asked for (``lengths[start:end]``): what
    length-grouped batching needs, a window at a time."""

    def __init__(self, task: PreparedEmbeddingTask | PreparedCrossTask) -> None:
        self.task = task
        self._cache: tuple[tuple[int, int], list[int]] | None = None

    def __getitem__(self, span: slice) -> list[int]:
        start, stop = span.start or 0, span.stop
        if self._cache is None or self._cache[0] != (start, stop):
            present = self.task.rows.data.rows(start, stop)
            rows = range(start, start + len(present[self.task.names[0]]))
            self._cache = ((start, stop), self.task.row_lengths(rows))
        return self._cache[1]


class TextModel(TextTokenizing, Protocol):
    """The model a bi-encoder task tokenises for, on its device (where a loss's guide runs too)."""

    @property
    def device(self) -> torch.device: ...


class GuideEmbeddings:
    """A loss's guide model (:attr:`embforge.losses.base.EmbeddingLoss.guide`: GIST's false-negative filter),
    loaded once, frozen, and run on each batch's texts in eval mode without autograd (``encode``), each column
    with the task's prompt: the labels the loss reads, ``(rows, columns, D_g)``. The loss never sees the model."""

    def __init__(self, name: str, *, device: DeviceLike) -> None:
        model = load_any(name, device=device)
        if not is_single_vector(model):
            raise ValueError(
                f"guide {name!r} must be a dense or static embedding model (one vector per text)"
            )
        for weight in model.parameters():  # frozen: encode() runs without autograd, and nothing may train it
            weight.requires_grad_(False)
        self.model: Embedder = model

    def __call__(self, columns: Sequence[list[str]], prefixes: Sequence[str]) -> Tensor:
        parts = [
            self.model.encode(texts, batch_size=len(texts), prompt=prefix, show_progress=False)
            for texts, prefix in zip(columns, prefixes)
        ]
        return torch.from_numpy(np.stack(parts, axis=1))


class PreparedEmbeddingTask:
    """A bi-encoder task ready to batch: its rows are fetched and tokenised per batch (``inputs(rows)``).

    The model forwards ``inputs(rows)`` — every text column's token ids of those rows, column after column — to
    one ``(columns * rows, dim)`` tensor; :meth:`loss_fn` splits it back into columns for the loss. Nothing is
    tokenised ahead, so a corpus of any size costs no time or memory before the first step.
    """

    def __init__(self, task: Task, model: TextModel) -> None:
        self.loss = checked_loss(
            task,
            EmbeddingLoss,
            "is a cross-encoder loss; a bi-encoder needs an embedding loss (see embforge.losses.LOSSES)",
        )
        self.task, self.model, self.names = task, model, task.data.text_columns
        self.prefixes = [model.prompt_text(prompt_name=task.prompts.get(c)) for c in self.names]
        self.copies = 2 if task.loss.repeat_single_text else 1
        self.rows = _RowBatches(task)
        self.lengths = TokenLengths(self)
        self.guide = (
            None if self.loss.guide is None else GuideEmbeddings(self.loss.guide, device=model.device)
        )

    def tokenize(self, column: int, texts: list[str]) -> list[list[int]]:
        """Token ids of ``texts`` of text column ``column`` (its prompt prefixed); the first column is the query
        column, tokenised as queries (``is_query``): a multi-vector model's ``[Q]`` marker and ``[MASK]``
        augmentation, an inference-free sparse model's query table; the others as documents."""
        return self.model.tokenize_ids(texts, prefix=self.prefixes[column], is_query=column == 0)

    def column_ids(self, rows: Sequence[int]) -> list[list[list[int]]]:
        batch = self.rows.fetch(rows)
        return [self.tokenize(i, batch[c]) for i, c in enumerate(self.names)] * self.copies

    def inputs(self, rows: Sequence[int]) -> list[list[int]]:
        return [ids for column in self.column_ids(rows) for ids in column]

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        if self.guide is not None:  # the guide's embeddings of the rows' texts (gist)
            batch = self.rows.fetch(rows)
            return self.guide([batch[c] for c in self.names], self.prefixes)
        return self.rows.batch_labels(rows)

    def row_lengths(self, rows: Sequence[int]) -> list[int]:
        return [sum(map(len, row)) for row in zip(*self.column_ids(rows))]

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        """The task's loss of the model's outputs for ``inputs(rows)`` (split into one tensor per column)."""
        return self.loss(list(outputs.split(len(outputs) // (len(self.names) * self.copies))), labels)


class PreparedCrossTask:
    """A cross-encoder task ready to batch: the pairs ``(first text, other text)`` of each batch's rows,
    tokenised per batch, and their labels.

    Pointwise losses score ``(sentence1, sentence2)``; grouped losses (``listwise``) score the query with each
    candidate column (or, with a single candidate column, with every positive of the batch: ``rows²`` pairs).
    The model's outputs are pair logits; :meth:`loss_fn` shapes them as the loss expects.
    """

    def __init__(self, task: Task, model: CrossEncoder) -> None:
        self.loss = checked_loss(
            task,
            CrossLoss,
            "is a bi-encoder loss; a cross-encoder needs one of bce, ce, cosent, mse, listwise",
        )
        self.task, self.model, self.names = task, model, task.data.text_columns
        self.grouped = self.loss.grouped
        self.in_batch = self.grouped and len(self.names) == 2
        self.rows = _RowBatches(task, with_labels=not self.grouped)  # listwise: the loss sees scores only
        self.lengths = TokenLengths(self)

    def pairs(self, rows: Sequence[int]) -> list[list[PairIds]]:
        """Per candidate column, the tokenised pairs (first column's text, candidate) of ``rows``."""
        batch = self.rows.fetch(rows)
        first = batch[self.names[0]]
        return [self.model.tokenize_ids(first, batch[c]) for c in self.names[1:]]

    def inputs(self, rows: Sequence[int]) -> list[PairIds]:
        if self.in_batch:  # every query with every positive of the batch
            batch = self.rows.fetch(rows)
            queries, positives = batch[self.names[0]], batch[self.names[1]]
            return self.model.tokenize_ids(
                [q for q in queries for _ in positives], [p for _ in queries for p in positives]
            )
        pairs = self.pairs(rows)
        if self.grouped:
            return [column[i] for i in range(len(rows)) for column in pairs]
        return pairs[0]

    def labels(self, rows: Sequence[int]) -> Tensor | None:
        if self.in_batch:
            return torch.arange(len(rows))
        return self.rows.batch_labels(rows)

    def row_lengths(self, rows: Sequence[int]) -> list[int]:
        return [sum(len(pair[0]) for pair in row) for row in zip(*self.pairs(rows))]

    def loss_fn(self, outputs: Tensor, labels: Tensor | None) -> Tensor:
        """The task's loss of the pair logits for ``inputs(rows)``."""
        if self.in_batch:
            n = round(len(outputs) ** 0.5)
            return self.loss(outputs[:, 0].view(n, n), labels)
        if self.grouped:
            return self.loss(outputs[:, 0].view(-1, len(self.names) - 1), None)
        return self.loss(outputs, labels)


PreparedTask = PreparedEmbeddingTask | PreparedCrossTask


def prepare(task: Task, model: TrainableModel) -> PreparedTask:
    """Ready ``task`` for ``model``: the prepared-task class its kind's record names
    (:attr:`embforge.kinds.KindRecord.prepared_task`; a cross-encoder gets pair inputs, a bi-encoder text inputs)."""
    prepared: Callable[[Task, TrainableModel], PreparedTask] = load_named(kind_record(model).prepared_task)
    return prepared(task, model)
