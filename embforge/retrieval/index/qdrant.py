"""Qdrant backend of :class:`VectorIndex`: the scale-out path for search beyond one machine.

Three modes behind the same interface:

- in memory (``QdrantIndex(dim)``) and local on disk (``QdrantIndex(dim, path=DIR)``): qdrant-client's embedded
  mode, no server, used in tests;
- remote (``QdrantIndex(dim, url="http://qdrant:6333", api_key=...)``): a Qdrant server or cluster; the
  collection lives there and :meth:`save` only records where it is.

Qdrant point ids must be integers or UUIDs, so a string id is mapped to a UUID5 and kept in the payload
(``_id``). Scores are inner products (``Distance.DOT``), like the other backends.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from embforge._optional import require
from embforge.files import write_text_atomic
from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.exact import check_queries, check_vectors

_NAMESPACE = uuid.UUID("6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
_STORAGE = "storage"
_UPSERT_BATCH = 256


def point_id(key: str) -> str:
    """The Qdrant point id (a UUID5 string) of an embforge string id."""
    return str(uuid.uuid5(_NAMESPACE, key))


class QdrantIndex(VectorIndex):
    """Vectors in a Qdrant collection, searched by inner product.

    Args:
        dim: Vector size.
        path: Local (embedded) storage folder; the data lives in ``path/storage``. ``None`` with no ``url``:
            in memory.
        url: A Qdrant server, e.g. ``http://127.0.0.1:6333`` (remote mode).
        api_key: Qdrant API key for remote mode (default: env ``QDRANT_API_KEY``).
        collection: Collection name (created when missing).
    """

    def __init__(
        self,
        dim: int,
        *,
        path: str | Path | None = None,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = "embforge",
    ) -> None:
        qdrant = require("qdrant_client")
        self.dim = int(dim)
        self.collection = collection
        self.url = url
        self.path = Path(path) if path is not None else None
        if url is not None:
            self.client = qdrant.QdrantClient(url=url, api_key=api_key or os.environ.get("QDRANT_API_KEY"))
        elif self.path is not None:
            (self.path / _STORAGE).mkdir(parents=True, exist_ok=True)
            self.client = qdrant.QdrantClient(path=str(self.path / _STORAGE))
        else:
            self.client = qdrant.QdrantClient(location=":memory:")
        if not self.client.collection_exists(collection):
            models = qdrant.models
            self.client.create_collection(
                collection, vectors_config=models.VectorParams(size=self.dim, distance=models.Distance.DOT)
            )
        else:
            size = self.client.get_collection(collection).config.params.vectors.size
            if size != self.dim:
                raise ValueError(f"Qdrant collection {collection!r} holds {size}-d vectors, not {self.dim}-d")

    def _existing(self, ids: Sequence[str]) -> set[str]:
        found = self.client.retrieve(self.collection, ids=[point_id(i) for i in ids], with_payload=True)
        return {p.payload["_id"] for p in found}

    def has(self, key: str) -> bool:
        return bool(self._existing([key]))

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        array = check_vectors(ids, vectors, self.dim, self._existing(ids))
        models = require("qdrant_client").models
        for start in range(0, len(ids), _UPSERT_BATCH):
            points = [
                models.PointStruct(id=point_id(key), vector=vec.tolist(), payload={"_id": key})
                for key, vec in zip(ids[start : start + _UPSERT_BATCH], array[start : start + _UPSERT_BATCH])
            ]
            self.client.upsert(self.collection, points=points, wait=True)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        array = check_queries(queries, self.dim, k)
        models = require("qdrant_client").models
        requests = [models.QueryRequest(query=q.tolist(), limit=k, with_payload=True) for q in array]
        responses = self.client.query_batch_points(self.collection, requests=requests) if len(array) else []
        width = min(k, len(self))
        scores = np.zeros((len(array), width), dtype=np.float32)
        ids: list[list[str]] = []
        for row, response in enumerate(responses):
            points = response.points[:width]
            scores[row, : len(points)] = [p.score for p in points]
            ids.append([p.payload["_id"] for p in points])
        return scores, ids

    def _all_points(self) -> tuple[list[str], np.ndarray]:
        keys: list[str] = []
        vectors: list[list[float]] = []
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=1024, offset=offset, with_payload=True, with_vectors=True
            )
            keys += [p.payload["_id"] for p in points]
            vectors += [p.vector for p in points]
            if offset is None:
                break
        return keys, np.asarray(vectors, dtype=np.float32).reshape(len(keys), self.dim)

    def save(self, path: str | Path) -> None:
        """Record the collection in ``path/index.json``; local data already in ``path`` is not copied again.

        An in-memory index, or a local one saved to another folder, copies its points into
        ``path/storage``. A remote index stores only the URL and collection name (the data is on the server;
        the API key is not written).
        """
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        meta: dict[str, object] = {"backend": "qdrant", "dim": self.dim, "collection": self.collection}
        if self.url is not None:
            meta["url"] = self.url
        elif self.path is None or self.path.resolve() != folder.resolve():
            keys, vectors = self._all_points()
            copy = QdrantIndex(self.dim, path=folder, collection=self.collection)
            try:
                if len(copy):
                    copy.client.delete_collection(self.collection)
                    copy = QdrantIndex(self.dim, path=folder, collection=self.collection)
                if keys:
                    copy.add(keys, vectors)
            finally:
                copy.close()
        write_text_atomic(folder / "index.json", json.dumps(meta) + "\n")

    def snapshot(self) -> Callable[[Path], None]:
        """A remote or on-disk collection already persists itself: the snapshot records where it is
        (``"external": true``; :meth:`load` is then given the storage folder). An in-memory one is copied."""
        if self.url is None and self.path is None:
            return super().snapshot()
        meta: dict[str, object] = {"backend": "qdrant", "dim": self.dim, "collection": self.collection}
        meta.update({"external": True, **({"url": self.url} if self.url is not None else {})})

        def write(folder: Path) -> None:
            (folder / "index.json").write_text(json.dumps(meta) + "\n")

        return write

    @classmethod
    def load(
        cls, path: str | Path, *, api_key: str | None = None, storage: str | Path | None = None
    ) -> QdrantIndex:
        """Open what :meth:`save` (or :meth:`snapshot`) recorded in ``path``: local storage in ``path`` (or in
        ``storage`` for a snapshot of an external collection), or the remote collection."""
        folder = Path(path)
        meta_file = folder / "index.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{meta_file} does not exist: {path} is not a saved Qdrant index")
        meta = json.loads(meta_file.read_text())
        if meta.get("backend") != "qdrant":
            raise ValueError(f"{meta_file}: backend is {meta.get('backend')!r}, not 'qdrant'")
        if "url" in meta:
            return cls(meta["dim"], url=meta["url"], api_key=api_key, collection=meta["collection"])
        if meta.get("external"):
            if storage is None:
                raise ValueError(f"{meta_file}: the collection is stored elsewhere; pass its storage folder")
            return cls(meta["dim"], path=storage, collection=meta["collection"])
        return cls(meta["dim"], path=folder, collection=meta["collection"])

    def close(self) -> None:
        """Release the client (local mode locks its folder until closed)."""
        self.client.close()

    def __len__(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)
