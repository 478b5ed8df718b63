"""False-negative relabelling and pruning of mined training rows (RLHN: Thakur et al., 2025).

Mined hard negatives (``anchor, positive, negative_1..n`` rows, :func:`embforge.retrieval.mining.write_jsonl`)
hold unlabelled positives: a retriever's top hits that nobody judged. A *judge* — a cross-encoder, or a bi-encoder
scoring by cosine — scores every ``(anchor, positive)`` and ``(anchor, negative)`` pair of the file, then:

==================  ===========================================================================================
step                what it does
==================  ===========================================================================================
``prune``           drops a row when at least ``prune`` of its negatives score strictly above its positive (the
                    judge disagrees with the label); runs first, so a pruned row is not relabelled
false negatives     a negative is false when its score is ``>= s⁺ - margin`` (``s⁺``: the row's positive;
                    margin 0: it scores at least as high as the positive), or ``>= threshold`` when one is
                    given, or when its normalised text equals a positive of the same anchor anywhere in the
                    file. It leaves the row's negatives; ``action="relabel"`` also makes it the positive of an
                    extra row ``(anchor, false negative, the row's negatives)`` (RLHN's relabelling: the
                    training rows hold one positive each, so an extra positive is an extra row; a batch never
                    holds the same anchor twice, :mod:`embforge.training.batches`), ``action="drop"`` only
                    removes it (RLHN's "HN remove")
refill              every output row has ``negatives`` negative columns (default: the input's): a row left with
                    fewer gets negatives drawn at random (seeded) from other rows' kept negatives, never a
                    positive of its anchor — the rule of mining's random negatives
==================  ===========================================================================================

Every changed row is listed in the report with its line, scores and what happened.

Example:
    >>> from embforge.kinds import load_any
    >>> out, report = relabel(read_table("mined.jsonl"), load_any("my-reranker"),
    ...                       RelabelConfig(prune=1))  # doctest: +SKIP
    >>> report.summary()["false_negatives"]  # doctest: +SKIP
    41
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from embforge.data.dedup import normalise
from embforge.data.tables import Dataset
from embforge.kinds import is_pair_scorer, is_single_vector
from embforge.protocols import Embedder, PairScorer

ACTIONS = ("relabel", "drop")


@dataclass
class RelabelConfig:
    """What :func:`relabel` changes. The CLI fills it from ``embforge curate --relabel/--prune`` flags."""

    action: str | None = "relabel"  # what a false negative becomes: "relabel", "drop", or None (not checked)
    margin: float = 0.0  # false negative when its score >= the positive's - margin
    threshold: float | None = None  # ... or >= this score
    prune: int | None = None  # drop rows with at least this many negatives scored above the positive
    negatives: int | None = None  # negative columns of the output; None: as many as the input
    seed: int = 0
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.action not in (None, *ACTIONS):
            raise ValueError(
                f"relabel action must be one of {', '.join(ACTIONS)} or none, got {self.action!r}"
            )
        if self.prune is not None and self.prune < 1:
            raise ValueError(f"prune must be >= 1 (negatives above the positive), got {self.prune}")
        if self.negatives is not None and self.negatives < 1:
            raise ValueError(f"negatives must be >= 1, got {self.negatives}")
        if self.action is None and self.prune is None:
            raise ValueError("nothing to do: give a false-negative action (relabel/drop) or prune")


@dataclass
class RelabelReport:
    """Counts per action and one record per changed row (its line, the judge's scores, what happened)."""

    rows_in: int
    rows_out: int
    counts: dict[str, int]
    rows: list[dict[str, object]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {"rows_in": self.rows_in, "rows_out": self.rows_out, **self.counts}

    def to_json(self) -> dict[str, object]:
        return {**self.summary(), "rows": self.rows}


def judge_scores(
    judge: Embedder | PairScorer,
    anchors: Sequence[str],
    candidates: Sequence[Sequence[str]],
    *,
    batch_size: int,
) -> np.ndarray:
    """``(rows, candidates)`` scores of each anchor against its candidates: a cross-encoder's (with its
    activation) or a bi-encoder's cosine, each distinct text embedded once."""
    if not anchors:  # every row removed before (curate's steps)
        return np.zeros((0, 0))
    width = len(candidates[0])
    if is_pair_scorer(judge):
        pairs = [(a, c) for a, row in zip(anchors, candidates) for c in row]
        scores = judge.predict(pairs, batch_size=batch_size)
        return np.asarray(scores, dtype=np.float64).reshape(len(anchors), width)
    if not is_single_vector(judge):
        raise ValueError("the judge must be a cross-encoder or a single-vector bi-encoder (dense or static)")
    texts = sorted({*anchors, *(c for row in candidates for c in row)})
    where = {t: i for i, t in enumerate(texts)}
    vectors = np.asarray(judge.encode(texts, batch_size=batch_size), dtype=np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    a = vectors[[where[t] for t in anchors]]
    c = vectors[[[where[t] for t in row] for row in candidates]]
    return np.einsum("nd,nkd->nk", a, c)


def relabel(
    data: Dataset,
    judge: Embedder | PairScorer,
    config: RelabelConfig,
    *,
    rows: Sequence[int] | None = None,
) -> tuple[Dataset, RelabelReport]:
    """Prune and relabel ``data``'s rows (all, or those at ``rows``; see the module docstring); return the
    rewritten rows (``anchor, positive, negative_1..m``, each keeping its source line) and the report."""
    _check_columns(data)
    keep = list(range(len(data))) if rows is None else list(rows)
    negative_columns = data.text_columns[2:]
    anchors = [data.columns["anchor"][r] for r in keep]
    positives = [data.columns["positive"][r] for r in keep]
    negatives = [[data.columns[c][r] for c in negative_columns] for r in keep]
    scores = judge_scores(
        judge, anchors, [[p, *n] for p, n in zip(positives, negatives)], batch_size=config.batch_size
    )
    positive, negative = scores[:, :1], scores[:, 1:]
    counts = dict.fromkeys(
        ("pruned", "rows_with_false_negatives", "false_negatives", "rows_added", "negatives_refilled"), 0
    )
    lines = [data.lines[r] for r in keep]
    alive, records = _prune(positive, negative, lines, config.prune)
    counts["pruned"] = len(records)
    keys = [normalise(a) for a in anchors]
    known: dict[str, set[str]] = {}  # per normalised anchor: its positives, normalised
    for key, p in zip(keys, positives):
        known.setdefault(key, set()).add(normalise(p))
    false = np.zeros_like(negative, dtype=bool)
    if config.action is not None:
        false = _false_negatives(negative, positive, negatives, keys, known, alive, config)
    kept_negatives, banned = _left_over(negatives, false, keys, known)
    width = config.negatives or len(negative_columns)
    pool = sorted({n for i, row in enumerate(kept_negatives) if alive[i] for n in row})
    rng = random.Random(config.seed)
    out_rows: list[tuple[int, str, str, list[str]]] = []  # (line, anchor, positive, negatives)
    added: set[tuple[str, str]] = set()
    for i in np.flatnonzero(alive).tolist():
        chosen = kept_negatives[i][:width]
        refilled = _refill(chosen, width, pool, banned[keys[i]], rng)
        counts["negatives_refilled"] += refilled
        line = lines[i]
        out_rows.append((line, anchors[i], positives[i], chosen))
        flagged = np.flatnonzero(false[i]).tolist()
        if not flagged:
            continue
        counts["rows_with_false_negatives"] += 1
        counts["false_negatives"] += len(flagged)
        became = []
        for j in flagged:
            text = negatives[i][j]
            pair = (keys[i], normalise(text))
            if config.action == "drop":
                became.append("dropped")
            elif pair[1] in known[keys[i]] or pair in added:
                became.append("dropped (already a positive)")
            else:
                added.add(pair)
                out_rows.append((line, anchors[i], text, chosen))
                became.append("positive of an added row")
        records.append(
            {
                "line": line,
                "action": "false_negatives",
                "columns": [negative_columns[j] for j in flagged],
                "scores": [round(float(negative[i, j]), 4) for j in flagged],
                "positive_score": round(float(positive[i, 0]), 4),
                "became": became,
                "refilled": refilled,
            }
        )
    counts["rows_added"] = len(added)
    records.sort(key=lambda r: int(str(r["line"])))
    out = _as_dataset(data.path, out_rows, width)
    return out, RelabelReport(len(keep), len(out), counts, records)


def _check_columns(data: Dataset) -> None:
    data.require(["anchor", "positive", "negative*"], purpose="--relabel/--prune (mined negatives)")
    if data.label_column is not None:
        raise ValueError(
            f"{data.path}: relabelling rewrites the negatives, so the {data.label_column!r} column would no "
            "longer match them; remove it (or relabel the file before scoring it with a teacher)"
        )


def _left_over(
    negatives: list[list[str]], false: np.ndarray, keys: list[str], known: dict[str, set[str]]
) -> tuple[list[list[str]], dict[str, set[str]]]:
    """Each row's negatives that are not false, and per normalised anchor the texts that must never be one of its
    negatives: its positives and its false negatives (normalised)."""
    banned = {key: set(texts) for key, texts in known.items()}
    for key, row, flags in zip(keys, negatives, false.tolist()):
        banned[key].update(normalise(n) for n, f in zip(row, flags) if f)
    kept = [[n for n, f in zip(row, flags) if not f] for row, flags in zip(negatives, false.tolist())]
    return kept, banned


def _prune(
    positive: np.ndarray, negative: np.ndarray, lines: list[int], prune: int | None
) -> tuple[np.ndarray, list[dict[str, object]]]:
    """Which rows live, and a record per row with at least ``prune`` negatives scored above its positive."""
    alive = np.ones(len(lines), dtype=bool)
    if prune is None:
        return alive, []
    above = (negative > positive).sum(axis=1)
    records: list[dict[str, object]] = []
    for i in np.flatnonzero(above >= prune).tolist():
        alive[i] = False
        records.append(
            {
                "line": lines[i],
                "action": "pruned",
                "negatives_above_positive": int(above[i]),
                "positive_score": round(float(positive[i, 0]), 4),
            }
        )
    return alive, records


def _false_negatives(
    negative: np.ndarray,
    positive: np.ndarray,
    negatives: list[list[str]],
    keys: list[str],
    known: dict[str, set[str]],
    alive: np.ndarray,
    config: RelabelConfig,
) -> np.ndarray:
    """``(rows, negatives)`` flags: scored ``>= s⁺ - margin`` (or ``>= threshold``), or the text of a positive
    of the same anchor; a text flagged in one row of an anchor is flagged in all of them. Pruned rows: none."""
    false = negative >= positive - config.margin
    if config.threshold is not None:
        false |= negative >= config.threshold
    found: dict[str, set[str]] = {key: set(texts) for key, texts in known.items()}
    for key, row, flags in zip(keys, negatives, (false & alive[:, None]).tolist()):
        found[key].update(normalise(n) for n, f in zip(row, flags) if f)
    for i, (key, row) in enumerate(zip(keys, negatives)):
        false[i] |= [normalise(n) in found[key] for n in row]
    return false & alive[:, None]


def _refill(chosen: list[str], width: int, pool: list[str], banned: set[str], rng: random.Random) -> int:
    """Append random ``pool`` texts (none in ``banned`` once normalised, none already chosen) to ``chosen``, in
    place, until it holds ``width``; returns how many. Draws at random first, then scans the shuffled pool."""
    missing = width - len(chosen)
    if missing <= 0:
        return 0

    def ok(text: str) -> bool:
        return text not in chosen and normalise(text) not in banned

    for _ in range(8 * missing):
        if len(chosen) == width:
            return missing
        text = pool[rng.randrange(len(pool))] if pool else None
        if text is not None and ok(text):
            chosen.append(text)
    rest = [t for t in pool if ok(t)]
    rng.shuffle(rest)
    if len(chosen) + len(rest) < width:
        raise ValueError(
            f"too few negatives left to refill a row to {width} (lower --keep-negatives, or mine more negatives)"
        )
    chosen.extend(rest[: width - len(chosen)])
    return missing


def _as_dataset(path: str, rows: list[tuple[int, str, str, list[str]]], width: int) -> Dataset:
    columns: dict[str, list] = {"anchor": [r[1] for r in rows], "positive": [r[2] for r in rows]}
    for k in range(width):
        columns[f"negative_{k + 1}"] = [r[3][k] for r in rows]
    return Dataset(path, columns, [r[0] for r in rows])
