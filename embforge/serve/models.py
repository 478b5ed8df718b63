"""The models one server holds: embedders and rerankers by name, each with its own batcher, queue and limits.

A request's ``model`` field picks one (``/v1/models`` lists them); a server with a single embedder (or reranker)
answers any name with it, as a one-model server always did. Each model has its own :class:`MicroBatcher`, so one
model's full queue (429) or slow batches never hold up another's requests.

Embedders are batched by token cost: the server tokenises a request's texts, queues the token-id lists with their
lengths, and the batch runs through the model's batched forward — the padding-free packed forward of a PyTorch
:class:`~embforge.encoder.Encoder` (``embed_ids``), or one padded call of an exported graph (``embed_sorted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge.serve.batcher import MicroBatcher
from embforge.serve.config import ServeConfig
from embforge.serve.middleware import ApiError

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.onnx.runtime import OnnxCrossEncoder
    from embforge.protocols import PairScorer

EMBEDDING = "embedding"
RERANK = "rerank"


def backend_name(model: object) -> str:
    """``torch``, ``onnx`` or ``openvino``: the runtime a loaded model runs on."""
    return str(getattr(model, "backend", None) or ("torch" if _is_torch(model) else "onnx"))


def _is_torch(model: object) -> bool:
    import torch

    return isinstance(model, torch.nn.Module)


def embed_fn(model: Any, max_tokens: int) -> Callable[[list[list[int]]], np.ndarray]:
    """``token-id lists -> (n, dim) float32`` through ``model``'s batched forward (see the module docstring)."""
    if not _is_torch(model):
        return lambda ids: np.asarray(model.embed_sorted(ids, batch_size=len(ids)), dtype=np.float32)
    import torch

    model.eval()

    def run(ids: list[list[int]]) -> np.ndarray:
        with torch.inference_mode():
            return model.embed_ids(ids, max_tokens=max_tokens).float().cpu().numpy()

    return run


def score_fn(model: PairScorer) -> Callable[[list[tuple[str, str]]], np.ndarray]:
    """``pairs -> scores`` of a cross-encoder (PyTorch or ONNX), one batch per call."""
    return lambda pairs: np.asarray(model.predict(pairs, batch_size=len(pairs)), dtype=np.float32)


@dataclass
class ServedModel:
    """One loaded model as the server runs it."""

    name: str
    kind: str  # EMBEDDING or RERANK
    model: Any
    batcher: MicroBatcher
    ranges: np.ndarray | None = None  # int8/uint8 calibration ranges (embedders)
    backend: str = "torch"

    @property
    def dim(self) -> int | None:
        return int(self.model.dim) if self.kind == EMBEDDING else None

    def describe(self) -> dict[str, object]:
        """The ``/v1/models`` entry."""
        entry: dict[str, object] = {
            "id": self.name,
            "object": "model",
            "owned_by": "embforge",
            "kind": self.kind,
        }
        entry["backend"] = self.backend
        if self.kind == EMBEDDING:
            entry["dim"] = self.dim
            entry["quantized_formats"] = ["binary", "ubinary"] + (
                ["int8", "uint8"] if self.ranges is not None else []
            )
        return entry


class ModelSet:
    """Embedders and rerankers by name (insertion order: the first of each kind is the default)."""

    def __init__(
        self,
        embedders: Mapping[str, Any],
        rerankers: Mapping[str, PairScorer],
        config: ServeConfig,
        *,
        ranges: Mapping[str, np.ndarray | None] | None = None,
        on_batch: Callable[[str, int, float], None] | None = None,
    ) -> None:
        if not embedders:
            raise ValueError("the server needs at least one embedding model")
        self.config = config
        self.embedders = {
            name: self._served(
                name, EMBEDDING, model, (ranges or {}).get(name), _label("embedding", name, i), on_batch
            )
            for i, (name, model) in enumerate(embedders.items())
        }
        self.rerankers = {
            name: self._served(name, RERANK, model, None, _label("reranker", name, i), on_batch)
            for i, (name, model) in enumerate(rerankers.items())
        }

    def _served(
        self,
        name: str,
        kind: str,
        model: Any,
        ranges: np.ndarray | None,
        label: str,
        on_batch: Callable[[str, int, float], None] | None,
    ) -> ServedModel:
        cfg = self.config
        fn = embed_fn(model, cfg.max_batch_tokens) if kind == EMBEDDING else score_fn(model)
        batcher = MicroBatcher(
            fn,
            max_batch_size=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            max_wait_ms=cfg.max_wait_ms,
            max_queue=cfg.max_queue,
            on_batch=(lambda n, seconds: on_batch(label, n, seconds)) if on_batch is not None else None,
            concurrency=int(getattr(model, "parallel_batches", 1)),  # an OpenVINO runtime's streams
        )
        if ranges is None and kind == EMBEDDING:
            ranges = _saved_ranges(model)
        return ServedModel(name, kind, model, batcher, ranges=ranges, backend=backend_name(model))

    def all(self) -> list[ServedModel]:
        return [*self.embedders.values(), *self.rerankers.values()]

    def start(self) -> None:
        for served in self.all():
            served.batcher.start()

    async def stop(self) -> None:
        for served in self.all():
            await served.batcher.stop()

    def embedder(self, name: str | None) -> ServedModel:
        return _pick(self.embedders, name, "embedding")

    def reranker(self, name: str | None) -> ServedModel:
        if not self.rerankers:
            raise ApiError(
                501, "no reranker is loaded; start the server with --reranker MODEL", "model", "not_available"
            )
        return _pick(self.rerankers, name, "rerank")

    def listing(self) -> dict[str, object]:
        return {"object": "list", "data": [served.describe() for served in self.all()]}


def _label(kind: str, name: str, position: int) -> str:
    """The metrics label of a model's batches: ``embedding`` / ``reranker`` for the first, ``kind:name`` after."""
    return kind if position == 0 else f"{kind}:{name}"


def _pick(models: dict[str, ServedModel], name: str | None, kind: str) -> ServedModel:
    if name is None or len(models) == 1:
        return next(iter(models.values()))
    if name not in models:
        known = ", ".join(models)
        raise ApiError(
            404, f"no {kind} model named {name!r}; this server has: {known}", "model", "model_not_found"
        )
    return models[name]


def _saved_ranges(model: object) -> np.ndarray | None:
    """Calibration ranges saved beside the model (``embforge_quantization.json`` in its folder), if any."""
    from embforge.quantization import read_ranges

    where = getattr(model, "graph", None) or getattr(model, "name_or_path", None)
    if where is None:
        return None
    try:
        from embforge.modeling.resolve import resolve_model_path

        folder = where if getattr(model, "graph", None) is not None else resolve_model_path(where)
        return read_ranges(folder)
    except (OSError, ValueError):
        return None


def pair_costs(model: CrossEncoder | OnnxCrossEncoder, query: str, docs: Sequence[str]) -> list[int]:
    """Token counts of ``(query, doc)`` pairs as the cross-encoder's tokenizer cuts them (the batching cost)."""
    enc = model.tokenizer(
        [query] * len(docs),
        list(docs),
        truncation=True,
        max_length=int(model.max_seq_length),
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    return [len(ids) for ids in enc["input_ids"]]
