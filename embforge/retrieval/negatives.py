"""Which ranked candidates become negatives, as array operations over a block of queries (no loop over queries).

:func:`filtered` drops the candidates a margin or ``max_score`` rules out, :func:`pick_hard` takes the hard
negatives among the survivors (after ``skip_top``), :func:`random_negatives` draws the uniform ones. Their order and
meaning are :mod:`embforge.retrieval.mining`'s, which calls them.
"""

from __future__ import annotations

import numpy as np


def filtered(
    scores: np.ndarray,
    valid: np.ndarray,
    ref: np.ndarray,
    stats: dict[str, int],
    *,
    relative_margin: float | None,
    absolute_margin: float | None,
    max_score: float | None,
) -> np.ndarray:
    """Mask of the valid candidates that a margin or ``max_score`` drops; ``ref (q, 1)``: lowest positive score.

    ``scores`` come from whichever scorer ranked the candidates (retriever or cross-encoder); drops are counted
    in ``stats`` per filter, in order (a candidate is counted by the first filter that drops it).
    """
    drop = np.zeros_like(valid)
    for name, threshold in (
        (
            "relative_margin",
            None if relative_margin is None else ref - np.abs(ref) * relative_margin,
        ),
        ("absolute_margin", None if absolute_margin is None else ref - absolute_margin),
        ("max_score", max_score),
    ):
        if threshold is None:
            continue
        new = valid & ~drop & (scores > threshold)
        stats[f"skipped_{name}"] = int(new.sum())
        drop |= new
    return drop


def pick_hard(valid: np.ndarray, n_hard: int, *, skip_top: int, sampling: str, seed: int) -> np.ndarray:
    """Column positions of the ``n_hard`` chosen candidates per row (rank order), -1 where too few survive: the
    first ones after ``skip_top`` valid ones (``sampling="top"``), or a random sample of those."""
    if n_hard == 0:
        return np.empty((len(valid), 0), dtype=np.int64)
    usable = valid & (np.cumsum(valid, axis=1) > skip_top)
    if sampling == "random":
        rng = np.random.default_rng(seed)
        keys = np.where(usable, rng.random(usable.shape), np.inf)
        chosen = np.argsort(keys, axis=1, kind="stable")[:, :n_hard]
        ok = np.take_along_axis(usable, chosen, axis=1)
        chosen = np.sort(np.where(ok, chosen, np.iinfo(np.int64).max), axis=1)
        return np.where(chosen == np.iinfo(np.int64).max, -1, chosen)
    order = np.argsort(~usable, axis=1, kind="stable")[:, :n_hard]
    ok = np.take_along_axis(usable, order, axis=1)
    return np.where(ok, order, -1)


def random_negatives(chosen: np.ndarray, pos_keys: np.ndarray, n_docs: int, n: int, seed: int) -> np.ndarray:
    """``n`` uniform corpus positions per row, never a known positive nor an already chosen negative."""
    rng = np.random.default_rng(seed + 1)
    n_q = len(chosen)
    draws = rng.integers(0, n_docs, size=(n_q, 4 * n + 8))
    bad = np.isin(np.arange(n_q)[:, None] * n_docs + draws, pos_keys)
    bad |= (draws[:, :, None] == chosen[:, None, :]).any(axis=2)
    # a repeated draw within the row is also bad: keep the first occurrence only
    sorted_idx = np.argsort(draws, axis=1, kind="stable")
    sorted_draws = np.take_along_axis(draws, sorted_idx, axis=1)
    repeat = np.zeros_like(bad)
    repeat_sorted = np.concatenate(
        [np.zeros((n_q, 1), bool), sorted_draws[:, 1:] == sorted_draws[:, :-1]], axis=1
    )
    np.put_along_axis(repeat, sorted_idx, repeat_sorted, axis=1)
    bad |= repeat
    order = np.argsort(bad, axis=1, kind="stable")[:, :n]
    picked = np.take_along_axis(draws, order, axis=1)
    return np.where(np.take_along_axis(bad, order, axis=1), -1, picked)
