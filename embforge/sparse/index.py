"""An inverted index of sparse vectors: scipy sparse matrix products, then top-k per query.

The documents' vectors are kept as one CSR matrix ``(documents, vocab)`` and, for search, its transpose in CSC
form — for each vocabulary dimension the documents that have it and their weights, i.e. posting lists. A
query's scores are the sparse product ``queries @ documents.T``: only documents sharing a term with the query
are touched, so the work is the sum of the query terms' posting-list lengths (what SPLADE's FLOPS term
minimises), not ``documents x vocab``. Queries go in blocks; each block's top-k is one ``argpartition``.

Example:
    >>> import scipy.sparse as sp
    >>> docs = sp.csr_matrix([[0, 2.0, 0], [1.0, 0, 0], [0, 1.0, 3.0]])
    >>> index = SparseIndex(3)
    >>> index.add(["a", "b", "c"], docs)
    >>> scores, ids = index.search(sp.csr_matrix([[0, 1.0, 1.0]]), k=2)
    >>> [index.ids[i] for i in ids[0]], scores[0].tolist()
    (['c', 'a'], [4.0, 2.0])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

# scores materialised per query block (floats): bounds the memory of a block's dense score rows
_BLOCK_SCORES = 1 << 24


class SparseIndex:
    """Documents' sparse vectors with their ids; :meth:`search` returns dot-product top-k."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.ids: list[str] = []
        self._parts: list[sp.csr_matrix] = []
        self._postings: sp.csc_matrix | None = None  # documents.T, built on first search after an add

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, ids: Sequence[str], vectors: sp.spmatrix | sp.sparray) -> None:
        """Add documents (``vectors``: ``(len(ids), dim)``, e.g. :meth:`SparseEncoder.encode_document`)."""
        matrix = sp.csr_matrix(vectors, dtype=np.float32)
        if matrix.shape != (len(ids), self.dim):
            raise ValueError(f"expected vectors of shape ({len(ids)}, {self.dim}), got {matrix.shape}")
        self.ids.extend(ids)
        self._parts.append(matrix)
        self._postings = None

    @property
    def postings(self) -> sp.csc_matrix:
        """The ``(vocab, documents)`` matrix whose column ``d`` is document ``d``'s vector (posting lists by row)."""
        if self._postings is None:
            documents = sp.vstack(self._parts, format="csr") if self._parts else sp.csr_matrix((0, self.dim))
            self._parts = [documents]
            self._postings = sp.csc_matrix(documents.T, dtype=np.float32)
        return self._postings

    def search(self, queries: sp.spmatrix | sp.sparray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """``(scores, positions)``, each ``(queries, min(k, documents))``, best first; positions index
        :attr:`ids`."""
        queries = sp.csr_matrix(queries, dtype=np.float32)
        n, k = queries.shape[0], min(k, len(self.ids))
        scores, positions = np.zeros((n, k), np.float32), np.zeros((n, k), np.int64)
        if k == 0:
            return scores, positions
        block = max(1, _BLOCK_SCORES // len(self.ids))
        postings = self.postings
        for start in range(0, n, block):
            dense = (queries[start : start + block] @ postings).toarray()
            top = np.argpartition(-dense, k - 1, axis=1)[:, :k]
            top_scores = np.take_along_axis(dense, top, axis=1)
            order = np.argsort(-top_scores, axis=1, kind="stable")
            positions[start : start + block] = np.take_along_axis(top, order, axis=1)
            scores[start : start + block] = np.take_along_axis(top_scores, order, axis=1)
        return scores, positions
