"""Dropout masks that depend on *which text* is dropped, never on how a batch was cut.

With a global random generator a token's dropout mask depends on everything drawn before it: the order of the
texts, how they were grouped into attention blocks, how a batch was split into mini-batches. Then a performance
knob (``chunk_tokens``, the cached step's ``mini_batch_size``) changes training results, and a cached
(GradCache) step cannot replay the masks of its first, gradient-free pass.

Here every text of a forward gets its own key, ``text_key(seed, place)``: ``seed`` is one number per micro-step
(drawn by the trainer from torch's seeded generator, so runs stay reproducible and resumable) and ``place`` is
the text's position in the whole batch (not in a mini-batch or an attention block). Each ``(text, layer)`` seeds
a generator with ``mix(key, layer)`` and draws that text's masks for the layer in a fixed layout:

- attention probabilities ``(query, head, key)`` — row 0 first, so a first-token-only layer reads a prefix;
- the attention output ``(token, hidden)``, then the feed-forward output ``(token, hidden)``.

Draws are 15-bit integers (four per 64-bit draw of the generator, as cheap as ``F.dropout``'s Bernoulli draw): an
element is kept when its draw is at least ``round(p * 32768)``, i.e. with probability ``1 - p`` to within 2e-5,
and scaled by ``1 / (1 - p)``. The masks are the same on every call with the same keys, which also makes
recomputation (gradient checkpointing) exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def mix(*values: int) -> int:
    """splitmix64 of a sequence of integers: a well-spread 63-bit key (a valid ``manual_seed``)."""
    z = 0
    for value in values:
        z = (z + _GOLDEN + (value & _MASK64)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


def text_keys(seed: int, places: Sequence[int]) -> list[int]:
    """One key per text from the micro-step's ``seed`` and each text's place in the whole batch."""
    return [mix(seed, place) for place in places]


class LayerMasks:
    """The dropout masks of one layer for every text of a packed forward (see the module docstring).

    Args:
        keys: Per-text keys in packed order.
        lengths: Tokens per text, packed order.
        layer: Layer number (mixed into each text's key).
        heads: Attention heads.
        hidden: Hidden size.
        p_attention / p_hidden: Dropout probabilities (0 draws nothing for that site).
        rows: Query rows drawn per text (``None``: all; 1: the first token only).
        device: Where the masks go.
    """

    def __init__(
        self,
        keys: Sequence[int],
        lengths: Sequence[int],
        *,
        layer: int,
        heads: int,
        hidden: int,
        p_attention: float,
        p_hidden: float,
        rows: int | None = None,
        device: torch.device,
    ) -> None:
        self.lengths = list(lengths)
        self.heads, self.hidden = heads, hidden
        self.p_attention, self.p_hidden = p_attention, p_hidden
        self.rows = rows
        generator = torch.Generator(device=device)
        self.draws: list[Tensor] = []
        for key, n in zip(keys, self.lengths):
            q = n if rows is None else min(rows, n)
            size = q * heads * n + 2 * q * hidden
            generator.manual_seed(mix(key, layer))
            raw = torch.empty((size + 3) // 4, dtype=torch.int64, device=device).random_(generator=generator)
            self.draws.append(raw.view(torch.int16)[:size] & 0x7FFF)

    def _rows(self, n: int) -> int:
        return n if self.rows is None else min(self.rows, n)

    def attention(self, first: int, texts: int, width: int) -> Tensor | None:
        """Drop-mask ``(texts, heads, query rows, width)`` (True: dropped) for texts ``first..first+texts`` of a
        block; the caller scales what is kept by :attr:`attention_scale`."""
        if self.p_attention <= 0:
            return None
        q_width = width if self.rows is None else min(self.rows, width)
        block = self.draws[0].new_zeros((texts, q_width, self.heads, width))
        for i in range(texts):
            n = self.lengths[first + i]
            q = self._rows(n)
            block[i, :q, :, :n] = self.draws[first + i][: q * self.heads * n].view(q, self.heads, n)
        return block.permute(0, 2, 1, 3) < round(self.p_attention * 32768)

    @property
    def attention_scale(self) -> float:
        return 1.0 / (1.0 - self.p_attention)

    def hidden_mask(self, site: int, dtype: torch.dtype) -> Tensor | None:
        """Scaled keep-mask ``(rows, hidden)`` of site 0 (attention output) or 1 (feed-forward output)."""
        if self.p_hidden <= 0:
            return None
        parts = []
        for draw, n in zip(self.draws, self.lengths):
            q = self._rows(n)
            start = q * self.heads * n + site * q * self.hidden
            parts.append(draw[start : start + q * self.hidden])
        keep = torch.cat(parts).view(-1, self.hidden) >= round(self.p_hidden * 32768)
        return keep.to(dtype).mul_(1.0 / (1.0 - self.p_hidden))


def head_mask(
    keys: Sequence[int], *, layer: int, hidden: int, p: float, dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """Scaled keep-mask ``(texts, hidden)`` for one vector per text (a classifier head's dropout)."""
    if p <= 0:
        return None
    masks = LayerMasks(
        keys,
        [1] * len(keys),
        layer=layer,
        heads=0,
        hidden=hidden,
        p_attention=0.0,
        p_hidden=p,
        rows=1,
        device=device,
    )
    return masks.hidden_mask(0, dtype)
