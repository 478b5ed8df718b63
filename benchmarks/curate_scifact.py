"""Does ``embforge curate`` undo planted noise? SciFact train pairs: clean vs noisy (15 % planted) vs curated.

The clean file is the SciFact train split's ``anchor, positive`` pairs (what ``--retrieval-train`` trains on).
The noisy file plants 15 % noise into it, with a fixed seed: 10 % of the rows get another row's positive
(shuffled positives: a claim paired with an unrelated abstract) and 5 % more rows are duplicates of random rows
(half verbatim, half with changed case and spacing, which the normalised exact step must still catch). The
curated file is ``embforge curate --consistency --model all-MiniLM-L6-v2`` of the noisy one (exact duplicates,
MinHash near-duplicates, then pairs whose positive is not in the claim's top-10 among the file's abstracts).

Each file trains all-MiniLM-L6-v2 with the same recipe as ``cached_scifact.py``'s batch-32 row (InfoNCE,
in-batch negatives, 1 epoch, lr 5e-5, 128 tokens) and is scored on SciFact dev NDCG@10 against the full corpus.
Results go to ``OUT/<file>-<seed>.json`` (a rerun skips what exists); the table is printed at the end, with the
curation's precision and recall against the planted rows and its run time.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/curate_scifact.py --out runs/curate-scifact
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

from cached_scifact import EMBFORGE, recipe_arguments, run, train_and_score

from embforge.data.builtin.scifact import load_scifact
from embforge.data.retrieval import training_pairs

SHUFFLED, DUPLICATED = 0.10, 0.05


def plant(out: Path, seed: int = 0) -> dict[str, int]:
    """Write ``clean.jsonl`` and ``noisy.jsonl`` (+ ``planted.json``: the noisy file's planted lines)."""
    pairs = training_pairs(load_scifact("train"))
    rows = [{"anchor": a, "positive": p} for a, p in zip(pairs.columns["anchor"], pairs.columns["positive"])]
    rng = random.Random(seed)
    noisy = [dict(r) for r in rows]
    shuffled = rng.sample(range(len(rows)), round(SHUFFLED * len(rows)))
    # a derangement of the chosen rows' positives: each gets the next one's (distinct claims, unrelated abstracts)
    for i, j in zip(shuffled, shuffled[1:] + shuffled[:1]):
        noisy[i]["positive"] = rows[j]["positive"]
    sources = rng.choices(range(len(rows)), k=round(DUPLICATED * len(rows)))
    for k, i in enumerate(sources):
        copy = dict(noisy[i])
        if k % 2:
            copy["anchor"] = "  " + copy["anchor"].upper().replace(" ", "  ")
        noisy.append(copy)
    order = list(range(len(noisy)))
    rng.shuffle(order)
    noisy = [noisy[i] for i in order]
    line_of = {old: new + 1 for new, old in enumerate(order)}  # JSONL lines are 1-based
    # planted noise: every line carrying a shuffled positive, and each copy after the first of a duplicated row
    source_of = {**{i: i for i in range(len(rows))}, **{len(rows) + k: i for k, i in enumerate(sources)}}
    copies: dict[int, list[int]] = {}
    for row, source in source_of.items():
        copies.setdefault(source, []).append(line_of[row])
    chosen = set(shuffled)
    planted = {"shuffled": sorted(line_of[r] for r, source in source_of.items() if source in chosen)}
    planted["duplicates"] = sorted(line for lines in copies.values() for line in sorted(lines)[1:])
    for name, table in (("clean", rows), ("noisy", noisy)):
        with (out / f"{name}.jsonl").open("w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in table)
    (out / "planted.json").write_text(json.dumps(planted) + "\n")
    return {"clean": len(rows), "noisy": len(noisy), **{k: len(v) for k, v in planted.items()}}


def curate_noisy(out: Path) -> dict:
    """Run ``embforge curate`` on the noisy file; score what it removed against the planted lines."""
    report_file = out / "curate-report.json"
    if not report_file.exists():
        command = [
            *EMBFORGE,
            "curate",
            "--data",
            str(out / "noisy.jsonl"),
            "--output",
            str(out / "curated.jsonl"),
        ]
        command += ["--report", str(report_file), "--consistency", "--model", "all-MiniLM-L6-v2", "--quiet"]
        start = time.perf_counter()
        run(command)
        (out / "curate-seconds.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    report = json.loads(report_file.read_text())
    planted = json.loads((out / "planted.json").read_text())
    noise = set(planted["shuffled"]) | set(planted["duplicates"])
    removed = {r["line"] for r in report["rows"]}
    caught = len(removed & noise)
    return {
        "seconds": float((out / "curate-seconds.txt").read_text()),
        "removed": len(removed),
        "by_step": {k: v for k, v in report["removed"].items() if v},
        "planted": len(noise),
        "precision": caught / max(len(removed), 1),
        "recall": caught / len(noise),
        "shuffled_caught": len(removed & set(planted["shuffled"])) / len(planted["shuffled"]),
        "duplicates_caught": len(removed & set(planted["duplicates"])) / len(planted["duplicates"]),
    }


def main() -> None:
    args = recipe_arguments(__doc__, "runs/curate-scifact")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "planted.json").exists():
        print(json.dumps(plant(out)), flush=True)
    curation = curate_noisy(out)
    print(json.dumps(curation), flush=True)
    rows: dict[str, list[dict]] = {"clean": [], "noisy": [], "curated": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, results in rows.items():
            result_file = out / f"{name}-{seed}.json"
            if not result_file.exists():
                source = ["--train", str(out / f"{name}.jsonl")]
                result = train_and_score(
                    source, out / f"model-{name}-{seed}", args, batch=32, mini=0, seed=seed
                )
                result_file.write_text(json.dumps(result) + "\n")
                print(json.dumps({"file": name, **result}), flush=True)
            results.append(json.loads(result_file.read_text()))
    print("\n| training file | pairs | SciFact dev NDCG@10, mean ± std | per seed | train s / run |")
    print("|---|---:|---|---|---:|")
    for name, results in rows.items():
        ndcg = [r["ndcg@10"] for r in results]
        spread = statistics.stdev(ndcg) if len(ndcg) > 1 else 0.0
        pairs = sum(1 for _ in (out / f"{name}.jsonl").open())
        per_seed = ", ".join(f"{x:.2f}" for x in ndcg)
        train_s = statistics.mean(r["train_s"] for r in results)
        print(
            f"| {name} | {pairs} | {statistics.mean(ndcg):.2f} ± {spread:.2f} | {per_seed} | {train_s:.0f} |"
        )
    print(
        f"\ncuration: removed {curation['removed']} rows {curation['by_step']} in {curation['seconds']:.0f} s; "
        f"precision {curation['precision']:.2%}, recall {curation['recall']:.2%} "
        f"(shuffled {curation['shuffled_caught']:.0%}, duplicates {curation['duplicates_caught']:.0%})"
    )


if __name__ == "__main__":
    sys.exit(main())
