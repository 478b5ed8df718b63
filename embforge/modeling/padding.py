"""Turning token-id lists into padded tensors and length-sorted chunks, with as little padding as possible."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, pairwise
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from embforge.modeling.dropout import mix

T = TypeVar("T")


def sort_by_length(ids: Sequence[Sequence[int]]) -> list[int]:
    """Indices of ``ids`` from the longest sequence to the shortest (stable)."""
    return sorted(range(len(ids)), key=lambda i: -len(ids[i]))


def token_budget_chunks(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split positions of length-sorted (descending) sequences into chunks of at most ``max_tokens`` padded tokens.

    Every chunk holds at least one sequence, so a sequence longer than the budget still gets through.
    """
    chunks: list[list[int]] = []
    current: list[int] = []
    width = 0
    for pos, length in enumerate(lengths):
        new_width = max(width, length)
        if current and new_width * (len(current) + 1) > max_tokens:
            chunks.append(current)
            current, new_width = [], length
        current.append(pos)
        width = new_width
    if current:
        chunks.append(current)
    return chunks


ATTENTION_GROUPS = 4  # attention groups of a packed forward (before the token budget splits any)
BLOCK_TOKENS = 1 << 16  # default budget of one attention block of the packed forward (padded tokens)
CHUNK_TOKENS = 1 << 14  # default budget of one padded chunk (a whole model's forward and backward over it)


def plan_groups(
    lengths: np.ndarray, max_tokens: int, *, groups: int = ATTENTION_GROUPS
) -> list[tuple[int, int]]:
    """``(first, texts)`` of each attention group over length-sorted (descending) ``lengths``.

    The span from the longest to the shortest length is cut into ``groups`` equal steps of log-length (texts of
    8 to 64 tokens: widths within a factor of 1.7 share a group), so a forward has at most ``groups`` attention
    groups whatever its number of texts — each group costs a few operations per layer, kernel launches on an
    accelerator — and pads only inside attention. A group over ``max_tokens`` padded tokens is split (each
    piece holds at least one text).
    """
    longest, shortest = float(lengths[0]), float(lengths[-1])
    if longest == shortest:
        index = np.zeros(len(lengths), dtype=np.int64)
    else:
        steps = np.log(longest / lengths) / np.log(longest / shortest) * groups
        index = np.minimum(groups - 1, np.floor(steps)).astype(np.int64)
    bounds = [0, *(np.flatnonzero(np.diff(index)) + 1).tolist(), len(lengths)]
    planned = []
    for begin, end in pairwise(bounds):
        per_group = max(1, max_tokens // int(lengths[begin]))
        planned += [(first, min(per_group, end - first)) for first in range(begin, end, per_group)]
    return planned


def token_chunks(lengths: Sequence[int], budget: int) -> list[range]:
    """Consecutive positions of ``lengths`` in chunks of at most ``budget`` tokens (each holds at least one)."""
    chunks, start, used = [], 0, 0
    for pos, length in enumerate(lengths):
        if pos > start and used + length > budget:
            chunks.append(range(start, pos))
            start, used = pos, 0
        used += length
    if start < len(lengths):
        chunks.append(range(start, len(lengths)))
    return chunks


def pad_ids(
    ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    device: torch.device | str | None = None,
    side: str = "right",
) -> tuple[Tensor, Tensor]:
    """Pad sequences to the longest one: ``(input_ids, attention_mask)`` as long tensors.

    ``side="left"`` puts the padding first (decoder tokenizers such as Qwen3-Embedding's pad on the left). Built
    on the host with NumPy in a fixed number of passes (no tensor operation per text).
    """
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    width = int(lengths.max())
    columns = np.arange(width)[None, :]
    real = columns >= (width - lengths)[:, None] if side == "left" else columns < lengths[:, None]
    input_ids = np.full((len(ids), width), pad_id, dtype=np.int64)
    input_ids[real] = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    mask = torch.from_numpy(real.astype(np.int64))
    return torch.from_numpy(input_ids).to(device), mask.to(device)


def in_length_chunks(
    items: Sequence[T],
    max_tokens: int,
    forward: Callable[[list[T]], Tensor],
    *,
    lengths: Sequence[int] | None = None,
    seed: int | None = None,
    places: Sequence[int] | None = None,
) -> Tensor:
    """``forward`` over length-sorted chunks of similar lengths (:func:`plan_groups`:
    a few groups of similar lengths, at most ``max_tokens`` padded tokens each), outputs in the input order.

    With ``seed`` (training), each chunk runs under torch's generator seeded from ``(seed, place of the chunk's
    first item)``, so a chunk's dropout masks are the same whenever the same chunk is forwarded again (the cached
    step's second pass) — though, unlike the padding-free path, they depend on how items were chunked.
    """
    sizes = [len(item) for item in items] if lengths is None else list(lengths)  # type: ignore[arg-type]
    order = sorted(range(len(items)), key=lambda i: -sizes[i])
    where = list(range(len(items))) if places is None else list(places)
    parts = []
    for first, count in plan_groups(np.array([sizes[i] for i in order]), max_tokens):
        chunk = range(first, first + count)
        members = [items[order[i]] for i in chunk]
        if seed is None:
            parts.append(forward(members))
            continue
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(mix(seed, where[order[chunk[0]]]))
            parts.append(forward(members))
    out = torch.cat(parts)
    inverse = torch.empty(len(order), dtype=torch.long, device=out.device)
    inverse[torch.as_tensor(order, device=out.device)] = torch.arange(len(order), device=out.device)
    return out[inverse]


def set_backbone_checkpointing(backbone: Any, enabled: bool) -> None:
    """Turn a Hugging Face model's own gradient checkpointing on or off (used by its padded forward)."""
    if not getattr(backbone, "supports_gradient_checkpointing", False):
        if enabled:
            raise ValueError(f"{type(backbone).__name__} does not support gradient checkpointing")
        return
    # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (the old names warn); older
    # releases have only the old ones
    if hasattr(backbone, "activation_checkpointing_enable"):
        if enabled:
            backbone.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif backbone.is_activation_checkpointing:
            backbone.activation_checkpointing_disable()
    elif enabled:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif backbone.is_gradient_checkpointing:
        backbone.gradient_checkpointing_disable()
