"""What every embedding loss looks like: embeddings of each text column (+ labels) in, a scalar out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from embforge.data.tables import Dataset
    from embforge.protocols import Embedder


def check_temperature(temperature: float) -> float:
    """``temperature`` if it is > 0 (it divides the logits), else a ``ValueError``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return float(temperature)


class BaseLoss(nn.Module):
    """Base class of every loss: the class attributes that tell the trainer what data the loss needs.

    - ``min_texts`` / ``max_texts``: how many text columns it accepts;
    - ``needs_labels``: whether a ``score`` or ``label`` column is required;
    - ``repeat_single_text``: feed a one-column data set twice (SimCSE: dropout makes the two views differ);
    - ``fixed_dim``: the loss owns parameters sized to the embedding (cannot be truncated by Matryoshka);
    - ``in_batch_negatives``: rows are scored against the other rows of the batch (so the sampler never puts the
      same text twice in one batch: it would be its own false negative).

    What the loss takes is declared by the subclass it derives from: :class:`EmbeddingLoss` (the embeddings of
    each text column) or :class:`embforge.losses.cross.CrossLoss` (pair scores). Together they satisfy
    :class:`embforge.protocols.Loss`.
    """

    name = "loss"
    min_texts = 2
    max_texts: int | None = None
    needs_labels = False
    repeat_single_text = False
    fixed_dim = False
    in_batch_negatives = False

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        """Turn a whole data set's labels into what ``forward`` expects (called once per task)."""
        return labels


class EmbeddingLoss(BaseLoss):
    """Base class of bi-encoder losses.

    Subclasses implement ``forward(embeddings, labels)`` where ``embeddings[k]`` is the ``(batch, dim)``
    embedding of the k-th text column (in :attr:`embforge.data.tables.Dataset.text_columns` order).
    """

    guide: str | None = None
    """A guide model (folder or name) whose embeddings of each batch's texts the training task passes as the
    labels (``(n, columns, D)``, no gradient): :class:`embforge.losses.gist.GISTLoss`; ``None``: none."""

    def start_from(self, model: Embedder, data: Dataset) -> None:
        """Set data-dependent starting values before training (called once per task with the model to train)."""

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """``forward`` with the labels moved to the embeddings' device (labels are often built on the CPU). A
        penalty added to any loss is a wrapper (:class:`embforge.losses.centroid.CentroidLoss`)."""
        if labels is not None and embeddings:
            labels = labels.to(embeddings[0].device)
        loss: Tensor = super().__call__(embeddings, labels)
        return loss


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """All-pairs cosine similarity ``(len(a), len(b))`` computed in float32."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def pairwise_cosine(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine similarity of two ``(n, dim)`` tensors, in float32."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


class LossWrapper(EmbeddingLoss):
    """A loss around another (Matryoshka, the centroid penalty): the columns, labels and data-dependent start it
    takes are the inner loss's."""

    shared: tuple[str, ...] = (
        "min_texts",
        "max_texts",
        "needs_labels",
        "repeat_single_text",
        "in_batch_negatives",
        "guide",
    )

    def __init__(self, loss: EmbeddingLoss) -> None:
        super().__init__()
        self.inner = loss
        for attr in self.shared:
            setattr(self, attr, getattr(loss, attr))

    def prepare_labels(self, labels):  # noqa: ANN001, ANN201
        return self.inner.prepare_labels(labels)

    def start_from(self, model, data):  # noqa: ANN001, ANN201
        self.inner.start_from(model, data)
