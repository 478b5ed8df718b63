"""Cached (GradCache) steps and gradient checkpointing: peak memory and time of one InfoNCE step, vs the peer.

Every measurement runs in a fresh child process (so peak RSS is that configuration's own): all-MiniLM-L6-v2 on
SciFact train pairs (query, abstract; long documents), one warm-up step then timed steps of InfoNCE with in-batch
negatives, fp32. Configurations:

- embforge uncached at batch 32 (plain batch 256 needs > 24 GB here); cached (``mini_batch_size``) at 64, 256, 1024;
- sentence-transformers' ``CachedMultipleNegativesRankingLoss`` at the same batch and mini-batch (the peer);
- embforge with and without gradient checkpointing at batch 64 (uncached).

    .venv/bin/python benchmarks/bench_cached.py                         # the whole table
    .venv/bin/python benchmarks/bench_cached.py --only embforge-cached:256:32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

CONFIGS = [
    "embforge:32:0",
    "embforge-cached:64:32",  # vs embforge:64:0 below: cached vs plain time at equal batch
    "embforge-cached:256:32",
    "peer-cached:256:32",
    "embforge-cached:1024:32",
    "peer-cached:1024:32",
    "embforge:64:0",
    "embforge-checkpointing:64:0",
]


def pairs(n: int) -> tuple[list[str], list[str]]:
    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.retrieval import training_pairs

    data = training_pairs(load_scifact("all"))
    anchors, positives = data.columns["anchor"], data.columns["positive"]
    reps = -(-n // len(anchors))
    return (anchors * reps)[:n], (positives * reps)[:n]


def embforge_step(kind: str, batch: int, mini: int, max_seq_length: int) -> tuple[callable, object]:
    from embforge.data.tables import Dataset
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.step import cached_step
    from embforge.training.tasks import Task, prepare

    model = Encoder.load("all-MiniLM-L6-v2", max_seq_length=max_seq_length)
    if kind == "embforge-checkpointing":
        model.gradient_checkpointing(True)
    anchors, positives = pairs(batch)
    data = Dataset("scifact", {"anchor": anchors, "positive": positives}, list(range(1, batch + 1)))
    task = prepare(Task("scifact", data, get_loss("infonce")), model)
    rows = tuple(range(batch))
    model.train()
    seed = iter(range(10**6))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if mini:
            cached_step(
                model,
                task,
                rows,
                mini_batch_size=mini,
                max_tokens=512,
                dropout_seed=next(seed),
                backward=lambda loss: loss.backward(),
            )
        else:
            loss = task.loss_fn(model(task.inputs(rows), max_tokens=512, dropout_seed=next(seed)), None)
            loss.backward()

    return step, model


def peer_step(batch: int, mini: int, max_seq_length: int) -> tuple[callable, object]:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss

    from embforge.modeling.resolve import resolve_model_path

    model = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
    model.max_seq_length = max_seq_length
    loss = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=mini)
    anchors, positives = pairs(batch)
    features = [model.tokenize(anchors), model.tokenize(positives)]
    labels = torch.zeros(batch)
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss(features, labels).backward()

    return step, model


def child(config: str, steps: int, max_seq_length: int) -> dict:
    import psutil
    from bench_train import PeakRSS

    torch.manual_seed(0)
    kind, batch, mini = config.split(":")
    batch_size, mini_size = int(batch), int(mini)
    if kind.startswith("peer"):
        step, _ = peer_step(batch_size, mini_size, max_seq_length)
    else:
        step, _ = embforge_step(kind, batch_size, mini_size, max_seq_length)
    before = psutil.Process().memory_info().rss / 2**20
    with PeakRSS() as peak:
        step()  # warm-up, and the peak of one step
        started = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = (time.perf_counter() - started) / steps
    return {
        "config": config,
        "peak_rss_mb": peak.mb,
        "step_mb": peak.mb - before,
        "seconds_per_step": seconds,
        "pairs_per_second": batch_size / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", action="append", help="configuration(s) to run, e.g. embforge-cached:256:32"
    )
    parser.add_argument("--steps", type=int, default=1, help="timed steps after the warm-up step (default 1)")
    parser.add_argument("--max-seq-length", type=int, default=256, help="tokens per text (default 256)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.max_seq_length)))
        return
    results = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent)}
    for config in args.only or CONFIGS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                config,
                "--steps",
                str(args.steps),
                "--max-seq-length",
                str(args.max_seq_length),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if out.returncode != 0:
            print(f"{config}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(
            f"{r['config']:<28} peak RSS {r['peak_rss_mb']:8.0f} MB  step +{r['step_mb']:7.0f} MB  "
            f"{r['seconds_per_step']:7.2f} s/step  {r['pairs_per_second']:6.1f} pairs/s",
            flush=True,
        )
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
