"""Binary index with float rescoring vs exact float search on SciFact (all 809 claims, 5,183 abstracts), MiniLM.

The binary index (``--index-kind binary``) keeps the sign bits the server returns for ``encoding_format=ubinary``,
takes the ``rescore · k`` nearest in Hamming distance and re-scores them with the float vectors. Prints recall@10
and nDCG@10 against the qrels for exact search and for the binary index at several ``rescore`` values, their ratio
to exact, and how many of exact search's top 10 the binary index returns. Embeddings are cached in ``--cache``.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/binary_recall.py
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent


def ndcg_at_k(hits: list[str], relevant: dict[str, int], k: int) -> float:
    """nDCG@k with graded relevance (log2 discount)."""
    gains = [relevant.get(h, 0) for h in hits[:k]]
    ideal = sorted(relevant.values(), reverse=True)[:k]
    dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
    return float(dcg / sum(g / np.log2(i + 2) for i, g in enumerate(ideal)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--rescore", default="1,2,4,10")
    parser.add_argument("--cache", default=str(ROOT / "output" / "binary_recall"))
    args = parser.parse_args()

    from embforge.data.builtin.scifact import load_scifact
    from embforge.encoder import Encoder
    from embforge.retrieval.index.registry import create_index

    data = load_scifact("all")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    docs_file, queries_file = cache / "docs.npy", cache / "queries.npy"
    if not docs_file.exists():
        model = Encoder.load(args.model)
        started = time.perf_counter()
        np.save(queries_file, model.encode(data.query_texts, batch_size=64))
        np.save(docs_file, model.encode(data.documents, batch_size=32))
        print(f"encoded in {time.perf_counter() - started:.0f} s")
    docs, queries = np.load(docs_file), np.load(queries_file)

    def run(kind: str, **options) -> tuple[list[list[str]], float, float]:
        index = create_index(kind, docs.shape[1], **options)
        index.add(data.doc_ids, docs)
        hits = index.search(queries, 10)[1]
        recall = np.mean(
            [len(set(h) & set(data.qrels[q])) / len(data.qrels[q]) for q, h in zip(data.query_ids, hits)]
        )
        ndcg = np.mean([ndcg_at_k(h, data.qrels[q], 10) for q, h in zip(data.query_ids, hits)])
        return hits, float(recall), float(ndcg)

    exact, recall0, ndcg0 = run("exact")
    print(f"{len(data.query_ids)} claims, {len(data.doc_ids)} abstracts, {args.model}")
    print("| search | recall@10 | vs exact | nDCG@10 | vs exact | exact top-10 kept |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| exact (float) | {100 * recall0:.2f} | 1.000 | {100 * ndcg0:.2f} | 1.000 | 100.0 % |")
    for rescore in [int(x) for x in args.rescore.split(",")]:
        hits, recall, ndcg = run("binary", rescore=rescore)
        kept = np.mean([len(set(h) & set(e)) / len(e) for h, e in zip(hits, exact)])
        print(
            f"| binary, rescore {rescore} ({rescore * 10} candidates) | {100 * recall:.2f} | {recall / recall0:.3f} "
            f"| {100 * ndcg:.2f} | {ndcg / ndcg0:.3f} | {100 * kept:.1f} % |"
        )


if __name__ == "__main__":
    main()
