"""Token pooling of a ColBERT index on SciFact: index size and NDCG@10 at pool factors 1/2/4, and pooling-aware training.

Two ColBERT models are made from all-MiniLM-L6-v2 and trained alike (embforge's ``colbert_scifact.py`` recipe: the
SciFact train (claim, relevant abstract) pairs, in-batch InfoNCE over MaxSim at temperature 1, batch 16, lr 1e-4,
``--steps`` steps, one seed): ``plain`` with the usual loss, ``pooled`` with the documents pooled at
``--train-factor`` in the loss (``MaxSimInfoNCELoss(pool_factor=...)``, ``--loss-option pool_factor=4`` on the
command line). Each model encodes the SciFact dev queries (121 with qrels) and a corpus of their judged abstracts
plus the first ``--max-corpus`` others (``RetrievalData.subset``, as ``embforge eval retrieval --max-corpus`` cuts
it) once; the document matrices are then pooled at each factor (:mod:`embforge.multivector.pooling`, pylate's
definition; and with the cluster means re-normalised, sentence-transformers' default) and searched by exact MaxSim.

Trained models and results are cached under ``--out`` (a finished part is reused; ``--models`` takes the trained
models from another run's folder)::

    HF_HUB_OFFLINE=1 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/token_pooling.py --steps 50
    HF_HUB_OFFLINE=1 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/token_pooling.py --steps 50 \
        --max-corpus -1 --models runs/token-pooling --out runs/token-pooling-full

Seeds 2 and 3 (``--out runs/token-pooling-s2`` ``--seed 2``, the same for 3), then their table (nothing trained)::

    .venv/bin/python benchmarks/token_pooling.py --summarize runs/token-pooling,runs/token-pooling-s2,runs/token-pooling-s3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _common import embforge_train_config


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/token-pooling")
    parser.add_argument("--models", default=None, help="where the trained models are (default: --out)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-corpus", type=int, default=400, help="abstracts besides the judged ones (-1: the whole 5,183)"
    )
    parser.add_argument("--factors", default="1,2,4", help="index pool factors")
    parser.add_argument(
        "--train-factor", type=float, default=4.0, help="pool factor of the pooling-aware loss"
    )
    parser.add_argument("--parts", default="plain,pooled", help="which trained models to score")
    parser.add_argument(
        "--summarize",
        default=None,
        help="comma-separated finished --out folders, one per seed: print NDCG@10 mean ± std over them and stop",
    )
    parser.set_defaults(epochs=1, device="cpu", amp="no")
    return parser.parse_args()


def trained(args: argparse.Namespace, part: str, pairs: Path):
    """The ColBERT model of ``part`` (``plain`` or ``pooled``), trained here unless ``OUT/part`` holds it."""
    import torch

    from embforge.data.tables import read_table
    from embforge.losses.late import MaxSimInfoNCELoss
    from embforge.modeling.resolve import resolve_model_path
    from embforge.multivector import MultiVectorEncoder
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    folder = Path(args.models or args.out) / part
    if (folder / "train_summary.json").exists():
        return MultiVectorEncoder.load(folder)
    torch.manual_seed(
        args.seed
    )  # the projection's and the marker rows' initialisation: the same for both parts
    model = MultiVectorEncoder.load(resolve_model_path("all-MiniLM-L6-v2"))
    factor = args.train_factor if part == "pooled" else 1
    task = Task("scifact", read_table(pairs), MaxSimInfoNCELoss(pool_factor=factor))
    config = embforge_train_config(args, folder, seed=args.seed, max_steps=args.steps, chunk_tokens=8192)
    started = time.perf_counter()
    train(model, [task], config)
    print(f"{part}: trained in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return model


def score(args: argparse.Namespace, part: str, pairs: Path) -> dict:
    """Index size and quality of ``part``'s model at each pool factor (the corpus encoded once)."""
    from embforge.data.builtin.scifact import load_scifact
    from embforge.evaluate.ranking import evaluate_run, run_from_topk
    from embforge.multivector.pooling import pool_documents
    from embforge.multivector.search import ExactMaxSimIndex

    model = trained(args, part, pairs)
    data = load_scifact("dev").subset(max_corpus=args.max_corpus if args.max_corpus >= 0 else None)
    started = time.perf_counter()
    documents = model.encode(data.documents, batch_size=32)
    queries = model.encode(data.query_texts, is_query=True)
    print(f"{part}: encoded in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for factor in [float(f) for f in args.factors.split(",")]:
        for normalize in (False, True) if factor > 1 else (False,):
            pooled = pool_documents(documents, factor, normalize=normalize)
            index = ExactMaxSimIndex()
            index.add(data.doc_ids, pooled)
            run = run_from_topk(data.query_ids, *index.search(queries, 100))
            metrics = evaluate_run(run, data.qrels, ["ndcg@10", "recall@100"])
            vectors = sum(len(m) for m in pooled)
            rows.append(
                {
                    "factor": factor,
                    "normalize": normalize,
                    "vectors": vectors,
                    "bytes": vectors * model.dim * 4,
                    **{name: 100 * value for name, value in metrics.items()},
                }
            )
    return {"part": part, "queries": len(data.query_ids), "documents": len(data.doc_ids), "rows": rows}


def table(results: list[dict]) -> None:
    print(
        f"\nSciFact dev, {results[0]['queries']} queries x {results[0]['documents']} abstracts, exact MaxSim"
    )
    print(
        "\n| trained | index pool factor | vectors | index MB (fp32) | vectors kept | NDCG@10 | % of unpooled "
        "NDCG@10 | recall@100 | NDCG@10, means re-normalised |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for result in results:
        rows = result["rows"]
        base = next(r for r in rows if r["factor"] == 1)
        renormalised = {r["factor"]: r for r in rows if r["normalize"]}
        for row in (r for r in rows if not r["normalize"]):
            other = renormalised.get(row["factor"])
            print(
                f"| {result['part']} | {row['factor']:g} | {row['vectors']:,} | {row['bytes'] / 2**20:.2f} | "
                f"{100 * row['vectors'] / base['vectors']:.1f} % | {row['ndcg@10']:.2f} | "
                f"{100 * row['ndcg@10'] / base['ndcg@10']:.1f} % | {row['recall@100']:.2f} | "
                f"{'–' if other is None else format(other['ndcg@10'], '.2f')} |"
            )
    by_part = {r["part"]: r for r in results}
    if {"plain", "pooled"} <= set(by_part):
        plain_base = next(r for r in by_part["plain"]["rows"] if r["factor"] == 1)["ndcg@10"]
        for part in ("plain", "pooled"):
            at = [r for r in by_part[part]["rows"] if r["factor"] == 4 and not r["normalize"]]
            if at:
                print(
                    f"{part}-trained model, index pooled at 4: {at[0]['ndcg@10']:.2f} NDCG@10 = "
                    f"{100 * at[0]['ndcg@10'] / plain_base:.1f} % of the plain model's unpooled {plain_base:.2f}"
                )


def summary(folders: list[Path], parts: list[str], factors: list[float]) -> None:
    """NDCG@10 (pylate's pooling) of each trained model at each index factor: mean ± std over ``folders``."""
    runs = [{part: json.loads((folder / f"{part}.json").read_text()) for part in parts} for folder in folders]
    if len({(r[part]["queries"], r[part]["documents"]) for r in runs for part in parts}) > 1:
        raise SystemExit(f"{', '.join(map(str, folders))} were not scored on the same queries and corpus")

    def ndcg(run: dict, part: str, factor: float) -> float:
        return next(r["ndcg@10"] for r in run[part]["rows"] if r["factor"] == factor and not r["normalize"])

    first = runs[0][parts[0]]
    print(f"\nSciFact dev, {first['queries']} queries x {first['documents']} abstracts, {len(runs)} runs")
    print("\n| trained | index pool factor | NDCG@10, mean ± std | per run | % of plain's unpooled mean |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.mean(ndcg(run, "plain", 1.0) for run in runs) if "plain" in parts else None
    for part in parts:
        for factor in factors:
            values = [ndcg(run, part, factor) for run in runs]
            mean, spread = statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0
            print(
                f"| {part} | {factor:g} | {mean:.2f} ± {spread:.2f} | {', '.join(f'{v:.2f}' for v in values)} | "
                f"{'–' if base is None else format(100 * mean / base, '.1f') + ' %'} |"
            )
    if {"plain", "pooled"} <= set(parts):
        for factor in factors:
            gaps = [ndcg(run, "pooled", factor) - ndcg(run, "plain", factor) for run in runs]
            spread = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
            print(
                f"pooled - plain at index factor {factor:g}, per run: {', '.join(f'{g:+.2f}' for g in gaps)} "
                f"(mean {statistics.mean(gaps):+.2f} ± {spread:.2f})"
            )


def main() -> None:
    args = arguments()
    if args.summarize:
        folders = [Path(folder) for folder in args.summarize.split(",")]
        summary(folders, args.parts.split(","), [float(f) for f in args.factors.split(",")])
        return
    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import training_pairs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = out / "pairs.jsonl"
    if not pairs.exists():
        rows = training_pairs(load_scifact("train"))
        texts = zip(rows.columns["anchor"], rows.columns["positive"])
        pairs.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in texts))
    results = []
    for part in args.parts.split(","):
        done = out / f"{part}.json"
        if not done.exists():
            done.write_text(json.dumps(score(args, part, pairs)) + "\n")
        results.append(json.loads(done.read_text()))
    table(results)


if __name__ == "__main__":
    sys.exit(main())
