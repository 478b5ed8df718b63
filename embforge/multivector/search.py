"""Multi-vector indexes: exact MaxSim over all documents, and PLAID (``fast-plaid``) for large corpora.

Both take each document's token matrix (``(tokens, dim)``, masked tokens already dropped, as
:meth:`~embforge.multivector.model.MultiVectorEncoder.encode` returns them) and answer the top ``k`` documents of
each query matrix with their MaxSim scores.

- ``exact``: every query against every document (:func:`~embforge.multivector.scoring.maxsim_topk`), in blocks.
- ``pool_factor`` (an option of either): each document's token vectors are pooled before they are indexed
  (:mod:`embforge.multivector.pooling`; 2 keeps about half of them).
- ``plaid``: Santhanam et al., 2022 ("PLAID: An Efficient Engine for Late Interaction Retrieval") through the
  ``fast-plaid`` library: token vectors are clustered (k-means centroids) and stored as centroid + 4-bit residual
  codes; a query probes its tokens' nearest centroids, prunes candidates by centroid interaction, and re-scores
  the best ``n_full_scores`` with decompressed vectors. ``fast-plaid`` wheels are built against one torch
  version each (``pip install 'embforge[plaid]'`` with the torch it names).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from embforge._optional import require
from embforge.multivector.model import pad_matrices
from embforge.multivector.pooling import check_pool_factor, pool_documents
from embforge.multivector.scoring import maxsim_topk

MULTIVECTOR_INDEXES = ("exact", "plaid")


class MultiVectorIndex(Protocol):
    """Document token matrices in, top-``k`` ``(scores, ids)`` per query out."""

    def add(self, ids: Sequence[str], matrices: Sequence[np.ndarray]) -> None: ...

    def search(self, queries: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, list[list[str]]]: ...


class ExactMaxSimIndex:
    """Exact MaxSim of each query with every document (zero-padded matrices kept in memory)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.matrices: list[np.ndarray] = []
        self._padded: torch.Tensor | None = None

    def add(self, ids: Sequence[str], matrices: Sequence[np.ndarray]) -> None:
        self.ids.extend(ids)
        self.matrices.extend(matrices)
        self._padded = None

    def search(self, queries: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, list[list[str]]]:
        if self._padded is None:
            self._padded = pad_matrices(self.matrices, self.matrices[0].shape[1])[0]
        q = pad_matrices(queries, queries[0].shape[1])[0]
        scores, rows = maxsim_topk(q, self._padded, k)
        return scores.numpy(), [[self.ids[j] for j in row] for row in rows.tolist()]


class PlaidIndex:
    """A PLAID index (``fast-plaid``) in ``folder`` (a temporary folder when none is given).

    Args:
        folder: Where the index files go.
        nbits: Bits per residual dimension (4: ColBERTv2/PLAID's default).
        n_ivf_probe: Centroids probed per query token.
        n_full_scores: Candidates re-scored with decompressed vectors per query.
        device: ``cpu`` or ``cuda:N``.
    """

    def __init__(
        self,
        folder: str | Path | None = None,
        *,
        nbits: int = 4,
        n_ivf_probe: int = 8,
        n_full_scores: int = 4096,
        device: str = "cpu",
        seed: int = 42,
    ) -> None:
        self._tmp = None if folder is not None else tempfile.mkdtemp(prefix="embforge-plaid-")
        self.folder = Path(folder if folder is not None else self._tmp)  # type: ignore[arg-type]
        self.nbits, self.n_ivf_probe, self.n_full_scores = nbits, n_ivf_probe, n_full_scores
        self.device, self.seed = device, seed
        self.ids: list[str] = []

    def add(self, ids: Sequence[str], matrices: Sequence[np.ndarray]) -> None:
        """Build the index over these documents (PLAID's centroids are fitted to them: one build per corpus)."""
        if self.ids:
            raise ValueError("a PLAID index is built once over its whole corpus; create a new PlaidIndex")
        search = require("fast_plaid.search")
        self.ids = list(ids)
        self._plaid = search.FastPlaid(index=str(self.folder), device=self.device)
        tensors = [torch.from_numpy(np.ascontiguousarray(m, dtype=np.float32)) for m in matrices]
        self._plaid.create(documents_embeddings=tensors, nbits=self.nbits, seed=self.seed)

    def search(self, queries: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, list[list[str]]]:
        tensors = [torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)) for q in queries]
        hits = self._plaid.search(
            queries_embeddings=tensors,
            top_k=k,
            n_ivf_probe=self.n_ivf_probe,
            n_full_scores=self.n_full_scores,
            show_progress=False,
        )
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for row, found in enumerate(hits):
            scores[row, : len(found)] = [score for _, score in found]
        return scores, [[self.ids[doc] for doc, _ in found] for found in hits]

    def close(self) -> None:
        """Remove the temporary folder (an index built in a given folder stays)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


class PooledIndex:
    """An index whose documents are pooled as they are added (:func:`~embforge.multivector.pooling.pool_documents`,
    hierarchical clustering: about ``1 / pool_factor`` of each document's token vectors); queries are not."""

    def __init__(self, inner: MultiVectorIndex, pool_factor: object) -> None:
        self.inner, self.pool_factor = inner, check_pool_factor(pool_factor)
        self.vectors = 0  # token vectors indexed (after pooling)

    def add(self, ids: Sequence[str], matrices: Sequence[np.ndarray]) -> None:
        pooled = pool_documents(matrices, self.pool_factor)
        self.vectors += sum(len(m) for m in pooled)
        self.inner.add(ids, pooled)

    def search(self, queries: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, list[list[str]]]:
        return self.inner.search(queries, k)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)  # only PLAID keeps files
        if close is not None:
            close()


def create_multivector_index(kind: str, **options: object) -> MultiVectorIndex:
    """``exact`` or ``plaid`` (options: :class:`PlaidIndex`'s); the option ``pool_factor`` above 1 pools the
    documents (:class:`PooledIndex`)."""
    pool_factor = check_pool_factor(options.pop("pool_factor", 1))
    index: MultiVectorIndex
    if kind == "exact":
        if options:
            raise ValueError(
                f"the exact MaxSim index takes no options besides pool_factor, got {sorted(options)}"
            )
        index = ExactMaxSimIndex()
    elif kind == "plaid":
        index = PlaidIndex(**options)  # type: ignore[arg-type]
    else:
        raise ValueError(
            f"unknown multi-vector index {kind!r}; choose one of {', '.join(MULTIVECTOR_INDEXES)}"
        )
    return index if pool_factor == 1 else PooledIndex(index, pool_factor)
