"""The centroid penalty: any dense embedding loss plus the batch's mean cosine, as a wrapper (``centroid = W``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, LossWrapper


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


class CentroidLoss(LossWrapper):
    r"""An inner loss plus ``centroid`` × :func:`centroid_penalty` of the batch (loss option ``centroid``).

    .. math:: \mathcal{L} = \mathcal{L}_{\text{inner}}(e, y) + w\, \Big\lVert \frac{1}{n} \sum_i
        \frac{e_i}{\lVert e_i \rVert} \Big\rVert^2

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    those of the inner loss                     those of the inner loss
    ==========================================  ==============================================================

    ``centroid_columns`` = k spreads the first k text columns only (``1``: the queries of a query → candidates
    task); ``None``: every column. :func:`embforge.losses.get_loss` wraps a loss in it when the options name a
    ``centroid`` weight, inside a :class:`~embforge.losses.matryoshka.MatryoshkaLoss` (each prefix has its own
    penalty, at that prefix's weight). The wrapper keeps the inner loss's name: the penalty is one of its options.

    Example:
        >>> import torch
        >>> from embforge.losses.regression import CosineMSELoss
        >>> loss = CentroidLoss(CosineMSELoss(), centroid=2.0)
        >>> u, v = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])  # cosine 0; their centroid's norm² 0.5
        >>> float(loss([u, v], torch.tensor([0.0])))  # (0 - 0)² + 2.0 * 0.5
        1.0
    """

    shared = (*LossWrapper.shared, "fixed_dim")  # the penalty leaves the dimension as it is

    def __init__(self, loss: EmbeddingLoss, *, centroid: float, centroid_columns: int | None = None) -> None:
        super().__init__(loss)
        self.centroid, self.centroid_columns = float(centroid), centroid_columns
        self.name = loss.name

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        return self.inner(embeddings, labels) + self.centroid * centroid_penalty(
            embeddings[: self.centroid_columns]
        )
