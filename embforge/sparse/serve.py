"""The server of a sparse (SPLADE) model: ``{indices, values}`` from ``/v1/embeddings``, inverted-index ``/search``.

:func:`embforge.serve.app.create_app` hands a sparse model here (its kind is declared, :mod:`embforge.kinds`); the
app is the one of every non-dense kind (:func:`embforge.serve.kind_api.create_kind_app`). Each ``embedding`` is
``{"indices": [...], "values": [...], "dim": vocab}`` — the active vocabulary dimensions and their weights (queries
of an inference-free model come from its query table); ``/search`` ranks by dot product
(:class:`~embforge.sparse.index.SparseIndex`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import scipy.sparse as sp

from embforge.serve.kind_api import create_kind_app
from embforge.sparse.index import SparseIndex
from embforge.sparse.model import SparseEncoder

if TYPE_CHECKING:
    from fastapi import FastAPI


class SparseItem(TypedDict):
    """One sparse vector of a response: its active dimensions (ascending), their weights, the vocabulary size."""

    indices: list[int]
    values: list[float]
    dim: int


def sparse_items(vectors: sp.csr_matrix) -> list[SparseItem]:
    """One ``{"indices", "values", "dim"}`` per row, indices ascending."""
    vectors = sp.csr_matrix(vectors)
    vectors.sort_indices()
    rows = zip(vectors.indptr[:-1].tolist(), vectors.indptr[1:].tolist())
    return [
        {
            "indices": vectors.indices[a:b].tolist(),
            "values": vectors.data[a:b].tolist(),
            "dim": int(vectors.shape[1]),
        }
        for a, b in rows
    ]


class SparseBackend:
    """A sparse model and its inverted index, for :func:`~embforge.serve.kind_api.create_kind_app`."""

    kind = "sparse"

    def __init__(self, model: SparseEncoder) -> None:
        self.model = model
        self.dim = model.dim
        self.index = SparseIndex(model.dim)
        self.texts: dict[str, str] = {}

    def encode(self, texts: list[str], is_query: bool) -> sp.csr_matrix:
        return self.model.encode_query(texts) if is_query else self.model.encode_document(texts)

    def items(self, vectors: sp.csr_matrix) -> tuple[list[dict[str, object]], dict[str, int]]:
        return [{"embedding": item} for item in sparse_items(vectors)], {"active_dims": int(vectors.nnz)}

    def ids(self) -> Sequence[str]:
        return self.index.ids

    def add(self, ids: list[str], texts: list[str], vectors: sp.csr_matrix) -> None:
        self.index.add(ids, vectors)
        self.texts.update(zip(ids, texts))

    def search(self, vectors: sp.csr_matrix, k: int) -> list[list[tuple[str, float]]]:
        scores, positions = self.index.search(vectors, k)
        return [
            [(self.index.ids[p], s) for p, s in zip(found, row)]
            for row, found in zip(scores.tolist(), positions.tolist())
        ]

    def text(self, doc_id: str) -> str:
        return self.texts[doc_id]


def create_sparse_app(model: SparseEncoder, *, name: str = "splade", max_inputs: int = 2048) -> FastAPI:
    """A FastAPI app serving ``model`` (see the module docstring)."""
    return create_kind_app(SparseBackend(model), name=name, max_inputs=max_inputs)
