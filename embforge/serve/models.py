"""The models one server holds: embedders and rerankers by name, each with its own batcher, queue and limits.

A request's ``model`` field picks one (``/v1/models`` lists them): a name the server does not serve is a 404, one
model or several; without a ``model`` field the first of each kind answers. Each model has its own
:class:`MicroBatcher`, so one model's full queue (429) or slow batches never hold up another's requests.

An embedder of any kind (dense, static, sparse, multi-vector) is served through its kind's serving record
(:mod:`embforge.serve.serving`): the server tokenises a request's texts, queues the token-id lists with their
lengths (the batch cost), and each batch runs through the record's batched function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from embforge.cross_encoder import CrossEncoder
from embforge.encoder import Encoder
from embforge.modeling.encoding import BatchEncoding
from embforge.onnx.runtime import ExportedEncoder, OnnxCrossEncoder
from embforge.serve.batcher import MicroBatcher
from embforge.serve.config import ServeConfig
from embforge.serve.middleware import ApiError
from embforge.serve.serving import KindServing, serving_for
from embforge.static.model import StaticEncoder

RERANK = "rerank"
Reranker = CrossEncoder | OnnxCrossEncoder  # OpenVINO's cross-encoder is an OnnxCrossEncoder


def score_fn(model: Reranker) -> Callable[[list[tuple[str, str]]], np.ndarray]:
    """``pairs -> scores`` of a cross-encoder (PyTorch or ONNX), one batch per call."""
    return lambda pairs: np.asarray(model.predict(pairs, batch_size=len(pairs)), dtype=np.float32)


@dataclass
class ServedModel:
    """One loaded model as the server runs it: its name, batcher and runtime (``torch``, ``onnx``,
    ``openvino``)."""

    name: str
    batcher: MicroBatcher
    backend: str

    def describe(self) -> dict[str, object]:
        """The ``/v1/models`` entry."""
        return {"id": self.name, "object": "model", "owned_by": "embforge", "backend": self.backend}


@dataclass
class ServedEmbedder(ServedModel):
    """An embedding model of any kind, served through its kind's record (:mod:`embforge.serve.serving`); its
    ``precision`` (``fp32``, ``int8`` ...) is what the vectors it answers are computed in."""

    serving: KindServing
    precision: str

    @property
    def dim(self) -> int:
        return self.serving.dim

    def describe(self) -> dict[str, object]:
        entry = {
            **super().describe(),
            "precision": self.precision,
            "kind": self.serving.name,
            "dim": self.dim,
        }
        return {**entry, **self.serving.describe()}


@dataclass
class ServedReranker(ServedModel):
    """A cross-encoder (PyTorch, ONNX Runtime or OpenVINO) answering ``/rerank``."""

    model: Reranker

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "kind": RERANK}


Served = TypeVar("Served", bound=ServedModel)


class ModelSet:
    """Embedders and rerankers by name (insertion order: the first of each kind is the default)."""

    def __init__(
        self,
        embedders: Mapping[str, object],
        rerankers: Mapping[str, Reranker],
        config: ServeConfig,
        *,
        ranges: Mapping[str, np.ndarray | None] | None = None,
        on_batch: Callable[[str, int, float], None] | None = None,
    ) -> None:
        if not embedders:
            raise ValueError("the server needs at least one embedding model")
        self.config = config
        self.on_batch = on_batch
        self.embedders = {
            name: self._embedder(name, model, (ranges or {}).get(name), i)
            for i, (name, model) in enumerate(embedders.items())
        }
        self.rerankers = {
            name: ServedReranker(
                name,
                self._batcher(score_fn(model), _label("reranker", name, i), model),
                _backend(model),
                model,
            )
            for i, (name, model) in enumerate(rerankers.items())
        }

    def _embedder(self, name: str, model: object, ranges: np.ndarray | None, position: int) -> ServedEmbedder:
        """``model`` served through its kind's record (int8/uint8 ranges: given, or saved beside a dense model)."""
        ranges = _ranges(ranges, model) if isinstance(model, BatchEncoding) else ranges
        serving = serving_for(model, ranges=ranges)
        fn = serving.batched(self.config.max_batch_tokens)
        batcher = self._batcher(fn, _label("embedding", name, position), model)
        return ServedEmbedder(name, batcher, _backend(model), serving, _precision(model))

    def _batcher(self, fn: Callable[[list[Any]], np.ndarray], label: str, model: object) -> MicroBatcher:
        cfg, on_batch = self.config, self.on_batch
        return MicroBatcher(
            fn,
            max_batch_size=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            max_wait_ms=cfg.max_wait_ms,
            max_queue=cfg.max_queue,
            on_batch=(lambda n, seconds: on_batch(label, n, seconds)) if on_batch is not None else None,
            concurrency=_streams(model),
        )

    def all(self) -> list[ServedModel]:
        return [*self.embedders.values(), *self.rerankers.values()]

    def start(self) -> None:
        for served in self.all():
            served.batcher.start()

    async def stop(self) -> None:
        for served in self.all():
            await served.batcher.stop()

    def embedder(self, name: str | None) -> ServedEmbedder:
        return _pick(self.embedders, name, "embedding")

    def reranker(self, name: str | None) -> ServedReranker:
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


def _backend(model: object) -> str:
    """``torch``, ``onnx`` or ``openvino``: the runtime a loaded model runs on."""
    return model.backend if isinstance(model, (ExportedEncoder, OnnxCrossEncoder)) else "torch"


def _precision(model: object) -> str:
    """What an embedder computes in: an exported graph's ``fp32`` or ``int8`` (any graph but the export's fp32 one
    is quantised: ``model_int8.onnx``, OpenVINO's static int8 IR), a PyTorch model's parameter type."""
    if isinstance(model, ExportedEncoder):
        return "fp32" if model.graph.name == model.meta["files"].get("fp32") else "int8"
    import torch

    if isinstance(model, torch.nn.Module):
        dtype = next(model.parameters()).dtype
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, str(dtype))
    return "fp32"


def _streams(model: object) -> int:
    """Batches the model may run at once: an OpenVINO runtime's inference streams, else 1."""
    return model.parallel_batches if isinstance(model, (BatchEncoding, OnnxCrossEncoder)) else 1


def _pick(models: dict[str, Served], name: str | None, kind: str) -> Served:
    """The model named ``name`` (the first when no name is given); a name this server does not serve is a 404."""
    if name is None:
        return next(iter(models.values()))
    if name not in models:
        known = ", ".join(models)
        raise ApiError(
            404, f"no {kind} model named {name!r}; this server has: {known}", "model", "model_not_found"
        )
    return models[name]


def _ranges(given: np.ndarray | None, model: BatchEncoding) -> np.ndarray | None:
    """The int8/uint8 calibration ranges to serve: ``given``, else those saved beside the model; ranges that
    cannot quantise this model's vectors (another width, not finite, min >= max) stop the server from starting."""
    from embforge.quantization import check_ranges

    if given is None:
        return _saved_ranges(model)
    label = getattr(model, "name_or_path", None) or getattr(model, "graph", None) or "the model"
    return check_ranges(given, where=f"the calibration ranges given for {label}", dim=int(model.dim))


def _saved_ranges(model: BatchEncoding) -> np.ndarray | None:
    """Calibration ranges saved beside the model (``embforge_quantization.json`` in its folder), if any; a file
    there that cannot serve (not JSON, no min/max, another width, not finite) is an error naming it."""
    from embforge.modeling.resolve import resolve_model_path
    from embforge.quantization import read_ranges

    if isinstance(model, ExportedEncoder):
        return read_ranges(model.graph, dim=int(model.dim))
    if not isinstance(model, (Encoder, StaticEncoder)) or model.name_or_path is None:
        return None
    try:
        folder = resolve_model_path(model.name_or_path)
    except (OSError, ValueError):  # a model not loaded from a folder here: nothing saved beside it
        return None
    return read_ranges(folder, dim=int(model.dim))


def pair_costs(model: Reranker, query: str, docs: Sequence[str]) -> list[int]:
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
