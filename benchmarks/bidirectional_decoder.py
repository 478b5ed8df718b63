"""Issue #52: does ``embforge train --bidirectional`` help a decoder embedder? A from-scratch toy, not an LLM.

No decoder (LLM) weights are available offline here, so the backbone is a small Qwen3-style decoder with RANDOM
weights (``Qwen3Model``: ``--layers`` layers, hidden ``--hidden``, ``--heads`` heads, 2 key/value heads,
intermediate ``--intermediate``; one initialisation, ``--init-seed``, shared by every setting) whose tokenizer is
all-MiniLM-L6-v2's WordPiece tokenizer (a real 30,522-token vocabulary; ``[SEP]`` ends every text, so last-token
pooling reads it). The weights are written as model folders (:meth:`embforge.encoder.Encoder.save`, normalised, 64
tokens) for each pooling (``mean``, ``lasttoken``) and attention mode; the causal folder of each pooling is trained
with the real CLI in both modes:

    embforge train --model FOLDER --train stsb-en-train.csv --loss cosent [--bidirectional] --seed S ...

(CoSENT on STS-B train, ``--epochs`` epochs, batch ``--batch-size``, lr ``--lr``, precision ``--amp``, the same for
every run; a seed gives both modes the same batches), and scored with ``embforge eval sts --model OUT --data
stsb-en-test.csv`` (Spearman x 100, 1,379 pairs, fp32). The four untrained folders are scored too.

Results go to ``OUT/<pooling>-<attention>-<seed>.json`` (a rerun skips what exists); the table is printed at the
end.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 flock /tmp/ef-heavy.lock .venv/bin/python benchmarks/bidirectional_decoder.py \\
        --out runs/bidirectional --seeds 1,2,3 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from cached_scifact import EMBFORGE, run

from embforge.data.paths import data_root

POOLINGS = ("mean", "lasttoken")
ATTENTIONS = ("causal", "bidirectional")


def build_folder(folder: Path, pooling: str, args: argparse.Namespace, *, bidirectional: bool) -> None:
    """A random Qwen3-style decoder with MiniLM's tokenizer, saved as an embforge (sentence-transformers) folder."""
    if (folder / "config_sentence_transformers.json").is_file():
        return
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    from embforge.encoder import Encoder
    from embforge.modeling.decoder import set_bidirectional
    from embforge.modeling.resolve import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("all-MiniLM-L6-v2"))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=2,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(args.init_seed)  # every folder starts from the same weights
    backbone = Qwen3Model(config)
    set_bidirectional(backbone, bidirectional)
    encoder = Encoder(
        backbone, tokenizer, pooling=pooling, normalize=True, max_seq_length=args.max_seq_length
    )
    encoder.save(folder)


def score(model: Path) -> float:
    """STS-B test Spearman x 100 of a model folder, through ``embforge eval sts``."""
    test = str(data_root() / "stsb_en" / "stsb-en-test.csv")
    scores, _ = run([*EMBFORGE, "eval", "sts", "--model", str(model), "--data", test, "--quiet"])
    return float(scores["spearman"])  # already x 100


def train_and_score(
    base: Path, pooling: str, attention: str, seed: int, out: Path, args: argparse.Namespace
) -> dict:
    """``embforge train`` the causal folder ``base`` (``--bidirectional`` for that attention) and score it."""
    model = out / f"model-{pooling}-{attention}-{seed}"
    train = [*EMBFORGE, "train", "--model", str(base), "--loss", "cosent"]
    train += ["--train", str(data_root() / "stsb_en" / "stsb-en-train.csv")]
    train += ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr)]
    train += ["--amp", args.amp, "--seed", str(seed), "--save-every", "0", "--quiet", "--overwrite"]
    train += ["--output", str(model)]
    if attention == "bidirectional":
        train.append("--bidirectional")
    report, train_s = run(train)
    return {"steps": report.get("steps"), "train_s": round(train_s, 1), "spearman": score(model)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/bidirectional")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="from-scratch weights need more than 5e-5")
    parser.add_argument(
        "--amp", default="auto", help="training precision; auto: bf16 autocast on CPUs with native bf16"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--init-seed", type=int, default=0, help="seed of the random initial weights")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    table: dict[tuple[str, str], dict] = {}
    for pooling in POOLINGS:
        for attention in ATTENTIONS:
            base = out / f"untrained-{pooling}-{attention}"
            build_folder(base, pooling, args, bidirectional=attention == "bidirectional")
            result_file = out / f"untrained-{pooling}-{attention}.json"
            if not result_file.exists():
                result_file.write_text(json.dumps({"spearman": score(base)}) + "\n")
            table[pooling, attention] = {"untrained": json.loads(result_file.read_text())["spearman"]}
    for seed in (int(s) for s in args.seeds.split(",")):
        for pooling in POOLINGS:
            for attention in ATTENTIONS:
                result_file = out / f"{pooling}-{attention}-{seed}.json"
                if not result_file.exists():
                    base = out / f"untrained-{pooling}-causal"  # --bidirectional sets the switch
                    result = {"pooling": pooling, "attention": attention, "seed": seed}
                    result |= train_and_score(base, pooling, attention, seed, out, args)
                    result_file.write_text(json.dumps(result) + "\n")
                    print(result_file.read_text().strip(), flush=True)
                table[pooling, attention].setdefault("runs", []).append(json.loads(result_file.read_text()))
    print(f"\ndone in {time.perf_counter() - start:.0f} s (skipped results not counted)")
    print("\n| setting | untrained | STS-B test Spearman, mean ± std | per seed |")
    print("|---|---:|---|---|")
    for (pooling, attention), row in table.items():
        values = [r["spearman"] for r in row.get("runs", [])]
        if not values:
            continue
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        per_seed = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"| {attention}, {pooling} pooling | {row['untrained']:.2f} | "
            f"{statistics.mean(values):.2f} ± {spread:.2f} | {per_seed} |"
        )
    print()
    for (
        pooling
    ) in POOLINGS:  # the same seed gives both modes the same weights and batches: paired differences
        causal, both = (table[pooling, a].get("runs", []) for a in ATTENTIONS)
        gains = [b["spearman"] - c["spearman"] for c, b in zip(causal, both)]
        if gains:
            each = ", ".join(f"{g:+.2f}" for g in gains)
            print(
                f"bidirectional - causal, {pooling} pooling, same seed: {statistics.mean(gains):+.2f} ({each})"
            )


if __name__ == "__main__":
    sys.exit(main())
