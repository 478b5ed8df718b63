"""Exact inner-product search with numpy: no dependency, the reference the approximate indexes are measured against."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from embforge.retrieval.index.base import InMemoryIndex, read_ids, read_meta, write_listing

if TYPE_CHECKING:
    import torch

# score-matrix entries per search tile (queries x vectors): 2**24 float32 = 64 MiB (1,024 x 16,384)
_CHUNK_ENTRIES = 1 << 24
_Index = TypeVar("_Index", bound="NumpyIndex")


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

    Ties are broken by position (lower first), so the result is deterministic. The score matrix is tiled — up to
    1,024 queries against blocks of vectors, at most ``_CHUNK_ENTRIES`` scores at a time — so each block of a
    million-vector matrix is read once per 1,024 queries rather than once per few queries, and each query keeps a
    running top ``k``. Products in numpy's BLAS (faster than torch's for these shapes on the CPUs we measured), the
    selection in torch (``topk`` is multi-threaded; ``np.argpartition`` is not, and was most of the time at 1M).
    """
    import torch  # here, not at import: a process that only stores vectors (the server's writer) skips it

    n = len(vectors)
    k = min(k, n)
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    scores_out = np.empty((len(queries), k), dtype=np.float32)
    pos_out = np.empty((len(queries), k), dtype=np.int64)
    q_step = min(len(queries), 1024)
    block = max(k, _CHUNK_ENTRIES // max(1, q_step))
    for start in range(0, len(queries), q_step):
        chunk = np.ascontiguousarray(queries[start : start + q_step], dtype=np.float32)
        best = (np.empty((len(chunk), 0), np.float32), np.empty((len(chunk), 0), np.int64))
        for first in range(0, n, block):
            sims = torch.from_numpy(chunk @ matrix[first : first + block].T)
            rows, scores, cols = _block_top(sims, k)
            best = _merge_top(best, (scores, cols + first), rows, k)
        scores_out[start : start + len(chunk)], pos_out[start : start + len(chunk)] = best
    return scores_out, pos_out


def _block_top(sims: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, scores, columns)`` of each row's top ``k`` in a score block, plus every score tied with a row's
    k-th (so that the lowest positions can win ties): ``topk(k + 1)``, and an exact pass over the rare rows whose
    k-th and (k+1)-th scores are equal."""
    import torch

    q, width = sims.shape
    values, columns = torch.topk(sims, min(k + 1, width), dim=1)
    if width <= k:
        return np.repeat(np.arange(q), width), values.numpy().ravel(), columns.numpy().ravel()
    tied = (values[:, k - 1] == values[:, k]).numpy()
    clean = np.flatnonzero(~tied)
    rows = [np.repeat(clean, k)]
    scores = [values.numpy()[clean, :k].ravel()]
    cols = [columns.numpy()[clean, :k].ravel()]
    if tied.any():
        ties = np.flatnonzero(tied)
        block = sims.numpy()[ties]
        r, c = np.nonzero(block >= values.numpy()[ties, k - 1 : k])
        rows, scores, cols = [*rows, ties[r]], [*scores, block[r, c]], [*cols, c]
    return np.concatenate(rows), np.concatenate(scores), np.concatenate(cols)


def _merge_top(
    best: tuple[np.ndarray, np.ndarray], found: tuple[np.ndarray, np.ndarray], found_rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ``k`` best of a running ``(scores, positions)`` top list and new ``(row, score, position)``
    candidates: highest score first, lower position first among equal scores."""
    q, held = best[0].shape
    rows = np.concatenate([np.repeat(np.arange(q), held), found_rows])
    scores = np.concatenate([best[0].ravel(), found[0]])
    positions = np.concatenate([best[1].ravel(), found[1]])
    order = np.lexsort((positions, -scores, rows))
    rows, scores, positions = rows[order], scores[order], positions[order]
    rank = np.arange(len(rows)) - np.searchsorted(rows, rows)
    keep = rank < k
    width = min(k, held + int(np.bincount(found_rows, minlength=q).min()))
    return scores[keep].reshape(q, width), positions[keep].reshape(q, width)


class NumpyIndex(InMemoryIndex):
    """Exact search over float32 vectors held in memory (brute force, chunked matrix products).

    Vectors live in one buffer that doubles when full, so an ``add`` costs the rows it adds (amortised), not a copy
    of the whole matrix; rows once written never change, which makes :meth:`snapshot` free.
    """

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.ids: list[str] = []
        self._positions: dict[str, int] = {}
        self._buffer = np.empty((0, self.dim), np.float32)

    @property
    def vectors(self) -> np.ndarray:
        """All vectors as one ``(n, dim)`` float32 matrix, in the order they were added."""
        return self._buffer[: len(self.ids)]

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        array = check_vectors(ids, vectors, self.dim, self._positions)
        n, need = len(self.ids), len(self.ids) + len(array)
        if need > len(self._buffer):
            grown = np.empty((max(need, 2 * len(self._buffer), 1024), self.dim), np.float32)
            grown[:n] = self._buffer[:n]
            self._buffer = grown  # a snapshot holding the old buffer keeps its (unchanged) rows
        self._buffer[n:need] = array
        for i in ids:
            self._positions[i] = len(self.ids)
            self.ids.append(i)

    def has(self, key: str) -> bool:
        return key in self._positions

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        array = check_queries(queries, self.dim, k)
        if not self.ids:
            return np.empty((len(array), 0), dtype=np.float32), [[] for _ in range(len(array))]
        scores, positions = topk_inner_product(array, self.vectors, k)
        return scores, [[self.ids[p] for p in row] for row in positions]

    def settings(self) -> dict[str, object]:
        """What ``index.json`` records besides the ids and vectors: the backend and what :meth:`from_settings`
        builds an empty index of this kind from."""
        return {"backend": "numpy", "dim": self.dim}

    @classmethod
    def from_settings(cls: type[_Index], meta: dict) -> _Index:
        """An empty index with the settings of an ``index.json`` written from :meth:`settings`."""
        return cls(meta["dim"])

    def snapshot(self) -> Callable[[Path], None]:
        ids, vectors = list(self.ids), self.vectors  # rows [0, n) are never written again
        meta = self.settings()

        def write(folder: Path) -> None:
            np.save(folder / "vectors.npy", vectors)
            write_listing(folder, ids, meta)

        return write

    @classmethod
    def load(cls: type[_Index], path: str | Path) -> _Index:
        folder, meta = read_meta(path)
        index = cls.from_settings(meta)
        ids = read_ids(folder)
        vectors = np.load(folder / "vectors.npy")
        if len(vectors) != len(ids):
            raise ValueError(f"{folder}: vectors.npy holds {len(vectors)} vectors but the id file {len(ids)}")
        if ids:
            index.add(ids, vectors)
        return index

    def __len__(self) -> int:
        return len(self.ids)
