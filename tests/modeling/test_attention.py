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
