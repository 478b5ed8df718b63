"""ColBERT on SciFact, embforge beside pylate: from all-MiniLM-L6-v2, the same pairs, steps, batch and lr.

Each side turns all-MiniLM-L6-v2 into a ColBERT model (128-d projection, [Q]/[D] markers, queries padded to 32
tokens with [MASK], documents cut at 180 tokens, punctuation masked) and trains it with in-batch-negative
InfoNCE over MaxSim (temperature 1, pylate's ``Contrastive``) on the SciFact train (query, relevant abstract)
pairs; a dense model is trained the same way (embforge InfoNCE, temperature 0.05) for reference. Every model is
scored on SciFact dev (121 queries, the whole 5,183-abstract corpus) by the same exact-MaxSim evaluator (pylate's
saved folder loads in embforge with equal token vectors, tests/multivector/test_multivector_pylate.py). embforge's model is
also searched through a PLAID index (fast-plaid), whose top 10 is compared with exact MaxSim's.

pylate pins torch 2.11 and sentence-transformers 5.3, so its side runs in ``.bench-venvs/pylate`` (this file,
``--side pylate``), as does the PLAID search (fast-plaid wheels are built per torch version)::

    python -m venv .bench-venvs/pylate && .bench-venvs/pylate/bin/pip install torch==2.11.0 pylate==1.6.0
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/colbert_scifact.py --steps 20 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import embforge_train_config, peer_training_args

ROOT = Path(__file__).resolve().parents[1]
PYLATE = ROOT / ".bench-venvs" / "pylate" / "bin" / "python"


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/colbert-scifact")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--chunk-tokens", type=int, default=8192, help="embforge: padded tokens per forward chunk"
    )
    parser.add_argument(
        "--side", default="all", help="all (orchestrate), pylate or plaid (inside pylate's venv)"
    )
    parser.add_argument("--parts", default="embforge,pylate,dense", help="which models to train and score")
    parser.add_argument("--corpus-docs", type=int, default=0, help="score on a corpus subset (0: all 5,183)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-plaid", action="store_true", help="score embforge's model by exact MaxSim only (no PLAID index)"
    )
    parser.add_argument(
        "--amp", default="no", choices=["no", "bf16"], help="mixed precision of both sides' training"
    )
    parser.add_argument("--pairs", default="")
    parser.add_argument("--model", default="")
    # what _common's training settings read besides --steps, --batch-size, --lr, --seed and --amp: one pass, CPU
    parser.set_defaults(epochs=1, device="cpu")
    return parser.parse_args()


# ----------------------------------------------------------------------------------------- pylate's side
def pylate_train(args: argparse.Namespace) -> None:
    """Inside pylate's venv: train a ColBERT model from MiniLM with pylate's trainer; save it and the timing."""
    import datasets
    import torch
    from pylate import losses, models, utils
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.training_args import BatchSamplers

    torch.manual_seed(args.seed)
    rows = [json.loads(line) for line in Path(args.pairs).read_text().splitlines()]
    data = datasets.Dataset.from_dict(
        {"query": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}
    )
    model = models.ColBERT(args.model, device="cpu")
    training = peer_training_args(
        SentenceTransformerTrainingArguments,
        args,
        Path(args.out) / "trainer",
        max_steps=args.steps,
        batch_sampler=BatchSamplers.NO_DUPLICATES,  # embforge's sampler never puts a text twice in a batch
    )
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training,
        train_dataset=data,
        loss=losses.Contrastive(model=model),
        data_collator=utils.ColBERTCollator(model.tokenize),
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model.save(str(Path(args.out) / "model"))
    pairs = args.steps * args.batch_size
    timing = {"seconds": seconds, "pairs_per_second": pairs / seconds, "torch": torch.__version__}
    (Path(args.out) / "timing.json").write_text(json.dumps(timing) + "\n")
    print(json.dumps(timing), flush=True)


def plaid_search(args: argparse.Namespace) -> None:
    """Inside pylate's venv (fast-plaid): build a PLAID index over saved document matrices; search the queries."""
    from embforge.multivector.search import PlaidIndex

    saved = np.load(args.pairs)
    lengths = saved["doc_lengths"]
    flat = saved["docs"].astype(np.float32)
    docs = np.split(flat, np.cumsum(lengths)[:-1])
    queries = list(saved["queries"].astype(np.float32))
    index = PlaidIndex(Path(args.out) / "plaid-index")
    start = time.perf_counter()
    index.add([str(i) for i in range(len(docs))], docs)
    built = time.perf_counter() - start
    start = time.perf_counter()
    scores, ids = index.search(queries, 100)
    searched = time.perf_counter() - start
    np.savez(
        Path(args.out) / "plaid-top.npz", ids=np.array([[int(i) for i in row] for row in ids]), scores=scores
    )
    print(json.dumps({"build_s": built, "search_s": searched}), flush=True)


# -------------------------------------------------------------------------------------------- embforge
def colbert_config(args: argparse.Namespace, out: Path, seed: int):
    """embforge's side of every training here: the peer's settings, ``--steps`` steps of ``--chunk-tokens``."""
    return embforge_train_config(args, out, seed=seed, max_steps=args.steps, chunk_tokens=args.chunk_tokens)


def pylate_flags(args: argparse.Namespace, pairs_file: Path, minilm: Path, out: Path, seed: int) -> list[str]:
    """The command line of pylate's side (``--side pylate``): the same pairs, model, steps, batch and lr."""
    flags = ["--pairs", str(pairs_file), "--model", str(minilm), "--out", str(out), "--seed", str(seed)]
    flags += ["--steps", str(args.steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr)]
    return [*flags, "--amp", args.amp]


def run_peer(*command: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(PYLATE), __file__, *command], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"pylate side failed:\n{done.stderr[-4000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def one_seed(args: argparse.Namespace, seed: int, pairs_file: Path, minilm: Path) -> dict | None:
    """Train and score the models of one seed, the parts named by ``--parts``; each part's result is cached in
    ``OUT/seed-N/<part>.json`` (a finished training is reused), and the seed's row is complete once all three
    are there."""
    out = Path(args.out) / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    for part in args.parts.split(","):
        done = out / f"{part}.json"
        if not done.exists():
            result = PARTS[part](args, seed, pairs_file, minilm, out)
            done.write_text(json.dumps(result) + "\n")
            print(json.dumps({part: result}), flush=True)
    parts = [out / f"{p}.json" for p in PARTS]
    if not all(p.exists() for p in parts):
        return None
    merged: dict = {"seed": seed, "steps": args.steps, "batch": args.batch_size, "lr": args.lr}
    for path in parts:
        merged |= json.loads(path.read_text())
    return merged


def dev_data(args: argparse.Namespace):
    """SciFact dev (queries with qrels); with ``--corpus-docs N``, a corpus of every relevant document plus
    random others (fixed seed) up to N — the same subset for every model."""
    import random

    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import RetrievalData

    data = load_scifact("dev").queries_with_qrels()
    if not args.corpus_docs:
        return data
    relevant = {d for rel in data.qrels.values() for d in rel}
    others = [d for d in data.doc_ids if d not in relevant]
    keep = relevant | set(random.Random(0).sample(others, max(0, args.corpus_docs - len(relevant))))
    rows = [i for i, d in enumerate(data.doc_ids) if d in keep]
    return RetrievalData(
        doc_ids=[data.doc_ids[i] for i in rows],
        doc_texts=[data.doc_texts[i] for i in rows],
        doc_titles=[data.doc_titles[i] for i in rows],
        query_ids=data.query_ids,
        query_texts=data.query_texts,
        qrels=data.qrels,
        name=data.name,
    )


METRICS = ("ndcg@10", "recall@10", "recall@100")


def embforge_part(args: argparse.Namespace, seed: int, pairs_file: Path, minilm: Path, out: Path) -> dict:
    import torch

    from embforge.data.tables import read_table
    from embforge.losses.late import MaxSimInfoNCELoss
    from embforge.multivector import MultiVectorEncoder
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    folder = out / "embforge"
    if (folder / "train_summary.json").exists():  # trained earlier: score it
        colbert = MultiVectorEncoder.load(folder)
        summary = json.loads((folder / "train_summary.json").read_text())
    else:
        torch.manual_seed(seed)  # the projection's and marker rows' initialisation, as pylate's side seeds it
        colbert = MultiVectorEncoder.load(minilm)
        task = Task("scifact", read_table(pairs_file), MaxSimInfoNCELoss())
        summary = train(colbert, [task], colbert_config(args, folder, seed))
    return {"embforge_pairs_s": summary["pairs_per_second"]} | exact_and_plaid(
        args, colbert, dev_data(args), out
    )


def pylate_part(args: argparse.Namespace, seed: int, pairs_file: Path, minilm: Path, out: Path) -> dict:
    from embforge.multivector import MultiVectorEncoder
    from embforge.multivector.evaluate import evaluate_multivector

    folder = out / "pylate"
    if not (folder / "timing.json").exists():
        run_peer("--side", "pylate", *pylate_flags(args, pairs_file, minilm, folder, seed))
    timing = json.loads((folder / "timing.json").read_text())
    scores = evaluate_multivector(MultiVectorEncoder.load(folder / "model"), dev_data(args), metrics=METRICS)
    return {"pylate_pairs_s": timing["pairs_per_second"], "pylate": scores}


def dense_part(args: argparse.Namespace, seed: int, pairs_file: Path, minilm: Path, out: Path) -> dict:
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.losses import InfoNCELoss
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    dense = Encoder.load(minilm, max_seq_length=180)  # the ColBERT sides' document length
    task = Task("scifact", read_table(pairs_file), InfoNCELoss())
    summary = train(dense, [task], colbert_config(args, out / "dense", seed))
    scores = evaluate_retrieval(dense, dev_data(args), metrics=METRICS)
    return {"dense_pairs_s": summary["pairs_per_second"], "dense": scores}


PARTS = {"embforge": embforge_part, "pylate": pylate_part, "dense": dense_part}


def exact_and_plaid(args: argparse.Namespace, model, dev, out: Path) -> dict:
    """embforge's model on SciFact dev by exact MaxSim, and through PLAID (fast-plaid, in pylate's venv): the
    corpus is encoded once; PLAID's top 10 is compared with exact MaxSim's."""
    from embforge.evaluate.ranking import evaluate_run, run_from_topk
    from embforge.multivector.evaluate import recall_against
    from embforge.multivector.search import ExactMaxSimIndex

    data = dev
    start = time.perf_counter()
    docs = model.encode(data.documents, batch_size=64)
    queries = model.encode(data.query_texts, is_query=True)
    encode_s = time.perf_counter() - start
    exact = ExactMaxSimIndex()
    exact.add(data.doc_ids, docs)
    exact_run = run_from_topk(data.query_ids, *exact.search(queries, 100))
    metrics = ["ndcg@10", "recall@10", "recall@100"]
    scores = {name: 100 * value for name, value in evaluate_run(exact_run, data.qrels, metrics).items()}
    if args.no_plaid:
        return {"embforge": scores, "encode_s": encode_s}
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        out / "matrices.npz",
        docs=np.concatenate(docs).astype(np.float16),
        doc_lengths=np.array([len(d) for d in docs]),
        queries=np.stack(queries),
    )
    timing = run_peer("--side", "plaid", "--pairs", str(out / "matrices.npz"), "--out", str(out))
    top = np.load(out / "plaid-top.npz")
    ids = [[data.doc_ids[i] for i in row if i >= 0] for row in top["ids"]]
    plaid_run = run_from_topk(data.query_ids, top["scores"], ids)
    ndcg = 100 * evaluate_run(plaid_run, data.qrels, ["ndcg@10"])["ndcg@10"]
    return {
        "embforge": scores,
        "encode_s": encode_s,
        "plaid_recall@10": recall_against(exact_run, plaid_run, 10),
        "plaid_ndcg@10": ndcg,
    } | timing


def table(results: list[dict]) -> None:
    def cell(values: list[float]) -> str:
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {spread:.2f}" if len(values) > 1 else f"{values[0]:.2f}"

    print("\n| model | SciFact dev NDCG@10 | recall@100 | training pairs/s |")
    print("|---|---:|---:|---:|")
    for name, speed in (
        ("embforge", "embforge_pairs_s"),
        ("pylate", "pylate_pairs_s"),
        ("dense", "dense_pairs_s"),
    ):
        ndcg = cell([r[name]["ndcg@10"] for r in results])
        recall = cell([r[name]["recall@100"] for r in results])
        print(f"| {name} | {ndcg} | {recall} | {cell([r[speed] for r in results])} |")
    ratio = [r["embforge_pairs_s"] / r["pylate_pairs_s"] for r in results]
    gap = [r["embforge"]["ndcg@10"] - r["pylate"]["ndcg@10"] for r in results]
    print(f"\nembforge / pylate pairs/s: {cell(ratio)}x; NDCG@10 embforge - pylate: {cell(gap)}")
    if any("plaid_recall@10" not in r for r in results):  # --no-plaid
        return
    print(
        f"PLAID recall@10 vs exact MaxSim: {cell([r['plaid_recall@10'] for r in results])}; "
        f"PLAID NDCG@10 {cell([r['plaid_ndcg@10'] for r in results])}"
    )


def speed(args: argparse.Namespace) -> None:
    """Training pairs/s only: embforge then pylate, back to back, ``--steps`` steps each (no evaluation)."""
    import torch

    from embforge.data.tables import read_table
    from embforge.losses.late import MaxSimInfoNCELoss
    from embforge.modeling.resolve import resolve_model_path
    from embforge.multivector import MultiVectorEncoder
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    out = Path(args.out) / f"speed-{args.steps}-{args.seed}"
    pairs_file = Path(args.out) / "pairs.jsonl"
    minilm = resolve_model_path("all-MiniLM-L6-v2")
    task = Task("scifact", read_table(pairs_file), MaxSimInfoNCELoss())
    torch.manual_seed(args.seed)
    ours = train(MultiVectorEncoder.load(minilm), [task], colbert_config(args, out / "embforge", args.seed))
    theirs = run_peer("--side", "pylate", *pylate_flags(args, pairs_file, minilm, out / "pylate", args.seed))
    ratio = ours["pairs_per_second"] / theirs["pairs_per_second"]
    report = {"embforge_pairs_s": ours["pairs_per_second"], "pylate_pairs_s": theirs["pairs_per_second"]}
    print(json.dumps(report | {"ratio": ratio}), flush=True)


def main() -> None:
    args = arguments()
    if args.side == "pylate":
        return pylate_train(args)
    if args.side == "plaid":
        return plaid_search(args)
    if args.side == "speed":
        return speed(args)
    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import training_pairs
    from embforge.modeling.resolve import resolve_model_path

    Path(args.out).mkdir(parents=True, exist_ok=True)
    pairs = training_pairs(load_scifact("train"))
    pairs_file = Path(args.out) / "pairs.jsonl"
    rows = zip(pairs.columns["anchor"], pairs.columns["positive"])
    pairs_file.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows))
    minilm = resolve_model_path("all-MiniLM-L6-v2")
    results = [one_seed(args, int(s), pairs_file, minilm) for s in args.seeds.split(",")]
    complete = [r for r in results if r is not None]
    if complete:
        table(complete)


if __name__ == "__main__":
    sys.exit(main())
