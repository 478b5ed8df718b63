"""What every embedding loss looks like: embeddings of each text column (+ labels) in, a scalar out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
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

    centroid = 0.0
    """Weight of :func:`centroid_penalty` added to the loss (``options = { centroid = 20.0 }``; 0: none)."""
    centroid_columns: int | None = None
    """How many leading text columns the penalty spreads (``centroid_columns = 1``: the queries of a query →
    candidates task only); ``None``: every column."""
    guide: str | None = None
    """A guide model (folder or name) whose embeddings of each batch's texts the training task passes as the
    labels (``(n, columns, D)``, no gradient): :class:`embforge.losses.gist.GISTLoss`; ``None``: none."""

    def start_from(self, model: Embedder, data: Dataset) -> None:
        """Set data-dependent starting values before training (called once per task with the model to train)."""

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """``forward`` with the labels moved to the embeddings' device (labels are often built on the CPU), plus
        ``centroid`` × :func:`centroid_penalty` when ``centroid`` is set."""
        if labels is not None and embeddings:
            labels = labels.to(embeddings[0].device)
        loss = super().__call__(embeddings, labels)
        if self.centroid:
            loss = loss + self.centroid * centroid_penalty(embeddings[: self.centroid_columns])
        return loss


def centroid_penalty(embeddings: list[Tensor]) -> Tensor:
    r"""Squared norm of the mean unit embedding of every text in the batch (all columns), in float32.

    .. math:: \Big\lVert \frac{1}{n} \sum_i \frac{e_i}{\lVert e_i \rVert} \Big\rVert^2
        = \frac{1}{n^2} \sum_{i, j} \cos(e_i, e_j)

    the mean cosine of all pairs of the batch's texts (self-pairs included, so ``1/n`` at its lowest for a
    perfectly spread batch). A loss with in-batch negatives (InfoNCE) keeps texts apart by itself; one that only
    orders or regresses pair scores (CoSENT, MSE, listwise distillation) does not, and fine-tuning with it lets
    the space contract (every text nearer every other: anisotropy), which costs what the loss never sees —
    classes that a linear probe separates by fine directions. As an added term it pulls the batch's centroid
    back to the origin and nothing else.

    Example:
        >>> import torch
        >>> round(float(centroid_penalty([torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])])), 4)
        0.5
    """
    unit = F.normalize(torch.cat([e.float() for e in embeddings]), dim=-1)
    return unit.mean(0).square().sum()


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """All-pairs cosine similarity ``(len(a), len(b))`` computed in float32."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def pairwise_cosine(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine similarity of two ``(n, dim)`` tensors, in float32."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1)
