"""Cosine regression: the Sentence-BERT STS regression objective."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, pairwise_cosine


class CosineMSELoss(EmbeddingLoss):
    r"""Mean squared error between the cosine similarity of a pair and its gold score (``mse``).

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \big(\cos(u_i, v_i) - y_i\big)^2

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``score``: in [0, 1], or larger (e.g. STS-B's 0-5), then
                                        divided by the data set's largest score rounded up
    ==================================  =========================================================

    Equals sentence-transformers' ``CosineSimilarityLoss`` on the same targets (tested).

    Paper: Reimers & Gurevych, 2019, "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks"
    (the regression objective).

    Example:
        >>> import torch
        >>> u, v = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # cosines 1, 0
        >>> round(float(CosineMSELoss()([u, v], torch.tensor([0.8, 0.2]))), 4)  # (0.2² + 0.2²) / 2
        0.04
        >>> CosineMSELoss().prepare_labels(np.array([0.0, 2.5, 4.6]))  # 0-5 scores -> [0, 1]
        array([0.  , 0.5 , 0.92])
    """

    name = "mse"
    max_texts = 2
    needs_labels = True

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        top = float(np.max(labels))
        return labels / np.ceil(top) if top > 1 else labels

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        return F.mse_loss(pairwise_cosine(embeddings[0], embeddings[1]), labels.float().reshape(-1))
