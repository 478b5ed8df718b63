r"""Losses of multi-vector (ColBERT) models: the same families as the dense ones, on MaxSim scores.

Each text column's embeddings are ``(rows, tokens, dim)`` token matrices (masked tokens zero,
:mod:`embforge.multivector.model`); :func:`~embforge.multivector.scoring.maxsim` turns them into scores and the
score-based losses of :mod:`embforge.losses.distill` (MarginMSE, listwise KL) are reused as they are.

=================  ==========================================  ================================================
name               data (text columns + labels)                formula (``S`` = MaxSim)
=================  ==========================================  ================================================
``infonce``        query, positive[, negative_1..k]            :math:`-\frac1n\sum_i\log\frac{e^{S(q_i,p_i)/\tau}}
                                                               {\sum_{c} e^{S(q_i,c)/\tau}}` over the batch's
                                                               positives and negatives (pylate's Contrastive)
``margin_mse``     query, positive, negative_1..k + teacher    :math:`\mathrm{mean}\big((S(q,p) - S(q,n_j)) -
                   scores ``(n, 1+k)`` or margins ``(n, k)``     (T_p - T_{n_j})\big)^2`
``kl_distill``     query, candidate_1..m + teacher scores       :math:`\tau_s^2\,\mathrm{KL}(\mathrm{softmax}(T/\tau_t)
                   ``(n, m)``                                   \,\|\,\mathrm{softmax}(S/\tau_s))`
=================  ==========================================  ================================================

Example:
    >>> import torch
    >>> q = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])   # two one-token queries
    >>> round(float(MaxSimInfoNCELoss(temperature=0.1)([q, q])), 4)  # each query's positive is itself
    0.0
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, check_temperature
from embforge.losses.distill import kl_distill, kl_temperatures, margin_mse
from embforge.multivector.scoring import maxsim, maxsim_pairwise


class MaxSimInfoNCELoss(EmbeddingLoss):
    """InfoNCE over MaxSim scores with in-batch and mined negatives (``infonce`` for multi-vector models).

    Every query is scored against every document of the batch (all positive and negative columns); its own
    positive is the target. ``temperature`` 1 (the default) is pylate's ``Contrastive`` loss: MaxSim sums are
    already spread over ``[-Lq, Lq]``.
    """

    name = "infonce"
    in_batch_negatives = True

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        queries, candidates = embeddings[0], torch.cat(embeddings[1:])
        targets = torch.arange(len(queries), device=queries.device)
        return F.cross_entropy(maxsim(queries, candidates) / self.temperature, targets)


class MaxSimMarginMSELoss(EmbeddingLoss):
    """MarginMSE distillation of a teacher's scores into MaxSim margins (``margin_mse``)."""

    name = "margin_mse"
    min_texts = 3
    needs_labels = True

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        query = embeddings[0]
        negatives = torch.stack([maxsim_pairwise(query, n) for n in embeddings[2:]], dim=1)
        return margin_mse(maxsim_pairwise(query, embeddings[1]), negatives, labels)


class MaxSimKLDistillLoss(EmbeddingLoss):
    """Listwise KL from a teacher's scores to the MaxSim scores of each query's candidates (``kl_distill``)."""

    name = "kl_distill"
    min_texts = 3
    needs_labels = True

    def __init__(
        self,
        temperature: float = 1.0,
        student_temperature: float | None = None,
        teacher_temperature: float | None = None,
    ) -> None:
        super().__init__()
        self.student_temperature, self.teacher_temperature = kl_temperatures(
            temperature, student_temperature, teacher_temperature
        )

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        query = embeddings[0]
        scores = torch.stack([maxsim_pairwise(query, c) for c in embeddings[1:]], dim=1)
        return kl_distill(
            scores,
            labels.reshape(scores.shape[0], -1),
            student_temperature=self.student_temperature,
            teacher_temperature=self.teacher_temperature,
        )


MULTIVECTOR_LOSSES: dict[str, type[EmbeddingLoss]] = {
    "infonce": MaxSimInfoNCELoss,
    "margin_mse": MaxSimMarginMSELoss,
    "kl_distill": MaxSimKLDistillLoss,
}


def get_multivector_loss(name: str, **options: Any) -> EmbeddingLoss:
    """A multi-vector loss by name (``infonce``, ``margin_mse``, ``kl_distill``)."""
    if name not in MULTIVECTOR_LOSSES:
        raise ValueError(
            f"loss {name!r} does not train a multi-vector model; choose one of {', '.join(MULTIVECTOR_LOSSES)}"
        )
    try:
        return MULTIVECTOR_LOSSES[name](**options)
    except TypeError as err:
        raise ValueError(f"bad option for loss {name!r}: {err}") from None
