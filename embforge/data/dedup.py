"""Text normalisation and MinHash near-duplicate search (pure numpy; used by :mod:`embforge.curate`).

:func:`normalise` maps texts that differ only in case, accents, punctuation or spacing to one key.
:func:`near_duplicate_pairs` finds pairs of texts whose character-shingle Jaccard similarity is at least a
threshold: MinHash signatures cut into LSH bands propose candidates, and every candidate is confirmed with the
exact Jaccard similarity of the shingle sets, so no pair below the threshold is ever returned (some above it may
be missed, with a probability that falls fast as ``num_perm`` grows).

Example:
    >>> normalise("  The CAFÉ,  opens!  ")
    'the cafe opens'
    >>> near_duplicate_pairs(["a cat sat on the mat", "a cat sat on the mat.", "stocks fell"], threshold=0.8)
    [(0, 1, 1.0)]
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

import numpy as np

_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")
_PRIME = np.uint64((1 << 31) - 1)  # hashes and coefficients below 2^31: products fit in 64 bits


def normalise(text: str) -> str:
    """Lower case, accents stripped (NFKD), punctuation removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return _SPACE.sub(" ", _PUNCT.sub(" ", text)).strip()


def shingles(text: str, n: int = 5) -> set[str]:
    """Character ``n``-grams of the normalised text (the whole text when shorter)."""
    norm = normalise(text)
    if len(norm) <= n:
        return {norm}
    return {norm[i : i + n] for i in range(len(norm) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _hash(items: set[str]) -> np.ndarray:
    return (
        np.fromiter(
            (int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little") for s in items),
            dtype=np.uint64,
            count=len(items),
        )
        % _PRIME
    )


def minhash(sets: Sequence[set[str]], *, num_perm: int = 128, seed: int = 0) -> np.ndarray:
    """``(len(sets), num_perm)`` MinHash signatures: ``min((a·h + b) mod p)`` over each set's shingle hashes."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, (1 << 31) - 1, size=num_perm, dtype=np.uint64)
    b = rng.integers(0, (1 << 31) - 1, size=num_perm, dtype=np.uint64)
    out = np.empty((len(sets), num_perm), dtype=np.uint64)
    for i, items in enumerate(sets):
        h = _hash(items) if items else np.zeros(1, dtype=np.uint64)
        out[i] = ((a[None, :] * h[:, None] + b[None, :]) % _PRIME).min(axis=0)
    return out


def near_duplicate_pairs(
    texts: Sequence[str],
    *,
    threshold: float = 0.8,
    num_perm: int = 128,
    bands: int | None = None,
    n: int = 5,
) -> list[tuple[int, int, float]]:
    """``(i, j, jaccard)`` with ``i < j`` for every confirmed pair of texts at or above ``threshold``.

    Args:
        texts: The texts.
        threshold: Minimum Jaccard similarity of the character-shingle sets.
        num_perm: MinHash permutations.
        bands: LSH bands (``num_perm`` must divide by it); default: the band count whose S-curve crosses 0.5
            just below ``threshold``, so pairs at the threshold are found with high probability.
        n: Shingle length in characters.
    """
    sets = [shingles(t, n) for t in texts]
    if bands is None:
        bands = _choose_bands(num_perm, threshold)
    if num_perm % bands:
        raise ValueError(f"num_perm ({num_perm}) must be a multiple of bands ({bands})")
    rows = num_perm // bands
    signatures = minhash(sets, num_perm=num_perm)
    candidates: set[tuple[int, int]] = set()
    for band in range(bands):
        buckets: dict[bytes, list[int]] = {}
        for i, sig in enumerate(signatures[:, band * rows : (band + 1) * rows]):
            buckets.setdefault(sig.tobytes(), []).append(i)
        for members in buckets.values():
            candidates.update((x, y) for k, x in enumerate(members) for y in members[k + 1 :])
    found = []
    for i, j in sorted(candidates):
        score = jaccard(sets[i], sets[j])
        if score >= threshold:
            found.append((i, j, score))
    return found


def _choose_bands(num_perm: int, threshold: float) -> int:
    """The divisor ``b`` of ``num_perm`` whose LSH threshold ``(1/b)^(1/r)`` is closest below ``0.9·threshold``."""
    options = [b for b in range(1, num_perm + 1) if num_perm % b == 0]
    target = 0.9 * threshold
    below = [b for b in options if (1 / b) ** (b / num_perm) <= target]
    return min(below, key=lambda b: target - (1 / b) ** (b / num_perm)) if below else num_perm
