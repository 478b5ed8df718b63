"""Run an exported bi-encoder (fp32 or static int8, NNCF post-training quantisation) or cross-encoder with OpenVINO
on the CPU.

:class:`OpenVinoEncoder` (and :class:`OpenVinoCrossEncoder`, for rerankers) reads the same export folder as :class:`~embforge.onnx.runtime.OnnxEncoder`
(:func:`embforge.onnx.export.export_onnx`): OpenVINO compiles the ONNX graph directly, or an IR (``.xml`` + ``.bin``)
written beside it. :func:`quantize_openvino_int8` writes ``openvino_int8.xml``: weights *and* activations in int8,
calibrated by NNCF on texts you give (real texts like the served ones; a few hundred are enough), so the int8
matrix products run end to end on VNNI/AMX units instead of quantising activations at run time as onnxruntime's
dynamic int8 does.

``streams``: with one stream (the default of :meth:`OpenVinoEncoder.load`) a call uses all CPU threads (latency
mode). With several, the graph is compiled in OpenVINO's throughput mode (``NUM_STREAMS`` streams sharing the cores,
each with its own infer request) and that many batches run at once: :meth:`~BatchEncoding.embed_sorted` keeps every
stream busy, and the server's batcher runs that many batches in flight. On a 2-core host under load, MiniLM int8 at
batch 64 did 790 texts per CPU-second on two one-thread streams against 630 with one two-thread stream (whose threads
wait for each other at every layer when one of them is descheduled).

Example:
    >>> enc = OpenVinoEncoder.load("exported/")  # doctest: +SKIP
    >>> enc.encode(["a cat", "a dog"]).shape  # doctest: +SKIP
    (2, 384)
"""

from __future__ import annotations

import os
import queue
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from embforge._optional import require
from embforge.onnx.runtime import (
    ExportedEncoder,
    OnnxCrossEncoder,
    load_tokenizer,
    pad_batch,
    read_export_meta,
)

if TYPE_CHECKING:
    from openvino import CompiledModel, InferRequest
    from transformers import PreTrainedTokenizerBase

INT8_IR = "openvino_int8.xml"
# OpenVINO's CPU plugin prepares kernels per input shape: a shape it has not seen costs ~2.7x a seen one (MiniLM
# int8, batch 4). Padding the sequence axis to a multiple of this many tokens makes shapes repeat (the mask keeps
# the embeddings exact), which cuts the server's tail latency.
WIDTH_STEP = 16


def compile_graph(
    graph: Path, *, threads: int | None = None, streams: int = 1, f32: bool = False
) -> CompiledModel:
    """An OpenVINO CPU compiled model of an ONNX graph or IR: latency mode (one stream, all threads) for
    ``streams=1``, else throughput mode with ``streams`` streams (``0``: as many as OpenVINO finds best here).
    ``f32`` keeps floating-point maths in fp32 where the CPU plugin would run bf16 (CPUs with AVX512-BF16/AMX)."""
    ov = require("openvino")
    core = ov.Core()
    config: dict[str, str | int] = {"PERFORMANCE_HINT": "LATENCY"}
    if streams != 1:
        config = {"PERFORMANCE_HINT": "THROUGHPUT"}
        if streams > 1:
            config["NUM_STREAMS"] = str(streams)
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    return core.compile_model(str(graph), "CPU", config)


class InferPool:
    """The infer requests of a compiled model, one per stream: :meth:`infer` borrows one, so up to
    ``parallel_batches`` calls (from different threads) run at once."""

    def __init__(self, compiled: CompiledModel) -> None:
        self.compiled = compiled
        self.parallel_batches = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        self._requests: queue.SimpleQueue[InferRequest] = queue.SimpleQueue()
        for _ in range(self.parallel_batches):
            self._requests.put(compiled.create_infer_request())
        self.inputs = {port.get_any_name() for port in compiled.inputs}

    def infer(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The first output of one inference, as a float32 array of its own."""
        request = self._requests.get()
        try:
            out = request.infer(feeds)
            return np.array(
                next(iter(out.values())), dtype=np.float32
            )  # a copy: the request reuses its buffer
        finally:
            self._requests.put(request)


def padded_width(feeds: dict[str, np.ndarray], *, pad_id: int, limit: int) -> dict[str, np.ndarray]:
    """``feeds`` with the sequence axis padded to a multiple of :data:`WIDTH_STEP` tokens (at most ``limit``, or
    the width itself when wider): ``input_ids`` with ``pad_id``, the mask and token types with zeros."""
    have = feeds["input_ids"].shape[1]
    width = min(-(-have // WIDTH_STEP) * WIDTH_STEP, max(have, limit))
    if width == have:
        return feeds
    extra = ((0, 0), (0, width - have))
    return {
        name: np.pad(x, extra, constant_values=pad_id if name == "input_ids" else 0)
        for name, x in feeds.items()
    }


def _graph_of(path: str | os.PathLike, kind: str) -> tuple[Path, Path, dict[str, Any]]:
    """``(folder, graph, meta)`` of an export folder, or an ``.onnx`` / ``.xml`` file in it, of model ``kind``."""
    given = Path(path).expanduser()
    folder, graph, meta = read_export_meta(given.parent if given.suffix == ".xml" else given)
    if given.suffix == ".xml":
        graph = given
    if meta.get("kind") != kind:
        raise ValueError(f"{graph} is a {meta.get('kind')} export, not a {kind}")
    return folder, graph, meta


class OpenVinoEncoder(ExportedEncoder):
    """A bi-encoder running an exported graph under OpenVINO: same ``encode()`` as :class:`Encoder`."""

    backend: ClassVar[str] = "openvino"
    width_step: ClassVar[int] = WIDTH_STEP  # embed_batch pads to it (padded_width)

    def __init__(
        self,
        compiled: CompiledModel,
        tokenizer: PreTrainedTokenizerBase,
        meta: dict[str, Any],
        *,
        graph: Path,
    ) -> None:
        self.pool = InferPool(compiled)
        super().__init__(tokenizer, meta, graph=graph, inputs=self.pool.inputs)
        self.parallel_batches = self.pool.parallel_batches

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, threads: int | None = None, streams: int = 1
    ) -> OpenVinoEncoder:
        """Load an export folder (its fp32 ONNX graph), or an ``.onnx`` / ``.xml`` file in it; ``streams``: see
        the module docstring."""
        folder, graph, meta = _graph_of(path, "bi-encoder")
        compiled = compile_graph(graph, threads=threads, streams=streams)
        return cls(compiled, load_tokenizer(folder), meta, graph=graph)

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One inference on token-id lists padded together (to a multiple of :data:`WIDTH_STEP` tokens):
        ``(n, dim)`` float32."""
        feeds = self.feeds(ids)
        return self.pool.infer(padded_width(feeds, pad_id=self.pad_token_id, limit=self.max_seq_length))


class OpenVinoCrossEncoder(OnnxCrossEncoder):
    """A cross-encoder export run by OpenVINO: ``predict(pairs)`` as :class:`OnnxCrossEncoder` (the same
    tokenisation, activation and output shape), inference on the CPU plugin."""

    backend: ClassVar[str] = "openvino"

    def __init__(
        self, compiled: CompiledModel, tokenizer: PreTrainedTokenizerBase, meta: dict[str, Any]
    ) -> None:
        self.pool = InferPool(compiled)
        self.parallel_batches = self.pool.parallel_batches
        self.tokenizer = tokenizer
        self.meta = meta
        self.max_seq_length = int(meta["max_seq_length"])
        self._inputs = self.pool.inputs

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, threads: int | None = None, streams: int = 1
    ) -> OpenVinoCrossEncoder:
        """Load a cross-encoder export folder, or an ``.onnx`` / ``.xml`` file in it. Its maths stays fp32 (bf16,
        the CPU plugin's default on bf16-capable CPUs, moved a tiny reranker's scores by 1e-2; the export's
        parity gate is 1e-3)."""
        folder, graph, meta = _graph_of(path, "cross-encoder")
        compiled = compile_graph(graph, threads=threads, streams=streams, f32=True)
        return cls(compiled, load_tokenizer(folder), meta)

    def logits(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        pad = int(self.tokenizer.pad_token_id or 0)
        return self.pool.infer(padded_width(feeds, pad_id=pad, limit=self.max_seq_length))


def quantize_openvino_int8(
    export: str | os.PathLike, texts: Sequence[str], *, batch_size: int = 16, subset_size: int = 300
) -> Path:
    """Static int8 OpenVINO IR of an export's fp32 graph, calibrated by NNCF on ``texts``; returns the ``.xml``.

    The calibration batches are the texts tokenised as the encoder does and padded per batch (``subset_size``
    batches at most). ``ModelType.TRANSFORMER`` keeps the softmax and layer norms in floating point.
    """
    ov = require("openvino")
    nncf = require("nncf")
    folder, graph, meta = read_export_meta(export)
    tokenizer = load_tokenizer(folder)
    ids = tokenizer(
        list(texts), truncation=True, max_length=int(meta["max_seq_length"]), return_token_type_ids=False
    )["input_ids"]
    pad = int(tokenizer.pad_token_id or 0)
    batches = []
    for start in range(0, len(ids), batch_size):
        batch, mask = pad_batch(ids[start : start + batch_size], pad)
        batches.append({"input_ids": batch, "attention_mask": mask})
    model = ov.Core().read_model(str(graph))
    quantized = nncf.quantize(
        model,
        nncf.Dataset(batches),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=min(subset_size, len(batches)),
    )
    target = folder / INT8_IR
    ov.save_model(quantized, str(target))
    return target
