"""The server's ``task`` field: ``/v1/embeddings`` answers with the task adapter's vectors, a micro-batch that
merged tasks runs one forward per task, and an unknown task is a 422 naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from embforge.encoder import Encoder
from embforge.modeling.adapters import add_task_adapter
from tests.modeling.test_task_adapters import TEXTS, nonzero
from tests.serve.test_serve import client_for

pytest.importorskip("fastapi")
pytest.importorskip("peft")


@pytest.fixture
def tasks_model(tmp_path, tiny_encoder) -> Encoder:
    """The tiny model with two task adapters, saved and loaded back (adapters off: the base)."""
    add_task_adapter(tiny_encoder, "retrieval", r=4, seed=1)
    nonzero(tiny_encoder, "retrieval", 1)
    add_task_adapter(tiny_encoder, "similarity", r=4, seed=2)
    nonzero(tiny_encoder, "similarity", 2)
    tiny_encoder.save(tmp_path / "tasks")
    return Encoder.load(tmp_path / "tasks")


def test_each_task_answers_with_its_adapter(tasks_model):
    expected = {task: tasks_model.encode(TEXTS, task=task) for task in (None, "retrieval", "similarity")}
    with client_for(tasks_model) as client:
        for task, vectors in expected.items():
            body = {"input": TEXTS, **({"task": task} if task else {})}
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 200, response.text
            got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
            np.testing.assert_allclose(got, vectors, atol=1e-5, err_msg=str(task))
        assert np.abs(expected["retrieval"] - expected[None]).max() > 1e-2
        listing = client.get("/v1/models").json()["data"][0]
        assert listing["tasks"] == ["retrieval", "similarity"]


def test_a_batch_of_several_tasks_runs_one_forward_per_task(tasks_model, monkeypatch):
    from embforge.serve.dense import DenseServing, TaskIds

    serving = DenseServing(tasks_model)
    items: list = []
    for task in ("retrieval", None, "similarity"):
        ids, _ = serving.batch_items(TEXTS[:3], input_type=None, prompt_name=None, task=task)
        items += ids
    order = [3, 0, 6, 1, 4, 7, 2, 5, 8]  # interleaved, as the batcher merges requests by cost
    forwards: list[set] = []
    plain = tasks_model.embed_ids

    def spy(ids, **options):
        forwards.append({item.task if isinstance(item, TaskIds) else None for item in ids})
        return plain(ids, **options)

    monkeypatch.setattr(tasks_model, "embed_ids", spy)
    rows = serving.batched(512)([items[i] for i in order])
    assert sorted(map(sorted, (map(str, f) for f in forwards))) == [["None"], ["retrieval"], ["similarity"]]
    for position, i in enumerate(order):
        task = ("retrieval", None, "similarity")[i // 3]
        np.testing.assert_allclose(rows[position], tasks_model.encode(TEXTS[i % 3], task=task), atol=1e-5)


def test_an_unknown_task_is_a_422_naming_the_field(tasks_model, tiny_encoder):
    with client_for(tasks_model) as client:
        response = client.post("/v1/embeddings", json={"input": "a", "task": "classification"})
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["param"] == "task"
        assert (
            "unknown task 'classification'" in error["message"]
            and "retrieval, similarity" in error["message"]
        )
        assert client.post("/v1/embeddings", json={"input": "a", "task": "retrieval"}).status_code == 200


def test_a_model_without_tasks_refuses_one(tiny_encoder):
    from embforge.serve.middleware import ApiError
    from embforge.serve.serving import refuse_task

    with client_for(tiny_encoder) as client:
        response = client.post("/v1/embeddings", json={"input": "a", "task": "retrieval"})
        assert response.status_code == 422 and response.json()["error"]["param"] == "task"
        assert "has no task adapters" in response.json()["error"]["message"]
    with pytest.raises(ApiError, match="a sparse model has no task adapters"):
        refuse_task("sparse", "retrieval")  # the sparse and multi-vector servings' check
