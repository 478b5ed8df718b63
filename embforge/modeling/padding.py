"""Turning token-id lists into padded tensors, with as little padding as possible."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


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


def pad_ids(
    ids: Sequence[Sequence[int]], pad_id: int, *, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """Right-pad sequences to the longest one: ``(input_ids, attention_mask)`` as long tensors."""
    width = max(len(seq) for seq in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return input_ids.to(device), mask.to(device)
