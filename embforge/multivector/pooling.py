r"""Hierarchical token pooling: fewer vectors per document, each the mean of a cluster of similar token vectors.

A ColBERT index stores every kept token vector of every document. Pooling (Clavié et al., 2024, "Reducing the
Footprint of Multi-Vector Retrieval with Minimal Performance Impact via Token Pooling", pylate's and
sentence-transformers' ``pool_factor``) clusters each document's token vectors and keeps one vector per cluster:

1. the first ``protected_tokens`` vectors (the ``[CLS]`` token's) are kept as they are;
2. the other ``n`` vectors are clustered by Ward's hierarchical method on the cosine distances
   :math:`1 - \langle d_i, d_j \rangle` (SciPy's ``linkage(method="ward")``) and the tree is cut into at most
   :math:`\max(\lfloor n / f \rfloor, 1)` clusters (``fcluster(criterion="maxclust")``), ``f`` the pool factor;
3. each cluster becomes the mean of its members, in cluster-label order, after the protected vectors.

A mean is not re-normalised (pylate's definition; ``normalize=True`` is sentence-transformers' default instead):
a query token's dot product with it is the mean of its dot products with the members. A document too short to
shrink (``⌊n / f⌋ >= n``) and ``pool_factor=1`` come back unchanged, bit for bit. Queries are never pooled.

Two appliers share the clustering (:func:`token_groups`) and the means (:func:`group_means`):

- :func:`pool_documents` at index time: a list of ``(tokens, dim)`` arrays, one per document;
- :func:`pool_padded` while training: zero-padded ``(texts, width, dim)`` matrices (masked tokens zero, as the
  model's forward gives them); the assignment is computed without gradient, the means keep it, so the loss trains
  the model for the pooled index it will be searched through.

The clustering runs per document (SciPy has no batched linkage): a loop over documents, never over tokens.

Example:
    >>> import numpy as np
    >>> doc = np.array([[1, 0], [0, 1], [0.6, 0.8], [0, 1]], dtype=np.float32)  # [CLS] then three tokens
    >>> pool_documents([doc], 2)[0]  # [CLS] kept; ⌊3 / 2⌋ = 1 cluster: the three tokens' mean
    array([[1.        , 0.        ],
           [0.2       , 0.93333334]], dtype=float32)
    >>> pool_documents([doc], 1)[0] is doc
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.cluster import hierarchy
from torch import Tensor


def check_pool_factor(value: object) -> float:
    """``value`` as a float ≥ 1 (1: no pooling); anything else is a ``ValueError`` saying what is allowed."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 1
    ):
        raise ValueError(
            f"pool_factor must be a finite number >= 1 (1: no pooling, 2: about half the token vectors), "
            f"got {value!r}"
        )
    return float(value)


def token_groups(vectors: np.ndarray, pool_factor: float, *, protected_tokens: int = 1) -> np.ndarray:
    """The group of each of a document's token vectors ``(tokens, dim)``: ``0 .. protected_tokens - 1`` for the
    protected ones, then the Ward clusters of the rest in cluster-label order (see the module docstring).
    ``arange(tokens)`` when the document is too short to shrink."""
    tokens = len(vectors)
    protected = min(protected_tokens, tokens)
    rest = tokens - protected
    clusters = max(int(rest // pool_factor), 1)
    if clusters >= rest:
        return np.arange(tokens)
    to_pool = torch.from_numpy(np.ascontiguousarray(vectors[protected:], dtype=np.float32))
    with torch.autocast(
        "cpu", enabled=False
    ):  # float32 products, as pylate's, inside a mixed-precision step too
        distances = (1 - to_pool @ to_pool.T).numpy()
    tree = hierarchy.linkage(distances[np.triu_indices(rest, k=1)], method="ward")
    labels = hierarchy.fcluster(tree, t=clusters, criterion="maxclust")
    _, dense = np.unique(labels, return_inverse=True)  # fcluster may return fewer clusters than asked (ties)
    return np.concatenate([np.arange(protected), protected + dense.reshape(-1)])


def group_means(vectors: Tensor, groups: Tensor, count: int) -> Tensor:
    """``(count, dim)``: row ``g`` is the mean of the ``vectors`` rows whose group is ``g`` (zero when none);
    differentiable in ``vectors``."""
    sums = vectors.new_zeros((count, vectors.shape[1])).index_add(0, groups, vectors)
    members = torch.zeros(count, dtype=vectors.dtype, device=vectors.device)
    members = members.index_add(0, groups, torch.ones_like(groups, dtype=vectors.dtype))
    return sums / members.clamp(min=1)[:, None]


def pool_documents(
    matrices: Sequence[np.ndarray], pool_factor: float, *, protected_tokens: int = 1, normalize: bool = False
) -> list[np.ndarray]:
    """Each document's token vectors ``(tokens, dim)`` pooled (see the module docstring); ``pool_factor`` 1
    returns the same arrays. ``normalize``: L2-normalise every output vector (sentence-transformers' default)."""
    factor = check_pool_factor(pool_factor)
    if factor == 1 and not normalize:
        return list(matrices)
    out = []
    for matrix in matrices:
        groups = token_groups(matrix, factor, protected_tokens=protected_tokens)
        count = int(groups.max()) + 1 if len(groups) else 0
        pooled = matrix
        if count < len(matrix):
            vectors = torch.from_numpy(np.ascontiguousarray(matrix))
            pooled = group_means(vectors, torch.from_numpy(groups), count).numpy()
        if normalize:
            pooled = F.normalize(torch.from_numpy(np.ascontiguousarray(pooled)), dim=-1).numpy()
        out.append(pooled)
    return out


def pool_padded(matrices: Tensor, pool_factor: float, *, protected_tokens: int = 1) -> Tensor:
    """Zero-padded token matrices ``(texts, width, dim)`` (masked tokens are zero rows) pooled: each text's pooled
    vectors first, then zero rows, ``(texts, width', dim)`` with ``width' <= width``. Gradients reach the pooled
    rows' members; the grouping itself is computed on a detached copy. ``pool_factor`` 1 returns ``matrices``."""
    if check_pool_factor(pool_factor) == 1 or matrices.numel() == 0:
        return matrices
    texts, width, _ = matrices.shape
    kept = (matrices != 0).any(dim=-1)
    vectors = matrices[kept]  # (kept tokens, dim), text by text, in token order
    lengths = kept.sum(dim=1).tolist()
    detached = vectors.detach().float().cpu().numpy()
    slots = np.empty(len(vectors), dtype=np.int64)
    widest, start = 1, 0
    for text, length in enumerate(lengths):
        groups = token_groups(
            detached[start : start + length], pool_factor, protected_tokens=protected_tokens
        )
        slots[start : start + length] = text * width + groups
        widest = max(widest, int(groups.max()) + 1 if len(groups) else 0)
        start += length
    pooled = group_means(vectors, torch.from_numpy(slots).to(vectors.device), texts * width)
    return pooled.view(texts, width, -1)[:, :widest]
