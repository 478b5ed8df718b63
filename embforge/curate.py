"""Training-data curation: duplicates, leakage into evaluation files, and pairs a model disagrees with.

Steps, in order; a row removed by one step is not seen by the later ones, and every removed row is listed in the
report with its line, the step and why (nothing is dropped silently: ``rows_in = rows_out + removed``):

==================  ===========================================================================================
step                removes a row when
==================  ===========================================================================================
``exact``           its text columns, normalised (:func:`embforge.data.dedup.normalise`), equal an earlier
                    row's (the earlier row is kept)
``leakage``         one of its texts, normalised, appears in an evaluation file (or, with ``leak_threshold``,
                    is a MinHash near-duplicate of one)
``near``            it is a near-duplicate of an earlier kept row: character-shingle Jaccard
                    (``near="minhash"``) or embedding cosine (``near="embedding"``, needs ``model``), each
                    text column compared with its own and averaged, ≥ ``near_threshold``
``consistency``     (``anchor, positive`` rows; needs ``model``) its positive is not in the anchor's top
                    ``top_k`` among every positive/negative text of the file — unless a cross-encoder
                    (``cross_encoder``) scores the pair ≥ ``cross_threshold`` (then it is kept, and counted)
``cross``           (a cross-encoder without a consistency model) the cross-encoder scores the pair below
                    ``cross_threshold``
==================  ===========================================================================================

Example:
    >>> report = curate(read_table("train.jsonl"), CurateConfig(eval_files=["test.csv"]))  # doctest: +SKIP
    >>> report.summary()["removed"]  # doctest: +SKIP
    {'exact': 12, 'leakage': 3, 'near': 40}
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from embforge.data.dedup import jaccard, near_duplicate_pairs, normalise, shingles
from embforge.data.tables import Dataset, read_table

if TYPE_CHECKING:
    from embforge.protocols import Embedder, PairScorer

STEPS = ("exact", "leakage", "near", "consistency", "cross")


class Drop(Protocol):
    """Removes a row from the output and records why (its step, a reason, and step-specific details)."""

    def __call__(self, row: int, step: str, reason: str, **detail: object) -> None: ...


@dataclass
class CurateConfig:
    """What :func:`curate` checks. The CLI fills it from ``embforge curate`` flags."""

    exact: bool = True
    near: str | None = "minhash"  # "minhash", "embedding" or None
    near_threshold: float = 0.9
    eval_files: list[str] = field(default_factory=list)
    leak_threshold: float | None = (
        None  # also drop MinHash near-duplicates of evaluation texts at this Jaccard
    )
    model: str | Embedder | None = (
        None  # bi-encoder (folder or loaded) for near="embedding" and the consistency check
    )
    consistency: bool = False
    top_k: int = 10
    cross_encoder: str | PairScorer | None = None  # cross-encoder (folder or loaded) confirming pairs
    cross_threshold: float = 0.5
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.near not in (None, "minhash", "embedding"):
            raise ValueError(f"near must be 'minhash', 'embedding' or none, got {self.near!r}")
        if (self.near == "embedding" or self.consistency) and self.model is None:
            raise ValueError("near='embedding' and the consistency check need a model (--model)")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")


@dataclass
class CurateReport:
    """The rows kept (indices into the input) and one record per removed row."""

    path: str
    rows_in: int
    kept: list[int]
    removed: list[dict[str, object]]
    notes: dict[str, object] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        counts = {step: 0 for step in STEPS}
        for record in self.removed:
            counts[str(record["step"])] += 1
        assert self.rows_in == len(self.kept) + len(self.removed), "every row is kept or reported"
        return {
            "input": self.path,
            "rows_in": self.rows_in,
            "rows_out": len(self.kept),
            "removed": {k: v for k, v in counts.items() if v},
            **self.notes,
        }

    def to_json(self) -> dict[str, object]:
        return {**self.summary(), "rows": self.removed}


def curate(data: Dataset, config: CurateConfig, *, show_progress: bool = False) -> CurateReport:
    """Run the configured steps over ``data`` (see the module docstring); return what was kept and removed."""
    n = len(data)
    alive = np.ones(n, dtype=bool)
    removed: list[dict[str, object]] = []
    notes: dict[str, object] = {}

    def drop(row: int, step: str, reason: str, **detail: object) -> None:
        alive[row] = False
        removed.append({"line": data.lines[row], "step": step, "reason": reason, **detail})

    columns = data.text_columns
    if config.exact:
        first: dict[tuple[str, ...], int] = {}
        for row in range(n):
            key = tuple(normalise(data.columns[c][row]) for c in columns)
            if key in first:
                drop(
                    row,
                    "exact",
                    "same normalised texts as an earlier row",
                    duplicate_of=data.lines[first[key]],
                )
            else:
                first[key] = row
    if config.eval_files:
        _leakage(data, config, alive, drop)
    model = _load_encoder(config.model) if config.model else None
    if config.near == "minhash":
        rows = np.flatnonzero(alive).tolist()
        for i, j, score in _near_by_shingles(data, rows, config.near_threshold):
            if alive[rows[i]] and alive[rows[j]]:
                drop(
                    int(rows[j]),
                    "near",
                    "MinHash near-duplicate of an earlier row",
                    duplicate_of=data.lines[rows[i]],
                    jaccard=round(score, 4),
                )
    elif config.near == "embedding":
        assert model is not None
        _near_by_embedding(data, model, config, alive, drop, show_progress)
    cross = _load_cross(config.cross_encoder) if config.cross_encoder else None
    if (config.consistency or cross is not None) and columns[:2] != ["anchor", "positive"]:
        raise ValueError(
            f"{data.path}: consistency/cross-encoder filtering needs anchor, positive columns, found {columns}"
        )
    skipped = _too_few_candidates(data, config, alive) if config.consistency else None
    if skipped is not None:
        notes["consistency_skipped"] = skipped
    elif config.consistency:
        assert model is not None
        notes["rescued_by_cross_encoder"] = _consistency(
            data, model, cross, config, alive, drop, show_progress
        )
    elif cross is not None:
        rows = np.flatnonzero(alive).tolist()
        scores = _cross_scores(cross, data, rows, config)
        for row, score in zip(rows, scores):
            if score < config.cross_threshold:
                drop(
                    int(row), "cross", "cross-encoder score below the threshold", score=round(float(score), 4)
                )
    removed.sort(key=lambda r: cast(int, r["line"]))
    return CurateReport(data.path, n, [int(i) for i in np.flatnonzero(alive)], removed, notes)


def _leakage(data: Dataset, config: CurateConfig, alive: np.ndarray, drop: Drop) -> None:
    seen: dict[str, str] = {}
    eval_texts: list[tuple[str, str]] = []
    for path in config.eval_files:
        other = read_table(path)
        for column in other.text_columns:
            for line, text in zip(other.lines, other.columns[column]):
                key = normalise(text)
                seen.setdefault(key, f"{path}:{line}")
                eval_texts.append((text, f"{path}:{line}"))
    for row in np.flatnonzero(alive).tolist():
        for column in data.text_columns:
            where = seen.get(normalise(data.columns[column][row]))
            if where is not None:
                drop(int(row), "leakage", f"column {column!r} appears in an evaluation file", found_in=where)
                break
    if config.leak_threshold is None:
        return
    rows = np.flatnonzero(alive).tolist()
    train = [(int(r), c) for r in rows for c in data.text_columns]
    texts = [data.columns[c][r] for r, c in train] + [t for t, _ in eval_texts]
    for i, j, score in near_duplicate_pairs(texts, threshold=config.leak_threshold):
        if i < len(train) <= j and alive[train[i][0]]:
            row, column = train[i]
            drop(
                row,
                "leakage",
                f"column {column!r} is a near-duplicate of an evaluation text",
                found_in=eval_texts[j - len(train)][1],
                jaccard=round(score, 4),
            )


def _load_encoder(model: str | Embedder) -> Embedder:
    from embforge.encoder import Encoder

    return Encoder.load(model) if isinstance(model, str) else model


def _load_cross(model: str | PairScorer) -> PairScorer:
    from embforge.cross_encoder import CrossEncoder

    return CrossEncoder.load(model) if isinstance(model, str) else model


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _near_by_shingles(data: Dataset, rows: list[int], threshold: float) -> list[tuple[int, int, float]]:
    """``(i, j, similarity)`` (indices into ``rows``, ``i < j``) whose per-column shingle Jaccard, averaged over
    the text columns, is ``>= threshold``.

    Each column weighs the same whatever its length: two pairs that share a long positive but have different
    anchors (several claims citing one abstract) are different training pairs, although their concatenated texts
    are nearly equal. A mean of ``threshold`` over ``C`` columns needs every column at ``C·threshold - (C-1)`` or
    more, so the first column's MinHash pairs at that bound are the candidates, confirmed column by column.
    """
    columns = data.text_columns
    bound = max(len(columns) * threshold - (len(columns) - 1), 0.05)
    first = [data.columns[columns[0]][r] for r in rows]
    found = []
    for i, j, _ in near_duplicate_pairs(first, threshold=bound):
        score = float(
            np.mean(
                [
                    jaccard(shingles(data.columns[c][rows[i]]), shingles(data.columns[c][rows[j]]))
                    for c in columns
                ]
            )
        )
        if score >= threshold:
            found.append((i, j, score))
    return sorted(found, key=lambda pair: (pair[1], pair[0]))


def _near_by_embedding(
    data: Dataset, model: Embedder, config: CurateConfig, alive: np.ndarray, drop: Drop, show_progress: bool
) -> None:
    """Drop rows whose per-column embedding cosine, averaged over the text columns, reaches ``near_threshold``
    against an earlier kept row (each column weighs the same, as in :func:`_near_by_shingles`)."""
    rows = np.flatnonzero(alive).tolist()
    embs = [
        _unit(
            model.encode(
                [data.columns[c][r] for r in rows], batch_size=config.batch_size, show_progress=show_progress
            )
        )
        for c in data.text_columns
    ]
    for start in range(0, len(rows), 1024):  # blocks of rows against every earlier row
        block = np.mean([e[start : start + 1024] @ e[: start + 1024].T for e in embs], axis=0)
        for k in range(block.shape[0]):
            i = start + k
            if not alive[rows[i]]:
                continue
            earlier = [
                e for e in np.flatnonzero(block[k, :i] >= config.near_threshold).tolist() if alive[rows[e]]
            ]
            if earlier:
                e = earlier[0]
                drop(
                    int(rows[i]),
                    "near",
                    "embedding near-duplicate of an earlier row",
                    duplicate_of=data.lines[rows[e]],
                    cosine=round(float(block[k, e]), 4),
                )


def _cross_scores(cross: PairScorer, data: Dataset, rows: list[int], config: CurateConfig) -> np.ndarray:
    pairs = [(data.columns["anchor"][r], data.columns["positive"][r]) for r in rows]
    return np.asarray(cross.predict(pairs, batch_size=config.batch_size), dtype=np.float64).reshape(-1)


def _too_few_candidates(data: Dataset, config: CurateConfig, alive: np.ndarray) -> str | None:
    """Why the consistency check cannot remove anything (a warning too), or ``None`` when it can: with no more
    candidate texts than ``top_k``, every positive is in its anchor's top k."""
    rows = np.flatnonzero(alive).tolist()
    count = len({data.columns[c][r] for c in data.text_columns[1:] for r in rows})
    if count > config.top_k:
        return None
    message = (
        f"{data.path}: --consistency: {count} candidate texts, not more than --top-k {config.top_k}, so every "
        f"positive is in its anchor's top {config.top_k} and no pair can be removed; the check is skipped "
        f"(lower --top-k, e.g. --top-k {max(1, count // 10)}, to use it on this file)"
    )
    warnings.warn(message, UserWarning, stacklevel=3)
    return message


def _consistency(
    data: Dataset,
    model: Embedder,
    cross: PairScorer | None,
    config: CurateConfig,
    alive: np.ndarray,
    drop: Drop,
    show_progress: bool,
) -> int:
    """Drop pairs whose positive is not in the anchor's top-k of the file's candidate texts; returns rescues."""
    rows = np.flatnonzero(alive).tolist()
    candidates = sorted({data.columns[c][r] for c in data.text_columns[1:] for r in rows})
    where = {t: i for i, t in enumerate(candidates)}
    docs = _unit(model.encode(candidates, batch_size=config.batch_size, show_progress=show_progress))
    queries = _unit(
        model.encode(
            [data.columns["anchor"][r] for r in rows],
            batch_size=config.batch_size,
            show_progress=show_progress,
        )
    )
    failing: list[tuple[int, int]] = []
    for start in range(0, len(rows), 1024):
        scores = queries[start : start + 1024] @ docs.T
        for k, row in enumerate(rows[start : start + 1024]):
            own = scores[k, where[data.columns["positive"][row]]]
            rank = int((scores[k] > own).sum()) + 1
            if rank > config.top_k:
                failing.append((int(row), rank))
    rescued = 0
    cross_scores = (
        _cross_scores(cross, data, [r for r, _ in failing], config) if cross is not None and failing else None
    )
    for idx, (row, rank) in enumerate(failing):
        if cross_scores is not None and cross_scores[idx] >= config.cross_threshold:
            rescued += 1
            continue
        detail: dict[str, object] = {"rank": rank, "top_k": config.top_k}
        if cross_scores is not None:
            detail["cross_score"] = round(float(cross_scores[idx]), 4)
        drop(row, "consistency", "positive not in the anchor's top-k under the model", **detail)
    return rescued


def write_rows(data: Dataset, rows: list[int], path: str) -> None:
    """Write the kept rows (standard column names) as JSONL, or CSV/TSV by the file's suffix."""
    import csv
    import json
    from pathlib import Path

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = list(data.columns)
    columns = dict(data.columns)
    if data.label_names is not None and "label" in columns:  # class names back, as they were read
        columns["label"] = [data.label_names[int(v)] for v in columns["label"]]
    if out.suffix in (".csv", ".tsv"):
        with out.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter="\t" if out.suffix == ".tsv" else ",")
            writer.writerow(names)
            writer.writerows([columns[c][r] for c in names] for r in rows)
        return
    with out.open("w", encoding="utf-8") as handle:
        for r in rows:
            handle.write(json.dumps({c: columns[c][r] for c in names}, ensure_ascii=False) + "\n")
