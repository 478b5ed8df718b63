"""The ``embforge`` command. Each verb lives in a small module with a ``register(verbs, evals)`` function.

Handlers return a dict (printed as one JSON line, the last line of stdout) or ``None``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

VERB_MODULES = [
    "embforge.cli.train",
    "embforge.cli.evaluate",
    "embforge.cli.encode",
    "embforge.cli.eval_tasks",
    "embforge.cli.export",
    "embforge.cli.serve",
    "embforge.cli.retrieval",
    "embforge.cli.cross",
    "embforge.cli.teacher",
    "embforge.cli.score",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embforge", description="Fine-tune, evaluate, export and serve text embedding models."
    )
    parser.add_argument("--version", action="version", version=_version())
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    eval_parser = verbs.add_parser("eval", help="evaluate a model; prints a JSON line of metrics last")
    evals = eval_parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    for name in VERB_MODULES:
        importlib.import_module(name).register(verbs, evals)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from embforge.modeling.precision import inference_autocast

    try:
        with inference_autocast(getattr(args, "inference_amp", "no")):
            result = args.func(args)
    except (ValueError, FileNotFoundError, KeyError, ImportError) as err:
        print(f"embforge {args.verb}: error: {err}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, default=float))
    return 0


def _version() -> str:
    from embforge import __version__

    return f"embforge {__version__}"
