"""STS Benchmark (English) from ``<data root>/stsb_en``: ``stsb-en-{train,dev,test}.csv``.

Headerless quoted CSV ``sentence1, sentence2, score`` with scores in [0, 5] (5749 / 1500 / 1379 rows).
"""

from __future__ import annotations

import os

from embforge.data.builtin._pairs import check_choice, dataset_dir
from embforge.data.tables import Dataset, read_table

SPLITS = ("train", "dev", "test")


def load_stsb(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One split as ``sentence1, sentence2, score`` (0–5)."""
    check_choice(split, SPLITS, what="STS-B split")
    folder = dataset_dir("stsb_en", root, expect=f"stsb-en-{split}.csv")
    return read_table(
        folder / f"stsb-en-{split}.csv", columns="0=sentence1,1=sentence2,2=score", header=False
    )
