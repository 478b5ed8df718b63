"""``embforge serve``: the embedding / rerank / search server (FastAPI + uvicorn, loopback by default)."""

from __future__ import annotations

import argparse
from typing import Any

from embforge.cli.common import add_index_kind_arg, add_model_arg, config_from_args, parse_options


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "serve", help="serve embeddings, rerank and search over HTTP", description=__doc__
    )
    add_model_arg(parser, amp=False)
    parser.add_argument(
        "--reranker", default=None, help="cross-encoder folder (or its ONNX export) for /rerank"
    )
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
        "--backend", choices=("torch", "onnx"), default="torch", help="onnx: --model is an export"
    )
    parser.add_argument(
        "--qdrant-url",
        default=None,
        help="with --index-kind qdrant: a Qdrant server (scale-out; API key from env QDRANT_API_KEY)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or env EMBFORGE_API_KEY)"
    )
    parser.add_argument("--model-name", default=None, help="name reported in responses (default: --model)")
    parser.add_argument(
        "--max-batch-size", type=int, default=64, help="most texts merged into one model call"
    )
    parser.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="wait for more requests to join a batch"
    )
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
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> dict[str, Any]:
    from embforge.serve.config import ServeConfig
    from embforge.serve.runner import serve

    config = config_from_args(
        ServeConfig,
        args,
        model_name=args.model_name or str(args.model),
        request_timeout_s=args.timeout,
        reranker_name=args.reranker,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive,
    )
    options = parse_options(args.index_option)
    if args.qdrant_url:
        options["url"] = args.qdrant_url
    serve(
        args.model,
        reranker=args.reranker,
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
    )
    return {"stopped": True, "host": args.host, "port": args.port}
