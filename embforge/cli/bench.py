"""``embforge bench <experiment>``: reproducible experiments (:mod:`embforge.bench`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.bench.cosent_vs_ce import add_arguments, config_from_args, run_benchmark
from embforge.cli.common import add_actions
from embforge.cli.values import non_negative_int, positive_float, positive_int

# the ranges of the experiment's numeric flags (its parser lives in the library, which never imports the CLI)
_RANGES = {
    "train_size": non_negative_int,
    "dev_size": non_negative_int,
    "test_size": non_negative_int,
    "epochs": positive_int,
    "batch_size": positive_int,
    "lr": positive_float,
    "max_seq_length": positive_int,
}


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    experiments = add_actions(
        verbs,
        "bench",
        help="reproducible experiments (see `embforge bench cosent-vs-ce -h`)",
        dest="experiment",
    )
    cosent = experiments.add_parser(
        "cosent-vs-ce",
        help="CE vs CoSENT cross-encoders and Sentence-BERT softmax vs CoSENT bi-encoders, over seeds",
        description="Train each system on each data set over several seeds from the same base model and "
        "budget; print Spearman and accuracy tables (mean ± std).",
    )
    add_arguments(cosent)
    for action in cosent._actions:
        action.type = _RANGES.get(action.dest, action.type)
    cosent.set_defaults(func=run_bench_cosent)


def run_bench_cosent(args: argparse.Namespace) -> Mapping[str, object]:
    return run_benchmark(config_from_args(args))
