"""WikiQA questions against whole passages: ``anchor`` a question, ``positive`` the Wikipedia summary paragraph
its answer is in (every candidate sentence of the question, joined in file order — WikiQA's candidates are the
sentences of one article's summary, in order).

Only questions with at least one correct answer are kept (the passage then answers the question). A
question → passage retrieval task from data the project has, built from the train split (or dev/test): 873 /
126 / 243 pairs. Passages run to a few hundred tokens, like SciFact abstracts, where WikiQA's answer-selection
pairs are single sentences.
"""

from __future__ import annotations

import os

from embforge.data.builtin.wikiqa import SPLITS, load_wikiqa
from embforge.data.tables import Dataset


def question_passages(data: Dataset) -> Dataset:
    """Group ``sentence1, sentence2, label`` rows by question into (question, joined candidates) pairs, keeping
    questions with a correct answer; each pair points at its question's first line."""
    sentences: dict[str, list[str]] = {}
    first_line: dict[str, int] = {}
    answered: set[str] = set()
    for question, sentence, label, line in zip(
        data.columns["sentence1"], data.columns["sentence2"], data.columns["label"], data.lines, strict=True
    ):
        sentences.setdefault(question, []).append(sentence.strip())
        first_line.setdefault(question, line)
        if label == 1:
            answered.add(question)
    kept = [q for q in sentences if q in answered]
    columns = {"anchor": kept, "positive": [" ".join(sentences[q]) for q in kept]}
    return Dataset(data.path, columns, [first_line[q] for q in kept])


def load_wikiqa_passages(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One WikiQA split (``train``, ``dev``, ``test``) as ``anchor`` question, ``positive`` passage."""
    if split not in SPLITS:
        raise ValueError(f"WikiQA passages split must be one of {', '.join(SPLITS)}, got {split!r}")
    return question_passages(load_wikiqa(split, root=root))
