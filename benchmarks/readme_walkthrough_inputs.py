"""Small real input files for `readme_walkthrough.sh` (the README's placeholders FILE, DIR, pairs.tsv ...).

Environment: WALK (output folder), SHARED (the folder holding data/). Files: STS-B train/dev excerpts, sentences,
MRPC pair files (pairs.tsv, dev.tsv, test.tsv), pairs.csv + docs.csv (pairs-mode mining), a small BEIR folder
(beir/: 60 SciFact train queries, their abstracts + 400 others, qrels train/dev), Banking77 JSONL excerpts,
a two-stage pipeline TOML and a corpus text file.
"""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path

from embforge.data.builtin.scifact import load_scifact


def read_csv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


def write_csv(path: Path, rows: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(rows)


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main() -> None:
    out = Path(os.environ["WALK"])
    out.mkdir(parents=True, exist_ok=True)
    shared = Path(os.environ["SHARED"]) / "data"
    train = read_csv(shared / "stsb_en/stsb-en-train.csv")
    write_csv(out / "sts-train.csv", [train[0], *train[1:321]])
    write_csv(out / "sts-dev.csv", read_csv(shared / "stsb_en/stsb-en-dev.csv")[:201])
    write_lines(out / "sentences.txt", [row[0] for row in train[1:201]])

    def mrpc(name: str) -> list[list[str]]:
        text = (shared / "mrpc" / name).read_text(encoding="utf-8-sig")
        return [line.split("\t") for line in text.splitlines()[1:]]

    mrpc_train, mrpc_test = mrpc("msr_paraphrase_train.txt"), mrpc("msr_paraphrase_test.txt")
    for name, rows in (("pairs.tsv", mrpc_train[:400]), ("dev.tsv", mrpc_train[400:600])):
        write_lines(out / name, ["label\tsentence1\tsentence2", *(f"{r[0]}\t{r[3]}\t{r[4]}" for r in rows)])
    write_lines(
        out / "test.tsv",
        ["label\tsentence1\tsentence2", *(f"{r[0]}\t{r[3]}\t{r[4]}" for r in mrpc_test[:300])],
    )
    write_csv(
        out / "pairs.csv", [["anchor", "positive"], *([r[3], r[4]] for r in mrpc_train[:200] if r[0] == "1")]
    )
    write_csv(out / "docs.csv", [["text"], *([r[4]] for r in mrpc_train[200:1200])])

    data = load_scifact("all")
    texts = dict(zip(data.query_ids, data.query_texts))
    queries = sorted(q for q in data.query_ids if data.qrels.get(q))[:60]
    judged = {d for q in queries for d in data.qrels[q]}
    keep = [i for i, d in enumerate(data.doc_ids) if d in judged]
    keep += [i for i, d in enumerate(data.doc_ids) if d not in judged][:400]
    beir = out / "beir"
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    write_lines(
        beir / "corpus.jsonl",
        [
            json.dumps({"_id": data.doc_ids[i], "title": data.doc_titles[i], "text": data.doc_texts[i]})
            for i in sorted(keep)
        ],
    )
    write_lines(beir / "queries.jsonl", [json.dumps({"_id": q, "text": texts[q]}) for q in queries])
    for split, chosen in (("train", queries[:45]), ("dev", queries[45:])):
        qrels = [f"{q}\t{d}\t{s}" for q in chosen for d, s in data.qrels[q].items()]
        write_lines(beir / "qrels" / f"{split}.tsv", ["query-id\tcorpus-id\tscore", *qrels])

    for seed, (source, target, n) in enumerate(
        (("train.csv", "train.jsonl", 1500), ("test.csv", "test.jsonl", 500))
    ):
        with open(shared / "banking77" / source, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
        random.Random(seed).shuffle(rows)
        write_lines(out / target, [json.dumps({"text": r["text"], "label": r["category"]}) for r in rows[:n]])

    (out / "pipeline.toml").write_text(
        'model = "all-MiniLM-L6-v2"\noutput = "runs/pipeline"\n[defaults]\nbatch_size = 16\nquiet = true\n'
        '[[stages]]\nname = "sts"\nsteps = 10\n  [[stages.tasks]]\n  name = "stsb"\n  data = "stsb:train"\n'
        '  loss = "cosent"\n[[stages]]\nname = "retrieval"\nsteps = 5\n  [[stages.tasks]]\n  name = "scifact"\n'
        '  data = "scifact:train"\n  loss = "infonce"\n'
    )
    write_lines(out / "corpus.txt", [" ".join(text.split()) for text in data.doc_texts[:300]])
    print("prepared", out)


if __name__ == "__main__":
    main()
