r"""Distillation losses for bi-encoders: a teacher's embeddings or scores arrive as labels (computed once).

=================  ==========================================  ================================================
name               data (text columns + labels)                formula
=================  ==========================================  ================================================
``mse_distill``    any text columns + teacher embeddings        :math:`\frac1C\sum_c \mathrm{mean}((s_c - t_c)^2)`
                   ``(n, D)`` (every column) or ``(n, C, D)``
``margin_mse``     query, positive, negative_1..k +            :math:`\mathrm{mean}\big((\mathrm{sim}(q,p) -
                   teacher scores ``(n, 1+k)`` or margins       \mathrm{sim}(q,n_j)) - (T_p - T_{n_j})\big)^2`
                   ``(n, k)`` / ``(n,)``
``kl_distill``     query, candidate_1..m + teacher scores       :math:`\tau_s^2\,\frac1n\sum_i \mathrm{KL}(
                   ``(n, m)``                                   \mathrm{softmax}(T_i/\tau_t)\,\|\,
                                                                \mathrm{softmax}(S_i/\tau_s))`
=================  ==========================================  ================================================

Teacher signals come from ``embforge score`` (scores in a ``score`` column; a list per row for mined rows) or
:func:`embforge.distill.signals.with_teacher_embeddings` (embeddings, cached on disk). When the student's dimension differs
from the teacher's, ``mse_distill`` needs a learned projection; it belongs to the student model (it is part of
what the student outputs), so give the student one with :func:`embforge.distill.projection.add_projection` — it is trained
with the model and saved as sentence-transformers' ``Dense`` module (``2_Dense/``).

Example:
    >>> import torch
    >>> loss = MarginMSEDistillLoss(similarity="dot")
    >>> q, p, n = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    >>> float(loss([q, p, n], torch.tensor([[0.5, 0.0]])))  # student margin 1, teacher margin 0.5
    0.25
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.losses.base import EmbeddingLoss, check_temperature, pairwise_cosine

SIMILARITIES = ("cosine", "dot")


def pair_similarity(a: Tensor, b: Tensor, kind: str) -> Tensor:
    """Row-wise ``cosine`` or ``dot`` similarity of two ``(n, dim)`` tensors, in float32."""
    if kind == "cosine":
        return pairwise_cosine(a, b)
    return (a.float() * b.float()).sum(-1)


def _check_similarity(similarity: str) -> str:
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {', '.join(SIMILARITIES)}, got {similarity!r}")
    return similarity


def margin_targets(labels: Tensor, negatives: int) -> Tensor:
    """Teacher margins ``(n, k)`` from scores ``(n, 1+k)`` (``T_p - T_{n_j}``) or margins ``(n, k)`` / ``(n,)``."""
    labels = labels.float()
    if labels.ndim == 1:
        labels = labels[:, None]
    if labels.shape[1] == negatives + 1:
        return labels[:, :1] - labels[:, 1:]
    if labels.shape[1] != negatives:
        raise ValueError(
            f"teacher labels have {labels.shape[1]} values per row; with {negatives} negative column(s) give "
            f"{negatives + 1} scores [T(q,p), T(q,n_1), ...] or {negatives} margins T(q,p) - T(q,n_j)"
        )
    return labels


def margin_mse(positive: Tensor, negatives: Tensor, labels: Tensor) -> Tensor:
    r"""MarginMSE on scores: ``positive`` ``(n,)``, ``negatives`` ``(n, k)``, teacher ``labels`` (see above).

    .. math:: \mathcal{L} = \frac{1}{nk}\sum_{i,j}\big((S_{i,p} - S_{i,n_j}) - (T_{i,p} - T_{i,n_j})\big)^2
    """
    margins = positive.float()[:, None] - negatives.float()
    return F.mse_loss(margins, margin_targets(labels, negatives.shape[1]).to(margins.device))


def kl_distill(
    student: Tensor,
    teacher: Tensor,
    *,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
    scale: float | None = None,
) -> Tensor:
    r"""Listwise KL from the teacher's to the student's distribution over each row's candidates.

    .. math::
        \mathcal{L} = \tau_s^2\,\frac{1}{n}\sum_i \sum_j P^T_{ij}\big(\log P^T_{ij} - \log P^S_{ij}\big),\quad
        P^T_i = \mathrm{softmax}(T_i/\tau_t),\ P^S_i = \mathrm{softmax}(S_i/\tau_s)

    Args:
        student: ``(n, m)`` student scores (cosines, dots or logits).
        teacher: ``(n, m)`` teacher scores (no gradient flows into them).
        student_temperature: ``τ_s``; the loss is multiplied by ``τ_s²`` (Hinton et al.) so gradients keep
            their size as the temperature changes.
        teacher_temperature: ``τ_t``; match it to the spread of the teacher's scores.
        scale: the loss's factor instead of ``τ_s²``. ``τ_s²`` keeps the gradient's size across temperatures for
            one loss alone; in a mix with InfoNCE / CoSENT tasks a small ``τ_s`` shrinks it against theirs
            (``τ_s = 0.05``: 400x smaller), and ``scale = 1`` keeps the KL at its own size.
    """
    if student.shape != teacher.shape:
        raise ValueError(
            f"teacher scores have shape {tuple(teacher.shape)} but the student scored {tuple(student.shape)}: "
            "give one teacher score per candidate column"
        )
    if student.shape[-1] < 2:
        raise ValueError("kl_distill needs at least two candidates per row (a softmax over one is constant)")
    log_p_student = F.log_softmax(student.float() / student_temperature, dim=-1)
    p_teacher = F.softmax(teacher.detach().float().to(student.device) / teacher_temperature, dim=-1)
    factor = student_temperature**2 if scale is None else scale
    return F.kl_div(log_p_student, p_teacher, reduction="batchmean") * factor


def teacher_embedding_labels(labels: np.ndarray, loss: str) -> np.ndarray:
    """Labels that are teacher embeddings (``(rows, dim)`` or ``(rows, columns, dim)``) as float32; other labels
    are an error of ``loss`` saying how to add them."""
    if labels.ndim not in (2, 3):
        raise ValueError(
            f"{loss} needs teacher embeddings as labels ((rows, dim) or (rows, columns, dim)); "
            'add them with embforge.distill.signals.with_teacher_embeddings or a task\'s teacher = "FOLDER"'
        )
    return labels.astype(np.float32)


class MSEDistillLoss(EmbeddingLoss):
    r"""The student's embeddings regress the teacher's (``mse_distill``).

    .. math:: \mathcal{L} = \frac{1}{C}\sum_{c=1}^{C} \frac{1}{nD}\sum_{i,d} (s_{c,i,d} - t_{c,i,d})^2

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``text``                            teacher embeddings ``(n, D)``
    ``col_1 … col_C``                   ``(n, D)`` (the same target for every column, e.g.
                                        translations) or ``(n, C, D)`` (one per column)
    ==================================  =========================================================

    Equals sentence-transformers' ``MSELoss`` (``EmbedDistillLoss(distance_metric="mse")``). There the projection
    for a smaller student lives on the loss and is lost when the model is saved; here it is the student's
    ``Dense`` module (:func:`embforge.distill.projection.add_projection`), so the dimensions must agree when the loss runs.

    Paper: Reimers & Gurevych, 2020, "Making Monolingual Sentence Embeddings Multilingual using Knowledge
    Distillation".

    Example:
        >>> import torch
        >>> student, teacher = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]])
        >>> float(MSEDistillLoss()([student], teacher))  # (1² + 0²) / 2
        0.5
    """

    name = "mse_distill"
    min_texts = 1
    needs_labels = True

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        return teacher_embedding_labels(labels, self.name)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        labels = labels.detach().float()
        if labels.ndim == 2:
            targets = [labels] * len(embeddings)
        elif labels.ndim == 3 and labels.shape[1] == len(embeddings):
            targets = list(labels.unbind(1))
        else:
            raise ValueError(
                f"teacher embeddings of shape {tuple(labels.shape)} do not fit {len(embeddings)} text column(s): "
                f"give (rows, dim) or (rows, {len(embeddings)}, dim)"
            )
        if embeddings[0].shape[-1] != targets[0].shape[-1]:
            raise ValueError(
                f"the student's embeddings are {embeddings[0].shape[-1]}-d, the teacher's {targets[0].shape[-1]}-d: "
                "give the student a projection first (embforge.distill.projection.add_projection(model, "
                f"{targets[0].shape[-1]})), which is trained with it and saved as its 2_Dense module"
            )
        parts = [F.mse_loss(e.float(), t.to(e.device)) for e, t in zip(embeddings, targets)]
        return torch.stack(parts).mean()


class MarginMSEDistillLoss(EmbeddingLoss):
    r"""The student's margin ``sim(q, p) - sim(q, n_j)`` regresses the teacher's margin (``margin_mse``).

    .. math:: \mathcal{L} = \frac{1}{nk}\sum_{i,j}\big((S(q_i,p_i) - S(q_i,n_{ij})) - (T_{i,p} - T_{i,n_j})\big)^2

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive, negative``              teacher margin ``T(q,p) - T(q,n)`` ``(n,)`` or scores ``(n, 2)``
    ``anchor, positive, negative_1..k``         scores ``[T(q,p), T(q,n_1), …]`` ``(n, 1+k)`` or margins ``(n, k)``
    ==========================================  ==============================================================

    ``similarity="dot"`` (default) equals sentence-transformers' ``MarginMSELoss`` (``pairwise_dot_score``);
    ``"cosine"`` keeps the student's scores in [-1, 1] for teachers that score with cosines.

    Paper: Hofstätter et al., 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge
    Distillation".

    Example:
        >>> import torch
        >>> q, p, n = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
        >>> float(MarginMSEDistillLoss()([q, p, n], torch.tensor([[0.5, 0.0]])))  # (1 - 0.5)²
        0.25
    """

    name = "margin_mse"
    min_texts = 3
    needs_labels = True

    def __init__(self, similarity: str = "dot") -> None:
        super().__init__()
        self.similarity = _check_similarity(similarity)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        query, positive, negatives = embeddings[0], embeddings[1], embeddings[2:]
        pos = pair_similarity(query, positive, self.similarity)
        neg = torch.stack([pair_similarity(query, n, self.similarity) for n in negatives], dim=1)
        return margin_mse(pos, neg, labels)


def kl_temperatures(
    temperature: float, student_temperature: float | None, teacher_temperature: float | None
) -> tuple[float, float]:
    """``(τ_s, τ_t)`` of a KL distillation loss: each side's own temperature, else the shared ``temperature``;
    both must be positive and finite."""
    student = check_temperature(temperature if student_temperature is None else student_temperature)
    teacher = check_temperature(temperature if teacher_temperature is None else teacher_temperature)
    if not (math.isfinite(student) and math.isfinite(teacher)):
        raise ValueError("temperatures must be finite")
    return student, teacher


class KLTemperatures(nn.Module):
    """The two temperatures of a listwise KL distillation loss, and that KL (:func:`kl_distill`).

    Shared by the KL losses of every model kind (bi-encoders, cross-encoders, multi-vector, in-batch similarity):
    ``temperature`` sets both sides, ``student_temperature`` / ``teacher_temperature`` each one;
    ``default_temperature`` is the class's value of ``temperature`` when it is not given. ``scale`` replaces the
    loss's ``τ_s²`` factor (:func:`kl_distill`; e.g. ``options = { scale = 1.0 }`` for a KL task in a mix);
    ``default_scale`` is the class's value when it is not given (``None``: ``τ_s²``).
    """

    default_temperature = 1.0
    default_scale: float | None = None

    def __init__(
        self,
        temperature: float | None = None,
        student_temperature: float | None = None,
        teacher_temperature: float | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        shared = self.default_temperature if temperature is None else temperature
        self.student_temperature, self.teacher_temperature = kl_temperatures(
            shared, student_temperature, teacher_temperature
        )
        if scale is not None and not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be positive and finite, got {scale}")
        self.scale = self.default_scale if scale is None else scale

    def kl(self, student: Tensor, teacher: Tensor) -> Tensor:
        """:func:`kl_distill` of ``(n, m)`` student and teacher scores at this loss's temperatures."""
        return kl_distill(
            student,
            teacher,
            student_temperature=self.student_temperature,
            teacher_temperature=self.teacher_temperature,
            scale=self.scale,
        )


class KLDistillLoss(KLTemperatures, EmbeddingLoss):
    r"""Listwise KL between the teacher's and the student's score distributions over a query's candidates.

    .. math::
        \mathcal{L} = \tau_s^2\,\frac{1}{n}\sum_i \mathrm{KL}\big(\mathrm{softmax}(T_i/\tau_t)\,\big\|\,
        \mathrm{softmax}(S_i/\tau_s)\big),\quad S_{ij} = \mathrm{sim}(q_i, c_{ij})

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive, negative_1..k``         teacher scores ``[T(q,p), T(q,n_1), …]`` ``(n, 1+k)``
    ==========================================  ==============================================================

    With ``similarity="dot"`` and ``temperature`` τ for both sides (default 1) this equals sentence-transformers'
    ``DistillKLDivLoss(temperature=τ)`` (``KLDivLoss(reduction="batchmean")`` scaled by ``τ_s²``). Cosine student
    scores live in [-1, 1], so pair ``similarity="cosine"`` with a small ``student_temperature`` (e.g. 0.05).

    Paper: Hinton, Vinyals & Dean, 2015, "Distilling the Knowledge in a Neural Network"; listwise over a
    query's candidates as in Ren et al., 2021, "RocketQAv2: A Joint Training Method for Dense Passage Retrieval
    and Passage Re-ranking".

    Example:
        >>> import torch
        >>> q, c1, c2 = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
        >>> loss = KLDistillLoss()  # student scores (dot) [1, 0]
        >>> float(loss([q, c1, c2], torch.tensor([[1.0, 0.0]])))  # the teacher agrees
        0.0
        >>> round(float(loss([q, c1, c2], torch.tensor([[0.0, 0.0]]))), 4)  # the teacher cannot tell them apart
        0.1201
    """

    name = "kl_distill"
    min_texts = 3
    needs_labels = True

    def __init__(
        self,
        temperature: float | None = None,
        student_temperature: float | None = None,
        teacher_temperature: float | None = None,
        similarity: str = "dot",
        scale: float | None = None,
    ) -> None:
        super().__init__(temperature, student_temperature, teacher_temperature, scale)
        self.similarity = _check_similarity(similarity)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        query = embeddings[0]
        scores = torch.stack([pair_similarity(query, c, self.similarity) for c in embeddings[1:]], dim=1)
        return self.kl(scores, labels.reshape(scores.shape[0], -1))
