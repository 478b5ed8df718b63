"""InfoNCE with in-batch negatives (also known as MultipleNegativesRankingLoss), and unsupervised SimCSE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.data.augment import AUGMENTATIONS, augment_texts
from embforge.losses.base import EmbeddingLoss, check_temperature, cosine_matrix


class InfoNCELoss(EmbeddingLoss):
    r"""InfoNCE: each anchor must pick its own positive among all candidates of the batch.

    .. math::
        \mathcal{L} = -\frac{1}{n}\sum_i \log
        \frac{e^{\cos(a_i, p_i)/\tau}}{\sum_j e^{\cos(a_i, p_j)/\tau} + \sum_{k,j} e^{\cos(a_i, n^{(k)}_j)/\tau}}

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive``                        none (the other rows' positives are the negatives)
    ``anchor, positive, negative_1..k``         none (plus every row's hard negatives as candidates)
    ==========================================  ==============================================================

    Candidates are the batch's positives plus every extra negative column (hard negatives). With
    ``symmetric=True`` the positives also pick their anchor among the batch's anchors and the two directions
    are averaged. Equals sentence-transformers' ``MultipleNegativesRankingLoss`` (and its symmetric variant)
    with ``scale = 1/τ`` (tested). Under torchrun the candidates are the global batch's (all-gathered).

    Paper: van den Oord et al., 2018, "Representation Learning with Contrastive Predictive Coding"; with
    in-batch negatives for text, Henderson et al., 2017, "Efficient Natural Language Response Suggestion for
    Smart Reply".

    Example:
        >>> import torch
        >>> loss = InfoNCELoss(temperature=1.0)
        >>> anchors = positives = torch.eye(2)  # each anchor's positive is itself, orthogonal to the other
        >>> round(float(loss([anchors, positives])), 4)  # -log(e^1 / (e^1 + e^0))
        0.3133
        >>> hard = positives.clone()  # a hard-negative column as close as the positive: -log(e / (2e + 2))
        >>> round(float(loss([anchors, positives, hard])), 4)
        1.0064
    """

    name = "infonce"
    in_batch_negatives = True

    def __init__(self, temperature: float = 0.05, symmetric: bool = False) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.symmetric = symmetric

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        anchors, positives = embeddings[0], embeddings[1]
        candidates = torch.cat(embeddings[1:]) if len(embeddings) > 2 else positives
        targets = torch.arange(len(anchors), device=anchors.device)
        logits = cosine_matrix(anchors, candidates) / self.temperature
        loss = F.cross_entropy(logits, targets)
        if self.symmetric:
            backward = cosine_matrix(positives, anchors) / self.temperature
            loss = (loss + F.cross_entropy(backward, targets)) / 2
        return loss


class SimCSELoss(InfoNCELoss):
    r"""Unsupervised SimCSE: InfoNCE where each text's positive is the same text under other dropout noise.

    .. math::
        \mathcal{L} = -\frac{1}{n}\sum_i \log \frac{e^{\cos(h_i, h'_i)/\tau}}{\sum_j e^{\cos(h_i, h'_j)/\tau}}

    with :math:`h_i, h'_i` two embeddings of text *i* under independent dropout masks.

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    one column (``text``, ``sentence1`` or      none
    ``anchor``)
    ==========================================  ==============================================================

    The trainer feeds the column twice in one forward pass, so the two copies get independent dropout masks.
    ``augment`` (``delete``, ``swap`` or ``cutoff``; :mod:`embforge.data.augment`) makes the second copy an edited
    view of the text as well (``augment_rate`` of its words), applied once when the task is tokenised. The loss
    itself only sees the two embedding tensors either way.

    Paper: Gao, Yao & Chen, 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings".

    Example:
        >>> import torch
        >>> loss = SimCSELoss(temperature=1.0)
        >>> views = torch.eye(2)  # the two dropout views of two texts (here equal)
        >>> round(float(loss([views, views])), 4)
        0.3133
        >>> loss.second_view(["a cat sat"])  # no augment: the second copy is the text itself
        ['a cat sat']
    """

    name = "simcse"
    min_texts = 1
    max_texts = 1
    repeat_single_text = True

    def __init__(
        self,
        temperature: float = 0.05,
        symmetric: bool = False,
        augment: str | None = None,
        augment_rate: float = 0.1,
        augment_seed: int = 0,
    ) -> None:
        super().__init__(temperature=temperature, symmetric=symmetric)
        if augment is not None and augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {', '.join(AUGMENTATIONS)} or none, got {augment!r}")
        if not 0 <= augment_rate <= 1:
            raise ValueError(f"augment_rate must be in [0, 1], got {augment_rate}")
        self.augment = augment
        self.augment_rate = augment_rate
        self.augment_seed = augment_seed

    def second_view(self, texts: list[str]) -> list[str]:
        """The texts of the second copy: an augmented view (``augment``), or the texts themselves."""
        if self.augment is None:
            return list(texts)
        return augment_texts(texts, self.augment, rate=self.augment_rate, seed=self.augment_seed)
