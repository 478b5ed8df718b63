"""The chunked keyed-dropout attention equals the written-out ops, values and gradients."""

import pytest
import torch

from embforge.modeling import attention
from embforge.modeling.attention import dropped_attention, written_attention


def _inputs(texts=5, heads=3, rows=7, width=7, d=4, dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(texts, heads, rows, d, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(texts, heads, width, d, dtype=dtype, requires_grad=True) for _ in range(2))
    key_mask = (torch.arange(width)[None, :] < torch.tensor([width, 3, 5, 1, width][:texts])[:, None])[
        :, None, None, :
    ]
    drop = torch.rand(texts, heads, rows, width) < 0.3
    return q, k, v, key_mask, drop


@pytest.mark.parametrize("rows", [7, 1])  # every query row, or the first token only
@pytest.mark.parametrize("chunk_elements", [1, 10**6])  # one text per chunk, or all at once
def test_dropped_attention_equals_the_written_out_ops(monkeypatch, rows, chunk_elements):
    monkeypatch.setitem(attention._CHUNK_ELEMENTS, "cpu", chunk_elements)
    q, k, v, key_mask, drop = _inputs(rows=rows)
    grad = torch.randn(q.shape)
    ours = dropped_attention(q, k, v, key_mask, drop[:, :, :rows], 1 / 0.7, 0.5)
    ours.backward(grad)
    ours_grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    reference = written_attention(q, k, v, key_mask, drop[:, :, :rows], 1 / 0.7, 0.5)
    reference.backward(grad)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    for mine, theirs in zip(ours_grads, [x.grad for x in (q, k, v)]):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)


def test_dropped_attention_gradients_pass_gradcheck():
    q, k, v, key_mask, drop = _inputs(texts=3, heads=2, rows=4, width=4, d=3, dtype=torch.float64)
    key_mask = key_mask[:3]
    torch.autograd.gradcheck(
        lambda a, b, c: dropped_attention(a, b, c, key_mask, drop[:3, :2, :4, :4], 1.25, 0.7), (q, k, v)
    )


@pytest.mark.parametrize("chunk_elements", [1, 10**6])
def test_dropped_attention_under_autocast_runs_chunked_at_autocast_precision(monkeypatch, chunk_elements):
    """Under bf16 autocast the chunked attention runs (no written-out (texts, heads, rows, width) tensors) with
    autocast's precisions — products in bf16, softmax in fp32 — so values and gradients match the written-out
    ops under the same autocast to bf16 rounding, and the gradients reach the inputs in their own dtype."""
    monkeypatch.setitem(attention._CHUNK_ELEMENTS, "cpu", chunk_elements)
    q, k, v, key_mask, drop = _inputs(texts=5, heads=3, rows=9, width=9, d=8)
    grad = torch.randn(5, 3, 9, 8)
    calls = []
    monkeypatch.setattr(attention, "written_attention", lambda *a: calls.append(a) or written_attention(*a))
    results = []
    for run in (dropped_attention, written_attention):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))  # as a Linear under autocast gives them
            out = run(qb, kb, vb, key_mask, drop, 1 / 0.7, 0.5)
        out.float().backward(grad)
        results.append((out, [x.grad.clone() for x in (q, k, v)]))
        for x in (q, k, v):
            x.grad = None
    (ours, ours_grads), (reference, reference_grads) = results
    assert not calls  # the chunked path ran, not the written-out ops
    assert ours.dtype == reference.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), reference.float(), rtol=2e-2, atol=2e-2)
    for mine, theirs in zip(ours_grads, reference_grads):
        torch.testing.assert_close(mine, theirs, rtol=3e-2, atol=3e-2)
