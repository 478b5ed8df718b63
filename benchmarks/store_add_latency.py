"""Add and search latency of the server's document store at 1k / 10k / 100k documents (random unit vectors).

For each size the store is filled (``DocumentStore.build``), reopened as the server opens it (each add one
SQLite transaction, fsynced), then ``--adds`` adds of ``--batch`` documents are timed, each followed by one search
(k=10), and a compaction (merge into the main index + save, SQLite checkpoint) is timed at the end (it runs off the
request path). Prints a JSON line per size: add p50/p95/max ms, search p50 ms, compaction seconds, bytes of
SQLite's log (``documents.sqlite-wal``) per add.

Run against an older checkout (``PYTHONPATH=OLD_CHECKOUT``) it times that store's ``add`` instead (it rewrote the
whole folder on each add), for the before/after table.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/store_add_latency.py --sizes 1000,10000,100000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _percentile(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 2)


def run(size: int, *, kind: str, dim: int, adds: int, batch: int, folder: Path) -> dict:
    from embforge.serve import store as store_module

    DocumentStore = store_module.DocumentStore
    rng = np.random.default_rng(size)
    ids = [f"doc{i}" for i in range(size)]
    texts = [f"text of document {i}" for i in range(size)]
    vectors = _unit(rng, size, dim)
    started = time.perf_counter()
    legacy = not hasattr(DocumentStore, "build")
    if legacy:  # the store that rewrote its folder per add: DocumentStore(dim, folder=..., index=kind)
        store = DocumentStore(dim, folder=folder, index=kind)
        store.add([{"id": i, "text": t} for i, t in zip(ids, texts)], vectors)
    else:
        DocumentStore.build(folder, ids, texts, vectors, kind=kind).close()
        store = DocumentStore.open(folder, dim=dim, compact_bytes=None)
    filled = time.perf_counter() - started
    add_times, search_times, log_sizes = [], [], []
    for n in range(adds):
        docs = [{"id": f"new{n}-{j}", "text": f"new text {n} {j}", "fields": {"n": n}} for j in range(batch)]
        new = _unit(rng, batch, dim)
        wal = folder / "documents.sqlite-wal"
        before = wal.stat().st_size if wal.exists() else 0
        t0 = time.perf_counter()
        store.add(docs, new)
        add_times.append(time.perf_counter() - t0)
        if not legacy and wal.exists() and wal.stat().st_size > before:  # (0 after SQLite's own checkpoint)
            log_sizes.append(wal.stat().st_size - before)
        t0 = time.perf_counter()
        hits = store.search(new[:1], 10)
        search_times.append(time.perf_counter() - t0)
        assert hits[0][0]["id"] == docs[0]["id"]
    compact = None
    if not legacy:
        t0 = time.perf_counter()
        store.compact()
        compact = round(time.perf_counter() - t0, 2)
        store.close()
    return {
        "store": "legacy" if legacy else "sqlite",
        "kind": kind,
        "documents": size,
        "fill_s": round(filled, 1),
        "add_p50_ms": _percentile(add_times, 50),
        "add_p95_ms": _percentile(add_times, 95),
        "add_max_ms": round(1000 * max(add_times), 2),
        "search_p50_ms": _percentile(search_times, 50),
        "log_bytes_per_add": int(np.mean(log_sizes)) if log_sizes else None,
        "compact_s": compact,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--kinds", default="exact", help="comma list of index kinds (exact, hnsw, ...)")
    parser.add_argument("--dim", type=int, default=384, help="vector size (384: MiniLM)")
    parser.add_argument("--adds", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8, help="documents per add")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            folder = Path(tempfile.mkdtemp(prefix="embforge-add-")) / "store"
            try:
                result = run(size, kind=kind, dim=args.dim, adds=args.adds, batch=args.batch, folder=folder)
            finally:
                shutil.rmtree(folder.parent, ignore_errors=True)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
