"""Candidate lists for listwise distillation: a file of ``(query, candidate)`` rows -> one row per query.

Reranking data (WikiQA, a retriever's top-k, ``embforge rerank`` output) comes as one row per (query, candidate).
:func:`candidate_lists` groups those rows by their query into rows ``anchor, positive, negative_1..k`` of exactly
``size`` candidates, the shape ``kl_distill`` / ``margin_mse`` read once a teacher has scored them
(``embforge score --lists SIZE``). Labels are dropped: the teacher's scores replace them, so unlabelled candidate
lists train too. ``positive`` is only the first candidate's column name (``kl_distill`` treats every candidate
alike).

- A query with more than ``size`` distinct candidates is split into several rows (consecutive chunks).
- A row with fewer is topped up with candidates of *other* queries drawn at random (``seed``): easy negatives
  the teacher scores low, so the listwise softmax still has ``size`` entries.

Example:
    >>> rows = Dataset("p", {"sentence1": ["q1", "q1", "q2"], "sentence2": ["a", "b", "c"]}, [1, 2, 3])
    >>> lists = candidate_lists(rows, size=2)
    >>> lists.columns["anchor"], lists.columns["positive"], lists.columns["negative_1"]
    (['q1', 'q2'], ['a', 'c'], ['b', 'b'])
"""

from __future__ import annotations

import numpy as np

from embforge.data.tables import Dataset


def _groups(queries: list[str], candidates: list[str]) -> tuple[list[str], list[np.ndarray]]:
    """Distinct queries in file order and, for each, the row positions of its distinct candidates."""
    pairs = np.asarray([f"{q}\x00{c}" for q, c in zip(queries, candidates)], dtype=object)
    _, first_pair = np.unique(pairs, return_index=True)
    rows = np.sort(first_pair)  # one row per distinct (query, candidate), file order
    names, first, inverse = np.unique(
        np.asarray(queries, dtype=object)[rows], return_index=True, return_inverse=True
    )
    order = np.argsort(first, kind="stable")  # queries in order of appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group = rank[inverse]
    by_group = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[by_group], np.arange(1, len(order)))
    return [str(names[i]) for i in order], np.split(rows[by_group], bounds)


def candidate_lists(data: Dataset, *, size: int, seed: int = 0) -> Dataset:
    """Rows ``anchor, positive, negative_1..size-1``: each query of ``data`` with ``size`` of its candidates.

    ``data``'s first text column is the query, its second the candidate (``sentence1, sentence2`` or
    ``anchor, positive``); other columns and labels are ignored. Raises ``ValueError`` for ``size < 2``, fewer
    than two text columns, or a file with a single query (nothing to top a short list up with).
    """
    if size < 2:
        raise ValueError(
            f"a candidate list needs at least 2 candidates (a softmax over one is constant), got {size}"
        )
    columns = data.text_columns
    if len(columns) < 2:
        raise ValueError(f"{data.path}: candidate lists need a query and a candidate column, found {columns}")
    queries, candidates = data.columns[columns[0]], data.columns[columns[1]]
    names, groups = _groups(queries, candidates)
    if len(names) < 2:
        raise ValueError(
            f"{data.path}: one query only; short lists are topped up with other queries' candidates"
        )
    owner = np.empty(len(queries), dtype=np.int64)
    for g, rows in enumerate(groups):
        owner[rows] = g
    pool = np.concatenate(groups)  # every distinct (query, candidate) row
    rng = np.random.default_rng(seed)
    anchors: list[str] = []
    lists: list[np.ndarray] = []
    for g, rows in enumerate(groups):
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            others = pool[owner[pool] != g]
            need = size - len(chunk)
            fill = rng.choice(others, size=need, replace=need > len(others))
            anchors.append(names[g])
            lists.append(np.concatenate([chunk, fill]))
    table = np.asarray(candidates, dtype=object)[np.stack(lists)]
    names_out = ["positive", *(f"negative_{j}" for j in range(1, size))]
    out = {"anchor": anchors, **{name: table[:, j].tolist() for j, name in enumerate(names_out)}}
    return Dataset(f"{data.path} (lists of {size})", out, list(range(1, len(anchors) + 1)))
