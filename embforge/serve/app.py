"""``create_app(...)``: the FastAPI app of the embedding server (OpenAI-compatible embeddings, rerank, search).

Endpoints: ``POST /v1/embeddings``, ``POST /rerank``, ``POST /similarity``, ``POST /search``,
``POST /index/documents``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Several embedders and rerankers
can be served at once (:mod:`embforge.serve.models`; the request's ``model`` picks one). Model calls go through a
token-budget :class:`MicroBatcher` per model, so concurrent requests share batches. ``encoding_format`` may ask for
quantised vectors (``int8``, ``uint8``, ``binary``, ``ubinary``: :mod:`embforge.quantization`). Every input is checked before it joins a batch (a lone surrogate or a NaN is a
422 naming the field and index), and a batch that still fails is split so only the request that broke it fails.
Errors are JSON ``{"error": {"message", "type", "param"}}`` with a 4xx status naming the offending field; the
server keeps serving (and keeps the connection alive) after any of them, 500s included.

Example:
    >>> from embforge.encoder import Encoder
    >>> app = create_app(Encoder.load("all-MiniLM-L6-v2"))  # doctest: +SKIP
    >>> # uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from embforge._optional import require
from embforge.data.texts import is_blank
from embforge.kinds import ModelKind, kind_of
from embforge.modeling.encoding import BatchEncoding
from embforge.multivector.serve import create_multivector_app
from embforge.quantization import quantize
from embforge.serve.batcher import QueueFull
from embforge.serve.config import ServeConfig
from embforge.serve.middleware import ApiError, Gatekeeper, error_body, invalid_value, validation_message
from embforge.serve.models import ModelSet, Reranker, ServedEmbedder, ServedModel, pair_costs
from embforge.serve.prometheus import Metrics
from embforge.serve.store import DocumentStore, DuplicateIdError
from embforge.sparse.serve import create_sparse_app

if TYPE_CHECKING:
    from embforge.multivector.model import MultiVectorEncoder
    from embforge.sparse.model import SparseEncoder

    Servable = (
        BatchEncoding | SparseEncoder | MultiVectorEncoder
    )  # dense embedders (PyTorch, exported, static); a multi-vector or sparse model gets its own app

require("fastapi")
orjson = require("orjson")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import PlainTextResponse, Response  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None
    dimensions: int | None = None
    encoding_format: Literal["float", "base64", "int8", "uint8", "binary", "ubinary"] = "float"
    user: str | None = None
    prompt_name: str | None = None


class RerankRequest(BaseModel):
    query: str
    documents: list[str | dict[str, object]] | None = None
    texts: list[str] | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    model: str | None = None


class SimilarityRequest(BaseModel):
    pairs: list[tuple[str, str]]
    model: str | None = None


class SearchRequest(BaseModel):
    query: str | list[str]
    top_k: int | None = Field(default=None, ge=1, le=1000)
    return_text: bool = True


class Document(BaseModel):
    id: str = Field(min_length=1)
    text: str
    fields: dict[str, object] = Field(default_factory=dict)


class AddDocumentsRequest(BaseModel):
    documents: list[Document]


def _json(payload: Mapping[str, object]) -> Response:
    """A JSON response written by orjson, which serialises numpy vectors directly (float32, shortest form that
    reads back to the same float32) instead of FastAPI's encoder walking hundreds of Python floats per vector."""
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def _error(status: int, message: str, param: str | None, kind: str = "invalid_request_error") -> Response:
    """An error response; ASCII-escaped JSON, so a message quoting a bad string can always be sent."""
    return Response(
        json.dumps(error_body(message, param, kind)), status_code=status, media_type="application/json"
    )


def _conflict(position: int, key: str) -> ApiError:
    field = f"documents[{position}].id"
    return ApiError(409, f"'{field}' {key!r} is already in the index", field)


def _check_body(body: BaseModel, **parts: object) -> None:
    """422 for the first string or number of the request that cannot be served (see :func:`invalid_value`);
    ``parts`` replace fields by the form they are served in (a single ``input`` string as a list)."""
    found = invalid_value({**body.model_dump(), **parts}, "")
    if found is not None:
        raise ApiError(422, found[1], found[0])


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _encoded(vectors: np.ndarray, encoding_format: str, ranges: np.ndarray | None) -> list[dict[str, object]]:
    """The ``data`` items of an embeddings response: float vectors, base64 of little-endian float32, or quantised
    codes (integer lists, sentence-transformers' ``quantize_embeddings`` semantics)."""
    if encoding_format == "base64":
        rows: Sequence[object] = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    elif encoding_format == "float":
        rows = list(vectors)
    else:
        rows = list(quantize(vectors, encoding_format, ranges).astype(np.int32))
    return [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]


class _Server:
    """What the endpoints share (settings, the served models, the document store, the metrics) and the endpoints
    themselves as methods; :func:`create_app` routes to them (:meth:`routes`)."""

    def __init__(
        self, cfg: ServeConfig, models: ModelSet, store: DocumentStore | None, metrics: Metrics
    ) -> None:
        self.cfg = cfg
        self.models = models
        self.store = store
        self.metrics = metrics
        self.default = next(iter(models.embedders.values()))

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start the batching workers; at shutdown finish queued requests and save the store."""
        self.models.start()
        try:
            yield
        finally:
            await self.models.stop()
            if self.store is not None:
                await asyncio.to_thread(self.store.close)

    def routes(self) -> list[tuple[str, str, Callable[..., Awaitable[object]]]]:
        """``(method, path, endpoint)`` of every endpoint."""
        return [
            ("POST", "/v1/embeddings", self.embeddings),
            ("POST", "/rerank", self.rerank),
            ("POST", "/similarity", self.similarity),
            ("POST", "/search", self.search),
            ("POST", "/index/documents", self.add_documents),
            ("GET", "/health", self.health),
            ("GET", "/v1/models", self.list_models),
            ("GET", "/metrics", self.metrics_text),
        ]

    def check_texts(self, texts: list[str], field: str) -> list[str]:
        if not texts:
            raise ApiError(422, f"'{field}' must not be empty", field)
        if len(texts) > self.cfg.max_inputs:
            raise ApiError(
                413, f"'{field}' has {len(texts)} items; the limit is {self.cfg.max_inputs}", field
            )
        out = []
        for i, text in enumerate(texts):
            if is_blank(text):  # the readers' rule too (data/texts.py)
                message = f"'{field}[{i}]' is empty (only whitespace or invisible characters)"
                raise ApiError(422, message, f"{field}[{i}]")
            found = invalid_value(text, f"{field}[{i}]")
            if found is not None:
                raise ApiError(422, found[1], found[0])
            if len(text) > self.cfg.max_chars:
                if not self.cfg.truncate:
                    raise ApiError(
                        413,
                        f"'{field}[{i}]' has {len(text)} characters; the limit is {self.cfg.max_chars} "
                        "(start the server with --truncate to cut long texts instead)",
                        f"{field}[{i}]",
                    )
                text = text[: self.cfg.max_chars]
            out.append(text)
        return out

    async def run(self, served: ServedModel, items: list[Any], costs: list[int]) -> Any:
        try:
            return await asyncio.wait_for(served.batcher.submit(items, costs), self.cfg.request_timeout_s)
        except QueueFull as err:
            raise ApiError(
                429, f"model {served.name!r} is overloaded ({err}); retry later", "model", "overloaded"
            ) from err
        except asyncio.TimeoutError as err:
            raise ApiError(
                503,
                f"the model did not answer within {self.cfg.request_timeout_s} s; retry later",
                None,
                "timeout",
            ) from err

    async def embed(
        self, texts: list[str], served: ServedEmbedder | None = None
    ) -> tuple[np.ndarray, list[int]]:
        """Vectors and token counts of ``texts``: tokenised here (the batch cost), embedded in token batches."""
        served = served or self.default
        if sum(len(t) for t in texts) > 20_000:  # a long request is tokenised off the event loop
            ids = await asyncio.to_thread(served.model.tokenize_ids, texts)
        else:
            ids = served.model.tokenize_ids(texts)
        lengths = [len(x) for x in ids]
        return await self.run(served, ids, lengths), lengths

    def prefix(self, served: ServedEmbedder, name: str | None, field: str = "prompt_name") -> str:
        if name is None:
            return ""
        prompts = served.model.prompts
        if name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise ApiError(422, f"unknown prompt name {name!r}; this model has: {known}", field)
        return prompts[name]

    async def embeddings(self, body: EmbeddingRequest) -> Response:
        served = self.models.embedder(body.model)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        _check_body(body, input=inputs)
        texts = self.check_texts(inputs, "input")
        dim = int(served.model.dim)
        if body.dimensions is not None and not 0 < body.dimensions <= dim:
            raise ApiError(
                422, f"'dimensions' must be between 1 and {dim}, got {body.dimensions}", "dimensions"
            )
        cut = body.dimensions is not None and body.dimensions < dim
        scalar = body.encoding_format in ("int8", "uint8")
        if scalar and (served.ranges is None or cut):
            why = (
                "with 'dimensions' (its calibration ranges are for full vectors)"
                if cut
                else "for this model: it has no calibration ranges (start the server with --calibration FILE)"
            )
            raise ApiError(
                422, f"'encoding_format' {body.encoding_format} is not available {why}", "encoding_format"
            )
        start = self.prefix(served, body.prompt_name)
        vectors, tokens = await self.embed([start + t for t in texts] if start else texts, served)
        if cut:
            vectors = vectors[:, : body.dimensions]
            if served.model.normalize:
                vectors = _l2(vectors)
        data = _encoded(np.ascontiguousarray(vectors, dtype=np.float32), body.encoding_format, served.ranges)
        used = int(sum(tokens))
        return _json(
            {
                "object": "list",
                "data": data,
                "model": served.name,
                "usage": {"prompt_tokens": used, "total_tokens": used},
            }
        )

    async def rerank(self, body: RerankRequest) -> dict[str, object]:
        served = self.models.reranker(body.model)
        _check_body(body)
        field = "documents" if body.documents is not None else "texts"
        raw: Sequence[object] = body.documents if body.documents is not None else (body.texts or [])
        docs = []
        for i, doc in enumerate(raw):
            text = doc.get("text") if isinstance(doc, dict) else doc
            if not isinstance(text, str):
                raise ApiError(
                    422, f"'{field}[{i}]' must be a string or an object with a 'text' string", f"{field}[{i}]"
                )
            docs.append(text)
        docs = self.check_texts(docs, field)
        query = self.check_texts([body.query], "query")[0]
        costs = pair_costs(served.model, query, docs)
        scores = await self.run(served, [(query, d) for d in docs], costs)
        scores = np.asarray(scores, dtype=np.float32).reshape(len(docs), -1)[:, -1]
        order = np.argsort(-scores, kind="stable")[: body.top_n]
        results = []
        for i in order:
            item: dict[str, object] = {"index": int(i), "relevance_score": float(scores[i])}
            if body.return_documents:
                item["document"] = {"text": docs[i]}
            results.append(item)
        return {"model": served.name, "results": results}

    async def similarity(self, body: SimilarityRequest) -> dict[str, object]:
        served = self.models.embedder(body.model)
        if not body.pairs:
            raise ApiError(422, "'pairs' must not be empty", "pairs")
        _check_body(body)
        unique = list(dict.fromkeys(t for pair in body.pairs for t in pair))
        self.check_texts(unique, "pairs")
        vectors, _ = await self.embed(unique, served)
        vectors = _l2(np.asarray(vectors, dtype=np.float32))
        pos = {t: i for i, t in enumerate(unique)}
        scores = [float(vectors[pos[a]] @ vectors[pos[b]]) for a, b in body.pairs]
        return {"model": served.name, "scores": scores}

    def need_store(self) -> DocumentStore:
        if self.store is None:
            raise ApiError(
                501, "no index is loaded; start the server with --index DIR", None, "not_available"
            )
        return self.store

    async def search(self, body: SearchRequest) -> dict[str, object]:
        docs = self.need_store()
        queries = [body.query] if isinstance(body.query, str) else body.query
        _check_body(body, query=queries)
        queries = self.check_texts(queries, "query")
        start = self.default.model.prompts.get("query", "")
        vectors, _ = await self.embed([start + q for q in queries])
        k = body.top_k or self.cfg.default_top_k
        hits = await asyncio.to_thread(docs.search, vectors, k, with_text=body.return_text)
        return {
            "model": self.default.name,
            "results": [{"query": q, "hits": h} for q, h in zip(queries, hits)],
        }

    async def add_documents(self, body: AddDocumentsRequest) -> dict[str, object]:
        docs = self.need_store()
        _check_body(body)
        texts = self.check_texts([d.text for d in body.documents], "documents")
        ids = [d.id for d in body.documents]
        dup = docs.duplicates(ids)
        if dup:  # cheap early answer; the store checks again, atomically, when it writes
            raise _conflict(dup[0], ids[dup[0]])
        prompts = self.default.model.prompts
        start = prompts.get("document") or prompts.get("passage") or ""
        vectors, _ = await self.embed([start + t for t in texts])
        items = [{"id": d.id, "text": t, "fields": d.fields} for d, t in zip(body.documents, texts)]
        try:
            await asyncio.to_thread(docs.add, items, vectors)
        except DuplicateIdError as err:
            raise _conflict(err.position, err.key) from err
        return {"added": len(items), "total": len(docs)}

    async def health(self) -> dict[str, object]:
        return {
            "status": "ok",
            "model": self.default.name,
            "dim": self.default.dim,
            "backend": self.default.backend,
            "reranker": bool(self.models.rerankers),
            "models": [m.name for m in self.models.all()],
            "documents": len(self.store) if self.store is not None else None,
        }

    async def list_models(self) -> dict[str, object]:
        return self.models.listing()

    async def metrics_text(self) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")


def _other_kind_app(model: object, store: DocumentStore | None, cfg: ServeConfig) -> FastAPI | None:
    """The app of a multi-vector (token vectors, MaxSim) or sparse (SPLADE) model, else None (a dense embedder)."""
    only = next(iter(model.values())) if isinstance(model, Mapping) and len(model) == 1 else model
    if isinstance(only, Mapping):
        return None
    name = next(iter(model)) if isinstance(model, Mapping) else cfg.model_name
    if kind_of(only) == ModelKind.MULTIVECTOR:
        if store is not None:
            raise ValueError(
                "a multi-vector model keeps its search documents in memory (POST /index/documents); "
                "--index folders hold one vector per document: serve it without --index"
            )
        return create_multivector_app(cast("MultiVectorEncoder", only), name=name, max_inputs=cfg.max_inputs)
    if kind_of(only) == ModelKind.SPARSE:  # {indices, values} embeddings and an inverted index
        if store is not None:
            raise ValueError(
                "a sparse model keeps its search documents in an in-memory inverted index (POST "
                "/index/documents); --index folders hold dense vectors: serve it without --index"
            )
        return create_sparse_app(cast("SparseEncoder", only), name=name, max_inputs=cfg.max_inputs)
    return None


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": {"message", "type", "param"}}``, the framework's own 4xx included."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        return _error(err.status, err.message, err.param, err.kind)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Response:
        """The framework's own 4xx (unknown path, wrong method, a body that is not UTF-8 JSON) in our format."""
        message = err.detail if isinstance(err.detail, str) else str(err.detail)
        if err.status_code == 400 and "parsing the body" in message:
            message = "the body could not be read as JSON (it must be UTF-8 encoded JSON)"
        return _error(err.status_code, message, "body" if err.status_code == 400 else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        message, param = validation_message(err.errors())
        return _error(422, message, param)


def create_app(
    model: Servable | Mapping[str, Servable],
    *,
    reranker: Reranker | Mapping[str, Reranker] | None = None,
    store: DocumentStore | None = None,
    config: ServeConfig | None = None,
    ranges: Mapping[str, np.ndarray | None] | None = None,
) -> FastAPI:
    """Build the server app.

    Args:
        model: An embedder — :class:`~embforge.encoder.Encoder` (torch), or an exported runtime
            (:class:`~embforge.onnx.runtime.OnnxEncoder`, OpenVINO) — or several as ``{name: model}``
            (the first is the default and the one ``/search`` uses).
        reranker: Optional :class:`~embforge.cross_encoder.CrossEncoder` or
            :class:`~embforge.onnx.runtime.OnnxCrossEncoder` for ``/rerank``, or several by name.
        store: Optional :class:`DocumentStore` for ``/search`` and ``/index/documents`` (saved at shutdown).
        config: Limits, batching, auth (default :class:`ServeConfig`).
        ranges: int8/uint8 calibration ranges by embedder name (default: those saved beside each model).

    Returns:
        A FastAPI app; its lifespan starts the batching workers and, at shutdown, finishes queued requests and
        saves the store.
    """
    cfg = config or ServeConfig()
    other = _other_kind_app(model, store, cfg)
    if other is not None:
        return other
    metrics = Metrics()
    given = dict(model) if isinstance(model, Mapping) else {cfg.model_name: model}
    embedders = {name: one for name, one in given.items() if isinstance(one, BatchEncoding)}
    if len(embedders) < len(given):
        other_kinds = ", ".join(sorted(set(given) - set(embedders)))
        raise ValueError(
            f"several models in one server are dense embedders; {other_kinds} is a sparse or multi-vector model: "
            "serve it on its own"
        )
    rerankers: dict[str, Reranker] = {}
    if isinstance(reranker, Mapping):
        rerankers = dict(reranker)
    elif reranker is not None:
        rerankers = {cfg.reranker_name or "reranker": reranker}
    models = ModelSet(embedders, rerankers, cfg, ranges=ranges, on_batch=metrics.observe_batch)
    server = _Server(cfg, models, store, metrics)
    app = FastAPI(title="embforge", lifespan=server.lifespan)
    app.state.metrics = metrics
    app.state.store = store
    app.state.models = models
    _add_error_handlers(app)
    for method, path, endpoint in server.routes():
        app.add_api_route(path, endpoint, methods=[method])
    known = {route.path for route in app.routes if hasattr(route, "path")}
    app.add_middleware(Gatekeeper, config=cfg, metrics=metrics, known_paths=known)
    return app
