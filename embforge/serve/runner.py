"""Load the models named on the command line and run the app under uvicorn (loopback by default)."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from embforge._optional import require
from embforge.serve.config import ServeConfig

if TYPE_CHECKING:
    import numpy as np
    import uvicorn
    from fastapi import FastAPI

    from embforge.protocols import Embedder, Kinded
    from embforge.serve.models import Reranker

API_KEY_ENV = "EMBFORGE_API_KEY"


def load_encoder(
    model: str,
    *,
    backend: str = "torch",
    threads: int | None = None,
    calibration: Sequence[str] | None = None,
    streams: int = 1,
) -> Kinded:
    """A bi-encoder on ``backend`` (:func:`embforge.onnx.backends.load_embedder`: torch, onnx, onnx-int8,
    openvino, openvino-int8, or auto, the fastest here); a model folder is exported on the fly (cached). A folder
    of another kind (sparse, static, multi-vector) loads as its PyTorch class: the server serves each model by the
    kind it declares (:func:`embforge.serve.serving.serving_for`)."""
    from embforge.onnx.backends import load_embedder

    return load_embedder(model, backend=backend, threads=threads, calibration=calibration, streams=streams)


def load_reranker(
    model: str, *, backend: str = "torch", threads: int | None = None, streams: int = 1
) -> Reranker:
    """A cross-encoder on ``backend`` (:func:`embforge.onnx.backends.load_scorer`): PyTorch, or an ONNX
    Runtime / OpenVINO runtime of its export (made on the fly and cached; an export folder is loaded as it is)."""
    from embforge.onnx.backends import load_scorer

    return load_scorer(model, backend=backend, threads=threads, streams=streams)


def calibrated(encoder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """int8/uint8 calibration ranges of ``encoder`` on ``texts``, saved with an exported model (beside its graph,
    where a later start without ``--calibration`` finds them); a PyTorch model's folder is left as it is."""
    from embforge.quantization import calibrate, write_ranges

    ranges = calibrate(encoder, texts)
    graph = getattr(
        encoder, "graph", None
    )  # exported runtimes (ONNX Runtime, OpenVINO) know their graph file
    if graph is not None:
        write_ranges(Path(graph).parent, ranges, texts=len(texts), source="embforge serve --calibration")
    return ranges


def _named(spec: str | Mapping[str, str]) -> dict[str, str]:
    """``{name: path}`` of a ``--model``/``--reranker`` value: a path (named by itself) or a mapping."""
    return dict(spec) if isinstance(spec, Mapping) else {str(spec): str(spec)}


def serve(
    model: str | Mapping[str, str],
    *,
    reranker: str | Mapping[str, str] | None = None,
    calibration: str | None = None,
    index: str | None = None,
    index_kind: str | None = None,
    index_options: Mapping[str, object] | None = None,
    allow_model_mismatch: bool = False,
    compact_bytes: int | None = 64 << 20,
    backend: str = "torch",
    host: str = "127.0.0.1",
    port: int = 8080,
    config: ServeConfig | None = None,
    graceful_timeout_s: float = 30.0,
    log_level: str = "info",
    threads: int | None = None,
    streams: int = 0,
) -> None:
    """Load the models, open the index, build the app and serve it until SIGINT/SIGTERM.

    ``index`` is a folder in the one index format (:mod:`embforge.serve.store`; ``embforge index build`` writes
    it, or the server starts an empty one there). ``index_kind``/``index_options`` pick the index of a new folder
    (without ``index``, ``index_kind`` picks the in-memory index of a model that keeps its documents in memory:
    a multi-vector model's ``exact`` or ``plaid``); an existing folder of another kind is an error naming both, and one built by another model is refused unless
    ``allow_model_mismatch``; ``compact_bytes`` of log start a background compaction. On shutdown uvicorn stops accepting connections, waits up to
    ``graceful_timeout_s`` for in-flight requests, then the app's lifespan drains the batch queues and compacts
    the index. ``model``/``reranker`` may name several models (``{name: path}``; requests pick one by its
    ``model`` field). ``calibration`` is a text file (one text a line): the ranges of int8/uint8 outputs and the
    quantiser of the openvino-int8 backend are calibrated on it. ``threads`` caps the model's CPU threads (torch intra-op or onnxruntime intra-op); on a busy or
    shared CPU, fewer threads than cores avoids the slowdown of spinning thread pools competing for cores.
    ``streams``: inference streams of the OpenVINO backends (0: OpenVINO's throughput choice, several batches in
    flight; 1: latency mode, one batch at a time on all threads).
    """
    uvicorn = require("uvicorn")
    from embforge.serve.app import create_app
    from embforge.serve.database import model_identity
    from embforge.serve.store import DocumentStore

    # requests are tokenised on the event loop, a few texts at a time, while the model's threads hold the cores:
    # the tokenizers library's thread pool only adds hand-offs there (16 clients: +12-15 % texts/s without it)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = config or ServeConfig()
    cfg.api_key = api_key(cfg.api_key)
    texts = _calibration_texts(calibration)
    encoders, ranges, path = _load_embedders(
        model, cfg, backend=backend, threads=threads, calibration=texts, streams=streams
    )
    scorers = _load_rerankers(reranker, cfg, backend=backend, threads=threads, streams=streams)
    encoder = next(iter(encoders.values()))
    store = None
    if index:
        store = DocumentStore.open(
            index,
            dim=int(encoder.dim),
            kind=index_kind,
            options=index_options,
            model=model_identity(encoder, path),
            allow_model_mismatch=allow_model_mismatch,
            compact_bytes=compact_bytes,
        )
    kind = None if index else index_kind  # without a folder: the in-memory index of the model's kind
    app = create_app(
        encoders, reranker=scorers or None, store=store, config=cfg, ranges=ranges, index_kind=kind,
        index_options=None if index else index_options,
    )  # fmt: skip
    announce(app, host=host, port=port)
    server = uvicorn.Server(
        uvicorn_config(
            app, cfg, host=host, port=port, log_level=log_level, graceful_timeout_s=graceful_timeout_s
        )
    )
    # the models, tokenizers and libraries loaded so far live as long as the server: out of the garbage
    # collector's generations, so its collections stop rescanning them on every request's allocations
    gc.collect()
    gc.freeze()
    # uvicorn re-raises the signal it shut down for: SIGINT as a KeyboardInterrupt, SIGTERM to the default handler
    # (exit status -15, a failure to a process manager); after a graceful drain both end here, and serve returns
    with contextlib.suppress(KeyboardInterrupt), _sigterm_handled():
        server.run()


def _calibration_texts(calibration: str | None) -> list[str] | None:
    """The texts of a ``--calibration`` file (one a line), or ``None``."""
    if not calibration:
        return None
    from embforge.quantization import read_texts

    return read_texts(calibration)


def api_key(given: str | None) -> str | None:
    """The key requests must send: ``given`` (``--api-key``), else ``EMBFORGE_API_KEY`` when it is set; an empty
    one (or only whitespace) is an error naming where it came from — it would switch auth off."""
    if given is None and API_KEY_ENV in os.environ:
        given = os.environ[API_KEY_ENV]
        if not given.strip():
            raise ValueError(
                f"{API_KEY_ENV} is set but empty: give it a key, or unset it to serve without auth"
            )
    if given is not None and not given.strip():
        raise ValueError("--api-key is empty or only whitespace: give a key, or leave --api-key out")
    return given


def announce(app: FastAPI, *, host: str, port: int) -> None:
    """One start-up line per embedder on stderr: its kind, backend and precision (and, for int8, how to get exact
    vectors)."""
    for served in app.state.models.embedders.values():
        line = (
            f"embforge serve: {served.name!r} on http://{host}:{port}: {served.serving.name}, "
            f"backend {served.backend}, precision {served.precision}"
        )
        if served.precision == "int8":
            line += " (int8-quantised vectors; --backend onnx or --backend torch serves exact ones)"
        print(line, file=sys.stderr, flush=True)


def _load_embedders(
    model: str | Mapping[str, str],
    cfg: ServeConfig,
    *,
    backend: str,
    threads: int | None,
    calibration: list[str] | None,
    streams: int,
) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """``({name: embedder}, {name: int8 ranges} or None, the first model's path)``; one unnamed model is reported
    under ``cfg.model_name``."""
    names = _named(model)
    encoders = {
        name: load_encoder(path, backend=backend, threads=threads, calibration=calibration, streams=streams)
        for name, path in names.items()
    }
    # calibration ranges are for dense vectors (another kind's serving record refuses them)
    ranges = (
        {name: calibrated(cast("Embedder", e), calibration) for name, e in encoders.items()}
        if calibration
        else None
    )
    first, encoder = next(iter(encoders.items()))
    if isinstance(model, str):
        encoders = {cfg.model_name: encoder}
        ranges = {cfg.model_name: ranges[first]} if ranges else None
    return encoders, ranges, names[first]


def _load_rerankers(
    reranker: str | Mapping[str, str] | None,
    cfg: ServeConfig,
    *,
    backend: str,
    threads: int | None,
    streams: int,
) -> dict[str, Reranker]:
    """``{name: reranker}``; one unnamed reranker is reported under ``cfg.reranker_name`` when set."""
    scorers = {
        name: load_reranker(path, backend=backend, threads=threads, streams=streams)
        for name, path in _named(reranker or {}).items()
    }
    if isinstance(reranker, str):
        scorers = {cfg.reranker_name or reranker: scorers[reranker]}
    return scorers


@contextlib.contextmanager
def _sigterm_handled() -> Iterator[None]:
    """While the server runs, SIGTERM's handler outside uvicorn's own does nothing (uvicorn restores it and raises
    the signal again after its shutdown); the previous handler afterwards."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def uvicorn_config(
    app: FastAPI,
    config: ServeConfig,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    graceful_timeout_s: float = 30.0,
) -> uvicorn.Config:
    """The ``uvicorn.Config`` the server runs under: the connection guard of :mod:`embforge.serve.sockets`
    (head/body deadlines, connection cap) on uvicorn's own HTTP protocol, and its keep-alive timeout."""
    uvicorn = require("uvicorn")
    from embforge.serve.sockets import guarded_protocol

    protocol = guarded_protocol(
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        max_connections=config.max_connections,
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        log_level=log_level,
        timeout_keep_alive=max(1, round(config.keep_alive_s)),
        timeout_graceful_shutdown=int(graceful_timeout_s),
    )
