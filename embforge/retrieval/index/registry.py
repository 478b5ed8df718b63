"""Create an index by kind and load any saved index folder (its ``index.json`` says which backend wrote it).

Kinds: ``exact`` (numpy), ``binary`` (sign-bit candidates re-scored with the float vectors), ``flat`` / ``hnsw`` / ``ivf`` / ``ivfpq`` / ``pq`` (FAISS) and ``qdrant``. Every caller
(evaluation, mining, ``index build``, the server's document store) goes through :func:`create_index` and
:func:`load_index`, so no caller special-cases a backend.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.binary import BinaryIndex
from embforge.retrieval.index.exact import NumpyIndex
from embforge.retrieval.index.faiss import FaissIndex
from embforge.retrieval.index.qdrant import QdrantIndex

INDEX_KINDS = ("exact", "flat", "hnsw", "ivf", "ivfpq", "pq", "qdrant", "binary")


def check_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`INDEX_KINDS`; a ``ValueError`` listing them otherwise."""
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    return kind


def create_index(kind: str, dim: int, *, storage: str | Path | None = None, **options: Any) -> VectorIndex:
    """A new empty index of ``kind``.

    Args:
        kind: One of :data:`INDEX_KINDS`.
        dim: Vector size.
        storage: A folder for an index that keeps its own data on disk (Qdrant's embedded mode); the others
            ignore it. ``None``: in memory.
        **options: Index options (FAISS: ``m``, ``nlist``, ``nprobe``, ...; Qdrant: ``url``, ``collection``).
    """
    check_kind(kind)
    if kind == "exact":
        if options:
            raise ValueError(f"the exact index takes no options, got {', '.join(options)}")
        return NumpyIndex(dim)
    if kind == "binary":
        unknown = set(options) - {"rescore"}
        if unknown:
            raise ValueError(f"binary index: unknown option(s) {', '.join(sorted(unknown))}; known: rescore")
        return BinaryIndex(dim, **options)
    if kind == "qdrant":
        unknown = set(options) - {"url", "collection", "api_key"}
        if unknown:
            raise ValueError(
                f"qdrant index: unknown option(s) {', '.join(sorted(unknown))}; known: url, collection"
            )
        url = options.get("url")
        return QdrantIndex(dim, path=None if url else storage, **options)

    return FaissIndex(dim, kind=kind, **options)


def load_index(path: str | Path, *, storage: str | Path | None = None) -> VectorIndex:
    """Load an index folder written by ``save`` (or a snapshot) of any backend; ``storage`` as in
    :func:`create_index`."""
    meta_file = Path(path) / "index.json"
    fallback = Path(path).with_name(Path(path).name + ".old")
    if (
        not meta_file.exists() and (fallback / "index.json").exists()
    ):  # a save was cut between its two renames
        path, meta_file = fallback, fallback / "index.json"
    if not meta_file.exists():
        raise FileNotFoundError(f"{meta_file} does not exist: {path} is not an embforge index folder")
    backend = json.loads(meta_file.read_text()).get("backend")
    if backend == "numpy":
        return NumpyIndex.load(path)
    if backend == "binary":
        return BinaryIndex.load(path)
    if backend == "faiss":
        return FaissIndex.load(path)
    if backend == "qdrant":
        return QdrantIndex.load(path, storage=storage)
    raise ValueError(f"{meta_file}: unknown index backend {backend!r} (known: numpy, binary, faiss, qdrant)")
