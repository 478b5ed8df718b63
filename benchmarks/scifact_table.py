"""SciFact retrieval table: zero-shot MiniLM vs fine-tuning with in-batch negatives, + BM25, + dense, + ANCE refresh.

Every fine-tuned row has the same budget (``--steps`` optimiser steps of ``--batch-size`` train queries, same lr,
seed and max sequence length) and is scored on the dev split (the 121 train queries with ``md5(id) % 8 == 0``, see
:mod:`embforge.data.builtin.scifact`). ``--eval-docs N`` scores against the dev-judged documents plus the first N other
documents instead of the whole 5,183-document corpus, and ``--train-docs N`` mines from the train-judged documents
plus N others (to fit a small CPU budget; say so when reporting).

Run: ``HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/scifact_table.py --steps 20``
"""

from __future__ import annotations

import argparse
import json
import time


def sub_corpus(data, eval_docs):
    if eval_docs is None:
        return data
    judged = {d for rel in data.qrels.values() for d in rel}
    keep = [i for i, d in enumerate(data.doc_ids) if d in judged][:] + [
        i for i, d in enumerate(data.doc_ids) if d not in judged
    ][:eval_docs]
    keep.sort()
    data.doc_ids = [data.doc_ids[i] for i in keep]
    data.doc_texts = [data.doc_texts[i] for i in keep]
    data.doc_titles = [data.doc_titles[i] for i in keep]
    return data


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--eval-docs", type=int, default=None, help="dev corpus: judged docs + N others")
    parser.add_argument("--train-docs", type=int, default=None, help="mining corpus: judged docs + N others")
    parser.add_argument("--refresh-every", type=int, default=5)
    parser.add_argument("--rows", default="zero-shot,in-batch,bm25,dense,ance")
    parser.add_argument("--output", default="runs/scifact-table")
    args = parser.parse_args()

    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import training_pairs
    from embforge.encoder import Encoder
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.losses import get_loss
    from embforge.retrieval.mining import MiningConfig
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.refresh import NegativeRefresher, RefreshConfig, RefreshHook
    from embforge.training.tasks import Task

    train_data = sub_corpus(load_scifact("train"), args.train_docs)
    dev = sub_corpus(load_scifact("dev"), args.eval_docs)

    def refresh(method: str, every: int = 0, start: float = 1.0, end: float = 1.0) -> RefreshConfig:
        mining = MiningConfig(method=method, num_negatives=1, relative_margin=0.05)
        return RefreshConfig(every=every, hard_ratio_start=start, hard_ratio_end=end, mining=mining)

    settings = {
        "in-batch": None,
        "bm25": refresh("bm25"),
        "dense": refresh("dense"),
        "ance": refresh("dense", args.refresh_every, 0.3, 0.9),
    }
    print(
        f"dev: {len(dev.query_ids)} queries, {len(dev.doc_ids)} documents; "
        f"train: {len(train_data.query_ids)} queries, mining corpus {len(train_data.doc_ids)} documents"
    )
    print("| model | NDCG@10 | Recall@100 | train s | refresh stall s |")
    print("|---|---|---|---|---|")
    for row in args.rows.split(","):
        model = Encoder.load("all-MiniLM-L6-v2", max_seq_length=args.max_seq_length)
        seconds, stall = 0.0, 0.0
        if row != "zero-shot":
            out = f"{args.output}/{row}"
            loss = get_loss("infonce")
            hook = None
            if settings[row] is None:
                tasks = [Task("retrieval", training_pairs(train_data), loss)]
            else:
                miner = NegativeRefresher(
                    train_data, loss, settings[row], total_steps=args.steps, log_dir=out
                )
                tasks = miner.start(model)
                hook = RefreshHook(miner, tasks) if settings[row].every else None
            config = TrainConfig(
                output=out,
                max_steps=args.steps,
                batch_size=args.batch_size,
                lr=args.lr,
                quiet=True,
                save_every=0,
            )
            started = time.perf_counter()
            train(model, tasks, config, refresher=hook)
            seconds = time.perf_counter() - started
            try:
                with open(f"{out}/refresh.jsonl") as handle:
                    stall = sum(json.loads(line).get("stall_seconds", 0.0) for line in handle)
            except FileNotFoundError:
                pass
        metrics = evaluate_retrieval(model, dev, metrics=["ndcg@10", "recall@100"])
        print(
            f"| {row} | {metrics['ndcg@10']:.2f} | {metrics['recall@100']:.2f} | {seconds:.0f} | {stall:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
