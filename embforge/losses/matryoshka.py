"""Matryoshka: train any embedding loss at several truncated dimensions at once."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss, LossWrapper


class MatryoshkaLoss(LossWrapper):
    r"""Weighted sum of an inner loss over prefixes of the embedding (``--matryoshka-dims``).

    .. math:: \mathcal{L} = \sum_k w_k\, \mathcal{L}_{\text{inner}}\big(\mathrm{norm}(e_{[:d_k]})\big)

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    those of the inner loss                     those of the inner loss
    ==========================================  ==============================================================

    Each prefix is L2-normalised (as sentence-transformers' ``MatryoshkaLoss`` does; equal on the same batch,
    tested), so a model trained this way can be truncated to any ``d_k`` at inference. The model is untouched:
    only the embeddings are sliced, so any loss without parameters sized to the embedding can be wrapped.

    Paper: Kusupati et al., 2022, "Matryoshka Representation Learning".

    Example:
        >>> import torch
        >>> from embforge.losses.regression import CosineMSELoss
        >>> loss = MatryoshkaLoss(CosineMSELoss(), dims=[1, 2], weights=[0.5, 1.0])
        >>> u, v = torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, -1.0]])  # cosine 0 at 2 dims, 1 at 1 dim
        >>> float(loss([u, v], torch.tensor([0.0])))  # 0.5 * (1 - 0)² + 1.0 * (0 - 0)²
        0.5
    """

    def __init__(
        self, loss: EmbeddingLoss, dims: Sequence[int], weights: Sequence[float] | None = None
    ) -> None:
        if loss.fixed_dim:
            raise ValueError(
                f"the {loss.name!r} loss has parameters sized to the full embedding; it cannot be "
                "wrapped by Matryoshka"
            )
        if not dims:
            raise ValueError("Matryoshka needs at least one dimension")
        if weights is None:
            weights = [1.0] * len(dims)
        if len(weights) != len(dims):
            raise ValueError(f"got {len(dims)} Matryoshka dims but {len(weights)} weights")
        super().__init__(loss)
        self.dims = [int(d) for d in dims]
        self.weights = [float(w) for w in weights]
        self.name = f"matryoshka({loss.name})"

    def forward(self, embeddings: list[Tensor], labels: Tensor | None) -> Tensor:
        full = embeddings[0].shape[-1]
        total = embeddings[0].new_zeros((), dtype=embeddings[0].float().dtype)
        for dim, weight in zip(self.dims, self.weights):
            if dim > full:
                raise ValueError(f"Matryoshka dimension {dim} is larger than the embedding size {full}")
            truncated = [F.normalize(e[..., :dim], p=2, dim=-1) for e in embeddings]
            total = total + weight * self.inner(truncated, labels)
        return total
