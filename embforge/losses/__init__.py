"""Bi-encoder losses, selectable by name. Each takes embeddings (one tensor per text column) and labels.

Sixteen by name in :data:`LOSSES` (the ``--loss`` choices of a dense, static or sparse model) plus the
:class:`MatryoshkaLoss` and :class:`CentroidLoss` wrappers; cross-encoder losses are in :mod:`embforge.losses.cross`, multi-vector (MaxSim)
ones in :mod:`embforge.losses.late`. Each class's docstring gives its formula, the columns it reads, its paper and
an example.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from embforge.losses.base import EmbeddingLoss
from embforge.losses.centroid import CentroidLoss
from embforge.losses.classification import ClusterLoss, PrototypeLoss, SupConLoss
from embforge.losses.cosent import CoSENTLoss, cosent
from embforge.losses.distill import KLDistillLoss, MarginMSEDistillLoss, MSEDistillLoss
from embforge.losses.gist import GISTLoss
from embforge.losses.infonce import InfoNCELoss, SimCSELoss
from embforge.losses.margin import ContrastiveLoss, TripletLoss
from embforge.losses.matryoshka import MatryoshkaLoss
from embforge.losses.regression import CosineMSELoss
from embforge.losses.relational import SimilarityDistillLoss
from embforge.losses.softmax import SoftmaxLoss
from embforge.losses.splade import SpladeLoss

LOSSES: dict[str, type[EmbeddingLoss]] = {
    "infonce": InfoNCELoss,
    "gist": GISTLoss,  # InfoNCE whose in-batch negatives a guide model vets
    "simcse": SimCSELoss,
    "cosent": CoSENTLoss,
    "mse": CosineMSELoss,
    "softmax": SoftmaxLoss,
    "contrastive": ContrastiveLoss,
    "triplet": TripletLoss,
    "prototype": PrototypeLoss,
    "cluster": ClusterLoss,
    "supcon": SupConLoss,
    "mse_distill": MSEDistillLoss,
    "margin_mse": MarginMSEDistillLoss,
    "kl_distill": KLDistillLoss,
    "similarity_distill": SimilarityDistillLoss,  # dimension-free: the teacher's in-batch similarities
    "splade": SpladeLoss,  # sparse models (--model-type sparse)
}

__all__ = [
    "LOSSES",
    "CentroidLoss",
    "ClusterLoss",
    "CoSENTLoss",
    "ContrastiveLoss",
    "CosineMSELoss",
    "EmbeddingLoss",
    "GISTLoss",
    "InfoNCELoss",
    "KLDistillLoss",
    "MSEDistillLoss",
    "MarginMSEDistillLoss",
    "MatryoshkaLoss",
    "PrototypeLoss",
    "SimCSELoss",
    "SimilarityDistillLoss",
    "SoftmaxLoss",
    "SpladeLoss",
    "SupConLoss",
    "TripletLoss",
    "cosent",
    "get_loss",
]


def get_loss(
    name: str,
    *,
    dim: int | None = None,
    num_labels: int | None = None,
    matryoshka_dims: Sequence[int] | None = None,
    matryoshka_weights: Sequence[float] | None = None,
    **options: object,
) -> EmbeddingLoss:
    """Build a loss by name.

    Args:
        name: One of :data:`LOSSES` (``infonce``, ``gist``, ``simcse``, ``cosent``, ``mse``, ``softmax``,
            ``contrastive``, ``triplet``, ``prototype``, ``cluster``, ``supcon``, ``mse_distill``,
            ``margin_mse``, ``kl_distill``, ``similarity_distill``, ``splade``).
        dim: Embedding size (needed by ``softmax`` and ``prototype``).
        num_labels: Number of classes (needed by ``softmax`` and ``prototype``).
        matryoshka_dims: Wrap the loss in :class:`MatryoshkaLoss` at these dimensions.
        matryoshka_weights: Weights of the Matryoshka dimensions (default all 1).
        **options: Keyword arguments of the loss class (e.g. ``temperature=0.02``, ``scale=20``), and for any
            dense loss ``centroid``: the weight of :func:`embforge.losses.centroid.centroid_penalty` added to it
            (the loss wrapped in :class:`CentroidLoss`), and ``centroid_columns``: the leading text columns it
            covers (default all).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")
    cls = LOSSES[name]
    centroid = _centroid_weight(name, options.pop("centroid", 0.0))
    centroid_columns = _centroid_columns(name, options.pop("centroid_columns", None), centroid)
    if cls is SoftmaxLoss or cls is PrototypeLoss:
        if dim is None or num_labels is None:
            raise ValueError(f"the {name} loss needs the embedding dim and the number of labels")
        options = {"dim": dim, "num_labels": num_labels, **options}
    try:
        loss = cls(**options)
    except TypeError as err:
        raise ValueError(f"bad option for loss {name!r}: {err}") from None
    if centroid:  # inside Matryoshka: each prefix has its own penalty
        loss = CentroidLoss(loss, centroid=centroid, centroid_columns=centroid_columns)
    if matryoshka_dims:
        loss = MatryoshkaLoss(loss, matryoshka_dims, matryoshka_weights)
    return loss


def _centroid_weight(name: str, value: object) -> float:
    """The ``centroid`` option as a weight ≥ 0; sparse vectors have no unit sphere to spread on."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"option 'centroid' of loss {name!r} must be a number >= 0, got {value!r}")
    if value and LOSSES[name] is SpladeLoss:
        raise ValueError("option 'centroid' applies to dense embeddings, not to the sparse 'splade' loss")
    return float(value)


def _centroid_columns(name: str, value: object, centroid: float) -> int | None:
    """The ``centroid_columns`` option: a count ≥ 1 of leading text columns, only beside a ``centroid`` weight."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option 'centroid_columns' of loss {name!r} must be an integer >= 1, got {value!r}")
    if not centroid:
        raise ValueError(
            f"option 'centroid_columns' of loss {name!r} needs a 'centroid' weight > 0 beside it"
        )
    return value
