"""Do relabelled or pruned mined negatives train a better retriever? SciFact train, BM25 negatives, MiniLM judge.

1. ``embforge mine --method bm25 --num-negatives 8`` on the SciFact train queries (688 claims, the dev queries held
   out; see :mod:`embforge.data.builtin.scifact`). BM25 mines, so the judge is not the miner: with the same model
   in both roles the false-negative rule would only flag what the miner itself ranked above the positive.
2. all-MiniLM-L6-v2 judges every (claim, abstract) pair by cosine (:func:`embforge.relabel.judge_scores`, once;
   the CLI runs the same code: ``embforge curate --relabel``). Files, each with 3 negative columns:
   ``original`` (the first 3 mined negatives), ``relabel`` (false negatives become positives of added rows,
   RLHN), ``drop`` (false negatives only removed, "HN remove"), ``prune`` (rows with ``--prune K`` negatives
   above the positive dropped).
3. Each file trains all-MiniLM-L6-v2 (InfoNCE with the hard negatives plus in-batch negatives, ``--steps``, batch
   ``--batch-size``, lr 5e-5, 128 tokens) per seed, scored on SciFact dev NDCG@10 (121 claims) against a corpus of
   the judged abstracts plus ``--max-corpus`` others (0: all 5,183).

Results go to ``OUT/<file>-<seed>.json`` (a rerun skips what exists); the table is printed at the end.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/relabel_scifact.py \\
        --out runs/relabel-scifact --seeds 1,2,3 --steps 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from cached_scifact import EMBFORGE, run

from embforge.data.paths import data_root
from embforge.data.tables import Dataset, read_table

FILES = ("original", "relabel", "drop", "prune")
Scorer = Callable[[str, argparse.Namespace], dict]  # (model folder or alias, args) -> metrics


class CachedJudge:
    """The judge's vectors computed once for every variant (a dense bi-encoder as far as relabel can tell)."""

    def __init__(self, model: Any) -> None:
        self.model, self.vectors = model, {}

    def encode(self, texts: list[str], **options: Any) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if missing:
            self.vectors.update(zip(missing, self.model.encode(missing, batch_size=32, show_progress=True)))
        return np.stack([self.vectors[t] for t in texts])


def first_negatives(data: Dataset, width: int) -> Dataset:
    keep = ["anchor", "positive", *[f"negative_{k}" for k in range(1, width + 1)]]
    return Dataset(data.path, {c: data.columns[c] for c in keep}, data.lines)


def make_files(out: Path, args: argparse.Namespace, *, source: list[str] | None = None) -> dict[str, Any]:
    """Mine, judge and write the four training files; returns the relabelling counts.

    ``source``: the data flags of ``embforge mine`` (default: the SciFact train split).
    """
    from embforge.curate import write_rows
    from embforge.encoder import Encoder
    from embforge.relabel import RelabelConfig, relabel

    mined = out / "mined.jsonl"
    if not mined.exists():
        source = source or ["--data", str(data_root() / "scifact"), "--split", "train"]
        command = [*EMBFORGE, "mine", *source, "--method", "bm25"]
        run([*command, "--num-negatives", "8", "--output", str(mined), "--quiet"])
    counts_file = out / "counts.json"
    if counts_file.exists():
        return json.loads(counts_file.read_text())
    data = read_table(mined)
    judge = CachedJudge(Encoder.load("all-MiniLM-L6-v2"))
    write_rows(first_negatives(data, args.negatives), list(range(len(data))), str(out / "original.jsonl"))
    counts: dict[str, Any] = {"original": {"rows_out": len(data)}}
    settings = {
        "relabel": RelabelConfig(negatives=args.negatives),
        "drop": RelabelConfig(action="drop", negatives=args.negatives),
        "prune": RelabelConfig(action=None, prune=args.prune, negatives=args.negatives),
    }
    for name, config in settings.items():
        rows, report = relabel(data, judge, config)
        write_rows(rows, list(range(len(rows))), str(out / f"{name}.jsonl"))
        counts[name] = report.summary()
        print(json.dumps({name: counts[name]}), flush=True)
    counts_file.write_text(json.dumps(counts) + "\n")
    return counts


def train_and_score(
    name: str, seed: int, out: Path, args: argparse.Namespace, *, scorer: Scorer | None = None
) -> dict:
    """Train all-MiniLM-L6-v2 on ``OUT/<name>.jsonl``; ``scorer`` (default: SciFact dev NDCG@10) scores the model."""
    model = out / f"model-{name}-{seed}"
    train = [*EMBFORGE, "train", "--train", str(out / f"{name}.jsonl"), "--loss", "infonce"]
    train += ["--batch-size", str(args.batch_size), "--max-steps", str(args.steps), "--lr", "5e-5"]
    train += [
        "--seed",
        str(seed),
        "--max-seq-length",
        "128",
        "--save-every",
        "0",
        "--quiet",
        "--output",
        str(model),
    ]
    report, train_s = run(train)
    return {
        "file": name,
        "seed": seed,
        "steps": report.get("steps"),
        "train_s": train_s,
        **(scorer or score)(str(model), args),
    }


def score(model: str, args: argparse.Namespace) -> dict:
    command = [*EMBFORGE, "eval", "retrieval", "--model", model, "--data", str(data_root() / "scifact")]
    command += ["--split", "dev", "--quiet"]
    if args.max_corpus:
        command += ["--max-corpus", str(args.max_corpus)]
    scores, _ = run(command)
    return {"ndcg@10": scores["ndcg@10"]}


@cache
def rows_in(path: Path) -> int:
    return sum(1 for _ in path.open())


def train_all(out: Path, args: argparse.Namespace, *, scorer: Scorer) -> tuple[dict, dict[str, list[dict]]]:
    """The untrained model's scores and every (file, seed) result of ``args.seeds``; a rerun skips what exists."""
    base_file = out / "base.json"
    if not base_file.exists():
        base_file.write_text(json.dumps(scorer("all-MiniLM-L6-v2", args)) + "\n")
    results: dict[str, list[dict]] = {name: [] for name in FILES}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in FILES:
            result_file = out / f"{name}-{seed}.json"
            if not result_file.exists():
                result = train_and_score(name, seed, out, args, scorer=scorer)
                result_file.write_text(json.dumps(result) + "\n")
                print(result_file.read_text().strip(), flush=True)
            results[name].append(json.loads(result_file.read_text()))
    return json.loads(base_file.read_text()), results


def print_table(out: Path, counts: dict, results: dict[str, list[dict]], *, metric: str, label: str) -> None:
    """One markdown row per training file: rows, what the judge changed, ``metric`` mean ± std and per seed."""
    print(f"\n| training file | rows | changed by the judge | {label}, mean ± std | per seed |")
    print("|---|---:|---|---|---|")
    for name, runs in results.items():
        values = [r[metric] for r in runs]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        changed = {k: v for k, v in counts[name].items() if k not in ("rows_in", "rows_out") and v}
        per_seed = ", ".join(f"{x:.2f}" for x in values)
        mean = statistics.mean(values)
        print(
            f"| {name} | {rows_in(out / f'{name}.jsonl')} | {changed or '-'} | {mean:.2f} ± {spread:.2f} | {per_seed} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/relabel-scifact")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--negatives", type=int, default=3, help="negative columns of every training file")
    parser.add_argument("--prune", type=int, default=3, help="prune rows with this many negatives above")
    parser.add_argument("--max-corpus", type=int, default=1000, help="0: the whole corpus")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = make_files(out, args)
    base, results = train_all(out, args, scorer=score)
    print(f"\nuntrained all-MiniLM-L6-v2: NDCG@10 {base['ndcg@10']:.2f}")
    print_table(out, counts, results, metric="ndcg@10", label="SciFact dev NDCG@10")


if __name__ == "__main__":
    sys.exit(main())
