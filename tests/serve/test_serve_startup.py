"""Issue #48: what the server is started with and what it says it serves — an empty API key is refused, a model
name the server does not serve is a 404, and an int8-quantised runtime says so (health, models, start-up line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

TEXTS = ["a man plays the guitar", "the cat", "oil price falls"]


def _no_model(*args: Any, **kwargs: Any) -> Any:
    raise ValueError("the model was loaded")


@pytest.mark.parametrize("key", ["", "   "])
def test_an_empty_api_key_is_an_error_naming_the_flag(key: str, monkeypatch, capsys) -> None:
    import embforge.serve.runner as runner
    from embforge.cli import main

    monkeypatch.setattr(runner, "load_encoder", _no_model)
    monkeypatch.setenv("EMBFORGE_API_KEY", "from-the-environment")
    assert main(["serve", "--model", "m", "--api-key", key]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--api-key" in err[0] and "empty" in err[0], err


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_api_key_variable_is_an_error_naming_it(value: str, monkeypatch, capsys) -> None:
    import embforge.serve.runner as runner
    from embforge.cli import main

    monkeypatch.setattr(runner, "load_encoder", _no_model)
    monkeypatch.setenv("EMBFORGE_API_KEY", value)
    assert main(["serve", "--model", "m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "EMBFORGE_API_KEY" in err[0] and "empty" in err[0], err


def test_a_config_with_an_empty_key_is_refused() -> None:
    from embforge.serve.config import ServeConfig

    with pytest.raises(ValueError, match="--api-key"):
        ServeConfig(api_key="")


def test_a_model_name_the_server_does_not_serve_is_a_404(tiny_encoder, tiny_cross_encoder) -> None:
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    config = ServeConfig(model_name="tiny", reranker_name="rr", max_wait_ms=1)
    with TestClient(create_app(tiny_encoder, reranker=tiny_cross_encoder, config=config)) as client:
        served = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert served == ["tiny", "rr"]
        wrong = client.post("/v1/embeddings", json={"input": "a cat", "model": "text-embedding-3-small"})
        assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
        assert "'text-embedding-3-small'" in wrong.json()["error"]["message"]
        assert "tiny" in wrong.json()["error"]["message"]
        reranked = client.post("/rerank", json={"query": "a", "documents": ["b"], "model": "tiny"})
        assert reranked.status_code == 404
        assert client.post("/v1/embeddings", json={"input": "a cat", "model": "tiny"}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "a cat"}).status_code == 200
        assert (
            client.post("/rerank", json={"query": "a", "documents": ["b"], "model": "rr"}).status_code == 200
        )


@pytest.fixture
def exported(tiny_model_dir: Path, tmp_path: Path) -> Path:
    pytest.importorskip("onnxruntime")
    from embforge.onnx.export import export_onnx

    export_onnx(tiny_model_dir, tmp_path / "onnx", parity_texts=TEXTS, quantize="int8")
    return tmp_path / "onnx"


def test_an_int8_runtime_names_its_precision(exported: Path, tiny_encoder) -> None:
    from fastapi.testclient import TestClient

    from embforge.encoder import Encoder
    from embforge.serve.app import create_app

    int8 = Encoder.load(exported / "model_int8.onnx", backend="onnx")
    fp32 = Encoder.load(exported, backend="onnx")
    with TestClient(create_app({"q": int8, "f": fp32, "t": tiny_encoder})) as client:
        listing = client.get("/v1/models").json()["data"]
        health = client.get("/health").json()
    got = {m["id"]: (m["backend"], m["precision"]) for m in listing}
    assert got == {"q": ("onnx", "int8"), "f": ("onnx", "fp32"), "t": ("torch", "fp32")}
    assert (health["backend"], health["precision"]) == ("onnx", "int8")


def test_the_start_up_line_says_the_vectors_are_int8_and_how_to_get_exact_ones(
    exported: Path, monkeypatch, capsys
) -> None:
    uvicorn = pytest.importorskip("uvicorn")
    import embforge.serve.runner as runner
    from embforge.encoder import Encoder

    int8 = Encoder.load(exported / "model_int8.onnx", backend="onnx")
    monkeypatch.setattr(runner, "load_encoder", lambda *args, **kwargs: int8)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *args: None)
    runner.serve("m", backend="auto")
    line = next(line for line in capsys.readouterr().err.splitlines() if "precision" in line)
    assert "backend onnx" in line and "precision int8" in line and "--backend onnx" in line, line
