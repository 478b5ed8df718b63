"""A static model distilled from all-MiniLM-L6-v2 beside the dense model: STS-B test Spearman and encode speed.

1. ``embforge distill-static`` (model2vec: vocabulary distillation, PCA to 256 dims, Zipf weighting), offline from
   the local MiniLM folder;
2. STS-B test Spearman (cosine) and encode texts/s of the dense model and the static one (the unique sentences
   of STS-B test, same batch size; the static model also at batch 1024), and of sentence-transformers
   encoding the same static folder (the peer's ``StaticEmbedding``);
3. one epoch of CoSENT on STS-B train through ``embforge train --model-type static``, then STS-B test again.

    python benchmarks/static_minilm.py [--lr 0.01] [--threads 2] [--output DIR --reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def texts_per_second(encode: Any, texts: list[str], rounds: int = 3) -> float:
    """Best of ``rounds`` timed encodes of ``texts`` (after one warm-up on a slice)."""
    encode(texts[:64])
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        encode(texts)
        best = min(best, time.perf_counter() - start)
    return len(texts) / best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--output", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--lr", type=float, default=0.01, help="CoSENT learning rate (chosen on STS-B dev)")
    parser.add_argument("--batch-size", type=int, default=32, help="training batch size")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--reuse", action="store_true", help="keep an already distilled OUTPUT/static folder")
    parser.add_argument(
        "--speed-texts", type=int, default=None, help="sentences timed per encode (default all)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds; the median is kept")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.evaluate.sts import evaluate_sts
    from embforge.static.distill import distill_static
    from embforge.static.model import StaticEncoder
    from embforge.training.run import run, spec_from_dict

    work = Path(args.output or tempfile.mkdtemp(prefix="bench-static-"))
    folder = data_root() / "stsb_en"
    test = read_table(folder / "stsb-en-test.csv", header=None, columns="0=sentence1,1=sentence2,2=score")
    sentences = list(dict.fromkeys(test.columns["sentence1"] + test.columns["sentence2"]))

    start = time.perf_counter()
    if not (args.reuse and (work / "static" / "model.safetensors").exists()):
        distill_static(args.model, work / "static", pca_dims=256)
    distill_seconds = time.perf_counter() - start
    dense, static = Encoder.load(args.model), StaticEncoder.load(work / "static")
    peer = SentenceTransformer(str(work / "static"), device="cpu")
    rows = [
        ("dense all-MiniLM-L6-v2 (embforge)", dense, lambda t: dense.encode(t, batch_size=32)),
        ("static (embforge)", static, lambda t: static.encode(t, batch_size=32)),
        ("static (embforge, batch 1024)", static, lambda t: static.encode(t, batch_size=1024)),
        ("static (sentence-transformers)", None, lambda t: peer.encode(t, batch_size=32)),
    ]
    results = [
        {
            "model": name,
            "spearman": evaluate_sts(model, test)["spearman"] if model is not None else None,
            "speeds": [],
        }
        for name, model, _ in rows
    ]
    timed = sentences[: args.speed_texts]
    for _ in range(args.rounds):  # interleaved rounds: every model sees the same machine load; median kept
        for result, (_, _, encode) in zip(results, rows):
            result["speeds"].append(texts_per_second(encode, timed, rounds=1))
    for result in results:
        result["texts_per_s"] = statistics.median(result.pop("speeds"))
        print(json.dumps(result), file=sys.stderr)

    train_file = work / "stsb-en-train.csv"  # a copy without the C0 control characters a few rows hold
    raw = (folder / "stsb-en-train.csv").read_text(encoding="utf-8")
    train_file.write_text(
        raw.translate({c: " " for c in range(32) if chr(c) not in "\t\n\r"}), encoding="utf-8"
    )
    spec = spec_from_dict(
        {
            "model": str(work / "static"),
            "model_type": "static",
            "train": [str(train_file)],
            "columns": "0=sentence1,1=sentence2,2=score",
            "loss": "cosent",
            "epochs": 1,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "save_every": 0,
            "device": "cpu",
            "quiet": True,
            "output": str(work / "static-cosent"),
        }
    )
    summary = run(spec)
    trained = StaticEncoder.load(work / "static-cosent")
    trained_spearman = evaluate_sts(trained, test)["spearman"]

    base = results[0]["texts_per_s"]
    print(f"\nSTS-B test: {len(sentences)} unique sentences, {len(timed)} timed; {args.threads} CPU threads")
    print(f"distill-static: {distill_seconds:.0f} s (0 with --reuse)")
    print("| model | STS-B test Spearman | encode texts/s | vs dense |")
    print("|---|---:|---:|---:|")
    for r in results:
        score = f"{r['spearman']:.2f}" if r["spearman"] is not None else "(same vectors)"
        print(f"| {r['model']} | {score} | {r['texts_per_s']:,.0f} | {r['texts_per_s'] / base:.0f}x |")
    print(
        f"| static + 1 epoch CoSENT on STS-B train (lr {args.lr}, batch {args.batch_size}, "
        f"{summary['steps']} steps, {summary['seconds']:.0f} s) | {trained_spearman:.2f} | | |"
    )


if __name__ == "__main__":
    main()
