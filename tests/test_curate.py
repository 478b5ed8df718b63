"""Data curation (embforge.curate, `embforge curate`, embforge.data.dedup): a hand-made file with planted
duplicates, leaks and inconsistent pairs -> the report names exactly those rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from embforge.curate import CurateConfig, curate
from embforge.data.dedup import jaccard, near_duplicate_pairs, normalise, shingles
from embforge.data.tables import read_table

ROWS = [
    ("a man plays the guitar", "a man is playing guitar"),  # line 1 (line 5 is the river row)
    ("A man plays the GUITAR!", "a man is  playing guitar"),  # line 2: exact duplicate of line 1
    ("the stock market rises", "stocks go up today"),  # line 3
    ("a woman eats food", "the woman is eating"),  # line 4: leaks into the eval file
    ("a cat runs in the green park near the old river", "a dog runs in the green park near the old river"),
    # line 6: near duplicate of line 5 (shingle Jaccard 0.93)
    (
        "a cat runs in the green park near the old river",
        "a dog runs in the green park near the old river bank",
    ),
    ("oil price falls sharply", "the price of oil drops"),  # line 7
    ("a child reads a book", "the sky is blue"),  # line 8: inconsistent pair
]


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in ROWS))
    return path


@pytest.fixture
def eval_file(tmp_path: Path) -> Path:
    path = tmp_path / "eval.csv"
    path.write_text(
        "sentence1,sentence2,score\nThe woman is eating.,a man cooks,1.0\nbirds fly,planes fly,2.0\n"
    )
    return path


def test_dedup_helpers() -> None:
    assert normalise("  Héllo,   WORLD! ") == "hello world"
    a, b = shingles(ROWS[4][0]), shingles(ROWS[5][0])
    assert jaccard(a, b) == pytest.approx(len(a & b) / len(a | b))
    texts = [" || ".join(r) for r in ROWS]
    found = near_duplicate_pairs(texts, threshold=0.9)
    assert [(i, j) for i, j, _ in found] == [(0, 1), (4, 5)]  # each confirmed by the exact Jaccard
    brute = [
        (i, j)
        for i in range(8)
        for j in range(i + 1, 8)
        if jaccard(shingles(texts[i]), shingles(texts[j])) >= 0.9
    ]
    assert brute == [(i, j) for i, j, _ in found]


def test_report_names_the_planted_rows(train_file: Path, eval_file: Path) -> None:
    report = curate(read_table(train_file), CurateConfig(eval_files=[str(eval_file)]))
    summary = report.summary()
    assert summary["rows_in"] == 8 and summary["rows_out"] == 5
    assert summary["removed"] == {"exact": 1, "leakage": 1, "near": 1}
    by_line = {r["line"]: r for r in report.removed}
    assert by_line[2]["step"] == "exact" and by_line[2]["duplicate_of"] == 1
    assert by_line[4]["step"] == "leakage" and by_line[4]["found_in"] == f"{eval_file}:2"
    assert by_line[6]["step"] == "near" and by_line[6]["duplicate_of"] == 5 and by_line[6]["jaccard"] >= 0.9
    assert report.kept == [0, 2, 4, 6, 7]


class TableModel:
    """A bi-encoder stand-in: fixed vectors per text (topic 0: people, 1: markets, 2: animals, 3: sky)."""

    TOPICS: ClassVar[dict[str, int]] = {
        "man": 0,
        "woman": 0,
        "child": 0,
        "book": 0,
        "stock": 1,
        "oil": 1,
        "price": 1,
        "cat": 2,
        "dog": 2,
        "sky": 3,
    }

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        out = np.zeros((len(texts), 4), dtype=np.float32)
        for i, text in enumerate(texts):
            for word, topic in self.TOPICS.items():
                if word in text.lower():
                    out[i, topic] += 1.0
        return out + 1e-3


class FixedCross:
    def __init__(self, scores: dict[tuple[str, str], float]) -> None:
        self.scores = scores

    def predict(self, pairs: list[tuple[str, str]], **kwargs: Any) -> np.ndarray:
        return np.array([self.scores.get(p, 0.0) for p in pairs])


def test_consistency_filter_and_cross_encoder_rescue(train_file: Path) -> None:
    data = read_table(train_file)
    config = CurateConfig(exact=False, near=None, model=TableModel(), consistency=True, top_k=1)
    report = curate(data, config)
    assert [(r["line"], r["step"], r["rank"]) for r in report.removed] == [
        (8, "consistency", 4)
    ]  # three people-topic texts outrank the sky
    cross = FixedCross({ROWS[7]: 0.9})
    report = curate(
        data,
        CurateConfig(
            exact=False, near=None, model=TableModel(), consistency=True, top_k=1, cross_encoder=cross
        ),
    )
    assert report.removed == [] and report.notes["rescued_by_cross_encoder"] == 1
    only_cross = curate(
        data, CurateConfig(exact=False, near=None, cross_encoder=FixedCross({r: 0.8 for r in ROWS[:6]}))
    )
    assert [(r["line"], r["step"]) for r in only_cross.removed] == [(7, "cross"), (8, "cross")]


ABSTRACT = (
    "Interleukin 12 exerts a potent proinflammatory effect by stimulating T helper 1 responses; mice lacking the "
    "interferon gamma receptor develop severe experimental autoimmune myocarditis after immunisation. "
    "Cardiac myosin peptides were given with adjuvant; hearts were scored for infiltrates after three weeks, "
    "and cytokine levels in serum and heart tissue were measured by ELISA and quantitative PCR in each group. "
    "Blocking antibodies against the cytokine reduced the disease score, while recombinant cytokine raised it."
) * 3


def test_pairs_sharing_a_long_positive_are_not_near_duplicates(tmp_path: Path) -> None:
    # found on SciFact: several claims cite the same abstract; the concatenated row texts are then > 0.9 alike
    # (the long positive dominates the shingles), but the pairs teach different things
    rows = [
        ("IL-12 drives myocarditis in mice.", ABSTRACT),
        ("Interferon gamma protects mice from myocarditis.", ABSTRACT),
        ("IL-12 drives myocarditis in mice!", ABSTRACT + " "),  # a real near-duplicate of line 1
    ]
    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows))
    report = curate(read_table(path), CurateConfig(exact=False))
    assert [(r["line"], r["step"], r["duplicate_of"]) for r in report.removed] == [(3, "near", 1)]
    by_embedding = curate(
        read_table(path), CurateConfig(exact=False, near="embedding", near_threshold=0.99, model=WordModel())
    )
    assert [(r["line"], r["duplicate_of"]) for r in by_embedding.removed] == [(3, 1)]


class WordModel:
    """Bag-of-words vectors (a stand-in bi-encoder whose cosine follows the shared words)."""

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        words = sorted({w for t in texts for w in normalise(t).split()})
        index = {w: i for i, w in enumerate(words)}
        out = np.zeros((len(texts), len(words)), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in normalise(text).split():
                out[i, index[w]] += 1.0
        return out


def test_curate_cli_writes_kept_rows_and_the_report(
    train_file: Path, eval_file: Path, tmp_path: Path
) -> None:
    from embforge.cli import main

    out, report = tmp_path / "kept.jsonl", tmp_path / "report.json"
    argv = ["curate", "--data", str(train_file), "--output", str(out), "--report", str(report)]
    assert main([*argv, "--eval", str(eval_file)]) == 0
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(k["anchor"], k["positive"]) for k in kept] == [ROWS[i] for i in (0, 2, 4, 6, 7)]
    written = json.loads(report.read_text())
    assert written["rows_in"] == 8 and written["rows_out"] == 5
    assert [(r["line"], r["step"]) for r in written["rows"]] == [(2, "exact"), (4, "leakage"), (6, "near")]
    assert all(r["reason"] for r in written["rows"])
