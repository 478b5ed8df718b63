"""A padding-free batch: tokenised texts sorted by length, concatenated, and planned into attention blocks.

:func:`pack` does the host work (a few NumPy passes over the token ids, one loop over the attention groups) and
sends a fixed number of tensors to the device. A :class:`PackedBatch` then says where every token sits in the one
padded buffer that holds all groups' attention blocks: :func:`to_blocks` and :func:`from_blocks` move a layer's
tokens there and back in one operation each, :func:`group_rows` cuts the buffer into its groups, and
:func:`flash_varlen` is the no-groups alternative on CUDA. The forwards that consume it are
:mod:`embforge.modeling.packing` (BERT) and :mod:`embforge.modeling.decoder_packing` (decoders).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from embforge.modeling.padding import plan_groups


@dataclass
class AttentionGroup:
    """Texts ``[first, first + texts)`` of the packed order, attended as one padded ``(texts, width)`` block whose
    rows start at row ``block`` of the batch's padded buffer (:func:`to_blocks`)."""

    first: int
    texts: int
    width: int
    block: int
    key_mask: Tensor | None  # (texts, 1, 1, width) True where a key is a real token; None: no padding


@dataclass
class PackedBatch:
    """Texts sorted by length (longest first) and concatenated: what :func:`packed_hidden` consumes.

    ``inverse`` puts per-text outputs (in packed order) back into the caller's order. Attention runs per group of
    texts of similar length; ``slots`` places every token in one padded buffer holding all groups' blocks, so
    moving a layer's tokens into blocks and back is one operation each, whatever the number of texts.
    """

    input_ids: Tensor  # (tokens,)
    position_ids: Tensor  # (tokens,)
    token_type_ids: Tensor | None  # (tokens,) or None
    lengths: Tensor  # (texts,) tokens per text, packed order
    offsets: Tensor  # (texts,) first token of each text
    segment: Tensor  # (tokens,) packed index of each token's text
    groups: list[AttentionGroup]
    inverse: Tensor  # (texts,) packed position of the caller's i-th text
    slots: Tensor | None  # (tokens,) each token's row in the padded buffer; None: no padding at all
    padded_rows: int  # rows of the padded buffer
    longest: int  # the longest text's tokens
    keys: Tensor | None = None  # per-text dropout keys, packed order (embforge.modeling.dropout); None: none

    @property
    def num_texts(self) -> int:
        return int(self.lengths.shape[0])


def pack(
    ids: Sequence[Sequence[int]],
    *,
    max_tokens: int,
    token_type_ids: Sequence[Sequence[int] | None] | None = None,
    keys: Tensor | None = None,
    attended: Sequence[int] | np.ndarray | None = None,
    device: torch.device | str | None = None,
) -> PackedBatch:
    """Sort tokenised texts by length, concatenate them, and plan the attention blocks.

    The host work is a few NumPy passes over the token ids (no Python loop over tokens) and one loop over the
    attention groups; the device receives a fixed number of tensors.

    Args:
        ids: Token ids of each text (already truncated, no padding).
        max_tokens: Padded-token budget of one attention block (texts of similar length share a block).
        token_type_ids: Segment ids per text (cross-encoder pairs), or None.
        keys: Dropout key of each text, input order (:func:`embforge.modeling.dropout.text_keys`); None: none.
        attended: How many leading tokens of each text are attention keys (None: all). The others are rows that
            attend but are not attended to, as a padded forward's positions with attention mask 0 (ColBERT's query
            expansion tokens).
        device: Where the tensors go (the model's device).
    """
    if not ids:
        raise ValueError("pack() needs at least one text")
    sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if sizes.min() < 1:
        raise ValueError("pack() got an empty token sequence")
    order = np.argsort(-sizes, kind="stable")
    lengths = sizes[order]
    total = int(lengths.sum())
    flat = np.fromiter(chain.from_iterable(map(ids.__getitem__, order)), dtype=np.int64, count=total)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    segment = np.repeat(np.arange(len(order)), lengths)
    positions = np.arange(total) - offsets[segment]
    types = None
    if token_type_ids is not None and token_type_ids[int(order[0])] is not None:
        chosen = (token_type_ids[i] or [0] * int(sizes[i]) for i in order.tolist())
        types = np.fromiter(chain.from_iterable(chosen), dtype=np.int64, count=total)
    keyed = None
    if attended is not None:
        keyed = positions < np.asarray(attended, dtype=np.int64)[order][segment]
    groups, slots, real = _blocks_plan(lengths, segment, positions, max_tokens, keyed)
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order))

    def put(array: np.ndarray) -> Tensor:
        return torch.from_numpy(array).to(device)

    real_mask = None if real is None else put(real)
    return PackedBatch(
        input_ids=put(flat),
        position_ids=put(positions),
        token_type_ids=None if types is None else put(types),
        lengths=put(lengths),
        offsets=put(offsets),
        segment=put(segment),
        groups=[
            AttentionGroup(
                first,
                texts,
                width,
                block,
                _key_mask(real_mask, block, texts, width) if padded and real_mask is not None else None,
            )
            for first, texts, width, block, padded in groups
        ],
        inverse=put(inverse),
        slots=None if slots is None else put(slots),
        padded_rows=groups[-1][3] + groups[-1][1] * groups[-1][2],
        longest=int(lengths[0]),
        keys=None if keys is None else keys.index_select(0, put(order)),
    )


def _blocks_plan(
    lengths: np.ndarray,
    segment: np.ndarray,
    positions: np.ndarray,
    max_tokens: int,
    keyed: np.ndarray | None = None,
) -> tuple[list[tuple[int, int, int, int, bool]], np.ndarray | None, np.ndarray | None]:
    """``(first, texts, width, block, masked)`` per group, each token's row in the padded buffer (None when nothing is
    padded) and which rows of the buffer are attention keys (real tokens, and of those the ``keyed`` ones; None
    when every row is one). ``masked``: the group has a row that is not a key."""
    groups: list[tuple[int, int, int, int, bool]] = []
    row_of_text = np.empty(len(lengths), dtype=np.int64)
    block = 0
    for first, texts in plan_groups(lengths, max_tokens):
        width = int(lengths[first])
        row_of_text[first : first + texts] = block + width * np.arange(texts)
        padded = int(lengths[first + texts - 1]) < width
        if keyed is not None and not padded:  # texts of one length: the group's tokens are contiguous
            start = int(np.searchsorted(segment, first))
            padded = not bool(keyed[start : start + texts * width].all())
        groups.append((first, texts, width, block, padded))
        block += texts * width
    if block == len(segment):  # no padding: the buffer is the packed tokens
        return groups, None, None if keyed is None or bool(keyed.all()) else keyed
    slots = row_of_text[segment] + positions
    real = np.zeros(block, dtype=bool)
    real[slots] = True if keyed is None else keyed
    return groups, slots, real


def _key_mask(real: Tensor, block: int, texts: int, width: int) -> Tensor:
    return real[block : block + texts * width].view(texts, 1, 1, width)


def to_blocks(x: Tensor, batch: PackedBatch) -> Tensor:
    """Token rows ``(tokens, ...)`` placed in the padded buffer ``(padded_rows, ...)`` (zeros in the padding)."""
    if batch.slots is None:
        return x
    return x.new_zeros(batch.padded_rows, *x.shape[1:]).index_copy(0, batch.slots, x)


def from_blocks(x: Tensor, batch: PackedBatch) -> Tensor:
    """The real tokens' rows of a padded buffer, back in packed order."""
    return x if batch.slots is None else _Unpad.apply(x, batch.slots)


class _Unpad(torch.autograd.Function):
    """``x.index_select(0, slots)`` for distinct ``slots``, whose gradient is then a copy into zeros
    (``index_copy_``) rather than ``index_select``'s accumulating ``index_add_`` — on a CPU a serial scatter-add,
    ~1.3 s of a 46 s MiniLM ColBERT step (16 x 180-token texts) on a loaded 2-core VM."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, slots: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(slots)
        ctx.rows = x.shape[0]  # type: ignore[attr-defined]
        return x.index_select(0, slots)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (slots,) = ctx.saved_tensors  # type: ignore[attr-defined]
        out = grad.new_zeros(ctx.rows, *grad.shape[1:])  # type: ignore[attr-defined]
        return out.index_copy_(0, slots, grad), None


def group_rows(buffer: Tensor, batch: PackedBatch) -> tuple[Tensor, ...]:
    """Each group's ``(texts * width, ...)`` rows of a padded buffer, as views (one ``split``: its backward
    concatenates the groups' gradients once, where slicing would zero a whole buffer per group)."""
    return buffer.split([g.texts * g.width for g in batch.groups])


def flash_varlen(batch: PackedBatch, hidden: Tensor) -> tuple[Any, Tensor, int] | None:
    """``(flash_attn_varlen_func, cu_seqlens, longest text)`` on CUDA when flash-attn is installed, else None:
    attention over all packed texts in one call, no groups, no padding."""
    if hidden.device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
        return None
    from flash_attn import flash_attn_varlen_func

    cu_seqlens = F.pad(batch.lengths.cumsum(0), (1, 0)).to(torch.int32)
    return flash_attn_varlen_func, cu_seqlens, batch.longest
