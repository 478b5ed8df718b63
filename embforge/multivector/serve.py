"""The server of a multi-vector (ColBERT) model: token vectors from ``/v1/embeddings``, MaxSim ``/search``.

:func:`embforge.serve.app.create_app` hands a multi-vector model here (its kind is declared,
:mod:`embforge.kinds`). Endpoints:

- ``POST /v1/embeddings`` ``{"input": [...], "input_type": "document" | "query"}``: each item's ``embedding`` is
  the text's token vectors (a list of ``dim``-float lists, masked tokens dropped), as pylate's ``encode`` gives;
- ``POST /index/documents`` ``{"documents": [{"id", "text"}]}``: encode and add documents to the index;
- ``POST /search`` ``{"query": ..., "top_k": 10}``: MaxSim top ``k`` over the added documents — exact, or through
  a PLAID index (``index="plaid"``, fast-plaid; rebuilt over the whole corpus after documents are added);
- ``GET /v1/models``, ``GET /health``.

Model calls run in a worker thread under one lock (one forward at a time); errors are the main server's JSON
``{"error": {"message", "type", "param"}}``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import numpy as np

from embforge._optional import require
from embforge.multivector.model import MultiVectorEncoder
from embforge.multivector.search import MultiVectorIndex, create_multivector_index

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


class _Corpus:
    """Documents by id with their token matrices, and the index over them (rebuilt when stale)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.matrices: list[np.ndarray] = []
        self.index: MultiVectorIndex | None = None

    def add(self, ids: list[str], texts: list[str], matrices: list[np.ndarray]) -> None:
        self.ids += ids
        self.texts += texts
        self.matrices += matrices
        self.index = None

    def search(self, queries: list[np.ndarray], k: int) -> tuple[np.ndarray, list[list[str]]]:
        if self.index is None:
            self.index = create_multivector_index(self.kind)
            self.index.add(self.ids, self.matrices)
        return self.index.search(queries, min(k, len(self.ids)))


def create_multivector_app(
    model: MultiVectorEncoder, *, name: str = "colbert", index: str = "exact", max_inputs: int = 2048
) -> Any:
    """A FastAPI app serving ``model`` (see the module docstring); ``index``: ``exact`` or ``plaid``."""
    app = FastAPI(title="embforge (multi-vector)")
    corpus = _Corpus(index)
    lock = threading.Lock()

    def encode(texts: list[str], is_query: bool) -> list[np.ndarray]:
        with lock:
            return model.encode(texts, is_query=is_query)

    def texts_of(items: str | list[str], field: str) -> list[str] | JSONResponse:
        return checked_texts(items, field, max_inputs)

    @app.post("/v1/embeddings")
    async def embeddings(body: KindEmbeddingRequest) -> Any:
        texts = texts_of(body.input, "input")
        if isinstance(texts, JSONResponse):
            return texts
        matrices = await asyncio.to_thread(encode, texts, body.input_type == "query")
        data = [
            {"object": "embedding", "index": i, "embedding": m.tolist(), "tokens": len(m)}
            for i, m in enumerate(matrices)
        ]
        used = sum(len(m) for m in matrices)
        return {"object": "list", "data": data, "model": name, "usage": {"total_tokens": used}}

    @app.post("/index/documents")
    async def add_documents(body: KindDocumentsRequest) -> Any:
        ids = [d.id for d in body.documents]
        clash = sorted(set(ids) & set(corpus.ids)) or sorted(i for i, n in Counter(ids).items() if n > 1)
        if clash:
            return error_response(409, f"document id {clash[0]!r} is already in the index", "documents")
        texts = [d.text for d in body.documents]
        matrices = await asyncio.to_thread(encode, texts, False)
        corpus.add(ids, texts, matrices)
        return {"added": len(ids), "total": len(corpus.ids)}

    @app.post("/search")
    async def search(body: KindSearchRequest) -> Any:
        queries = texts_of(body.query, "query")
        if isinstance(queries, JSONResponse):
            return queries
        if not corpus.ids:
            return error_response(409, "the index is empty; add documents with POST /index/documents", None)
        matrices = await asyncio.to_thread(encode, queries, True)
        scores, ids = await asyncio.to_thread(corpus.search, matrices, body.top_k)
        position = {d: i for i, d in enumerate(corpus.ids)}
        results = []
        for query, row, found in zip(queries, scores, ids):
            hits: list[dict[str, Any]] = [{"id": d, "score": float(s)} for d, s in zip(found, row)]
            if body.return_text:
                for hit, doc in zip(hits, found):
                    hit["text"] = corpus.texts[position[doc]]
            results.append({"query": query, "hits": hits})
        return {"model": name, "results": results}

    @app.get("/v1/models")
    async def models() -> Any:
        entry = {
            "id": name,
            "object": "model",
            "owned_by": "embforge",
            "kind": "multivector",
            "dim": model.dim,
        }
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "model": name, "kind": "multivector", "documents": len(corpus.ids)}

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, err: ValueError) -> JSONResponse:
        return error_response(422, str(err), None)

    return app
