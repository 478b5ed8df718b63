"""Cross-encoder throughput: embforge vs sentence-transformers' CrossEncoder, in one process, same everything.

Both sides start a cross-encoder from all-MiniLM-L6-v2 (new one-logit head, same seed), fine-tune it on the same
MRPC training pairs with binary cross-entropy, the same batch size, epochs, learning rate, warm-up, weight decay,
clipping and max length, in full precision (or both in bf16 autocast with ``--amp bf16``); then both score the same MRPC test pairs with the same batch size.
Training and prediction alternate between the two libraries round by round (so both see the same machine load)
and the best round of each is kept. Prints pairs/s and the embforge/peer ratio, plus test accuracy/AP of each
trained model as a sanity check (same protocol: threshold from a dev split).

    .venv/bin/python benchmarks/bench_cross_encoder.py
    .venv/bin/python benchmarks/bench_cross_encoder.py --train-pairs 1024 --predict-pairs 1725 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import embforge_train_config, peer_training_args

from embforge.cross_encoder import CrossEncoder
from embforge.data.builtin.mrpc import load_mrpc
from embforge.evaluate.pairs import best_threshold, classification_metrics
from embforge.losses.cross import get_cross_loss
from embforge.modeling.precision import inference_autocast
from embforge.modeling.resolve import resolve_model_path
from embforge.training.loop import train
from embforge.training.tasks import Task


def quality(predict, test, dev) -> dict[str, float]:
    pairs = lambda d: list(zip(d.columns["sentence1"], d.columns["sentence2"]))  # noqa: E731
    threshold, _ = best_threshold(np.asarray(predict(pairs(dev))), dev.labels())
    scores = np.asarray(predict(pairs(test)))
    m = classification_metrics(scores, test.labels(), threshold)
    return {"accuracy": m["accuracy"], "ap": m["ap"]}


def train_peer(train_data, args, out):
    from datasets import Dataset as HFDataset
    from sentence_transformers import CrossEncoder as STCrossEncoder
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    torch.manual_seed(args.seed)
    model = STCrossEncoder(
        str(resolve_model_path(args.model)), num_labels=1, max_length=args.max_length, device=args.device
    )
    dataset = HFDataset.from_dict(
        {
            "sentence1": train_data.columns["sentence1"],
            "sentence2": train_data.columns["sentence2"],
            "label": [float(x) for x in train_data.columns["label"]],
        }
    )
    targs = peer_training_args(CrossEncoderTrainingArguments, args, out)
    trainer = CrossEncoderTrainer(
        model=model, args=targs, train_dataset=dataset, loss=BinaryCrossEntropyLoss(model)
    )
    start = time.perf_counter()
    trainer.train()
    return model, time.perf_counter() - start


def train_embforge(train_data, args, out):
    torch.manual_seed(args.seed)
    model = CrossEncoder.load(
        args.model, num_labels=1, new_head=True, max_seq_length=args.max_length, device=args.device
    )
    config = embforge_train_config(args, out, chunk_tokens=args.chunk_tokens)
    start = time.perf_counter()
    train(model, [Task("mrpc", train_data, get_cross_loss("bce"))], config)
    return model, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--train-pairs", type=int, default=512)
    parser.add_argument("--predict-pairs", type=int, default=1725, help="MRPC test pairs to score (max 1725)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--predict-batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--chunk-tokens", type=int, default=4096, help="embforge: padded tokens per forward chunk in training"
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best of each is kept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both libraries)")
    parser.add_argument("--amp", default="no", choices=("no", "bf16"), help="precision of both libraries")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    train_data = load_mrpc("train").subset(range(args.train_pairs))
    dev = load_mrpc("dev")
    test = load_mrpc("test").subset(range(min(args.predict_pairs, 1725)))
    pairs = list(zip(test.columns["sentence1"], test.columns["sentence2"]))
    train_s = {"embforge": [], "sentence-transformers": []}
    predict_s = {"embforge": [], "sentence-transformers": []}
    models = {}
    chunked_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = (
                ["sentence-transformers", "embforge"] if r % 2 == 0 else ["embforge", "sentence-transformers"]
            )
            for name in order:
                fn = train_embforge if name == "embforge" else train_peer
                model, seconds = fn(train_data, args, Path(tmp) / f"{name}-{r}")
                train_s[name].append(seconds)
                models[name] = model
                print(f"round {r} {name}: train {len(train_data) / seconds:.1f} pairs/s", flush=True)
            for name in order:
                model = models[name]
                start = time.perf_counter()
                with inference_autocast(args.amp):
                    if name == "embforge":
                        model.predict(pairs, batch_size=args.predict_batch_size)
                    else:
                        model.predict(pairs, batch_size=args.predict_batch_size, show_progress_bar=False)
                predict_s[name].append(time.perf_counter() - start)
                print(f"round {r} {name}: predict {len(pairs) / predict_s[name][-1]:.1f} pairs/s", flush=True)
            # embforge with 512-token chunks instead of fixed batches
            start = time.perf_counter()
            with inference_autocast(args.amp):
                models["embforge"].predict(pairs, max_tokens=512)
            chunked_s.append(time.perf_counter() - start)
            print(
                f"round {r} embforge 512-token chunks: predict {len(pairs) / chunked_s[-1]:.1f} pairs/s",
                flush=True,
            )
    quality_of = {
        "embforge": quality(lambda p: models["embforge"].predict(p), test, dev),
        "sentence-transformers": quality(lambda p: models["sentence-transformers"].predict(p), test, dev),
    }
    print(
        f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, device {args.device}; model {args.model}; MRPC train {len(train_data)} pairs x {args.epochs} epoch, "
        f"batch {args.batch_size}, max length {args.max_length}, amp {args.amp}; predict {len(pairs)} pairs, "
        f"batch {args.predict_batch_size}; best of {args.rounds} alternating rounds\n"
    )
    print("| | embforge | sentence-transformers | ratio |")
    print("|---|---|---|---|")
    for label, times, n in (
        ("train pairs/s", train_s, len(train_data)),
        ("predict pairs/s", predict_s, len(pairs)),
    ):
        ours = (
            n * args.epochs / min(times["embforge"])
            if label.startswith("train")
            else n / min(times["embforge"])
        )
        peer = (
            n * args.epochs / min(times["sentence-transformers"])
            if label.startswith("train")
            else n / min(times["sentence-transformers"])
        )
        print(f"| {label} | {ours:.1f} | {peer:.1f} | {ours / peer:.2f}x |")
    chunked = len(pairs) / min(chunked_s)
    peer = len(pairs) / min(predict_s["sentence-transformers"])
    print(
        f"| predict pairs/s, embforge in 512-token chunks | {chunked:.1f} | {peer:.1f} | "
        f"{chunked / peer:.2f}x |"
    )
    for metric in ("accuracy", "ap"):
        print(
            f"| test {metric} (MRPC, after training) | {quality_of['embforge'][metric]:.2f} | "
            f"{quality_of['sentence-transformers'][metric]:.2f} | |"
        )


if __name__ == "__main__":
    main()
