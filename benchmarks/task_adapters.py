"""Issue #52: task adapters in one model — each LoRA adapter should win its own task.

all-MiniLM-L6-v2 (frozen) gets two rank-8 LoRA adapters, trained one after the other with ``embforge train
--adapter-name``, the second added to the folder the first wrote:

- ``similarity``: CoSENT on STS-B train (``--steps`` steps, batch 32);
- ``retrieval``: InfoNCE with in-batch negatives on SciFact train (the 688 train queries; the 121 dev queries are
  carved out, ``embforge.data.builtin.scifact``), ``--steps`` steps, batch 32.

The final folder (base weights + ``adapters/similarity`` + ``adapters/retrieval``) is then evaluated with the base
(``task=None``) and each adapter on STS-B test (Spearman, 1,379 pairs) and SciFact dev (NDCG@10, 121 queries over
their judged documents plus ``--eval-docs`` others; SciFact's test qrels are not in the data folder). Trained folders
are reused when present, so an interrupted run resumes.

Run (a few minutes on 2 CPU cores)::

    HF_HUB_OFFLINE=1 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/task_adapters.py --out runs/task_adapters
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

TASKS = (None, "similarity", "retrieval")


def train(args: argparse.Namespace, model: str, name: str, data: list[str], output: Path) -> None:
    """``embforge train ... --lora-r 8 --adapter-name NAME`` into ``output`` (skipped when it is there)."""
    from embforge.cli import main

    if (output / "config_sentence_transformers.json").is_file():
        return
    command = ["train", "--model", model, *data, "--lora-r", "8", "--adapter-name", name]
    command += ["--max-steps", str(args.steps), "--batch-size", "32", "--lr", str(args.lr), "--seed", "0"]
    command += ["--save-every", "0", "--quiet", "--output", str(output)]
    print("embforge " + " ".join(command), flush=True)
    started = time.perf_counter()
    if main(command) != 0:
        raise SystemExit(f"training the {name} adapter failed")
    print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from embforge.data.builtin import load_builtin
    from embforge.data.paths import data_root
    from embforge.encoder import Encoder
    from embforge.evaluate.retrieval import evaluate_retrieval
    from embforge.evaluate.sts import evaluate_sts
    from embforge.modeling.adapters import using_task

    out, root = Path(args.out), data_root()
    stsb = ["--train", str(root / "stsb_en" / "stsb-en-train.csv"), "--loss", "cosent"]
    scifact = ["--retrieval-train", str(root / "scifact"), "--num-negatives", "0", "--loss", "infonce"]
    train(args, args.base, "similarity", stsb, out / "similarity")
    train(args, str(out / "similarity"), "retrieval", scifact, out / "tasks")
    model = Encoder.load(out / "tasks")
    sts = load_builtin("stsb", "test")
    dev = load_builtin("scifact", "dev").subset(max_corpus=args.eval_docs)
    rows = []
    for task in TASKS:
        with using_task(model, task):  # encode() inside the evaluators uses this adapter (None: the base)
            row = {
                "task": task or "base",
                "sts": evaluate_sts(model, sts)["spearman"],
                "ndcg@10": evaluate_retrieval(model, dev, metrics=["ndcg@10"], batch_size=32)["ndcg@10"],
                "docs": len(dev.doc_ids),
                "queries": len(dev.query_ids),
            }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    best_sts = max(r["sts"] for r in rows)
    best_ndcg = max(r["ndcg@10"] for r in rows)

    def mark(value: float, best: float) -> str:
        return f"**{value:.2f}**" if value == best else f"{value:.2f}"

    out = ["| encode with | STS-B test Spearman | SciFact dev NDCG@10 |", "|---|---:|---:|"]
    for r in rows:
        out.append(f"| {r['task']} | {mark(r['sts'], best_sts)} | {mark(r['ndcg@10'], best_ndcg)} |")
    return "\n".join(out)


def _cpuinfo() -> list[str]:
    path = Path("/proc/cpuinfo")
    return path.read_text().splitlines() if path.is_file() else []


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default="all-MiniLM-L6-v2")
    parser.add_argument("--steps", type=int, default=200, help="training steps per adapter")
    parser.add_argument("--lr", type=float, default=5e-4, help="LoRA usually wants a larger rate")
    parser.add_argument("--eval-docs", type=int, default=1000)
    parser.add_argument("--out", default="runs/task_adapters")
    args = parser.parse_args()
    rows = measure(args)
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "?")
    print(f"SciFact dev: {rows[0]['queries']} queries, {rows[0]['docs']} documents")
    print(f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()}")
    print(table(rows))


if __name__ == "__main__":
    main()
