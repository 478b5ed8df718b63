"""Attention with keyed dropout masks (see :mod:`embforge.modeling.dropout`), the training path of the packed forward.

Fused ``scaled_dot_product_attention`` cannot take a given dropout mask, so with dropout the attention is written
out. Written as plain ops it materialises ``(texts, heads, rows, width)`` scores, probabilities, the dropped
probabilities and their gradients — on 256-token texts most of a training step's time goes into those passes over
memory. :class:`_DroppedAttention` computes the same values a few texts at a time (their probabilities stay in
cache), keeps only the inputs and the mask for the backward pass and recomputes the probabilities there, as
flash attention does: on one CPU layer of 32 × 256-token texts it is 2x faster than the written-out ops (0.36 vs
0.72 s forward + backward) with bit-identical values and gradients.

Under mixed precision (autocast) it runs at autocast's precisions: the products in the autocast dtype, the softmax
and its backward in fp32 (each chunk's probabilities are rounded to the autocast dtype for the product with ``v``,
as autocast rounds them for ``matmul``).
"""

from __future__ import annotations

import torch
from torch import Tensor

# probabilities per chunk: texts are processed in groups of about this many elements (on a CPU a chunk's
# probabilities stay in cache, 4 MB in fp32; on an accelerator memory bandwidth is not the limit, launches are)
_CHUNK_ELEMENTS = {"cpu": 1 << 20}
_ACCELERATOR_CHUNK_ELEMENTS = 1 << 28


def dropped_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, drop: Tensor, keep_scale: float, scale: float
) -> Tensor:
    """``softmax(q kᵀ · scale, masked) v`` with the probabilities under ``drop`` zeroed and the result scaled by
    ``keep_scale``: ``q`` ``(texts, heads, rows, d)``, ``k``/``v`` ``(texts, heads, width, d)``, ``key_mask``
    ``(texts, 1, 1, width)`` (True: a real key) or ``None``, ``drop`` ``(texts, heads, rows, width)``.

    Under autocast (mixed precision) ``q``, ``k``, ``v`` are cast to the autocast dtype (as ``matmul`` would).
    """
    device = q.device.type
    if torch.is_autocast_enabled(device):
        low = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return dropped_attention(q.to(low), k.to(low), v.to(low), key_mask, drop, keep_scale, scale)
    texts, heads, rows, width = drop.shape
    budget = _CHUNK_ELEMENTS.get(q.device.type, _ACCELERATOR_CHUNK_ELEMENTS)
    chunk = max(1, budget // max(1, rows * width))
    # (texts * heads, ., .) matrices, copied once here (q, k, v arrive as views of a permuted block)
    q3, k3, v3 = (x.reshape(texts * heads, *x.shape[2:]) for x in (q, k, v))
    # padding as an additive bias (0 or -inf per key): scores = bias + scale · q kᵀ in one baddbmm
    bias = q.new_zeros(texts, heads, 1, width)
    if key_mask is not None:
        bias.masked_fill_(~key_mask, float("-inf"))
    bias3 = bias.view(texts * heads, 1, width)
    drop3 = drop.reshape(texts * heads, rows, width)
    out = _DroppedAttention.apply(q3, k3, v3, bias3, drop3, keep_scale, scale, chunk)
    return out.view(texts, heads, rows, v.shape[-1])


def written_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None,
    drop: Tensor | None,
    keep_scale: float,
    scale: float,
) -> Tensor:
    """:func:`dropped_attention` as plain differentiable ops (``drop=None``: no dropout); the reference."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, float("-inf"))
    probs = scores.softmax(dim=-1)
    if drop is None:
        return torch.matmul(probs, v)
    return torch.matmul(probs.masked_fill(drop, 0.0), v) * keep_scale


def _parts(n: int, chunk: int, *tensors: Tensor | None) -> list[tuple[Tensor | None, ...]]:
    """``tensors`` cut along their first axis into chunks of ``chunk`` (no slicing when one chunk covers all)."""
    if chunk >= n:
        return [tensors]
    return [tuple(None if t is None else t[s : s + chunk] for t in tensors) for s in range(0, n, chunk)]


def _kept(drop: Tensor, dtype: torch.dtype) -> Tensor:
    """1 where ``drop`` keeps, 0 where it drops, in ``dtype``: a product with it is a vectorised pass on a CPU
    where ``masked_fill`` with a boolean mask is not (~8x slower on a chunk of probabilities)."""
    return drop.view(torch.uint8).bitwise_xor(1).to(dtype)


def _probabilities(q: Tensor, k: Tensor, bias: Tensor, scale: float) -> Tensor:
    """Softmax of the scores, in fp32 when ``q`` is half or bf16 (autocast's softmax precision)."""
    scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
    return torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


class _DroppedAttention(torch.autograd.Function):
    """:func:`written_attention` over ``(texts * heads, ., .)`` matrices in chunks of ``chunk`` of them,
    probabilities recomputed in the backward pass."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        drop: Tensor,
        keep_scale: float,
        scale: float,
        chunk: int,
    ) -> Tensor:
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        for oc, qc, kc, vc, bc, dc in _parts(q.shape[0], chunk, out, q, k, v, bias, drop):
            assert oc is not None and qc is not None and kc is not None and vc is not None and dc is not None
            assert bc is not None
            probs = _probabilities(qc, kc, bc, scale).to(vc.dtype).mul_(_kept(dc, vc.dtype))
            torch.bmm(probs, vc, out=oc)
        ctx.save_for_backward(q, k, v, bias, drop)
        ctx.keep_scale, ctx.scale, ctx.chunk = keep_scale, scale, chunk  # type: ignore[attr-defined]
        return out.mul_(keep_scale)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, bias, drop = ctx.saved_tensors  # type: ignore[attr-defined]
        keep_scale, scale, chunk = ctx.keep_scale, ctx.scale, ctx.chunk  # type: ignore[attr-defined]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # softmax's backward is linear in its incoming gradient, so keep_scale joins scale there and dv's
        # product (no scaled copy of ``grad``)
        parts = _parts(q.shape[0], chunk, q, k, v, bias, drop, grad, dq, dk, dv)
        for qc, kc, vc, bc, dc, gc, dqc, dkc, dvc in parts:
            assert qc is not None and kc is not None and vc is not None and dc is not None and gc is not None
            assert dqc is not None and dkc is not None and dvc is not None and bc is not None
            probs, kept = _probabilities(qc, kc, bc, scale), _kept(dc, vc.dtype)
            dprobs = torch.bmm(gc, vc.transpose(1, 2)).mul_(kept).to(probs.dtype)
            dscores = torch._softmax_backward_data(dprobs, probs, -1, probs.dtype).to(qc.dtype)
            # the probabilities are dropped in place once softmax's backward has read them (no copy in fp32), and
            # scale · keep_scale multiplies dq and dk (rows x head_dim) rather than dscores (rows x width)
            dropped = probs.to(vc.dtype).mul_(kept)
            torch.bmm(dropped.transpose(1, 2), gc, out=dvc).mul_(keep_scale)
            torch.bmm(dscores, kc, out=dqc).mul_(scale * keep_scale)
            torch.bmm(dscores.transpose(1, 2), qc, out=dkc).mul_(scale * keep_scale)
        return dq, dk, dv, None, None, None, None, None
