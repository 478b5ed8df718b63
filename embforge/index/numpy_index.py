"""Exact inner-product search with numpy: no dependency, the reference the approximate indexes are measured against."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embforge.checkpoint import atomic_dir
from embforge.index.base import VectorIndex

# score-matrix entries per search chunk (queries x vectors): 2**25 float32 = 128 MiB
_CHUNK_ENTRIES = 1 << 25


def check_vectors(ids: Sequence[str], vectors: np.ndarray, dim: int, known: set[str] | dict) -> np.ndarray:
    """Validate an ``add`` call and return the vectors as contiguous float32; errors name the offending id/shape."""
    array = np.ascontiguousarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"index.add: vectors must have shape (n, {dim}), got {tuple(array.shape)}")
    if len(ids) != len(array):
        raise ValueError(f"index.add: {len(ids)} ids for {len(array)} vectors")
    seen: set[str] = set()
    for i in ids:
        if i in known or i in seen:
            raise ValueError(f"index.add: id {i!r} is already in the index (ids must be unique)")
        seen.add(i)
    return array


def check_queries(queries: np.ndarray, dim: int, k: int) -> np.ndarray:
    array = np.ascontiguousarray(queries, dtype=np.float32)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"index.search: queries must have shape (q, {dim}), got {tuple(np.shape(queries))}")
    if k < 1:
        raise ValueError(f"index.search: k must be >= 1, got {k}")
    return array


def topk_inner_product(queries: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` rows of ``vectors`` per query by inner product: ``(scores, positions)``, best first.

    Ties are broken by position (lower first), so the result is deterministic. Queries go in chunks so the score
    matrix stays small for millions of vectors.
    """
    n = len(vectors)
    k = min(k, n)
    scores_out = np.empty((len(queries), k), dtype=np.float32)
    pos_out = np.empty((len(queries), k), dtype=np.int64)
    step = max(1, _CHUNK_ENTRIES // max(1, n))
    for start in range(0, len(queries), step):
        sims = queries[start : start + step] @ vectors.T
        if k < n:
            part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        else:
            part = np.broadcast_to(np.arange(n), sims.shape).copy()
        part_scores = np.take_along_axis(sims, part, axis=1)
        order = np.lexsort((part, -part_scores), axis=1)
        pos_out[start : start + step] = np.take_along_axis(part, order, axis=1)
        scores_out[start : start + step] = np.take_along_axis(part_scores, order, axis=1)
    return scores_out, pos_out


class NumpyIndex(VectorIndex):
    """Exact search over float32 vectors held in memory (brute force, chunked matrix products)."""

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.ids: list[str] = []
        self._positions: dict[str, int] = {}
        self._parts: list[np.ndarray] = []
        self._matrix: np.ndarray | None = None

    @property
    def vectors(self) -> np.ndarray:
        """All vectors as one ``(n, dim)`` float32 matrix, in the order they were added."""
        if self._matrix is None:
            self._matrix = np.concatenate(self._parts) if self._parts else np.empty((0, self.dim), np.float32)
            self._parts = [self._matrix] if len(self._matrix) else []
        return self._matrix

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        array = check_vectors(ids, vectors, self.dim, self._positions)
        for i in ids:
            self._positions[i] = len(self.ids)
            self.ids.append(i)
        self._parts.append(array)
        self._matrix = None

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        array = check_queries(queries, self.dim, k)
        if not self.ids:
            return np.empty((len(array), 0), dtype=np.float32), [[] for _ in range(len(array))]
        scores, positions = topk_inner_product(array, self.vectors, k)
        return scores, [[self.ids[p] for p in row] for row in positions]

    def save(self, path: str | Path) -> None:
        def write(folder: Path) -> None:
            np.save(folder / "vectors.npy", self.vectors)
            (folder / "ids.txt").write_text("".join(f"{i}\n" for i in self.ids), encoding="utf-8")
            (folder / "index.json").write_text(json.dumps({"backend": "numpy", "dim": self.dim}) + "\n")

        atomic_dir(Path(path), write)

    @classmethod
    def load(cls, path: str | Path) -> NumpyIndex:
        folder = Path(path)
        meta = json.loads((folder / "index.json").read_text())
        index = cls(meta["dim"])
        ids = (folder / "ids.txt").read_text(encoding="utf-8").splitlines()
        if ids:
            index.add(ids, np.load(folder / "vectors.npy"))
        return index

    def __len__(self) -> int:
        return len(self.ids)
