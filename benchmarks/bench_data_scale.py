"""Training on 10k to 10M pairs: peak memory, seconds to the first optimiser step and steady pairs/s per data mode.

Synthetic anchor/positive TSV files are generated from the shared data's sentence pairs (STS-B, SNLI) with
perturbations (a word dropped, two words swapped, a row number appended, so no two rows are equal) into
``runs/data_scale/`` (ignored by git). Each measurement is a fresh process training all-MiniLM-L6-v2 with InfoNCE,
batch 32, for 1 + ``--steps`` optimiser steps:

* ``stream``: the file is read a window (``--window`` rows) at a time;
* ``mmap``: the first run converts the file to a memory-mapped Arrow cache (its rows/s reported); the second
  run reuses the cache;
* ``memory``: the whole file is read into Python lists (sizes up to ``--memory-max``).

``--model tiny`` trains a 2-layer random BERT with MiniLM's tokenizer instead: the steps are cheap, so steady
pairs/s shows the data path (reading, tokenising, planning) rather than the encoder; ``--data-only`` measures that
path alone (no model step). Reported per run: peak RSS of the process (``wait4``), seconds from process start to the end of the first
optimiser step, and pairs/s over the steps after it, with tokens/s beside it: the appended row numbers are longer in
larger files (35.8 tokens per pair at 10k rows, 38.8 at 10M), so the step's work per pair grows a little with the
file and tokens/s is the size-free figure. Usage::

    python benchmarks/bench_data_scale.py --sizes 10000,1000000,10000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from _common import parent_or_child, quiet_config, run_child

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "runs" / "data_scale"
DATA = ROOT.parent / "shared" / "data"


# ------------------------------------------------------------------------------------------- the pair files
def base_pairs() -> list[tuple[str, str]]:
    """Sentence pairs from the shared data: STS-B train/dev (score >= 3) and SNLI dev/test entailments."""
    import csv

    pairs = []
    for split in ("train", "dev"):
        with open(DATA / "stsb_en" / f"stsb-en-{split}.csv", encoding="utf-8") as handle:
            pairs += [(a, b) for a, b, s in csv.reader(handle) if float(s) >= 3.0]
    snli = DATA / "snli_senteval"
    for split in ("dev", "test"):
        s1 = (snli / f"s1.{split}").read_text(encoding="utf-8").splitlines()
        s2 = (snli / f"s2.{split}").read_text(encoding="utf-8").splitlines()
        labels = (snli / f"labels.{split}").read_text(encoding="utf-8").splitlines()
        pairs += [(a, b) for a, b, y in zip(s1, s2, labels) if y.strip() == "entailment"]
    return [
        (a.replace("\t", " ").strip(), b.replace("\t", " ").strip())
        for a, b in pairs
        if a.strip() and b.strip()
    ]


def perturb(text: str, rnd: random.Random, number: int) -> str:
    words = text.split()
    if len(words) > 3:
        del words[rnd.randrange(len(words))]
        i = rnd.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words) + f" ({number})"


def generate(rows: int, path: Path) -> float:
    """Write ``rows`` perturbed pairs to ``path`` (once); returns the seconds it took (0 if it existed)."""
    if path.exists():
        return 0.0
    start = time.perf_counter()
    pairs = base_pairs()
    rnd = random.Random(rows)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("anchor\tpositive\n")
        for i in range(rows):
            a, b = pairs[rnd.randrange(len(pairs))]
            handle.write(f"{perturb(a, rnd, i)}\t{perturb(b, rnd, i)}\n")
    tmp.rename(path)
    return time.perf_counter() - start


def model_folder(model: str) -> str:
    """The ``--model`` to load: a folder or alias, or ``tiny`` (built once, :func:`tiny_model`)."""
    return tiny_model() if model == "tiny" else model


def tokens_per_pair(path: Path, tokenizer: Any, samples: int = 3000) -> float:
    """Mean tokens of a row's two texts, over ``samples`` rows read at random offsets of ``path``."""
    size = path.stat().st_size
    rnd = random.Random(0)
    texts: list[str] = []
    with open(path, "rb") as handle:
        for _ in range(samples):
            handle.seek(rnd.randrange(size))
            handle.readline()  # the rest of a row cut by the seek
            line = handle.readline().decode("utf-8").rstrip("\n")
            texts += line.split("\t") if line else []
    return 2 * sum(len(ids) for ids in tokenizer(texts)["input_ids"]) / max(len(texts), 1)


def tiny_model() -> str:
    """A 2-layer, 64-wide random BERT with MiniLM's tokenizer: the steps are cheap, so the data path shows."""
    folder = OUT / "tiny_bert"
    if not (folder / "modules.json").exists():
        import torch
        from transformers import BertModel

        from embforge.encoder import Encoder

        sys.path.insert(0, str(ROOT))
        from tests.conftest import tiny_bert_config  # the unit tests' tiny BERT, here twice as wide

        tokenizer = Encoder.load("all-MiniLM-L6-v2").tokenizer
        torch.manual_seed(0)
        wide = {"hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 512}
        config = tiny_bert_config(len(tokenizer), **wide)
        Encoder(BertModel(config), tokenizer, pooling="mean", normalize=False, max_seq_length=128).save(
            folder
        )
    return str(folder)


# -------------------------------------------------------------------------------------------- one measurement
def child(args: argparse.Namespace) -> None:
    """One training run (in its own process); prints a JSON line of its timings."""
    started = float(os.environ["BENCH_STARTED"])
    import torch

    from embforge.data.sources import SourceOptions, open_source, row_count
    from embforge.encoder import Encoder
    from embforge.losses import get_loss
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    torch.set_num_threads(args.threads)
    opened = time.time()
    options = SourceOptions(mode=args.mode, window=args.window, cache_dir=str(OUT / "arrow_cache"))
    source = open_source(args.file, options)
    open_seconds = time.time() - opened
    model = Encoder.load(model_folder(args.model))
    window = args.window if args.mode != "memory" else 0
    config = quiet_config(
        OUT / f"model_{args.mode}", max_steps=1 + args.steps, batch_size=32, shuffle_window=window, seed=0
    )
    times: dict[int, float] = {}
    if args.data_only:  # the input path alone: plan, read and tokenise each batch, no model step
        from embforge.training.feed import Feed
        from embforge.training.state import Progress

        feed = Feed.build(model, [Task("pairs", source, get_loss("infonce"))], config)
        progress = Progress()
        for step in range(1, 2 + args.steps):
            task, batch = feed.take(progress, [1.0])
            task.inputs(batch.rows)
            times[step] = time.time()
    else:
        task = Task("pairs", source, get_loss("infonce"))
        train(model, [task], config, on_step=lambda s: times.setdefault(s, time.time()))
    print(
        json.dumps(
            {
                "first_step_s": times[1] - started,
                "open_s": open_seconds,
                "source_rows": row_count(source),
                "pairs_per_s": 32 * args.steps / (times[1 + args.steps] - times[1]),
            }
        )
    )


def measure(file: Path, mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", "--mode", mode, "--file", str(file)]
    command += ["--steps", str(args.steps), "--window", str(args.window), "--threads", str(args.threads)]
    command += ["--model", args.model] + (["--data-only"] if args.data_only else [])
    env = {**os.environ, "BENCH_STARTED": repr(time.time()), "TOKENIZERS_PARALLELISM": "false"}
    return run_child(command, f"{mode} on {file.name}", env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--modes", default="stream,mmap,memory")
    parser.add_argument("--memory-max", type=int, default=1_000_000, help="largest size read in memory")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--model", default="all-MiniLM-L6-v2", help="a model folder/alias, or tiny (random BERT)"
    )
    parser.add_argument(
        "--data-only", action="store_true", help="plan, read and tokenise batches; no model step"
    )
    args = parent_or_child(parser, child, "mode", "file")
    if args is None:
        return
    OUT.mkdir(parents=True, exist_ok=True)
    from embforge.encoder import Encoder

    tokenizer = Encoder.load(model_folder(args.model)).tokenizer  # for the files' tokens per pair
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        file = OUT / f"pairs_{size}.tsv"
        made = generate(size, file)
        print(
            f"{size:>10,} rows: {file.stat().st_size / 2**20:,.0f} MB file (generated in {made:.0f} s)",
            flush=True,
        )
        tokens = tokens_per_pair(file, tokenizer)
        for mode in args.modes.split(","):
            if mode == "memory" and size > args.memory_max:
                continue
            runs = ["mmap (convert)", "mmap (cached)"] if mode == "mmap" else [mode]
            for label in runs:
                result = {"rows": size, "mode": label, **measure(file, mode, args)}
                result["tokens_per_s"] = result["pairs_per_s"] * tokens
                if label == "mmap (convert)":
                    result["convert_rows_per_s"] = size / result["open_s"]
                results.append(result)
                print(json.dumps(result), flush=True)
    what = "batches (plan, read, tokenise; no model step)" if args.data_only else "optimiser steps"
    print(f"\nmodel {args.model}, {args.steps} {what} after the first, window {args.window:,} rows")
    print(
        f"{'rows':>10} {'mode':<15} {'peak RSS MB':>11} {'first step s':>12} {'pairs/s':>8} {'tokens/s':>8}  conversion"
    )
    small = {r["mode"]: r for r in results if r["rows"] == min(x["rows"] for x in results)}
    for r in results:
        ratio = r["peak_rss_mb"] / small[r["mode"]]["peak_rss_mb"] if r["mode"] in small else float("nan")
        convert = f"{r['convert_rows_per_s']:,.0f} rows/s" if "convert_rows_per_s" in r else ""
        print(
            f"{r['rows']:>10,} {r['mode']:<15} {r['peak_rss_mb']:>8,.0f} ({ratio:.2f}x) {r['first_step_s']:>9.1f} "
            f"{r['pairs_per_s']:>8.1f} {r['tokens_per_s']:>8,.0f}  {convert}"
        )
    (OUT / f"results_{Path(args.model).name}{'_data' if args.data_only else ''}.json").write_text(
        json.dumps(results, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
