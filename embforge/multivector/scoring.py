r"""MaxSim (late interaction) scores of token matrices, as batched tensor operations.

.. math:: s(q, d) = \sum_{i \in q} \max_{j \in d} \langle q_i, d_j \rangle

Token matrices are zero-padded ``(texts, tokens, dim)`` tensors: a masked or padding token is a zero row, which
scores 0 against every query token (pylate multiplies its document mask into the similarities the same way) and
adds 0 to the sum when it is a query row.

Example:
    >>> import torch
    >>> q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])            # one query, two tokens
    >>> d = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[0.6, 0.8], [0.0, 1.0]]])
    >>> maxsim(q, d)
    tensor([[1.0000, 1.6000]])
"""

from __future__ import annotations

import torch
from torch import Tensor


def trim(matrices: Tensor) -> Tensor:
    """Drop the trailing token columns that are zero in every text (e.g. a fixed-width query's tail)."""
    used = (matrices != 0).any(dim=-1).any(dim=0)
    width = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
    return matrices[:, :width]


def maxsim(queries: Tensor, documents: Tensor) -> Tensor:
    """All-pairs MaxSim: ``queries`` ``(a, Lq, dim)`` x ``documents`` ``(b, Ld, dim)`` -> ``(a, b)`` float32."""
    q, d = trim(queries).float(), trim(documents).float()
    sims = torch.einsum("aid,bjd->abij", q, d)
    return sims.amax(dim=-1).sum(dim=-1)


def maxsim_pairwise(queries: Tensor, documents: Tensor) -> Tensor:
    """Row-wise MaxSim: ``queries`` ``(n, Lq, dim)`` with ``documents`` ``(n, Ld, dim)`` -> ``(n,)`` float32."""
    q, d = trim(queries).float(), trim(documents).float()
    return torch.einsum("nid,njd->nij", q, d).amax(dim=-1).sum(dim=-1)


def maxsim_topk(queries: Tensor, documents: Tensor, k: int, *, budget: int = 2**27) -> tuple[Tensor, Tensor]:
    """Exact top-``k`` documents of each query by MaxSim: ``(scores, indices)``, each ``(a, k)``.

    Documents are scored in blocks whose similarity tensor holds at most ``budget`` floats (one block is
    ``a x block x Lq x Ld``), keeping the running top ``k``.
    """
    q = trim(queries).float()
    k = min(k, len(documents))
    per_doc = max(1, q.shape[0] * q.shape[1] * documents.shape[1])
    block = max(1, budget // per_doc)
    best_scores = torch.full((len(q), 0), float("-inf"))
    best_ids = torch.zeros((len(q), 0), dtype=torch.long)
    for start in range(0, len(documents), block):
        scores = maxsim(q, documents[start : start + block].to(q.device)).cpu()
        ids = torch.arange(start, start + scores.shape[1]).expand_as(scores)
        merged, pick = torch.cat([best_scores, scores], 1).topk(
            min(k, best_scores.shape[1] + scores.shape[1]), 1
        )
        best_ids = torch.cat([best_ids, ids], 1).gather(1, pick)
        best_scores = merged
    return best_scores, best_ids
