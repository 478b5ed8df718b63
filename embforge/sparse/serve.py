"""How the server serves a sparse (SPLADE) model: :class:`SparseServing`, its serving record
(:mod:`embforge.serve.serving`).

Each ``/v1/embeddings`` item's ``embedding`` is ``{"indices": [...], "values": [...], "dim": vocab}`` — the active
vocabulary dimensions (ascending) and their weights; ``input_type: "query"`` encodes queries (through the query
table of an inference-free model, with the model's ``query`` prompt), documents otherwise. A sparse vector has no
truncated, quantised or base64 form: ``dimensions`` and an ``encoding_format`` other than ``float`` are refused.
``/search`` ranks the documents added with ``/index/documents`` by dot product through an in-memory inverted index
(:class:`~embforge.sparse.index.SparseIndex`); ``/similarity`` scores a pair as ``/search`` would (the first text
as a query, the second as a document).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import numpy as np
import scipy.sparse as sp

from embforge.serve.memory_store import MemoryStore
from embforge.serve.middleware import ApiError
from embforge.serve.requests import InputType
from embforge.serve.serving import (
    BatchFn,
    Items,
    SearchStore,
    object_rows,
    refuse_index_options,
    refuse_ranges,
    refuse_task,
)
from embforge.sparse.index import SparseIndex
from embforge.sparse.model import SparseEncoder

KIND = "sparse"


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


def stacked(rows: np.ndarray) -> sp.csr_matrix:
    """The ``(n, vocab)`` matrix of an object array of one-row sparse matrices."""
    return sp.csr_matrix(sp.vstack(list(rows), format="csr"), dtype=np.float32)


class InvertedDocuments:
    """The documents' sparse rows in an inverted index (the memory store's :class:`KindIndex`)."""

    kind = "inverted"

    def __init__(self, dim: int) -> None:
        self.index = SparseIndex(dim)

    def add(self, ids: list[str], rows: np.ndarray) -> None:
        self.index.add(ids, stacked(rows))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        scores, positions = self.index.search(stacked(queries), k)
        return scores, [[self.index.ids[p] for p in row] for row in positions.tolist()]

    def close(self) -> None:
        """Nothing to release."""


class SparseServing:
    """A sparse model as the server serves it (see the module docstring)."""

    name = KIND
    pair_inputs: tuple[InputType | None, InputType | None] = ("query", "document")

    def __init__(self, model: SparseEncoder, *, ranges: np.ndarray | None = None) -> None:
        refuse_ranges(KIND, ranges)
        self.model = model
        self.dim = model.dim

    def batch_items(
        self,
        texts: list[str],
        *,
        input_type: InputType | None,
        prompt_name: str | None,
        task: str | None = None,
    ) -> tuple[Items, list[int]]:
        refuse_task(KIND, task)
        query = input_type == "query"
        name = prompt_name
        if name is None and (input_type or "document") in self.model.prompts:
            name = input_type or "document"
        try:
            prefix = self.model.prompt_text(None, name)
        except KeyError as err:
            raise ApiError(422, str(err.args[0]), "prompt_name") from None
        ids = self.model.tokenize_ids(texts, prefix=prefix, is_query=query)
        return ids, [len(x) for x in ids]

    def batched(self, max_tokens: int) -> BatchFn:
        model = self.model

        def run(ids: Items) -> np.ndarray:
            with model.inference():
                dense = model.forward_ids(ids, max_tokens=max_tokens, seed=None, places=list(range(len(ids))))
            matrix = sp.csr_matrix(dense.float().cpu().numpy())
            return object_rows([matrix[i] for i in range(matrix.shape[0])])

        return run

    def check(self, *, encoding_format: str, dimensions: int | None) -> None:
        if dimensions is not None:
            raise ApiError(
                422,
                "'dimensions' is not available for a sparse model: a sparse vector cannot be truncated (its "
                "dimensions are vocabulary terms)",
                "dimensions",
            )
        if encoding_format != "float":
            raise ApiError(
                422,
                f"'encoding_format' {encoding_format} is not available for a sparse model: a sparse vector cannot "
                "be int8-coded, binarised or sent as base64; it is sent as {indices, values} (use float)",
                "encoding_format",
            )

    def answer(
        self, rows: np.ndarray, *, encoding_format: str, dimensions: int | None
    ) -> list[dict[str, object]]:
        return [{"embedding": item} for item in sparse_items(stacked(rows))]

    def similarity(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """Dot product of each (query, document) pair."""
        return np.asarray(stacked(first).multiply(stacked(second)).sum(axis=1), dtype=np.float32).ravel()

    def open_store(
        self, given: SearchStore | None, *, kind: str | None, options: Mapping[str, object] | None = None
    ) -> SearchStore | None:
        refuse_index_options(options, "a sparse model's in-memory inverted index takes no options")
        if given is not None:
            raise ValueError(
                "a sparse model keeps its search documents in an in-memory inverted index (POST "
                "/index/documents); --index folders hold dense vectors: serve it without --index"
            )
        if kind not in (None, "exact", InvertedDocuments.kind):
            raise ValueError(
                f"a sparse model searches an in-memory inverted index; index kind {kind!r} is not available for it"
            )
        return MemoryStore(InvertedDocuments(self.dim))

    def describe(self) -> dict[str, object]:
        return {}
