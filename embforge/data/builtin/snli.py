"""SNLI 1.0 dev/test in the SentEval layout, from ``<data root>/snli_senteval``, as entailment-vs-not pairs.

Three aligned files per split: ``s1.<split>`` (premises), ``s2.<split>`` (hypotheses) and ``labels.<split>``
(``entailment``, ``neutral``, ``contradiction``). Only dev (9842) and test (9824) ship (the 550k train split is
not available), so for training ``train`` is dev minus a deterministic ~10 % ``dev`` carved from it
(``md5(pair) % 10 == 0``); ``test`` is the SNLI test split.
"""

from __future__ import annotations

import os
from pathlib import Path

from embforge.data.builtin._pairs import check_choice, dataset_dir, hash_split
from embforge.data.tables import DataError, Dataset

SPLITS = ("train", "dev", "test", "dev_all")
NLI_LABELS = ("entailment", "neutral", "contradiction")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def read_senteval_nli(folder: Path, split: str, *, binary: bool = True) -> Dataset:
    """Read ``s1/s2/labels.<split>`` into ``sentence1, sentence2, label``; errors name file and line.

    ``binary``: label 1 for entailment, 0 for neutral/contradiction; else 0/1/2 in :data:`NLI_LABELS` order.
    """
    files = [folder / f"{name}.{split}" for name in ("s1", "s2", "labels")]
    s1, s2, raw = (_lines(f) for f in files)
    if not len(s1) == len(s2) == len(raw):
        raise DataError(
            f"{files[0]}:1: the aligned files have {len(s1)}, {len(s2)} and {len(raw)} lines "
            f"({files[0].name}, {files[1].name}, {files[2].name}); they must have one line per pair"
        )
    labels = []
    for i, (a, b, label) in enumerate(zip(s1, s2, raw)):
        for path, text in ((files[0], a), (files[1], b)):
            if not text.strip():
                raise DataError(f"{path}:{i + 1}: empty sentence")
        if label.strip() not in NLI_LABELS:
            raise DataError(f"{files[2]}:{i + 1}: label {label!r} is not one of {', '.join(NLI_LABELS)}")
        index = NLI_LABELS.index(label.strip())
        labels.append(int(index == 0) if binary else index)
    return Dataset(
        str(files[0]),
        {"sentence1": s1, "sentence2": s2, "label": labels},
        list(range(1, len(s1) + 1)),
        ["not_entailment", "entailment"] if binary else list(NLI_LABELS),
    )


def load_snli(split: str, *, root: str | os.PathLike | None = None, binary: bool = True) -> Dataset:
    """One split as ``sentence1`` (premise), ``sentence2`` (hypothesis), ``label`` (1 = entailment)."""
    check_choice(split, SPLITS, what="SNLI split")
    name = "test" if split == "test" else "dev"
    folder = dataset_dir("snli_senteval", root, expect=f"s1.{name}")
    data = read_senteval_nli(folder, name, binary=binary)
    if split in ("test", "dev_all"):
        return data
    train, dev = hash_split(data)
    return train if split == "train" else dev
