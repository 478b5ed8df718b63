"""The API key (issue #50): the answers a client sees (401 JSON naming what was wrong, ``WWW-Authenticate: Bearer``,
the scheme's case ignored, ``/health`` open) and the bearer scheme ``/openapi.json`` declares."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

PROTECTED = {
    "/v1/embeddings",
    "/rerank",
    "/similarity",
    "/search",
    "/index/documents",
    "/v1/models",
    "/metrics",
}


def make_app(tiny_encoder: Any, key: str | None) -> Any:
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    return create_app(tiny_encoder, config=ServeConfig(model_name="tiny", max_wait_ms=1, api_key=key))


def client(app: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(app)


@pytest.mark.parametrize(
    ("header", "status", "reason"),
    [
        (None, 401, "missing API key"),
        ("Bearer wrong", 401, "wrong API key"),
        ("Bearer ", 401, "wrong API key"),
        ("Basic k3y", 401, "wrong API key"),
        ("k3y", 401, "wrong API key"),
        ("Bearer k3y", 200, None),
        ("bearer k3y", 200, None),
        ("BEARER k3y", 200, None),
    ],
)
def test_the_key_is_checked_and_a_refusal_says_why(tiny_encoder, header, status, reason) -> None:
    with client(make_app(tiny_encoder, "k3y")) as http:
        headers = {} if header is None else {"Authorization": header}
        reply = http.post("/v1/embeddings", json={"input": "a cat"}, headers=headers)
        assert reply.status_code == status, reply.text
        if reason is not None:
            assert reply.headers["www-authenticate"] == "Bearer"
            error = reply.json()["error"]
            assert error["type"] == "authentication_error" and error["param"] == "authorization"
            assert error["message"] == f"{reason}: send the header 'Authorization: Bearer <key>'"


def test_without_a_key_every_endpoint_is_open(tiny_encoder) -> None:
    with client(make_app(tiny_encoder, None)) as http:
        assert http.post("/v1/embeddings", json={"input": "a cat"}).status_code == 200
        assert http.get("/metrics").status_code == 200
        assert http.get("/openapi.json").status_code == 200


def test_a_body_of_the_wrong_shape_without_the_key_is_a_401(tiny_encoder) -> None:
    with client(make_app(tiny_encoder, "k3y")) as http:
        reply = http.post("/v1/embeddings", json={"input": 5})
        assert reply.status_code == 401 and reply.json()["error"]["type"] == "authentication_error"


def test_openapi_declares_the_bearer_scheme_on_every_protected_endpoint(tiny_encoder) -> None:
    key = {"Authorization": "Bearer k3y"}
    with client(make_app(tiny_encoder, "k3y")) as http:
        schema = http.get("/openapi.json", headers=key).json()
        for page in ("/docs", "/redoc"):
            assert http.get(page).status_code == 401
            reply = http.get(page, headers=key)
            assert reply.status_code == 200 and "/openapi.json" in reply.text
    scheme = schema["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    security = {path: op.get("security") for path, ops in schema["paths"].items() for op in ops.values()}
    assert set(security) == PROTECTED | {"/health"}  # the docs pages are not operations of the API
    assert security.pop("/health") is None
    assert all(declared == [{"bearerAuth": []}] for declared in security.values()), security


def test_without_a_key_openapi_declares_no_scheme(tiny_encoder) -> None:
    schema = make_app(tiny_encoder, None).openapi()
    assert "securitySchemes" not in schema.get("components", {})
    assert all("security" not in op for ops in schema["paths"].values() for op in ops.values())
