"""The teacher's embeddings are cached in checked shards as they are computed: a run killed midway resumes where it
stopped, with the values of an uninterrupted run, and says what it is doing even when the run is quiet."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embforge.data.tables import Dataset
from embforge.distill.signals import with_teacher_embeddings
from embforge.distill.targets import scored_file
from embforge.encoder import Encoder
from embforge.progress import progress_bars
from tests.conftest import WORDS, make_bert, make_tokenizer

ROWS = 700  # a query and three candidates each: 2,800 texts, some repeated


class KilledEncoder:
    """An encoder that counts the texts it encoded, killed (``KeyboardInterrupt``) by the call that would take it
    past ``kill_after`` texts."""

    def __init__(self, model: Encoder, kill_after: int | None = None) -> None:
        self.model, self.kill_after, self.encoded = model, kill_after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def encode(self, texts: list[str], **options: Any) -> np.ndarray:
        if self.kill_after is not None and self.encoded + len(texts) > self.kill_after:
            raise KeyboardInterrupt
        self.encoded += len(texts)
        return self.model.encode(texts, **options)


def _teacher() -> Encoder:
    tokenizer = make_tokenizer()
    return Encoder(make_bert(len(tokenizer), seed=3), tokenizer, max_seq_length=32)


def _lists() -> Dataset:
    rng = random.Random(0)
    columns = {
        c: [" ".join(rng.choices(WORDS, k=6)) for _ in range(ROWS)]
        for c in ("anchor", "positive", "negative_1", "negative_2")
    }
    return Dataset("lists.jsonl", columns, list(range(1, ROWS + 1)))


def _scores(teacher: KilledEncoder, cache: Path) -> str:
    return scored_file(_lists(), teacher, cache_dir=cache, show_progress=False).read_text()  # type: ignore[arg-type]


def _embeddings(teacher: KilledEncoder, cache: Path) -> str:
    data = Dataset(
        "t.txt", {"text": _lists().columns["anchor"] + _lists().columns["positive"]}, list(range(2 * ROWS))
    )
    labels = with_teacher_embeddings(data, teacher, cache_dir=cache, show_progress=False).labels()  # type: ignore[arg-type]
    return np.asarray(labels).tobytes().hex()


@pytest.mark.parametrize("run", [_scores, _embeddings], ids=["scored lists", "embedding targets"])
def test_a_killed_teacher_run_resumes_where_it_stopped(
    run: Callable[[KilledEncoder, Path], str], tmp_path: Path
) -> None:
    model = _teacher()
    uninterrupted = KilledEncoder(model)
    expected = run(uninterrupted, tmp_path / "fresh")
    total = uninterrupted.encoded
    killed = KilledEncoder(model, kill_after=total // 2)  # killed halfway
    with pytest.raises(KeyboardInterrupt):
        run(killed, tmp_path / "cache")
    resumed = KilledEncoder(model)
    assert run(resumed, tmp_path / "cache") == expected  # the same values as the uninterrupted run
    assert resumed.encoded < total  # the killed run's work was kept ...
    assert resumed.encoded == total - killed.encoded  # ... all of it: only the unfinished texts are encoded


def test_the_teacher_phase_says_what_it_does_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    bars: list[bool] = []
    real = __import__("embforge.retrieval.corpus_cache", fromlist=["progress_bar"]).progress_bar

    def recording(**options: Any) -> Any:
        bars.append(options["enabled"])
        return real(**options)

    monkeypatch.setattr("embforge.retrieval.corpus_cache.progress_bar", recording)
    teacher = KilledEncoder(_teacher())
    with progress_bars(True):  # a CLI command without --quiet, running a recipe with quiet = true
        _scores(teacher, tmp_path)
    err = capsys.readouterr().err
    texts = teacher.encoded
    assert f"embedding {texts} texts with the teacher" in err and str(tmp_path) in err
    assert bars == [True]  # quiet silences per-step logs, not a multi-minute phase
