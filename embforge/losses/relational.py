r"""Similarity-preserving distillation: the teacher's in-batch similarity matrix as the student's soft targets.

=======================  ==========================================  ==========================================
name                     data (text columns + labels)                formula
=======================  ==========================================  ==========================================
``similarity_distill``   any text columns (one is enough: unlabeled  :math:`\frac1N\sum_i \mathrm{KL}(
                         texts) + teacher embeddings ``(n, D_t)``    \mathrm{softmax}(T_{i,\ne i}/\tau_t)\,\|\,
                         or ``(n, C, D_t)``                          \mathrm{softmax}(S_{i,\ne i}/\tau_s))`
=======================  ==========================================  ==========================================

Every text of the batch (all ``C`` columns of all ``n`` rows, ``N = nC``) is compared with every other one, by
cosine, in the student's space (:math:`S`) and in the teacher's (:math:`T`); each row of the teacher's matrix,
its diagonal removed, is a distribution over the batch's other texts that the student's row must match (listwise
KL, as :func:`~embforge.losses.distill.kl_distill` does for a query's candidates). Only similarities are
compared, so the student keeps its own dimension: no projection (``mse_distill`` needs one when the teacher is
wider), nothing added to the saved model. This is the relational / similarity-preserving family of
distillation (Park et al., 2019, "Relational Knowledge Distillation"; Tung & Mori, 2019,
"Similarity-Preserving Knowledge Distillation"), in the listwise-KL form of in-batch embedding distillation.

The teacher's embeddings arrive as labels, computed once and cached on disk
(:func:`embforge.distill.signals.with_teacher_embeddings`; a pipeline task with ``teacher = "FOLDER"``): a batch's
similarity matrix depends on which rows were drawn together, so it is built per batch from the rows' embeddings
(one matrix product), not stored.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, cosine_matrix
from embforge.losses.distill import KLTemperatures, kl_distill, teacher_embedding_labels


def off_diagonal(matrix: Tensor) -> Tensor:
    """The ``(N, N - 1)`` matrix of ``matrix``'s ``(N, N)`` entries without its diagonal (row order kept)."""
    n = matrix.shape[0]
    keep = ~torch.eye(n, dtype=torch.bool, device=matrix.device)
    return matrix[keep].reshape(n, n - 1)


def teacher_rows(labels: Tensor, columns: int) -> Tensor:
    """The teacher's ``(columns * n, D)`` embeddings in the student's order (column by column) from labels of
    shape ``(n, D)`` (one target for every column) or ``(n, columns, D)``."""
    labels = labels.detach().float()
    if labels.ndim == 2:
        return labels.repeat(columns, 1)
    if labels.ndim == 3 and labels.shape[1] == columns:
        return labels.transpose(0, 1).reshape(-1, labels.shape[-1])
    raise ValueError(
        f"teacher embeddings of shape {tuple(labels.shape)} do not fit {columns} text column(s): "
        f"give (rows, dim) or (rows, {columns}, dim)"
    )


def similarity_matrices(student: Tensor, teacher: Tensor) -> tuple[Tensor, Tensor]:
    """The student's and the teacher's ``(N, N - 1)`` in-batch cosine matrices, diagonals removed.

    Args:
        student: ``(N, d)`` student embeddings.
        teacher: ``(N, D)`` teacher embeddings of the same texts (any ``D``; no gradient flows into them).
    """
    if len(student) != len(teacher):
        raise ValueError(f"{len(student)} student embeddings but {len(teacher)} teacher embeddings")
    if len(student) < 3:
        raise ValueError("similarity_distill needs at least 3 texts in a batch (2 others per text)")
    teacher = teacher.to(student.device)
    return off_diagonal(cosine_matrix(student, student)), off_diagonal(cosine_matrix(teacher, teacher))


def similarity_distill(
    student: Tensor,
    teacher: Tensor,
    *,
    student_temperature: float,
    teacher_temperature: float,
    scale: float = 1.0,
) -> Tensor:
    r"""Listwise KL between the teacher's and the student's in-batch cosine matrices, diagonals removed.

    .. math::
        \mathcal{L} = \frac{c}{N}\sum_{i}\sum_{j\ne i} P^T_{ij}\big(\log P^T_{ij} - \log P^S_{ij}\big),
        \quad P^X_{i\cdot} = \mathrm{softmax}_{j \ne i}\big(\cos(x_i, x_j) / \tau_x\big)

    ``student`` ``(N, d)`` and ``teacher`` ``(N, D)`` embed the same texts (:func:`similarity_matrices`);
    ``c = scale``, 1 by default: the KL at its own size, like the InfoNCE / CoSENT losses it is mixed with
    (:func:`kl_distill`'s ``τ_s²`` would make it 400x smaller at ``τ_s = 0.05``).
    """
    scores, targets = similarity_matrices(student, teacher)
    return kl_distill(
        scores,
        targets,
        student_temperature=student_temperature,
        teacher_temperature=teacher_temperature,
        scale=scale,
    )


class SimilarityDistillLoss(KLTemperatures, EmbeddingLoss):
    r"""The student's in-batch similarity distributions match the teacher's (``similarity_distill``).

    .. math::
        \mathcal{L} = \frac{c}{N}\sum_{i=1}^{N}\mathrm{KL}\big(\mathrm{softmax}_{j\ne i}(\cos(t_i,t_j)
        /\tau_t)\,\big\|\,\mathrm{softmax}_{j\ne i}(\cos(s_i,s_j)/\tau_s)\big)

    over the ``N = nC`` texts of the batch (every column of every row).

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``text`` (unlabeled texts)          teacher embeddings ``(n, D_t)``
    ``col_1 … col_C`` (pairs, triplets) ``(n, C, D_t)`` (one per column) or ``(n, D_t)`` (the same
                                        target for every column, e.g. translations)
    ==================================  =========================================================

    ``D_t`` need not equal the student's dimension. The temperatures default to 0.05 on both sides (cosines
    spread over about [-0.2, 0.8] within a batch); a teacher with a narrower spread wants a smaller ``τ_t``.
    ``c = scale`` defaults to 1, not ``kl_distill``'s ``τ_s²``: beside InfoNCE / CoSENT tasks at ``τ_s = 0.05``
    that factor left the task ~400x smaller than theirs (benchmarks/README.md, "Teacher similarities at full
    size").

    Paper: Park et al., 2019, "Relational Knowledge Distillation"; Tung & Mori, 2019, "Similarity-Preserving
    Knowledge Distillation" (see the module docstring).

    Example:
        >>> import torch
        >>> loss = SimilarityDistillLoss(temperature=0.1)
        >>> teacher = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.6, 0.8, 0.0]])  # 3-d
        >>> round(float(loss([teacher[:, :2]], teacher)), 6)  # a 2-d student with the same cosines
        0.0
        >>> round(float(loss([torch.tensor([[1.0, 0.0], [0.0, 1.0], [-0.6, 0.8]])], teacher)), 3)  # third mirrored
        2.425
    """

    name = "similarity_distill"
    min_texts = 1
    needs_labels = True
    default_temperature = 0.05
    default_scale = 1.0

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        return teacher_embedding_labels(labels, self.name)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        assert labels is not None
        student, teacher = torch.cat(embeddings), teacher_rows(labels, len(embeddings))
        return self.kl(*similarity_matrices(student, teacher))
