"""Augmented positives (embforge.data.augment) and SimCSE's augment option."""

from __future__ import annotations

from collections import Counter

import pytest

from embforge.data.augment import augment_text, augment_texts
from embforge.losses import get_loss

TEXT = "a man is playing a guitar on the big stage tonight"


def _is_subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return all(word in it for word in short)


def test_delete_keeps_an_ordered_subset() -> None:
    words = TEXT.split()
    for seed in range(20):
        out = augment_text(TEXT, "delete", rate=0.3, seed=seed).split()
        assert 1 <= len(out) <= len(words) and _is_subsequence(out, words)
    assert augment_text("one two", "delete", rate=1.0, seed=3) in ("one", "two")  # never empty


def test_swap_keeps_the_words_and_cutoff_removes_one_span() -> None:
    words = TEXT.split()
    for seed in range(20):
        swapped = augment_text(TEXT, "swap", rate=0.2, seed=seed).split()
        assert Counter(swapped) == Counter(words)
        cut = augment_text(TEXT, "cutoff", rate=0.3, seed=seed).split()
        assert len(cut) == len(words) - 3  # round(0.3 * 11) words
        start = next((i for i, (a, b) in enumerate(zip(cut, words)) if a != b), len(cut))
        assert cut == words[:start] + words[start + 3 :]


def test_deterministic_per_seed_and_position_identity_at_rate_zero() -> None:
    texts = [TEXT, TEXT, "short text here"]
    assert augment_texts(texts, "swap", rate=0.3, seed=7) == augment_texts(texts, "swap", rate=0.3, seed=7)
    views = augment_texts([TEXT] * 8, "delete", rate=0.3, seed=7)
    assert len(set(views)) > 1  # each position gets its own edit
    assert augment_texts(texts, "cutoff", rate=0.0) == texts
    assert augment_text("single", "cutoff", rate=0.5) == "single"
    with pytest.raises(ValueError, match="unknown augmentation"):
        augment_text(TEXT, "shuffle")


def test_simcse_augment_option() -> None:
    plain = get_loss("simcse")
    assert plain.second_view([TEXT]) == [TEXT]
    loss = get_loss("simcse", augment="cutoff", augment_rate=0.2, augment_seed=3)
    assert loss.second_view([TEXT, "b c d"]) == augment_texts([TEXT, "b c d"], "cutoff", rate=0.2, seed=3)
    with pytest.raises(ValueError, match="augment must be one of"):
        get_loss("simcse", augment="mask")
