"""Sentence-BERT's classification objective on ``(u, v, |u - v|)``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.losses.base import EmbeddingLoss


class SoftmaxLoss(EmbeddingLoss):
    r"""A linear classifier over ``[u; v; |u - v|]`` trained with cross-entropy (Sentence-BERT's NLI objective).

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \mathrm{CE}\big(W [u_i; v_i; |u_i-v_i|] + b,\ y_i\big)

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            integer ``label`` in ``[0, num_labels)`` (e.g. NLI's 3)
    ==================================  =========================================================

    The classifier ``W`` (``3·dim × num_labels``) belongs to the loss and is trained with the model; it is not
    part of the saved encoder, and it cannot be wrapped by Matryoshka (it is sized to the full embedding).
    Equals sentence-transformers' ``SoftmaxLoss`` with the same classifier weights (tested).

    Paper: Reimers & Gurevych, 2019, "Sentence-BERT" (the ``(u, v, |u - v|)`` features from Conneau et al.,
    2017, "Supervised Learning of Universal Sentence Representations from Natural Language Inference Data").

    Example:
        >>> import torch
        >>> loss = SoftmaxLoss(dim=2, num_labels=3)
        >>> _ = loss.classifier.weight.data.zero_(), loss.classifier.bias.data.zero_()  # uniform: log 3
        >>> round(loss([torch.ones(2, 2), torch.zeros(2, 2)], torch.tensor([0, 2])).item(), 4)
        1.0986
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
