"""The document store's vectors in two tiers, so that an add costs the vectors it adds, whatever the index kind.

An exact index appends in amortised constant time, so it takes adds directly. A graph or trained index does not:
FAISS's HNSW ``add`` costs time in proportion to the whole index on every call (it sets up a lock per existing
vector; 150-270 ms for 8 vectors at 10k on the 2-core VM), and an IVF/PQ index trains on its first ``add``. For
those, adds go to a small exact *delta* index, searches merge the main index's and the delta's hits by score, and
compaction (off the request path) freezes the delta — new adds go to a fresh one — and merges it into the main
index in one batch: into a copy for FAISS (searches keep using the old one until a swap under the lock), in place
under the lock for other backends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.exact import NumpyIndex


def _merge(parts: list[tuple[np.ndarray, list[list[str]]]], k: int) -> tuple[np.ndarray, list[list[str]]]:
    """Per query, the ``k`` best of several ``(scores, ids)`` results, best first (earlier parts win ties)."""
    n_queries = len(parts[0][1])
    out_ids, out_scores = [], []
    for q in range(n_queries):
        hits = [(float(s), key) for scores, ids in parts for s, key in zip(scores[q], ids[q])]
        hits.sort(key=lambda hit: -hit[0])  # stable: the main index first among equal scores
        out_ids.append([key for _, key in hits[:k]])
        out_scores.append([s for s, _ in hits[:k]])
    width = max((len(row) for row in out_scores), default=0)
    scores = np.full((n_queries, width), -np.inf, dtype=np.float32)
    for q, row in enumerate(out_scores):
        scores[q, : len(row)] = row
    return scores, out_ids


class TieredIndex:
    """A main index plus, for kinds whose ``add`` is not cheap, an exact delta of recent adds."""

    def __init__(self, main: VectorIndex, *, tiered: bool = True) -> None:
        self.main = main
        self.dim = main.dim
        self.tiered = tiered and not isinstance(main, NumpyIndex)
        self.active = NumpyIndex(self.dim)
        self.frozen: NumpyIndex | None = None

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Add to the delta (or straight to an exact main index); duplicates are an error, as in any index."""
        if not self.tiered:
            self.main.add(ids, vectors)
            return
        deltas = [d for d in (self.active, self.frozen) if d is not None]
        clash = next((key for key in ids if any(d.has(key) for d in deltas)), None)  # the store checked main
        if clash is not None:
            raise ValueError(f"index.add: id {clash!r} is already in the index (ids must be unique)")
        self.active.add(ids, vectors)

    def has(self, key: str) -> bool:
        return (
            self.active.has(key) or (self.frozen is not None and self.frozen.has(key)) or self.main.has(key)
        )

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        parts = [self.main.search(queries, k)]
        for delta in (self.frozen, self.active):
            if delta is not None and len(delta):
                parts.append(delta.search(queries, k))
        return parts[0] if len(parts) == 1 else _merge(parts, k)

    def __len__(self) -> int:
        return len(self.main) + len(self.active) + (len(self.frozen) if self.frozen is not None else 0)

    def freeze(self) -> Callable[[Path], None] | None:
        """At a compaction's cut (the caller holds the store's locks): an exact main index is captured as it is
        (its snapshot writer is returned); otherwise the delta is frozen for :meth:`merge` and ``None`` returned."""
        if not self.tiered:
            return self.main.snapshot()
        if self.frozen is not None and len(self.active):  # a merge failed last time: carry on with both
            self.frozen.add(self.active.ids, self.active.vectors)
        elif self.frozen is None:
            self.frozen = self.active
        self.active = NumpyIndex(self.dim)
        return None

    def merge(self, lock: threading.RLock) -> Callable[[Path], None]:
        """Move the frozen delta into the main index (outside ``lock`` where the index can be copied), and return
        the main index's snapshot writer, which then holds exactly what was frozen."""
        frozen = self.frozen
        if frozen is not None:  # ids the main index already has (a remote one may) are not added twice
            keep = [i for i, key in enumerate(frozen.ids) if not self.main.has(key)]
            if len(keep) < len(frozen):
                rest = NumpyIndex(self.dim)
                rest.add([frozen.ids[i] for i in keep], frozen.vectors[keep])
                frozen = rest
        if frozen is not None and len(frozen):
            copy = getattr(self.main, "copy", None)
            if callable(copy):
                merged = copy()
                merged.add(frozen.ids, frozen.vectors)
                with lock:
                    self.main, self.frozen = merged, None
            else:
                with lock:
                    self.main.add(frozen.ids, frozen.vectors)
                    self.frozen = None
        else:
            self.frozen = None
        return self.main.snapshot()

    def close(self) -> None:
        self.main.close()
