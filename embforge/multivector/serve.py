"""The server of a multi-vector (ColBERT) model: token vectors from ``/v1/embeddings``, MaxSim ``/search``.

:func:`embforge.serve.app.create_app` hands a multi-vector model here (its kind is declared, :mod:`embforge.kinds`);
the app is the one of every non-dense kind (:func:`embforge.serve.kind_api.create_kind_app`). Each ``embedding`` is
the text's token vectors (a list of ``dim``-float lists, masked tokens dropped), as pylate's ``encode`` gives, with
its number of ``tokens``; ``/search`` is MaxSim top ``k`` over the added documents — exact, or through a PLAID index
(``index="plaid"``, fast-plaid; rebuilt over the whole corpus after documents are added).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from embforge.multivector.model import MultiVectorEncoder
from embforge.multivector.search import MultiVectorIndex, create_multivector_index
from embforge.serve.kind_api import create_kind_app

if TYPE_CHECKING:
    from fastapi import FastAPI


class MultiVectorBackend:
    """A multi-vector model and its documents' token matrices, with the index over them (rebuilt when stale),
    for :func:`~embforge.serve.kind_api.create_kind_app`."""

    kind = "multivector"

    def __init__(self, model: MultiVectorEncoder, index: str = "exact") -> None:
        self.model = model
        self.dim = model.dim
        self.index_kind = index
        self.doc_ids: list[str] = []
        self.texts: dict[str, str] = {}
        self.matrices: list[np.ndarray] = []
        self.index: MultiVectorIndex | None = None

    def encode(self, texts: list[str], is_query: bool) -> list[np.ndarray]:
        return self.model.encode(texts, is_query=is_query)

    def items(self, matrices: list[np.ndarray]) -> tuple[list[dict[str, object]], dict[str, int]]:
        items = [{"embedding": m.tolist(), "tokens": len(m)} for m in matrices]
        return items, {"total_tokens": sum(len(m) for m in matrices)}

    def ids(self) -> Sequence[str]:
        return self.doc_ids

    def add(self, ids: list[str], texts: list[str], matrices: list[np.ndarray]) -> None:
        self.doc_ids += ids
        self.texts.update(zip(ids, texts))
        self.matrices += matrices
        self.index = None

    def search(self, queries: list[np.ndarray], k: int) -> list[list[tuple[str, float]]]:
        if self.index is None:
            self.index = create_multivector_index(self.index_kind)
            self.index.add(self.doc_ids, self.matrices)
        scores, ids = self.index.search(queries, min(k, len(self.doc_ids)))
        return [[(d, float(s)) for d, s in zip(found, row)] for row, found in zip(scores, ids)]

    def text(self, doc_id: str) -> str:
        return self.texts[doc_id]


def create_multivector_app(
    model: MultiVectorEncoder, *, name: str = "colbert", index: str = "exact", max_inputs: int = 2048
) -> FastAPI:
    """A FastAPI app serving ``model`` (see the module docstring); ``index``: ``exact`` or ``plaid``."""
    return create_kind_app(MultiVectorBackend(model, index), name=name, max_inputs=max_inputs)
