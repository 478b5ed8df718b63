"""Margin losses on distances: contrastive (pairs) and triplet."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, pairwise_cosine

DISTANCES = ("cosine", "euclidean")


def distance(a: Tensor, b: Tensor, metric: str) -> Tensor:
    """Row-wise distance: ``1 - cos`` or the Euclidean norm, in float32."""
    if metric == "cosine":
        return 1 - pairwise_cosine(a, b)
    if metric == "euclidean":
        return F.pairwise_distance(a.float(), b.float(), p=2)
    raise ValueError(f"unknown distance {metric!r}; choose one of {', '.join(DISTANCES)}")


class ContrastiveLoss(EmbeddingLoss):
    r"""Contrastive loss on labelled pairs: similar pairs pulled together, dissimilar ones pushed past a margin.

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \tfrac12\big(y_i d_i^2 + (1 - y_i)\,\max(0, m - d_i)^2\big)

    with :math:`d_i = d(u_i, v_i)` the cosine distance :math:`1 - \cos` (default) or the Euclidean distance.

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``label``: 1 similar, 0 dissimilar
    ==================================  =========================================================

    Equals sentence-transformers' ``ContrastiveLoss`` (margin 0.5, cosine distance; tested).

    Paper: Hadsell, Chopra & LeCun, 2006, "Dimensionality Reduction by Learning an Invariant Mapping".

    Example:
        >>> import torch
        >>> u, v = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # d = 0, 1
        >>> float(ContrastiveLoss(margin=0.5)([u, v], torch.tensor([0, 1])))  # (0.5 * 0.5² + 0.5 * 1²) / 2
        0.3125
    """

    name = "contrastive"
    max_texts = 2
    needs_labels = True

    def __init__(self, margin: float = 0.5, distance: str = "cosine") -> None:
        super().__init__()
        self.margin = margin
        self.distance = distance

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        d = distance(embeddings[0], embeddings[1], self.distance)
        y = labels.float().reshape(-1)
        return (0.5 * (y * d.pow(2) + (1 - y) * F.relu(self.margin - d).pow(2))).mean()


class TripletLoss(EmbeddingLoss):
    r"""Triplet loss: the anchor must be closer to its positive than to its negative by a margin.

    .. math:: \mathcal{L} = \frac{1}{nk}\sum_{i,j} \max\big(0,\ d(a_i, p_i) - d(a_i, n^{(j)}_i) + m\big)

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive, negative``              none
    ``anchor, positive, negative_1..k``         none (averaged over the k negative columns)
    ==========================================  ==============================================================

    Defaults (Euclidean distance, margin 5) match sentence-transformers' ``TripletLoss`` (tested, both distances).

    Paper: Schroff, Kalenichenko & Philbin, 2015, "FaceNet: A Unified Embedding for Face Recognition and
    Clustering"; for sentences, Reimers & Gurevych, 2019, "Sentence-BERT".

    Example:
        >>> import torch
        >>> a, p, n = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 3.0]])
        >>> round(float(TripletLoss(margin=5.0)([a, p, n])), 4)  # max(0, 1 - 3 + 5)
        3.0
    """

    name = "triplet"
    min_texts = 3

    def __init__(self, margin: float = 5.0, distance: str = "euclidean") -> None:
        super().__init__()
        self.margin = margin
        self.distance = distance

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        anchor, positive = embeddings[0], embeddings[1]
        d_pos = distance(anchor, positive, self.distance)
        losses = [
            F.relu(d_pos - distance(anchor, neg, self.distance) + self.margin) for neg in embeddings[2:]
        ]
        return torch.stack(losses).mean()
