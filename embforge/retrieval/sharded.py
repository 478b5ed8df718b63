"""Sharded encoding under ``torchrun``: every rank embeds its share of the texts; every rank gets all vectors.

``torchrun --nproc-per-node N -m embforge encode|index build|mine|eval retrieval ...`` wraps the model in a
:class:`ShardedEncoder` (:func:`sharded`). Its ``encode`` gives the same vectors as one process, bit for bit:

:meth:`embforge.encoder.Encoder.encode` sorts the texts by token length and cuts that order into forward
passes (``batch_plan``: batches of ``batch_size`` texts, or token-budget chunks for a padding-free forward); a
forward's output for a text depends, in the last bits, on the other texts of its batch, so each rank takes a
contiguous range of whole batches of that same plan, encodes it with the same batch boundaries (the plan is
greedy from its first text), and the ranks exchange their rows (all-gather). Token lengths are counted in shares and exchanged too, so no rank tokenises the whole corpus
twice.

:func:`embforge.retrieval.corpus_cache.encode_corpus` with a sharded model splits each block this way; rank 0
alone writes the folder (embeddings, ids, progress) and decides which blocks are left to encode when resuming.
Callers that write outputs (the CLI verbs) write them on rank 0 (:func:`embforge.parallel.is_main`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import numpy as np

from embforge.parallel import (
    all_gather_objects,
    init_from_env,
    is_main,
    rank,
    spans_for,
    world_size,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from embforge.protocols import BatchEmbedder, EncodeOptions

T = TypeVar("T")
E = TypeVar("E", bound="BatchEmbedder | None")


class ShardedEncoder:
    """An encoder whose :meth:`encode` is split across the process group's ranks (see the module docstring).

    Everything else (``dim``, ``tokenize_ids``, ``state_dict``, ...) is the wrapped model's.
    """

    def __init__(self, model: BatchEmbedder) -> None:
        self.wrapped = model
        self.shards = world_size()

    def __getattr__(self, name: str) -> Any:  # a proxy: any attribute of the wrapped model, whatever its type
        return getattr(self.wrapped, name)

    def encode(self, texts: str | Sequence[str], **options: Unpack[EncodeOptions]) -> np.ndarray:
        """``model.encode(texts, **options)``, each rank encoding a contiguous range of its length-sorted batches
        (rank 0 alone shows progress and calls ``on_batch``, for all texts)."""
        model = self.wrapped
        if isinstance(texts, str) or self.shards == 1:
            return model.encode(texts, **options)
        texts = list(texts)
        me, main = rank(), is_main()
        start, end = spans_for(len(texts), self.shards)[me]
        prefix = model.prompt_text(options.get("prompt"), options.get("prompt_name"))
        local_lengths = [len(ids) for ids in model.tokenize_ids(texts[start:end], prefix=prefix)]
        lengths = [n for part in all_gather_objects(local_lengths) for n in part]
        order = sorted(range(len(texts)), key=lambda i: -lengths[i])  # Encoder.encode's (stable) order
        batch_size = options.get("batch_size", 32)  # the model's default
        plan = model.batch_plan([lengths[i] for i in order], batch_size)  # the single process's forwards
        first, last = spans_for(len(plan), self.shards)[me]
        rows = order[plan[first].start : plan[last - 1].stop] if first < last else []
        on_batch = options.get("on_batch") if main else None
        if not main:
            options = {**options, "show_progress": False, "on_batch": None}
        local = model.encode([texts[i] for i in rows], **options)
        parts = all_gather_objects((rows, np.asarray(local, dtype=np.float32)))
        out = np.empty((len(texts), parts[0][1].shape[1]), dtype=np.float32)
        for part_rows, vectors in parts:
            out[part_rows] = vectors
        if on_batch is not None:  # the other ranks' texts, for a caller's progress bar
            on_batch(len(texts) - len(rows))
        return out


def sharded(model: E) -> E | ShardedEncoder:
    """``model`` wrapped in a :class:`ShardedEncoder` when this process runs under torchrun with more than one
    process (joining the process group), else ``model`` itself."""
    if model is None or isinstance(model, ShardedEncoder) or init_from_env() == 1:
        return model
    return ShardedEncoder(model)


@overload
def unwrapped(model: ShardedEncoder) -> BatchEmbedder: ...


@overload
def unwrapped(model: T) -> T: ...


def unwrapped(model: object) -> object:
    """The model inside a :class:`ShardedEncoder` (fingerprints and saved identities are the model's)."""
    return model.wrapped if isinstance(model, ShardedEncoder) else model


def is_sharded(model: object) -> bool:
    return isinstance(model, ShardedEncoder) and model.shards > 1


def broadcast_from_main(value: T, model: object) -> T:
    """Rank 0's ``value`` on every rank when ``model`` is sharded (else ``value``)."""
    if not is_sharded(model):
        return value
    return cast("T", all_gather_objects(value if is_main() else None)[0])  # rank 0 sent a T
