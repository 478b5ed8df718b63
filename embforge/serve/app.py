"""``create_app(...)``: the FastAPI app of the embedding server (OpenAI-compatible embeddings, rerank, search).

Endpoints: ``POST /v1/embeddings``, ``POST /rerank``, ``POST /similarity``, ``POST /search``,
``POST /index/documents``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``. Every model kind is served by
this one app — dense, static, sparse (``{indices, values}``) and multi-vector (token vectors) — so auth, limits,
text checks, queues, metrics and the error format guard every endpoint of every kind; what differs by kind is the
kind's serving record (:mod:`embforge.serve.serving`). Several embedders and rerankers can be served at once
(:mod:`embforge.serve.models`; the request's ``model`` picks one). Model calls go through a token-budget
:class:`MicroBatcher` per model, so concurrent requests share batches. ``encoding_format`` may ask for quantised
vectors where the kind has them (``int8``, ``uint8``, ``binary``, ``ubinary``: :mod:`embforge.quantization`).
Every input is checked before it joins a batch (a lone surrogate or a NaN is a 422 naming the field and index), and
a batch that still fails is split so only the request that broke it fails. Errors are JSON
``{"error": {"message", "type", "param"}}`` with a 4xx status naming the offending field; the server keeps serving
(and keeps the connection alive) after any of them, 500s included.

Example:
    >>> from embforge.encoder import Encoder
    >>> app = create_app(Encoder.load("all-MiniLM-L6-v2"))  # doctest: +SKIP
    >>> # uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from embforge._optional import require
from embforge.data.texts import is_blank
from embforge.serve.auth import OPEN_PATHS, add_docs, guards
from embforge.serve.batcher import QueueFull
from embforge.serve.config import ServeConfig
from embforge.serve.documents import DuplicateIdError
from embforge.serve.middleware import ApiError, Gatekeeper, error_body, invalid_value, validation_message
from embforge.serve.models import ModelSet, Reranker, ServedEmbedder, ServedModel, pair_costs
from embforge.serve.prometheus import CONTENT_TYPE, Metrics
from embforge.serve.requests import (
    AddDocumentsRequest,
    EmbeddingRequest,
    InputType,
    RerankRequest,
    SearchRequest,
    SimilarityRequest,
)
from embforge.serve.serving import SearchStore

require("fastapi")
orjson = require("orjson")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import PlainTextResponse, Response  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402

LONG_REQUEST_CHARS = 20_000  # a request longer than this is tokenised off the event loop


def _json(payload: Mapping[str, object]) -> Response:
    """A JSON response written by orjson, which serialises numpy vectors directly (float32, shortest form that
    reads back to the same float32) instead of FastAPI's encoder walking hundreds of Python floats per vector."""
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def _error(
    status: int,
    message: str,
    param: str | None,
    kind: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> Response:
    """An error response; ASCII-escaped JSON, so a message quoting a bad string can always be sent."""
    body = json.dumps(error_body(message, param, kind))
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _conflict(position: int, key: str) -> ApiError:
    field = f"documents[{position}].id"
    return ApiError(409, f"'{field}' {key!r} is already in the index", field)


def _check_body(body: BaseModel, **parts: object) -> None:
    """422 for the first string or number of the request that cannot be served (see :func:`invalid_value`);
    ``parts`` replace fields by the form they are served in (a single ``input`` string as a list)."""
    found = invalid_value({**body.model_dump(), **parts}, "")
    if found is not None:
        raise ApiError(422, found[1], found[0])


class _Server:
    """What the endpoints share (settings, the served models, the document store, the metrics) and the endpoints
    themselves as methods; :func:`create_app` routes to them (:meth:`routes`)."""

    def __init__(
        self, cfg: ServeConfig, models: ModelSet, store: SearchStore | None, metrics: Metrics
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

    async def run(self, served: ServedModel, items: Sequence[object], costs: list[int]) -> Any:
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

    async def encode(
        self,
        served: ServedEmbedder,
        texts: list[str],
        input_type: InputType | None,
        prompt_name: str | None = None,
        task: str | None = None,
    ) -> tuple[np.ndarray, list[int]]:
        """The rows (one per text, as the model's kind gives them) and token counts of ``texts``: tokenised here
        (the batch cost), run in token batches."""
        serving = served.serving
        if sum(len(t) for t in texts) > LONG_REQUEST_CHARS:
            ids, costs = await asyncio.to_thread(
                serving.batch_items, texts, input_type=input_type, prompt_name=prompt_name, task=task
            )
        else:
            ids, costs = serving.batch_items(texts, input_type=input_type, prompt_name=prompt_name, task=task)
        return await self.run(served, ids, costs), costs

    async def embeddings(self, body: EmbeddingRequest) -> Response:
        served = self.models.embedder(body.model)
        inputs = [body.input] if isinstance(body.input, str) else body.input
        _check_body(body, input=inputs)
        texts = self.check_texts(inputs, "input")
        served.serving.check(encoding_format=body.encoding_format, dimensions=body.dimensions)
        rows, tokens = await self.encode(served, texts, body.input_type, body.prompt_name, body.task)
        items = served.serving.answer(rows, encoding_format=body.encoding_format, dimensions=body.dimensions)
        data = [{"object": "embedding", "index": i, **item} for i, item in enumerate(items)]
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
        """Each pair's score as the model's kind scores two texts (dense: cosine; sparse and multi-vector: the
        first text as a query against the second as a document, as ``/search`` ranks)."""
        served = self.models.embedder(body.model)
        if not body.pairs:
            raise ApiError(422, "'pairs' must not be empty", "pairs")
        _check_body(body)
        unique = list(dict.fromkeys(t for pair in body.pairs for t in pair))
        checked = dict(zip(unique, self.check_texts(unique, "pairs")))
        sides = served.serving.pair_inputs  # how each side of a pair is encoded
        wanted = list(dict.fromkeys((side, text) for pair in body.pairs for side, text in zip(sides, pair)))
        by_side: dict[InputType | None, list[str]] = {}
        for side, text in wanted:
            by_side.setdefault(side, []).append(text)
        rows: list[np.ndarray] = []
        for side, texts in by_side.items():
            rows.append((await self.encode(served, [checked[t] for t in texts], side))[0])
        place = {key: i for i, key in enumerate((side, t) for side, texts in by_side.items() for t in texts)}
        every = np.concatenate(rows)
        first = every[[place[(sides[0], a)] for a, _ in body.pairs]]
        second = every[[place[(sides[1], b)] for _, b in body.pairs]]
        scores = served.serving.similarity(first, second)
        return {"model": served.name, "scores": [float(s) for s in scores]}

    def need_store(self) -> SearchStore:
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
        rows, _ = await self.encode(self.default, queries, "query")
        k = body.top_k or self.cfg.default_top_k
        hits = await asyncio.to_thread(docs.search, rows, k, with_text=body.return_text)
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
        rows, _ = await self.encode(self.default, texts, "document")
        items = [{"id": d.id, "text": t, "fields": d.fields} for d, t in zip(body.documents, texts)]
        try:
            await asyncio.to_thread(docs.add, items, rows)
        except DuplicateIdError as err:
            raise _conflict(err.position, err.key) from err
        return {"added": len(items), "total": len(docs)}

    async def health(self) -> dict[str, object]:
        return {
            "status": "ok",
            "model": self.default.name,
            "kind": self.default.serving.name,
            "dim": self.default.dim,
            "backend": self.default.backend,
            "precision": self.default.precision,
            "reranker": bool(self.models.rerankers),
            "models": [m.name for m in self.models.all()],
            "documents": len(self.store) if self.store is not None else None,
        }

    async def list_models(self) -> dict[str, object]:
        return self.models.listing()

    async def metrics_text(self) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type=CONTENT_TYPE)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": {"message", "type", "param"}}``, the framework's own 4xx included."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        return _error(err.status, err.message, err.param, err.kind, err.headers)

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
    model: object | Mapping[str, object],
    *,
    reranker: Reranker | Mapping[str, Reranker] | None = None,
    store: SearchStore | None = None,
    config: ServeConfig | None = None,
    ranges: Mapping[str, np.ndarray | None] | None = None,
    index_kind: str | None = None,
    index_options: Mapping[str, object] | None = None,
) -> FastAPI:
    """Build the server app.

    Args:
        model: An embedding model of any kind — a dense :class:`~embforge.encoder.Encoder` (torch) or exported
            runtime (:class:`~embforge.onnx.runtime.OnnxEncoder`, OpenVINO), a static, sparse or multi-vector
            model — or several as ``{name: model}`` (the first is the default and the one ``/search`` uses).
        reranker: Optional :class:`~embforge.cross_encoder.CrossEncoder` or
            :class:`~embforge.onnx.runtime.OnnxCrossEncoder` for ``/rerank``, or several by name.
        store: Optional :class:`~embforge.serve.store.DocumentStore` for ``/search`` and ``/index/documents`` of a
            dense default model (saved at shutdown). A sparse or multi-vector default model keeps its documents in
            memory instead (an ``--index`` folder holds one vector per document: giving one is an error).
        config: Limits, batching, auth (default :class:`ServeConfig`).
        ranges: int8/uint8 calibration ranges by embedder name (default: those saved beside each model).
        index_kind: The in-memory index of a default model that keeps its documents in memory (multi-vector:
            ``exact`` or ``plaid``); a dense model's index kind is its ``store``'s.
        index_options: Options of that in-memory index (``--index-option``; multi-vector: ``pool_factor``, each
            document's token vectors pooled when it is added); an option it does not take is an error.

    Returns:
        A FastAPI app; its lifespan starts the batching workers and, at shutdown, finishes queued requests and
        saves the store.
    """
    cfg = config or ServeConfig()
    metrics = Metrics()
    embedders = dict(model) if isinstance(model, Mapping) else {cfg.model_name: model}
    rerankers: dict[str, Reranker] = {}
    if isinstance(reranker, Mapping):
        rerankers = dict(reranker)
    elif reranker is not None:
        rerankers = {cfg.reranker_name or "reranker": reranker}
    models = ModelSet(embedders, rerankers, cfg, ranges=ranges, on_batch=metrics.observe_batch)
    default = next(iter(models.embedders.values()))
    searched = default.serving.open_store(store, kind=index_kind, options=index_options)
    server = _Server(cfg, models, searched, metrics)
    # FastAPI's own docs pages take no dependencies: add_docs serves them behind the key
    app = FastAPI(title="embforge", lifespan=server.lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.metrics = metrics
    app.state.store = searched
    app.state.models = models
    _add_error_handlers(app)
    guard = guards(cfg.api_key)
    for method, path, endpoint in server.routes():
        app.add_api_route(path, endpoint, methods=[method], dependencies=[] if path in OPEN_PATHS else guard)
    add_docs(app, guard)
    known = {route.path for route in app.routes if hasattr(route, "path")}
    app.add_middleware(Gatekeeper, config=cfg, metrics=metrics, known_paths=known)
    return app
