"""Cross-encoder verbs: ``eval pairs``, ``eval rerank`` and ``rerank`` (two-stage).

``eval pairs`` and ``eval rerank`` take a bi-encoder or a cross-encoder folder (detected from its config).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from embforge.cli.common import add_amp_arg, add_batch_size_arg, add_data_args, add_eval_kind
from embforge.cli.values import data_path, positive_int, ratio

if TYPE_CHECKING:
    from embforge.protocols import Embedder, PairScorer


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    pairs = add_eval_kind(evals, "pairs", run_eval_pairs)
    pairs.add_argument(
        "--dev",
        type=data_path,
        help="dev file for the accuracy threshold (default: searched on --data itself)",
    )
    rerank = add_eval_kind(evals, "rerank", run_eval_rerank)
    rerank.add_argument(
        "--all-queries", action="store_true", help="keep queries without a relevant candidate (scored 0)"
    )

    two_stage = verbs.add_parser(
        "rerank",
        help="two-stage retrieval: bi-encoder top-k, re-scored by a cross-encoder (metrics before/after)",
        description="Pool the candidates of a query/candidate/label file as the corpus, retrieve the top-k with "
        "the bi-encoder, re-score them with the cross-encoder, and report MRR@10/NDCG@10 before and after.",
    )
    two_stage.add_argument("--bi-model", default="all-MiniLM-L6-v2", help="bi-encoder for the first stage")
    two_stage.add_argument("--cross-model", required=True, help="cross-encoder folder for the second stage")
    add_data_args(two_stage)
    two_stage.add_argument(
        "--top-k", type=positive_int, default=20, help="candidates re-scored per query (default 20)"
    )
    add_batch_size_arg(two_stage)
    two_stage.add_argument(
        "--fusion",
        type=ratio,
        default=None,
        metavar="W",
        help="rank by W x z(cross score) + (1 - W) x z(bi cosine) over each query's top-k, W in [0, 1] (choose W "
        "on a dev split); default: the cross-encoder alone",
    )
    add_amp_arg(two_stage)
    two_stage.set_defaults(func=run_two_stage)


def load_any_model(path: str) -> Embedder | PairScorer:
    """A :class:`CrossEncoder` for a cross-encoder folder, else the kind the folder declares (an
    :class:`Encoder`, a static or sparse model ...; :func:`embforge.kinds.load_any`)."""
    from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
    from embforge.kinds import load_any

    return CrossEncoder.load(path) if is_cross_encoder_folder(path) else load_any(path)


def run_eval_pairs(args: argparse.Namespace) -> Mapping[str, object]:
    """pair classification: accuracy (threshold from --dev), F1, AP, ROC-AUC (0-100)

    Pair classification of a bi- or cross-encoder on sentence1, sentence2, label (0/1) rows.
    """
    from embforge.data.tables import read_table
    from embforge.evaluate.pairs import evaluate_pairs

    data = read_table(args.data, columns=args.columns, header=args.header, label_set=[0, 1])
    dev = (
        read_table(args.dev, columns=args.columns, header=args.header, label_set=[0, 1]) if args.dev else None
    )
    return evaluate_pairs(load_any_model(args.model), data, dev=dev, batch_size=args.batch_size)


def run_eval_rerank(args: argparse.Namespace) -> Mapping[str, object]:
    """MRR@10, NDCG@10, MAP (0-100) over each query's candidates

    Rank each query's candidates (rows sentence1=query, sentence2=candidate, label=grade).
    """
    from embforge.data.tables import read_table
    from embforge.evaluate.rerank import evaluate_rerank

    data = read_table(args.data, columns=args.columns, header=args.header)
    return evaluate_rerank(
        load_any_model(args.model), data, positives_only=not args.all_queries, batch_size=args.batch_size
    )


def run_two_stage(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.cross_encoder import CrossEncoder
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.retrieval.two_stage import evaluate_two_stage

    data = read_table(args.data, columns=args.columns, header=args.header)
    return evaluate_two_stage(
        Encoder.load(args.bi_model),
        CrossEncoder.load(args.cross_model),
        data,
        top_k=args.top_k,
        batch_size=args.batch_size,
        fusion=args.fusion,
    )
