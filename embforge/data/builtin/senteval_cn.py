"""The Chinese pair sets of the CoSENT paper (``senteval_cn``): ATEC, BQ, LCQMC, PAWSX (and STS-B).

Files ``<data root>/senteval_cn/<TASK>/<TASK>.<split>.data``: headerless TSV ``text1, text2, label`` (0/1; STS-B
0–5). Only ``valid`` and ``test`` ship for ATEC/BQ/LCQMC/PAWSX (their train splits are over the snapshot limit),
so the protocol here is **train on valid, test on test**: ``train`` is valid minus a deterministic ~10 % ``dev``
(``md5(pair) % 10 == 0``) kept for the accuracy threshold. No Chinese model ships offline: pass your own.
"""

from __future__ import annotations

import os

from embforge.data.builtin._pairs import check_choice, dataset_dir, hash_split
from embforge.data.tables import Dataset, read_table

TASKS = ("ATEC", "BQ", "LCQMC", "PAWSX", "STS-B")
SPLITS = ("train", "dev", "test", "valid")


def load_senteval_cn(task: str, split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One split of one task as ``sentence1, sentence2, label`` (``score`` for STS-B).

    Args:
        task: ATEC, BQ, LCQMC, PAWSX or STS-B.
        split: ``train``/``dev`` (carved from valid; STS-B has a real train), ``valid`` (all of it) or ``test``.
        root: The ``senteval_cn`` folder (default ``<data root>/senteval_cn``).
    """
    check_choice(task, TASKS, what="senteval_cn task")
    check_choice(split, SPLITS, what="senteval_cn split")
    folder = dataset_dir("senteval_cn", root, expect=f"{task}/{task}.test.data") / task
    graded = task == "STS-B"
    if graded and split in ("train", "dev"):
        split = {"train": "train", "dev": "valid"}[split]
    source = "test" if split == "test" else ("train" if split == "train" and graded else "valid")
    data = read_table(
        folder / f"{task}.{source}.data",
        columns=f"0=sentence1,1=sentence2,2={'score' if graded else 'label'}",
        header=False,
        label_set=None if graded else [0, 1],
    )
    if graded or split in ("test", "valid"):
        return data
    train, dev = hash_split(data)
    return train if split == "train" else dev
