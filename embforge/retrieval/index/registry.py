"""Create an index by name and load any saved index folder (its ``index.json`` says which backend wrote it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embforge.retrieval.index.base import VectorIndex

INDEX_KINDS = ("exact", "flat", "hnsw", "ivf", "ivfpq", "pq")


def create_index(kind: str, dim: int, **options: Any) -> VectorIndex:
    """``exact`` -> :class:`NumpyIndex`; ``flat``/``hnsw``/``ivf``/``ivfpq``/``pq`` -> :class:`FaissIndex`."""
    if kind == "exact":
        from embforge.retrieval.index.exact import NumpyIndex

        if options:
            raise ValueError(f"the exact index takes no options, got {', '.join(options)}")
        return NumpyIndex(dim)
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown index kind {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
    from embforge.retrieval.index.faiss import FaissIndex

    return FaissIndex(dim, kind=kind, **options)


def load_index(path: str | Path) -> VectorIndex:
    """Load an index folder written by ``save`` of any backend."""
    meta_file = Path(path) / "index.json"
    if not meta_file.exists():
        raise FileNotFoundError(f"{meta_file} does not exist: {path} is not an embforge index folder")
    backend = json.loads(meta_file.read_text()).get("backend")
    if backend == "numpy":
        from embforge.retrieval.index.exact import NumpyIndex

        return NumpyIndex.load(path)
    if backend == "faiss":
        from embforge.retrieval.index.faiss import FaissIndex

        return FaissIndex.load(path)
    raise ValueError(f"{meta_file}: unknown index backend {backend!r} (known: numpy, faiss)")
