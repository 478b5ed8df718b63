"""Turning token-id lists into padded tensors and length-sorted chunks, with as little padding as possible."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
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


def length_buckets(lengths: np.ndarray) -> np.ndarray:
    """Bucket of each length: lengths within a factor of about sqrt(2) share one (attention blocks then pad at
    most ~2x the attention work of their longest text, and a batch has at most ~18 buckets up to 512 tokens)."""
    return np.ceil(2 * np.log2(np.maximum(lengths, 1))).astype(np.int64)


def plan_groups(lengths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """``(first, texts)`` of each attention group over length-sorted (descending) ``lengths``: a new group where
    the length bucket changes, or where a group would exceed ``max_tokens`` padded tokens (each group holds at
    least one text). The number of groups depends on the spread of lengths, not on the batch size, unless the
    budget binds."""
    starts = np.flatnonzero(np.diff(length_buckets(lengths))) + 1
    bounds = [0, *starts.tolist(), len(lengths)]
    groups = []
    for begin, end in pairwise(bounds):
        per_group = max(1, max_tokens // int(lengths[begin]))
        groups += [(first, min(per_group, end - first)) for first in range(begin, end, per_group)]
    return groups


def pad_ids(
    ids: Sequence[Sequence[int]],
    pad_id: int,
    *,
    device: torch.device | str | None = None,
    side: str = "right",
) -> tuple[Tensor, Tensor]:
    """Pad sequences to the longest one: ``(input_ids, attention_mask)`` as long tensors.

    ``side="left"`` puts the padding first (decoder tokenizers such as Qwen3-Embedding's pad on the left).
    """
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    width = max(len(seq) for seq in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        cols = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        input_ids[row, cols] = torch.as_tensor(seq, dtype=torch.long)
        mask[row, cols] = 1
    return input_ids.to(device), mask.to(device)


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
    within a factor of ~sqrt(2), at most ``max_tokens`` padded tokens), outputs in the input order.

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
