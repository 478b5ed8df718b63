"""Pick and load a runtime for a bi-encoder: PyTorch, ONNX Runtime (fp32 / dynamic int8) or OpenVINO (fp32 / static
int8), exporting the model on the fly and caching the export; and for a cross-encoder (reranker): PyTorch, ONNX
Runtime (fp32 / dynamic int8) or OpenVINO (fp32), :func:`load_scorer`.

``backend="auto"`` takes the fastest path measured on CPUs (``benchmarks/bench_encode.py``): OpenVINO static int8
when OpenVINO and NNCF are installed and calibration texts are given, else ONNX Runtime dynamic int8 when
onnxruntime is installed, else PyTorch; on a GPU, PyTorch. The int8 paths stay within 0.5 STS-B Spearman points of
fp32 on MiniLM (benchmarks/README.md).

Exports go to ``$EMBFORGE_CACHE/exports/<key>`` (default ``~/.cache/embforge``), keyed by the model folder and
its files' sizes and modification times, so a changed model is exported again and an unchanged one is not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.kind_names import ModelKind
    from embforge.onnx.runtime import OnnxCrossEncoder
    from embforge.protocols import Kinded, ModelPath

log = logging.getLogger("embforge.backends")
BACKENDS = ("auto", "torch", "onnx", "onnx-int8", "openvino", "openvino-int8")


def cache_root() -> Path:
    """Where embforge caches exports: ``$EMBFORGE_CACHE`` or ``~/.cache/embforge``."""
    return Path(os.environ.get("EMBFORGE_CACHE") or Path.home() / ".cache" / "embforge")


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def choose_backend(*, calibration: Sequence[str] | None = None) -> str:
    """The backend ``auto`` means on this machine (see the module docstring)."""
    import torch

    if torch.cuda.is_available():
        return "torch"
    if calibration and _installed("openvino", "nncf"):
        return "openvino-int8"
    if _installed("onnxruntime", "onnx"):
        return "onnx-int8"
    return "torch"


def export_key(folder: Path) -> str:
    """A key of a model folder's identity: its path and the sizes and modification times of its files."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def cached_export(model: ModelPath, *, cache: Path | None = None) -> Path:
    """An ONNX export folder (fp32 + dynamic int8) of ``model``: the folder itself when it is an export, else a
    cached export made now if missing."""
    from embforge.modeling.resolve import resolve_model_path
    from embforge.onnx.runtime import META_FILE

    given = Path(model)
    if (given / META_FILE).is_file() or given.suffix == ".onnx":
        return given
    source = resolve_model_path(model)
    target = (cache or cache_root()) / "exports" / export_key(source)
    if not (target / META_FILE).is_file() or not (target / "model_int8.onnx").is_file():
        from embforge.onnx.export import export_onnx

        export_onnx(source, target, quantize="int8")
    return target


def load_embedder(
    model: ModelPath,
    *,
    backend: str = "auto",
    threads: int | None = None,
    calibration: Sequence[str] | None = None,
    cache: Path | None = None,
    streams: int = 1,
) -> Kinded:
    """A bi-encoder on ``backend`` (one of :data:`BACKENDS`); ``calibration`` texts are needed for
    ``openvino-int8`` (its quantiser calibrates on them; the int8 graph is cached beside the export). ``streams``:
    inference streams of the OpenVINO backends (1: latency mode; several, or 0 for OpenVINO's choice: that many
    batches run at once, :mod:`embforge.onnx.openvino`)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    other = _other_kind(model)
    if other is not None:  # sparse, static, multi-vector: their own PyTorch class (embforge.kinds)
        if backend not in ("auto", "torch"):
            raise ValueError(
                f"{model} is a {other.value} model: it is served with backend torch, not {backend}"
            )
        from embforge.kinds import model_class

        return model_class(other).load(model)
    if backend == "auto":
        chosen = choose_backend(calibration=calibration)
        try:
            return load_embedder(
                model, backend=chosen, threads=threads, calibration=calibration, cache=cache, streams=streams
            )
        except Exception as err:  # e.g. an architecture the exporter cannot trace: serve it as it is
            if chosen == "torch":
                raise
            log.warning("backend %s failed for %s (%s); using torch", chosen, model, err)
            backend = "torch"
    if backend == "torch":
        from embforge.encoder import Encoder

        if threads:
            import torch

            torch.set_num_threads(threads)
        return Encoder.load(model)
    export = cached_export(model, cache=cache)
    if backend.startswith("onnx"):
        from embforge.onnx.runtime import OnnxEncoder

        graph = export / "model_int8.onnx" if backend == "onnx-int8" and export.is_dir() else export
        return OnnxEncoder.load(graph, threads=threads)
    from embforge.onnx.openvino import INT8_IR, OpenVinoEncoder, quantize_openvino_int8

    if backend == "openvino":
        return OpenVinoEncoder.load(export, threads=threads, streams=streams)
    ir = export / INT8_IR
    if not ir.is_file():
        if not calibration:
            raise ValueError("the openvino-int8 backend calibrates on texts: give --calibration FILE")
        ir = quantize_openvino_int8(export, calibration)
    return OpenVinoEncoder.load(ir, threads=threads, streams=streams)


def _other_kind(model: ModelPath) -> ModelKind | None:
    """The declared kind of a model folder when its kind has no ONNX runtime (its record is not
    ``exportable``: sparse, static, multi-vector), else ``None``."""
    from embforge.kinds import folder_kind, kind_record

    try:
        kind = folder_kind(model)
    except (FileNotFoundError, ValueError):  # an .onnx file, an export folder: dense runtimes
        return None
    return kind if kind is not None and not kind_record(kind).exportable else None


SCORER_BACKENDS = ("auto", "torch", "onnx", "onnx-int8", "openvino")


def load_scorer(
    model: ModelPath,
    *,
    backend: str = "auto",
    threads: int | None = None,
    cache: Path | None = None,
    streams: int = 1,
) -> CrossEncoder | OnnxCrossEncoder:
    """A cross-encoder (reranker) on ``backend`` (one of :data:`SCORER_BACKENDS`; ``openvino-int8`` means
    ``openvino`` here: its static quantiser calibrates on single texts, not pairs). ``auto`` is OpenVINO fp32 when
    installed, else ONNX Runtime fp32, else PyTorch (on a GPU, PyTorch): the exported graphs keep the scores
    within 1e-3 of PyTorch (the export's parity gate); dynamic int8 is asked for by name. A model folder is
    exported on the fly (cached, as for bi-encoders); an export folder or ``.onnx`` file is loaded as it is."""
    if backend == "openvino-int8":
        backend = "openvino"
    if backend not in SCORER_BACKENDS:
        raise ValueError(f"unknown reranker backend {backend!r}; choose one of {', '.join(SCORER_BACKENDS)}")
    given = Path(model)
    exported = given.suffix == ".onnx" or _is_export(given)
    if not exported:  # the check CrossEncoder.load makes, before a bi-encoder is exported as one
        from embforge.cross_encoder import refuse_untrained_head
        from embforge.modeling.resolve import resolve_model_path

        refuse_untrained_head(model, resolve_model_path(model))
    if backend == "auto":
        import torch

        chosen = "torch"
        if not torch.cuda.is_available() and _installed("onnxruntime", "onnx"):
            chosen = "openvino" if _installed("openvino") else "onnx"
        try:
            return load_scorer(model, backend=chosen, threads=threads, cache=cache, streams=streams)
        except Exception as err:  # an architecture the exporter cannot trace: serve it as it is
            if chosen == "torch":
                raise
            log.warning("backend %s failed for reranker %s (%s); using torch", chosen, model, err)
            backend = "torch"
    if backend == "torch" and not exported:
        from embforge.cross_encoder import CrossEncoder

        if threads:
            import torch

            torch.set_num_threads(threads)
        return CrossEncoder.load(model)
    export = cached_export(model, cache=cache)
    if backend == "openvino":
        from embforge.onnx.openvino import OpenVinoCrossEncoder

        return OpenVinoCrossEncoder.load(export, threads=threads, streams=streams)
    from embforge.onnx.runtime import OnnxCrossEncoder

    graph = export
    if backend == "onnx-int8" and export.is_dir():
        graph = export / "model_int8.onnx"
        if not graph.is_file():
            raise ValueError(
                f"{export} has no int8 graph: export it with --quantize int8, or use backend onnx"
            )
    return OnnxCrossEncoder.load(graph, threads=threads)


def _is_export(folder: Path) -> bool:
    from embforge.onnx.runtime import META_FILE

    return (folder / META_FILE).is_file()
