"""``embforge curate``: remove duplicates, near-duplicates, evaluation leakage and inconsistent pairs from a
training file; write the kept rows and a JSON report of every removed row (line, step, reason)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

from embforge.cli.common import add_batch_size_arg, config_from_args
from embforge.cli.values import data_path, finite_float, positive_int, ratio, similarity


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
    add_batch_size_arg(parser)
    parser.set_defaults(func=run_curate)


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
    write_rows(data, report.kept, args.output)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
    return {**report.summary(), "output": args.output, "report": args.report}
