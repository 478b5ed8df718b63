"""Multi-vector indexes: exact MaxSim over all documents, and PLAID (``fast-plaid``) for large corpora.

Both take each document's token matrix (``(tokens, dim)``, masked tokens already dropped, as
:meth:`~embforge.multivector.model.MultiVectorEncoder.encode` returns them) and answer the top ``k`` documents of
each query matrix with their MaxSim scores.

- ``exact``: every query against every document (:func:`~embforge.multivector.scoring.maxsim_topk`), in blocks.
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


def create_multivector_index(kind: str, **options: object) -> MultiVectorIndex:
    """``exact`` or ``plaid`` (options: :class:`PlaidIndex`'s)."""
    if kind == "exact":
        return ExactMaxSimIndex()
    if kind == "plaid":
        return PlaidIndex(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown multi-vector index {kind!r}; choose one of {', '.join(MULTIVECTOR_INDEXES)}")
