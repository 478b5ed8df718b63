"""SPLADE's loss for sparse models: a ranking loss over sparse dot products + FLOPS regularisers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.losses.base import EmbeddingLoss


def flops(x: Tensor, threshold: int | None = None) -> Tensor:
    """``sum_j mean_i(x_ij)^2`` (rows with at most ``threshold`` active dimensions count as zero rows)."""
    if threshold is not None:
        x = x * ((x != 0).sum(dim=1) > threshold).unsqueeze(1).to(x.dtype)
    return torch.sum(torch.mean(x.float(), dim=0) ** 2)


class SpladeLoss(EmbeddingLoss):
    r"""InfoNCE over sparse dot products + separately weighted, warmed-up FLOPS terms (``splade``).

    .. math::
        \mathcal{L} = \underbrace{-\frac{1}{n}\sum_i \log \frac{e^{s\, q_i \cdot d_i^+}}
        {\sum_{d \in \text{batch}} e^{s\, q_i \cdot d}}}_{\text{ranking (InfoNCE, dot product)}}
        + w(t)\Big(\lambda_q \, \mathrm{FLOPS}(Q) + \lambda_d \, \mathrm{FLOPS}(D)\Big),
        \qquad \mathrm{FLOPS}(X) = \sum_{j} \Big(\frac{1}{n}\sum_i x_{ij}\Big)^2

    ==========================================  ==============================================================
    text columns                                labels
    ==========================================  ==============================================================
    ``query, positive``                         none (the other rows' positives are the negatives)
    ``query, positive, negative_1..k``          none (every document column is regularised as ``D``)
    ==========================================  ==============================================================

    ``FLOPS`` is the squared mean activation of each vocabulary dimension summed over the vocabulary: it
    approximates the number of multiplications of an inverted-index search and pushes rarely useful dimensions
    to zero. Queries (the first column) and documents (every other column) get separate weights ``λ_q``
    (``query_weight``), ``λ_d`` (``document_weight``); ``w(t) = min(1, (t / warmup_steps)^2)`` warms both up
    quadratically over the first training calls (the regularisers would otherwise zero the vectors before the
    ranking loss has shaped them). An inference-free model's queries come from a weight table and are usually not
    regularised (``query_weight=0``). ``threshold`` drops rows with at most that many active dimensions from a
    FLOPS term (FLOPS with an l0 mask). Equals sentence-transformers' ``SpladeLoss(
    SparseMultipleNegativesRankingLoss(scale=s), document_regularizer_weight=λ_d, query_regularizer_weight=λ_q)``
    at full weight (tested).

    Paper: Formal et al., 2021, "SPLADE: Sparse Lexical and Expansion Model for First Stage Ranking"; the FLOPS
    regulariser from Paria et al., 2020, "Minimizing FLOPs to Learn Efficient Sparse Representations".

    Example:
        >>> import torch
        >>> loss = SpladeLoss(query_weight=0.5, document_weight=0.25)
        >>> q, d = torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]])  # one pair: ranking term 0
        >>> float(loss([q, d]))  # 0.5 * FLOPS(q) + 0.25 * FLOPS(d) = 0.5 * 2² + 0.25 * 1²
        2.25
        >>> loss.terms["query_flops"]
        tensor(4.)
    """

    name = "splade"
    in_batch_negatives = True

    def __init__(
        self,
        scale: float = 1.0,
        query_weight: float = 5e-5,
        document_weight: float = 3e-5,
        warmup_steps: int = 0,
        query_threshold: int | None = None,
        document_threshold: int | None = None,
    ) -> None:
        super().__init__()
        if min(query_weight, document_weight) < 0 or warmup_steps < 0:
            raise ValueError("query_weight, document_weight and warmup_steps must be >= 0")
        self.scale = float(scale)
        self.query_weight = float(query_weight)
        self.document_weight = float(document_weight)
        self.warmup_steps = int(warmup_steps)
        self.query_threshold = query_threshold
        self.document_threshold = document_threshold
        self.calls: Tensor
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))  # training calls so far (warm-up)
        self.terms: dict[str, Tensor] = {}  # the last call's ranking and FLOPS terms, detached (logs, tests)

    def warmup_factor(self) -> float:
        """``w(t)``: ``(t / warmup_steps)^2`` during the warm-up, then 1."""
        if self.warmup_steps == 0:
            return 1.0
        return min(1.0, (int(self.calls) / self.warmup_steps) ** 2)

    def forward(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        queries, documents = embeddings[0].float(), torch.cat(embeddings[1:]).float()
        targets = torch.arange(len(queries), device=queries.device)
        ranking = F.cross_entropy(self.scale * queries @ documents.T, targets)
        query_flops = flops(queries, self.query_threshold)
        document_flops = flops(documents, self.document_threshold)
        factor = self.warmup_factor()
        if self.training:
            self.calls += 1
        self.terms = {
            "ranking": ranking.detach(),
            "query_flops": query_flops.detach(),
            "document_flops": document_flops.detach(),
        }
        return ranking + factor * (self.query_weight * query_flops + self.document_weight * document_flops)
