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

Token-pooling-aware training: every loss here takes ``pool_factor`` (``--loss-option pool_factor=4``; 1, the
default, is off). Above 1, the document columns (all but the first, the queries) are pooled as an index pooled at
that factor will hold them (:func:`~embforge.multivector.pooling.pool_padded`: Ward clusters of each document's
token vectors, computed without gradient, replaced by their means, which keep it) before MaxSim, so the model
learns for the pooled index it will be searched through.

Example:
    >>> import torch
    >>> q = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])   # two one-token queries
    >>> round(float(MaxSimInfoNCELoss(temperature=0.1)([q, q])), 4)  # each query's positive is itself
    0.0
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, check_temperature
from embforge.losses.distill import KLTemperatures, margin_mse
from embforge.multivector.pooling import check_pool_factor, pool_padded
from embforge.multivector.scoring import maxsim, maxsim_pairwise


class MaxSimLoss(EmbeddingLoss):
    """Base of the losses here: ``pool_factor`` above 1 pools the document columns (every column after the
    first) before :meth:`forward` sees them (see the module docstring); 1 leaves them as they are."""

    def __init__(self, *, pool_factor: float = 1) -> None:
        super().__init__()
        self.pool_factor = check_pool_factor(pool_factor)

    def __call__(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        if self.pool_factor != 1 and len(embeddings) > 1:
            embeddings = [embeddings[0], *(pool_padded(e, self.pool_factor) for e in embeddings[1:])]
        return super().__call__(embeddings, labels)


class MaxSimInfoNCELoss(MaxSimLoss):
    r"""InfoNCE over MaxSim scores with in-batch and mined negatives (``infonce`` for multi-vector models).

    .. math::
        \mathcal{L} = -\frac{1}{n}\sum_i \log \frac{e^{S(q_i, p_i)/\tau}}{\sum_{c \in \text{batch}} e^{S(q_i, c)/\tau}},
        \qquad S(q, d) = \sum_{a} \max_{b} q_a \cdot d_b

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``query, positive``                         none (the other rows' positives are the negatives)
    ``query, positive, negative_1..k``          none (plus every row's mined negatives)
    ==========================================  ==============================================================

    Every query is scored against every document of the batch (all positive and negative columns); its own
    positive is the target. ``temperature`` 1 (the default) is pylate's ``Contrastive`` loss: MaxSim sums are
    already spread over ``[-Lq, Lq]``.

    Paper: Khattab & Zaharia, 2020, "ColBERT: Efficient and Effective Passage Search via Contextualized Late
    Interaction over BERT".

    Example:
        >>> import torch
        >>> q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # one query, two token vectors
        >>> p, n = q.clone(), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # MaxSim 2 and 1
        >>> round(float(MaxSimInfoNCELoss()([q, p, n])), 4)  # -log(e^2 / (e^2 + e^1))
        0.3133
    """

    name = "infonce"
    in_batch_negatives = True

    def __init__(self, temperature: float = 1.0, *, pool_factor: float = 1) -> None:
        super().__init__(pool_factor=pool_factor)
        self.temperature = check_temperature(temperature)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        queries, candidates = embeddings[0], torch.cat(embeddings[1:])
        targets = torch.arange(len(queries), device=queries.device)
        return F.cross_entropy(maxsim(queries, candidates) / self.temperature, targets)


class CandidateScoresLoss(MaxSimLoss):
    """Base of the teacher-score losses here: each row's query is scored (MaxSim) against its own candidate
    columns, ``(n, columns - 1)``, and :meth:`from_scores` compares those scores with the teacher's labels."""

    min_texts = 3
    needs_labels = True

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        scores = torch.stack([maxsim_pairwise(embeddings[0], c) for c in embeddings[1:]], dim=1)
        return self.from_scores(scores, labels)

    def from_scores(self, scores: Tensor, labels: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class MaxSimMarginMSELoss(CandidateScoresLoss):
    r"""MarginMSE distillation of a teacher's scores into MaxSim margins (``margin_mse``).

    .. math:: \mathcal{L} = \frac{1}{nk}\sum_{i,j}\big((S(q_i,p_i) - S(q_i,n_{ij})) - (T_{i,p} - T_{i,n_j})\big)^2

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``query, positive, negative_1..k``          teacher scores ``[T(q,p), T(q,n_1), …]`` ``(n, 1+k)`` or
                                                margins ``(n, k)`` (:func:`~embforge.losses.distill.margin_mse`)
    ==========================================  ==============================================================

    Paper: Hofstätter et al., 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge
    Distillation" (ColBERT among its students).

    Example:
        >>> import torch
        >>> q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> p, n = q.clone(), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # student margin 2 - 1
        >>> float(MaxSimMarginMSELoss()([q, p, n], torch.tensor([[3.0, 0.0]])))  # (1 - 3)²
        4.0
    """

    name = "margin_mse"

    def from_scores(self, scores: Tensor, labels: Tensor) -> Tensor:
        return margin_mse(scores[:, 0], scores[:, 1:], labels)


class MaxSimKLDistillLoss(KLTemperatures, CandidateScoresLoss):
    r"""Listwise KL from a teacher's scores to the MaxSim scores of each query's candidates (``kl_distill``).

    .. math::
        \mathcal{L} = \tau_s^2\,\frac{1}{n}\sum_i \mathrm{KL}\big(\mathrm{softmax}(T_i/\tau_t)\,\big\|\,
        \mathrm{softmax}(S_i/\tau_s)\big),\quad S_{ij} = \mathrm{MaxSim}(q_i, c_{ij})

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``query, candidate_1..m``                   teacher scores ``(n, m)``
    ==========================================  ==============================================================

    Paper: Santhanam et al., 2022, "ColBERTv2: Effective and Efficient Retrieval via Lightweight Late
    Interaction" (KL distillation of a cross-encoder's scores).

    Example:
        >>> import torch
        >>> q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> p, n = q.clone(), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # MaxSim 2 and 1
        >>> float(MaxSimKLDistillLoss()([q, p, n], torch.tensor([[2.0, 1.0]])))  # the teacher agrees
        0.0
    """

    name = "kl_distill"

    def __init__(
        self,
        temperature: float | None = None,
        student_temperature: float | None = None,
        teacher_temperature: float | None = None,
        scale: float | None = None,
        *,
        pool_factor: float = 1,
    ) -> None:
        super().__init__(temperature, student_temperature, teacher_temperature, scale)
        self.pool_factor = check_pool_factor(pool_factor)

    def from_scores(self, scores: Tensor, labels: Tensor) -> Tensor:
        return self.kl(scores, labels.reshape(scores.shape[0], -1))


MULTIVECTOR_LOSSES: dict[str, type[EmbeddingLoss]] = {
    "infonce": MaxSimInfoNCELoss,
    "margin_mse": MaxSimMarginMSELoss,
    "kl_distill": MaxSimKLDistillLoss,
}


def get_multivector_loss(name: str, **options: object) -> EmbeddingLoss:
    """A multi-vector loss by name (``infonce``, ``margin_mse``, ``kl_distill``)."""
    if name not in MULTIVECTOR_LOSSES:
        raise ValueError(
            f"loss {name!r} does not train a multi-vector model; choose one of {', '.join(MULTIVECTOR_LOSSES)}"
        )
    try:
        return MULTIVECTOR_LOSSES[name](**options)
    except TypeError as err:
        raise ValueError(f"bad option for loss {name!r}: {err}") from None
