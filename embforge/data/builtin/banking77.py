"""BANKING77 (77 banking intents) from ``<data root>/banking77`` as ``text, label`` data sets.

``train.csv`` (10,003 rows) and ``test.csv`` (3,080) have a header ``text,category``; ``categories.json`` lists
the 77 intent names, whose order fixes the integer labels (so train and test agree). For model selection a
``dev`` split is carved from train deterministically (``md5(text) % 10 == 0``, about 10 %); ``train`` is the
rest and ``train_all`` keeps every row.
"""

from __future__ import annotations

import hashlib
import json
import os

from embforge.data.builtin._pairs import check_choice, dataset_dir
from embforge.data.tables import DataError, Dataset, read_table

SPLITS = ("train", "dev", "test", "train_all")


def banking77_labels(root: str | os.PathLike | None = None) -> list[str]:
    """The 77 intent names in ``categories.json`` order."""
    folder = dataset_dir("banking77", root, expect="categories.json")
    names = json.loads((folder / "categories.json").read_text(encoding="utf-8"))
    if not isinstance(names, list) or len(set(names)) != len(names):
        raise DataError(f"{folder / 'categories.json'}:1: expected a JSON list of distinct category names")
    return [str(n) for n in names]


def load_banking77(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One split as ``text, label`` (label = index into :func:`banking77_labels`)."""
    check_choice(split, SPLITS, what="Banking77 split")
    name = "test" if split == "test" else "train"
    folder = dataset_dir("banking77", root, expect=f"{name}.csv")
    data = read_table(
        folder / f"{name}.csv",
        columns={"text": "text", "category": "label"},
        header=True,
        label_names=banking77_labels(root),
    )
    if split in ("test", "train_all"):
        return data
    dev = {
        i
        for i, t in enumerate(data.columns["text"])
        if int(hashlib.md5(t.encode()).hexdigest(), 16) % 10 == 0
    }
    return data.subset(sorted(dev) if split == "dev" else [i for i in range(len(data)) if i not in dev])
