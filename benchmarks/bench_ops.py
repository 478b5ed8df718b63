"""Operations dispatched per training step and per encode: embforge vs sentence-transformers, in one run.

On a GPU each dispatched operation is a kernel launch (5-10 µs of host time), so a small model's large batch is
launch-bound when the count grows with the batch. Counted here on the CPU with ``torch.profiler`` (``aten::``
events, nested ones included), which is deterministic: a 2-layer, 64-wide BERT built from all-MiniLM-L6-v2's
config and tokenizer (its compute is negligible, so the count is what a GPU would pay in launches), STS-B train
pairs, CoSENT, AdamW.

- embforge step: the operations between the end of step 1 and the end of step 2 of ``train()``;
- sentence-transformers step: the second of two hand-written steps — tokenize, forward of both columns,
  ``CoSENTLoss``, backward, ``AdamW.step`` (fused, as its trainer's default on this torch), ``zero_grad``;
- encode: ``encode()`` of N STS-B test sentences at each library's default batch size (embforge counted with an
  accelerator's token budget, ``encode_tokens = ENCODE_TOKENS``; a CPU's default chunks are cache-sized).

A second table times embforge's step with and without dropout (the keyed hash masks' cost; one thread).

    .venv/bin/python benchmarks/bench_ops.py
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch

from embforge.data.paths import data_root
from embforge.data.tables import read_table
from embforge.encoder import ENCODE_TOKENS, Encoder
from embforge.losses import get_loss
from embforge.modeling.resolve import resolve_model_path
from embforge.profiling import op_count, step_ops
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task


def tiny_minilm(folder: Path, dropout: float) -> Path:
    """all-MiniLM-L6-v2's config and tokenizer with 2 layers of width 64, random weights, saved for both."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    root = resolve_model_path("all-MiniLM-L6-v2")
    config = BertConfig.from_pretrained(root)
    config.num_hidden_layers, config.hidden_size = 2, 64
    config.num_attention_heads, config.intermediate_size = 2, 128
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    torch.manual_seed(0)
    path = folder / f"tiny-{dropout}"
    Encoder(BertModel(config), AutoTokenizer.from_pretrained(root), max_seq_length=128).save(path)
    return path


def embforge_step(path: Path, data, batch: int, out: Path) -> int:
    model = Encoder.load(path)
    config = TrainConfig(
        output=str(out), max_steps=2, batch_size=batch, save_every=0, log_every=1000, quiet=True, amp="no"
    )
    return step_ops(
        lambda on_step: train(model, [Task("stsb", data, get_loss("cosent"))], config, on_step=on_step)
    )


def embforge_step_seconds(path: Path, data, batch: int, out: Path, steps: int = 13) -> float:
    """Median wall seconds of steps 2..``steps`` (one thread): the hash dropout's cost beside no dropout."""
    model = Encoder.load(path)
    config = TrainConfig(
        output=str(out), max_steps=steps, batch_size=batch, save_every=0, log_every=1000, quiet=True, amp="no"
    )
    marks: list[float] = []
    train(
        model,
        [Task("stsb", data, get_loss("cosent"))],
        config,
        on_step=lambda _: marks.append(time.perf_counter()),
    )
    return statistics.median(b - a for a, b in itertools.pairwise(marks))


def peer_step(path: Path, data, batch: int) -> int:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import CoSENTLoss

    model = SentenceTransformer(str(path), device="cpu")
    loss = CoSENTLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    columns = data.columns

    def step(start: int) -> None:
        rows = slice(start, start + batch)
        features = [model.tokenize(columns[name][rows]) for name in ("sentence1", "sentence2")]
        labels = torch.tensor(columns["score"][rows], dtype=torch.float32)
        loss(features, labels).backward()
        optimizer.step()
        optimizer.zero_grad()

    model.train()
    step(0)
    return op_count(lambda: step(batch))


def encode_ops(path: Path, texts: list[str]) -> tuple[int, int]:
    from sentence_transformers import SentenceTransformer

    ours, peer = Encoder.load(path), SentenceTransformer(str(path), device="cpu")
    ours.encode_tokens = ENCODE_TOKENS  # an accelerator's plan (on a CPU the default chunks are cache-sized)
    ours.encode(texts[:8], show_progress=False)  # warm both up
    peer.encode(texts[:8])
    return (
        op_count(lambda: ours.encode(texts, show_progress=False)),
        op_count(lambda: peer.encode(texts, show_progress_bar=False)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="the shared data folder (default ../shared/data)")
    parser.add_argument("--batches", default="64,512", help="batch sizes (pairs) and encode sizes (texts)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = data_root(args.data) / "stsb_en"
    data = read_table(root / "stsb-en-train.csv")
    test = read_table(root / "stsb-en-test.csv").columns["sentence1"]
    sizes = [int(x) for x in args.batches.split(",")]
    rows, seconds = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for dropout in (0.1, 0.0):
            path = tiny_minilm(folder, dropout)
            for batch in sizes:
                ours = embforge_step(path, data, batch, folder / f"run-{dropout}-{batch}")
                peer = peer_step(path, data, batch)
                rows.append((f"training step, CoSENT, dropout {dropout}", batch, ours, peer))
                seconds[dropout, batch] = embforge_step_seconds(
                    path, data, batch, folder / f"time-{dropout}-{batch}"
                )
        path = tiny_minilm(folder, 0.1)
        for n in sizes:
            ours, peer = encode_ops(path, list(test[:n]))
            rows.append(("encode of N texts", n, ours, peer))
    print("| what | batch / N | embforge ops | sentence-transformers ops | ratio |")
    print("|---|---:|---:|---:|---:|")
    for what, size, ours, peer in rows:
        print(f"| {what} | {size} | {ours:,} | {peer:,} | {ours / peer:.2f}x |")
    print(
        "\n| embforge step, one thread (median of 12) | batch | dropout 0.1 (ms) | dropout 0 (ms) | ratio |"
    )
    print("|---|---:|---:|---:|---:|")
    for batch in sizes:
        on, off = seconds[0.1, batch], seconds[0.0, batch]
        print(f"| tiny model, CoSENT | {batch} | {on * 1e3:.1f} | {off * 1e3:.1f} | {on / off:.2f}x |")


if __name__ == "__main__":
    main()
