"""Issue #52: the merging methods side by side — an STS-B specialist merged with its base by each method.

Base all-MiniLM-L6-v2, specialist ``runs/stsb-cosent`` (``make main``: CoSENT on STS-B train, one epoch). Rows:

- ``linear`` at t = 0, 0.25, 0.5, 0.75, 1 (t = 0 is the base, 1 the specialist): the straight line between them,
  the floor the other methods are read against;
- ``slerp`` t = 0.5; ``task_arithmetic`` at weight 0.5; ``ties``, ``dare_linear``, ``dare_ties`` at weights 0.5 and 1
  (density 0.5: TIES keeps the specialist's task vector's larger half, DARE a random half rescaled by 2);
- ``model_stock`` needs two or more fine-tuned models: the specialist and a second one (``--second``: the same
  recipe with another seed); its ratio comes from their task vectors' angle. Beside it, the second specialist
  alone and the plain average of the two (``linear`` 0.5/0.5), what Model Stock is read against.

Each row: STS-B test Spearman (1,379 pairs) and SciFact dev NDCG@10 (the 121 dev queries carved from the train
qrels: SciFact's test qrels are not in the data folder; ``--eval-docs N``: their judged documents plus N others,
not the whole 5,183-document corpus, to fit a small CPU budget), and ``vs line``: the SciFact NDCG@10 minus the
straight line's at the same STS Spearman (the line's points interpolated; positive: above the floor). Rows are
appended to ``OUT/rows.jsonl`` and skipped when present, so an interrupted run resumes.

Run (about a minute per row on 2 CPU cores)::

    HF_HUB_OFFLINE=1 .venv/bin/embforge train --train ../shared/data/stsb_en/stsb-en-train.csv \\
        --eval ../shared/data/stsb_en/stsb-en-dev.csv --output runs/stsb-cosent-seed1 --seed 1   # the 2nd one
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/merge_methods.py --specialist runs/stsb-cosent \\
        --second runs/stsb-cosent-seed1 --eval-docs 1000 --out runs/merge_methods
"""

from __future__ import annotations

import argparse
import json
from itertools import pairwise
from pathlib import Path
from typing import Any

LINE = (0.0, 0.25, 0.5, 0.75, 1.0)


def recipes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each row: its label, the Merger's arguments and the weights."""
    base, spec, second = args.base, args.specialist, args.second
    rows: list[dict[str, Any]] = [
        {"label": f"linear t={t:g}", "models": [base, spec], "method": "linear", "weights": [1 - t, t]}
        for t in LINE
    ]
    rows.append({"label": "slerp t=0.5", "models": [base, spec], "method": "slerp", "weights": [0.5, 0.5]})
    rows.append(
        {
            "label": "task_arithmetic w=0.5",
            "models": [spec],
            "base": base,
            "method": "task_arithmetic",
            "weights": [0.5],
        }
    )
    for w in (0.5, 1.0):
        for method in ("ties", "dare_linear", "dare_ties"):
            rows.append(
                {
                    "label": f"{method} w={w:g} d={args.density:g}",
                    "models": [spec],
                    "base": base,
                    "method": method,
                    "weights": [w],
                    "density": args.density,
                }
            )
    if second:
        rows.append(
            {"label": "second specialist", "models": [base, second], "method": "linear", "weights": [0, 1]}
        )
        rows.append(
            {
                "label": "average of the two",
                "models": [spec, second],
                "method": "linear",
                "weights": [0.5, 0.5],
            }
        )
        rows.append({"label": "model_stock", "models": [spec, second], "base": base, "method": "model_stock"})
    return rows


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from embforge.data.builtin import load_builtin
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.evaluate.sts import evaluate_sts
    from embforge.merge import Merger

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rows.jsonl"
    done = {r["label"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}
    sts = load_builtin("stsb", "test")
    scifact = load_builtin("scifact", "dev").subset(max_corpus=args.eval_docs)
    rows = []
    for recipe in recipes(args):
        if recipe["label"] in done:
            rows.append(done[recipe["label"]])
            continue
        merger = Merger(
            recipe["models"],
            method=recipe["method"],
            base=recipe.get("base"),
            density=recipe.get("density", 1.0),
            seed=args.seed,
        )
        model = merger.merge(recipe.get("weights"))
        row = {
            "label": recipe["label"],
            "sts": evaluate_sts(model, sts)["spearman"],
            "ndcg@10": evaluate_retrieval(model, scifact, metrics=["ndcg@10"], batch_size=32)["ndcg@10"],
            "docs": len(scifact.doc_ids),
            "queries": len(scifact.query_ids),
        }
        print(json.dumps(row), flush=True)
        with path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        rows.append(row)
    return rows


def line_at(line: list[dict[str, Any]], sts: float) -> tuple[float, bool]:
    """The straight line's SciFact NDCG@10 at STS Spearman ``sts``, and whether ``sts`` is past its ends (then the
    nearer end's NDCG@10: a point past the specialist's STS and above its NDCG@10 beats it on both)."""
    points = sorted((r["sts"], r["ndcg@10"]) for r in line)
    for (s0, n0), (s1, n1) in pairwise(points):
        if s0 <= sts <= s1:
            return (n0 if s1 == s0 else n0 + (sts - s0) / (s1 - s0) * (n1 - n0)), False
    return (points[0][1] if sts < points[0][0] else points[-1][1]), True


def table(rows: list[dict[str, Any]]) -> str:
    line = [r for r in rows if r["label"].startswith("linear t=")]
    out = ["| merge | STS-B test Spearman | SciFact dev NDCG@10 | vs line |", "|---|---:|---:|---:|"]
    for r in rows:
        at, past = line_at(line, r["sts"])
        vs = "" if r in line else f"{r['ndcg@10'] - at:+.2f}" + (" (past the end)" if past else "")
        out.append(f"| {r['label']} | {r['sts']:.2f} | {r['ndcg@10']:.2f} | {vs} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="all-MiniLM-L6-v2")
    parser.add_argument("--specialist", default="runs/stsb-cosent")
    parser.add_argument("--second", default=None, help="a second specialist (another seed), for model_stock")
    parser.add_argument("--density", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0, help="DARE's seed")
    parser.add_argument("--eval-docs", type=int, default=1000)
    parser.add_argument("--out", default="runs/merge_methods")
    args = parser.parse_args()
    rows = measure(args)
    print(f"SciFact dev: {rows[0]['queries']} queries, {rows[0]['docs']} documents")
    print(table(rows))


if __name__ == "__main__":
    main()
