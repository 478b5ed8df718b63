"""Candidate lists for listwise distillation (embforge.distill.lists) and `embforge score --lists`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.data.tables import Dataset, read_table
from embforge.distill.lists import candidate_lists
from embforge.encoder import Encoder
from embforge.losses import get_loss
from tests.conftest import WORDS

# q1: 5 candidates (one repeated), q2: 1, q3: 2 — as WikiQA's (question, sentence, label) rows
ROWS = [
    ("q1", "a1"), ("q1", "a2"), ("q2", "b1"), ("q1", "a3"), ("q1", "a2"),
    ("q3", "c1"), ("q1", "a4"), ("q3", "c2"), ("q1", "a5"),
]  # fmt: skip


def _pairs() -> Dataset:
    columns = {"sentence1": [q for q, _ in ROWS], "sentence2": [c for _, c in ROWS], "label": [0] * len(ROWS)}
    return Dataset("p", columns, list(range(1, len(ROWS) + 1)))


def _candidates(lists: Dataset) -> list[list[str]]:
    return [list(row) for row in zip(*(lists.columns[c] for c in lists.text_columns[1:]))]


def test_lists_split_long_queries_and_top_up_short_ones_from_other_queries() -> None:
    lists = candidate_lists(_pairs(), size=3, seed=1)
    assert lists.text_columns == ["anchor", "positive", "negative_1", "negative_2"]
    assert lists.label_column is None  # the labels are dropped: the teacher's scores replace them
    assert lists.columns["anchor"] == ["q1", "q1", "q2", "q3"]
    rows = _candidates(lists)
    assert rows[0] == ["a1", "a2", "a3"]  # file order, the repeated a2 once
    assert rows[1][:2] == ["a4", "a5"] and rows[1][2] in {"b1", "c1", "c2"}
    assert rows[2][0] == "b1" and not {"b1"} & set(rows[2][1:])  # topped up from q1 / q3 only
    assert len(set(rows[2][1:])) == 2
    assert rows[3][:2] == ["c1", "c2"] and rows[3][2] not in {"c1", "c2"}
    again = candidate_lists(_pairs(), size=3, seed=1)
    assert _candidates(again) == rows  # the top-up is seeded
    assert len(lists) == 4 and lists.lines == [1, 2, 3, 4]


def test_lists_errors() -> None:
    with pytest.raises(ValueError, match="at least 2 candidates"):
        candidate_lists(_pairs(), size=1)
    one = Dataset("one", {"sentence1": ["q", "q"], "sentence2": ["a", "b"]}, [1, 2])
    with pytest.raises(ValueError, match="one query only"):
        candidate_lists(one, size=2)
    texts = Dataset("t", {"text": ["a", "b"], "label": [0, 1]}, [1, 2])
    with pytest.raises(ValueError, match="a query and a candidate column"):
        candidate_lists(texts, size=2)


def test_score_lists_cli_writes_teacher_scored_lists_kl_distill_trains_on(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A headerless (question, candidate, label) TSV -> lists of 3 scored by a bi-encoder teacher (cosines);
    the file reads back as kl_distill's (n, 3) labels."""
    from embforge.cli import main

    words = dict(
        zip(sorted({t for row in ROWS for t in row}), WORDS[2:])
    )  # each id -> a word of the vocabulary
    source = tmp_path / "train.txt"
    source.write_text("".join(f"the {words[q]}\ta {words[c]}\t1\n" for q, c in ROWS))
    out = tmp_path / "lists.jsonl"
    argv = ["score", "--teacher", str(tiny_model_dir), "--data", str(source), "--no-header"]
    argv += ["--columns", "0=sentence1,1=sentence2", "--lists", "3", "--output", str(out), "--quiet"]
    assert main(argv) == 0
    first = json.loads(out.read_text().splitlines()[0])
    texts = [f"the {words['q1']}", *(f"a {words[c]}" for c in ("a1", "a2", "a3"))]
    assert [first[c] for c in ("anchor", "positive", "negative_1", "negative_2")] == texts
    teacher = Encoder.load(tiny_model_dir)
    emb = teacher.encode(texts, normalize=True)
    assert first["score"] == pytest.approx((emb[1:] @ emb[0]).tolist(), abs=1e-5)
    scored = read_table(out)
    labels = scored.labels()
    assert labels is not None and labels.shape == (4, 3)
    loss = get_loss("kl_distill", similarity="cosine", temperature=0.05)
    embeddings = [teacher.encode(scored.columns[c], normalize=True) for c in scored.text_columns]
    value = loss([torch.from_numpy(np.asarray(e)) for e in embeddings], torch.from_numpy(labels))
    assert float(value) == pytest.approx(0.0, abs=1e-6)  # the teacher agrees with itself
