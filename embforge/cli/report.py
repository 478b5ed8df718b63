"""``embforge report RUN_DIR``: an HTML page of a training run (loss curves, learning rate, evaluations, task
weights, refresh stalls) from its metrics.jsonl and refresh.jsonl."""

from __future__ import annotations

import argparse
from collections.abc import Mapping


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "report",
        help="write an HTML report of a training run (curves of loss, lr, metrics)",
        description=__doc__,
    )
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="the training run's output folder (holds metrics.jsonl)"
    )
    parser.add_argument("--output", default=None, help="HTML file to write (default RUN_DIR/report.html)")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.training.report import write_report

    return write_report(args.run_dir, output=args.output)
