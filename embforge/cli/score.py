"""``embforge score``: add a teacher's scores to a pair, triplet or mined file, once, for distillation.

Pairs get one ``score`` per row, rows with several candidates (triplets, mined negatives) a list
``[T(q,p), T(q,n_1), …]`` (JSONL). A cross-encoder teacher gives raw logits, a bi-encoder the cosine; train
``margin_mse`` or ``kl_distill`` on the output.

``--lists SIZE`` first turns a file of ``(query, candidate)`` rows (reranking data, labels ignored) into one row per
query and ``SIZE`` candidates (:func:`embforge.distill.lists.candidate_lists`): unlabelled candidate lists scored
by the teacher, for ``kl_distill``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from embforge.cli.common import add_amp_arg, add_batch_size_arg, add_data_args
from embforge.cli.values import integer, seed


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "score", help="add a teacher's scores to a pair/triplet/mined file", description=__doc__
    )
    parser.add_argument("--teacher", required=True, help="cross-encoder or bi-encoder folder (or alias)")
    add_amp_arg(parser)
    add_data_args(parser)
    parser.add_argument("--output", required=True, help="output .jsonl (or .csv/.tsv for pair scores)")
    parser.add_argument(
        "--kind",
        choices=("auto", "cross", "bi"),
        default="auto",
        help="teacher kind (default: auto, from the folder's config)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing score/label column")
    parser.add_argument(
        "--lists",
        type=integer(2, name="list_size"),
        default=None,
        metavar="SIZE",
        help="group (query, candidate) rows by query into rows of SIZE >= 2 candidates (labels ignored; short "
        "lists topped up with other queries' candidates at random) before scoring",
    )
    parser.add_argument("--seed", type=seed, default=0, help="seed of the --lists top-up (default 0)")
    add_batch_size_arg(parser, default=32)
    parser.set_defaults(func=run_score)


def run_score(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
    from embforge.data.tables import read_table
    from embforge.distill.lists import candidate_lists
    from embforge.distill.signals import score_rows, write_scored
    from embforge.encoder import Encoder

    data = read_table(args.data, columns=args.columns, header=args.header)
    if args.lists is not None:
        data = candidate_lists(data, size=args.lists, seed=args.seed)
    if data.label_column is not None and not args.overwrite:  # fail before the teacher runs
        raise ValueError(
            f"{args.data}: already has a {data.label_column!r} column; pass --overwrite to replace it"
        )
    cross = args.kind == "cross" or (args.kind == "auto" and is_cross_encoder_folder(args.teacher))
    teacher: Encoder | CrossEncoder = CrossEncoder.load(args.teacher) if cross else Encoder.load(args.teacher)
    scores = score_rows(
        teacher, data, batch_size=args.batch_size, show_progress=not getattr(args, "quiet", False)
    )
    out = write_scored(data, scores, args.output, overwrite=args.overwrite)
    return {
        "output": str(out),
        "rows": len(data),
        "teacher": "cross" if cross else "bi",
        "list_scores": len(data.text_columns) > 2,
    }
