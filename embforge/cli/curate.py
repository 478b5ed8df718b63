"""``embforge curate``: remove duplicates, near-duplicates, evaluation leakage and inconsistent pairs from a
training file; with ``--relabel``/``--prune``, turn the mined negatives a judge scores as positives into positives
(or drop them) and drop rows the judge disagrees with; write the rows and a JSON report of every change."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

from embforge.cli.common import add_batch_size_arg, config_from_args
from embforge.cli.values import data_path, finite_float, non_negative_int, positive_int, ratio, similarity
from embforge.modeling.resolve import DEFAULT_MODEL


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "curate", help="deduplicate and filter a training file, with a report", description=__doc__
    )
    parser.add_argument("--data", type=data_path, required=True, help="training file (CSV/TSV/JSONL/Parquet)")
    parser.add_argument("--output", required=True, help="kept rows (.jsonl, .csv or .tsv)")
    parser.add_argument("--report", required=True, help="JSON report of what was removed and why")
    parser.add_argument("--no-exact", action="store_true", help="keep exact (normalised) duplicates")
    parser.add_argument(
        "--near", choices=("minhash", "embedding", "none"), default="minhash", help="near-duplicate method"
    )
    parser.add_argument(
        "--near-threshold",
        type=similarity,
        default=0.9,
        help="Jaccard (minhash, 0 to 1) or cosine (embedding, -1 to 1); default 0.9",
    )
    parser.add_argument(
        "--eval",
        nargs="*",
        type=data_path,
        default=[],
        help="evaluation files whose texts must not be trained on",
    )
    parser.add_argument(
        "--leak-threshold",
        type=ratio,
        default=None,
        help="also drop MinHash near-duplicates of evaluation texts (Jaccard, 0 to 1)",
    )
    parser.add_argument("--model", default=None, help="bi-encoder for --near embedding and --consistency")
    parser.add_argument(
        "--consistency",
        action="store_true",
        help="keep a pair only if its positive is in the anchor's top k under --model",
    )
    parser.add_argument(
        "--top-k",
        type=positive_int,
        default=10,
        help="with --consistency: the positive must rank in the top k (default %(default)s; a file with no more "
        "candidate texts than k is skipped with a warning)",
    )
    parser.add_argument("--cross-encoder", default=None, help="confirms pairs (rescues consistency failures)")
    parser.add_argument(
        "--cross-threshold", type=finite_float, default=0.5, help="cross-encoder score to confirm a pair"
    )
    add_relabel_args(parser)
    add_batch_size_arg(parser)
    parser.set_defaults(func=run_curate)


def add_relabel_args(parser: argparse.ArgumentParser) -> None:
    """The flags of false-negative relabelling and pruning (:mod:`embforge.relabel`)."""
    group = parser.add_argument_group("false negatives in mined rows (anchor, positive, negative_1..n)")
    group.add_argument(
        "--relabel",
        nargs="?",
        const="relabel",
        choices=("relabel", "drop"),
        default=None,
        help="a negative the judge scores at least as high as the positive (less --fn-margin) becomes the "
        "positive of an added row (relabel, the default), or is only removed (drop)",
    )
    group.add_argument(
        "--prune",
        nargs="?",
        const=1,
        type=positive_int,
        default=None,
        help="drop rows with at least K negatives scored above their positive (K default 1)",
    )
    group.add_argument(
        "--judge",
        default=DEFAULT_MODEL,
        help=f"cross-encoder, or bi-encoder scoring by cosine, for --relabel/--prune (default {DEFAULT_MODEL})",
    )
    group.add_argument(
        "--fn-margin",
        type=finite_float,
        default=0.0,
        help="false negative when its score >= the positive's - this (default 0)",
    )
    group.add_argument(
        "--fn-threshold", type=finite_float, default=None, help="also a false negative at or above this score"
    )
    group.add_argument(
        "--keep-negatives",
        type=positive_int,
        default=None,
        help="negative columns written (default: as many as the input); a row left short gets random "
        "negatives of other rows",
    )
    group.add_argument("--seed", type=non_negative_int, default=0, help="seed of the refilled negatives")


def run_curate(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.curate import CurateConfig, curate, write_rows
    from embforge.data.tables import read_table

    config = config_from_args(
        CurateConfig,
        args,
        exact=not args.no_exact,
        near=None if args.near == "none" else args.near,
        eval_files=list(args.eval),
    )
    data = read_table(args.data)
    report = curate(data, config, show_progress=not getattr(args, "quiet", False))
    written: dict[str, object] = report.to_json()
    summary = report.summary()
    if args.relabel is None and args.prune is None:
        write_rows(data, report.kept, args.output)
    else:
        from embforge.kinds import load_any
        from embforge.relabel import RelabelConfig, relabel

        options = RelabelConfig(
            action=args.relabel,
            margin=args.fn_margin,
            threshold=args.fn_threshold,
            prune=args.prune,
            negatives=args.keep_negatives,
            seed=args.seed,
            batch_size=args.batch_size,
        )
        rewritten, changes = relabel(data, load_any(args.judge), options, rows=report.kept)
        write_rows(rewritten, list(range(len(rewritten))), args.output)
        written["relabel"] = {"judge": args.judge, **changes.to_json()}
        summary = {**summary, "rows_out": changes.rows_out, "relabel": changes.summary()}
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")
    return {**summary, "output": args.output, "report": args.report}
