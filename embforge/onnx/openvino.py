"""Run an exported bi-encoder with OpenVINO on the CPU, in fp32 or static int8 (NNCF post-training quantisation).

:class:`OpenVinoEncoder` reads the same export folder as :class:`~embforge.onnx.runtime.OnnxEncoder`
(:func:`embforge.onnx.export.export_onnx`): OpenVINO compiles the ONNX graph directly, or an IR (``.xml`` + ``.bin``)
written beside it. :func:`quantize_openvino_int8` writes ``openvino_int8.xml``: weights *and* activations in int8,
calibrated by NNCF on texts you give (real texts like the served ones; a few hundred are enough), so the int8
matrix products run end to end on VNNI/AMX units instead of quantising activations at run time as onnxruntime's
dynamic int8 does.

Example:
    >>> enc = OpenVinoEncoder.load("exported/")  # doctest: +SKIP
    >>> enc.encode(["a cat", "a dog"]).shape  # doctest: +SKIP
    (2, 384)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embforge._optional import require
from embforge.modeling.encoding import BatchEncoding
from embforge.onnx.runtime import _load_tokenizer, _pad, read_export_meta

INT8_IR = "openvino_int8.xml"
# OpenVINO's CPU plugin prepares kernels per input shape: a shape it has not seen costs ~2.7x a seen one (MiniLM
# int8, batch 4). Padding the sequence axis to a multiple of this many tokens makes shapes repeat (the mask keeps
# the embeddings exact), which cuts the server's tail latency.
WIDTH_STEP = 16


def compile_graph(graph: Path, *, threads: int | None = None) -> Any:
    """An OpenVINO CPU compiled model of an ONNX graph or IR, tuned for latency (one stream, all threads)."""
    ov = require("openvino")
    core = ov.Core()
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return core.compile_model(str(graph), "CPU", config)


class OpenVinoEncoder(BatchEncoding):
    """A bi-encoder running an exported graph under OpenVINO: same ``encode()`` as :class:`Encoder`."""

    backend = "openvino"

    def __init__(self, compiled: Any, tokenizer: Any, meta: dict[str, Any], *, graph: Path) -> None:
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.tokenizer = tokenizer
        self.meta = meta
        self.graph = graph
        self.pooling: str = meta["pooling"]
        self.normalize: bool = bool(meta["normalize"])
        self.max_seq_length: int = int(meta["max_seq_length"])
        self.prompts: dict[str, str] = dict(meta.get("prompts") or {})
        self.default_prompt_name: str | None = meta.get("default_prompt_name")
        self.append_token_id: int | None = meta.get("append_token_id")
        self._inputs = {port.get_any_name() for port in compiled.inputs}

    @classmethod
    def load(cls, path: str | os.PathLike, *, threads: int | None = None) -> OpenVinoEncoder:
        """Load an export folder (its fp32 ONNX graph), or an ``.onnx`` / ``.xml`` file in it."""
        given = Path(path).expanduser()
        folder, graph, meta = read_export_meta(given.parent if given.suffix == ".xml" else given)
        if given.suffix == ".xml":
            graph = given
        if meta.get("kind") != "bi-encoder":
            raise ValueError(f"{graph} is a {meta.get('kind')} export; OpenVINO serves bi-encoders here")
        return cls(compile_graph(graph, threads=threads), _load_tokenizer(folder), meta, graph=graph)

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def embed_batch(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One inference on token-id lists padded together (to a multiple of :data:`WIDTH_STEP` tokens):
        ``(n, dim)`` float32."""
        batch, mask = _pad(ids, self.pad_token_id)
        width = min(-(-batch.shape[1] // WIDTH_STEP) * WIDTH_STEP, max(batch.shape[1], self.max_seq_length))
        if width > batch.shape[1]:
            extra = ((0, 0), (0, width - batch.shape[1]))
            batch = np.pad(batch, extra, constant_values=self.pad_token_id)
            mask = np.pad(mask, extra)
        feeds = {"input_ids": batch, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(batch)
        out = self.request.infer(feeds)
        return np.array(next(iter(out.values())), dtype=np.float32)


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
    tokenizer = _load_tokenizer(folder)
    ids = tokenizer(
        list(texts), truncation=True, max_length=int(meta["max_seq_length"]), return_token_type_ids=False
    )["input_ids"]
    pad = int(tokenizer.pad_token_id or 0)
    batches = []
    for start in range(0, len(ids), batch_size):
        batch, mask = _pad(ids[start : start + batch_size], pad)
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
