"""InfoNCE variants on WikiQA: plain InfoNCE vs GTE's directions vs GIST's guided negatives (guide = the base model).

Each variant fine-tunes all-MiniLM-L6-v2 for the same steps on WikiQA's train (question, correct answer sentence)
pairs (the 873 answerable questions, 1,040 pairs; in-batch negatives only, τ = 0.05 for every variant, max 64
tokens, the same seed, so the same batches), then retrieves for each of the 243 answerable test questions among
all 5,951 distinct test candidate sentences pooled into one corpus (:func:`embforge.retrieval.two_stage.
pool_candidates`): NDCG@10 and MRR@10 (exact cosine search). Variants:

- ``infonce``: query → document softmax (``loss = "infonce"``);
- ``gte``: all four directions in one joint partition function (``directions = GTE_DIRECTIONS``, Li et al., 2023);
- ``gist``: ``loss = "gist"``, ``guide`` = the base model, absolute margin 0 (Solatorio, 2024), anchors and
  positives contrasted as in the paper;
- ``hardness`` (not in the default list): InfoNCE with ``hardness_mode = "in_batch_negatives"``, α = 9.

One result file per variant in ``OUT`` (a rerun skips what exists); the table is printed at the end.

    HF_HUB_OFFLINE=1 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/infonce_variants.py --steps 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from _common import quiet_config

from embforge.data.builtin.wikiqa import load_wikiqa
from embforge.data.tables import Dataset
from embforge.encoder import Encoder
from embforge.evaluate.ranking import evaluate_run
from embforge.losses import get_loss
from embforge.losses.infonce import GTE_DIRECTIONS
from embforge.retrieval.index.exact import topk_inner_product
from embforge.retrieval.two_stage import as_run, pool_candidates
from embforge.training.loop import train
from embforge.training.tasks import Task

METRICS = ("ndcg@10", "mrr@10")


def variants(model: str) -> dict[str, tuple[str, dict]]:
    """Variant name -> (loss name, options), every one at τ = 0.05."""
    return {
        "infonce": ("infonce", {"temperature": 0.05}),
        "gte": ("infonce", {"temperature": 0.05, "directions": list(GTE_DIRECTIONS)}),
        "gist": ("gist", {"temperature": 0.05, "guide": model, "margin_strategy": "absolute", "margin": 0.0}),
        "hardness": (
            "infonce",
            {"temperature": 0.05, "hardness_mode": "in_batch_negatives", "hardness_strength": 9.0},
        ),
    }


def train_pairs() -> Dataset:
    """WikiQA train: one ``(anchor, positive)`` row per correct answer sentence."""
    data = load_wikiqa("train")
    rows = [i for i, label in enumerate(data.columns["label"]) if label > 0]
    columns = {
        "anchor": [data.columns["sentence1"][i] for i in rows],
        "positive": [data.columns["sentence2"][i] for i in rows],
    }
    return Dataset("wikiqa-train-positives", columns, [data.lines[i] for i in rows])


def score(model: Encoder) -> dict[str, float]:
    """NDCG@10 / MRR@10 (0-100) of ``model`` on WikiQA test, every candidate sentence pooled into one corpus."""
    queries, corpus, qrels = pool_candidates(load_wikiqa("test"))
    q = model.encode(queries, batch_size=64, normalize=True, show_progress=False)
    d = model.encode(corpus, batch_size=64, normalize=True, show_progress=False)
    scores, positions = topk_inner_product(q, d, 10)
    ranking = [list(zip(map(int, p), map(float, s))) for p, s in zip(positions, scores)]
    metrics = evaluate_run(as_run(list(qrels), ranking), qrels, METRICS)
    return {name: round(100 * value, 2) for name, value in metrics.items()} | {
        "queries": len(queries),
        "documents": len(corpus),
    }


def run_variant(name: str, args: argparse.Namespace) -> dict:
    """Train variant ``name`` (or nothing for ``base``), score it, write ``OUT/<name>.json``."""
    out = Path(args.out)
    result_file = out / f"{name}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    model = Encoder.load(args.model, max_seq_length=args.max_seq_length)
    result: dict = {"variant": name}
    if name != "base":
        loss, options = variants(args.model)[name]
        task = Task("wikiqa", train_pairs(), get_loss(loss, **options))
        config = quiet_config(
            out / f"model-{name}",
            max_steps=args.steps,
            epochs=100,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            warmup_ratio=0.1,
        )
        started = time.perf_counter()
        summary = train(model, [task], config)
        result |= {"loss": loss, "options": options, "steps": summary["steps"]}
        result["train_s"] = round(time.perf_counter() - started, 1)
        shutil.rmtree(out / f"model-{name}", ignore_errors=True)
    result |= score(model)
    result_file.write_text(json.dumps(result) + "\n")
    print(json.dumps(result), flush=True)
    return result


def table(results: list[dict]) -> str:
    lines = [
        "| variant | loss and options | steps | NDCG@10 | MRR@10 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        shown = {k: v for k, v in r.get("options", {}).items() if k != "temperature"}
        if shown.get("directions") == list(GTE_DIRECTIONS):
            shown["directions"] = "all four (GTE), joint"
        options = ", ".join(f"{k} = {v}" for k, v in shown.items())
        how = f"`{r['loss']}` {options}".strip() if "loss" in r else "zero-shot"
        lines.append(
            f"| {r['variant']} | {how} | {r.get('steps', 0)} | {r['ndcg@10']:.2f} | {r['mrr@10']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument(
        "--variants", default="base,infonce,gte,gist", help="comma list: base,infonce,gte,gist,hardness"
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default="runs/infonce-variants")
    args = parser.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v != "base" and v not in variants(args.model)]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from base, {', '.join(variants(args.model))}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = [run_variant(name, args) for name in names]
    print(table(results))


if __name__ == "__main__":
    main()
