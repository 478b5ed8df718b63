"""Training and encoding throughput: embforge vs sentence-transformers, in one process, same everything.

Both sides fine-tune all-MiniLM-L6-v2 on STS-B train with the same loss (CoSENT and cosine-MSE), batch size,
epochs, learning rate, warm-up, weight decay and clipping, then are scored on STS-B test with the same code.
Then both encode the STS-B test sentences (alternating rounds, best round kept). Prints a table with
embforge/peer ratios.

CPU efficiency: each side's model FLOPs/s in training (``step_flops`` of benchmarks/gpu/gpu_common.py: 6 × non-embedding
parameters × real tokens + 12 × layers × hidden × Σ len², forward + backward, padding excluded; tokens from each
side's own tokenisation of the pairs it trained on) as a fraction of this CPU's measured fp32 matmul rate (torch,
same threads, 2048², best of 5): the "how close to the limit" figure.

    .venv/bin/python benchmarks/bench_train.py                       # batch 16, lr 2e-5, 1 epoch
    .venv/bin/python benchmarks/bench_train.py --batch-size 32 --lr 5e-5 --losses cosent
    .venv/bin/python benchmarks/bench_train.py --losses cosent --limit 1024 --skip-encode  # CPU efficiency only
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import torch
from _common import embforge_train_config, peer_training_args

from embforge.data.paths import data_root
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.evaluate.similarity import correlations, pair_scores
from embforge.losses import get_loss
from embforge.modeling.resolve import resolve_model_path
from embforge.training.loop import train
from embforge.training.tasks import Task, prepare


def step_flops(backbone: torch.nn.Module, lengths: list[int]) -> float:
    """The GPU run's training FLOP count (benchmarks/gpu/gpu_common.py), imported from there."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
    from gpu_common import step_flops as gpu_step_flops

    return gpu_step_flops(backbone, lengths)


def cpu_matmul_peak(n: int = 2048, reps: int = 3, rounds: int = 5) -> float:
    """This CPU's fp32 ``torch.matmul`` rate (FLOP/s) at torch's current thread count: best of ``rounds``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(a, b)  # warm-up
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start))
    return best


class PeakRSS:
    """Highest resident set size seen (sampled every 20 ms) while the block runs, in MB."""

    def __enter__(self) -> PeakRSS:
        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.mb = self.peak / 2**20


def spearman(encode, test) -> float:
    a = encode(test.columns["sentence1"])
    b = encode(test.columns["sentence2"])
    return correlations(pair_scores(a, b)["cosine"], test.labels())["spearman"]


def run_peer(loss_name, train_data, test, args, out):
    from datasets import Dataset as HFDataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.training_args import SentenceTransformerTrainingArguments

    model = SentenceTransformer(str(resolve_model_path(args.model)), device=args.device)
    scores = np.asarray(train_data.labels(), dtype=np.float64)
    if loss_name == "mse":
        scores = (
            scores / 5.0
        )  # CosineSimilarityLoss wants [0, 1]; embforge's mse does the same rescale itself
        loss = losses.CosineSimilarityLoss(model)
    else:
        loss = losses.CoSENTLoss(model)
    dataset = HFDataset.from_dict(
        {
            "sentence1": train_data.columns["sentence1"],
            "sentence2": train_data.columns["sentence2"],
            "score": scores.tolist(),
        }
    )
    targs = peer_training_args(SentenceTransformerTrainingArguments, args, out)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=dataset, loss=loss)
    tokenize = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers 6: preprocess
    texts = train_data.columns["sentence1"] + train_data.columns["sentence2"]
    lengths = [
        int(n)
        for i in range(0, len(texts), 256)
        for n in tokenize(texts[i : i + 256])["attention_mask"].sum(1)
    ]
    flops = step_flops(model[0].auto_model, lengths) * args.epochs
    return measured(
        trainer.train, len(dataset) * args.epochs, lambda t: model.encode(t, batch_size=64), test, flops
    )


def run_embforge(loss_name, train_data, test, args, out):
    model = Encoder.load(args.model)
    config = embforge_train_config(args, out)
    task = Task("stsb", train_data, get_loss(loss_name))
    pairs = len(train_data) * args.epochs
    lengths = [len(ids) for ids in prepare(task, model).inputs(range(len(train_data)))]
    flops = step_flops(model.backbone, lengths) * args.epochs
    return measured(
        lambda: train(model, [task], config), pairs, lambda t: model.encode(t, batch_size=64), test, flops
    )


def measured(
    run: Callable[[], object], pairs: int, encode: Callable[[list[str]], np.ndarray], test, flops: float
) -> dict:
    """One side's training ``run`` over ``pairs`` pairs (``flops`` model FLOPs), timed (wall and CPU) under
    :class:`PeakRSS`; then its STS-B test Spearman (``encode``: the trained model's)."""
    with PeakRSS() as mem:
        start, cpu = time.perf_counter(), time.process_time()
        run()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "pairs_s": pairs / seconds,
        "pairs_cpu_s": pairs / cpu,
        "flops_s": flops / seconds,
        "rss": mem.mb,
        "spearman": spearman(encode, test),
    }


def bench_encode(args, test):
    from sentence_transformers import SentenceTransformer

    texts = list(dict.fromkeys(test.columns["sentence1"] + test.columns["sentence2"]))
    ours = Encoder.load(args.model, device=args.device)
    peer = SentenceTransformer(str(resolve_model_path(args.model)), device=args.device)
    best = {"embforge": 0.0, "peer": 0.0}
    diff = 0.0
    for _ in range(args.encode_rounds):
        for side in ("peer", "embforge"):
            start = time.perf_counter()
            if side == "peer":
                b = peer.encode(texts, batch_size=32)
            else:
                a = ours.encode(texts, batch_size=32)
            best[side] = max(best[side], len(texts) / (time.perf_counter() - start))
        diff = float(np.abs(a - b).max())
    return len(texts), best, diff


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--data", default=None, help="data root (default ../shared/data)")
    parser.add_argument("--losses", default="cosent,mse")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N training pairs")
    parser.add_argument("--encode-rounds", type=int, default=3)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-encode", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both libraries)")
    parser.add_argument("--amp", default="no", choices=["no", "bf16"], help="mixed precision on both sides")
    parser.add_argument("--out", default="/tmp/embforge-bench-train")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = data_root(args.data) / "stsb_en"
    train_data = read_table(root / "stsb-en-train.csv")
    if args.limit:
        train_data = train_data.subset(range(args.limit))
    test = read_table(root / "stsb-en-test.csv")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, threads {torch.get_num_threads()}"
    )
    print(
        f"data: STS-B train {len(train_data)} pairs, test {len(test)}; batch {args.batch_size}, lr {args.lr}, "
        f"epochs {args.epochs}, warmup 0.1, weight decay 0.01, clip 1.0\n"
    )
    rows = []
    if not args.skip_train:
        peak = cpu_matmul_peak() if args.device == "cpu" else None
        if peak:
            print(
                f"fp32 matmul peak (torch, 2048², {torch.get_num_threads()} threads, best of 5): {peak / 1e9:.1f} GFLOP/s"
            )
        for loss_name in args.losses.split(","):
            results = {}
            for side, fn in (("sentence-transformers", run_peer), ("embforge", run_embforge)):
                results[side] = fn(loss_name, train_data, test, args, Path(args.out) / f"{side}-{loss_name}")
                gc.collect()
                print(f"  {loss_name:7s} {side:22s} {results[side]}", flush=True)
            rows.append((loss_name, results))
        # pairs per CPU-second (all the process's threads): what a busy host's wall clock hides
        print(
            "\n| loss | library | train pairs/s | pairs per CPU-second | model GFLOP/s | of matmul peak | "
            "peak RSS (MB) | STS-B test Spearman |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for loss_name, results in rows:
            for side, r in results.items():
                frac = f"{100 * r['flops_s'] / peak:.0f} %" if peak else "-"
                print(
                    f"| {loss_name} | {side} | {r['pairs_s']:.1f} | {r['pairs_cpu_s']:.2f} | "
                    f"{r['flops_s'] / 1e9:.1f} | {frac} | {r['rss']:.0f} | {r['spearman']:.2f} |"
                )
            ours, peer = results["embforge"], results["sentence-transformers"]
            print(
                f"| {loss_name} | **embforge / peer** | **{ours['pairs_s'] / peer['pairs_s']:.2f}x** | "
                f"**{ours['pairs_cpu_s'] / peer['pairs_cpu_s']:.2f}x** | "
                f"{ours['flops_s'] / peer['flops_s']:.2f}x | | {ours['rss'] / peer['rss']:.2f}x | "
                f"{ours['spearman'] - peer['spearman']:+.2f} |"
            )
    if args.skip_encode:
        return
    n, best, diff = bench_encode(args, test)
    print(f"\n| encode ({n} STS-B test sentences, batch 32, best of {args.encode_rounds}) | sentences/s |")
    print("|---|---:|")
    print(f"| sentence-transformers | {best['peer']:.0f} |")
    print(f"| embforge | {best['embforge']:.0f} |")
    print(f"| **embforge / peer** | **{best['embforge'] / best['peer']:.2f}x** (max abs diff {diff:.1e}) |")


if __name__ == "__main__":
    main()
