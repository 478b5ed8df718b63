"""How the server serves a multi-vector (ColBERT) model: :class:`MultiVectorServing`, its serving record
(:mod:`embforge.serve.serving`).

Each ``/v1/embeddings`` item's ``embedding`` is the text's token vectors (a list of ``dim``-float lists, masked
tokens dropped, as pylate's ``encode`` gives) with its number of ``tokens``; ``input_type: "query"`` encodes
queries (``[Q]`` marker, ``[MASK]`` expansion), documents otherwise. ``encoding_format: "base64"`` sends the
``(tokens, dim)`` little-endian float32 matrix as one base64 string; token vectors have no truncated or quantised
form (``dimensions``, ``int8`` ... are refused). ``/search`` is MaxSim top ``k`` over the documents added with
``/index/documents``, kept in memory — exact, or through a PLAID index (``--index-kind plaid``, fast-plaid;
rebuilt over the whole corpus after documents are added); ``/similarity`` scores a pair by MaxSim (the first text
as a query, the second as a document).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np

from embforge.modeling.padding import pad_ids
from embforge.multivector.model import MultiVectorEncoder
from embforge.multivector.pooling import check_pool_factor
from embforge.multivector.search import MULTIVECTOR_INDEXES, MultiVectorIndex, create_multivector_index
from embforge.serve.memory_store import MemoryStore
from embforge.serve.middleware import ApiError
from embforge.serve.requests import InputType
from embforge.serve.serving import (
    BatchFn,
    Items,
    SearchStore,
    object_rows,
    refuse_index_options,
    refuse_ranges,
    refuse_task,
)

KIND = "multivector"
FORMATS = ("float", "base64")


class MaxSimDocuments:
    """The documents' token matrices and a MaxSim index over them, built on the first search after an add (the
    memory store's :class:`~embforge.serve.memory_store.KindIndex`)."""

    def __init__(self, kind: str = "exact", *, pool_factor: float = 1) -> None:
        self.pool_factor = pool_factor  # each document's token vectors pooled when indexed
        if kind not in MULTIVECTOR_INDEXES:
            raise ValueError(
                f"a multi-vector model searches by MaxSim in memory; index kind {kind!r} is not available for it "
                f"(choose {' or '.join(MULTIVECTOR_INDEXES)})"
            )
        self.kind = kind
        self.ids: list[str] = []
        self.matrices: list[np.ndarray] = []
        self.index: MultiVectorIndex | None = None

    def add(self, ids: list[str], rows: np.ndarray) -> None:
        self.ids += ids
        self.matrices += list(rows)
        self.close()

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
        if self.index is None:
            self.index = create_multivector_index(self.kind, pool_factor=self.pool_factor)
            self.index.add(self.ids, self.matrices)
        return self.index.search(list(queries), min(k, len(self.ids)))

    def close(self) -> None:
        """Drop the index (a PLAID index removes its temporary folder)."""
        close = getattr(self.index, "close", None)  # only PLAID keeps files
        if close is not None:
            close()
        self.index = None


class MultiVectorServing:
    """A multi-vector model as the server serves it (see the module docstring)."""

    name = KIND
    pair_inputs: tuple[InputType | None, InputType | None] = ("query", "document")

    def __init__(self, model: MultiVectorEncoder, *, ranges: np.ndarray | None = None) -> None:
        refuse_ranges(KIND, ranges)
        self.model = model
        self.dim = model.dim

    def batch_items(
        self,
        texts: list[str],
        *,
        input_type: InputType | None,
        prompt_name: str | None,
        task: str | None = None,
    ) -> tuple[Items, list[int]]:
        refuse_task(KIND, task)
        try:
            prefix = self.model.prompt_text(None, prompt_name)
        except KeyError as err:
            raise ApiError(422, str(err.args[0]), "prompt_name") from None
        ids = self.model.tokenize_ids(texts, is_query=input_type == "query", prefix=prefix)
        return ids, [len(x) for x in ids]

    def batched(self, max_tokens: int) -> BatchFn:
        """Token matrices of a batch (one padded forward, as ``encode`` runs), masked tokens dropped."""
        model = self.model

        def run(ids: Items) -> np.ndarray:
            with model.inference():
                matrices = model.padded_forward(*pad_ids(ids, model.pad_token_id, device=model.device))
                kept = (matrices.abs().sum(-1) > 0).cpu().numpy()
                arrays = matrices.float().cpu().numpy()
            return object_rows([matrix[mask] for matrix, mask in zip(arrays, kept)])

        return run

    def check(self, *, encoding_format: str, dimensions: int | None) -> None:
        if dimensions is not None:
            raise ApiError(
                422,
                "'dimensions' is not available for a multivector model: its token vectors cannot be truncated",
                "dimensions",
            )
        if encoding_format not in FORMATS:
            raise ApiError(
                422,
                f"'encoding_format' {encoding_format} is not available for a multivector model: its token vectors "
                "are not int8-coded or binarised (use float or base64)",
                "encoding_format",
            )

    def answer(
        self, rows: np.ndarray, *, encoding_format: str, dimensions: int | None
    ) -> list[dict[str, object]]:
        if encoding_format == "base64":
            return [
                {"embedding": base64.b64encode(m.astype("<f4").tobytes()).decode(), "tokens": len(m)}
                for m in rows
            ]
        return [{"embedding": m, "tokens": len(m)} for m in rows]

    def similarity(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """MaxSim of each (query, document) pair: each query token's best document token, summed."""
        scores = [float((q @ d.T).max(axis=1).sum()) if len(d) else 0.0 for q, d in zip(first, second)]
        return np.array(scores, dtype=np.float32)

    def open_store(
        self, given: SearchStore | None, *, kind: str | None, options: Mapping[str, object] | None = None
    ) -> SearchStore | None:
        if given is not None:
            raise ValueError(
                "a multi-vector model keeps its search documents in memory (POST /index/documents); "
                "--index folders hold one vector per document: serve it without --index"
            )
        reason = "a multi-vector model's in-memory index takes pool_factor only"
        refuse_index_options(options, reason, takes=("pool_factor",))
        pool_factor = (options or {}).get("pool_factor", 1)
        return MemoryStore(MaxSimDocuments(kind or "exact", pool_factor=check_pool_factor(pool_factor)))

    def describe(self) -> dict[str, object]:
        return {}
