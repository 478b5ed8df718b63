"""``embforge eval sts``: Spearman/Pearson of a model on scored pairs."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.cli.common import add_eval_kind


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    add_eval_kind(evals, "sts", run_sts)


def run_sts(args: argparse.Namespace) -> Mapping[str, object]:
    """Spearman/Pearson (0-100) of cosine, dot and Euclidean similarity

    Spearman/Pearson of a bi-encoder (or a cross-encoder's score) on scored pairs.
    """
    from embforge.cli.cross import load_any_model
    from embforge.data.tables import read_table
    from embforge.evaluate.sts import evaluate_sts

    data = read_table(args.data, columns=args.columns, header=args.header)
    model = load_any_model(args.model)  # a bi-encoder, or a cross-encoder folder
    return evaluate_sts(model, data, batch_size=args.batch_size)
