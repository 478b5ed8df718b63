"""One process vs ``torchrun --nproc-per-node 2``: training and encoding throughput, and equal results.

Training: all-MiniLM-L6-v2 on STS-B train (CoSENT, the default recipe; ``--loss infonce`` trains on the pairs
with score >= 4 instead), global batch 64, ``--steps`` steps, fp32. The 1-process run gets all the CPU threads,
each of the 2 processes half of them (``OMP_NUM_THREADS``), so both use the same cores. Reports pairs/s from
``train_summary.json``, the wall time of the command (start-up included) and the largest weight difference between
the two final models (the point: 2 processes train exactly what 1 does).

Encoding: ``embforge encode`` of the unique STS-B test sentences, 1 vs 2 processes; the two ``.npy`` files must be
equal. The CLI commands are printed before they run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_torchrun.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(command: list[str], threads: int) -> float:
    print(f"$ OMP_NUM_THREADS={threads} {shlex.join(command)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def embforge(n: int, *args: str) -> list[str]:
    """``python -m embforge ARGS``, or under ``torchrun --nproc-per-node n`` (loopback rendezvous)."""
    if n == 1:
        return [sys.executable, "-m", "embforge", *args]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n)]
    return [*launcher, "--master-addr", "127.0.0.1", "--master-port", "29517", "-m", "embforge", *args]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--data", default=None, help="STS-B folder (default ../shared/data/stsb_en)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--loss", default="cosent")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (median reported)")
    args = parser.parse_args()

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder

    folder = Path(args.data) if args.data else data_root() / "stsb_en"
    work = Path(tempfile.mkdtemp(prefix="bench-torchrun-"))
    train_file = folder / "stsb-en-train.csv"
    if args.loss == "infonce":
        data = read_table(train_file)
        keep = [i for i, s in enumerate(data.labels()) if s >= 4.0]
        rows = [
            {"anchor": data.columns["sentence1"][i], "positive": data.columns["sentence2"][i]} for i in keep
        ]
        train_file = work / "pairs.jsonl"
        train_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    test = read_table(folder / "stsb-en-test.csv")
    sentences = list(dict.fromkeys(test.columns["sentence1"] + test.columns["sentence2"]))
    texts = work / "sentences.txt"
    texts.write_text("".join(s.replace("\n", " ") + "\n" for s in sentences))

    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for round_ in range(args.rounds):  # interleaved, the order alternating: both see the same machine load
        for n in (1, 2) if round_ % 2 == 0 else (2, 1):
            runs[n].append(measure(n, args, train_file, texts, work))
    results = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    one, two = Encoder.load(work / "train-1"), Encoder.load(work / "train-2")
    weight_diff = max((p - q).abs().max().item() for p, q in zip(one.parameters(), two.parameters()))
    same_vectors = bool(np.array_equal(np.load(work / "encode-1.npy"), np.load(work / "encode-2.npy")))
    title = f"{args.model}, {args.loss}, global batch {args.batch_size}, {args.steps} steps, fp32"
    print(
        f"\n{title}, {args.threads} CPU threads; encode: {len(sentences)} sentences; median of {args.rounds}"
    )
    print("| processes | train pairs/s | train loop s | train command s | encode command s |")
    print("|---|---|---|---|---|")
    for n, r in results.items():
        cells = [r["pairs_per_second"], r["train_seconds"], r["train_wall"], r["encode_wall"]]
        print(f"| {n} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    print(f"\nmax |weight difference| 1 vs 2 processes: {weight_diff:.2e}; encoded equal: {same_vectors}")


def measure(n: int, args: argparse.Namespace, train_file: Path, texts: Path, work: Path) -> dict[str, float]:
    """One training and one encoding with ``n`` processes (each with ``threads / n`` CPU threads)."""
    out = work / f"train-{n}"
    settings = ["--batch-size", str(args.batch_size), "--max-steps", str(args.steps), "--amp", "no"]
    settings += ["--save-every", "0", "--device", "cpu", "--quiet", "--output", str(out)]
    command = embforge(n, "train", "--model", args.model, "--train", str(train_file), "--loss", args.loss)
    wall = run([*command, *settings], max(1, args.threads // n))
    summary = json.loads((out / "train_summary.json").read_text())
    encode_out = work / f"encode-{n}.npy"
    command = embforge(n, "encode", "--model", args.model, "--input", str(texts), "--output", str(encode_out))
    encode_wall = run([*command, "--batch-size", "64", "--quiet"], max(1, args.threads // n))
    return {
        "pairs_per_second": summary["pairs_per_second"],
        "train_seconds": summary["seconds"],
        "train_wall": wall,
        "encode_wall": encode_wall,
    }


if __name__ == "__main__":
    main()
