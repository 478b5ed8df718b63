"""One task's batches in one pass over (a window of) its rows: shuffled, grouped by length, texts kept distinct.

:mod:`embforge.training.sampling` plans which task gives each batch and asks this module for that task's rows.
Tasks whose loss uses in-batch negatives (:func:`uses_in_batch_negatives`) get their rows' texts as ``distinct``
keys (:class:`TextKeys`): a batch never holds the same text twice, as a duplicate would be scored as a negative of
itself.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

if TYPE_CHECKING:
    from embforge.protocols import Loss

T_co = TypeVar("T_co", covariant=True)


class Sliced(Protocol[T_co]):
    """Per-row values read by slices (``values[start:end]``): a list, or a task's lengths or keys computed for a
    window of rows when it is asked for."""

    def __getitem__(self, span: slice, /) -> Sequence[T_co]: ...


def _order(size: int, rng: np.random.Generator, lengths: Sequence[int] | None, mega: int) -> list[int]:
    order = rng.permutation(size)
    if lengths is not None and size:
        order = np.concatenate(
            [sorted(order[i : i + mega], key=lambda r: -lengths[r]) for i in range(0, size, mega)]
        )
    return [int(r) for r in order]


def _cut(
    order: list[int], batch_size: int, keys: Sequence[Sequence[Hashable]] | None
) -> list[tuple[int, ...]]:
    """Cut ``order`` into batches; with ``keys``, no two rows in one batch share a key (rows that would are
    moved to the next batch that has room for them, so every row is still used once)."""
    if keys is None:
        return [tuple(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    batches: list[tuple[int, ...]] = []
    pending = list(order)
    while pending:
        batch: list[int] = []
        seen: set[Hashable] = set()
        deferred: list[int] = []
        for i, row in enumerate(pending):
            row_keys = set(keys[row])
            if seen.isdisjoint(row_keys):
                batch.append(row)
                seen |= row_keys
                if len(batch) == batch_size:
                    deferred.extend(pending[i + 1 :])
                    break
            else:
                deferred.append(row)
        batches.append(tuple(batch))
        pending = deferred
    return batches


def task_batches(
    size: int,
    batch_size: int,
    rng: np.random.Generator,
    *,
    lengths: Sequence[int] | None = None,
    distinct: Sequence[Sequence[Hashable]] | None = None,
    group_factor: int = 50,
) -> list[tuple[int, ...]]:
    """Shuffle ``range(size)`` into batches; every row appears exactly once (some batches may be short).

    With ``lengths`` (length-grouped batching), rows are shuffled, cut into mega-batches of
    ``group_factor * batch_size`` rows, sorted by length inside each, and the resulting batches shuffled: batches
    hold texts of similar length (less padding) while staying random across the epoch. With ``distinct``
    (the texts of each row), no text occurs twice in a batch.
    """
    order = _order(size, rng, lengths, group_factor * batch_size)
    batches = _cut(order, batch_size, distinct)
    if lengths is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


class _Slices(Sequence[tuple[int, ...]]):
    """Batches as consecutive slices of a shuffled order (no grouping, no distinct texts): 8 bytes per row, and
    each batch's tuple made only when it is asked for (a 10M-row pass is one array, not 300k tuples)."""

    def __init__(self, order: np.ndarray, batch_size: int) -> None:
        self.order, self.batch_size = order, batch_size

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch_size)

    def __getitem__(self, j):  # noqa: ANN001 (Sequence's overloads)
        if not 0 <= j < len(self):
            raise IndexError(j)
        return tuple(int(r) for r in self.order[j * self.batch_size : (j + 1) * self.batch_size])


def window_batches(
    size: int,
    batch_size: int,
    rng: np.random.Generator,
    *,
    lengths: Sequence[int] | None = None,
    distinct: Sequence[Sequence[Hashable]] | None = None,
) -> Sequence[tuple[int, ...]]:
    """:func:`task_batches`, kept as one shuffled array when there is nothing to group or keep distinct."""
    if lengths is None and distinct is None:
        return _Slices(rng.permutation(size), batch_size)
    return task_batches(size, batch_size, rng, lengths=lengths, distinct=distinct)


def uses_in_batch_negatives(loss: Loss) -> bool:
    """Whether a loss scores each row against the other rows of its batch (its declared ``in_batch_negatives``;
    see :class:`embforge.losses.base.BaseLoss`), so duplicates in a batch are false negatives."""
    return loss.in_batch_negatives


def row_texts(columns: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Per row, the texts of all its text columns (the keys that must stay distinct inside a batch)."""
    return [tuple(dict.fromkeys(texts)) for texts in zip(*columns)] if columns else []


class TextKeys:
    """Each row's texts (the keys that must stay distinct in a batch), read from a row source by slices
    (``keys[start:end]``): a window's keys, never the whole corpus's unless the window is the whole task."""

    def __init__(self, source: Any, columns: Sequence[str]) -> None:
        self.source, self.columns = source, list(columns)

    def __getitem__(self, span: slice) -> list[tuple[str, ...]]:
        rows = self.source.rows(span.start or 0, span.stop)
        return row_texts([rows[c] for c in self.columns])
