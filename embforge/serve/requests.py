"""The request bodies of the server's endpoints (pydantic models: FastAPI validates a request against them and
writes them into ``/openapi.json``)."""

from __future__ import annotations

from typing import Literal

from embforge._optional import require

require("fastapi")
from pydantic import BaseModel, Field  # noqa: E402

InputType = Literal["query", "document"]
EncodingFormat = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields, plus ``input_type`` (a query or a document: the model's prompt for
    it, or the kind's own query encoding), ``prompt_name`` (one of the model's prompts by name) and ``task`` (one of
    the model's task adapters, :mod:`embforge.modeling.adapters`; absent: the base)."""

    input: str | list[str]
    model: str | None = None
    dimensions: int | None = None
    encoding_format: EncodingFormat = "float"
    user: str | None = None
    prompt_name: str | None = None
    input_type: InputType | None = None
    task: str | None = None


class RerankRequest(BaseModel):
    """``POST /rerank``: a query and its documents (or TEI's ``texts``)."""

    query: str
    documents: list[str | dict[str, object]] | None = None
    texts: list[str] | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    model: str | None = None


class SimilarityRequest(BaseModel):
    """``POST /similarity``: pairs of texts to score."""

    pairs: list[tuple[str, str]]
    model: str | None = None


class SearchRequest(BaseModel):
    """``POST /search``: queries against the documents of the index."""

    query: str | list[str]
    top_k: int | None = Field(default=None, ge=1, le=1000)
    return_text: bool = True


class Document(BaseModel):
    """One document of ``POST /index/documents``."""

    id: str = Field(min_length=1)
    text: str
    fields: dict[str, object] = Field(default_factory=dict)


class AddDocumentsRequest(BaseModel):
    """``POST /index/documents``."""

    documents: list[Document]
