"""AllNLI-style triplets from SNLI dev/test: ``anchor`` premise, ``positive`` entailed hypothesis,
``negative`` contradicting hypothesis (the recipe of Sentence-BERT / SimCSE supervised training).

Only SNLI dev and test ship here (the 550k train split is too large for the snapshot), giving about 2.9k
triplets each. Premises with several entailments/contradictions are paired in file order (the first entailment
with the first contradiction, ...), so each hypothesis is used once. ``split="all"`` joins dev and test
(≈5.9k triplets) for training; evaluate STS on other data (STS-B), not on SNLI.
"""

from __future__ import annotations

import os

from embforge.data.builtin._pairs import check_choice, dataset_dir
from embforge.data.builtin.snli import read_senteval_nli
from embforge.data.tables import Dataset

SPLITS = ("dev", "test", "all")


def nli_triplets(data: Dataset) -> Dataset:
    """Turn ``sentence1, sentence2, label`` (0 entailment, 1 neutral, 2 contradiction) into triplets."""
    entail: dict[str, list[tuple[str, int]]] = {}
    contra: dict[str, list[str]] = {}
    order: list[str] = []
    s1, s2, labels = data.columns["sentence1"], data.columns["sentence2"], data.columns["label"]
    for premise, hypothesis, label, line in zip(s1, s2, labels, data.lines):
        premise, hypothesis = premise.strip(), hypothesis.strip()
        if premise not in entail and premise not in contra:
            order.append(premise)
        if label == 0:
            entail.setdefault(premise, []).append((hypothesis, line))
        elif label == 2:
            contra.setdefault(premise, []).append(hypothesis)
    columns: dict[str, list] = {"anchor": [], "positive": [], "negative": []}
    lines = []
    for premise in order:
        for (positive, line), negative in zip(entail.get(premise, []), contra.get(premise, [])):
            columns["anchor"].append(premise)
            columns["positive"].append(positive)
            columns["negative"].append(negative)
            lines.append(line)
    return Dataset(data.path, columns, lines)


def load_snli_triplets(split: str = "all", *, root: str | os.PathLike | None = None) -> Dataset:
    """``anchor, positive, negative`` triplets from SNLI ``dev``, ``test`` or ``all`` (both)."""
    check_choice(split, SPLITS, what="SNLI triplet split")
    folder = dataset_dir("snli_senteval", root, expect="s1.dev")
    parts = [
        nli_triplets(read_senteval_nli(folder, s, binary=False))
        for s in (("dev", "test") if split == "all" else (split,))
    ]
    if len(parts) == 1:
        return parts[0]
    return Dataset(
        str(folder),
        {c: [v for p in parts for v in p.columns[c]] for c in ("anchor", "positive", "negative")},
        [line for p in parts for line in p.lines],
    )
