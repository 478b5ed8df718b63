"""ONNX export of bi-encoders and cross-encoders, with a parity check against PyTorch and optional int8.

A bi-encoder graph takes ``input_ids`` and ``attention_mask`` (dynamic batch and sequence axes) and returns
``sentence_embedding``: pooling, an optional Matryoshka truncation and L2 normalisation run INSIDE the graph, so a
consumer needs only a tokenizer and onnxruntime. A cross-encoder graph (any Hugging Face
``...ForSequenceClassification`` folder) returns ``logits``. The export folder holds:

- ``model.onnx`` (fp32) and, with ``quantize="int8"``, ``model_int8.onnx`` (onnxruntime dynamic quantisation);
- the tokenizer files;
- ``embforge_onnx.json``: kind, pooling, normalisation, output dim, max length, prompts and the parity figures.

After writing, the fp32 graph is run on real sentences next to the PyTorch model; the export fails with
:class:`ExportParityError` when the cosine of any embedding pair is below ``min_cosine`` (default 0.9999).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from embforge._optional import require
from embforge.cross_encoder import CrossEncoder, is_cross_encoder_folder
from embforge.encoder import Encoder
from embforge.kinds import folder_record
from embforge.modeling.decoder import backbone_hidden
from embforge.modeling.lora import merge_lora, uses_adapters
from embforge.modeling.padding import pad_ids
from embforge.modeling.pooling import pool
from embforge.modeling.resolve import resolve_model_path
from embforge.onnx.runtime import OnnxCrossEncoder, OnnxEncoder
from embforge.quantization import RANGES_FILE, calibrate, write_ranges
from embforge.retrieval.corpus_cache import model_fingerprint

if TYPE_CHECKING:
    from embforge.protocols import ModelPath

META_FILE = "embforge_onnx.json"
FP32_FILE = "model.onnx"
INT8_FILE = "model_int8.onnx"

# Real English sentences of varied length (a few STS-B-style captions, news and questions) for the parity check.
PARITY_SENTENCES = [
    "A man is playing a guitar.",
    "A plane is taking off.",
    "Three men are playing chess.",
    "A woman is slicing an onion with a sharp knife on a wooden cutting board in the kitchen.",
    "The stock market rose sharply on Tuesday after the central bank held interest rates steady.",
    "How do I reset my password if I no longer have access to the email address on my account?",
    "Dogs",
    "The quick brown fox jumps over the lazy dog.",
    "Scientists have discovered a new species of frog in the rainforests of Ecuador, according to a study "
    "published this week, which describes its unusual mating call and bright orange skin.",
    "Is it safe to drink tap water in Lisbon?",
    "A child is riding a horse.",
    "Obama signs the landmark health care bill into law.",
]
PARITY_PAIRS = [
    ("How many people live in Berlin?", "Berlin has a population of about 3.7 million people."),
    ("How many people live in Berlin?", "The city is known for its museums and nightlife."),
    ("What is the capital of France?", "Paris is the capital and largest city of France."),
    ("What is the capital of France?", "A man is playing a guitar."),
    ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("Who wrote Hamlet?", "The weather in Lisbon is mild in winter."),
]


class ExportParityError(ValueError):
    """The exported graph does not reproduce the PyTorch model closely enough."""


class BiEncoderGraph(nn.Module):
    """Backbone + pooling + optional truncation + optional L2 normalisation, as one traceable module."""

    def __init__(self, backbone: nn.Module, *, pooling: str, normalize: bool, dim: int | None) -> None:
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.normalize = normalize
        self.dim = dim

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = backbone_hidden(self.backbone, input_ids, attention_mask)  # decoders: real-token positions
        emb = pool(hidden, attention_mask, self.pooling).float()
        if self.dim is not None:
            emb = emb[:, : self.dim]
        return F.normalize(emb, p=2, dim=-1) if self.normalize else emb


class CrossEncoderGraph(nn.Module):
    """A sequence-classification model returning its raw logits (the activation is applied by the runtime)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits.float()


def _eager(model: nn.Module) -> nn.Module:
    """Use the plain attention path: SDPA's mask shortcuts are data-dependent and must not be traced."""
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter("eager")
    return model.eval()


def _write_graphs(
    graph: Any, args: tuple, out: Path, inputs: list[str], output: str, tokenizer: Any, quantize: str | None
) -> dict[str, str]:
    """The fp32 graph, the tokenizer files and (``quantize="int8"``) the int8 copy; returns the ``files`` record."""
    _export(graph, args, out / FP32_FILE, inputs, output)
    tokenizer.save_pretrained(out)
    files = {"fp32": FP32_FILE}
    if quantize == "int8":
        quantize_int8(out / FP32_FILE, out / INT8_FILE)
        files["int8"] = INT8_FILE
    return files


def _export(module: nn.Module, args: tuple[Tensor, ...], path: Path, inputs: list[str], output: str) -> None:
    require("onnx")
    dynamic = {name: {0: "batch", 1: "sequence"} for name in inputs}
    dynamic[output] = {0: "batch"}
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # the tracer's notes about Python booleans and advanced indexing concern shapes the parity check covers
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=[output],
            dynamic_axes=dynamic,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )


def quantize_int8(source: Path, target: Path) -> None:
    """Dynamic int8 quantisation of the weights of MatMul/Gemm nodes (activations quantised at run time)."""
    require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quant_logger = logging.getLogger()
    level = quant_logger.level
    quant_logger.setLevel(logging.ERROR)  # onnxruntime logs a generic "consider pre-processing" warning
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        quant_logger.setLevel(level)


def _min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return float((a * b).sum(axis=1).min())


def export_onnx(
    model: ModelPath,
    output: str | os.PathLike,
    *,
    quantize: str | None = None,
    dim: int | None = None,
    parity_texts: Sequence[str] | None = None,
    min_cosine: float = 0.9999,
    max_score_diff: float = 1e-3,
    calibration: Sequence[str] | None = None,
) -> dict[str, object]:
    """Export ``model`` (a folder or alias) to ``output`` and check the graph against PyTorch.

    Args:
        model: A bi-encoder (sentence-transformers or HF folder, or alias) or a HF
            ``...ForSequenceClassification`` folder (cross-encoder).
        output: Folder to write (created; existing export files in it are replaced).
        quantize: ``None`` or ``"int8"`` (adds ``model_int8.onnx``).
        dim: Bi-encoders only: keep the first ``dim`` dimensions inside the graph (Matryoshka).
        parity_texts: Sentences for the check (default: :data:`PARITY_SENTENCES`). For a cross-encoder they are
            paired with each other; the default uses :data:`PARITY_PAIRS`.
        min_cosine: Smallest allowed cosine between the fp32 graph's and PyTorch's embeddings.
        max_score_diff: Cross-encoders: largest allowed absolute difference of a score.
        calibration: Bi-encoders: texts like the served ones (a few hundred to thousands); the per-dimension
            ranges of the graph's embeddings on them are saved with the export
            (:data:`embforge.quantization.RANGES_FILE`), so the server's ``int8``/``uint8`` outputs use them.

    Returns:
        A report: files, kind, dim and parity figures (``fp32_min_cosine``, and ``int8_min_cosine`` /
        ``int8_mean_cosine`` when quantised).

    Raises:
        ExportParityError: The fp32 graph disagrees with PyTorch.
    """
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be 'int8' or None, got {quantize!r}")
    source = resolve_model_path(model)
    _refuse_unexported_kinds(source)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)

    cross = is_cross_encoder_folder(source)
    if cross and calibration is not None:
        raise ValueError("--calibration applies to bi-encoders only; a cross-encoder outputs scores")
    for stale in (
        FP32_FILE,
        INT8_FILE,
        META_FILE,
        RANGES_FILE,
    ):  # ranges of a previous export must not linger
        (out / stale).unlink(missing_ok=True)
    if cross:
        if dim is not None:
            raise ValueError("--dim applies to bi-encoders only; a cross-encoder outputs scores")
        meta = _export_cross_encoder(source, out, quantize, parity_texts, max_score_diff)
    else:
        meta = _export_bi_encoder(source, out, quantize, dim, parity_texts, min_cosine)
    meta["source"] = str(model)
    if calibration is not None:
        meta["quantization"] = _save_calibration(out, calibration, source=str(model))
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return {"output": str(out), **meta}


def _save_calibration(out: Path, texts: Sequence[str], *, source: str) -> dict[str, object]:
    """Calibration ranges of the exported fp32 graph's embeddings on ``texts``, written beside the graph."""
    ranges = calibrate(OnnxEncoder.load(out / FP32_FILE), list(texts))
    path = write_ranges(out, ranges, texts=len(texts), source=source)
    return {"ranges": path.name, "texts": len(texts)}


def _refuse_unexported_kinds(source: Path) -> None:
    """A clear error for a folder of a kind without an ONNX export (its record's ``no_export``: sparse,
    multi-vector, static)."""
    record = folder_record(source)
    if not record.exportable:
        raise ValueError(f"{source} is {record.no_export}")


def _export_bi_encoder(
    source: Path,
    out: Path,
    quantize: str | None,
    dim: int | None,
    parity_texts: Sequence[str] | None,
    min_cosine: float,
) -> dict[str, object]:
    encoder = Encoder.load(source)

    fingerprint = model_fingerprint(encoder)  # an index built by the source model accepts the export
    if uses_adapters(encoder.backbone):  # a LoRA folder: the graph gets the merged weights
        merge_lora(encoder)
    if dim is not None and not 0 < dim <= encoder.dim:
        raise ValueError(f"dim must be between 1 and the model's dimension {encoder.dim}, got {dim}")
    _eager(encoder.backbone)
    graph = BiEncoderGraph(encoder.backbone, pooling=encoder.pooling, normalize=encoder.normalize, dim=dim)
    ids = encoder.tokenize_ids(["a short one", "and a somewhat longer second sentence here"])

    batch, mask = pad_ids(ids, encoder.pad_token_id, device=torch.device("cpu"))
    inputs = ["input_ids", "attention_mask"]
    files = _write_graphs(
        graph, (batch, mask), out, inputs, "sentence_embedding", encoder.tokenizer, quantize
    )
    meta: dict[str, object] = {
        "format": 1,
        "kind": "bi-encoder",
        "files": files,
        "pooling": encoder.pooling,
        "normalize": encoder.normalize,
        "dim": dim or encoder.dim,
        "max_seq_length": encoder.max_seq_length,
        "prompts": encoder.prompts,
        "default_prompt_name": encoder.default_prompt_name,
        "append_token_id": encoder.append_token_id,  # decoders: end-of-text token put after every text
        "inputs": ["input_ids", "attention_mask"],
        "output": "sentence_embedding",
        "opset": 17,
        "fingerprint": fingerprint,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    texts = list(parity_texts or PARITY_SENTENCES)
    reference = encoder.encode(texts, batch_size=8, dim=dim)
    fp32 = OnnxEncoder.load(out / FP32_FILE).encode(texts, batch_size=8)
    parity: dict[str, float] = {"sentences": len(texts), "fp32_min_cosine": _min_cosine(reference, fp32)}
    parity["fp32_max_abs_diff"] = float(np.abs(reference - fp32).max())
    if quantize == "int8":
        int8 = OnnxEncoder.load(out / INT8_FILE).encode(texts, batch_size=8)
        parity["int8_min_cosine"] = _min_cosine(reference, int8)
        norm_ref = reference / np.linalg.norm(reference, axis=1, keepdims=True)
        norm_q = int8 / np.linalg.norm(int8, axis=1, keepdims=True)
        parity["int8_mean_cosine"] = float((norm_ref * norm_q).sum(axis=1).mean())
    meta["parity"] = parity
    if parity["fp32_min_cosine"] < min_cosine:
        (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        raise ExportParityError(
            f"{out / FP32_FILE}: parity check failed: the smallest cosine between ONNX and PyTorch embeddings "
            f"over {len(texts)} sentences is {parity['fp32_min_cosine']:.6f} < {min_cosine}; the graph is "
            "not usable (report the model type; try a different opset or transformers version)"
        )
    return meta


def _export_cross_encoder(
    source: Path,
    out: Path,
    quantize: str | None,
    parity_texts: Sequence[str] | None,
    max_score_diff: float,
) -> dict[str, object]:
    ce = CrossEncoder.load(source)
    if uses_adapters(ce.model):  # a LoRA folder: the graph gets the merged weights
        merge_lora(ce)
    _eager(ce.model)
    enc = ce.tokenizer(
        ["a query", "another query"],
        ["a document", "a longer document text"],
        padding=True,
        return_tensors="pt",
    )
    token_types = enc.get("token_type_ids", torch.zeros_like(enc["input_ids"]))
    args = (enc["input_ids"], enc["attention_mask"], token_types)
    inputs = ["input_ids", "attention_mask", "token_type_ids"]
    files = _write_graphs(CrossEncoderGraph(ce.model), args, out, inputs, "logits", ce.tokenizer, quantize)
    meta: dict[str, object] = {
        "format": 1,
        "kind": "cross-encoder",
        "files": files,
        "num_labels": int(ce.num_labels),
        "activation": ce.activation,
        "max_seq_length": int(ce.max_seq_length),
        "inputs": inputs,
        "output": "logits",
        "opset": 17,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    if parity_texts:
        texts = list(parity_texts)
        pairs = [(texts[i], texts[(i + 1) % len(texts)]) for i in range(len(texts))]
    else:
        pairs = list(PARITY_PAIRS)
    reference = ce.predict(pairs, activation=False)
    scores = OnnxCrossEncoder.load(out / FP32_FILE).predict(pairs, batch_size=4, activation=False)
    diff = float(np.abs(reference - scores).max())
    parity: dict[str, float] = {"pairs": len(pairs), "fp32_max_abs_diff": diff}
    meta["parity"] = parity
    if quantize == "int8":
        q_scores = OnnxCrossEncoder.load(out / INT8_FILE).predict(pairs, batch_size=4, activation=False)
        parity["int8_max_abs_diff"] = float(np.abs(reference - q_scores).max())
    if diff > max_score_diff:
        raise ExportParityError(
            f"{out / FP32_FILE}: parity check failed: ONNX scores differ from PyTorch by up to {diff:.2e} "
            f"(> {max_score_diff}) over {len(pairs)} pairs"
        )
    return meta
