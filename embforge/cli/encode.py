"""``embforge encode``: embed the texts of a file into a ``.npy`` array (one row per line/row)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from embforge.cli.common import add_batch_size_arg, add_model_arg
from embforge.cli.values import data_path, positive_int

if TYPE_CHECKING:
    from embforge.protocols import BatchEmbedder


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser("encode", help="embed texts into a .npy file", description=__doc__)
    add_model_arg(parser)
    parser.add_argument(
        "--input",
        type=data_path,
        required=True,
        help="a .txt file (one text per line) or a table with a 'text' column",
    )
    parser.add_argument("--output", required=True, help="output .npy file")
    parser.add_argument("--columns", default=None, help="column mapping for tables, e.g. 'sentence=text'")
    add_batch_size_arg(parser, default=32)
    parser.add_argument(
        "--dim", type=positive_int, default=None, help="truncate to this many dimensions (Matryoshka)"
    )
    parser.add_argument("--prompt-name", default=None, help="one of the model's prompts, e.g. query")
    parser.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="L2-normalise (default: the model's setting)",
    )
    parser.set_defaults(func=run_encode)


def read_texts(path: str, columns: str | None) -> list[str]:
    from embforge.data.tables import DataError, read_table

    if path.endswith(".txt") and columns is None:
        texts = []
        with open(path, encoding="utf-8-sig") as handle:
            for line, text in enumerate(handle, start=1):
                if not text.strip():
                    raise DataError(f"{path}:{line}: column 1: empty text")
                texts.append(text.rstrip("\r\n"))
        return texts
    data = read_table(path, columns=columns)
    data.require(["text"], purpose="encode")
    return data.columns["text"]


def run_encode(args: argparse.Namespace) -> Mapping[str, object] | None:
    import numpy as np

    from embforge.kinds import folder_record, is_single_vector, load_any
    from embforge.retrieval.sharded import is_main, sharded

    record = folder_record(args.model)
    if not record.single_vector:
        how = (
            "Score pairs with it in Python (CrossEncoder.predict)"
            if record.pair_scoring
            else "Encode it in Python (encode_document / encode_query) or through 'embforge serve'"
        )
        raise ValueError(
            f"{args.model} is a {record.kind.value} model; embforge encode writes one dense vector per text "
            f"(.npy). {how}"
        )
    texts = read_texts(args.input, args.columns)
    loaded = load_any(args.model)
    assert is_single_vector(loaded)  # its record says so
    model = sharded(
        cast("BatchEmbedder", loaded)
    )  # single-vector kinds are BatchEncodings  # torchrun: each process encodes a share (retrieval/sharded.py)
    emb = model.encode(
        texts,
        batch_size=args.batch_size,
        dim=args.dim,
        prompt_name=args.prompt_name,
        normalize=args.normalize,
        show_progress=True,
    )
    if not is_main():
        return None
    np.save(args.output, emb)
    return {"output": args.output, "rows": int(emb.shape[0]), "dim": int(emb.shape[1])}
