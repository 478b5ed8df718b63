"""Padding-free forward for BERT-family encoders: the big matrix products see only real tokens.

Training batches of short, uneven texts spend a third of their matrix work on padding even when sorted by length
(STS-B, batch 16 pairs: ~460 real tokens against ~707 padded in 512-token chunks). Here the texts of a batch are
concatenated into one ``(tokens, hidden)`` matrix: embeddings, the query/key/value projections, the feed-forward
layers and the layer norms run on it directly. Only attention needs per-text blocks: the tokens are copied into
one padded buffer (one operation) in which each group of texts of similar length (length-sorted, at most four
groups, at most ``max_tokens`` padded tokens each) is a ``(texts, heads, width, head_dim)`` block that
attends with a key mask through ``scaled_dot_product_attention``, and copied back (one operation). The work per
forward is a fixed number of tensor operations per layer plus a few per attention group, and the number of
groups follows the spread of lengths, not the number of texts. The backbone's own submodules and weights are called, so the output equals the padded forward
(tested ≤ 1e-5, gradients too) and training updates the same parameters. In training, dropout masks are keyed by
text (:mod:`embforge.modeling.dropout`), so how texts are grouped or split into mini-batches never changes them.

Covered: Hugging Face ``BertModel`` (BERT, MiniLM, BGE, E5, ...), and ``BertForSequenceClassification`` heads for
cross-encoders. Other architectures use the padded path.
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
from torch.utils.checkpoint import checkpoint

from embforge.modeling.attention import dropped_attention, written_attention
from embforge.modeling.dropout import (
    SITE_ATTENTION_OUTPUT,
    SITE_FEED_FORWARD,
    AttentionSites,
    HiddenSites,
    LayerMasks,
    head_mask,
    layer_keys,
)
from embforge.modeling.lora import uses_adapters
from embforge.modeling.padding import plan_groups


def supports_packing(backbone: object) -> bool:
    """Whether ``backbone`` is an encoder-only ``BertModel`` whose layers :func:`packed_hidden` can drive."""
    config = getattr(backbone, "config", None)
    return (
        not uses_adapters(backbone)  # LoRA layers replace the Linear modules this forward reads weights from
        and type(backbone).__name__ == "BertModel"
        and config is not None
        and not getattr(config, "is_decoder", False)
        and getattr(config, "position_embedding_type", "absolute") == "absolute"
    )


def supports_packed_classifier(model: Any) -> bool:
    """Whether ``model`` is a ``BertForSequenceClassification`` (pooler + dropout + linear head over a BERT)."""
    return (
        type(model).__name__ == "BertForSequenceClassification"
        and supports_packing(getattr(model, "bert", None))
        and model.bert.pooler is not None
    )


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


def _attend(qkv: Tensor, batch: PackedBatch, heads: int, scale: float, masks: LayerMasks | None) -> Tensor:
    """Self-attention of each text over its own tokens: ``(tokens, 3 * hidden)`` -> ``(tokens, hidden)``.

    Without dropout masks (inference, evaluation, or no attention dropout): on CUDA in fp16/bf16 with flash-attn
    installed, its varlen kernel over all texts in one call; else ``scaled_dot_product_attention`` per group
    (its fused kernel). With masks the attention is written out (scores, key mask, softmax, keyed dropout,
    values).
    """
    hidden = qkv.shape[1] // 3
    drops = masks is not None and masks.drops is not None
    varlen = None if drops or qkv.dtype not in (torch.float16, torch.bfloat16) else flash_varlen(batch, qkv)
    if varlen is not None:
        flash, cu_seqlens, longest = varlen
        q, k, v = qkv.view(qkv.shape[0], 3, heads, hidden // heads).unbind(1)
        out = flash(q, k, v, cu_seqlens, cu_seqlens, longest, longest, softmax_scale=scale, causal=False)
        return out.reshape(qkv.shape[0], hidden)
    outputs = []
    for index, (g, rows) in enumerate(zip(batch.groups, group_rows(to_blocks(qkv, batch), batch))):
        q, k, v = _heads(rows, g, 3, heads)
        drop = None if masks is None else masks.attention(index)
        if drop is None or masks is None:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=g.key_mask, scale=scale)
        else:
            context = dropped_attention(q, k, v, g.key_mask, drop, masks.attention_scale, scale)
        outputs.append(context.transpose(1, 2).reshape(g.texts * g.width, hidden))
    return from_blocks(outputs[0] if len(outputs) == 1 else torch.cat(outputs), batch)


def _heads(rows: Tensor, g: AttentionGroup, parts: int, heads: int) -> tuple[Tensor, ...]:
    """A group's padded rows ``(texts * width, parts * hidden)`` as ``parts`` ``(texts, heads, width, head_dim)``
    tensors (e.g. query, key, value)."""
    head_dim = rows.shape[1] // parts // heads
    return rows.view(g.texts, g.width, parts, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def _add_norm(block: Any, x: Tensor, residual: Tensor, keep: Tensor | None) -> Tensor:
    """``BertSelfOutput`` / ``BertOutput``: dense -> dropout (scaled keep-mask) -> LayerNorm(. + residual)."""
    x = block.dense(x)
    return block.LayerNorm((x if keep is None else x * keep) + residual)


@dataclass
class DropoutSites:
    """A training forward's dropout counters (:mod:`embforge.modeling.dropout`), built once and shared by every
    layer: each token's attention-output and feed-forward sites, every attention block's probabilities, and —
    for a first-token-only last layer — the same for each text's first token."""

    tokens: HiddenSites
    blocks: AttentionSites | None
    firsts: HiddenSites | None = None
    first_blocks: AttentionSites | None = None

    @classmethod
    def build(cls, backbone: Any, batch: PackedBatch, first_tokens_only: bool) -> DropoutSites | None:
        """The counters ``backbone``'s layers need for ``batch``, or None outside training."""
        layer = backbone.encoder.layer[0]
        if not layer.training or batch.keys is None:
            return None
        attention = layer.attention.self
        heads, hidden = attention.num_attention_heads, attention.all_head_size
        sites = (SITE_ATTENTION_OUTPUT, SITE_FEED_FORWARD)
        dropped = float(attention.dropout.p) > 0
        device = batch.input_ids.device
        blocks = [(g.first, g.texts, g.width, g.width) for g in batch.groups]
        out = cls(
            HiddenSites(batch.position_ids, hidden, sites=sites),
            AttentionSites(blocks, heads, device) if dropped else None,
        )
        if first_tokens_only:
            out.firsts = HiddenSites(torch.zeros_like(batch.offsets), hidden, sites=sites)
            if dropped:
                first_blocks = [(g.first, g.texts, 1, g.width) for g in batch.groups]
                out.first_blocks = AttentionSites(first_blocks, heads, device)
        return out


def _layer_masks(
    layer: Any, number: int, batch: PackedBatch, sites: DropoutSites | None, first_only: bool
) -> LayerMasks | None:
    """This layer's keyed dropout masks, or None outside training; rows are every token, or each text's first
    token for a first-token-only layer."""
    if sites is None or batch.keys is None:
        return None
    p_attention = float(layer.attention.self.dropout.p)
    p_hidden = float(layer.output.dropout.p)
    if p_attention <= 0 and p_hidden <= 0:
        return None
    hidden_sites = sites.firsts if first_only else sites.tokens
    assert hidden_sites is not None, "DropoutSites.build(first_tokens_only=True) makes the first-token sites"
    return LayerMasks(
        layer_keys(batch.keys, number),
        None if first_only else batch.segment,
        hidden_sites=hidden_sites,
        attention_sites=sites.first_blocks if first_only else sites.blocks,
        p_attention=p_attention,
        p_hidden=p_hidden,
    )


def _bert_layer(
    layer: Any,
    number: int,
    hidden: Tensor,
    batch: PackedBatch,
    sites: DropoutSites | None,
    first_only: bool = False,
) -> Tensor:
    """One ``BertLayer`` over all packed tokens; with ``first_only``, for each text's first token only (keys and
    values of all tokens, the rest of the layer for the first tokens: the same values and gradients as the full
    layer's first rows, dropout masks included)."""
    attention = layer.attention.self
    scale = getattr(attention, "scaling", attention.attention_head_size**-0.5)
    heads = attention.num_attention_heads
    masks = _layer_masks(layer, number, batch, sites, first_only)
    parts = (
        [attention.key, attention.value] if first_only else [attention.query, attention.key, attention.value]
    )
    projected = F.linear(hidden, torch.cat([p.weight for p in parts]), torch.cat([p.bias for p in parts]))
    if first_only:
        residual = hidden.index_select(0, batch.offsets)
        context = _attend_first(attention.query(residual), projected, batch, heads, scale, masks)
    else:
        residual = hidden
        context = _attend(projected, batch, heads, scale, masks)
    dtype = context.dtype
    first_mask = None if masks is None else masks.hidden_mask(0, dtype)
    attended = _add_norm(layer.attention.output, context, residual, first_mask)
    second_mask = None if masks is None else masks.hidden_mask(1, dtype)
    return _add_norm(layer.output, layer.intermediate(attended), attended, second_mask)


def packed_hidden(
    backbone: Any,
    batch: PackedBatch,
    *,
    first_tokens_only: bool = False,
    checkpoint_layers: bool = False,
) -> Tensor:
    """Last hidden states ``(tokens, hidden)`` of a ``BertModel`` for a :class:`PackedBatch`.

    Calls the backbone's own embedding, projection, feed-forward and layer-norm modules, so autocast and
    train/eval mode behave as in its forward. In training, dropout uses the keyed masks of
    :mod:`embforge.modeling.dropout` (``batch.keys``): each text's masks depend on the text, not on the batching.
    The embedding layer's own dropout is applied through the same keys (as layer ``-1``'s feed-forward site).

    ``first_tokens_only=True`` returns only each text's first token (``(texts, hidden)``, packed order) — all that
    CLS pooling and a cross-encoder's head read. The last layer then needs keys and values of every token but
    queries, attention output, feed-forward and layer norms for the first tokens only: the same values and
    gradients for what is returned, and ~14 % fewer operations for a 6-layer model (5/6 of the last layer's).

    ``checkpoint_layers=True`` keeps only each layer's input for the backward pass and recomputes the layer there
    (gradient checkpointing): the keyed masks are a function of the keys, so the recomputation is exact.
    """
    sites = DropoutSites.build(backbone, batch, first_tokens_only)
    hidden = _embed(backbone.embeddings, batch, sites)
    layers = backbone.encoder.layer
    for number, layer in enumerate(layers):
        first_only = first_tokens_only and number == len(layers) - 1
        if checkpoint_layers and torch.is_grad_enabled():
            hidden = checkpoint(
                _bert_layer, layer, number, hidden, batch, sites, first_only, use_reentrant=False
            )
        else:
            hidden = _bert_layer(layer, number, hidden, batch, sites, first_only)
    return hidden


def _embed(embeddings: Any, batch: PackedBatch, sites: DropoutSites | None) -> Tensor:
    """``BertEmbeddings``: word + position + token-type embeddings, LayerNorm, then its dropout as keyed masks
    (layer -1's feed-forward site)."""
    type_ids = batch.token_type_ids if batch.token_type_ids is not None else torch.zeros_like(batch.input_ids)
    hidden = embeddings.word_embeddings(batch.input_ids) + embeddings.token_type_embeddings(type_ids)
    hidden = embeddings.LayerNorm(hidden + embeddings.position_embeddings(batch.position_ids))
    p = float(embeddings.dropout.p)
    if sites is not None and p > 0 and batch.keys is not None:
        keys = layer_keys(batch.keys, -1).index_select(0, batch.segment)
        hidden = hidden * sites.tokens.keeps(keys, p, hidden.dtype, site=1)[0]
    return hidden


def _attend_first(
    q: Tensor, kv: Tensor, batch: PackedBatch, heads: int, scale: float, masks: LayerMasks | None
) -> Tensor:
    """Attention of each text's first token over its own tokens: queries ``(texts, hidden)`` (packed order) and
    keys/values ``(tokens, 2 * hidden)`` -> ``(texts, hidden)``."""
    hidden = q.shape[1]
    outputs = []
    for index, (g, rows) in enumerate(zip(batch.groups, group_rows(to_blocks(kv, batch), batch))):
        k, v = _heads(rows, g, 2, heads)
        query = q[g.first : g.first + g.texts].view(g.texts, heads, 1, hidden // heads)
        drop = None if masks is None else masks.attention(index)
        if drop is None or masks is None:  # inference, or no attention dropout
            context = written_attention(query, k, v, g.key_mask, None, 1.0, scale)  # (texts, heads, 1, d)
        else:
            context = dropped_attention(query, k, v, g.key_mask, drop, masks.attention_scale, scale)
        outputs.append(context.reshape(g.texts, hidden))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def pool_packed(hidden: Tensor, batch: PackedBatch, mode: str) -> Tensor:
    """Pool packed token states into ``(texts, hidden)`` in packed order (see :func:`embforge.modeling.pooling.pool`)."""
    if mode == "mean":
        summed = hidden.new_zeros(batch.num_texts, hidden.shape[1]).index_add(0, batch.segment, hidden)
        return summed / batch.lengths[:, None].to(hidden.dtype)
    if mode == "cls":
        return hidden.index_select(0, batch.offsets)
    if mode == "lasttoken":
        return hidden.index_select(0, batch.offsets + batch.lengths - 1)
    if mode == "max":
        index = batch.segment[:, None].expand_as(hidden)
        empty = hidden.new_full((batch.num_texts, hidden.shape[1]), float("-inf"))
        return empty.scatter_reduce(0, index, hidden, reduce="amax", include_self=False)
    raise ValueError(f"unknown pooling mode {mode!r}")


def packed_logits(model: Any, batch: PackedBatch, *, checkpoint_layers: bool = False) -> Tensor:
    """Logits ``(texts, num_labels)`` of a ``BertForSequenceClassification``, in packed order."""
    first = packed_hidden(model.bert, batch, first_tokens_only=True, checkpoint_layers=checkpoint_layers)
    pooled = model.bert.pooler.activation(model.bert.pooler.dense(first))
    keep = None
    if model.training and batch.keys is not None:
        layers = len(model.bert.encoder.layer)
        p = float(model.dropout.p)
        keep = head_mask(batch.keys, layer=layers, hidden=pooled.shape[1], p=p, dtype=pooled.dtype)
    return model.classifier(pooled if keep is None else pooled * keep)
