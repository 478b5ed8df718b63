"""Does a large cached batch help retrieval at SciFact's size? Batch 32 vs batch 256 (cached, mini-batch 32).

Each (batch, seed) trains all-MiniLM-L6-v2 on the SciFact train queries (in-batch negatives only, InfoNCE, the
same epochs, learning rate and max sequence length) in its own process with the CLI, then scores SciFact dev
NDCG@10 against the whole 5,183-document corpus. Results go to ``OUT/<batch>-<seed>.json`` (a rerun skips what
exists), and the table (mean ± std over seeds) is printed at the end.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/cached_scifact.py --out runs/cached-scifact
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

from embforge.data.paths import data_root

EMBFORGE = [sys.executable, "-m", "embforge"]


def last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def run(command: list[str]) -> tuple[dict, float]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return last_json(done.stdout), time.perf_counter() - start


def train_and_score(
    source: list[str], model: Path, args: argparse.Namespace, *, batch: int, mini: int, seed: int
) -> dict:
    """Train all-MiniLM-L6-v2 on ``source`` (CLI data flags) with InfoNCE, in-batch negatives only; score SciFact dev."""
    train = [*EMBFORGE, "train", *source, "--loss", "infonce"]
    train += ["--batch-size", str(batch), "--mini-batch-size", str(mini), "--epochs", str(args.epochs)]
    train += ["--lr", str(args.lr), "--seed", str(seed), "--max-seq-length", str(args.max_seq_length)]
    train += ["--save-every", "0", "--quiet", "--output", str(model)]
    report, train_s = run(train)
    scifact = str(data_root() / "scifact")
    scores, eval_s = run(
        [*EMBFORGE, "eval", "retrieval", "--model", str(model), "--data", scifact, "--split", "dev"]
    )
    result = {
        "batch": batch,
        "mini_batch": mini,
        "seed": seed,
        "steps": report.get("steps"),
        "train_s": train_s,
    }
    return result | {"eval_s": eval_s, "ndcg@10": scores["ndcg@10"]}


def one(args: argparse.Namespace, batch: int, mini: int, seed: int) -> dict:
    result_file = Path(args.out) / f"{batch}-{seed}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    source = ["--retrieval-train", str(data_root() / "scifact"), "--num-negatives", "0"]
    model = Path(args.out) / f"model-{batch}-{seed}"
    result = train_and_score(source, model, args, batch=batch, mini=mini, seed=seed)
    result_file.write_text(json.dumps(result) + "\n")
    print(json.dumps(result), flush=True)
    return result


def recipe_arguments(description: str, out: str) -> argparse.Namespace:
    """The command line of the SciFact training benchmarks: output folder, seeds and the shared recipe."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=out)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-seq-length", type=int, default=128)
    return parser.parse_args()


def main() -> None:
    args = recipe_arguments(__doc__, "runs/cached-scifact")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = {(32, 0): [], (256, 32): []}
    for seed in seeds:
        for (batch, mini), results in rows.items():
            results.append(one(args, batch, mini, seed))
    print(
        "\n| batch (mini-batch) | optimiser steps | SciFact dev NDCG@10, mean ± std | per seed | train s / run |"
    )
    print("|---|---:|---|---|---:|")
    for (batch, mini), results in rows.items():
        ndcg = [r["ndcg@10"] for r in results]
        spread = statistics.stdev(ndcg) if len(ndcg) > 1 else 0.0
        label = f"{batch} (cached, {mini})" if mini else f"{batch}"
        train_s = statistics.mean(r["train_s"] for r in results)
        per_seed = ", ".join(f"{x:.2f}" for x in ndcg)
        print(
            f"| {label} | {results[0]['steps']} | {statistics.mean(ndcg):.2f} ± {spread:.2f} | {per_seed} | {train_s:.0f} |"
        )


if __name__ == "__main__":
    main()
