"""The server of a sparse (SPLADE) model: ``{indices, values}`` from ``/v1/embeddings``, inverted-index ``/search``.

:func:`embforge.serve.app.create_app` hands a sparse model here (its kind is declared, :mod:`embforge.kinds`).
Endpoints:

- ``POST /v1/embeddings`` ``{"input": [...], "input_type": "document" | "query"}``: each item's ``embedding`` is
  ``{"indices": [...], "values": [...], "dim": vocab}`` — the active vocabulary dimensions and their weights
  (queries of an inference-free model come from its query table);
- ``POST /index/documents`` ``{"documents": [{"id", "text"}]}``: encode and add documents to the inverted index;
- ``POST /search`` ``{"query": ..., "top_k": 10}``: dot-product top ``k`` (:class:`~embforge.sparse.index.SparseIndex`);
- ``GET /v1/models``, ``GET /health``.

Model calls run in a worker thread under one lock; errors are the main server's JSON
``{"error": {"message", "type", "param"}}``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import scipy.sparse as sp

from embforge._optional import require
from embforge.sparse.index import SparseIndex
from embforge.sparse.model import SparseEncoder

require("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from embforge.serve.kind_api import (  # noqa: E402
    KindDocumentsRequest,
    KindEmbeddingRequest,
    KindSearchRequest,
    checked_texts,
    error_response,
)


def sparse_items(vectors: sp.csr_matrix) -> list[dict[str, Any]]:
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


def create_sparse_app(model: SparseEncoder, *, name: str = "splade", max_inputs: int = 2048) -> Any:
    """A FastAPI app serving ``model`` (see the module docstring)."""
    app = FastAPI(title="embforge (sparse)")
    index = SparseIndex(model.dim)
    texts_by_id: dict[str, str] = {}
    lock = threading.Lock()

    def encode(texts: list[str], query: bool) -> sp.csr_matrix:
        with lock:
            return model.encode_query(texts) if query else model.encode_document(texts)

    def texts_of(items: str | list[str], field: str) -> list[str] | JSONResponse:
        return checked_texts(items, field, max_inputs)

    @app.post("/v1/embeddings")
    async def embeddings(body: KindEmbeddingRequest) -> Any:
        texts = texts_of(body.input, "input")
        if isinstance(texts, JSONResponse):
            return texts
        vectors = await asyncio.to_thread(encode, texts, body.input_type == "query")
        data = [
            {"object": "embedding", "index": i, "embedding": item}
            for i, item in enumerate(sparse_items(vectors))
        ]
        return {"object": "list", "data": data, "model": name, "usage": {"active_dims": int(vectors.nnz)}}

    @app.post("/index/documents")
    async def add_documents(body: KindDocumentsRequest) -> Any:
        ids = [d.id for d in body.documents]
        clash = sorted(set(ids) & set(texts_by_id)) or sorted(i for i, n in Counter(ids).items() if n > 1)
        if clash:
            return error_response(409, f"document id {clash[0]!r} is already in the index", "documents")
        texts = [d.text for d in body.documents]
        vectors = await asyncio.to_thread(encode, texts, False)
        with lock:
            index.add(ids, vectors)
            texts_by_id.update(zip(ids, texts))
        return {"added": len(ids), "total": len(index)}

    @app.post("/search")
    async def search(body: KindSearchRequest) -> Any:
        queries = texts_of(body.query, "query")
        if isinstance(queries, JSONResponse):
            return queries
        if not len(index):
            return error_response(409, "the index is empty; add documents with POST /index/documents", None)
        vectors = await asyncio.to_thread(encode, queries, True)
        scores, positions = await asyncio.to_thread(index.search, vectors, body.top_k)
        results = []
        for query, row, found in zip(queries, scores.tolist(), positions.tolist()):
            hits = [{"id": index.ids[p], "score": s} for p, s in zip(found, row)]
            if body.return_text:
                for hit in hits:
                    hit["text"] = texts_by_id[hit["id"]]
            results.append({"query": query, "hits": hits})
        return {"model": name, "results": results}

    @app.get("/v1/models")
    async def models() -> Any:
        entry = {"id": name, "object": "model", "owned_by": "embforge", "kind": "sparse", "dim": model.dim}
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "model": name, "kind": "sparse", "documents": len(index)}

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, err: ValueError) -> JSONResponse:
        return error_response(422, str(err), None)

    return app
