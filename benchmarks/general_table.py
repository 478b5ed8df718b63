"""The general-recipe table — every row scored on four task families, seeds, mean ± std.

Rows: ``base`` (all-MiniLM-L6-v2), ``teacher`` (all-mpnet-base-v2, ``make teacher``), ``specialist`` (the default
recipe on STS-B train), ``merge`` (the specialist merged back into the base, weight chosen by ``embforge merge
--choose-on``), ``distill`` (``benchmarks/general_distill.toml``), ``general`` (``embforge/configs/general.toml``),
``seedsoup`` (the general recipe's ``--seeds`` merged with equal weights by ``embforge merge``: seed averaging).
Trained rows are trained once per seed, by the CLI, into ``OUT/<row>-s<seed>``.

Columns (``--split test``), embforge's own evaluators:

- STS-B test Spearman (:func:`embforge.evaluate.sts.evaluate_sts`, cosine);
- SciFact dev NDCG@10 on the **full corpus** (5,183 abstracts; the 121 dev claims of ``load_scifact("dev")``),
  the corpus embeddings cached per model in ``OUT/corpus-cache/<row>-s<seed>`` (resumable);
- MRPC test accuracy (threshold searched on MRPC dev, carved from train) and AP
  (:func:`embforge.evaluate.pairs.evaluate_pairs`);
- Banking77 test accuracy, logistic regression fitted on all 10,003 train texts
  (:func:`embforge.evaluate.classification.evaluate_classification`);
- opt-in (``--families banking_mteb``, needs ``pip install 'embforge[mteb]'``): Banking77 test accuracy under
  mteb's own protocol, run by mteb (8 train texts an intent, 10 logistic regressions, their mean accuracy;
  all-MiniLM-L6-v2: 80.04, its MTEB leaderboard figure); not in the average;
- average = mean of the four families' headline numbers (MRPC counted by its AP: threshold-free).

``--split dev`` scores the dev splits instead (STS-B dev, SciFact dev, MRPC dev with its own threshold, Banking77
dev with the classifier fitted on train minus dev): what the recipe is tuned on. One JSON per (split, row, seed) in
``OUT/results/<split>/``, updated after each family, so an interrupted run resumes where it stopped.

Run (2-core CPU, one heavy process at a time)::

    HF_HUB_OFFLINE=1 nohup .venv/bin/python benchmarks/general_table.py run --rows base,general,teacher \\
        --seeds 42 --out runs/general-table > /tmp/general/run.log 2>&1 &
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/general_table.py table --out runs/general-table

Leave-one-family-out (``loo``, benchmarks/_loo.py): the recipe trained without the tasks of one family (STS,
pair classification, retrieval, classification in turn), that family scored against the recipe's base::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/general_table.py loo --recipe embforge/configs/general.toml \
        --families sts,mrpc,scifact,banking --seeds 42,43,44 --out runs/general-table
    .venv/bin/python benchmarks/general_table.py loo --table --recipe embforge/configs/general.toml --out ...

``--dry-run`` writes the variant recipes and prints the plan; ``--max-steps N`` sets every stage's steps (say so
with the figures); ``--set KEY=VALUE`` adds a ``[defaults]`` field (``ema_decay=0.95``, ``soup_last=3``). Each
``--set`` and a ``--max-steps`` is part of the rows' name (``general+steps=132-without-banking-s42``).

What the test set resolves (``paired``, benchmarks/_paired.py): each model against the base on the same test
items — the difference with its paired-bootstrap 95 % interval, and McNemar's exact p for the accuracy
columns::

    .venv/bin/python benchmarks/general_table.py paired --families banking \
        --models runs/gp/centroid4-without-banking-s42/final,runs/gp/centroid4-without-banking-s43/final
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _loo import loo_table, parse_sets, run_loo
from _paired import classification_outcomes, compare, mteb_outcomes, pair_outcomes

LABELS = {
    "base": "all-MiniLM-L6-v2 (base)",
    "teacher": "all-mpnet-base-v2 (teacher, 5x larger)",
    "specialist": "STS specialist (default recipe, STS-B train)",
    "merge": "+ merge with the base (`--choose-on`)",
    "distill": "+ distillation (mse_distill to the teacher)",
    "general": "**general recipe** (`embforge/configs/general.toml`)",
    "seedsoup": "general recipe, its seeds averaged (`embforge merge`, equal weights)",
}
ROWS = tuple(LABELS)
TRAINED = ("specialist", "merge", "distill", "general")
COLUMNS = (
    ("sts", "STS-B Spearman"),
    ("scifact", "SciFact NDCG@10"),
    ("mrpc_acc", "MRPC acc."),
    ("mrpc_ap", "MRPC AP"),
    ("banking", "Banking77 acc."),
    ("banking_mteb", "Banking77 acc., mteb's protocol"),
    ("wikiqa", "WikiQA MAP (held out)"),
    ("qtype", "question type acc. (held out)"),
    ("cluster", "Banking77 clustering V (held out)"),
)
AVERAGED = ("sts", "scifact", "mrpc_ap", "banking", "wikiqa", "qtype", "cluster")
# family -> its columns (the headline, averaged, first)
FAMILY_COLUMNS = {
    "sts": ("sts",), "scifact": ("scifact",), "mrpc": ("mrpc_acc", "mrpc_ap"), "banking": ("banking",),
    "banking_mteb": ("banking_mteb",),
    "wikiqa": ("wikiqa",), "qtype": ("qtype",), "cluster": ("cluster",),
}  # fmt: skip
STSB = "../shared/data/stsb_en"
TEACHER = "models/all-mpnet-base-v2"


def model_path(row: str, seed: int | None, out: Path) -> str:
    """The model folder (or alias) a row is evaluated from."""
    if row == "base":
        return "all-MiniLM-L6-v2"
    if row == "teacher":
        return TEACHER
    if row == "specialist" and seed == 42 and Path("runs/stsb-specialist/model.safetensors").exists():
        return "runs/stsb-specialist"  # the main job's specialist (default recipe, seed 42)
    if row == "seedsoup":
        return str(out / "seedsoup")
    folder = out / f"{row}-s{seed}"
    return str(folder / "final") if row in ("distill", "general") else str(folder)


def seed_soup(seeds: list[int], out: Path, *, mix: str, grid: str) -> None:
    """The general recipe's ``seeds`` (trained if missing) merged with equal weights into ``OUT/seedsoup``."""
    if (out / "seedsoup" / "modules.json").exists():
        return
    for seed in seeds:
        train_row("general", seed, out, mix=mix, grid=grid)
    members = [model_path("general", seed, out) for seed in seeds]
    args = ["merge", "--models", *members, "--output", str(out / "seedsoup"), "--quiet"]
    _cli(args, out / "logs" / "seedsoup.log")
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "train" / "seedsoup.json").write_text(
        json.dumps({"row": "seedsoup", "seeds": seeds, "command": "embforge " + " ".join(args)}, indent=2)
        + "\n"
    )


def _cli(args: list[str], log: Path) -> float:
    """Run ``embforge ARGS`` (same interpreter), append its output to ``log``; returns the wall seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a") as handle:
        handle.write(f"$ embforge {' '.join(args)}\n")
        handle.flush()
        code = subprocess.call(
            [sys.executable, "-m", "embforge", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    if code != 0:
        raise SystemExit(f"embforge {' '.join(args)} failed ({code}); see {log}")
    return time.perf_counter() - started


def mix_folder(folder: Path, *, others: int) -> Path:
    """A BEIR folder of SciFact dev: its 121 claims, the judged abstracts + the first ``others`` other ones.

    ``embforge merge --choose-on`` scores every weight of its grid; on the full corpus that is 4-5 minutes of
    CPU per weight for MiniLM, so the weight is chosen on this reduced corpus (the table itself uses the full one).
    """
    if (folder / "qrels" / "dev.tsv").exists():
        return folder
    from embforge.data.builtin.scifact import load_scifact

    data = load_scifact("dev")
    judged = {d for rel in data.qrels.values() for d in rel}
    keep = [i for i, d in enumerate(data.doc_ids) if d in judged]
    keep += [i for i, d in enumerate(data.doc_ids) if d not in judged][:others]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w") as handle:
        for i in sorted(keep):
            doc = {"_id": data.doc_ids[i], "title": data.doc_titles[i], "text": data.doc_texts[i]}
            handle.write(json.dumps(doc) + "\n")
    with (folder / "queries.jsonl").open("w") as handle:
        for qid, text in zip(data.query_ids, data.query_texts):
            handle.write(json.dumps({"_id": qid, "text": text}) + "\n")
    lines = [f"{q}\t{d}\t{g}" for q, rel in data.qrels.items() for d, g in rel.items()]
    (folder / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(lines) + "\n")
    return folder


def train_row(row: str, seed: int, out: Path, *, mix: str, grid: str) -> None:
    """Train (or merge) one row for one seed unless its model exists; records the wall time."""
    target = Path(model_path(row, seed, out))
    if (target / "modules.json").exists():
        return
    if row == "merge":
        train_row("specialist", seed, out, mix=mix, grid=grid)
    folder = out / f"{row}-s{seed}"
    log = out / "logs" / f"{row}-s{seed}.log"
    if row == "specialist":
        args = ["train", "--train", f"{STSB}/stsb-en-train.csv", "--eval", f"{STSB}/stsb-en-dev.csv"]
        args += ["--output", str(folder), "--seed", str(seed), "--quiet"]
    elif row == "merge":
        spec = model_path("specialist", seed, out)
        args = ["merge", "--models", "all-MiniLM-L6-v2", spec, "--choose-on", mix, "--grid", grid]
        args += ["--output", str(folder), "--quiet"]
    else:
        config = "benchmarks/general_distill.toml" if row == "distill" else "embforge/configs/general.toml"
        args = ["train", config, "--output", str(folder), "--seed", str(seed), "--resume", "--quiet"]
    seconds = _cli(args, log)
    record = {"row": row, "seed": seed, "command": "embforge " + " ".join(args), "seconds": seconds}
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "train" / f"{row}-s{seed}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record), flush=True)


def _banking77(split: str) -> tuple[Any, Any]:
    """Banking77's texts to fit a classifier on and to score it on: on ``test`` all 10,003 train texts, on ``dev``
    train minus dev."""
    from embforge.data.builtin import load_builtin

    return load_builtin("banking77", "train_all" if split == "test" else "train"), load_builtin(
        "banking77", split
    )


def _families(split: str) -> dict[str, Any]:
    """``name -> model -> {column: value}`` for the four families on ``split`` (data loaded lazily)."""
    from embforge.data.builtin import load_builtin
    from embforge.evaluate.classification import evaluate_classification
    from embforge.evaluate.pairs import evaluate_pairs
    from embforge.evaluate.sts import evaluate_sts

    def sts(model: Any) -> dict[str, float]:
        return {"sts": evaluate_sts(model, load_builtin("stsb", split))["spearman"]}

    def mrpc(model: Any) -> dict[str, float]:
        dev = load_builtin("mrpc", "dev")
        m = evaluate_pairs(model, load_builtin("mrpc", split), dev=dev if split == "test" else None)
        return {"mrpc_acc": m["accuracy"], "mrpc_ap": m["ap"]}

    def banking(model: Any) -> dict[str, float]:
        m = evaluate_classification(model, *_banking77(split))
        return {"banking": m["accuracy"]}

    def banking_mteb(model: Any) -> dict[str, float]:
        correct, _ = mteb_outcomes(model, "Banking77Classification", *_banking77(split))
        return {"banking_mteb": 100.0 * float(correct.mean())}

    families = {"sts": sts, "mrpc": mrpc, "banking": banking, "banking_mteb": banking_mteb}
    return {**families, **_held_out_families(split)}


def _held_out_families(split: str) -> dict[str, Any]:
    """Families no recipe trains on: WikiQA answer reranking (MAP), WikiQA question types (accuracy), and
    k-means clustering of the Banking77 test texts (V-measure; its intents are the ones the recipe's Banking77
    task classifies, so this is a new *form* of a seen family, not a new domain)."""
    from embforge.data.builtin.banking77 import load_banking77
    from embforge.data.builtin.wikiqa import load_wikiqa
    from embforge.evaluate.classification import evaluate_classification
    from embforge.evaluate.clustering import evaluate_clustering
    from embforge.evaluate.rerank import evaluate_rerank

    def wikiqa(model: Any) -> dict[str, float]:
        m = evaluate_rerank(model, load_wikiqa(split), metrics=("map", "mrr@10", "ndcg@10"))
        return {"wikiqa": m["map"], "wikiqa_mrr": m["mrr@10"]}

    def qtype(model: Any) -> dict[str, float]:
        m = evaluate_classification(model, question_types("train"), question_types(split))
        return {"qtype": m["accuracy"]}

    def cluster(model: Any) -> dict[str, float]:
        return {"cluster": evaluate_clustering(model, load_banking77(split))["v_measure"]}

    return {"wikiqa": wikiqa, "qtype": qtype, "cluster": cluster}


QUESTION_WORDS = ("what", "who", "when", "where", "how", "why", "which")


def question_types(split: str) -> Any:
    """WikiQA's distinct questions of ``split`` labelled by their question word, the word itself removed
    ("___ is the capital of France?" -> where/what): the model has to read what is asked for. Questions
    starting with another word are left out."""
    from embforge.data.builtin.wikiqa import load_wikiqa
    from embforge.data.tables import Dataset

    texts, labels = [], []
    for question in dict.fromkeys(load_wikiqa(split).columns["sentence1"]):
        first, _, rest = question.strip().partition(" ")
        if first.lower() in QUESTION_WORDS and rest:
            texts.append(rest)
            labels.append(QUESTION_WORDS.index(first.lower()))
    return Dataset(path=f"wikiqa-{split}-question-types", columns={"text": texts, "label": labels})


FAMILIES = ("sts", "scifact", "mrpc", "banking", "wikiqa", "qtype", "cluster")


def _item_outcomes(split: str) -> dict[str, tuple[str, Any]]:
    """``family -> (metric, model -> (per-item outcomes, gold))`` for the columns :func:`paired` compares
    (the items, classifiers and splits of :func:`_families`)."""
    from embforge.data.builtin import load_builtin

    def banking(model: Any) -> Any:
        return classification_outcomes(model, *_banking77(split))

    def banking_mteb(model: Any) -> Any:
        return mteb_outcomes(model, "Banking77Classification", *_banking77(split))

    return {
        "banking": ("accuracy", banking),
        "banking_mteb": ("accuracy", banking_mteb),
        "qtype": (
            "accuracy",
            lambda m: classification_outcomes(m, question_types("train"), question_types(split)),
        ),
        "sts": ("spearman", lambda m: pair_outcomes(m, load_builtin("stsb", split))),
        "mrpc": ("ap", lambda m: pair_outcomes(m, load_builtin("mrpc", split))),
    }


def paired(
    models: list[str], families: list[str], *, against: str, split: str = "test"
) -> list[dict[str, Any]]:
    """Each of ``models`` against ``against`` on each family's test items (:func:`_paired.compare`); one JSON
    line per (model, family) as it is done."""
    from embforge.encoder import Encoder

    items = _item_outcomes(split)
    unknown = [f for f in families if f not in items]
    if unknown:
        raise SystemExit(f"no per-item comparison for {', '.join(unknown)}; choose from {', '.join(items)}")
    reference = Encoder.load(against)
    rows = []
    for family in families:
        metric, outcomes = items[family]
        base, gold = outcomes(reference)
        for model in models:
            row = {"model": model, "against": against, "family": family, "metric": metric}
            row.update(compare(outcomes(Encoder.load(model))[0], base, gold, metric))
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def evaluate_row(
    row: str,
    seed: int | None,
    out: Path,
    *,
    split: str = "test",
    model: str | None = None,
    families: tuple[str, ...] = FAMILIES,
) -> dict[str, Any]:
    """Score one (row, seed) on ``families``, resuming from its JSON; returns the record."""
    from embforge.data.builtin.scifact import load_scifact
    from embforge.encoder import Encoder
    from embforge.evaluate.retrieval import evaluate_retrieval

    name = f"{row}-s{seed}" if seed is not None else row
    path = out / "results" / split / f"{name}.json"
    record: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    record.update(row=row, seed=seed, split=split, model=model or model_path(row, seed, out))
    record.setdefault("seconds", {})
    todo = [f for f in families if f not in record["seconds"]]
    if not todo:
        return record
    encoder = Encoder.load(record["model"])
    record["dim"] = encoder.dim
    families = _families(split)
    for family in todo:
        started = time.perf_counter()
        if family == "scifact":  # the full 5,183-document corpus, cached per model
            cache = out / "corpus-cache" / name
            m = evaluate_retrieval(
                encoder, load_scifact("dev"), metrics=["ndcg@10"], corpus_cache=cache, show_progress=True
            )
            scores = {"scifact": m["ndcg@10"], "scifact_docs": m["documents"]}
        else:
            scores = families[family](encoder)
        record = _save_scores(path, record, scores, {family: time.perf_counter() - started})
        print(json.dumps({"row": name, "split": split, family: scores}), flush=True)
    return record


def _save_scores(
    path: Path, record: dict[str, Any], scores: dict[str, Any], seconds: dict[str, float]
) -> dict[str, Any]:
    """Add one family's scores to the row's JSON file and return the row as saved.

    Two runs may score one row at once (two left-out runs both score the base): under a lock the file is read
    again and the new scores merged into what is there, so neither run drops the other's families."""
    from embforge.files import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        merged = {
            **saved,
            **record,
            **scores,
            "seconds": {**saved.get("seconds", {}), **record["seconds"], **seconds},
        }
        write_text_atomic(path, json.dumps(merged, indent=2) + "\n")
    return merged


def _cell(values: list[float], best: bool) -> str:
    if not values:
        return "–"
    text = f"{values[0]:.2f}"
    if len(values) > 1:
        text = f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
    return f"**{text}**" if best else text


def table(out: Path, *, split: str = "test", families: tuple[str, ...] | None = None) -> str:
    """The Markdown table of every finished (row, seed) under ``OUT/results/<split>``, on ``families`` (default:
    all; a record missing one of them is left out); the average is over those families' headline columns."""
    wanted = {c for f in families or FAMILY_COLUMNS for c in FAMILY_COLUMNS[f]}
    columns = [(k, label) for k, label in COLUMNS if k in wanted]
    averaged = [k for k in AVERAGED if k in wanted]
    done: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((out / "results" / split).glob("*.json")):
        record = json.loads(path.read_text())
        if all(k in record for k, _ in columns):
            record["average"] = statistics.mean(record[k] for k in averaged)
            done.setdefault(record["row"], []).append(record)
    keys = [*columns, ("average", "average")]
    means = {
        row: {k: statistics.mean(r[k] for r in records) for k, _ in keys} for row, records in done.items()
    }
    best = {k: max((m[k] for m in means.values()), default=None) for k, _ in keys}
    lines = [
        "| model | seeds | " + " | ".join(label for _, label in keys) + " |",
        "|---|---|" + "---:|" * len(keys),
    ]
    for row in [*ROWS, *sorted(set(done) - set(ROWS))]:  # then variants scored with `eval --row NAME`
        records = done.get(row, [])
        seeds = (
            ", ".join(str(r["seed"]) for r in records) if row not in ("base", "teacher", "seedsoup") else "–"
        )
        cells = [_cell([r[k] for r in records], bool(records) and means[row][k] == best[k]) for k, _ in keys]
        lines.append(f"| {LABELS.get(row, row)} | {seeds or 'not run'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    run = steps.add_parser("run", help="train what is missing, then evaluate, row by row and seed by seed")
    run.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    run.add_argument("--seeds", default="42,43,44", help="seeds of the trained rows")
    run.add_argument("--split", choices=("test", "dev"), default="test")
    run.add_argument("--no-eval", action="store_true", help="only train")
    run.add_argument(
        "--mix",
        default=None,
        help="merge --choose-on dev mix (default: STS-B dev + SciFact dev "
        "against its judged abstracts + --mix-docs others)",
    )
    run.add_argument("--mix-docs", type=int, default=500, help="other SciFact abstracts in the default mix")
    run.add_argument("--grid", default="0.2,0.4,0.5,0.6,0.8", help="merge weights tried by --choose-on")
    ev = steps.add_parser("eval", help="evaluate one model folder as a row (e.g. a recipe variant)")
    ev.add_argument("--row", required=True)
    ev.add_argument("--model", default=None, help="folder; default: the row's own")
    ev.add_argument("--seed", type=int, default=None)
    ev.add_argument("--split", choices=("test", "dev"), default="test")
    tab = steps.add_parser("table", help="print the Markdown table (and write OUT/table-<split>.md)")
    tab.add_argument("--split", choices=("test", "dev"), default="test")
    loo = steps.add_parser(
        "loo", help="leave one family out: train the recipe without it, score it vs the base"
    )
    loo.add_argument("--recipe", default="embforge/configs/general.toml")
    loo.add_argument("--seeds", default="42,43,44")
    loo.add_argument("--split", choices=("test", "dev"), default="test")
    loo.add_argument(
        "--max-steps", type=int, default=None, help="steps of every stage (default: the recipe's)"
    )
    loo.add_argument("--set", action="append", default=[], help="KEY=VALUE added to [defaults] (repeatable)")
    loo.add_argument("--dry-run", action="store_true", help="write the variant recipes, print the plan")
    loo.add_argument("--table", action="store_true", help="only print the leave-one-out table")
    pair = steps.add_parser("paired", help="models vs the base on the same test items: intervals, McNemar")
    pair.add_argument("--models", required=True, help="comma list of model folders")
    pair.add_argument("--against", default="all-MiniLM-L6-v2", help="the model compared with (default: base)")
    pair.add_argument(
        "--families", default="banking,qtype,sts,mrpc", help="of banking, banking_mteb, qtype, sts, mrpc"
    )
    pair.add_argument("--split", choices=("test", "dev"), default="test")
    for sub in (run, ev, tab, loo):
        sub.add_argument("--out", default="runs/general-table")
    for sub in (run, ev, tab, loo):
        sub.add_argument(
            "--families",
            default=",".join(FAMILIES),
            help=f"columns to score, of {','.join(FAMILIES)} (the teacher's full SciFact corpus is ~2 h of one "
            "thread: leave it for a quiet run; a variant's dev check needs only sts,banking)",
        )
    args = parser.parse_args()
    if args.step == "paired":
        paired(args.models.split(","), args.families.split(","), against=args.against, split=args.split)
        return
    out = Path(args.out)
    if args.step == "table":
        text = table(out, split=args.split, families=tuple(args.families.split(",")))
        (out / f"table-{args.split}.md").write_text(text + "\n")
        print(text)
        return
    if args.step == "loo":
        recipe = Path(args.recipe)
        if not args.table:
            run_loo(
                recipe, args.families.split(","), [int(s) for s in args.seeds.split(",")], out,
                train=lambda argv, log: _cli(argv, log), evaluate=evaluate_row, split=args.split,
                max_steps=args.max_steps, sets=parse_sets(args.set), dry_run=args.dry_run,
            )  # fmt: skip
        if not args.dry_run:
            print(
                loo_table(out, recipe, sets=parse_sets(args.set), split=args.split, max_steps=args.max_steps)
            )
        return
    if args.step == "eval":
        families = tuple(args.families.split(","))
        evaluate_row(args.row, args.seed, out, split=args.split, model=args.model, families=families)
        return
    if args.mix is None:
        folder = mix_folder(Path(f"/tmp/general/scifact-dev-{args.mix_docs}"), others=args.mix_docs)
        args.mix = f"sts:stsb-dev,retrieval:{folder}@dev"
    for row in args.rows.split(","):
        if row not in ROWS:
            raise SystemExit(f"unknown row {row!r}; choose from {', '.join(ROWS)}")
        if row == "seedsoup":
            seed_soup([int(s) for s in args.seeds.split(",")], out, mix=args.mix, grid=args.grid)
        for seed in [int(s) for s in args.seeds.split(",")] if row in TRAINED else [None]:
            if seed is not None:
                train_row(row, seed, out, mix=args.mix, grid=args.grid)
            if not args.no_eval:
                evaluate_row(row, seed, out, split=args.split, families=tuple(args.families.split(",")))
    print(table(out, split=args.split, families=tuple(args.families.split(","))))


if __name__ == "__main__":
    main()
