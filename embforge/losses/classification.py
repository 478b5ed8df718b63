"""Classification and clustering as embedding-training tasks (single text column + integer ``label``).

Three losses, all on L2-normalised embeddings so they train the geometry that cosine search uses:

- :class:`PrototypeLoss` (``prototype``): cross-entropy over cosine similarities to learnable class prototypes;
- :class:`ClusterLoss` (``cluster``): each text must be closer to its class's centre *in the batch* than to the
  other classes' centres (the centres are batch means, nothing is learnt besides the encoder);
- :class:`SupConLoss` (``supcon``): supervised contrastive, every same-label text of the batch is a positive.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge.losses.base import EmbeddingLoss, check_temperature, cosine_matrix
from embforge.progress import phase

if TYPE_CHECKING:
    from embforge.data.tables import Dataset
    from embforge.protocols import Embedder


def _check(embeddings: list[Tensor], labels: Tensor | None, name: str) -> tuple[Tensor, Tensor]:
    if labels is None:
        raise ValueError(f"the {name!r} loss needs an integer 'label' column")
    return F.normalize(embeddings[0].float(), dim=-1), labels.long().reshape(-1)


class LabelledTextLoss(EmbeddingLoss):
    """Base of the losses here: one text column and its labels, cosine logits over a ``temperature``."""

    min_texts = 1
    max_texts = 1
    needs_labels = True

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)


class PrototypeLoss(LabelledTextLoss):
    r"""Classification against learnable class prototypes: cosine logits over a temperature, cross-entropy.

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \mathrm{CE}\big(\cos(e_i, p_k) / \tau,\ y_i\big)

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``text``                            integer ``label`` in ``[0, num_labels)``
    ==================================  =========================================================

    The ``num_labels × dim`` prototypes are trained with the encoder and not saved with it. A task's prototypes
    start at each class's normalised mean embedding under the model being trained (:meth:`start_from`): random
    ones, trained at the encoder's learning rate, barely move in a fine-tuning run and drag every text towards a
    random direction. Prototypes are sliced to the embedding's size, so the loss can be wrapped by Matryoshka
    (each prefix is classified against the prototypes' prefix).

    Paper: Snell, Swersky & Zemel, 2017, "Prototypical Networks for Few-shot Learning"; the cosine logits over a
    temperature as in Wang et al., 2018, "NormFace: L2 Hypersphere Embedding for Face Verification".

    Example:
        >>> import torch
        >>> loss = PrototypeLoss(dim=2, num_labels=2, temperature=1.0)
        >>> loss.prototypes.data = torch.eye(2)  # class 0 along x, class 1 along y
        >>> round(loss([torch.tensor([[3.0, 0.0], [0.0, 0.5]])], torch.tensor([0, 1])).item(), 4)
        0.3133
    """

    name = "prototype"

    def __init__(self, dim: int, num_labels: int, temperature: float = 0.05) -> None:
        if num_labels < 2:
            raise ValueError(f"the prototype loss needs at least 2 labels, got {num_labels}")
        super().__init__(temperature)
        self.num_labels = num_labels
        self.prototypes = nn.Parameter(torch.randn(num_labels, dim) / math.sqrt(dim))

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        if labels.size and (labels.min() < 0 or labels.max() >= self.num_labels):
            raise ValueError(
                f"labels must be in [0, {self.num_labels}), found {labels.min()}..{labels.max()}"
            )
        return labels

    def start_from(self, model: Embedder, data: Dataset) -> None:
        """Each class's prototype := the normalised mean of its texts' normalised embeddings (absent classes keep
        their random start)."""
        found = data.labels()
        if found is None:  # Task.validate requires the label column of this loss
            raise ValueError(f"{data.path}: the {self.name!r} loss needs a 'label' column")
        labels = torch.as_tensor(self.prepare_labels(found)).long()
        texts = data.texts()[0]
        # tens of thousands of texts take minutes: a line even in a quiet run, and the command's bar
        doing = f"embedding the {len(texts)} texts of {data.path} for its {self.num_labels} class prototypes"
        with phase(f"prototype loss: {doing} ..."):
            embeddings = torch.as_tensor(model.encode(texts, normalize=True, show_progress=None))
        sums = torch.zeros(self.num_labels, embeddings.shape[1]).index_add_(0, labels, embeddings)
        present = torch.bincount(labels, minlength=self.num_labels) > 0
        with torch.no_grad():
            self.prototypes[present] = F.normalize(sums[present], dim=-1).to(self.prototypes)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        e, y = _check(embeddings, labels, self.name)
        logits = cosine_matrix(e, self.prototypes[:, : e.shape[-1]]) / self.temperature
        return F.cross_entropy(logits, y)


class ClusterLoss(LabelledTextLoss):
    r"""Clustering by distance to the batch's cluster centres (nothing is learnt besides the encoder).

    The centre of class *k* is the mean of the batch's normalised embeddings of that class; for a text's own
    class the text itself is left out of the mean (else a singleton would be its own centre):

    .. math::
        c_k^{(-i)} = \mathrm{norm}\Big(\sum_{j \ne i,\ y_j = k} e_j\Big), \qquad
        \mathcal{L} = -\frac{1}{|A|}\sum_{i \in A} \log
        \frac{e^{\cos(e_i, c_{y_i}^{(-i)})/\tau}}{\sum_k e^{\cos(e_i, c_k^{(-i)})/\tau}}

    where *A* holds the texts whose class has another member in the batch (0 if none does).

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``text``                            integer ``label`` (any values; classes are the batch's)
    ==================================  =========================================================

    Paper: the leave-one-out centroids of Wan et al., 2018, "Generalized End-to-End Loss for Speaker
    Verification" (GE2E, softmax form), with cosine logits over a temperature.

    Example:
        >>> import torch
        >>> e = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])  # two tight classes
        >>> round(ClusterLoss(temperature=1.0)([e], torch.tensor([7, 7, 9, 9])).item(), 4)  # -log(e / (e + 1))
        0.3133
    """

    name = "cluster"

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        e, y = _check(embeddings, labels, self.name)
        classes, y = torch.unique(y, return_inverse=True)
        one_hot = F.one_hot(y, len(classes)).to(e.dtype)  # (n, K)
        sums = one_hot.T @ e  # (K, d)
        counts = one_hot.sum(0)  # (K,)
        anchors = counts[y] > 1
        if not anchors.any():
            return e.sum() * 0.0
        # centres seen from text i: its own class without it, the other classes whole
        centres = sums.unsqueeze(0) - one_hot.unsqueeze(-1) * e.unsqueeze(1)  # (n, K, d)
        centres = F.normalize(centres, dim=-1)
        logits = torch.einsum("nd,nkd->nk", e, centres) / self.temperature
        return F.cross_entropy(logits[anchors], y[anchors])


class SupConLoss(LabelledTextLoss):
    r"""Supervised contrastive loss over the batch: every same-label text is a positive.

    .. math::
        \mathcal{L} = \frac{1}{|A|}\sum_{i \in A} \frac{-1}{|P(i)|} \sum_{p \in P(i)}
        \log \frac{e^{\cos(e_i, e_p)/\tau}}{\sum_{a \ne i} e^{\cos(e_i, e_a)/\tau}}

    with *P(i)* the other texts of *i*'s class and *A* the texts that have one (0 if none does).

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``text``                            integer ``label`` (any values)
    ==================================  =========================================================

    Paper: Khosla et al., 2020, "Supervised Contrastive Learning" (:math:`\mathcal{L}^{sup}_{out}`).

    Example:
        >>> import torch
        >>> e = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
        >>> round(SupConLoss(temperature=1.0)([e], torch.tensor([0, 0, 1, 1])).item(), 4)  # log(e + 2) - 1
        0.5514
    """

    name = "supcon"

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        e, y = _check(embeddings, labels, self.name)
        n = len(y)
        self_mask = torch.eye(n, dtype=torch.bool, device=e.device)
        logits = (e @ e.T / self.temperature).masked_fill(self_mask, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        positives = (y.unsqueeze(0) == y.unsqueeze(1)) & ~self_mask
        count = positives.sum(1)
        anchors = count > 0
        if not anchors.any():
            return e.sum() * 0.0
        per_anchor = -(log_prob.masked_fill(~positives, 0.0).sum(1)[anchors]) / count[anchors]
        return per_anchor.mean()
