"""False-negative relabelling and pruning (embforge.relabel, `embforge curate --relabel/--prune`): hand-built mined
files whose false negatives and disputed rows are known, judged by stand-ins with hand-computable scores, a tiny
random cross-encoder and a tiny random bi-encoder."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embforge.data.dedup import normalise
from embforge.data.tables import read_table
from embforge.relabel import RelabelConfig, judge_scores, relabel

# (anchor, positive, negative_1, negative_2)
ROWS = [
    ("red apple fruit", "apple is a red fruit", "the red apple fruit", "car engine oil"),  # 1: neg_1 false
    ("fast car engine", "a car engine", "engine oil", "green tree leaf"),  # 2: clean
    ("blue ocean water", "sky", "blue ocean water waves", "blue water"),  # 3: both negatives above "sky"
    ("green tree leaf", "a green leaf on a tree", "A green leaf on a TREE", "car engine oil"),  # 4: same text
    ("red apple fruit", "red fruit apple", "car engine", "the red apple fruit"),  # 5: line 1's anchor again
]


class WordModel:
    """A bi-encoder stand-in: bag-of-words vectors, so every cosine can be computed by hand."""

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        words = sorted({w for t in texts for w in normalise(t).split()})
        index = {w: i for i, w in enumerate(words)}
        out = np.zeros((len(texts), len(words)), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in normalise(text).split():
                out[i, index[w]] += 1.0
        return out


class TableCross:
    """A cross-encoder stand-in (it declares the kind) with fixed scores per pair, 0 otherwise."""

    kind = "cross"

    def __init__(self, scores: dict[tuple[str, str], float]) -> None:
        self.scores = scores

    def predict(self, pairs: list[tuple[str, str]], **kwargs: Any) -> np.ndarray:
        return np.array([self.scores.get(p, 0.0) for p in pairs])


def cosine(a: str, b: str) -> float:
    """The reference: bag-of-words cosine written out with Python counts."""
    wa, wb = normalise(a).split(), normalise(b).split()
    dot = sum(wa.count(w) * wb.count(w) for w in set(wa))
    return dot / math.sqrt(sum(wa.count(w) ** 2 for w in set(wa)) * sum(wb.count(w) ** 2 for w in set(wb)))


def write(path: Path, rows: list[tuple[str, ...]]) -> Path:
    names = ["anchor", "positive"] + [f"negative_{k}" for k in range(1, len(rows[0]) - 1)]
    path.write_text("".join(json.dumps(dict(zip(names, r))) + "\n" for r in rows))
    return path


@pytest.fixture
def mined(tmp_path: Path) -> Path:
    return write(tmp_path / "mined.jsonl", ROWS)


def test_judge_scores_equal_the_hand_cosines() -> None:
    got = judge_scores(WordModel(), [r[0] for r in ROWS], [list(r[1:]) for r in ROWS], batch_size=2)
    want = [[cosine(r[0], c) for c in r[1:]] for r in ROWS]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def reference_flags(rows: list[tuple[str, ...]], margin: float = 0.0) -> list[list[bool]]:
    """The rule written out: a negative scoring >= its positive - margin, or a text that is a positive of its
    anchor or flagged in another row of that anchor."""
    own = [[cosine(a, n) >= cosine(a, p) - margin for n in negs] for a, p, *negs in rows]
    texts: dict[str, set[str]] = {}
    for (a, p, *negs), flags in zip(rows, own):
        texts.setdefault(normalise(a), set()).add(normalise(p))
        texts[normalise(a)].update(normalise(n) for n, f in zip(negs, flags) if f)
    return [
        [f or normalise(n) in texts[normalise(a)] for n, f in zip(negs, flags)]
        for (a, p, *negs), flags in zip(rows, own)
    ]


def test_false_negatives_follow_the_rule(mined: Path) -> None:
    data = read_table(mined)
    out, report = relabel(data, WordModel(), RelabelConfig(action="drop"))
    expected = [
        (line, [f"negative_{k}" for k, f in enumerate(flags, 1) if f])
        for line, flags in enumerate(reference_flags(ROWS), 1)
        if any(flags)
    ]
    assert expected == [
        (1, ["negative_1"]),
        (3, ["negative_1", "negative_2"]),
        (4, ["negative_1"]),
        (5, ["negative_2"]),
    ]
    assert [(r["line"], r["columns"]) for r in report.rows] == expected
    # line 5's "the red apple fruit" scores below its own positive; flagged because line 1 flags it
    assert cosine(ROWS[4][0], ROWS[4][3]) < cosine(ROWS[4][0], ROWS[4][1])
    summary = report.summary()
    assert summary["false_negatives"] == 5 and summary["rows_with_false_negatives"] == 4
    assert summary["rows_added"] == 0 and len(out) == 5  # drop: no rows added
    assert out.text_columns == ["anchor", "positive", "negative_1", "negative_2"]
    for k, (anchor, positive, *_) in enumerate(ROWS):
        negs = {out.columns["negative_1"][k], out.columns["negative_2"][k]}
        assert len(negs) == 2 and normalise(positive) not in {normalise(n) for n in negs}
        assert anchor != "red apple fruit" or "the red apple fruit" not in negs
    assert summary["negatives_refilled"] == 5  # one slot per false negative, from other rows' negatives


def test_identical_negative_is_relabelled_with_a_tiny_model(tmp_path: Path, tiny_encoder: Any) -> None:
    words = [
        "dog",
        "man",
        "woman",
        "plays",
        "piano",
        "flute",
        "plane",
        "car",
        "drives",
        "road",
        "red",
        "blue",
    ]
    words += ["green", "big", "house", "tree", "river", "sun"]
    filler = [" ".join(c) for c in itertools.islice(itertools.combinations(words, 3), 0, 240, 10)]
    rows = [
        ("a cat eats food", "the small cat eats", "the small cat eats", "stock market rises"),
        (
            "a man plays guitar",
            "the man is playing the guitar",
            "The Man is playing the GUITAR!",
            "oil falls",
        ),
        ("the child reads", "a child reads a book", "the dog runs in the park", "rain in the sky"),
        *[(filler[4 * k], filler[4 * k + 1], filler[4 * k + 2], filler[4 * k + 3]) for k in range(6)],
    ]
    data = read_table(write(tmp_path / "mined.jsonl", rows))
    out, report = relabel(data, tiny_encoder, RelabelConfig())  # the default rule: scored >= the positive
    flagged = {r["line"]: r for r in report.rows}
    assert "negative_1" in flagged[1]["columns"] and "negative_1" in flagged[2]["columns"]
    assert flagged[1]["scores"][0] == pytest.approx(
        flagged[1]["positive_score"]
    )  # the same text, the same score
    for k in (0, 1):  # out of the negatives, and not added again: it is the positive already
        assert {out.columns["negative_1"][k], out.columns["negative_2"][k]}.isdisjoint(rows[k][1:3])
    # with the score rule out of reach (cosines lie in [-1, 1]), the same-text rule alone still finds both
    _, report = relabel(data, tiny_encoder, RelabelConfig(margin=-2.0))
    assert [(r["line"], r["columns"], r["became"]) for r in report.rows] == [
        (1, ["negative_1"], ["dropped (already a positive)"]),
        (2, ["negative_1"], ["dropped (already a positive)"]),
    ]


def test_relabel_adds_a_row_per_false_negative(mined: Path) -> None:
    data = read_table(mined)
    out, report = relabel(data, WordModel(), RelabelConfig())
    rows = list(zip(out.lines, out.columns["anchor"], out.columns["positive"]))
    added = [r for r in rows if r[1:] not in {(a, p) for a, p, *_ in ROWS}]  # each after its source row
    assert added == [
        (1, "red apple fruit", "the red apple fruit"),
        (3, "blue ocean water", "blue ocean water waves"),
        (3, "blue ocean water", "blue water"),
    ]
    assert report.summary()["rows_added"] == 3 and report.rows_out == 8
    # an added row has its source row's (refilled) negatives, none of them a positive of the anchor
    for k, (_, anchor, _) in enumerate(rows):
        if anchor == "blue ocean water":
            negs = {out.columns["negative_1"][k], out.columns["negative_2"][k]}
            assert not negs & {"sky", "blue ocean water waves", "blue water"}


def test_prune_drops_rows_the_judge_disagrees_with(mined: Path) -> None:
    data = read_table(mined)
    out, report = relabel(data, WordModel(), RelabelConfig(action=None, prune=2))
    assert [(r["line"], r["action"], r["negatives_above_positive"]) for r in report.rows] == [
        (3, "pruned", 2)
    ]
    assert out.lines == [1, 2, 4, 5] and report.summary()["pruned"] == 1
    out, report = relabel(data, WordModel(), RelabelConfig(action=None, prune=1))
    above = {i + 1 for i, (a, p, *n) in enumerate(ROWS) if any(cosine(a, x) > cosine(a, p) for x in n)}
    assert {r["line"] for r in report.rows} == above == {1, 3}
    # pruning runs first: a pruned row's negatives are not counted as false negatives
    out, report = relabel(data, WordModel(), RelabelConfig(action="relabel", prune=1))
    assert report.summary()["pruned"] == 2  # lines 1 and 3
    assert (
        report.summary()["rows_added"] == 0
    )  # line 5's flagged text came from pruned line 1: not flagged now
    assert [r["line"] for r in report.rows if r["action"] == "false_negatives"] == [4]


def test_cross_encoder_judge_with_a_threshold(mined: Path, tiny_cross_encoder: Any) -> None:
    data = read_table(mined)
    judge = TableCross({(ROWS[1][0], ROWS[1][1]): 0.9, (ROWS[1][0], ROWS[1][2]): 0.8})
    _, report = relabel(data, judge, RelabelConfig(action="drop", margin=-0.5, threshold=0.7))
    # margin -0.5: nothing is within reach of the positive except by the threshold, and the same-text rule
    assert [(r["line"], r["columns"]) for r in report.rows] == [(2, ["negative_1"]), (4, ["negative_1"])]
    scores = judge_scores(tiny_cross_encoder, ["a", "b"], [["x", "y"], ["z", "w"]], batch_size=4)
    pairs = [("a", "x"), ("a", "y"), ("b", "z"), ("b", "w")]
    np.testing.assert_allclose(scores.ravel(), tiny_cross_encoder.predict(pairs), rtol=1e-5)


def test_fewer_negatives_written(mined: Path) -> None:
    out, _ = relabel(read_table(mined), WordModel(), RelabelConfig(action="drop", negatives=1))
    assert out.text_columns == ["anchor", "positive", "negative_1"]
    assert out.columns["negative_1"][1] == "engine oil"  # the first kept negative of a clean row
    with pytest.raises(ValueError, match="too few negatives left"):
        relabel(read_table(mined), WordModel(), RelabelConfig(action="drop", negatives=9))


def test_refuses_files_it_cannot_rewrite(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"anchor": "a", "positive": "b"}) + "\n")
    with pytest.raises(Exception, match=r"pairs.jsonl:1: missing column 'negative\*'"):
        relabel(read_table(pairs), WordModel(), RelabelConfig())
    scored = tmp_path / "scored.jsonl"
    scored.write_text(
        json.dumps({"anchor": "a", "positive": "b", "negative_1": "c", "score": [1.0, 0.0]}) + "\n"
    )
    with pytest.raises(ValueError, match="'score' column would no longer match"):
        relabel(read_table(scored), WordModel(), RelabelConfig())
    with pytest.raises(ValueError, match="nothing to do"):
        RelabelConfig(action=None)


def test_cli_relabel_and_prune(mined: Path, tmp_path: Path, tiny_model_dir: Path) -> None:
    from embforge.cli import main

    out, report = tmp_path / "out.jsonl", tmp_path / "report.json"
    argv = ["curate", "--data", str(mined), "--output", str(out), "--report", str(report), "--near", "none"]
    assert main([*argv, "--relabel", "--prune", "2", "--judge", str(tiny_model_dir), "--quiet"]) == 0
    written = json.loads(report.read_text())["relabel"]
    kept = read_table(out)  # readable training rows
    assert written["rows_out"] == len(kept) and written["judge"] == str(tiny_model_dir)
    assert written["rows_in"] == 5 and set(written) >= {"pruned", "false_negatives", "rows_added", "rows"}
    # line 4's negative is its positive written differently: always a false negative, whatever the tiny model says
    line4 = [r for r in written["rows"] if r["line"] == 4 and r["action"] == "false_negatives"]
    assert line4 and "negative_1" in line4[0]["columns"]


def test_cli_names_the_line_of_a_malformed_row(
    mined: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from embforge.cli import main

    broken = tmp_path / "broken.jsonl"
    lines = mined.read_text().splitlines()
    row = json.loads(lines[2])
    del row["negative_2"]
    broken.write_text("\n".join([*lines[:2], json.dumps(row), *lines[3:]]) + "\n")
    argv = [
        "curate",
        "--data",
        str(broken),
        "--output",
        str(tmp_path / "o.jsonl"),
        "--report",
        str(tmp_path / "r"),
    ]
    assert main([*argv, "--relabel", "--judge", "unused"]) == 2
    assert f"{broken}:3: column 'negative_2': missing value" in capsys.readouterr().err


def test_no_rows_left_gives_an_empty_file(mined: Path) -> None:
    out, report = relabel(read_table(mined), WordModel(), RelabelConfig(), rows=[])
    assert len(out) == 0 and report.summary()["rows_out"] == 0
