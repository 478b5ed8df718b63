"""Multi-task vs single-task training, Matryoshka vs not, and the 3-stage pipeline, on all-MiniLM-L6-v2.

Every trained model gets the same optimiser-step budget (``--steps``) and batch size. Each is then scored on
the same evaluation subsets (fixed seeds; see ``EvalSets``):

* retrieval: SciFact dev (121 queries carved from train, ``embforge.data.builtin.scifact``) NDCG@10 over a
  reduced corpus (every relevant document + ``--distractors`` random others; 128 tokens);
* STS: STS-B test Spearman (every ``--sts-every``-th pair);
* classification: Banking77 test accuracy of logistic regression fitted on ``--per-class`` train texts per intent;
* clustering: Banking77 test V-measure (k-means, k = 77);
* pair classification: MRPC test average precision of the cosine score (a subset).

Results are appended to ``<out>/results.jsonl`` (one line per model) so runs can be split across invocations;
``--report`` prints the Markdown tables (and writes the Matryoshka PNG) from that file.

    nice -n 5 .venv/bin/python benchmarks/multitask.py --models base,retrieval,sts,classification,clustering
    nice -n 5 .venv/bin/python benchmarks/multitask.py --models multitask,multitask-mrl,three-stage
    .venv/bin/python benchmarks/multitask.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from embforge.data.builtin.banking77 import load_banking77
from embforge.data.builtin.mrpc import load_mrpc
from embforge.data.builtin.scifact import load_scifact
from embforge.data.builtin.snli_triplets import load_snli_triplets
from embforge.data.paths import data_root
from embforge.data.retrieval import RetrievalData, training_pairs
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.classification import evaluate_classification
from embforge.evaluate.clustering import evaluate_clustering
from embforge.evaluate.matryoshka import TruncatedModel, format_table, plot_matryoshka
from embforge.evaluate.retrieval import evaluate_retrieval
from embforge.evaluate.sts import evaluate_sts
from embforge.losses import get_loss
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task

DIMS = [64, 128, 256, 384]
MRL = [384, 256, 128, 64]
COLUMNS = [
    ("retrieval", "SciFact dev NDCG@10"),
    ("sts", "STS-B test Spearman"),
    ("classification", "Banking77 acc."),
    ("clustering", "Banking77 V-measure"),
    ("pairs", "MRPC AP"),
]


class EvalSets:
    """The evaluation subsets, built once with fixed seeds."""

    def __init__(
        self, distractors: int, sts_every: int, mrpc_pairs: int, banking_test: int, per_class: int
    ) -> None:
        self.per_class = per_class
        rng = np.random.default_rng(0)
        full = load_scifact("dev")
        relevant = {d for q in full.qrels.values() for d in q}
        others = [i for i, d in enumerate(full.doc_ids) if d not in relevant]
        keep = sorted(
            [i for i, d in enumerate(full.doc_ids) if d in relevant]
            + list(rng.choice(others, distractors, replace=False))
        )
        self.scifact = RetrievalData(
            [full.doc_ids[i] for i in keep],
            [full.doc_texts[i] for i in keep],
            full.query_ids,
            full.query_texts,
            full.qrels,
            [full.doc_titles[i] for i in keep],
            name="scifact/dev-subset",
        )
        stsb = read_table(
            data_root() / "stsb_en" / "stsb-en-test.csv", columns="0=sentence1,1=sentence2,2=score"
        )
        self.stsb = stsb.subset(list(range(0, len(stsb), sts_every)))
        train = load_banking77("train_all")
        labels = train.labels()
        per_class = [int(i) for c in range(77) for i in np.flatnonzero(labels == c)[: self.per_class]]
        self.banking_train = train.subset(per_class)
        test = load_banking77("test")
        self.banking_test = test.subset(sorted(rng.choice(len(test), banking_test, replace=False).tolist()))
        mrpc = load_mrpc("test")
        self.mrpc = mrpc.subset(sorted(rng.choice(len(mrpc), mrpc_pairs, replace=False).tolist()))

    def run(self, model, *, matryoshka: bool = False, only_banking: bool = False) -> dict:
        from sklearn.metrics import average_precision_score

        scores: dict = {}
        started = time.perf_counter()
        dims = [] if only_banking else DIMS if matryoshka else [model.dim]
        cache: dict = {}
        by_dim: dict = {"retrieval": {}, "sts": {}}
        for d in dims:
            view = TruncatedModel(model, d, cache)
            by_dim["retrieval"][d] = evaluate_retrieval(view, self.scifact, metrics=["ndcg@10"])["ndcg@10"]
            by_dim["sts"][d] = evaluate_sts(view, self.stsb)["spearman"]
        if not only_banking:
            scores["retrieval"] = by_dim["retrieval"][model.dim]
            scores["sts"] = by_dim["sts"][model.dim]
        if matryoshka:
            scores["by_dim"] = by_dim
        scores["classification"] = evaluate_classification(model, self.banking_train, self.banking_test)[
            "accuracy"
        ]
        scores["clustering"] = evaluate_clustering(model, self.banking_test, seeds=3)["v_measure"]
        if only_banking:
            return scores
        a = model.encode(self.mrpc.columns["sentence1"], normalize=True)
        b = model.encode(self.mrpc.columns["sentence2"], normalize=True)
        scores["pairs"] = 100 * float(average_precision_score(self.mrpc.labels(), (a * b).sum(1)))
        scores["eval_seconds"] = time.perf_counter() - started
        return scores


def training_tasks(dim: int, *, matryoshka: bool, cluster_loss: str = "cluster") -> dict[str, Task]:
    dims = MRL if matryoshka else None

    def loss(name: str, **options):
        return get_loss(name, dim=dim, num_labels=77, matryoshka_dims=dims, **options)

    banking = load_banking77("train")
    stsb = read_table(
        data_root() / "stsb_en" / "stsb-en-train.csv", columns="0=sentence1,1=sentence2,2=score"
    )
    return {
        "scifact": Task("scifact", training_pairs(load_scifact("train")), loss("infonce")),
        "snli": Task("snli", load_snli_triplets("all"), loss("infonce")),
        "stsb": Task("stsb", stsb, loss("cosent")),
        "banking-cls": Task("banking-cls", banking, loss("prototype")),
        "banking-clu": Task("banking-clu", banking, loss(cluster_loss)),
    }


RECIPES = {
    "retrieval": ["scifact", "snli"],
    "sts": ["stsb"],
    "classification": ["banking-cls"],
    "clustering": ["banking-clu"],
    "clustering-supcon": ["banking-clu"],
    "multitask": ["scifact", "snli", "stsb", "banking-cls", "banking-clu"],
    "multitask-mrl": ["scifact", "snli", "stsb", "banking-cls", "banking-clu"],
}


def train_model(name: str, args: argparse.Namespace) -> tuple[Encoder, dict]:
    model = Encoder.load("all-MiniLM-L6-v2", max_seq_length=args.max_seq_length)
    if name == "base":
        return model, {}
    if name == "three-stage":
        from embforge.training.pipeline import load_pipeline, run_pipeline

        pipeline = load_pipeline(args.pipeline)
        summary = run_pipeline(pipeline, output=str(Path(args.out) / name), model=model)
        return model, {**summary, "steps": sum(s["steps"] for s in summary["stages"])}
    tasks = training_tasks(
        model.dim, matryoshka=name.endswith("-mrl"), cluster_loss="supcon" if "supcon" in name else "cluster"
    )
    chosen = [tasks[t] for t in RECIPES[name]]
    multi = len(chosen) > 2
    config = TrainConfig(
        output=str(Path(args.out) / name),
        max_steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        sampling="temperature" if multi else "epoch",
        sampling_alpha=0.5,
        dynamic_weights_every=args.steps // 8 if multi else 0,
        dynamic_weights_smoothing=0.3,
        save_every=0,
        log_every=10,
        quiet=True,
        seed=42,
    )
    summary = train(model, chosen, config)
    return model, summary


def run(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    sets = EvalSets(args.distractors, args.sts_every, args.mrpc_pairs, args.banking_test, args.per_class)
    print(f"eval sets ready in {time.perf_counter() - t0:.0f}s: scifact docs {len(sets.scifact.doc_ids)}, "
          f"stsb pairs {len(sets.stsb)}, banking train/test {len(sets.banking_train)}/{len(sets.banking_test)}, "
          f"mrpc {len(sets.mrpc)}", flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        started = time.perf_counter()
        model, summary = train_model(name, args)
        trained = time.perf_counter() - started
        matryoshka = name.startswith("multitask") or name == "three-stage"
        scores = sets.run(
            model, matryoshka=matryoshka and not args.banking_only, only_banking=args.banking_only
        )
        record = {"model": name, "steps": summary.get("steps", 0), "train_seconds": trained, **scores}
        with (out / ("banking.jsonl" if args.banking_only else "results.jsonl")).open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def report(args: argparse.Namespace) -> None:
    records: dict = {}
    for line in (Path(args.out) / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["model"]] = record  # the last run of a model wins
    for name, record in records.items():  # pipelines: steps summed over the stages
        stages = sorted((Path(args.out) / name).glob("stage-*/stage_done.json"))
        if stages and not record["steps"]:
            record["steps"] = "+".join(str(json.loads(p.read_text())["steps"]) for p in stages)
    head = "| model | steps | " + " | ".join(c for _, c in COLUMNS) + " | average |"
    print(head + "\n|---|---:|" + "---:|" * (len(COLUMNS) + 1))
    for name, r in records.items():
        values = [r[k] for k, _ in COLUMNS]
        print(
            f"| {name} | {r['steps']} | "
            + " | ".join(f"{v:.2f}" for v in values)
            + f" | {np.mean(values):.2f} |"
        )
    runs = {}
    for name in ("multitask", "multitask-mrl"):
        if name in records and "by_dim" in records[name]:
            for task, metric in (("sts", "spearman"), ("retrieval", "ndcg@10")):
                scores = {int(d): v for d, v in records[name]["by_dim"][task].items()}
                runs[f"{name} {task}"] = {
                    "metric": metric,
                    "dims": sorted(scores),
                    "scores": scores,
                    "retained": {d: v / scores[384] for d, v in scores.items()},
                }
    if runs:
        print()
        print(format_table(runs))
        path = plot_matryoshka(runs, Path(args.out) / "matryoshka.png", title="Matryoshka vs not (MiniLM-L6)")
        print(f"\nplot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", default="base,retrieval,sts,classification,clustering,multitask,multitask-mrl"
    )
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-seq-length", type=int, default=96)
    parser.add_argument("--distractors", type=int, default=200)
    parser.add_argument("--sts-every", type=int, default=3)
    parser.add_argument("--mrpc-pairs", type=int, default=300)
    parser.add_argument("--banking-test", type=int, default=500)
    parser.add_argument(
        "--per-class", type=int, default=5, help="Banking77 train texts per intent for the classifier"
    )
    parser.add_argument("--pipeline", default="embforge/configs/three_stage.toml")
    parser.add_argument("--out", default="runs/bench-multitask")
    parser.add_argument("--report", action="store_true")
    parser.add_argument(
        "--banking-only", action="store_true", help="evaluate Banking77 only (loss comparisons)"
    )
    args = parser.parse_args()
    report(args) if args.report else run(args)


if __name__ == "__main__":
    main()
