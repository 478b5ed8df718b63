"""The server of the sparse and multi-vector kinds: one app (:func:`create_kind_app`) over a :class:`KindBackend`
that each kind supplies (:mod:`embforge.sparse.serve`, :mod:`embforge.multivector.serve`). Endpoints:

- ``POST /v1/embeddings`` ``{"input": [...], "input_type": "document" | "query"}``: each item's ``embedding`` is
  what the kind gives a text (``{indices, values, dim}``, or a list of token vectors);
- ``POST /index/documents`` ``{"documents": [{"id", "text"}]}``: encode and add documents to the kind's index;
- ``POST /search`` ``{"query": ..., "top_k": 10}``: top ``k`` of the added documents by the kind's score;
- ``GET /v1/models``, ``GET /health``.

Model calls run in a worker thread under one lock (one forward at a time). Errors are the main server's JSON
``{"error": {"message", "type", "param"}}``; a text is empty by the readers' rule (:func:`embforge.data.texts.is_blank`:
only whitespace or zero-width characters), as in the dense server.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from embforge._optional import require
from embforge.data.texts import is_blank

require("fastapi")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402


class KindEmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None
    input_type: Literal["document", "query"] = "document"


class KindSearchRequest(BaseModel):
    query: str | list[str]
    top_k: int = Field(default=10, ge=1, le=1000)
    return_text: bool = True


class KindDocument(BaseModel):
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class KindDocumentsRequest(BaseModel):
    documents: list[KindDocument]


def error_response(status: int, message: str, param: str | None) -> JSONResponse:
    """The main server's error body with ``status``."""
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param}}, status_code=status
    )


def checked_texts(items: str | list[str], field: str, max_inputs: int) -> list[str] | JSONResponse:
    """``items`` as a list of 1 to ``max_inputs`` non-empty texts, or the 422 that says what is wrong."""
    texts = [items] if isinstance(items, str) else list(items)
    if not texts or len(texts) > max_inputs:
        return error_response(422, f"'{field}' must hold 1 to {max_inputs} texts, got {len(texts)}", field)
    for i, text in enumerate(texts):
        if is_blank(text):
            return error_response(422, f"'{field}[{i}]' is empty", f"{field}[{i}]")
    return texts


class KindBackend(Protocol):
    """What a model kind gives the shared server: its encoder, its answer items and its searchable documents."""

    kind: str  # "sparse", "multivector": the ``kind`` of /v1/models and /health
    dim: int

    def encode(self, texts: list[str], is_query: bool) -> Any:
        """The kind's vectors of ``texts`` (called in a worker thread, one call at a time)."""

    def items(self, vectors: Any) -> tuple[list[dict[str, object]], dict[str, int]]:
        """Each text's fields in a /v1/embeddings answer (its ``embedding`` ...), and the answer's ``usage``."""

    def ids(self) -> Sequence[str]:
        """The ids of the documents added so far, in the order they were added."""

    def add(self, ids: list[str], texts: list[str], vectors: Any) -> None:
        """Add documents (their ids are new)."""

    def search(self, vectors: Any, k: int) -> list[list[tuple[str, float]]]:
        """Each query's top ``k`` documents as ``(id, score)``, best first."""

    def text(self, doc_id: str) -> str:
        """The text of an added document."""


def create_kind_app(backend: KindBackend, *, name: str, max_inputs: int = 2048) -> FastAPI:
    """A FastAPI app serving ``backend`` under the model name ``name`` (see the module docstring)."""
    app = FastAPI(title=f"embforge ({backend.kind})")
    lock = threading.Lock()

    def encode(texts: list[str], is_query: bool) -> Any:
        with lock:
            return backend.encode(texts, is_query)

    @app.post("/v1/embeddings")
    async def embeddings(body: KindEmbeddingRequest) -> Any:
        texts = checked_texts(body.input, "input", max_inputs)
        if isinstance(texts, JSONResponse):
            return texts
        vectors = await asyncio.to_thread(encode, texts, body.input_type == "query")
        items, usage = backend.items(vectors)
        data = [{"object": "embedding", "index": i, **item} for i, item in enumerate(items)]
        return {"object": "list", "data": data, "model": name, "usage": usage}

    @app.post("/index/documents")
    async def add_documents(body: KindDocumentsRequest) -> Any:
        ids = [d.id for d in body.documents]
        clash = sorted(set(ids) & set(backend.ids())) or sorted(i for i, n in Counter(ids).items() if n > 1)
        if clash:
            return error_response(409, f"document id {clash[0]!r} is already in the index", "documents")
        texts = [d.text for d in body.documents]
        vectors = await asyncio.to_thread(encode, texts, False)
        with lock:
            backend.add(ids, texts, vectors)
        return {"added": len(ids), "total": len(backend.ids())}

    @app.post("/search")
    async def search(body: KindSearchRequest) -> Any:
        queries = checked_texts(body.query, "query", max_inputs)
        if isinstance(queries, JSONResponse):
            return queries
        if not backend.ids():
            return error_response(409, "the index is empty; add documents with POST /index/documents", None)
        vectors = await asyncio.to_thread(encode, queries, True)
        found = await asyncio.to_thread(backend.search, vectors, body.top_k)
        results = []
        for query, top in zip(queries, found):
            hits: list[dict[str, object]] = [
                {"id": d, "score": float(s), **({"text": backend.text(d)} if body.return_text else {})}
                for d, s in top
            ]
            results.append({"query": query, "hits": hits})
        return {"model": name, "results": results}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        entry = {
            "id": name,
            "object": "model",
            "owned_by": "embforge",
            "kind": backend.kind,
            "dim": backend.dim,
        }
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> dict[str, object]:
        return {"status": "ok", "model": name, "kind": backend.kind, "documents": len(backend.ids())}

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, err: ValueError) -> JSONResponse:
        return error_response(422, str(err), None)

    return app
