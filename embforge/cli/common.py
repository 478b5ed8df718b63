"""Argument helpers shared by the verbs."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, TypeVar

from embforge.cli.values import data_path, non_negative_int, positive_int
from embforge.modeling.precision import AMP_SETTINGS
from embforge.modeling.resolve import DEFAULT_MODEL

if TYPE_CHECKING:
    from embforge.data.retrieval import RetrievalData

T = TypeVar("T")


class _FlagOptions(TypedDict, total=False):
    action: str
    type: Callable[[str], object]
    default: object
    metavar: str | None
    choices: Sequence[str] | None


class Flag(NamedTuple):
    """One option of a verb as a table row (:func:`add_flags`): its name, help, value type and default; ``action``
    ``"append"`` repeats it, ``"store_true"`` makes it a switch (no value). A number's type is a range-checked one
    of :mod:`embforge.cli.values` (``positive_int``, ``ratio``, ``port`` ...), never a bare ``int`` or ``float``."""

    name: str
    help: str
    type: Callable[[str], object] = str
    default: object = None
    metavar: str | None = None
    choices: Sequence[str] | None = None
    action: str = "store"

    def options(self) -> _FlagOptions:
        """The keyword arguments of ``add_argument`` besides the help (a switch takes no value settings)."""
        if self.action == "store_true":
            return {"action": self.action}
        return _FlagOptions(
            action=self.action,
            type=self.type,
            default=self.default,
            metavar=self.metavar,
            choices=self.choices,
        )


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag]) -> None:
    """Add ``flags`` to ``parser``, in order."""
    for flag in flags:
        parser.add_argument(flag.name, help=flag.help, **flag.options())


def add_model_arg(parser: argparse.ArgumentParser, *, amp: bool = True) -> None:
    """``--model``, and (``amp``) the inference ``--amp`` that :func:`embforge.cli.main` applies around the verb."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model folder (HF or sentence-transformers layout) or alias (default {DEFAULT_MODEL})",
    )
    if amp:
        add_amp_arg(parser)


def add_amp_arg(parser: argparse.ArgumentParser) -> None:
    """The inference ``--amp``: :func:`embforge.cli.main` runs the verb under that autocast."""
    parser.add_argument(
        "--amp",
        dest="inference_amp",
        default="no",
        choices=AMP_SETTINGS,
        help="mixed precision of the forward passes: no (fp32, default), auto, bf16, fp16; bf16 about "
        "halves CPU encoding time on CPUs with native bf16 (embforge.modeling.precision)",
    )


def add_batch_size_arg(parser: argparse.ArgumentParser, *, default: int = 64) -> None:
    """``--batch-size``: texts per forward pass of the verb's model(s)."""
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=default,
        help="texts per forward pass (default %(default)s)",
    )


def add_corpus_cache_arg(parser: argparse.ArgumentParser, *, default: str = "in memory only") -> None:
    """``--corpus-cache DIR``: the resumable corpus embeddings (:mod:`embforge.retrieval.corpus_cache`), shared by
    the verbs that encode a corpus; ``default`` says what happens without it."""
    parser.add_argument(
        "--corpus-cache",
        default=None,
        metavar="DIR",
        help="keep the corpus embeddings here (resumable) and reuse them on the next run with the same model and "
        f"corpus (eval retrieval, mine and index build share it); default: {default}",
    )


def add_eval_kind(
    evals: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], object],
    *,
    data_flag: str = "--data",
) -> argparse.ArgumentParser:
    """``embforge eval NAME``: a model scored on one data file (``--model``, ``--amp``, the file's arguments,
    ``--batch-size``), run by ``func``; the parser, to add the evaluation's own arguments to.

    ``func``'s docstring is the help: its first line in ``embforge eval -h``, the rest the kind's description.
    """
    summary, _, details = inspect.cleandoc(func.__doc__ or name).partition("\n")
    parser = evals.add_parser(name, help=summary, description=details.strip() or summary)
    add_model_arg(parser)
    add_data_args(parser, flag=data_flag)
    add_batch_size_arg(parser)
    parser.set_defaults(func=func)
    return parser


def add_actions(
    verbs: argparse._SubParsersAction,
    name: str,
    *,
    help: str,
    dest: str,
    description: str | None = None,
) -> argparse._SubParsersAction:
    """A verb whose next word picks an action (``embforge index build``): the sub-parsers to add the actions to
    (one is required; listed as ``DEST`` in upper case)."""
    parser = verbs.add_parser(name, help=help, description=description)
    return parser.add_subparsers(dest=dest, required=True, metavar=dest.upper())


def add_data_args(parser: argparse.ArgumentParser, *, flag: str = "--data", required: bool = True) -> None:
    parser.add_argument(flag, type=data_path, required=required, help="CSV/TSV/JSONL/Parquet file")
    parser.add_argument(
        "--columns",
        default=None,
        help="map source columns (header names, spaces and '#' allowed, or 0-based positions) to standard "
        "names, e.g. '0=sentence1,1=sentence2,2=score' or 'Quality=label,#1 String=sentence1,#2 String=sentence2'; "
        "columns not named keep their standard names (one whose name a mapped column takes is left out), "
        "others are left out",
    )
    parser.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the CSV/TSV file has (--header) or has no (--no-header) header row (default: detected from the "
        "content; names in --columns imply a header)",
    )


def config_from_args(config_class: type[T], args: argparse.Namespace, **values: object) -> T:
    """A configuration dataclass filled from a verb's flags: each field ``values`` does not give is taken from the
    flag of the same name (``--max-inputs`` -> ``max_inputs``) when the verb has one, else keeps its default."""
    for field in dataclasses.fields(config_class):  # type: ignore[arg-type]
        if field.init and field.name not in values and hasattr(args, field.name):
            values[field.name] = getattr(args, field.name)
    return config_class(**values)


def parse_options(items: list[str] | None) -> dict[str, Any]:
    """``["scale=20", "symmetric=true"]`` -> ``{"scale": 20, "symmetric": True}``."""
    options: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"option {item!r} must look like NAME=VALUE")
        key, raw = item.split("=", 1)
        lowered = raw.strip().lower()
        if lowered in ("true", "false"):
            options[key.strip()] = lowered == "true"
            continue
        try:
            options[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = raw.strip()
    return options


class DeprecatedFlag(argparse.Action):
    """An old spelling of an option, kept for one release: stores into the new option's ``dest`` and says on
    stderr which spelling replaces it (``new``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        print(
            f"embforge: {option_string} is deprecated and will be removed in the next release; use {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_index_kind_arg(
    parser: argparse.ArgumentParser, *, old: str | None = None, default: str | None = "exact", note: str = ""
) -> None:
    """``--index-kind KIND`` (one vocabulary: ``--index-kind`` is a kind, ``--index`` a folder, everywhere), and
    ``old``, the deprecated spelling this verb used to have; ``note`` ends the help text."""
    from embforge.retrieval.index.registry import INDEX_KINDS

    kinds = ", ".join(INDEX_KINDS)
    parser.add_argument(
        "--index-kind",
        default=default,
        metavar="KIND",
        help=f"vector index: {kinds} (default: {default or 'an existing folder keeps its own; else exact'}){note}",
    )
    if old:
        parser.add_argument(
            old, dest="index_kind", action=DeprecatedFlag, new="--index-kind", help=argparse.SUPPRESS
        )


def add_subset_args(parser: argparse.ArgumentParser) -> None:
    """``--max-queries`` and ``--max-corpus``: a quick look at a retrieval set (``eval retrieval``, ``mine``)."""
    parser.add_argument(
        "--max-queries", type=positive_int, help="a quick look: the first N queries with qrels (default: all)"
    )
    parser.add_argument(
        "--max-corpus",
        type=non_negative_int,
        help="a quick look: a corpus of the queries' judged documents plus the first M others (default: the "
        "whole corpus; scores on a cut corpus are higher and compare only with the same cut)",
    )


def take_subset(
    args: argparse.Namespace, data: RetrievalData, verb: str
) -> tuple[RetrievalData, dict[str, int]]:
    """``data`` cut by ``--max-queries`` / ``--max-corpus`` (:meth:`RetrievalData.subset`, deterministic), said on
    stderr, and what was kept of what for the output JSON (``{}``: the whole set)."""
    if args.max_queries is None and args.max_corpus is None:
        return data, {}
    small = data.subset(max_queries=args.max_queries, max_corpus=args.max_corpus)
    asked = {"max_queries": args.max_queries, "max_corpus": args.max_corpus}
    of = {"of_queries": len(data.queries_with_qrels().query_ids), "of_documents": len(data.doc_ids)}
    print(
        f"{verb}: a subset of {data.name or args.data}: {len(small.query_ids)} of {of['of_queries']} queries, "
        f"{len(small.doc_ids)} of {of['of_documents']} documents (drop --max-queries/--max-corpus for all)",
        file=sys.stderr,
    )
    return small, {k: v for k, v in asked.items() if v is not None} | of
