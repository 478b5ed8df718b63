"""Dropout masks that depend on *which text* is dropped, never on how a batch was cut — drawn for a whole layer
in a fixed number of tensor operations.

With a global random generator a token's dropout mask depends on everything drawn before it: the order of the
texts, how they were grouped into attention blocks, how a batch was split into mini-batches. Then a performance
knob (``chunk_tokens``, the cached step's ``mini_batch_size``) changes training results, and a cached
(GradCache) step cannot replay the masks of its first, gradient-free pass.

Here every text of a forward gets its own key, ``text_keys(seed, places)``: ``seed`` is one number per micro-step
(drawn by the trainer from torch's seeded generator, so runs stay reproducible and resumable) and ``place`` is
the text's position in the whole batch (not in a mini-batch or an attention block). Each mask element is a
counter-based hash (splitmix64's finaliser, in wrapping int64 tensor arithmetic) of

    (the text's key mixed with the layer, the site, the element's coordinates inside its text)

— the site being attention probabilities ``(head, query row, key)``, the attention output ``(token, hidden)`` or
the feed-forward output ``(token, hidden)``. One 64-bit hash gives four 16-bit draws (adjacent keys or hidden
units); an element is dropped when its draw, read as a signed 16-bit number, is below ``round(p · 65536) − 32768``,
i.e. with probability ``p`` to within 8e-6, and what is kept is scaled by ``1 / (1 − p)``. The masks of every text
of a layer come from one hash over the layer's tensor — a fixed number of operations whatever the batch (each
operation is a kernel launch on a GPU) — and are the same on every call with the same keys, which also makes
recomputation (gradient checkpointing, the cached step's second pass) exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 that holds it (tensor arithmetic is signed and wraps)."""
    return value - (1 << 64) if value >= 1 << 63 else value


_M1, _M2, _GOLDEN_S = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB), _signed(_GOLDEN)

# coordinates inside a text are packed into one counter: site | row (query row or token) | column group
_ROW_BITS, _COL_BITS = (
    20,
    14,
)  # up to 1M tokens per text, 16k groups of four columns (64k keys / hidden units)
SITE_ATTENTION, SITE_ATTENTION_OUTPUT, SITE_FEED_FORWARD = 0, 1, 2


def mix(*values: int) -> int:
    """splitmix64 of a sequence of integers: a well-spread 63-bit key (a valid ``manual_seed``)."""
    z = 0
    for value in values:
        z = (z + _GOLDEN + (value & _MASK64)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


def forward_keys(
    training: bool, count: int, dropout_seed: int | None, places: Sequence[int] | None
) -> tuple[int | None, list[int]]:
    """What a training forward keys the dropout of ``count`` texts (or pairs) with: the seed (``dropout_seed``, or
    one drawn from torch's seeded generator when training without one; ``None`` outside training: no dropout)
    and each text's place in the whole batch (``places``, default ``0..count-1``)."""
    seed = None
    if training:
        seed = int(torch.randint(0, 2**62, ()).item()) if dropout_seed is None else dropout_seed
    return seed, list(range(count)) if places is None else list(places)


def hash64(x: Tensor) -> Tensor:
    """splitmix64's finaliser on an int64 tensor (wrapping arithmetic; logical shifts), elementwise; ``x`` is
    left as it was. Two buffers of ``x``'s size, every later step in place: on a CPU, a fresh tensor per step
    (page faults on every large allocation) made the hash 3x slower."""
    shifted = x >> 30
    x = x ^ shifted.bitwise_and_((1 << 34) - 1)  # the one new tensor: the caller's x stays as it was
    x.mul_(_M1)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 27, out=shifted).bitwise_and_((1 << 37) - 1))
    x.mul_(_M2)
    return x.bitwise_xor_(torch.bitwise_right_shift(x, 31, out=shifted).bitwise_and_((1 << 33) - 1))


def text_keys(seed: int, places: Sequence[int], *, device: torch.device | str | None = None) -> Tensor:
    """One int64 key per text from the micro-step's ``seed`` and each text's place in the whole batch."""
    where = torch.as_tensor(places if isinstance(places, Sequence) else list(places), dtype=torch.long)
    return hash64(where.to(device) * _GOLDEN_S + _signed(mix(seed)))


def layer_keys(keys: Tensor, layer: int) -> Tensor:
    """Each text's key for one layer (``layer`` -1: the embeddings; one past the last: a classifier head)."""
    return hash64(keys + _signed(mix(layer + 2)))


def _draws(keys: Tensor, counters: Tensor, columns: int) -> Tensor:
    """Signed 16-bit draws ``keys ⊗ counters`` → ``(..., columns)``: ``keys`` broadcast against ``counters``,
    whose last axis counts groups of four columns."""
    words = hash64(keys + counters * _GOLDEN_S)
    return words.view(torch.int16)[..., :columns]


def _threshold(p: float) -> int:
    return round(p * 65536) - 32768


def hidden_keep(
    keys: Tensor, positions: Tensor, *, site: int, hidden: int, p: float, dtype: torch.dtype
) -> Tensor:
    """Scaled keep-mask ``(rows, hidden)`` for rows whose texts have layer keys ``keys`` and which sit at
    ``positions`` inside their texts (one row per token, or per text for a first-token-only layer)."""
    return HiddenSites(positions, hidden, sites=(site,)).keeps(keys, p, dtype)[0]


class HiddenSites:
    """The counters of hidden-unit sites ``(site, row, hidden)`` of a forward's rows, computed once; each layer
    hashes them with its own keys (one hash for all its sites)."""

    def __init__(self, positions: Tensor, hidden: int, *, sites: Sequence[int]) -> None:
        device = positions.device
        site = torch.tensor(list(sites), device=device)[:, None, None] << _ROW_BITS
        columns = torch.arange((hidden + 3) // 4, device=device)
        self.counters = ((site + positions[None, :, None] << _COL_BITS) + columns) * _GOLDEN_S
        self.hidden = hidden

    def keeps(self, row_keys: Tensor, p: float, dtype: torch.dtype, *, site: int | None = None) -> Tensor:
        """Scaled keep-masks ``(sites, rows, hidden)`` for rows with these layer keys (``site``: only that one)."""
        counters = self.counters if site is None else self.counters[site : site + 1]
        words = hash64(counters + row_keys[None, :, None])
        keep = words.view(torch.int16)[..., : self.hidden] >= _threshold(p)
        return keep.to(dtype).mul_(1.0 / (1.0 - p))


class AttentionSites:
    """The counters of every attention-probability element of a forward's blocks, in one flat tensor.

    ``blocks`` are ``(first text, texts, query rows, width)``; element ``(text, head, row, key)`` of a block gets
    the counter of ``(head, row, key)`` — not of the block's width — so a text's mask is the same in any block.
    Built with a fixed number of operations whatever the number of blocks; each layer then hashes all of them at
    once (:meth:`drops`).
    """

    def __init__(self, blocks: Sequence[tuple[int, int, int, int]], heads: int, device: torch.device) -> None:
        self.blocks, self.heads = list(blocks), heads
        quads = [(width + 3) // 4 for _, _, _, width in blocks]
        per_text = [heads * rows * q for (_, _, rows, _), q in zip(blocks, quads)]
        sizes = [texts * n for (_, texts, _, _), n in zip(blocks, per_text)]
        self.starts = [0]
        for size in sizes:
            self.starts.append(self.starts[-1] + size)
        spec = torch.tensor(
            [(b[0], n, b[2], q, start) for b, n, q, start in zip(blocks, per_text, quads, self.starts)],
            device=device,
        )
        group = torch.repeat_interleave(
            torch.arange(len(blocks), device=device), torch.tensor(sizes, device=device)
        )
        first, text_size, rows, quad, start = spec[group].unbind(1)
        local = torch.arange(self.starts[-1], device=device) - start
        self.text = first + local // text_size
        within = local % text_size  # (head, row, quad) of the element inside its text
        head, cell = within // (rows * quad), within % (rows * quad)
        counters = ((cell // quad * heads + head) << _COL_BITS) + cell % quad
        self.counters = counters * _GOLDEN_S

    def drops(self, keys: Tensor, p: float) -> list[Tensor]:
        """Drop-masks ``(texts, heads, rows, width)`` (True: dropped), one per block, for texts with these layer
        keys."""
        words = hash64(self.counters + keys.index_select(0, self.text))
        dropped = words.view(torch.int16) < _threshold(p)
        masks = []
        for (_, texts, rows, width), start, end in zip(self.blocks, self.starts, self.starts[1:]):
            block = dropped[4 * start : 4 * end].view(texts, self.heads, rows, -1)
            masks.append(block[..., :width])
        return masks


class LayerMasks:
    """The dropout masks of one layer for every text of a packed forward (see the module docstring).

    Args:
        keys: The layer's per-text keys (:func:`layer_keys`), packed order.
        row_text: The text (packed index) of each row of the layer's hidden states; None: row ``i`` is text ``i``.
        hidden_sites: Counters of the rows' hidden sites (attention output, feed-forward output).
        attention_sites: Counters of the layer's attention blocks (None: no attention dropout).
        p_attention / p_hidden: Dropout probabilities (0 draws nothing for that site).
    """

    def __init__(
        self,
        keys: Tensor,
        row_text: Tensor | None,
        *,
        hidden_sites: HiddenSites,
        attention_sites: AttentionSites | None,
        p_attention: float,
        p_hidden: float,
    ) -> None:
        self.keys, self.row_text, self.hidden_sites = keys, row_text, hidden_sites
        self.p_attention, self.p_hidden = p_attention, p_hidden
        self.drops = None
        if p_attention > 0 and attention_sites is not None:
            self.drops = attention_sites.drops(keys, p_attention)
        self._keeps: Tensor | None = None

    def attention(self, group: int) -> Tensor | None:
        """Drop-mask ``(texts, heads, rows, width)`` (True: dropped) of attention block ``group``; the caller
        scales what is kept by :attr:`attention_scale`."""
        return None if self.drops is None else self.drops[group]

    @property
    def attention_scale(self) -> float:
        return 1.0 / (1.0 - self.p_attention)

    def hidden_mask(self, site: int, dtype: torch.dtype) -> Tensor | None:
        """Scaled keep-mask ``(rows, hidden)`` of the ``site``-th site of ``hidden_sites`` (all sites are hashed
        together on the first call)."""
        if self.p_hidden <= 0:
            return None
        if self._keeps is None or self._keeps.dtype != dtype:
            row_keys = self.keys if self.row_text is None else self.keys.index_select(0, self.row_text)
            self._keeps = self.hidden_sites.keeps(row_keys, self.p_hidden, dtype)
        return self._keeps[site]


def head_mask(keys: Tensor, *, layer: int, hidden: int, p: float, dtype: torch.dtype) -> Tensor | None:
    """Scaled keep-mask ``(texts, hidden)`` for one vector per text (a classifier head's dropout)."""
    if p <= 0:
        return None
    first = torch.zeros_like(keys)
    return hidden_keep(
        layer_keys(keys, layer), first, site=SITE_ATTENTION_OUTPUT, hidden=hidden, p=p, dtype=dtype
    )
