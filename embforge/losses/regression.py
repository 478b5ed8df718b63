"""Cosine regression: the Sentence-BERT STS regression objective."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, pairwise_cosine


class CosineMSELoss(EmbeddingLoss):
    r"""Mean squared error between the cosine similarity of a pair and its gold score.

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \big(\cos(u_i, v_i) - y_i\big)^2

    Columns: two texts + ``score``. Scores above 1 (e.g. STS-B's 0-5) are divided by the data set's largest
    score rounded up, so targets lie in [0, 1] (sentence-transformers' CosineSimilarityLoss expects this too).
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
