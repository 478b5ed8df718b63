"""The models one server holds: embedders and rerankers by name, each with its own batcher, queue and limits.

A request's ``model`` field picks one (``/v1/models`` lists them); a server with a single embedder (or reranker)
answers any name with it, as a one-model server always did. Each model has its own :class:`MicroBatcher`, so one
model's full queue (429) or slow batches never hold up another's requests.

Embedders are batched by token cost: the server tokenises a request's texts, queues the token-id lists with their
lengths, and the batch runs through the model's batched forward — the padding-free packed forward of a PyTorch
:class:`~embforge.encoder.Encoder` (``embed_ids``), or padded calls of an exported graph (``embed_batch``), the batch
cut where the padded tokens saved pay for another call (:func:`width_groups`).
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
from embforge.static.model import StaticEncoder

EMBEDDING = "embedding"
RERANK = "rerank"
Reranker = CrossEncoder | OnnxCrossEncoder  # OpenVINO's cross-encoder is an OnnxCrossEncoder
Runtime = BatchEncoding | Reranker


# a padded call's fixed cost in padded tokens: MiniLM int8 on an OpenVINO stream took ~1.5 ms a call beside ~90 us a
# padded token; 8, 16 and 32 served short texts alike at 16 and 64 clients, 64 was slower (benchmarks/README.md,
# 2026-11-27)
CALL_TOKENS = 16


def width_groups(lengths: Sequence[int], *, step: int = 1, call_tokens: int = CALL_TOKENS) -> list[range]:
    """Cut items of ascending token ``lengths`` into consecutive groups, one padded call each, at the fewest padded
    tokens plus ``call_tokens`` a call (a call pads to its longest item, rounded up to a multiple of ``step``).

    Short texts padded to the width of the batch's longest one cost as much as that many long texts: on short
    STS-B sentences a batch of 32 padded to 16-token multiples was 46 % real tokens. The cuts can only pay where
    the padded width changes; the cheapest set of them comes from a dynamic programme over those points (a handful
    for short texts, so it costs microseconds).

    >>> width_groups([5, 6, 7, 40])  # one 40-token call for the three short ones would cost 160 tokens
    [range(0, 3), range(3, 4)]
    >>> width_groups([5, 6, 7, 40], step=16)  # widths 16, 16, 16, 48
    [range(0, 3), range(3, 4)]
    >>> width_groups([30, 31, 32])  # cutting saves fewer tokens than a call costs
    [range(0, 3)]
    """
    if not lengths:
        return []
    widths = [-(-n // step) * step for n in lengths]
    ends = [i for i in range(1, len(widths)) if widths[i] != widths[i - 1]] + [len(widths)]
    best: dict[int, tuple[int, int]] = {0: (0, 0)}  # end -> (cost of the items before it, start of its group)
    for end in ends:
        width = widths[end - 1]
        best[end] = min((best[start][0] + call_tokens + (end - start) * width, start) for start in best)
    groups = []
    end = len(widths)
    while end > 0:
        start = best[end][1]
        groups.append(range(start, end))
        end = start
    return groups[::-1]


def embed_fn(model: BatchEncoding, max_tokens: int) -> Callable[[list[list[int]]], np.ndarray]:
    """``token-id lists -> (n, dim) float32`` through ``model``'s batched forward (see the module docstring)."""
    if not isinstance(model, (Encoder, StaticEncoder)):  # an exported graph: padded calls by width
        return padded_fn(model)
    import torch

    model.eval()

    def run(ids: list[list[int]]) -> np.ndarray:
        with torch.inference_mode():
            return model.embed_ids(ids, max_tokens=max_tokens).float().cpu().numpy()

    return run


def padded_fn(model: BatchEncoding) -> Callable[[list[list[int]]], np.ndarray]:
    """``token-id lists -> (n, dim) float32`` through a padded graph: the batch sorted by length and cut by
    :func:`width_groups`, the calls one after another on the batcher's thread (its stream)."""
    step = model.width_step if isinstance(model, ExportedEncoder) else 1

    def run(ids: list[list[int]]) -> np.ndarray:
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), model.dim), dtype=np.float32)
        for group in width_groups([len(ids[i]) for i in order], step=step):
            rows = [order[i] for i in group]
            out[rows] = model.embed_batch([ids[i] for i in rows])
        return out

    return run


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
    """An embedding model (dense: PyTorch, exported graph or static) and its int8/uint8 calibration ranges."""

    model: BatchEncoding
    ranges: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.model.dim)

    def describe(self) -> dict[str, object]:
        formats = ["binary", "ubinary"] + (["int8", "uint8"] if self.ranges is not None else [])
        return {**super().describe(), "kind": EMBEDDING, "dim": self.dim, "quantized_formats": formats}


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
        embedders: Mapping[str, BatchEncoding],
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
            name: ServedEmbedder(
                name,
                self._batcher(embed_fn(model, config.max_batch_tokens), _label("embedding", name, i), model),
                _backend(model),
                model,
                _ranges((ranges or {}).get(name), model),
            )
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

    def _batcher(self, fn: Callable[[list[Any]], np.ndarray], label: str, model: Runtime) -> MicroBatcher:
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


def _backend(model: Runtime) -> str:
    """``torch``, ``onnx`` or ``openvino``: the runtime a loaded model runs on."""
    return model.backend if isinstance(model, (ExportedEncoder, OnnxCrossEncoder)) else "torch"


def _streams(model: Runtime) -> int:
    """Batches the model may run at once: an OpenVINO runtime's inference streams, else 1."""
    return model.parallel_batches if isinstance(model, (BatchEncoding, OnnxCrossEncoder)) else 1


def _pick(models: dict[str, Served], name: str | None, kind: str) -> Served:
    if name is None or len(models) == 1:
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
