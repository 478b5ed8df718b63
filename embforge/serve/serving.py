"""How the server serves each model kind: the per-kind serving record, the store contract, and the one lookup.

The server has one app and one path per endpoint; what differs by kind is data the kind's record gives
(:class:`KindServing`): how texts become batch items (token ids) with their costs as queries or documents, the
batched function the :class:`~embforge.serve.batcher.MicroBatcher` calls (one row per item: a float vector, or a
numpy object array holding a sparse row or a token matrix), how rows are written into a ``/v1/embeddings`` answer,
which ``encoding_format`` values and ``dimensions`` it can honour, how a pair of texts is scored for
``/similarity``, and the store ``/search`` and ``/index/documents`` use. Dense and static models search the
``--index`` folder (:class:`~embforge.serve.store.DocumentStore`); sparse and multi-vector models keep their
documents in memory (:class:`~embforge.serve.memory_store.MemoryStore`). Both satisfy :class:`SearchStore`.

Each kind's serving record is named by the kind's registry record (:attr:`embforge.kinds.KindRecord.serving`);
:func:`serving_for` asks the record of the kind the model declares — the one lookup from a kind to how it is served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from embforge.kinds import kind_record
from embforge.serve.middleware import ApiError

if TYPE_CHECKING:
    from embforge.serve.documents import Hit
    from embforge.serve.requests import InputType

Items = list[list[int]]  # a request's batch items: token ids, one list per text
BatchFn = Callable[[Items], np.ndarray]


class SearchStore(Protocol):
    """The documents ``/search`` and ``/index/documents`` work on, with the vectors of the kind that serves them."""

    def __len__(self) -> int: ...

    def duplicates(self, ids: Sequence[str]) -> list[int]:
        """Positions of ids that are already stored or repeated within ``ids``."""
        ...

    def add(self, documents: Sequence[Mapping[str, object]], vectors: np.ndarray) -> None:
        """Add documents (``id``, ``text``, ``fields``) with their rows; raises
        :class:`~embforge.serve.documents.DuplicateIdError` for a stored or repeated id, checked atomically with the
        write (of concurrent adds of one id exactly one succeeds)."""
        ...

    def search(self, queries: np.ndarray, k: int, *, with_text: bool = True) -> list[list[Hit]]:
        """Each query row's top ``k`` documents, best first."""
        ...

    def close(self) -> None: ...


class KindServing(Protocol):
    """What the server asks of a model kind (see the module docstring); one instance per served model."""

    name: str  # the ``kind`` of /v1/models and /health: embedding, sparse, multivector
    dim: int
    pair_inputs: tuple[InputType | None, InputType | None]  # how /similarity encodes a pair's two texts

    def batch_items(
        self,
        texts: list[str],
        *,
        input_type: InputType | None,
        prompt_name: str | None,
        task: str | None = None,
    ) -> tuple[Items, list[int]]:
        """Batch items of ``texts`` as queries or documents and their costs (tokens), encoded with the task
        adapter ``task`` (:func:`refuse_task` where the kind has none); an unknown ``prompt_name`` or ``task`` is
        an :class:`~embforge.serve.middleware.ApiError` 422."""
        ...

    def batched(self, max_tokens: int) -> BatchFn:
        """The model call of a batch: one row per item, in order."""
        ...

    def check(self, *, encoding_format: str, dimensions: int | None) -> None:
        """A 422 naming ``encoding_format`` or ``dimensions`` when this model cannot honour them."""
        ...

    def answer(
        self, rows: np.ndarray, *, encoding_format: str, dimensions: int | None
    ) -> list[dict[str, object]]:
        """The fields of each ``/v1/embeddings`` data item (``embedding`` ...), one per row."""
        ...

    def similarity(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """The score of each pair of rows (``first[i]``, ``second[i]``)."""
        ...

    def open_store(
        self, given: SearchStore | None, *, kind: str | None, options: Mapping[str, object] | None = None
    ) -> SearchStore | None:
        """The store ``/search`` uses: ``given`` (an ``--index`` folder) or the kind's own; ``kind`` and
        ``options``: the index kind and options (``--index-option``) asked for the kind's own. A store, kind or
        option this model cannot use is a ``ValueError`` saying why."""
        ...

    def describe(self) -> dict[str, object]:
        """Fields of this model's ``/v1/models`` entry beyond the common ones."""
        ...


def serving_for(model: object, *, ranges: np.ndarray | None = None) -> KindServing:
    """The serving record of ``model``'s declared kind; ``ranges``: int8/uint8 calibration ranges (dense only)."""
    record: Callable[..., KindServing] = kind_record(model).serving_class()
    return record(model, ranges=ranges)


def refuse_index_options(
    options: Mapping[str, object] | None, reason: str, *, takes: tuple[str, ...] = ()
) -> None:
    """Index options (``--index-option``) the kind's own index does not take: a ``ValueError`` naming them and
    ``reason`` (they would be dropped)."""
    unknown = sorted(set(options or {}) - set(takes))
    if unknown:
        raise ValueError(f"--index-option {', '.join(unknown)}: {reason}")


def refuse_ranges(kind: str, ranges: np.ndarray | None) -> None:
    """A kind without int8/uint8 codes given calibration ranges: a ``ValueError`` (they would be dropped)."""
    if ranges is not None:
        raise ValueError(f"calibration ranges are for dense vectors; a {kind} model has no int8/uint8 codes")


def refuse_task(kind: str, task: str | None) -> None:
    """A kind without task adapters asked for one: a 422 naming the ``task`` field."""
    if task is not None:
        raise ApiError(422, f"unknown task {task!r}: a {kind} model has no task adapters", "task")


def object_rows(values: Sequence[object]) -> np.ndarray:
    """A numpy object array with one element per value, filled element by element (``np.array`` of a list of
    arrays would broadcast them into one array): the row array of a kind whose rows are ragged."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
