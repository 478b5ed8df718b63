"""The request bodies, input check and error shape shared by the servers of the sparse and multi-vector kinds
(:mod:`embforge.sparse.serve`, :mod:`embforge.multivector.serve`).

Errors are the main server's JSON ``{"error": {"message", "type", "param"}}``; a text is empty by the readers' rule
(:func:`embforge.data.texts.is_blank`: only whitespace or zero-width characters), as in the dense server.
"""

from __future__ import annotations

from typing import Literal

from embforge._optional import require
from embforge.data.texts import is_blank

require("fastapi")
from fastapi.responses import JSONResponse  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402


class KindEmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None
    input_type: Literal["document", "query"] = "document"


class KindSearchRequest(BaseModel):
    query: str | list[str]
    top_k: int = Field(default=10, ge=1, le=1000)
    return_text: bool = True


class KindDocument(BaseModel):
    id: str = Field(min_length=1)
    text: str = Field(min_length=1)


class KindDocumentsRequest(BaseModel):
    documents: list[KindDocument]


def error_response(status: int, message: str, param: str | None) -> JSONResponse:
    """The main server's error body with ``status``."""
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param}}, status_code=status
    )


def checked_texts(items: str | list[str], field: str, max_inputs: int) -> list[str] | JSONResponse:
    """``items`` as a list of 1 to ``max_inputs`` non-empty texts, or the 422 that says what is wrong."""
    texts = [items] if isinstance(items, str) else list(items)
    if not texts or len(texts) > max_inputs:
        return error_response(422, f"'{field}' must hold 1 to {max_inputs} texts, got {len(texts)}", field)
    for i, text in enumerate(texts):
        if is_blank(text):
            return error_response(422, f"'{field}[{i}]' is empty", f"{field}[{i}]")
    return texts
