"""CoSENT: a ranking loss on any vector of pair scores."""

from __future__ import annotations

import torch
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, pairwise_cosine


def cosent(scores: Tensor, labels: Tensor, *, scale: float = 20.0) -> Tensor:
    r"""CoSENT on a batch of pair scores.

    .. math::
        \mathcal{L} = \log\Big(1 + \sum_{(i,j):\ y_i > y_j} e^{\lambda (f_j - f_i)}\Big)

    Every pair of examples whose labels say "i should score higher than j" is penalised when ``f_j`` comes close
    to or above ``f_i``. Only the order of the labels matters, so the scores can be cosine similarities
    (bi-encoder) or any logit (cross-encoder). Computed with log-sum-exp in float32: finite under fp16/bf16.

    Args:
        scores: ``(n,)`` predicted scores ``f``.
        labels: ``(n,)`` gold scores or class labels ``y`` (only their order is used).
        scale: ``λ``, the inverse temperature (20 in the CoSENT paper).
    """
    scores = scores.float().reshape(-1) * scale
    labels = labels.to(scores.device).reshape(-1)
    # diff[i, j] = λ (f_j - f_i), kept where y_i > y_j
    diff = scores[None, :] - scores[:, None]
    keep = labels[:, None] > labels[None, :]
    diff = diff.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.reshape(-1)]), dim=0)


class CoSENTLoss(EmbeddingLoss):
    """CoSENT on the cosine similarity of ``(sentence1, sentence2)`` pairs against their ``score``/``label``.

    Columns: two texts + ``score`` (or ``label``). See :func:`cosent` for the formula.
    """

    name = "cosent"
    max_texts = 2
    needs_labels = True

    def __init__(self, scale: float = 20.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        return cosent(pairwise_cosine(embeddings[0], embeddings[1]), labels, scale=self.scale)
