"""Encode throughput on CPU: embforge (torch, ONNX fp32, ONNX int8) vs sentence-transformers, one process.

All four encode the same sentences (the unique sentences of STS-B test) with the same batch size. Runs are
interleaved round by round (the order rotates each round) so all see the same machine load; the table reports the
median sentences/s over rounds, the ratio to sentence-transformers and the STS-B test Spearman of each.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/bench_encode.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def spearman_of(emb: np.ndarray, sentences: list[str], data) -> float:
    """STS-B Spearman (0-100) of cosine similarity, from the embeddings of the unique sentences."""
    from embforge.evaluate.similarity import correlations

    s1, s2 = data.columns["sentence1"], data.columns["sentence2"]
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    pos = {t: i for i, t in enumerate(sentences)}
    cos = (emb[[pos[t] for t in s1]] * emb[[pos[t] for t in s2]]).sum(1)
    return correlations(cos, np.asarray(data.labels(), dtype=np.float64))["spearman"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch and onnxruntime")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--export-dir", default=None, help="reuse an export (default: export to a temp folder)"
    )
    args = parser.parse_args()

    from sentence_transformers import SentenceTransformer

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table
    from embforge.encoder import Encoder
    from embforge.export import export_onnx
    from embforge.modeling.onnx_runtime import OnnxEncoder
    from embforge.modeling.resolve import resolve_model_path

    data = read_table(
        data_root() / "stsb_en" / "stsb-en-test.csv", header=None, columns="0=sentence1,1=sentence2,2=score"
    )
    sentences = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))
    path = resolve_model_path("all-MiniLM-L6-v2")
    export_dir = Path(args.export_dir or tempfile.mkdtemp(prefix="embforge-onnx-"))
    if not (export_dir / "model_int8.onnx").exists():
        report = export_onnx(path, export_dir, quantize="int8")
        print(f"exported to {export_dir}: parity {report['parity']}")

    bs = args.batch_size
    if args.threads:
        torch.set_num_threads(args.threads)
    torch_model = Encoder.load(path)
    fp32 = OnnxEncoder.load(export_dir / "model.onnx", threads=args.threads)
    int8 = OnnxEncoder.load(export_dir / "model_int8.onnx", threads=args.threads)
    peer = SentenceTransformer(str(path), device="cpu")
    runners = {
        "sentence-transformers": lambda t: peer.encode(t, batch_size=bs, convert_to_numpy=True),
        "embforge torch": lambda t: torch_model.encode(t, batch_size=bs),
        "embforge onnx fp32": lambda t: fp32.encode(t, batch_size=bs),
        "embforge onnx int8": lambda t: int8.encode(t, batch_size=bs),
    }
    for run in runners.values():  # warm-up
        run(sentences[:64])
    times: dict[str, list[float]] = {name: [] for name in runners}
    outputs: dict[str, np.ndarray] = {}
    names = list(runners)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            outputs[name] = np.asarray(runners[name](sentences), dtype=np.float32)
            times[name].append(time.perf_counter() - start)
        print(
            f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in names),
            flush=True,
        )
    spearman = {name: spearman_of(outputs[name], sentences, data) for name in names}
    peer_rate = len(sentences) / statistics.median(times["sentence-transformers"])
    print(
        f"\n{len(sentences)} unique STS-B test sentences, batch {bs}, {args.rounds} interleaved rounds, "
        f"torch threads {torch.get_num_threads()}, onnxruntime threads {args.threads or 'default'}, "
        f"CPU cores {os.cpu_count()}"
    )
    print("| runner | sentences/s (median) | vs sentence-transformers | STS-B test Spearman |")
    print("|---|---:|---:|---:|")
    for name in names:
        rate = len(sentences) / statistics.median(times[name])
        print(f"| {name} | {rate:.0f} | {rate / peer_rate:.2f}x | {spearman[name]:.2f} |")
    print(
        f"\nint8 - fp32 Spearman: {spearman['embforge onnx int8'] - spearman['embforge onnx fp32']:+.2f} points"
    )


if __name__ == "__main__":
    main()
