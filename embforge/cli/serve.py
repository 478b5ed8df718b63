"""``embforge serve``: the embedding / rerank / search server (FastAPI + uvicorn, loopback by default)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from embforge.cli.common import (
    DEFAULT_MODEL,
    Flag,
    add_flags,
    add_index_kind_arg,
    config_from_args,
    parse_options,
)
from embforge.cli.values import (
    folder,
    non_negative_float,
    option,
    port,
    positive_int,
    seconds,
    streams,
    threads,
)
from embforge.onnx.backends import BACKENDS

# what is served: embedders and rerankers, by name
_MODELS = [
    Flag(
        "--model",
        f"embedding model folder, alias or export (default {DEFAULT_MODEL}); repeat as NAME=PATH to serve several "
        "(a request's 'model' picks one; the first is the default and the one /search uses)",
        metavar="[NAME=]PATH",
        action="append",
    ),
    Flag(
        "--reranker",
        "cross-encoder folder (or its ONNX export) for /rerank; repeat as NAME=PATH for several",
        metavar="[NAME=]PATH",
        action="append",
    ),
]


# the document index behind /search and /index/documents
_INDEX = [
    Flag(
        "--index",
        "index folder for /search and /index/documents: one written by 'embforge index build', or a new one the "
        "server starts",
        folder,
        metavar="DIR",
    ),
    Flag("--index-option", "option of a new index, e.g. m=32", option, metavar="NAME=VALUE", action="append"),
    Flag(
        "--allow-model-mismatch",
        "serve an index built by another model (refused by default: its vectors would not match)",
        action="store_true",
    ),
    Flag(
        "--qdrant-url",
        "with --index-kind qdrant: a Qdrant server (scale-out; API key from env QDRANT_API_KEY)",
    ),
]

# how the models run: backend, OpenVINO streams, int8 calibration
_RUNTIME = [
    Flag(
        "--backend",
        "runtime of the models: auto (the fastest here: openvino-int8 with --calibration, else onnx-int8, else "
        "torch; rerankers: openvino, else onnx, else torch), torch, onnx, onnx-int8, openvino, openvino-int8 "
        "(rerankers: openvino); a model folder is exported on the fly and the export cached",
        default="auto",
        choices=BACKENDS,
    ),
    Flag(
        "--streams",
        "inference streams of the openvino backends: N batches run at once, each on its share of the cores "
        "(default 0: OpenVINO's throughput choice; 1: one batch at a time on all cores, lowest latency when idle; "
        "at most 4 x the CPUs)",
        streams,
        0,
        metavar="N",
    ),
    Flag(
        "--calibration",
        "texts, one a line, to calibrate int8/uint8 outputs and the openvino-int8 quantiser on",
        metavar="FILE",
    ),
]

# where it listens and who may call it
_SERVER = [
    Flag("--host", "address to bind (default loopback only)", default="127.0.0.1"),
    Flag("--port", "TCP port, 1 to 65535 (default 8080)", port, 8080),
    Flag("--api-key", "require 'Authorization: Bearer KEY' (or env EMBFORGE_API_KEY)"),
    Flag("--model-name", "name reported in responses (default: --model)"),
]

# how requests share model calls
_BATCHING = [
    Flag("--max-batch-size", "most texts merged into one model call", positive_int, 64),
    Flag(
        "--max-batch-tokens",
        "most padded tokens in one model call (the queue is sorted by length; TEI semantics)",
        positive_int,
        16384,
    ),
    Flag("--max-queue", "most texts waiting per model (429 beyond)", positive_int, 4096),
    Flag("--max-wait-ms", "wait for more requests to join a batch", non_negative_float, 5.0),
]

# per-request and per-connection limits
_LIMITS = [
    Flag("--max-inputs", "most texts per request (413 beyond)", positive_int, 256),
    Flag("--max-chars", "most characters per text (413 beyond)", positive_int, 8192),
    Flag("--truncate", "cut texts over --max-chars instead of 413", action="store_true"),
    Flag(
        "--max-body-bytes",
        "largest request body accepted (413 beyond; default 2 MiB)",
        positive_int,
        2 * 1024 * 1024,
    ),
    Flag("--timeout", "seconds a request may wait for the model (> 0, at most a day)", seconds, 30.0),
    Flag(
        "--threads",
        "CPU threads of the model, 1 to 4 x the CPUs: more only contend for the cores (default: "
        "torch/onnxruntime's own)",
        threads,
    ),
    Flag("--header-timeout", "seconds a client has to send a request's head (408)", seconds, 10.0),
    Flag("--body-timeout", "seconds a client has to send a request's body", seconds, 30.0),
    Flag("--keep-alive", "seconds an idle connection is kept", seconds, 5.0),
    Flag("--max-connections", "most open connections (503 and closed beyond)", positive_int, 1024),
    Flag("--log-level", "uvicorn log level: debug, info, warning, error (default info)", default="info"),
]


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "serve", help="serve embeddings, rerank and search over HTTP", description=__doc__
    )
    add_flags(parser, _MODELS + _INDEX[:1])
    add_index_kind_arg(  # after the index folder, before the new index's settings
        parser, default=None, note="; without --index, a multi-vector model's in-memory index: exact or plaid"
    )
    for flags in (_INDEX[1:], _RUNTIME, _SERVER, _BATCHING, _LIMITS):
        add_flags(parser, flags)
    parser.set_defaults(func=run_serve)


def named_models(values: list[str] | None) -> str | dict[str, str] | None:
    """``--model`` values: one plain path stays a string; ``NAME=PATH`` items (or several) give ``{name: path}``."""
    if not values:
        return None
    named: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or "/" in name or Path(value).exists():
            name, path = value, value
        if name in named:
            raise ValueError(f"two models are named {name!r}; give each --model NAME=PATH a different name")
        named[name] = path
    plain = len(values) == 1 and next(iter(named)) == values[0]
    return values[0] if plain else named


def run_serve(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.serve.config import ServeConfig
    from embforge.serve.runner import serve

    model = named_models(args.model) or DEFAULT_MODEL
    reranker = named_models(args.reranker)
    config = config_from_args(
        ServeConfig,
        args,
        model_name=args.model_name or (model if isinstance(model, str) else next(iter(model))),
        request_timeout_s=args.timeout,
        reranker_name=reranker if isinstance(reranker, str) else None,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
    )
    if args.qdrant_url and not args.index:  # a Qdrant collection backs an index folder
        raise ValueError("--qdrant-url sets up an index folder: give the folder with --index DIR")
    options = parse_options(args.index_option)
    if args.qdrant_url:
        options["url"] = args.qdrant_url
    serve(
        model,
        reranker=reranker,
        calibration=args.calibration,
        index=args.index,
        index_kind=args.index_kind,
        index_options=options or None,
        allow_model_mismatch=args.allow_model_mismatch,
        backend=args.backend,
        host=args.host,
        port=args.port,
        config=config,
        log_level=args.log_level,
        threads=args.threads,
        streams=args.streams,
    )
    return {"stopped": True, "host": args.host, "port": args.port}
