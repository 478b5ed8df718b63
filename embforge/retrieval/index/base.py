"""The interface every vector index implements."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class VectorIndex(abc.ABC):
    """Ids + float32 vectors, searchable by inner product (cosine when the vectors are L2-normalised).

    Implementations: ``embforge.retrieval.index.exact.NumpyIndex`` (exact, no dependency),
    ``embforge.retrieval.index.faiss.FaissIndex`` (flat / HNSW / IVF-PQ) and
    ``embforge.retrieval.index.qdrant.QdrantIndex`` (local or remote Qdrant).
    """

    dim: int

    @abc.abstractmethod
    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Add ``len(ids)`` vectors of shape ``(n, dim)``; an id already present is an error."""

    @abc.abstractmethod
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        """Top-``k`` per query: ``(scores (q, k') float32, ids)`` best first, ``k' = min(k, len(self))``."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the index to a folder (atomically: a reader never sees a half-written index)."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | Path) -> VectorIndex:
        """Read an index written by :meth:`save`."""

    @abc.abstractmethod
    def __len__(self) -> int: ...
