"""A pipeline trains a cross-encoder given as its model: its stages are checked and built for the model's kind
(a cross-encoder has no embedding dimension), and a rerun takes the last stage's weights back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embforge.cross_encoder import CrossEncoder
from embforge.kinds import ModelKind
from embforge.training.pipeline import (
    Pipeline,
    PipelineError,
    parse_pipeline,
    run_pipeline,
    validate_pipeline,
)
from tests.conftest import make_cross_encoder

PAIRS = [("a man plays the guitar", "a man is playing guitar"), ("the sun in the sky", "rain on the river")]


def rerank_pipeline(sts_csv: Path, *, stage: dict | None = None, task: dict | None = None) -> Pipeline:
    """Two pointwise stages on the STS pairs (``bce`` on scores scaled from 0-5), ``stage`` and ``task`` fields
    added to each."""
    sts = {"name": "sts", "data": str(sts_csv), "loss": "bce", "options": {"label_max": 5.0}, **(task or {})}
    stages = [
        {"name": n, "lr": 1e-3, "steps": 2, "tasks": [sts], **(stage or {})} for n in ("first", "second")
    ]
    defaults = {"batch_size": 4, "device": "cpu", "amp": "no", "quiet": True}
    return parse_pipeline({"defaults": defaults, "stages": stages}, source="rerank")


def test_a_pipeline_trains_a_given_cross_encoder_and_a_rerun_reloads_it(
    tmp_path, sts_csv, tiny_cross_encoder
):
    before = tiny_cross_encoder.predict(PAIRS)
    result = run_pipeline(rerank_pipeline(sts_csv), output=str(tmp_path / "out"), model=tiny_cross_encoder)
    assert [(s["name"], s["steps"]) for s in result["stages"]] == [("first", 2), ("second", 2)]
    trained = tiny_cross_encoder.predict(PAIRS)
    assert not np.allclose(trained, before)
    np.testing.assert_allclose(CrossEncoder.load(result["final"]).predict(PAIRS), trained, rtol=1e-5)
    # every stage is done: a rerun trains nothing and gives the model the last stage's weights
    other = make_cross_encoder(seed=1)
    run_pipeline(rerank_pipeline(sts_csv), output=str(tmp_path / "out"), model=other)
    np.testing.assert_allclose(other.predict(PAIRS), trained, rtol=1e-5)


def test_cross_encoder_stages_refuse_mining_and_matryoshka_before_training(sts_csv):
    mining = rerank_pipeline(sts_csv, task={"mine": {"method": "bm25"}})
    with pytest.raises(
        PipelineError, match=r"stage 1 \('first'\), task 'sts': field 'mine': .* cross-encoder"
    ):
        validate_pipeline(mining, dim=None, kind=ModelKind.CROSS)
    matryoshka = rerank_pipeline(sts_csv, stage={"matryoshka_dims": [16]})
    with pytest.raises(PipelineError, match=r"field 'loss' = 'bce': matryoshka_dims applies to bi-encoders"):
        validate_pipeline(matryoshka, dim=None, kind=ModelKind.CROSS)
