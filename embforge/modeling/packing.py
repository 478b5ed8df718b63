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

The batch itself (sorting, concatenation, attention blocks) is :mod:`embforge.modeling.packed_batch`.

Covered: Hugging Face ``BertModel`` (BERT, MiniLM, BGE, E5, ...), and ``BertForSequenceClassification`` heads for
cross-encoders. Other architectures use the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from embforge.modeling.packed_batch import (
    AttentionGroup,
    PackedBatch,
    flash_varlen,
    from_blocks,
    group_rows,
    pack,
    to_blocks,
)

# the batch this forward consumes (modeling/packed_batch.py), re-exported for the callers of both
__all__ = ["PackedBatch", "pack"]


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
