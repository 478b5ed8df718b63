"""A pipeline trains a cross-encoder given as its model: its stages are checked and built for the model's kind
(a cross-encoder has no embedding dimension), and a rerun takes the last stage's weights back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embforge.cross_encoder import CrossEncoder
from embforge.kinds import ModelKind
from embforge.training.pipeline import PipelineError, load_pipeline, run_pipeline, validate_pipeline
from tests.conftest import make_cross_encoder

PAIRS = [("a man plays the guitar", "a man is playing guitar"), ("the sun in the sky", "rain on the river")]


def rerank_pipeline(tmp_path: Path, sts_csv: Path, *, task_extra: str = "") -> Path:
    """Two pointwise stages on the STS pairs (``bce`` on scores scaled from 0-5)."""
    stages = "".join(
        f"""
[[stages]]
name = "{name}"
lr = 1e-3
steps = 2
  [[stages.tasks]]
  name = "sts"
  data = {json.dumps(str(sts_csv))}
  loss = "bce"
  options = {{ label_max = 5.0 }}
  {task_extra}
"""
        for name in ("first", "second")
    )
    path = tmp_path / "rerank.toml"
    path.write_text('[defaults]\nbatch_size = 4\ndevice = "cpu"\namp = "no"\nquiet = true\n' + stages)
    return path


def test_a_pipeline_trains_a_given_cross_encoder_and_a_rerun_reloads_it(
    tmp_path, sts_csv, tiny_cross_encoder
):
    path = rerank_pipeline(tmp_path, sts_csv)
    before = tiny_cross_encoder.predict(PAIRS)
    result = run_pipeline(load_pipeline(path), output=str(tmp_path / "out"), model=tiny_cross_encoder)
    assert [(s["name"], s["steps"]) for s in result["stages"]] == [("first", 2), ("second", 2)]
    trained = tiny_cross_encoder.predict(PAIRS)
    assert not np.allclose(trained, before)
    np.testing.assert_allclose(CrossEncoder.load(result["final"]).predict(PAIRS), trained, rtol=1e-5)
    # every stage is done: a rerun trains nothing and gives the model the last stage's weights
    other = make_cross_encoder(seed=1)
    run_pipeline(load_pipeline(path), output=str(tmp_path / "out"), model=other)
    np.testing.assert_allclose(other.predict(PAIRS), trained, rtol=1e-5)


def test_cross_encoder_stages_refuse_mining_and_matryoshka_before_training(tmp_path, sts_csv):
    mining = load_pipeline(rerank_pipeline(tmp_path, sts_csv, task_extra='mine = { method = "bm25" }'))
    with pytest.raises(
        PipelineError, match=r"stage 1 \('first'\), task 'sts': field 'mine': .* cross-encoder"
    ):
        validate_pipeline(mining, dim=None, kind=ModelKind.CROSS)
    path = rerank_pipeline(tmp_path, sts_csv)
    path.write_text(path.read_text().replace("steps = 2", "steps = 2\nmatryoshka_dims = [16]", 1))
    with pytest.raises(PipelineError, match=r"field 'loss' = 'bce': matryoshka_dims applies to bi-encoders"):
        validate_pipeline(load_pipeline(path), dim=None, kind=ModelKind.CROSS)
