"""MRPC (Microsoft Research Paraphrase Corpus) from ``<data root>/mrpc``.

``msr_paraphrase_{train,test}.txt``: TSV with a header ``Quality, #1 ID, #2 ID, #1 String, #2 String``;
``Quality`` is 1 for a paraphrase. 4076 train / 1725 test rows. There is no dev file, so ``dev`` is carved from
train deterministically (``md5(pair) % 10 == 0``, about 10 %) and ``train`` is the rest; ``train_all`` keeps all.
"""

from __future__ import annotations

import os

from embforge.data.builtin._pairs import check_choice, dataset_dir, hash_split
from embforge.data.tables import Dataset, read_table

SPLITS = ("train", "dev", "test", "train_all")
_COLUMNS = {"Quality": "label", "#1 String": "sentence1", "#2 String": "sentence2"}


def load_mrpc(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One split as ``sentence1, sentence2, label`` (1 = paraphrase)."""
    check_choice(split, SPLITS, what="MRPC split")
    name = "test" if split == "test" else "train"
    folder = dataset_dir("mrpc", root, expect=f"msr_paraphrase_{name}.txt")
    data = read_table(folder / f"msr_paraphrase_{name}.txt", columns=_COLUMNS, header=True, label_set=[0, 1])
    if split in ("test", "train_all"):
        return data
    train, dev = hash_split(data)
    return train if split == "train" else dev
