"""``embforge serve``: the embedding / rerank / search server (FastAPI + uvicorn, loopback by default)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from embforge.cli.common import DEFAULT_MODEL, add_index_kind_arg, config_from_args, parse_options
from embforge.onnx.backends import BACKENDS


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "serve", help="serve embeddings, rerank and search over HTTP", description=__doc__
    )
    for add in (_model_args, _index_args, _runtime_args, _server_args, _batching_args, _limit_args):
        add(parser)
    parser.set_defaults(func=run_serve)


def _model_args(parser: argparse.ArgumentParser) -> None:
    """What is served: embedders and rerankers, by name."""
    parser.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]PATH",
        help=f"embedding model folder, alias or export (default {DEFAULT_MODEL}); repeat as NAME=PATH to serve "
        "several (a request's 'model' picks one; the first is the default and the one /search uses)",
    )
    parser.add_argument(
        "--reranker",
        action="append",
        metavar="[NAME=]PATH",
        help="cross-encoder folder (or its ONNX export) for /rerank; repeat as NAME=PATH for several",
    )


def _index_args(parser: argparse.ArgumentParser) -> None:
    """The document index behind /search and /index/documents."""
    parser.add_argument(
        "--index",
        default=None,
        metavar="DIR",
        help="index folder for /search and /index/documents: one written by 'embforge index build', or a new "
        "one the server starts",
    )
    add_index_kind_arg(parser, default=None)
    parser.add_argument(
        "--index-option", action="append", metavar="NAME=VALUE", help="option of a new index, e.g. m=32"
    )
    parser.add_argument(
        "--allow-model-mismatch",
        action="store_true",
        help="serve an index built by another model (refused by default: its vectors would not match)",
    )
    parser.add_argument(
        "--qdrant-url",
        default=None,
        help="with --index-kind qdrant: a Qdrant server (scale-out; API key from env QDRANT_API_KEY)",
    )


def _runtime_args(parser: argparse.ArgumentParser) -> None:
    """How the models run: backend, OpenVINO streams, int8 calibration."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="runtime of the models: auto (the fastest here: openvino-int8 with --calibration, else onnx-int8, "
        "else torch; rerankers: openvino, else onnx, else torch), torch, onnx, onnx-int8, openvino, openvino-int8 "
        "(rerankers: openvino); a model folder is exported on the fly and the export cached",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=0,
        metavar="N",
        help="inference streams of the openvino backends: N batches run at once, each on its share of the cores "
        "(default 0: OpenVINO's throughput choice; 1: one batch at a time on all cores, lowest latency when idle)",
    )
    parser.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="texts, one a line, to calibrate int8/uint8 outputs and the openvino-int8 quantiser on",
    )


def _server_args(parser: argparse.ArgumentParser) -> None:
    """Where it listens and who may call it."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or env EMBFORGE_API_KEY)"
    )
    parser.add_argument("--model-name", default=None, help="name reported in responses (default: --model)")


def _batching_args(parser: argparse.ArgumentParser) -> None:
    """How requests share model calls."""
    parser.add_argument(
        "--max-batch-size", type=int, default=64, help="most texts merged into one model call"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        default=16384,
        help="most padded tokens in one model call (the queue is sorted by length; TEI semantics)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=4096, help="most texts waiting per model (429 beyond)"
    )
    parser.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="wait for more requests to join a batch"
    )


def _limit_args(parser: argparse.ArgumentParser) -> None:
    """Per-request and per-connection limits."""
    parser.add_argument("--max-inputs", type=int, default=256, help="most texts per request (413 beyond)")
    parser.add_argument("--max-chars", type=int, default=8192, help="most characters per text (413 beyond)")
    parser.add_argument("--truncate", action="store_true", help="cut texts over --max-chars instead of 413")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=2 * 1024 * 1024,
        help="largest request body accepted (413 beyond; default 2 MiB)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds a request may wait for the model"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of the model (default: torch/onnxruntime's own)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send a request's head (408)",
    )
    parser.add_argument(
        "--body-timeout", type=float, default=30.0, help="seconds a client has to send a request's body"
    )
    parser.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle connection is kept")
    parser.add_argument(
        "--max-connections", type=int, default=1024, help="most open connections (503 and closed beyond)"
    )
    parser.add_argument(
        "--log-level", default="info", help="uvicorn log level: debug, info, warning, error (default info)"
    )


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
