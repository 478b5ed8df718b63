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
    r"""Contrastive loss (Hadsell et al. 2006) on labelled pairs.

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \tfrac12\big(y_i d_i^2 + (1 - y_i)\,\max(0, m - d_i)^2\big)

    with ``d`` the cosine distance (default) or Euclidean distance. Columns: two texts + ``label`` (1 similar,
    0 dissimilar). Matches sentence-transformers' ContrastiveLoss (margin 0.5, cosine distance).
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

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \max\big(0,\ d(a_i, p_i) - d(a_i, n_i) + m\big)

    Columns: ``anchor, positive, negative[_1, ...]``; with several negative columns the loss is averaged over
    them. Defaults (Euclidean distance, margin 5) match sentence-transformers' TripletLoss.
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
