"""``embforge bench <experiment>``: reproducible experiments (:mod:`embforge.bench`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.bench.cosent_vs_ce import add_arguments, config_from_args, run_benchmark
from embforge.cli.common import add_actions


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
    cosent.set_defaults(func=run_bench_cosent)


def run_bench_cosent(args: argparse.Namespace) -> Mapping[str, object]:
    return run_benchmark(config_from_args(args))
