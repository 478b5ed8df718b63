"""``embforge eval retrieval``, ``embforge mine`` and ``embforge index build|search``.

One vocabulary: ``--index-kind`` is a kind (exact, flat, hnsw, ivf, ivfpq, pq, qdrant, binary) and ``--index``
a folder, in every verb. The old spellings (``--index KIND`` in ``eval retrieval`` and ``mine``, ``--kind`` in
``index build``) still work for this release, with a deprecation note on stderr.

``--data`` is a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) or the SciFact folder
(``corpus_train.csv``...; splits ``train``, ``dev``, ``all`` — see :mod:`embforge.data.builtin.scifact`).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from embforge.cli.common import (
    DeprecatedFlag,
    add_actions,
    add_batch_size_arg,
    add_corpus_cache_arg,
    add_index_kind_arg,
    add_model_arg,
    add_subset_args,
    config_from_args,
    parse_options,
    take_subset,
)
from embforge.cli.values import (
    data_path,
    finite_float,
    folder,
    non_negative_int,
    number,
    option,
    positive_int,
    ratio,
    seed,
)

if TYPE_CHECKING:
    from embforge.data.retrieval import RetrievalData
    from embforge.data.tables import Dataset
    from embforge.protocols import BatchEmbedder


def register(verbs: argparse._SubParsersAction, evals: argparse._SubParsersAction) -> None:
    _register_eval(evals)
    _register_mine(verbs)
    _register_index(verbs)


def _register_eval(evals: argparse._SubParsersAction) -> None:
    """``embforge eval retrieval``."""
    ev = evals.add_parser("retrieval", help="NDCG/MRR/MAP/Recall/Precision@k (0-100) on a BEIR folder")
    add_model_arg(ev)
    _add_data(ev, default_split=None)
    ev.add_argument("--metrics", default=None, help="comma list, e.g. ndcg@10,mrr@10,recall@100")
    add_index_kind_arg(ev, old="--index", note="; multi-vector models: exact or plaid; sparse: inverted")
    pool = "multi-vector models: pool each document's token vectors to about 1/F (pylate's pool_factor; default 1)"
    ev.add_argument("--pool-factor", type=number(1), metavar="F", help=pool)
    add_corpus_cache_arg(ev)
    add_batch_size_arg(ev)
    ev.add_argument(
        "--max-seq-length",
        type=positive_int,
        default=None,
        help="truncate texts to this many tokens (default: the model's)",
    )
    ev.set_defaults(func=run_eval)


def _register_mine(verbs: argparse._SubParsersAction) -> None:
    """``embforge mine``."""
    mine = verbs.add_parser("mine", help="mine hard negatives to JSONL (anchor, positive, negative_1..n)")
    add_model_arg(mine)
    _add_data(mine, default_split="train")
    mine.add_argument(
        "--pairs", type=data_path, default=None, help="an anchor,positive file instead of --data (pairs mode)"
    )
    mine.add_argument(
        "--corpus",
        type=data_path,
        default=None,
        help="pairs mode: extra documents (a file with a 'text' column)",
    )
    mine.add_argument("--output", required=True, help="JSONL file to write")
    mine.add_argument("--method", default="dense", help="dense, bm25 or hybrid (default dense)")
    mine.add_argument(
        "--num-negatives",
        type=positive_int,
        default=3,
        help="negatives per (query, positive) row (default 3)",
    )
    mine.add_argument(
        "--depth",
        type=positive_int,
        default=None,
        help="candidates per query (default: sized from --num-negatives and the filters)",
    )
    mine.add_argument(
        "--skip-top", type=non_negative_int, default=0, help="skip the first r surviving candidates"
    )
    mine.add_argument(
        "--relative-margin",
        type=number(0, 1, open_high=True),
        default=None,
        help="drop scores > (1-m) x positive, m in [0, 1)",
    )
    mine.add_argument("--absolute-margin", type=finite_float, default=None, help="drop scores > positive - a")
    mine.add_argument(
        "--max-score",
        type=finite_float,
        default=None,
        help="drop candidates scoring above this (likely positives)",
    )
    mine.add_argument(
        "--hard-ratio", type=ratio, default=1.0, help="hard share, 0 to 1, rest random (default 1)"
    )
    mine.add_argument("--sampling", default="top", help="top (default) or random, of the survivors")
    add_index_kind_arg(mine, old="--index")
    mine.add_argument(
        "--cross-encoder",
        default=None,
        metavar="MODEL",
        help="re-score candidates and positives with this cross-encoder; the margins then use its scores",
    )
    mine.add_argument(
        "--rescore-depth",
        type=positive_int,
        default=30,
        help="candidates per query the cross-encoder scores (default 30)",
    )
    add_batch_size_arg(mine, default=32)
    add_corpus_cache_arg(mine)
    mine.add_argument(
        "--seed", type=seed, default=0, help="seed of the random negatives and sampling (default 0)"
    )
    mine.set_defaults(func=run_mine)


def _register_index(verbs: argparse._SubParsersAction) -> None:
    """``embforge index build`` and ``embforge index search``."""
    sub = add_actions(verbs, "index", help="build or search a vector index of a corpus", dest="action")
    build = sub.add_parser("build", help="encode a corpus (resumable) and build an index folder")
    add_model_arg(build)
    build.add_argument("--data", required=True, help="BEIR or SciFact folder, or a corpus file with _id,text")
    build.add_argument(
        "--columns", default=None, help="corpus file column mapping, e.g. 'doc_id=_id,body=text'"
    )
    build.add_argument(
        "--index",
        "--output",
        dest="index",
        type=folder,
        required=True,
        help="index folder to write (replaced if it is one)",
    )
    add_index_kind_arg(build)
    build.add_argument(
        "--kind", dest="index_kind", action=DeprecatedFlag, new="--index-kind", help=argparse.SUPPRESS
    )
    build.add_argument(
        "--option", action="append", type=option, metavar="NAME=VALUE", help="index option, e.g. m=32"
    )
    add_corpus_cache_arg(build, default="a temporary folder")
    add_batch_size_arg(build)
    build.set_defaults(func=run_index_build)
    search = sub.add_parser("search", help="top-k documents (id, score, text) of query texts")
    add_model_arg(search)
    search.add_argument(
        "--index", type=folder, required=True, help="index folder written by 'index build' or the server"
    )
    search.add_argument(
        "--allow-model-mismatch",
        action="store_true",
        help="search even if the index was built by another model (its vectors will not match)",
    )
    search.add_argument("--query", action="append", required=True, help="query text (repeatable)")
    search.add_argument("-k", type=positive_int, default=10, help="hits per query (default 10)")
    search.set_defaults(func=run_index_search)


def _add_data(parser: argparse.ArgumentParser, *, default_split: str | None) -> None:
    parser.add_argument("--data", default=None, help="BEIR folder or the SciFact folder")
    default = default_split or "the data set's first of test, dev, validation (SciFact: dev)"
    parser.add_argument("--split", default=default_split, help=f"qrels split (default: {default})")
    add_subset_args(parser)


def load_data(folder: str | None, split: str) -> RetrievalData:
    """A BEIR or SciFact folder as :class:`~embforge.data.retrieval.RetrievalData`."""
    if folder is None:
        raise ValueError("--data FOLDER is required (a BEIR folder or the SciFact folder)")
    from embforge.data.folders import load_retrieval_folder

    return load_retrieval_folder(folder, split)


def run_eval(args: argparse.Namespace) -> Mapping[str, object] | None:
    from embforge.evaluate.retrieval import RETRIEVAL_METRICS, evaluate_retrieval
    from embforge.retrieval.index.registry import check_kind
    from embforge.retrieval.sharded import is_main, sharded

    split = args.split
    if split is None and args.data is not None:
        from embforge.data.folders import default_eval_split

        split = default_eval_split(args.data)
        print(
            f"eval retrieval: evaluating split {split!r} of {args.data} (choose with --split)",
            file=sys.stderr,
        )
    data, subset = take_subset(args, load_data(args.data, split), "eval retrieval")
    report = {"subset": subset} if subset else {}
    metrics = args.metrics.split(",") if args.metrics else RETRIEVAL_METRICS
    from embforge.kinds import folder_record, is_single_vector, load_any

    # a kind that scores retrieval its own way (its record's evaluator: ColBERT's MaxSim with --index-kind exact
    # or plaid, SPLADE's inverted index), in one process
    record = folder_record(args.model)
    own = record.evaluator("retrieval")
    pooled = {} if args.pool_factor is None else {"index_options": {"pool_factor": args.pool_factor}}
    if pooled and (own is None or "index_options" not in inspect.signature(own).parameters):
        raise ValueError(
            f"--pool-factor pools a multi-vector model's token vectors; {args.model} is {record.description}"
        )
    if own is not None:
        scores = own(
            load_any(args.model, max_seq_length=args.max_seq_length),
            data,
            metrics=metrics,
            batch_size=args.batch_size,
            index=args.index_kind,
            show_progress=True,
            **pooled,
        )
        return {**scores, **report}
    check_kind(args.index_kind)
    loaded = load_any(args.model, max_seq_length=args.max_seq_length)
    if not is_single_vector(loaded):
        raise ValueError(
            f"{args.model} is {record.description}: retrieval evaluation needs an embedding model"
        )
    model = sharded(cast("BatchEmbedder", loaded))  # a single-vector kind batches; torchrun: shares
    result = evaluate_retrieval(
        model,
        data,
        metrics=metrics,
        batch_size=args.batch_size,
        index=args.index_kind,
        corpus_cache=args.corpus_cache,
        show_progress=True,
    )
    return {**result, **report} if is_main() else None


def run_mine(args: argparse.Namespace) -> Mapping[str, object] | None:
    from embforge.data.tables import read_table
    from embforge.retrieval.index.registry import check_kind
    from embforge.retrieval.mining import MiningConfig, mine, write_jsonl
    from embforge.retrieval.sharded import is_main, sharded

    check_kind(args.index_kind)
    config = config_from_args(MiningConfig, args, index=args.index_kind)
    corpus = None
    subset: dict[str, int] = {}
    if args.pairs:
        for flag, value in (("--max-queries", args.max_queries), ("--max-corpus", args.max_corpus)):
            if value is not None:
                raise ValueError(f"{flag} applies to --data (a retrieval folder), not to --pairs")
        data: Dataset | RetrievalData = read_table(args.pairs)
        if args.corpus:
            corpus = read_table(args.corpus).columns.get("text")
            if corpus is None:
                raise ValueError(f"{args.corpus}: the corpus file needs a 'text' column")
    else:
        data, subset = take_subset(args, load_data(args.data, args.split), "mine")
    model = None
    if config.method != "bm25":
        from embforge.encoder import Encoder

        model = sharded(Encoder.load(args.model))  # under torchrun each process encodes a share
    rescorer = None
    if args.cross_encoder:
        from embforge.cross_encoder import CrossEncoder

        try:  # a folder of another kind is refused: it would score with an untrained head
            rescorer = CrossEncoder.load(args.cross_encoder)
        except ValueError as err:
            raise ValueError(f"--cross-encoder: {err}") from None
    rows = mine(model, data, config, corpus=corpus, rescorer=rescorer, corpus_cache=args.corpus_cache)
    if len(rows) == 0:
        stats = ", ".join(f"{k} {v}" for k, v in config.stats.items())
        raise ValueError(
            f"no rows were mined ({stats}): every query lacked {config.num_negatives} negatives that pass the "
            "filters; loosen --relative-margin/--absolute-margin/--max-score, raise --depth or lower "
            f"--num-negatives. Nothing was written to {args.output}"
        )
    if not is_main():
        return None
    path = write_jsonl(rows, args.output)
    return {"output": str(path), **config.stats, **({"subset": subset} if subset else {})}


def _corpus(folder: str, columns: str | None) -> tuple[list[str], list[str]]:
    root = Path(folder)
    if root.is_dir():
        data = load_data(folder, "all" if (root / "corpus_train.csv").exists() else _any_split(root))
        return data.doc_ids, data.documents
    from embforge.data.retrieval import read_texts
    from embforge.data.tables import parse_columns

    ids, titles, texts = read_texts(root, parse_columns(columns), with_title=True, kind="corpus")
    if not ids:
        raise ValueError(f"{root}:1: the corpus is empty")
    return ids, [f"{t} {x}".strip() for t, x in zip(titles, texts)]


def _any_split(root: Path) -> str:
    splits = sorted(p.stem for p in (root / "qrels").glob("*.tsv"))
    if not splits:
        raise FileNotFoundError(f"{root / 'qrels'} has no <split>.tsv file")
    return splits[0]


def run_index_build(args: argparse.Namespace) -> Mapping[str, object] | None:
    """Encode the corpus (resumable through ``--corpus-cache``) and write an index folder in the one format the
    server opens (:mod:`embforge.serve.store`): vectors, texts, the kind and the model that built it."""
    import tempfile
    import time

    import numpy as np

    from embforge.encoder import Encoder
    from embforge.retrieval.corpus_cache import encode_corpus, model_fingerprint
    from embforge.retrieval.index.registry import check_kind, create_index
    from embforge.retrieval.sharded import is_main, sharded
    from embforge.serve.store import DocumentStore, model_identity

    kind, options = check_kind(args.index_kind), parse_options(args.option)
    ids, texts = _corpus(args.data, args.columns)
    model = Encoder.load(args.model)
    create_index(kind, model.dim, **options).close()  # bad options fail here, before the corpus is encoded
    encoder = sharded(model)  # under torchrun each process encodes a share of each block; rank 0 writes
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="embforge-index-") as scratch:
        emb = encode_corpus(
            encoder,
            texts,
            ids,
            args.corpus_cache or scratch,
            batch_size=args.batch_size,
            model_tag=model_fingerprint(model),
        )
        encoded = time.perf_counter() - started
        if not is_main():
            return None
        store = DocumentStore.build(
            args.index,
            ids,
            texts,
            np.asarray(emb),
            kind=kind,
            options=options,
            model=model_identity(model, args.model),
        )
        store.close()
    return {
        "index": str(args.index),
        "kind": kind,
        "documents": len(ids),
        "encode_seconds": encoded,
        "build_seconds": time.perf_counter() - started - encoded,
    }


def run_index_search(args: argparse.Namespace) -> Mapping[str, object]:
    from embforge.encoder import Encoder
    from embforge.serve.store import DocumentStore, model_identity

    model = Encoder.load(args.model)
    store = DocumentStore.open(
        args.index,
        dim=model.dim,
        model=model_identity(model, args.model),
        allow_model_mismatch=args.allow_model_mismatch,
        read_only=True,
    )
    hits = store.search(model.encode(args.query), args.k)
    store.index.close()
    return {"results": [{"query": q, "hits": row} for q, row in zip(args.query, hits)]}
