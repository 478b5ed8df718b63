"""Cross-encoder losses: the logits of scored pairs (and labels) in, a scalar out. Selectable by name.

=============  ====================================  =============================================================
name           data                                  formula
=============  ====================================  =============================================================
``bce``        two texts + label 0/1 (or score)      binary cross-entropy on the logit, ``σ(f)`` vs ``y``
``ce``         two texts + class label               softmax cross-entropy over ``num_labels`` logits
``cosent``     two texts + score or label            :func:`embforge.losses.cosent.cosent` on the logits
``mse``        two texts + score                     ``mean((f - y)²)``
``listwise``   query + positive [+ negatives]        InfoNCE over each query's candidates (in-batch if no
                                                     negatives): ``-log softmax(s · f)[positive]``
``margin_mse`` query, positive, negatives + teacher  ``mean(((f_p - f_{n_j}) - (T_p - T_{n_j}))²)``
               scores ``(n, 1+k)`` or margins        (:func:`embforge.losses.distill.margin_mse`)
``kl_distill`` query + candidates + teacher scores   ``τ_s² · KL(softmax(T/τ_t) ‖ softmax(f/τ_s))`` per query
               ``(n, m)``                            (:func:`embforge.losses.distill.kl_distill`)
=============  ====================================  =============================================================

Every loss sees tensors only: the trainer scores the pairs with the model and passes the logits. They declare the
class attributes of :class:`~embforge.losses.base.BaseLoss` (``min_texts``, ``max_texts``, ``needs_labels``) so
:meth:`embforge.training.tasks.Task.validate` checks the data for them, plus ``grouped`` (the scores arrive as
``(queries, candidates)``).

Example:
    >>> import torch
    >>> loss = get_cross_loss("cosent")
    >>> round(float(loss(torch.tensor([[2.0], [0.0]]), torch.tensor([1.0, 0.0]))), 4)
    0.1269
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import BaseLoss
from embforge.losses.cosent import cosent
from embforge.losses.distill import KLTemperatures, margin_mse


class CrossLoss(BaseLoss):
    """Base class of cross-encoder losses: ``forward(logits, labels) -> scalar``.

    ``logits`` is ``(batch, num_labels)`` for pointwise losses and ``(queries, candidates)`` for grouped ones.
    """

    name = "cross"
    max_texts: int | None = 2
    needs_labels = True
    grouped = False

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, logits: Tensor, labels: Tensor | None = None) -> Tensor:
        """``forward`` with the labels moved to the logits' device."""
        return super().__call__(logits, None if labels is None else labels.to(logits.device))


def _single_logit(logits: Tensor, name: str) -> Tensor:
    if logits.ndim == 2 and logits.shape[1] != 1:
        raise ValueError(
            f"the {name!r} loss needs a one-label cross-encoder (num_labels=1), got {logits.shape[1]} logits per pair"
        )
    return logits.float().reshape(-1)


class BCELoss(CrossLoss):
    r"""Binary cross-entropy on the pair's single logit (``bce``).

    .. math:: \mathcal{L} = -\frac{1}{n}\sum_i \big(y_i \log\sigma(f_i) + (1-y_i)\log(1-\sigma(f_i))\big)

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``label`` 0/1, or a soft target in [0, 1] (``label_max``
                                        divides graded scores first, e.g. 5 for STS-B's 0-5)
    ==================================  =========================================================

    ``pos_weight`` weighs the positive term (rare positives). Equals sentence-transformers'
    ``BinaryCrossEntropyLoss`` (tested).

    Paper: Nogueira & Cho, 2019, "Passage Re-ranking with BERT" (monoBERT).

    Example:
        >>> import torch
        >>> round(float(BCELoss()(torch.tensor([[0.0], [0.0]]), torch.tensor([1.0, 0.0]))), 4)  # log 2
        0.6931
    """

    name = "bce"

    def __init__(self, label_max: float | None = None, pos_weight: float | None = None) -> None:
        super().__init__()
        self.label_max = label_max
        self.pos_weight = None if pos_weight is None else torch.tensor(float(pos_weight))

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        labels = labels.astype(np.float32)
        if self.label_max is not None:
            labels = labels / self.label_max
        if labels.min() < 0 or labels.max() > 1:
            raise ValueError(
                f"the 'bce' loss needs labels in [0, 1], got {labels.min():g}..{labels.max():g}; "
                "pass label_max=<largest score> (e.g. --loss-option label_max=5) to scale graded labels"
            )
        return labels

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        pos_weight = None if self.pos_weight is None else self.pos_weight.to(logits.device)
        return F.binary_cross_entropy_with_logits(
            _single_logit(logits, self.name), labels.float().reshape(-1), pos_weight=pos_weight
        )


class SoftmaxCELoss(CrossLoss):
    r"""Softmax cross-entropy over ``num_labels`` logits against integer class labels (``ce``).

    .. math:: \mathcal{L} = -\frac{1}{n}\sum_i \log \mathrm{softmax}(f_i)_{y_i}

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            integer class ``label`` (0/1 for pairs, 3 NLI classes ...)
    ==================================  =========================================================

    Needs a cross-encoder with ``num_labels >= 2``. Equals sentence-transformers' cross-encoder
    ``CrossEntropyLoss`` (tested).

    Paper: Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
    Understanding" (sentence-pair classification).

    Example:
        >>> import torch
        >>> round(float(SoftmaxCELoss()(torch.tensor([[2.0, 0.0]]), torch.tensor([0]))), 4)  # -log softmax
        0.1269
    """

    name = "ce"

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        if not np.all(labels == np.round(labels)):
            raise ValueError(
                "the 'ce' loss needs integer class labels; use 'bce', 'mse' or 'cosent' for scores"
            )
        return labels.astype(np.int64)

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        if logits.ndim != 2 or logits.shape[1] < 2:
            raise ValueError("the 'ce' loss needs a cross-encoder with num_labels >= 2 (e.g. 2 for pairs)")
        return F.cross_entropy(logits.float(), labels.long().reshape(-1))


class CrossCoSENTLoss(CrossLoss):
    r"""CoSENT on the batch of pair logits (``cosent``): :func:`embforge.losses.cosent.cosent` as it is.

    .. math:: \mathcal{L} = \log\Big(1 + \sum_{(i,j):\ y_i > y_j} e^{\lambda (f_j - f_i)}\Big)

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``score`` (any scale) or 0/1 ``label``
    ==================================  =========================================================

    Only the order of the labels is used, so graded scores and 0/1 labels both work. The logit is unbounded,
    so ``λ`` (``scale``) defaults to 1 (the head learns the scale); 20 is the bi-encoder value for cosines.

    Paper: Su Jianlin, 2022, "CoSENT: a more efficient sentence vector scheme than Sentence-BERT"
    (kexue.fm/archives/8847).

    Example:
        >>> import torch
        >>> round(float(CrossCoSENTLoss()(torch.tensor([[2.0], [0.0]]), torch.tensor([1.0, 0.0]))), 4)
        0.1269
    """

    name = "cosent"

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        return cosent(_single_logit(logits, self.name), labels, scale=self.scale)


class MSELoss(CrossLoss):
    r"""Mean squared error between the logit (optionally through a sigmoid) and the label (``mse``).

    .. math:: \mathcal{L} = \frac{1}{n}\sum_i \big(a(f_i) - y_i\big)^2, \qquad a = \mathrm{identity}\ \text{or}\ \sigma

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``sentence1, sentence2``            ``score`` (``label_max`` divides it first, if given)
    ==================================  =========================================================

    ``activation="identity"`` (default) equals sentence-transformers' cross-encoder ``MSELoss`` (tested).

    Paper: Reimers & Gurevych, 2019, "Sentence-BERT" (the cross-encoder STS regression it compares with).

    Example:
        >>> import torch
        >>> float(MSELoss()(torch.tensor([[0.5], [1.0]]), torch.tensor([0.0, 1.0])))  # (0.5² + 0²) / 2
        0.125
    """

    name = "mse"

    def __init__(self, activation: str = "identity", label_max: float | None = None) -> None:
        super().__init__()
        if activation not in ("identity", "sigmoid"):
            raise ValueError(f"activation must be 'identity' or 'sigmoid', got {activation!r}")
        self.activation = activation
        self.label_max = label_max

    def prepare_labels(self, labels: np.ndarray) -> np.ndarray:
        labels = labels.astype(np.float32)
        return labels / self.label_max if self.label_max is not None else labels

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        scores = _single_logit(logits, self.name)
        if self.activation == "sigmoid":
            scores = torch.sigmoid(scores)
        return F.mse_loss(scores, labels.float().reshape(-1))


class ListwiseLoss(CrossLoss):
    r"""InfoNCE over each query's candidates (``listwise``; also ``infonce``): the positive must win the softmax.

    .. math:: \mathcal{L} = -\frac{1}{n}\sum_i \log \mathrm{softmax}\big(s \cdot f(q_i, \cdot)\big)_{p_i}

    ==================================  =========================================================
    text columns                        labels
    ==================================  =========================================================
    ``anchor, positive``                none (the other rows' positives are the candidates:
                                        ``batch²`` pairs are scored)
    ``anchor, positive, negative_1..k`` none (the positive is candidate 0)
    ==================================  =========================================================

    Paper: Gao, Dai & Callan, 2021, "Rethink Training of BERT Rerankers in Multi-Stage Retrieval Pipeline"
    (localized contrastive estimation).

    Example:
        >>> import torch
        >>> round(float(ListwiseLoss()(torch.tensor([[1.0, 0.0]]))), 4)  # one query: positive 1, negative 0
        0.3133
    """

    name = "listwise"
    max_texts = None
    needs_labels = False
    grouped = True

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        target = labels if labels is not None else torch.zeros(len(logits), dtype=torch.long)
        return F.cross_entropy(self.scale * logits.float(), target.long().to(logits.device))


class GroupedTeacherLoss(CrossLoss):
    """Base of the cross-encoder distillation losses: each query's candidate columns are scored as one group,
    ``(queries, candidates)`` logits, against the teacher's scores."""

    min_texts = 3
    max_texts = None
    grouped = True


class CrossMarginMSELoss(GroupedTeacherLoss):
    r"""Distillation: the logit margin ``f(q,p) - f(q,n_j)`` regresses the teacher's margin (``margin_mse``).

    .. math:: \mathcal{L} = \frac{1}{nk}\sum_{i,j}\big((f(q_i,p_i) - f(q_i,n_{ij})) - (T_{i,p} - T_{i,n_j})\big)^2

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, positive, negative_1..k``         teacher scores ``[T(q,p), T(q,n_1), …]`` ``(n, 1+k)`` or
                                                margins ``T(q,p) - T(q,n_j)`` ``(n, k)``
    ==========================================  ==============================================================

    The trainer scores each query with its candidate columns and passes ``(queries, 1+k)`` logits. Same as
    sentence-transformers' cross-encoder ``MarginMSELoss`` (identity activation).

    Paper: Hofstätter et al., 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture Knowledge
    Distillation".

    Example:
        >>> import torch
        >>> float(CrossMarginMSELoss()(torch.tensor([[3.0, 1.0]]), torch.tensor([[1.0, 0.0]])))  # (2 - 1)²
        1.0
    """

    name = "margin_mse"

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        logits = logits.float()
        return margin_mse(logits[:, 0], logits[:, 1:], labels)


class CrossKLDistillLoss(KLTemperatures, GroupedTeacherLoss):
    r"""Distillation: KL from the teacher's to the cross-encoder's softmax over each query's candidates.

    .. math::
        \mathcal{L} = \tau_s^2\,\frac{1}{n}\sum_i \mathrm{KL}\big(\mathrm{softmax}(T_i/\tau_t)\,\big\|\,
        \mathrm{softmax}(f(q_i, \cdot)/\tau_s)\big)

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``anchor, candidate_1..m``                  teacher scores ``(n, m)``
    ==========================================  ==============================================================

    ``τ_s²`` rescales the loss (:func:`embforge.losses.distill.kl_distill`).

    Paper: Hinton, Vinyals & Dean, 2015, "Distilling the Knowledge in a Neural Network"; listwise over a
    query's candidates as in Ren et al., 2021, "RocketQAv2".

    Example:
        >>> import torch
        >>> float(CrossKLDistillLoss()(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])))  # teacher agrees
        0.0
    """

    name = "kl_distill"

    def forward(self, logits: Tensor, labels: Tensor | None) -> Tensor:
        assert labels is not None
        return self.kl(logits.float(), labels.float().reshape(logits.shape))


CROSS_LOSSES: dict[str, type[CrossLoss]] = {
    "bce": BCELoss,
    "ce": SoftmaxCELoss,
    "cosent": CrossCoSENTLoss,
    "mse": MSELoss,
    "listwise": ListwiseLoss,
    "margin_mse": CrossMarginMSELoss,
    "kl_distill": CrossKLDistillLoss,
}


def get_cross_loss(name: str, **options: object) -> CrossLoss:
    """Build a cross-encoder loss by name (``bce``, ``ce``, ``cosent``, ``mse``, ``listwise``, ``margin_mse``,
    ``kl_distill``).

    Args:
        name: The loss name.
        **options: Keyword arguments of the loss class (e.g. ``scale=1``, ``label_max=5``).
    """
    key = {"infonce": "listwise", "softmax": "ce", "cross_entropy": "ce"}.get(name, name)
    if key not in CROSS_LOSSES:
        raise ValueError(f"unknown cross-encoder loss {name!r}; choose one of {', '.join(CROSS_LOSSES)}")
    try:
        return CROSS_LOSSES[key](**options)
    except TypeError as err:
        raise ValueError(f"bad option for cross-encoder loss {name!r}: {err}") from None
