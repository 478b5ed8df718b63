"""The interface every vector index implements, and the id file all of them write."""

from __future__ import annotations

import abc
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embforge.files import atomic_dir

IDS_FILE = "ids.jsonl"
LEGACY_IDS_FILE = "ids.txt"
META_FILE = "index.json"


def write_ids(folder: Path, ids: Sequence[str]) -> None:
    """``ids.jsonl``: one JSON string per line (ASCII), so ids with line breaks, U+2028 or U+0085 round-trip."""
    with open(folder / IDS_FILE, "w", encoding="ascii") as handle:
        for key in ids:
            handle.write(json.dumps(key, ensure_ascii=True) + "\n")


def read_ids(folder: Path) -> list[str]:
    """The ids written by :func:`write_ids` (or the ``ids.txt`` of indexes saved before it, one id a line)."""
    path = folder / IDS_FILE
    if not path.exists():
        legacy = folder / LEGACY_IDS_FILE
        return legacy.read_text(encoding="utf-8").split("\n")[:-1] if legacy.exists() else []
    ids = []
    with open(path, encoding="ascii") as handle:
        for line_no, line in enumerate(handle, start=1):
            try:
                ids.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}:{err.colno}: {err.msg}") from err
    return ids


def write_listing(folder: Path, ids: Sequence[str], meta: dict) -> None:
    """The files every saved in-memory index has besides its vectors: the ids and ``index.json`` (``meta``)."""
    write_ids(folder, ids)
    (folder / META_FILE).write_text(json.dumps(meta) + "\n")


def read_meta(path: str | Path) -> tuple[Path, dict]:
    """``(folder, its index.json)`` of a saved index."""
    folder = Path(path)
    return folder, json.loads((folder / META_FILE).read_text())


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
    def has(self, key: str) -> bool:
        """Whether ``key`` is in the index."""

    @abc.abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the index to a folder (atomically: a reader never sees a half-written index)."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | Path) -> VectorIndex:
        """Read an index written by :meth:`save`."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def snapshot(self) -> Callable[[Path], None]:
        """Capture the index as it is now; the returned ``write(folder)`` fills an empty folder with what
        :meth:`save` writes, later, even if vectors were added in between (the document store writes snapshots
        off the request path). This default saves a copy at once; indexes override it with cheaper captures."""
        staging = Path(tempfile.mkdtemp(prefix="embforge-snapshot-"))
        self.save(staging / "index")

        def write(folder: Path) -> None:
            for item in (staging / "index").iterdir():
                shutil.move(str(item), folder / item.name)
            shutil.rmtree(staging, ignore_errors=True)

        return write

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the index holds (files, clients); the default holds nothing."""


class InMemoryIndex(VectorIndex):
    """An index held in this process: :meth:`snapshot` captures its files, :meth:`save` swaps them in atomically."""

    @abc.abstractmethod
    def snapshot(self) -> Callable[[Path], None]:
        """Capture the index now; ``write(folder)`` writes its vectors and :func:`write_listing`'s files."""

    def save(self, path: str | Path) -> None:
        atomic_dir(Path(path), self.snapshot())  # readers see the old folder or the new one
