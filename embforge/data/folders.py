"""Retrieval folders by their layout: which reader a folder needs, and the splits it offers.

The generic reader (:func:`embforge.data.retrieval.load_beir`) knows no data set; a built-in set kept in its own
layout knows its files (:func:`embforge.data.builtin.scifact.is_scifact_folder`). This module, above both, picks:
SciFact's folder is read by its loader, any other folder as BEIR (``corpus.jsonl``, ``queries.jsonl``,
``qrels/<split>.tsv``).
"""

from __future__ import annotations

import os
from pathlib import Path

from embforge.data.builtin import scifact
from embforge.data.retrieval import RetrievalData, load_beir

EVAL_SPLITS = ("test", "dev", "validation", "val")


def retrieval_splits(folder: str | os.PathLike) -> list[str]:
    """The qrels splits a folder offers: SciFact's ``train, dev, all``, or a BEIR folder's ``qrels/<split>.tsv``."""
    root = Path(folder)
    if scifact.is_scifact_folder(root):
        return list(scifact.SPLITS)
    return sorted(p.stem for p in (root / "qrels").glob("*.tsv")) if (root / "qrels").is_dir() else []


def default_eval_split(folder: str | os.PathLike) -> str:
    """The split to evaluate when none is named: the first of ``test, dev, validation, val`` the folder has,
    else its first split (SciFact here: ``dev``, as its test qrels do not ship)."""
    splits = retrieval_splits(folder)
    for name in EVAL_SPLITS:
        if name in splits:
            return name
    if not splits:
        raise FileNotFoundError(
            f"{folder}: no qrels split found (a BEIR folder has qrels/<split>.tsv; SciFact has "
            f"{scifact.CORPUS_FILE})"
        )
    return splits[0]


def load_retrieval_folder(folder: str | os.PathLike, split: str) -> RetrievalData:
    """A BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) or the SciFact folder."""
    root = Path(folder)
    if scifact.is_scifact_folder(root):
        return scifact.load_scifact(split, root=root)
    return load_beir(root, split=split)
