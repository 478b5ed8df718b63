"""Mining over 100k to 1M+ documents: peak memory with the corpus in shards on disk vs its float matrix in memory.

Random unit vectors (``--dim``, MiniLM's 384 by default) stand in for the encoded corpus: they are written once as
an :func:`~embforge.retrieval.corpus_cache.encode_corpus` folder (one ``.npy`` shard per 4,096 rows) under
``runs/corpus_scale/`` (ignored by git), by :func:`~embforge.retrieval.corpus_cache.write_shards`. Each
measurement is a fresh process that mines ``--queries`` queries (each a corpus vector plus noise, its known
positive) with ``mine_positions`` and the ``--index`` kind — the real path: the quantiser trained on a sample,
the index filled a shard at a time, queries mined in blocks of 4,096:

* ``shards``: the corpus vectors are read from the shards (:class:`CorpusEmbeddings`), as mining with
  ``corpus_cache`` does;
* ``in memory``: the same vectors first read into one float32 matrix (the peer: what holding the corpus's
  embeddings in RAM costs), then the same mining.

Reported per run: peak RSS of the process (``wait4``), its RSS after the imports, and the mining seconds. Usage::

    python benchmarks/bench_corpus_scale.py --sizes 100000,1000000 [--dim 64 --queries 1000 --sample 16384]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from _common import parent_or_child, run_child

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "corpus_scale"
BLOCK = 4096


def generate(rows: int, dim: int) -> Path:
    """The shards of ``rows`` random unit vectors (written once, a block at a time)."""
    import numpy as np

    from embforge.retrieval.corpus_cache import write_shards

    folder = OUT / f"docs_{rows}_{dim}"
    if (folder / "progress.json").exists():
        return folder
    rng = np.random.default_rng(rows)

    def blocks():
        for first in range(0, rows, BLOCK):
            block = rng.standard_normal((min(BLOCK, rows - first), dim)).astype(np.float32)
            yield block / np.linalg.norm(block, axis=1, keepdims=True)

    write_shards(folder, [str(i) for i in range(rows)], blocks(), block_size=BLOCK, rows=rows, dim=dim)
    return folder


def child(args: argparse.Namespace) -> None:
    """One mining run in its own process; prints a JSON line."""
    import numpy as np

    from embforge.retrieval import search
    from embforge.retrieval.corpus_cache import load_encoded
    from embforge.retrieval.mining import MiningConfig, mine_positions

    search.SAMPLE_ROWS = args.sample  # the vectors the quantiser is trained on (a fixed number at any size)

    imported_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _, emb = load_encoded(args.folder)
    rng = np.random.default_rng(0)
    positives = rng.choice(len(emb), size=args.queries, replace=False)
    q = emb.take(positives) + 0.3 * rng.standard_normal((args.queries, emb.dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    corpus = [""] * len(emb)  # dense mining reads only the corpus's length
    started = time.perf_counter()
    doc_emb = np.asarray(emb) if args.mode == "memory" else emb
    mined = mine_positions(
        [""] * args.queries,
        [[int(p)] for p in positives],
        corpus,
        MiningConfig(index=args.index, num_negatives=3),
        query_emb=q,
        doc_emb=doc_emb,
    )
    seconds = time.perf_counter() - started
    found = float((mined.negatives >= 0).all(axis=1).mean())
    print(json.dumps({"imported_rss_mb": imported_rss, "seconds": seconds, "complete_rows": found}))


def measure(folder: Path, mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", "--mode", mode, "--folder", str(folder)]
    command += ["--queries", str(args.queries), "--index", args.index, "--sample", str(args.sample)]
    return run_child(command, f"{mode} on {folder.name}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument(
        "--index", default="ivfpq", help="exact, ivfpq, pq, ... (see embforge.retrieval.index)"
    )
    parser.add_argument(
        "--sample", type=int, default=65_536, help="vectors the IVF/PQ quantiser is trained on"
    )
    args = parent_or_child(parser, child, "mode", "folder")
    if args is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"{'documents':>10}  {'float matrix':>12}  {'mode':<9}  {'peak RSS':>9}  {'after imports':>13}  "
          f"{'mining s':>8}  {'shards / in memory':>18}")  # fmt: skip
    for size in [int(s) for s in args.sizes.split(",")]:
        folder = generate(size, args.dim)
        matrix_mb = size * args.dim * 4 / 2**20
        runs = {mode: measure(folder, mode, args) for mode in ("shards", "memory")}
        for mode, r in runs.items():
            ratio = runs["shards"]["peak_rss_mb"] / runs["memory"]["peak_rss_mb"] if mode == "shards" else 1.0
            print(
                f"{size:>10,}  {matrix_mb:>9,.0f} MB  {mode:<9}  {r['peak_rss_mb']:>6,.0f} MB  "
                f"{r['imported_rss_mb']:>10,.0f} MB  {r['seconds']:>8.1f}  {ratio:>17.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
