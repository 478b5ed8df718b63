"""The server's searchable documents: texts and fields next to a vector index, persisted in one folder.

Layout of the folder::

    store.json        {"dim": 384, "index": "exact" | "flat" | "hnsw" | ... | "qdrant", "documents": n}
    documents.jsonl   one {"id", "text", "fields"} per line, in insertion order
    index/            the vector index (its own ``save`` format)

Vectors are L2-normalised before they go in, so scores are cosine similarities whatever the model does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embforge.retrieval.index.base import VectorIndex
from embforge.training.checkpoints import write_text_atomic

STORE_FILE = "store.json"
DOCS_FILE = "documents.jsonl"
INDEX_DIR = "index"


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _new_index(kind: str, dim: int, folder: Path | None, qdrant_url: str | None = None) -> VectorIndex:
    if kind == "qdrant":
        import os

        from embforge.retrieval.index.qdrant import QdrantIndex

        if qdrant_url is not None:
            return QdrantIndex(dim, url=qdrant_url, api_key=os.environ.get("QDRANT_API_KEY"))
        return QdrantIndex(dim, path=folder / INDEX_DIR if folder is not None else None)
    from embforge.retrieval.index.registry import create_index

    return create_index(kind, dim)


def _load_index(folder: Path) -> VectorIndex:
    meta = json.loads((folder / "index.json").read_text())
    if meta.get("backend") == "qdrant":
        import os

        from embforge.retrieval.index.qdrant import QdrantIndex

        return QdrantIndex.load(folder, api_key=os.environ.get("QDRANT_API_KEY"))
    from embforge.retrieval.index.registry import load_index

    return load_index(folder)


class DocumentStore:
    """Documents (id, text, fields) and their vectors; thread-safe; saved to ``folder`` by :meth:`save`.

    Args:
        dim: Vector size.
        folder: Where to persist (``None``: memory only).
        index: ``exact`` (numpy), a FAISS kind (``flat``, ``hnsw``, ...) or ``qdrant``.
        qdrant_url: With ``index="qdrant"``: a Qdrant server (API key from env ``QDRANT_API_KEY``) instead of
            the embedded local mode. The vectors live on the server; texts and fields stay in ``folder``.
    """

    def __init__(
        self,
        dim: int,
        *,
        folder: str | Path | None = None,
        index: str = "exact",
        qdrant_url: str | None = None,
    ) -> None:
        self.dim = dim
        self.folder = Path(folder) if folder is not None else None
        self.kind = index
        self.docs: dict[str, dict[str, Any]] = {}
        self.index = _new_index(index, dim, self.folder, qdrant_url)
        self._lock = threading.RLock()

    @classmethod
    def open(
        cls, folder: str | Path, *, dim: int, index: str = "exact", qdrant_url: str | None = None
    ) -> DocumentStore:
        """Load the store saved in ``folder``, or start an empty one there (``index`` picks its backend)."""
        root = Path(folder)
        meta_file = root / STORE_FILE
        if not meta_file.is_file():
            return cls(dim, folder=root, index=index, qdrant_url=qdrant_url)
        meta = json.loads(meta_file.read_text())
        if int(meta["dim"]) != dim:
            raise ValueError(
                f"{meta_file}: the index holds {meta['dim']}-d vectors but the model gives {dim}-d ones; "
                "serve it with the model that built it or use another --index folder"
            )
        store = cls.__new__(cls)
        store.dim, store.folder, store.kind = dim, root, meta["index"]
        store._lock = threading.RLock()
        store.docs = {}
        with open(root / DOCS_FILE, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{root / DOCS_FILE}:{line_no}:{err.colno}: {err.msg}") from err
                store.docs[doc["id"]] = {"text": doc["text"], "fields": doc.get("fields") or {}}
        store.index = _load_index(root / INDEX_DIR)
        if len(store.index) != len(store.docs):
            raise ValueError(
                f"{root}: {len(store.docs)} documents but {len(store.index)} vectors; the folder is inconsistent"
            )
        return store

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, documents: Sequence[dict[str, Any]], vectors: np.ndarray) -> None:
        """Add documents (``id``, ``text``, optional ``fields``) with their vectors, then persist."""
        with self._lock:
            ids = [d["id"] for d in documents]
            self.index.add(ids, _normalize(vectors))
            for doc in documents:
                self.docs[doc["id"]] = {"text": doc["text"], "fields": dict(doc.get("fields") or {})}
            self.save()

    def duplicates(self, ids: Sequence[str]) -> list[int]:
        """Positions of ids that are already stored or repeated within ``ids``."""
        seen: set[str] = set()
        out = []
        with self._lock:
            for pos, key in enumerate(ids):
                if key in self.docs or key in seen:
                    out.append(pos)
                seen.add(key)
        return out

    def search(self, queries: np.ndarray, k: int, *, with_text: bool = True) -> list[list[dict[str, Any]]]:
        """Top-``k`` documents per query vector: ``[{"id", "score", "text", "fields"}, ...]`` best first."""
        with self._lock:
            if not len(self.docs):
                return [[] for _ in range(len(queries))]
            scores, ids = self.index.search(_normalize(queries), k)
            results = []
            for row_scores, row_ids in zip(scores, ids):
                hits = []
                for score, key in zip(row_scores, row_ids):
                    hit: dict[str, Any] = {"id": key, "score": float(score)}
                    if with_text:
                        hit["text"] = self.docs[key]["text"]
                    hit["fields"] = self.docs[key]["fields"]
                    hits.append(hit)
                results.append(hits)
            return results

    def save(self) -> None:
        """Write documents, index and ``store.json`` to the folder (no-op for a memory-only store)."""
        if self.folder is None:
            return
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            lines = "".join(
                json.dumps({"id": key, **doc}, ensure_ascii=False) + "\n" for key, doc in self.docs.items()
            )
            write_text_atomic(self.folder / DOCS_FILE, lines)
            self.index.save(self.folder / INDEX_DIR)
            meta = {"dim": self.dim, "index": self.kind, "documents": len(self.docs)}
            write_text_atomic(self.folder / STORE_FILE, json.dumps(meta) + "\n")

    def close(self) -> None:
        """Save and release the index (Qdrant's local mode holds a lock on its folder)."""
        with self._lock:
            self.save()
            close = getattr(self.index, "close", None)
            if callable(close):
                close()
