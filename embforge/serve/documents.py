"""A document as every store holds it (the SQLite folder store and the in-memory one of the other kinds).

Checked on the way in (:func:`document_row`, :func:`unit_vectors`), refused when its id is taken
(:func:`taken`, :class:`DuplicateIdError`), read back (:class:`StoredDocument`) and found (:class:`Hit`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TypedDict

import numpy as np

from embforge.serve.database import to_json


class DuplicateIdError(ValueError):
    """An added id is already stored (or repeated in the same add); ``position`` is its place in the add."""

    def __init__(self, position: int, key: str) -> None:
        super().__init__(f"document id {key!r} (position {position}) is already in the index")
        self.position = position
        self.key = key


class StoredDocument(TypedDict):
    """A stored document as it is read back: its text and its JSON fields."""

    text: str
    fields: dict[str, object]


class _Hit(TypedDict):
    id: str
    score: float
    fields: dict[str, object]


class Hit(_Hit, total=False):
    """One search result: the document's id, score and fields (and its text when asked for)."""

    text: str


def hit(key: str, score: float, doc: StoredDocument, *, with_text: bool) -> Hit:
    """A search result for the stored ``doc``; keys in the order the API documents."""
    if with_text:
        return {"id": key, "score": float(score), "text": doc["text"], "fields": doc["fields"]}
    return {"id": key, "score": float(score), "fields": doc["fields"]}


def document_row(position: int, doc: Mapping[str, object]) -> tuple[str, str, str]:
    """``(id, text, fields JSON)`` of one added document, or a ``ValueError`` saying why it cannot be stored."""
    key, text, fields = doc.get("id"), doc.get("text"), doc.get("fields") or {}
    if not isinstance(key, str) or not key:
        raise ValueError(f"document {position}: 'id' must be a non-empty string, got {key!r}")
    if not isinstance(text, str):
        raise ValueError(f"document {position}: 'text' must be a string, got {type(text).__name__}")
    if not isinstance(fields, dict):
        raise ValueError(f"document {position}: 'fields' must be an object, got {type(fields).__name__}")
    for name, value in (("id", key), ("text", text)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"document {position}: its {name} cannot be stored: not valid Unicode ({err.reason} at {err.start})"
            ) from None
    try:
        return key, text, to_json(fields)
    except (TypeError, ValueError) as err:
        raise ValueError(f"document {position}: a field cannot be stored: {err}") from err


def unit_vectors(x: np.ndarray, dim: int, n: int) -> np.ndarray:
    """``n`` vectors of size ``dim`` scaled to unit length (scores are cosines), or a ``ValueError`` saying why not."""
    array = np.asarray(x, dtype=np.float32)
    if array.shape != (n, dim):
        raise ValueError(f"expected vectors of shape ({n}, {dim}), got {tuple(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError("the vectors contain NaN or infinity")
    return array / np.maximum(np.linalg.norm(array, axis=-1, keepdims=True), 1e-12)


def taken(ids: Sequence[str], stored: Collection[str]) -> list[int]:
    """Positions of ``ids`` that are in ``stored`` or repeat an earlier one of ``ids``."""
    seen: set[str] = set()
    out = []
    for position, key in enumerate(ids):
        if key in stored or key in seen:
            out.append(position)
        seen.add(key)
    return out
