"""Padding-free forward for decoder (LLM) embedders: Qwen2, Qwen3, Llama and Mistral backbones.

The same idea as :mod:`embforge.modeling.packing` for BERT, with causal attention. The texts of a batch are
concatenated into one ``(tokens, hidden)`` matrix, positions restart at 0 for every text, and the token embedding,
the RMS norms, the query/key/value/output projections (and Qwen3's ``q_norm``/``k_norm``) and the MLPs run on that
matrix directly. Only attention needs to know where texts start:

- on CUDA, in fp16/bf16, with ``flash-attn`` installed: ``flash_attn_varlen_func`` over the packed tokens
  (``cu_seqlens``, causal) — no padding at all;
- otherwise: texts of similar length (:func:`~embforge.modeling.packed_batch.pack`'s plan, at most ``max_tokens``
  padded tokens per block) are copied into right-padded ``(texts, heads, width, head_dim)`` blocks and attend
  through ``scaled_dot_product_attention(is_causal=True)``. Right padding under a causal mask needs no key mask:
  a real token at position ``i`` sees keys ``0..i``, all of them its own text's; padding rows are dropped.

Sliding-window layers (Mistral; Qwen2/Qwen3 with ``use_sliding_window``) keep their window (a banded mask, or
flash-attn's ``window_size``). A bidirectional backbone (:func:`~embforge.modeling.decoder.set_bidirectional`)
attends to every real token of its text: flash-attn with ``causal=False``, the blocks with their padding-key mask,
no window. The model's own modules are called — rotary embedding through the model's own
``apply_rotary_pos_emb`` — so LoRA adapters injected into the projections are used, autocast and train/eval mode
behave as in the Hugging Face forward, and gradients reach the same parameters (tested against the padded forward
≤ 1e-5, values and gradients, fp32).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from embforge.modeling.decoder import base_model, is_bidirectional
from embforge.modeling.packed_batch import PackedBatch, flash_varlen, from_blocks, group_rows, to_blocks

_PACKABLE = frozenset({"Qwen2Model", "Qwen3Model", "LlamaModel", "MistralModel"})


def supports_decoder_packing(backbone: nn.Module) -> bool:
    """Whether :func:`packed_decoder_hidden` can drive ``backbone`` (a Qwen2/Qwen3/Llama/Mistral base model,
    possibly wrapped by peft)."""
    model = base_model(backbone)
    return type(model).__name__ in _PACKABLE and all(
        hasattr(model, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")
    )


def packed_decoder_hidden(
    backbone: nn.Module,
    batch: PackedBatch,
    *,
    last_tokens_only: bool = False,
    seed: int | None = None,
    checkpoint_layers: bool = False,
) -> Tensor:
    """Last hidden states ``(tokens, hidden)`` of a decoder for a :class:`~embforge.modeling.packed_batch.PackedBatch`.

    ``last_tokens_only=True`` returns each text's last token only (``(texts, hidden)``, packed order): what
    last-token pooling reads (the final norm then runs on those rows only). ``seed`` (training): run under
    torch's generator seeded with it, so the only dropout these models have (LoRA's, and attention dropout when
    a config sets it) repeats exactly when the same texts are forwarded again (a cached step's second pass).
    ``checkpoint_layers``: keep only each layer's input and recompute the layer in the backward pass (gradient
    checkpointing; the recomputation replays the same dropout masks).
    """
    if seed is None:
        return _forward(base_model(backbone), batch, last_tokens_only, checkpoint_layers)
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        return _forward(base_model(backbone), batch, last_tokens_only, checkpoint_layers)


def _forward(model: Any, batch: PackedBatch, last_tokens_only: bool, checkpoint_layers: bool) -> Tensor:
    hidden = model.embed_tokens(batch.input_ids)
    cos, sin = model.rotary_emb(hidden[None], batch.position_ids[None])
    varlen = flash_varlen(batch, hidden)
    causal = not is_bidirectional(model)
    for layer in model.layers[: model.config.num_hidden_layers]:
        window = _window(model, layer) if causal else None
        run = partial(
            _layer, layer, rotary=(cos, sin), batch=batch, varlen=varlen, window=window, causal=causal
        )
        if checkpoint_layers and torch.is_grad_enabled():
            hidden = checkpoint(run, hidden, use_reentrant=False)
        else:
            hidden = run(hidden)
    if last_tokens_only:
        hidden = hidden.index_select(0, batch.offsets + batch.lengths - 1)
    return model.norm(hidden)


def _layer(
    layer: Any,
    hidden: Tensor,
    *,
    rotary: tuple[Tensor, Tensor],
    batch: PackedBatch,
    varlen: Any,
    window: int | None,
    causal: bool,
) -> Tensor:
    """One decoder layer on packed tokens: pre-norm attention and pre-norm MLP, each added to the residual."""
    attention = layer.self_attn
    x = layer.input_layernorm(hidden)
    context = _self_attention(attention, x, rotary, batch, varlen, window, causal=causal)
    hidden = hidden + attention.o_proj(context)
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _window(model: Any, layer: Any) -> int | None:
    """The layer's sliding window in tokens (keys ``i - window < j <= i``), or ``None`` for full causal attention."""
    if type(model).__name__ == "MistralModel":  # Mistral applies config.sliding_window in every layer
        return getattr(model.config, "sliding_window", None)
    return getattr(layer.self_attn, "sliding_window", None)


def _self_attention(
    attention: Any,
    x: Tensor,
    rotary: tuple[Tensor, Tensor],
    batch: PackedBatch,
    varlen: Any,
    window: int | None,
    *,
    causal: bool = True,
) -> Tensor:
    """Causal (or bidirectional) self-attention of each text over its own tokens: normed ``(tokens, hidden)`` -> ``(tokens, heads *
    head_dim)`` (before ``o_proj``)."""
    tokens, head_dim = x.shape[0], attention.head_dim
    q = attention.q_proj(x).view(tokens, -1, head_dim)
    k = attention.k_proj(x).view(tokens, -1, head_dim)
    v = attention.v_proj(x).view(tokens, -1, head_dim)
    if hasattr(attention, "q_norm"):  # Qwen3: RMS norm over each head's dimensions
        q, k = attention.q_norm(q), attention.k_norm(k)
    rope = sys.modules[type(attention).__module__].apply_rotary_pos_emb  # the model's own rotary function
    q, k = rope(q.transpose(0, 1)[None], k.transpose(0, 1)[None], *rotary)
    q, k = q[0].transpose(0, 1), k[0].transpose(0, 1)  # back to (tokens, heads, head_dim)
    p = float(getattr(attention, "attention_dropout", 0.0) or 0.0) if attention.training else 0.0
    device = q.device.type
    half = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    if varlen is not None and half in (torch.float16, torch.bfloat16):
        flash, cu_seqlens, max_len = varlen
        q, k, v = q.to(half), k.to(half), v.to(half)  # rotary tables are fp32 under autocast, as in HF
        out = flash(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            max_len,
            max_len,
            dropout_p=p,
            softmax_scale=attention.scaling,
            causal=causal,
            window_size=(-1, -1) if window is None else (window - 1, 0),
        )
        return out.reshape(tokens, -1)
    return _blocked_attention(q, k, v, batch, attention.scaling, p, window, causal).reshape(tokens, -1)


def _blocked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    batch: PackedBatch,
    scale: float,
    dropout_p: float,
    window: int | None,
    causal: bool = True,
) -> Tensor:
    """Per-group right-padded blocks through ``scaled_dot_product_attention``: ``(tokens, heads, head_dim)``."""
    repeats = q.shape[1] // k.shape[1]  # grouped-query attention: each key/value head serves `repeats` heads
    grouped = [group_rows(to_blocks(t, batch), batch) for t in (q, k, v)]
    outputs = []
    for g, *rows in zip(batch.groups, *grouped):
        qb, kb, vb = (r.view(g.texts, g.width, *r.shape[1:]).transpose(1, 2) for r in rows)
        if repeats > 1:
            kb, vb = kb.repeat_interleave(repeats, dim=1), vb.repeat_interleave(repeats, dim=1)
        if not causal:  # every real key of the text; right padding: the keys past its length are masked
            mask = g.key_mask
        elif window is not None and g.width > window:
            mask = _band(g.width, window, q.device)
        else:
            mask = None
        out = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and mask is None, scale=scale
        )
        outputs.append(out.transpose(1, 2).reshape(g.texts * g.width, q.shape[1], q.shape[2]))
    return from_blocks(outputs[0] if len(outputs) == 1 else torch.cat(outputs), batch)


def _band(width: int, window: int, device: torch.device) -> Tensor:
    """Causal sliding-window mask ``(width, width)``: query ``i`` sees keys ``i - window < j <= i``."""
    i = torch.arange(width, device=device)[:, None]
    j = torch.arange(width, device=device)[None, :]
    return (j <= i) & (j > i - window)
