"""The model card (issue #50): Hub metadata that ``huggingface_hub`` reads back, and the body's training figures,
usage and reproduction; written offline from plain data, without training a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embforge.training.config import TrainConfig
from embforge.training.model_card import write_model_card

TASKS = [
    {"name": "sts", "source": "data/sts.csv", "rows": 32, "columns": ["a", "b", "score"], "loss": "cosent"},
    {"name": "nli", "source": "sentence-transformers/all-nli", "rows": 100, "loss": "mnrl", "weight": 2.0},
]
FINAL = {"spearman": 81.25, "pearson": 79.5}


@pytest.fixture
def card(tiny_model_dir: Path) -> Path:
    history = [{"step": s, "eval": {"spearman": 70.0 + s, "pearson": 69.0 + s}} for s in (2, 4)]
    (tiny_model_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    return write_model_card(
        tiny_model_dir,
        base_model="all-MiniLM-L6-v2",
        tasks_info=TASKS,
        config=TrainConfig(lr=1e-3),
        eval_results=FINAL,
        best={"step": 4, "value": 74.0},
        seconds=75.0,
        steps=4,
        device="cpu",
        command="embforge train --train sts.csv --output tiny",
    )


def test_the_body_carries_the_figures_usage_and_reproduction(card: Path) -> None:
    text = card.read_text(encoding="utf-8")
    assert "| sts | `data/sts.csv` | 32 | a, b, score | `cosent` | – | 1 |" in text
    assert "| nli | `sentence-transformers/all-nli` | 100 | – | `mnrl` | – | 2 |" in text
    assert "132 training rows in all." in text and "| `lr` | `0.001` |" in text
    assert "| spearman | 81.25 |" in text and "| pearson | 79.50 |" in text
    assert "Best metric: 74.00 at step 4." in text
    assert "| step | spearman | pearson |" in text and "| 4 | 74.00 | 73.00 |" in text
    assert "- Training time: 1 min 15 s" in text and "- Optimiser steps: 4" in text
    assert 'Encoder.load("tiny")' in text and "embforge train --train sts.csv --output tiny" in text
    assert "| Output dimensionality | 32 |" in text and "- embforge: " in text
    assert "fine-tuned from [sentence-transformers/all-MiniLM-L6-v2]" in text


def test_huggingface_hub_reads_the_metadata(card: Path) -> None:
    from huggingface_hub import ModelCard

    data = ModelCard.load(card).data  # a local file: no network
    assert data.library_name == "sentence-transformers"
    assert data.pipeline_tag == "sentence-similarity"
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert data.tags[:3] == ["sentence-transformers", "sentence-similarity", "embforge"]
    assert {"loss:cosent", "loss:mnrl"} <= set(data.tags)


def test_the_metadata_has_the_final_figures_as_a_model_index(card: Path) -> None:
    from huggingface_hub import ModelCard

    text = card.read_text(encoding="utf-8")
    assert text.startswith("---\nlibrary_name: sentence-transformers\npipeline_tag: sentence-similarity\n")
    data = ModelCard.load(card).data
    assert data.datasets == ["sentence-transformers/all-nli"]  # a Hub id; a local file is not a Hub data set
    assert data.model_name == "tiny"
    figures = {r.metric_type: r.metric_value for r in data.eval_results}
    assert figures == FINAL
    assert {(r.task_type, r.dataset_name) for r in data.eval_results} == {
        ("sentence-similarity", "evaluation during training")
    }
    index = data.to_dict()["model-index"]
    assert [m["value"] for m in index[0]["results"][0]["metrics"]] == list(FINAL.values())


def test_no_evaluation_no_model_index_and_a_local_base_model_is_not_metadata(tiny_model_dir: Path) -> None:
    from huggingface_hub import ModelCard

    card = write_model_card(
        tiny_model_dir, base_model=str(tiny_model_dir), tasks_info=TASKS[:1], config=TrainConfig()
    )
    data = ModelCard.load(card).data
    assert data.eval_results is None and data.base_model is None and data.datasets is None
    assert "No evaluation ran during training" in card.read_text(encoding="utf-8")
    assert f"fine-tuned from `{tiny_model_dir}`" in card.read_text(encoding="utf-8")
