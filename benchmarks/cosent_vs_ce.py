"""CE vs CoSENT for cross-encoders, Sentence-BERT softmax vs CoSENT for bi-encoders, over seeds.

For every data set and seed, four systems start from the same base model and train with the same budget
(training pairs, epochs, batch size, learning rate, max length):

=================  ===============  ===========================================================================
system             model            loss
=================  ===============  ===========================================================================
``cross-ce``       cross-encoder    binary cross-entropy on the logit (= 2-class softmax CE); STS-B: score / 5
``cross-cosent``   cross-encoder    CoSENT on the logits (λ = 1)
``bi-softmax``     bi-encoder       Sentence-BERT softmax on ``[u; v; |u-v|]``; STS-B: 6 classes (rounded score)
``bi-cosent``      bi-encoder       CoSENT on the cosines (λ = 20)
=================  ===============  ===========================================================================

Metrics on the test split: Spearman between the model's score (cross-encoder logit / cosine) and the labels,
and accuracy with the threshold searched on the dev split (binary data sets only). Tables (rows = system,
columns = data sets + average) show mean ± std over the seeds, like the CoSENT source's tables.

    .venv/bin/python benchmarks/cosent_vs_ce.py --quick                  # two data sets, 64 pairs: minutes
    .venv/bin/python benchmarks/cosent_vs_ce.py --results runs.jsonl     # the four English sets, 3 seeds
    .venv/bin/python benchmarks/cosent_vs_ce.py --datasets ATEC,BQ,LCQMC,PAWSX --model path/to/chinese-bert
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.data.tables import Dataset
    from embforge.encoder import Encoder
    from embforge.losses.base import BaseLoss


class Splits(TypedDict):
    """One data set's splits as the benchmark uses them (subsampled), their full sizes, and whether the labels
    are graded scores (STS) rather than 0/1 classes."""

    graded: bool
    full: dict[str, int]
    train: Dataset
    dev: Dataset
    test: Dataset


ENGLISH = ("stsb", "mrpc", "wikiqa", "snli")
CHINESE = ("ATEC", "BQ", "LCQMC", "PAWSX")
LABELS = {
    "cross-ce": "cross-encoder + CE",
    "cross-cosent": "cross-encoder + CoSENT",
    "bi-softmax": "bi-encoder + Softmax (SBERT)",
    "bi-cosent": "bi-encoder + CoSENT",
}
SYSTEMS = tuple(LABELS)


@dataclass
class BenchConfig:
    """What to run; ``--quick`` shrinks every size so the whole English run takes a few minutes on 2 cores."""

    model: str = "all-MiniLM-L6-v2"
    datasets: list[str] = field(default_factory=lambda: list(ENGLISH))
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    train_size: int | None = 1000
    dev_size: int | None = 500
    test_size: int | None = 1000
    epochs: int = 1
    batch_size: int = 16
    lr: float = 5e-5
    max_seq_length: int = 64
    cn_root: str | None = None
    results: str | None = None
    quick: bool = False

    def __post_init__(self) -> None:
        for name in self.datasets:
            if name not in ENGLISH + CHINESE:
                raise ValueError(f"unknown data set {name!r}; choose from {', '.join(ENGLISH + CHINESE)}")
        for name in self.systems:
            if name not in SYSTEMS:
                raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
        if not self.seeds:
            raise ValueError("give at least one seed")


# Budgets measured for all-MiniLM-L6-v2 on 2 CPU cores (both models train at ~45-60 pairs/s there): the default
# sizes keep 4 data sets x 4 systems x 3 seeds well within an hour (see benchmarks/README.md for the measured
# time); --quick checks the whole pipeline on two data sets in minutes (its numbers are noise: 64 training pairs).
QUICK: dict[str, int | list[str]] = {
    "train_size": 64,
    "dev_size": 64,
    "test_size": 128,
    "datasets": ["stsb", "mrpc"],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BenchConfig()
    from embforge.cli.values import non_negative_int, positive_float, positive_int

    parser.add_argument("--model", default=defaults.model, help="base model for every system")
    parser.add_argument(
        "--datasets",
        default=None,
        help=f"comma-separated: {', '.join(ENGLISH)} (default) and/or the Chinese {', '.join(CHINESE)} "
        "(pass a Chinese --model)",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of the systems")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    for name in ("train_size", "dev_size", "test_size"):
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=non_negative_int,
            default=None,
            help=f"subsample to this many rows, 0 = all (default {getattr(defaults, name)})",
        )
    parser.add_argument("--epochs", type=positive_int, default=None, help=f"default {defaults.epochs}")
    parser.add_argument(
        "--batch-size", type=positive_int, default=None, help=f"default {defaults.batch_size}"
    )
    parser.add_argument("--lr", type=positive_float, default=None, help=f"default {defaults.lr}")
    parser.add_argument(
        "--max-seq-length", type=positive_int, default=None, help=f"default {defaults.max_seq_length}"
    )
    parser.add_argument(
        "--cn-root", default=None, help="senteval_cn folder (default <data root>/senteval_cn)"
    )
    parser.add_argument("--results", default=None, help="append one JSON line per run to this file")
    parser.add_argument("--quick", action="store_true", help=f"small sizes for a few-minute run: {QUICK}")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    values: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.datasets:
        values["datasets"] = [d.strip() for d in args.datasets.split(",") if d.strip()]
    for name in ("train_size", "dev_size", "test_size", "epochs", "batch_size", "lr", "max_seq_length"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name) or None
    return BenchConfig(
        model=args.model,
        systems=[s.strip() for s in args.systems.split(",") if s.strip()],
        seeds=[int(s) for s in args.seeds.split(",") if s.strip()],
        cn_root=args.cn_root,
        results=args.results,
        quick=args.quick,
        **values,
    )


def load_splits(name: str, config: BenchConfig) -> Splits:
    """``{"train", "dev", "test"}`` datasets (subsampled as configured) and whether the labels are graded."""
    import numpy as np

    if name in CHINESE:
        from embforge.data.builtin.senteval_cn import load_senteval_cn

        splits = {s: load_senteval_cn(name, s, root=config.cn_root) for s in ("train", "dev", "test")}
    else:
        from embforge.data.builtin.mrpc import load_mrpc
        from embforge.data.builtin.snli import load_snli
        from embforge.data.builtin.stsb import load_stsb
        from embforge.data.builtin.wikiqa import load_wikiqa

        loader = {"stsb": load_stsb, "mrpc": load_mrpc, "wikiqa": load_wikiqa, "snli": load_snli}[name]
        splits = {s: loader(s) for s in ("train", "dev", "test")}
    sizes = {"train": config.train_size, "dev": config.dev_size, "test": config.test_size}
    used: dict[str, Dataset] = {}
    for split, data in splits.items():
        limit = sizes[split]
        if limit is not None and len(data) > limit:
            rows = np.sort(np.random.default_rng(1234).permutation(len(data))[:limit])
            data = data.subset(rows.tolist())
        used[split] = data
    return {
        "graded": splits["test"].label_column == "score",
        "full": {split: len(data) for split, data in splits.items()},
        "train": used["train"],
        "dev": used["dev"],
        "test": used["test"],
    }


def _as_classes(data: Dataset) -> Dataset:
    """STS-style data with integer ``label`` = rounded score (Sentence-BERT's softmax needs classes)."""
    from embforge.data.tables import Dataset

    columns = {k: v for k, v in data.columns.items() if k != "score"}
    columns["label"] = [round(s) for s in data.columns["score"]]
    return Dataset(data.path, columns, data.lines, None)


def run_one(system: str, splits: Splits, seed: int, config: BenchConfig, workdir: Path) -> dict[str, float]:
    """Train one system with one seed and evaluate it on the test split."""
    import numpy as np
    import torch

    from embforge.evaluate.pairs import best_threshold, score_pairs
    from embforge.evaluate.similarity import correlations
    from embforge.training.config import TrainConfig
    from embforge.training.loop import train
    from embforge.training.tasks import Task

    torch.manual_seed(seed)  # the new heads are initialised from the seed too
    graded = splits["graded"]
    train_data = splits["train"]
    if system.startswith("cross"):
        from embforge.cross_encoder import CrossEncoder
        from embforge.losses.cross import get_cross_loss

        model: Encoder | CrossEncoder = CrossEncoder.load(
            config.model, num_labels=1, new_head=True, max_seq_length=config.max_seq_length
        )
        loss: BaseLoss = (
            get_cross_loss("bce", label_max=5.0 if graded else None)
            if system == "cross-ce"
            else get_cross_loss("cosent", scale=1.0)
        )
    else:
        from embforge.encoder import Encoder
        from embforge.losses import get_loss

        model = Encoder.load(config.model, max_seq_length=config.max_seq_length)
        if system == "bi-softmax":
            if graded:
                train_data = _as_classes(train_data)
            num_labels = int(max(train_data.columns["label"])) + 1
            loss = get_loss("softmax", dim=model.dim, num_labels=max(2, num_labels))
        else:
            loss = get_loss("cosent")
    out = workdir / f"{system}-{seed}"
    train_config = TrainConfig(
        output=str(out),
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        seed=seed,
        save_every=0,
        quiet=True,
        device="cpu" if not torch.cuda.is_available() else "auto",
    )
    started = time.perf_counter()
    summary = train(model, [Task(system, train_data, loss)], train_config)
    train_seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    test = splits["test"]
    scores = score_pairs(model, test)
    gold, dev_gold = test.labels(), splits["dev"].labels()
    if gold is None or dev_gold is None:
        raise ValueError(f"{test.path}: the benchmark needs a 'score' or 'label' column in every split")
    result: dict[str, float] = {
        "spearman": correlations(scores, gold)["spearman"],
        "train_seconds": train_seconds,
        "train_pairs_per_second": summary["pairs_per_second"],
    }
    if not graded:
        threshold, _ = best_threshold(score_pairs(model, splits["dev"]), dev_gold, source="dev")
        result["accuracy"] = 100 * float(np.mean((scores >= threshold) == gold))
    return result


def _cell(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{np.mean(values):.2f} ± {float(np.std(values, ddof=1)):.2f}"


def format_tables(runs: list[dict[str, Any]], config: BenchConfig) -> str:
    """Markdown tables in the source's layout: rows = model + loss, columns = data sets + avg (mean ± std)."""
    import numpy as np

    lines = []
    for metric, title in (
        ("spearman", "Spearman (test)"),
        ("accuracy", "Accuracy (test, threshold from dev)"),
    ):
        names = [d for d in config.datasets if any(metric in r and r["dataset"] == d for r in runs)]
        if not names:
            continue
        lines += [f"### {title}", "", "| system | " + " | ".join(names) + " | avg |"]
        lines.append("|---" * (len(names) + 2) + "|")
        for system in config.systems:
            cells, per_seed_avg = [], []
            for name in names:
                cells.append(
                    _cell([r[metric] for r in runs if r["system"] == system and r["dataset"] == name])
                )
            for seed in config.seeds:
                values = [
                    r[metric]
                    for r in runs
                    if r["system"] == system and r["seed"] == seed and r["dataset"] in names and metric in r
                ]
                if len(values) == len(names):
                    per_seed_avg.append(float(np.mean(values)))
            lines.append(f"| {LABELS[system]} | " + " | ".join(cells) + f" | {_cell(per_seed_avg)} |")
        lines.append("")
    return "\n".join(lines)


def run_benchmark(config: BenchConfig, *, echo: bool = True) -> dict[str, object]:
    """Run every (data set, system, seed); print progress and the tables; return the tables and raw runs."""
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    sizes: dict[str, dict[str, str]] = {}
    results_file = Path(config.results) if config.results else None
    # checkpoints written by train() are thrown away at once: keep them in memory when the OS offers a tmpfs
    scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="embforge-bench-", dir=scratch) as tmp:
        for name in config.datasets:
            splits = load_splits(name, config)
            sizes[name] = {s: f"{len(splits[s])}/{splits['full'][s]}" for s in ("train", "dev", "test")}
            for seed in config.seeds:
                for system in config.systems:
                    record = {"dataset": name, "system": system, "seed": seed}
                    record.update(run_one(system, splits, seed, config, Path(tmp)))
                    runs.append(record)
                    if results_file is not None:
                        with results_file.open("a") as handle:
                            handle.write(json.dumps({**record, "config": asdict(config)}) + "\n")
                    if echo:
                        shown = {k: round(v, 2) for k, v in record.items() if isinstance(v, float)}
                        print(
                            f"[{time.perf_counter() - started:6.0f}s] {name} {system} seed={seed} {shown}",
                            file=sys.stderr,
                            flush=True,
                        )
    tables = format_tables(runs, config)
    subsample = "; ".join(f"{d}: " + ", ".join(f"{s} {v}" for s, v in sz.items()) for d, sz in sizes.items())
    header = (
        f"model {config.model}; seeds {config.seeds}; epochs {config.epochs}; batch {config.batch_size}; "
        f"lr {config.lr}; max length {config.max_seq_length}\n"
        f"rows used/available (subsampled with a fixed seed where smaller): {subsample}\n"
    )
    if echo:
        print(header + "\n" + tables, flush=True)
    return {
        "seconds": time.perf_counter() - started,
        "config": asdict(config),
        "rows": sizes,
        "tables": tables,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train each system on each data set over several seeds from the same base model and budget; "
        "print Spearman and accuracy tables (mean ± std), then one JSON line of the whole result."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    result = run_benchmark(config)
    print(json.dumps(result, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
