"""API fuzzing (schemathesis): requests generated from the server's OpenAPI schema — valid and invalid bodies —
(positive and negative generation) sent to a real uvicorn on loopback with a reranker and a document store, for
every model kind the server serves (dense, static, sparse, multi-vector: one app, the same endpoints). No answer may
be a 5xx, and every 4xx must be a JSON error object. Bounded: 150 examples for the dense model, fewer for the
others. With an API key the schema declares the bearer scheme, and schemathesis sends its own ``Authorization``
headers (missing, empty, random); the valid requests carry the key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import make_tokenizer, running, tiny_bert_config
from tests.serve.tiny_kinds import build

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("uvicorn")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _reranker():
    import torch
    from transformers import BertForSequenceClassification

    from embforge.cross_encoder import CrossEncoder

    tokenizer = make_tokenizer()
    torch.manual_seed(1)
    config = tiny_bert_config(len(tokenizer), num_hidden_layers=1, num_labels=1, max_position_embeddings=512)
    return CrossEncoder(BertForSequenceClassification(config), tokenizer, max_seq_length=64).eval()


@pytest.mark.parametrize(
    ("kind", "examples", "key"),
    [
        ("dense", 150, None),
        ("dense", 60, "k3y"),
        ("static", 40, None),
        ("sparse", 60, None),
        ("multivector", 60, None),
    ],
)
def test_fuzzed_requests_never_get_a_5xx_and_4xx_are_json_errors(
    kind: str, examples: int, key: str | None, tmp_path: Path
):
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig
    from embforge.serve.store import DocumentStore

    tiny = build(kind, tmp_path)
    config = ServeConfig(model_name="tiny", max_wait_ms=1, max_inputs=16, max_chars=512, api_key=key)
    store = DocumentStore.open(tmp_path / "docs", dim=tiny.model.dim) if tiny.store else None
    app = create_app(tiny.model, reranker=_reranker(), store=store, config=config)
    schema = schemathesis.openapi.from_dict(app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/embeddings", "/rerank", "/search", "/index/documents"}
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    with_key = {"Authorization": f"Bearer {key}"} if key else None
    cases = st.one_of(
        *(op.as_strategy(generation_mode=positive).map(lambda case: (case, with_key)) for op in operations),
        *(op.as_strategy(generation_mode=negative).map(lambda case: (case, None)) for op in operations),
    )
    started = time.perf_counter()
    seen: dict[str, list[int]] = {}

    with running(app, config) as (port, _):
        base = f"http://127.0.0.1:{port}"

        @settings(
            max_examples=examples,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(drawn=cases)
        def fuzz(drawn) -> None:
            case, headers = drawn
            response = case.call(base_url=base, headers=headers, timeout=30)
            seen.setdefault(case.operation.path, []).append(response.status_code)
            assert response.status_code < 500, (case.operation.path, case.body, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert isinstance(error["message"], str) and error["message"], response.text

        fuzz()
    elapsed = time.perf_counter() - started
    counts = {path: {c: codes.count(c) for c in sorted(set(codes))} for path, codes in seen.items()}
    print(
        f"schemathesis ({kind}, key: {key is not None}): {sum(map(len, seen.values()))} requests in {elapsed:.1f} s: {counts}"
    )
    assert sum(len(v) for v in seen.values()) >= examples * 2 // 3
    assert any(code == 200 for codes in seen.values() for code in codes)  # not only rejections
    if key:  # the generated Authorization headers reached the key check
        assert any(code == 401 for codes in seen.values() for code in codes)
