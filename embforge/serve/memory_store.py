"""The in-memory document store of kinds whose vectors an ``--index`` folder cannot hold (sparse rows, token
matrices): texts and fields by id, and the kind's own index over the rows (:class:`KindIndex`).

It answers the same :class:`~embforge.serve.serving.SearchStore` contract as the folder store: an add is checked
for stored or repeated ids under the store's lock, with the write, so of concurrent adds of one id exactly one
succeeds; searches take the same lock (the kinds' indexes build their search structures lazily).

Example:
    >>> import numpy as np
    >>> class Dot:
    ...     kind = "dot"
    ...     def __init__(self): self.ids, self.rows = [], []
    ...     def add(self, ids, rows): self.ids += ids; self.rows += list(rows)
    ...     def search(self, queries, k):
    ...         scores = np.array([[float(q @ r) for r in self.rows] for q in queries])
    ...         top = np.argsort(-scores, axis=1)[:, :k]
    ...         return np.take_along_axis(scores, top, 1), [[self.ids[j] for j in row] for row in top]
    ...     def close(self): pass
    >>> store = MemoryStore(Dot())
    >>> store.add([{"id": "a", "text": "x"}, {"id": "b", "text": "y"}], np.eye(2))
    >>> [hit["id"] for hit in store.search(np.array([[0.0, 1.0]]), 1)[0]], store.duplicates(["b", "c", "c"])
    (['b'], [0, 2])
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from embforge.serve.documents import DuplicateIdError, Hit, StoredDocument, document_row, hit, taken


class KindIndex(Protocol):
    """A kind's search structure over its rows: ``add`` rows by id, ``search`` the top ``k`` of query rows."""

    kind: str  # what it is, e.g. ``inverted``, ``exact``, ``plaid`` (the store reports it)

    def add(self, ids: list[str], rows: np.ndarray) -> None: ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """``(scores, ids)`` per query, best first."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """Documents (id, text, fields) in memory, searched through ``index``; thread-safe."""

    def __init__(self, index: KindIndex) -> None:
        self.index = index
        self.kind = index.kind
        self._docs: dict[str, StoredDocument] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._docs)

    def duplicates(self, ids: Sequence[str]) -> list[int]:
        """Positions of ids that are already stored or repeated within ``ids``."""
        with self._lock:
            return taken(ids, self._docs)

    def add(self, documents: Sequence[Mapping[str, object]], vectors: np.ndarray) -> None:
        """Add documents with their rows (one per document).

        Raises:
            DuplicateIdError: an id is already stored or repeated (checked under the lock, with the write).
            ValueError: a document that cannot be stored; nothing was changed.
        """
        rows = [document_row(i, d) for i, d in enumerate(documents)]
        if len(vectors) != len(rows):
            raise ValueError(f"{len(rows)} documents and {len(vectors)} rows; they must match")
        ids = [key for key, _, _ in rows]
        with self._lock:
            dup = taken(ids, self._docs)
            if dup:
                raise DuplicateIdError(dup[0], ids[dup[0]])
            self.index.add(ids, vectors)
            self._docs.update(
                {key: {"text": text, "fields": json.loads(fields)} for key, text, fields in rows}
            )

    def search(self, queries: np.ndarray, k: int, *, with_text: bool = True) -> list[list[Hit]]:
        """Top-``k`` documents per query row: ``[{"id", "score", "text", "fields"}, ...]`` best first."""
        with self._lock:
            if not self._docs:
                return [[] for _ in range(len(queries))]
            scores, ids = self.index.search(queries, min(k, len(self._docs)))
            docs = {key: self._docs[key] for row in ids for key in row}
        results = []
        for row_scores, row_ids in zip(scores, ids):
            hits: list[Hit] = []
            for score, key in zip(row_scores, row_ids):
                hits.append(hit(key, score, docs[key], with_text=with_text))
            results.append(hits)
        return results

    def close(self) -> None:
        """Release the index (a PLAID index's temporary folder)."""
        self.index.close()
