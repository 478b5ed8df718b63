"""Relabelled, dropped or pruned mined negatives on WikiQA: the SciFact experiment (relabel_scifact.py) again.

1. Training rows: the WikiQA train split's (question, correct sentence) pairs (label 1); corpus: every train
   candidate sentence, de-duplicated (:mod:`embforge.data.builtin.wikiqa`). ``embforge mine --pairs --corpus
   --method bm25 --num-negatives 8`` mines the negatives (every correct sentence of the question is a known
   positive, never a negative).
2. all-MiniLM-L6-v2 judges them and the four files (``original``, ``relabel``, ``drop``, ``prune``, 3 negative
   columns each) are written exactly as for SciFact (:func:`relabel_scifact.make_files`). WikiQA also labels
   wrong answers: the script counts the added ``relabel`` rows whose new positive the annotators marked wrong.
3. Each file trains all-MiniLM-L6-v2 per seed with the SciFact recipe (InfoNCE with the hard negatives plus
   in-batch ones, ``--steps``, batch ``--batch-size``, lr 5e-5, 128 tokens), scored by the standard WikiQA
   evaluation on the test split: the 243 questions with a correct answer, each question's candidates ranked
   (``embforge eval rerank``, :func:`embforge.evaluate.rerank.evaluate_rerank`): MAP, MRR@10, NDCG@10.

Results go to ``OUT/<file>-<seed>.json`` (a rerun skips what exists); the tables are printed at the end.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/relabel_wikiqa.py \\
        --out runs/relabel-wikiqa --seeds 1,2,3 --steps 50
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cached_scifact import EMBFORGE, run
from relabel_scifact import make_files, print_table, train_all

from embforge.data.builtin.wikiqa import load_wikiqa
from embforge.data.paths import data_root
from embforge.data.tables import read_table

METRICS = {"map": "MAP", "mrr@10": "MRR@10", "ndcg@10": "NDCG@10"}


def train_pairs(label: int) -> dict[tuple[str, str], None]:
    """The train split's distinct (question, candidate) pairs with this label, in file order."""
    train = load_wikiqa("train")
    rows = zip(*(train.columns[c] for c in ("sentence1", "sentence2", "label")))
    return dict.fromkeys((q, s) for q, s, y in rows if y == label)


def write_inputs(out: Path) -> list[str]:
    """The pairs and corpus files of the train split; returns the data flags of ``embforge mine``."""
    pairs, corpus = out / "pairs.jsonl", out / "corpus.jsonl"
    with pairs.open("w") as f:
        f.writelines(json.dumps({"anchor": q, "positive": s}) + "\n" for q, s in train_pairs(1))
    with corpus.open("w") as f:
        f.writelines(
            json.dumps({"text": s}) + "\n" for s in dict.fromkeys(load_wikiqa("train").columns["sentence2"])
        )
    return ["--pairs", str(pairs), "--corpus", str(corpus)]


def overruled(out: Path) -> dict[str, int]:
    """The rows relabelling added (a flagged negative made the positive) and how many pair the question with a
    candidate WikiQA's annotators marked wrong for it (label 0): the judge overruling the data set's own label."""
    mined, relabelled = (read_table(out / f"{name}.jsonl").columns for name in ("mined", "relabel"))
    added = set(zip(relabelled["anchor"], relabelled["positive"])) - set(
        zip(mined["anchor"], mined["positive"])
    )
    return {"rows_added": len(added), "labelled_wrong": len(added & train_pairs(0).keys())}


def score(model: str, args: argparse.Namespace) -> dict:
    """WikiQA test: MAP, MRR@10 and NDCG@10 over the questions with a correct answer."""
    test = str(data_root() / "wikiqa" / "test.txt")
    command = [*EMBFORGE, "eval", "rerank", "--model", model, "--data", test]
    scores, _ = run([*command, "--columns", "0=sentence1,1=sentence2,2=label", "--no-header", "--quiet"])
    return {name: scores[name] for name in (*METRICS, "queries")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/relabel-wikiqa")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--negatives", type=int, default=3, help="negative columns of every training file")
    parser.add_argument("--prune", type=int, default=3, help="prune rows with this many negatives above")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = make_files(out, args, source=write_inputs(out))
    print(json.dumps({"counts": counts, "relabel_rows_labelled_wrong": overruled(out)}), flush=True)
    base, results = train_all(out, args, scorer=score)
    untrained = ", ".join(f"{label} {base[metric]:.2f}" for metric, label in METRICS.items())
    print(f"\nuntrained all-MiniLM-L6-v2 ({base['queries']:.0f} test questions): {untrained}")
    for metric, label in METRICS.items():
        print_table(out, counts, results, metric=metric, label=f"WikiQA test {label}")


if __name__ == "__main__":
    sys.exit(main())
