r"""GISTEmbed: InfoNCE whose in-batch negatives a guide model vets (guided false-negative masking).

=========  ==========================================  ==================================================
name       data (text columns + labels)                formula
=========  ==========================================  ==================================================
``gist``   anchor, positive[, negative_1..k] + the     InfoNCE over anchor→positive, anchor→anchor,
           guide's embeddings ``(n, C, D_g)``: the      positive→positive and anchor→negative blocks, a
           training task computes them per batch        candidate left out where the guide scores it above
           with ``guide = MODEL``                       the guide's own positive score (less a margin)
=========  ==========================================  ==================================================

The loss sees tensors only: the guide model is loaded, frozen and run by the training task
(:class:`embforge.training.tasks.PreparedEmbeddingTask`: in eval mode, without autograd, on the batch's texts with
the task's prompts) when the loss names one, and its embeddings arrive as the labels. A data set can also carry
them as labels itself (a pipeline task's ``teacher = "FOLDER"`` computes and caches them once), with no ``guide``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, check_temperature, cosine_matrix
from embforge.losses.distill import teacher_embedding_labels
from embforge.losses.relational import teacher_rows

MARGIN_STRATEGIES = ("absolute", "relative")


def guided_mask(guided: Tensor, threshold: Tensor) -> Tensor:
    """Where the guide's similarities ``guided`` ``(n, m)`` exceed each row's ``threshold`` ``(n, 1)``: the
    candidates the guide takes for false negatives."""
    return guided > threshold


def gist_logits(
    student: list[Tensor],
    guide: list[Tensor],
    *,
    temperature: float,
    margin_strategy: str = "absolute",
    margin: float = 0.0,
    contrast_anchors: bool = True,
    contrast_positives: bool = True,
) -> Tensor:
    r"""The ``(n, ·)`` logits of GIST's softmax (column *i* is row *i*'s positive), masked candidates at ``-inf``.

    With the guide's cosine :math:`g(\cdot,\cdot)` and the threshold :math:`t_i = g(a_i, p_i) - m` (``absolute``)
    or :math:`g(a_i, p_i) - |g(a_i, p_i)|\,m` (``relative``), a candidate :math:`c` of row *i* is left out when
    :math:`g(x_i, c) > t_i` (:math:`x_i` the row's anchor, or its positive in the positive→positive block) —
    never row *i*'s own positive; the anchor→anchor and positive→positive blocks always leave out the text
    itself (sentence-transformers leaves it to the guide, which masks it whenever :math:`t_i < 1`).

    Args:
        student: The student's embeddings per column: anchors, positives, then negative columns.
        guide: The guide's embeddings of the same texts, one ``(n, D_g)`` tensor per column (no gradient).
        temperature: τ; the logits are cosines / τ.
        margin_strategy: ``absolute`` or ``relative`` (see above).
        margin: ``m``.
        contrast_anchors: Add the anchor→anchor block (the anchors pushed apart).
        contrast_positives: Add the positive→positive block.
    """
    anchors, positives, negatives = student[0], student[1], student[2:]
    g_anchors, g_positives, *g_negatives = (g.to(anchors.device) for g in guide)
    n = len(anchors)
    self_pair = torch.eye(n, dtype=torch.bool, device=anchors.device)
    guided_positive = cosine_matrix(g_anchors, g_positives)
    score = guided_positive.diagonal()[:, None]
    threshold = score - margin if margin_strategy == "absolute" else score - score.abs() * margin
    blocks = [
        cosine_matrix(anchors, positives).masked_fill(
            guided_mask(guided_positive, threshold) & ~self_pair, -torch.inf
        )
    ]
    if contrast_anchors:
        masked = guided_mask(cosine_matrix(g_anchors, g_anchors), threshold) | self_pair
        blocks.append(cosine_matrix(anchors, anchors).masked_fill(masked, -torch.inf))
    if contrast_positives:
        masked = guided_mask(cosine_matrix(g_positives, g_positives), threshold) | self_pair
        blocks.append(cosine_matrix(positives, positives).masked_fill(masked, -torch.inf))
    if negatives:
        guided = cosine_matrix(g_anchors, torch.cat(g_negatives))
        blocks.append(
            cosine_matrix(anchors, torch.cat(negatives)).masked_fill(
                guided_mask(guided, threshold), -torch.inf
            )
        )
    return torch.cat(blocks, dim=1) / temperature


class GISTLoss(EmbeddingLoss):
    r"""InfoNCE with guided in-batch negatives: candidates a guide model scores above the positive are left out.

    .. math::
        \mathcal{L} = -\frac1n\sum_i \log \frac{e^{\cos(a_i,p_i)/\tau}}{\sum_{c \in C_i,\ g(x_i, c) \le t_i}
        e^{\cos(x_i, c)/\tau}},\qquad t_i = g(a_i, p_i) - m

    over the candidates :math:`C_i`: the batch's positives, anchors (``contrast_anchors``) and negatives for
    :math:`x_i = a_i`, the positives for :math:`x_i = p_i` (``contrast_positives``); :math:`g` is the guide's
    cosine (:func:`gist_logits`; ``margin_strategy = "relative"``: :math:`t_i = g_{ii} - |g_{ii}|\,m`).

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive``                        the guide's embeddings ``(n, C, D_g)``, computed by the
    ``anchor, positive, negative_1..k``         training task with ``guide = MODEL`` (or carried by the data)
    ==========================================  ==============================================================

    A pair whose texts resemble another pair's (two questions with the same answer, duplicates in a mined set)
    is a false negative to plain InfoNCE, which pushes them apart; the guide — the base model, or a stronger
    one — spots them. Equals sentence-transformers' ``GISTEmbedLoss`` on the same batch and guide embeddings
    (loss and gradients, both margin strategies, tested); more than one negative column is allowed here (their
    candidates are concatenated, as InfoNCE's are).

    In a run: ``loss = "gist"``, ``options = { guide = "all-MiniLM-L6-v2", margin_strategy = "absolute",
    margin = 0.0 }``; the guide is loaded once, frozen, in eval mode, and embeds each batch's texts without a graph.

    Paper: Solatorio, 2024, "GISTEmbed: Guided In-sample Selection of Training Negatives for Text Embedding
    Fine-tuning".

    Example:
        >>> import torch
        >>> texts = torch.eye(2)  # two pairs, each anchor equal to its positive, orthogonal to the other pair
        >>> blind = torch.ones(2, 2, 3)  # a guide that sees every text as the same
        >>> loss = GISTLoss(temperature=1.0, contrast_anchors=False, contrast_positives=False)
        >>> round(float(loss([texts, texts], blind)), 4)  # -log(e / (e + 1)): no guided score above 1
        0.3133
        >>> round(float(GISTLoss(temperature=1.0, margin=0.1)([texts, texts], blind)), 4)  # above 1 - 0.1: all out
        0.0
    """

    name = "gist"
    in_batch_negatives = True

    def __init__(
        self,
        guide: str | None = None,
        temperature: float = 0.01,
        margin_strategy: str = "absolute",
        margin: float = 0.0,
        contrast_anchors: bool = True,
        contrast_positives: bool = True,
    ) -> None:
        super().__init__()
        if guide is not None and (not isinstance(guide, str) or not guide.strip()):
            raise ValueError(f"guide must be a model folder or name, got {guide!r}")
        if margin_strategy not in MARGIN_STRATEGIES:
            raise ValueError(
                f"margin_strategy must be one of {', '.join(MARGIN_STRATEGIES)}, got {margin_strategy!r}"
            )
        self.guide = guide
        self.temperature = check_temperature(temperature)
        self.margin_strategy, self.margin = margin_strategy, float(margin)
        self.contrast_anchors, self.contrast_positives = contrast_anchors, contrast_positives

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        return teacher_embedding_labels(labels, self.name)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        if labels is None:
            raise ValueError(
                "the gist loss needs the guide's embeddings of the batch: give it the option guide = MODEL "
                "(the training task embeds each batch with it), or data whose labels are those embeddings"
            )
        guide = list(teacher_rows(labels, len(embeddings)).split(len(embeddings[0])))
        logits = gist_logits(
            embeddings,
            guide,
            temperature=self.temperature,
            margin_strategy=self.margin_strategy,
            margin=self.margin,
            contrast_anchors=self.contrast_anchors,
            contrast_positives=self.contrast_positives,
        )
        return F.cross_entropy(logits, torch.arange(len(logits), device=logits.device))
