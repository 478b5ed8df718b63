"""Augmented positives for unlabelled text: word deletion, word swap and span cut-off (pure, seeded functions).

Unsupervised SimCSE makes a text's positive from the same text under other dropout noise. These functions make
a second, slightly edited view instead (or as well): the trainer tokenises ``augment_texts(texts, …)`` as the
positive column of a one-column task (``simcse`` with ``augment="delete"``).

=============  ==================================================================================
method         edit (``rate`` = fraction of the words)
=============  ==================================================================================
``delete``     each word is dropped with probability ``rate`` (at least one word is kept)
``swap``       ``max(1, round(rate · n))`` random pairs of adjacent words are swapped
``cutoff``     one contiguous span of ``max(1, round(rate · n))`` words is removed (not all of them)
=============  ==================================================================================

The same ``(text, seed, index)`` always gives the same view, so runs and resumes are reproducible.

Example:
    >>> augment_text("a man is playing a guitar on stage", "cutoff", rate=0.25, seed=1)
    'a playing a guitar on stage'
    >>> augment_texts(["one", "two words"], "delete", rate=0.5, seed=0)
    ['one', 'words']
"""

from __future__ import annotations

import random
from collections.abc import Sequence

AUGMENTATIONS = ("delete", "swap", "cutoff")


def augment_text(text: str, method: str, *, rate: float = 0.1, seed: int = 0) -> str:
    """One augmented view of ``text`` (words split on whitespace, joined with single spaces)."""
    if method not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {method!r}; choose one of {', '.join(AUGMENTATIONS)}")
    if not 0 <= rate <= 1:
        raise ValueError(f"augmentation rate must be in [0, 1], got {rate}")
    words = text.split()
    if len(words) < 2 or rate == 0:
        return " ".join(words)
    rng = random.Random(seed)
    n = len(words)
    count = max(1, round(rate * n))
    if method == "delete":
        kept = [w for w in words if rng.random() >= rate]
        return " ".join(kept or [rng.choice(words)])
    if method == "swap":
        for _ in range(count):
            i = rng.randrange(n - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        return " ".join(words)
    count = min(count, n - 1)
    start = rng.randrange(n - count + 1)
    return " ".join(words[:start] + words[start + count :])


def augment_texts(texts: Sequence[str], method: str, *, rate: float = 0.1, seed: int = 0) -> list[str]:
    """``augment_text`` of every text, each with its own seed derived from ``seed`` and its position."""
    return [augment_text(t, method, rate=rate, seed=seed * 1_000_003 + i) for i, t in enumerate(texts)]
