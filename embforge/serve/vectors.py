"""The vector index beside the document rows: loaded from its own files, checked against the rows, caught up.

The rows (:mod:`embforge.serve.store`, SQLite) are the truth; the index is derived from them. An ``exact`` store
keeps no index files: its vectors are read from the rows on open. Other kinds save their index to ``index/`` with
``rows.json`` (``{"seq": s}``: the index holds the rows ``1..s``). Opening loads it, checks that it holds exactly
the ids of those rows (else rebuilds it from the rows, with a warning) and adds the rows after ``s``.

Adds cost the vectors they add, whatever the kind. An exact index appends in amortised constant time, so it takes
adds directly. A graph or trained index does not: FAISS's HNSW ``add`` costs time in proportion to the whole index
(150-270 ms for 8 vectors at 10k on a 2-core VM) and an IVF/PQ index trains on its first ``add``. For those, adds
go to a small exact *delta*, searches merge the main index's and the delta's hits by score, and
:meth:`StoreIndex.merge` (off the request path) moves a frozen delta into the main index in one batch: into a copy
for FAISS (searches keep using the old one until a swap under the lock), in place under the lock otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from embforge.files import atomic_dir
from embforge.retrieval.index.base import IDS_FILE, VectorIndex, read_ids
from embforge.retrieval.index.exact import NumpyIndex
from embforge.retrieval.index.registry import create_index, load_index

INDEX_DIR = "index"
STORAGE_DIR = "storage"  # where an index that keeps its own files (Qdrant's embedded mode) lives
ROWS_FILE = "rows.json"
log = logging.getLogger("embforge.store")


class Rows(Protocol):
    """What the index needs from the rows: their ids and vectors in the order they were added (``seq`` 1, 2, ...)."""

    def ids_upto(self, seq: int) -> list[str]:
        """Ids of the rows ``1..seq``, in order."""
        ...

    def vectors_after(self, seq: int) -> Iterator[tuple[list[str], np.ndarray, int]]:
        """Blocks ``(ids, vectors, last seq)`` of the rows after ``seq``, in order."""
        ...


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


class StoreIndex:
    """A main index holding the rows ``1..seq`` plus, for kinds whose ``add`` is not cheap, an exact delta."""

    def __init__(self, main: VectorIndex, *, seq: int = 0) -> None:
        self.main = main
        self.dim = main.dim
        self.seq = seq  # last row in main
        self.tiered = not isinstance(main, NumpyIndex)
        self.active = NumpyIndex(self.dim)
        self.active_seq = seq
        self.frozen: NumpyIndex | None = None
        self.frozen_seq = seq

    def add(self, ids: Sequence[str], vectors: np.ndarray, seq: int) -> None:
        """Add the rows up to ``seq``; an id already here is an error, as in any index."""
        if not self.tiered:
            self.main.add(ids, vectors)
            self.seq = self.active_seq = seq
            return
        deltas = [d for d in (self.active, self.frozen) if d is not None]
        clash = next((key for key in ids if any(d.has(key) for d in deltas)), None)  # the rows checked main
        if clash is not None:
            raise ValueError(f"index.add: id {clash!r} is already in the index (ids must be unique)")
        self.active.add(ids, vectors)
        self.active_seq = seq

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

    def pending(self) -> int:
        """Vectors not yet in the main index."""
        return len(self.active) + (len(self.frozen) if self.frozen is not None else 0)

    def freeze(self) -> bool:
        """At a cut (the caller holds the store's locks): the delta becomes frozen for :meth:`merge`, new adds go
        to a fresh one. Returns whether there is anything to merge."""
        if not self.tiered or not self.pending():
            return False
        if self.frozen is not None and len(self.active):  # a merge failed last time: carry on with both
            self.frozen.add(self.active.ids, self.active.vectors)
        elif self.frozen is None:
            self.frozen = self.active
        self.frozen_seq = self.active_seq
        self.active = NumpyIndex(self.dim)
        return True

    def merge(self, lock: threading.RLock) -> Callable[[Path], None]:
        """Move the frozen delta into the main index (outside ``lock`` where the index can be copied); returns
        the main index's snapshot writer, which then holds the rows ``1..seq``."""
        frozen = self.frozen
        if frozen is not None:  # ids the main index already has (a remote one may) are not added twice
            frozen = _without(frozen, self.main)
        if frozen is not None and len(frozen):
            copy = getattr(self.main, "copy", None)
            if callable(copy):
                merged = copy()
                merged.add(frozen.ids, frozen.vectors)
                with lock:
                    self.main, self.frozen, self.seq = merged, None, self.frozen_seq
            else:
                with lock:
                    self.main.add(frozen.ids, frozen.vectors)
                    self.frozen, self.seq = None, self.frozen_seq
        else:
            self.frozen, self.seq = None, self.frozen_seq
        return self.main.snapshot()

    def close(self) -> None:
        self.main.close()


def _without(delta: NumpyIndex, main: VectorIndex) -> NumpyIndex:
    keep = [i for i, key in enumerate(delta.ids) if not main.has(key)]
    if len(keep) == len(delta):
        return delta
    rest = NumpyIndex(delta.dim)
    rest.add([delta.ids[i] for i in keep], delta.vectors[keep])
    return rest


def save_index(folder: Path, write: Callable[[Path], None], seq: int) -> None:
    """``folder/index``: the index's files and ``rows.json``, swapped in atomically."""

    def fill(tmp: Path) -> None:
        write(tmp)
        (tmp / ROWS_FILE).write_text(json.dumps({"seq": seq}) + "\n")

    atomic_dir(folder / INDEX_DIR, fill)


def _saved(folder: Path, rows: Rows, *, storage: Path) -> tuple[VectorIndex, int] | None:
    """The saved index and the rows it holds, if it matches them; ``None`` (rebuild) otherwise."""
    path = folder / INDEX_DIR
    if not (path / ROWS_FILE).exists():
        path = folder / (INDEX_DIR + ".old")  # a save cut between its two renames leaves the old one here
    if not (path / ROWS_FILE).exists():
        return None
    try:
        seq = int(json.loads((path / ROWS_FILE).read_text())["seq"])
        index = load_index(path, storage=storage)
        expected = rows.ids_upto(seq)
        saved = read_ids(path) if (path / IDS_FILE).exists() else None
        if len(expected) != seq or (saved is not None and saved != expected) or len(index) < seq:
            index.close()
            raise ValueError(f"it holds {len(index)} vectors, the rows 1..{seq} are {len(expected)}")
    except (OSError, ValueError, KeyError) as err:
        log.warning("%s does not match the documents (%s); rebuilding it from them", path, err)
        return None
    return index, seq


def load_vectors(
    folder: Path | None, rows: Rows, *, kind: str, dim: int, options: Mapping[str, object]
) -> StoreIndex:
    """The index of a store's rows: the saved one when it matches them (not for ``exact``), caught up with the
    rows added after it; or a new one built from all the rows."""
    storage = None if folder is None else folder / STORAGE_DIR
    found = None if kind == "exact" or folder is None else _saved(folder, rows, storage=folder / STORAGE_DIR)
    if found is None:
        found = create_index(kind, dim, storage=storage, **options), 0
    index = StoreIndex(found[0], seq=found[1])
    for ids, vectors, last in rows.vectors_after(index.seq):
        fresh = [i for i, key in enumerate(ids) if not index.main.has(key)]  # a remote index may hold them
        index.add([ids[i] for i in fresh], vectors[fresh], last)
    return index
