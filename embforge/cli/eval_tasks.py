"""``embforge eval classification`` / ``clustering`` / ``matryoshka``: task evaluations printing a JSON line last."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from embforge.cli.common import add_batch_size_arg, add_data_args, add_eval_kind, add_model_arg
from embforge.cli.values import data_path, int_list, positive_int

if TYPE_CHECKING:
    from embforge.data.tables import Dataset


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = add_eval_kind(evals, "classification", run_classification, data_flag="--train")
    parser.add_argument(
        "--test", type=data_path, required=True, help="CSV/TSV/JSONL/Parquet file with text,label"
    )
    parser = add_eval_kind(evals, "clustering", run_clustering)
    parser.add_argument("--seeds", type=positive_int, default=3, help="k-means runs averaged (default 3)")

    parser = evals.add_parser(
        "matryoshka",
        help="an STS, classification or clustering evaluation at several truncated dimensions (+ PNG plot)",
        description="Evaluate at several embedding sizes; prints a table, saves a plot, JSON line last.",
    )
    add_model_arg(parser)
    parser.add_argument(
        "--task",
        choices=["sts", "classification", "clustering"],
        default="sts",
        help="which evaluation to run at each dimension (default sts)",
    )
    add_data_args(parser)
    parser.add_argument(
        "--train", type=data_path, help="classification: file the classifier is fitted on (--data is scored)"
    )
    parser.add_argument(
        "--dims", type=int_list, default=[64, 128, 256], help="e.g. 64,128,256 (full size added)"
    )
    parser.add_argument(
        "--output",
        "--plot",
        dest="plot",
        default=None,
        help="PNG file to write (default: matryoshka-<task>.png in the current folder)",
    )
    add_batch_size_arg(parser)
    parser.set_defaults(func=run_matryoshka)


def _load(
    path: str, columns: str | None, *, header: bool | None = None, label_names: list[str] | None = None
) -> Dataset:
    from embforge.data.tables import read_table

    return read_table(path, columns=columns, header=header, label_names=label_names)


def _shared_label_names(*paths: str, columns: str | None, header: bool | None = None) -> list[str] | None:
    """String labels of several files indexed in one sorted order (so train and test ids agree)."""
    from embforge.data.tables import read_table

    names: set[str] = set()
    for path in paths:
        data = read_table(path, columns=columns, header=header)
        if data.label_names is None:
            return None
        names |= set(data.label_names)
    return sorted(names)


def run_classification(args: argparse.Namespace) -> Mapping[str, object]:
    """logistic regression on frozen embeddings: accuracy and macro-F1 (0-100)

    Fit logistic regression on the embeddings of --train (text,label), score it on --test.
    """
    from embforge.encoder import Encoder
    from embforge.evaluate.classification import evaluate_classification

    names = _shared_label_names(args.train, args.test, columns=args.columns, header=args.header)
    train = _load(args.train, args.columns, header=args.header, label_names=names)
    test = _load(args.test, args.columns, header=args.header, label_names=names)
    return evaluate_classification(Encoder.load(args.model), train, test, batch_size=args.batch_size)


def run_clustering(args: argparse.Namespace) -> Mapping[str, object]:
    """k-means on embeddings (k = number of labels): V-measure (0-100)

    Cluster the embeddings of --data (text,label) with k-means and report V-measure.
    """
    from embforge.encoder import Encoder
    from embforge.evaluate.clustering import evaluate_clustering

    data = _load(args.data, args.columns, header=args.header)
    return evaluate_clustering(Encoder.load(args.model), data, batch_size=args.batch_size, seeds=args.seeds)


def run_matryoshka(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.encoder import Encoder
    from embforge.evaluate.matryoshka import evaluate_matryoshka, format_table, plot_matryoshka

    model = Encoder.load(args.model)
    if args.task == "sts":
        from embforge.evaluate.sts import evaluate_sts

        data = _load(args.data, args.columns, header=args.header)
        metric, evaluator = "spearman", lambda m: evaluate_sts(m, data, batch_size=args.batch_size)
    elif args.task == "classification":
        from embforge.evaluate.classification import evaluate_classification

        if not args.train:
            raise ValueError("--task classification needs --train FILE (the classifier's training data)")
        names = _shared_label_names(args.train, args.data, columns=args.columns, header=args.header)
        train, test = (
            _load(args.train, args.columns, header=args.header, label_names=names),
            _load(args.data, args.columns, header=args.header, label_names=names),
        )
        metric = "accuracy"
        evaluator = lambda m: evaluate_classification(m, train, test, batch_size=args.batch_size)  # noqa: E731
    else:
        from embforge.evaluate.clustering import evaluate_clustering

        data = _load(args.data, args.columns, header=args.header)
        metric, evaluator = "v_measure", lambda m: evaluate_clustering(m, data, batch_size=args.batch_size)
    result = evaluate_matryoshka(model, evaluator, args.dims, metric=metric)
    label = Path(str(args.model)).name
    print(format_table({label: result}))
    plot = Path(args.plot or f"matryoshka-{args.task}.png")  # never beside --data (a shared data folder)
    plot_matryoshka({label: result}, plot, title=f"{label}: {args.task} ({Path(args.data).name})")
    return {
        "metric": metric,
        "scores": {str(d): v for d, v in result["scores"].items()},
        "retained": {str(d): v for d, v in result["retained"].items()},
        "plot": str(plot),
    }
