"""Vector index benchmark: HNSW, IVF and fast-scan PQ recall@10 against exact search, and queries per second.

Data: ``--n`` random unit vectors of ``--dim`` dimensions (default 1M x 384) and/or a folder of corpus embeddings
written by :func:`embforge.retrieval.corpus_cache.encode_corpus` (``--embeddings``; e.g. the SciFact corpus). Queries are
``--queries`` random unit vectors (random data) or held-out corpus vectors (embeddings). Exact search is embforge's
numpy :class:`NumpyIndex` (tiled BLAS + torch top-k) and FAISS ``IndexFlatIP``; each ANN setting is timed over the same queries
(single batch call, all threads), recall@10 = overlap of its top-10 with the exact top-10.

Run: ``HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/bench_index.py --n 1000000``
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def unit(n, dim, seed):
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # in chunks: no float64 copy of the whole matrix
        x = rng.standard_normal((min(100_000, n - start), dim), dtype=np.float32)
        out[start : start + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def recall_at_10(found, truth):
    return float(np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(found, truth)]))


def bench(name, vectors, queries, args):
    from embforge.retrieval.index.exact import NumpyIndex
    from embforge.retrieval.index.faiss import FaissIndex

    ids = [str(i) for i in range(len(vectors))]
    print(f"\n## {name}: {len(vectors):,} x {vectors.shape[1]}, {len(queries)} queries")
    exact = NumpyIndex(vectors.shape[1])
    exact.add(ids, vectors)
    t_exact, (_, truth) = timed(lambda: exact.search(queries, 10))
    qps_exact = len(queries) / t_exact
    flat = FaissIndex(vectors.shape[1], kind="flat")
    flat.add(ids, vectors)
    t_flat, (_, flat_found) = timed(lambda: flat.search(queries, 10))
    print("| index | setting | build s | recall@10 | queries/s | x exact (numpy) |")
    print("|---|---|---|---|---|---|")
    print(f"| exact numpy | - | 0 | 1.000 | {qps_exact:,.0f} | 1.0 |")
    print(
        f"| FAISS flat | - | 0 | {recall_at_10(flat_found, truth):.3f} | {len(queries) / t_flat:,.0f} | "
        f"{t_exact / t_flat:.1f} |"
    )
    configs = [
        ("hnsw", {"m": args.hnsw_m, "ef_construction": args.ef_construction}, "ef_search", args.ef_search),
        ("ivf", {"nlist": args.nlist}, "nprobe", args.nprobe),
        ("pq", {"pq_m": args.pq_m}, "refine", args.refine),
    ]
    for kind, options, knob, values in (c for c in configs if c[0] in args.kinds.split(",")):
        index = FaissIndex(vectors.shape[1], kind=kind, **options)
        t_build, _ = timed(lambda index=index: index.add(ids, vectors))
        for value in values:
            index.set_search_options(**{knob: value})
            t, (_, found) = timed(lambda index=index: index.search(queries, 10))
            setting = (
                ", ".join(f"{k}={v}" for k, v in index.options.items() if k != knob) + f", {knob}={value}"
            )
            print(
                f"| FAISS {kind} | {setting} | {t_build:.1f} | {recall_at_10(found, truth):.3f} | "
                f"{len(queries) / t:,.0f} | {t_exact / t:.1f} |",
                flush=True,
            )
        del index


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000, help="random vectors (0 = skip)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--embeddings", default=None, help="encode_corpus folder (e.g. SciFact corpus)")
    parser.add_argument("--hnsw-m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=80)
    parser.add_argument(
        "--ef-search", type=lambda s: [int(x) for x in s.split(",")], default=[32, 64, 128, 256]
    )
    parser.add_argument("--nlist", type=int, default=None)
    parser.add_argument("--nprobe", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 32, 64])
    parser.add_argument("--pq-m", type=int, default=None, help="pq: sub-quantisers (default dim/2)")
    parser.add_argument("--refine", type=lambda s: [int(x) for x in s.split(",")], default=[5, 10, 20])
    parser.add_argument("--kinds", default="hnsw,ivf,pq", help="ANN kinds to run (comma-separated)")
    args = parser.parse_args()
    import faiss

    print(f"FAISS {faiss.__version__}, {faiss.omp_get_max_threads()} threads")
    if args.embeddings:
        from embforge.retrieval.corpus_cache import load_encoded

        _, emb = load_encoded(args.embeddings)
        emb = np.array(emb, dtype=np.float32)  # a writable copy of the memory map
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        held = np.random.default_rng(0).permutation(len(emb))
        queries, corpus = emb[held[: args.queries]], emb[np.sort(held[args.queries :])]
        bench(f"corpus embeddings {args.embeddings}", corpus, queries, args)
    if args.n:
        bench("random unit vectors", unit(args.n, args.dim, 0), unit(args.queries, args.dim, 1), args)


if __name__ == "__main__":
    main()
