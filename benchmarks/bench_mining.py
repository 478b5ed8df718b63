"""Hard-negative mining: embforge vs sentence-transformers' ``mine_hard_negatives`` on SciFact train queries.

Same model (all-MiniLM-L6-v2), same corpus, same filters, one process. Two measurements:

1. end to end (encode corpus + queries, search, filter), once per library on a corpus of ``--e2e-docs`` documents;
   ``--amp bf16`` runs embforge's forward passes under bf16 autocast (``embforge mine --amp bf16``) and
   ``--peer-amp bf16`` the peer's, each reported with how many negatives match the other side's;
2. mining only, on identical cached embeddings (sentence-transformers' own ``cache_folder`` files, which embforge
   reads too), alternating the two libraries for ``--rounds`` rounds; the negatives must then be identical.

Run: ``HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/bench_mining.py``
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import time

import numpy as np


def scifact_pairs(docs_limit: int | None, queries_limit: int | None = None):
    from embforge.data.builtin.scifact import load_scifact

    data = load_scifact("train")
    if queries_limit is not None:
        data = data.subset_queries(data.query_ids[:queries_limit])
    position = {d: i for i, d in enumerate(data.doc_ids)}
    documents = data.documents
    anchors, positives = [], []
    for qid, text in zip(data.query_ids, data.query_texts):
        for did, grade in data.qrels[qid].items():
            if grade > 0:
                anchors.append(text)
                positives.append(documents[position[did]])
    corpus = documents
    if docs_limit is not None and docs_limit < len(documents):
        needed = set(positives)
        others = [d for d in documents if d not in needed][: max(0, docs_limit - len(needed))]
        corpus = [d for d in documents if d in needed or d in set(others)]
    return anchors, positives, corpus


def inject_random_cache(model, anchors, positives, corpus, cache, dim):
    """Write stand-in embeddings where sentence-transformers' cache looks for them (its own file naming).

    Documents are seeded random unit vectors; a query is its positives' mean plus as much noise, normalised, so that
    positives score high (about 0.7) as with a real model, and the margin filters have real work to do.
    """
    import hashlib

    queries = list(dict.fromkeys(anchors))
    documents = list(dict.fromkeys(corpus + positives))
    position = {t: i for i, t in enumerate(documents)}
    name = model.model_card_data.base_model or ""
    os.makedirs(cache, exist_ok=True)
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((len(documents), dim)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    rows = {q: [] for q in queries}
    for a, p in zip(anchors, positives):
        rows[a].append(position[p])
    qs = np.stack([docs[rows[q]].mean(axis=0) for q in queries])
    qs += rng.standard_normal(qs.shape).astype(np.float32) / np.sqrt(dim)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    for kind, texts, x in (("query", queries, qs), ("corpus", documents, docs)):
        digest = hashlib.sha256(repr((name, None, None, texts)).encode()).hexdigest()
        np.save(f"{cache}/{kind}_embeddings_{digest}.npy", x)


def run_st(st, model, anchors, positives, corpus, args, cache):
    from datasets import Dataset as HFDataset

    started = time.perf_counter()
    out = st.util.mine_hard_negatives(
        HFDataset.from_dict({"anchor": anchors, "positive": positives}),
        model,
        corpus=corpus,
        num_negatives=args.num_negatives,
        range_min=args.skip_top,
        relative_margin=args.relative_margin,
        output_format="n-tuple",
        batch_size=args.batch_size,
        cache_folder=cache,
        verbose=False,
    )
    return time.perf_counter() - started, out


def run_ours(model, anchors, positives, corpus, args, emb=None):
    from embforge.data.tables import Dataset
    from embforge.retrieval.mining import MiningConfig, mine

    config = MiningConfig(
        num_negatives=args.num_negatives,
        skip_top=args.skip_top,
        relative_margin=args.relative_margin,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
    )
    pairs = Dataset("pairs", {"anchor": anchors, "positive": positives}, list(range(len(anchors))))
    started = time.perf_counter()
    if emb is not None:
        emb = (np.load(emb[0]), np.load(emb[1]))  # loading the cache is part of the timed work, as for ST
    rows = mine(
        model,
        pairs,
        config,
        corpus=corpus,
        query_emb=None if emb is None else emb[0],
        doc_emb=None if emb is None else emb[1],
    )
    return time.perf_counter() - started, rows


def agreement(ours, theirs, n):
    """How many negatives agree, row by row; rows are matched by (anchor, positive) when the counts differ."""
    key = lambda anchor, positive: (anchor, positive)  # noqa: E731
    theirs_rows = {
        key(theirs["anchor"][r], theirs["positive"][r]): [theirs[f"negative_{j}"][r] for j in range(1, n + 1)]
        for r in range(len(theirs))
    }
    same = total = 0
    for r in range(len(ours)):
        other = theirs_rows.get(key(ours.columns["anchor"][r], ours.columns["positive"][r]))
        if other is None:
            continue
        mine = [ours.columns[f"negative_{j}"][r] for j in range(1, n + 1)]
        same += sum(a == b for a, b in zip(mine, other))
        total += n
    rows = "" if len(ours) == len(theirs) else f"; rows {len(ours)} vs {len(theirs)}"
    return f"{same}/{total} negatives identical ({100 * same / max(1, total):.2f}%){rows}"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=None, help="corpus size for the mining-only rounds")
    parser.add_argument("--e2e-docs", type=int, default=None, help="corpus size for the end-to-end run")
    parser.add_argument("--e2e-queries", type=int, default=None, help="train queries for the end-to-end run")
    parser.add_argument("--num-negatives", type=int, default=5)
    parser.add_argument("--skip-top", type=int, default=0)
    parser.add_argument("--relative-margin", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=None, help="embforge: token-budget batches")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-e2e", action="store_true", help="only the mining-only rounds")
    parser.add_argument(
        "--inject-random",
        action="store_true",
        help="mining-only rounds: write seeded random unit vectors as the cached embeddings instead of encoding "
        "(measures the mining stage at full SciFact scale when encoding it would take too long)",
    )
    parser.add_argument("--amp", default="no", help="embforge's inference precision (no, bf16, auto)")
    parser.add_argument("--peer-amp", default="no", help="the same for sentence-transformers' forward passes")
    parser.add_argument("--cache", default="runs/bench-mining")
    args = parser.parse_args()
    import sentence_transformers as st
    import torch

    from embforge.encoder import Encoder
    from embforge.modeling.precision import inference_autocast
    from embforge.modeling.resolve import resolve_model_path

    path = str(resolve_model_path("all-MiniLM-L6-v2"))
    st_model = st.SentenceTransformer(path, device="cpu")
    ours_model = Encoder.load(path)
    print(f"torch threads {torch.get_num_threads()}; cpu count {os.cpu_count()}")
    # 1. end to end
    anchors, positives, corpus = scifact_pairs(args.e2e_docs, args.e2e_queries)
    e2e_cache = f"{args.cache}/e2e-{len(corpus)}"
    if not args.skip_e2e:
        n_docs = len(set(corpus) | set(positives))
        print(f"end to end: {len(set(anchors))} queries, {len(anchors)} pairs, corpus {n_docs}")
        with inference_autocast(args.amp):
            t_ours, rows_ours = run_ours(ours_model, anchors, positives, corpus, args)
        shutil.rmtree(e2e_cache, ignore_errors=True)  # sentence-transformers must really encode here
        with inference_autocast(args.peer_amp):
            t_st, rows_st = run_st(st, st_model, anchors, positives, corpus, args, e2e_cache)
        agree = agreement(rows_ours, rows_st, args.num_negatives)
        print(
            f"| end to end (peer amp {args.peer_amp}, embforge amp {args.amp}) | {t_st:.1f} s | {t_ours:.1f} s | "
            f"{t_st / t_ours:.2f}x | {agree} |"
        )
    # 2. mining only, on the same cached embeddings
    anchors, positives, corpus = scifact_pairs(args.docs)
    cache = f"{args.cache}/mine-{'synthetic-' if args.inject_random else ''}{len(corpus)}"
    if args.docs == args.e2e_docs and args.e2e_queries is None and not args.skip_e2e:
        cache = e2e_cache
    elif args.inject_random:
        inject_random_cache(st_model, anchors, positives, corpus, cache, st_model.get_embedding_dimension())
    else:
        run_st(st, st_model, anchors, positives, corpus, args, cache)  # fills the cache
    query_file = glob.glob(f"{cache}/query_embeddings_*.npy")[0]
    corpus_file = glob.glob(f"{cache}/corpus_embeddings_*.npy")[0]
    print(
        f"mining only: {len(set(anchors))} queries, corpus {len(np.load(corpus_file))}, rounds {args.rounds}"
    )
    times_st, times_ours = [], []
    for _ in range(args.rounds):
        t, rows_st = run_st(st, st_model, anchors, positives, corpus, args, cache)
        times_st.append(t)
        t, rows_ours = run_ours(None, anchors, positives, corpus, args, emb=(query_file, corpus_file))
        times_ours.append(t)
    m_st, m_ours = statistics.median(times_st), statistics.median(times_ours)
    print(
        f"| mining only (median of {args.rounds}) | {m_st:.3f} s | {m_ours:.3f} s | {m_st / m_ours:.2f}x | "
        f"{agreement(rows_ours, rows_st, args.num_negatives)} |"
    )


if __name__ == "__main__":
    main()
