"""Sentence-BERT's classification objective on ``(u, v, |u - v|)``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.losses.base import EmbeddingLoss


class SoftmaxLoss(EmbeddingLoss):
    r"""A linear classifier over ``[u; v; |u - v|]`` trained with cross-entropy (Sentence-BERT, NLI training).

    .. math:: \mathcal{L} = \mathrm{CE}\big(W [u; v; |u-v|] + b,\ y\big)

    Columns: two texts + integer ``label`` in ``[0, num_labels)``. The classifier belongs to the loss and is
    trained with the model; it is not part of the saved encoder.
    """

    name = "softmax"
    max_texts = 2
    needs_labels = True
    fixed_dim = True

    def __init__(self, dim: int, num_labels: int) -> None:
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"softmax loss needs at least 2 labels, got {num_labels}")
        self.classifier = nn.Linear(3 * dim, num_labels)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        u, v = embeddings[0], embeddings[1]
        features = torch.cat([u, v, (u - v).abs()], dim=-1)
        logits = self.classifier(features.to(self.classifier.weight.dtype))
        return F.cross_entropy(logits.float(), labels.long().reshape(-1))
