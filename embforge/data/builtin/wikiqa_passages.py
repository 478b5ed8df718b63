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

from embforge.data.builtin._pairs import check_choice
from embforge.data.builtin.wikiqa import SPLITS, load_wikiqa
from embforge.data.tables import Dataset
from embforge.evaluate.rerank import group_candidates


def question_passages(data: Dataset) -> Dataset:
    """Group ``sentence1, sentence2, label`` rows by question (the reranking evaluation's grouping, answered
    questions only) into (question, joined candidates) pairs; each pair points at its question's first line."""
    groups, _ = group_candidates(data)
    questions, sentences = data.columns["sentence1"], data.columns["sentence2"]
    columns = {
        "anchor": [questions[rows[0]] for rows in groups.values()],
        "positive": [" ".join(sentences[r].strip() for r in rows) for rows in groups.values()],
    }
    return Dataset(data.path, columns, [data.lines[rows[0]] for rows in groups.values()])


def load_wikiqa_passages(split: str, *, root: str | os.PathLike | None = None) -> Dataset:
    """One WikiQA split (``train``, ``dev``, ``test``) as ``anchor`` question, ``positive`` passage."""
    check_choice(split, SPLITS, what="WikiQA passages split")
    return question_passages(load_wikiqa(split, root=root))
