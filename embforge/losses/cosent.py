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
    r"""CoSENT on the cosine similarities of ``(sentence1, sentence2)`` pairs, ranked by their gold scores.

    .. math::
        \mathcal{L} = \log\Big(1 + \sum_{(i,j):\ y_i > y_j} e^{\lambda (\cos(u_j, v_j) - \cos(u_i, v_i))}\Big)

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``score`` (any scale, e.g. STS-B's 0-5) or 0/1 ``label``
    ==================================  =========================================================

    Only the order of the labels inside the batch is used, so no rescaling of the scores is needed; ``scale``
    (``λ``) is 20 as in the paper and sentence-transformers' ``CoSENTLoss`` (equal on the same batch, tested).
    embforge's default loss for scored pairs. See :func:`cosent` for the function on any score vector.

    Paper: Su Jianlin, 2022, "CoSENT: a more efficient sentence vector scheme than Sentence-BERT"
    (kexue.fm/archives/8847).

    Example:
        >>> import torch
        >>> loss = CoSENTLoss(scale=1.0)
        >>> u, v = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # cosines 1, 0
        >>> round(float(loss([u, v], torch.tensor([4.0, 1.0]))), 4)  # in the labels' order: log(1 + e^(0 - 1))
        0.3133
        >>> round(float(loss([u, v], torch.tensor([1.0, 4.0]))), 4)  # against it: log(1 + e^(1 - 0))
        1.3133
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
