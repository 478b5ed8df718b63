"""WikiQA answer-sentence selection from ``<data root>/wikiqa``: ``{train,dev,test}.txt``.

Headerless TSV ``question, candidate sentence, label (0/1)`` (20360 / 2733 / 6165 rows). As pairs it is a
binary classification set; grouped by question it is a reranking set (the standard evaluation keeps the
questions with at least one correct answer: 243 in test; see
:func:`embforge.evaluate.rerank.group_candidates`).
"""

from __future__ import annotations

import os

from embforge.data.builtin._pairs import check_choice, dataset_dir
from embforge.data.tables import Dataset, read_table

SPLITS = ("train", "dev", "test")


def load_wikiqa(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One split as ``sentence1`` (question), ``sentence2`` (candidate), ``label`` (1 = correct answer)."""
    check_choice(split, SPLITS, what="WikiQA split")
    folder = dataset_dir("wikiqa", root, expect=f"{split}.txt")
    return read_table(
        folder / f"{split}.txt", columns="0=sentence1,1=sentence2,2=label", header=False, label_set=[0, 1]
    )
