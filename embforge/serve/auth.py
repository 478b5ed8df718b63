"""The API key as a FastAPI security dependency (``HTTPBearer``), so ``/openapi.json`` declares the bearer scheme
on every endpoint that needs it, and the API docs pages behind the same key.

With a key (``embforge serve --api-key``), every route but ``/health`` depends on :func:`key_check`: a request
without ``Authorization: Bearer <key>``, or with another key, is a 401 in the server's JSON error format
(``authentication_error``, ``WWW-Authenticate: Bearer``); two ``Authorization`` headers are a 400 (proxies disagree
on which they forward). The key is compared in constant time. The check runs where FastAPI resolves an endpoint's
dependencies, which is after routing and after the body is read and parsed as JSON: an unknown path is a 404,
a wrong method a 405, a body over the limit a 413 and a body that is not JSON a 422, with or without the key
(the ASGI gate checked the key before all of them until #50); a body that is JSON but not the endpoint's shape
is still a 401 without the key.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

from embforge._optional import require
from embforge.serve.middleware import ApiError

require("fastapi")
from fastapi import Depends, FastAPI, Request, params  # noqa: E402
from fastapi.openapi.docs import (  # noqa: E402
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse, JSONResponse, Response  # noqa: E402
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer  # noqa: E402

OPEN_PATHS = ("/health",)
BEARER = HTTPBearer(
    auto_error=False,  # key_check answers in the server's error format
    scheme_name="bearerAuth",
    description="The server's API key (`embforge serve --api-key`), sent as `Authorization: Bearer <key>`.",
)


def key_check(key: str) -> Callable[..., Awaitable[None]]:
    """The dependency that lets a request through only with ``Authorization: Bearer <key>``."""
    expected = key.encode()

    async def check_key(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
    ) -> None:
        given = request.headers.getlist("authorization")
        if len(given) > 1:
            raise ApiError(
                400,
                "more than one Authorization header; send one: 'Authorization: Bearer <key>'",
                "authorization",
            )
        token = credentials.credentials if credentials is not None else ""
        if not token or not hmac.compare_digest(token.encode(), expected):
            reason = "missing" if not given else "wrong"
            raise ApiError(
                401,
                f"{reason} API key: send the header 'Authorization: Bearer <key>'",
                "authorization",
                "authentication_error",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_key


def guards(key: str | None) -> list[params.Depends]:
    """The dependencies of a protected route: the key check, or none when the server has no key."""
    return [Depends(key_check(key))] if key else []


def add_docs(app: FastAPI, guard: Sequence[params.Depends]) -> None:
    """``/openapi.json``, ``/docs`` (Swagger UI, with its OAuth2 redirect page) and ``/redoc``, each behind
    ``guard``. Create ``app`` with ``openapi_url=None, docs_url=None, redoc_url=None``: FastAPI's own pages are
    plain routes, which take no dependencies."""

    def schema_url(request: Request) -> str:
        return request.scope.get("root_path", "").rstrip("/") + "/openapi.json"

    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    async def swagger(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=schema_url(request),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + "/docs/oauth2-redirect",
        )

    async def oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=schema_url(request), title=f"{app.title} - ReDoc")

    pages: list[tuple[str, Callable[..., Awaitable[Response]]]] = [
        ("/openapi.json", openapi),
        ("/docs", swagger),
        ("/docs/oauth2-redirect", oauth2_redirect),
        ("/redoc", redoc),
    ]
    for path, page in pages:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False, dependencies=list(guard))
