"""Quantised embeddings: int8/uint8 (per-dimension calibration ranges) and binary/ubinary (sign bits, packed).

The semantics are sentence-transformers' ``quantize_embeddings``:

- ``uint8``: ``clip(floor((x - lo) / step), 0, 255)`` with ``step = (hi - lo) / 255`` per dimension (a zero step
  counts as 1), where ``lo``/``hi`` are the calibration ranges; ``int8`` is that minus 128;
- ``ubinary``: ``packbits(x > 0)`` along the dimensions (8 dimensions a byte, the first one in the high bit);
  ``binary`` is that minus 128, as int8.

int8/uint8 need ranges computed on a representative set of embeddings (the min and max of each dimension), not on
the few vectors of one request: :func:`calibrate` computes them and :func:`write_ranges` saves them beside the model
(``embforge_quantization.json`` in the model or export folder), where the server reads them.

Example:
    >>> import numpy as np
    >>> quantize(np.array([[0.5, -0.2, 0.1, 0.0, 1.0, -1.0, 0.3, 0.2]]), "ubinary").tolist()
    [[171]]
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from embforge.protocols import Embedder

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]
PRECISIONS: tuple[str, ...] = ("float32", "int8", "uint8", "binary", "ubinary")
RANGES_FILE = "embforge_quantization.json"


def quantize(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """``embeddings`` (``(n, dim)`` float) at ``precision``; int8/uint8 need ``ranges`` (``(2, dim)``: min, max).

    Raises:
        ValueError: an unknown precision, or int8/uint8 without ranges of the embeddings' width.
    """
    x = np.asarray(embeddings, dtype=np.float32)
    if precision == "float32":
        return x
    if precision in ("binary", "ubinary"):
        packed = np.packbits(x > 0, axis=-1)
        return (packed - 128).astype(np.int8) if precision == "binary" else packed
    if precision not in ("int8", "uint8"):
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if ranges is None or np.shape(ranges) != (2, x.shape[-1]):
        raise ValueError(
            f"{precision} quantisation needs calibration ranges of shape (2, {x.shape[-1]}), got "
            f"{None if ranges is None else np.shape(ranges)}"
        )
    lo = ranges[0].astype(np.float32)
    steps = (ranges[1].astype(np.float32) - lo) / 255
    steps = np.where(steps == 0, 1, steps)
    levels = np.clip(np.floor((x - lo) / steps), 0, 255)
    return (levels - 128).astype(np.int8) if precision == "int8" else levels.astype(np.uint8)


def unpack_bits(packed: np.ndarray, dim: int) -> np.ndarray:
    """The ``(n, dim)`` 0/1 bits of ``binary`` or ``ubinary`` codes."""
    codes = np.asarray(packed)
    if codes.dtype == np.int8:
        codes = (codes.astype(np.int16) + 128).astype(np.uint8)
    return np.unpackbits(codes, axis=-1)[..., :dim]


def ranges_of(embeddings: np.ndarray) -> np.ndarray:
    """Per-dimension ``(min, max)`` of calibration embeddings: ``(2, dim)`` float32."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"calibration needs at least 2 embeddings of shape (n, dim), got {x.shape}")
    return np.stack([x.min(axis=0), x.max(axis=0)])


def calibrate(model: Embedder, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
    """Calibration ranges of ``model`` on ``texts`` (a few hundred to thousands of texts like the served ones).

    Raises:
        ValueError: ``model`` is not a one-vector (dense or static) model, or the ranges have a dimension of zero
            width or that is not finite (too few or identical texts: every int8 value there would be -128).
    """
    from embforge.kinds import is_single_vector, kind_of

    if not is_single_vector(model):
        name = getattr(model, "name_or_path", None) or type(model).__name__
        raise ValueError(
            f"int8/uint8 calibration applies to dense embedding models; {name} is {kind_of(model).value}"
        )
    texts = list(texts)
    ranges = ranges_of(np.asarray(model.encode(texts, batch_size=batch_size), dtype=np.float32))
    flat = ranges[0] >= ranges[1]
    if flat.any():
        raise ValueError(
            f"calibration ranges have zero width (min == max) in {int(flat.sum())} of {flat.size} dimensions "
            f"on {len(texts)} texts, {len(set(texts))} distinct: give more varied calibration texts (a few "
            "hundred like the served ones)"
        )
    return check_ranges(ranges, where="calibration ranges")


def check_ranges(ranges: np.ndarray, *, where: str, dim: int | None = None) -> np.ndarray:
    """``ranges`` as ``(2, dim)`` float32 when they can quantise: finite, min < max in every dimension and, when
    ``dim`` is given, that many dimensions; else a one-line ``ValueError`` starting with ``where`` (a file, a
    model)."""
    x = np.asarray(ranges, dtype=np.float32)
    if x.ndim != 2 or len(x) != 2:
        raise ValueError(
            f"{where}: ranges of shape {x.shape}; expected (2, dim): a min and a max per dimension"
        )
    width = x.shape[1]
    if dim is not None and width != dim:
        raise ValueError(
            f"{where}: {width} dimensions, but the model has {dim} (ranges of another model?); calibrate this "
            "model again (--calibration FILE)"
        )
    bad = ~np.isfinite(x).all(axis=0)
    if bad.any():
        raise ValueError(
            f"{where}: not finite (NaN or infinity) in {int(bad.sum())} of {width} dimensions (first: dimension "
            f"{int(bad.argmax())})"
        )
    bad = x[0] >= x[1]
    if bad.any():
        first = int(bad.argmax())
        raise ValueError(
            f"{where}: min >= max in {int(bad.sum())} of {width} dimensions (first: dimension {first}, min "
            f"{x[0, first]:g}, max {x[1, first]:g}); calibrate again on more varied texts"
        )
    return x


def write_ranges(folder: str | os.PathLike, ranges: np.ndarray, *, texts: int, source: str = "") -> Path:
    """Save calibration ranges in ``folder`` (:data:`RANGES_FILE`); returns the file."""
    path = Path(folder) / RANGES_FILE
    record = {
        "format": 1,
        "min": ranges[0].tolist(),
        "max": ranges[1].tolist(),
        "texts": texts,
        "source": source,
    }
    path.write_text(json.dumps(record) + "\n")
    return path


def read_ranges(folder: str | os.PathLike, *, dim: int | None = None) -> np.ndarray | None:
    """Calibration ranges saved in ``folder`` (or beside a ``.onnx``/``.xml`` file in it); ``None`` if none.

    Raises:
        ValueError: The file is not a ranges file, or its ranges cannot quantise (:func:`check_ranges`; ``dim``:
            the model's width), in one line naming the file.
    """
    base = Path(folder)
    path = (base.parent if base.is_file() else base) / RANGES_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: expected a JSON object with 'min' and 'max', got {type(record).__name__}")
    for key in ("min", "max"):
        if key not in record:
            raise ValueError(
                f"{path}: no {key!r} (a ranges file holds 'min' and 'max', one value per dimension, as "
                "embforge export onnx --calibration writes it)"
            )
    low, high = record["min"], record["max"]
    if isinstance(low, list) and isinstance(high, list) and len(low) != len(high):
        raise ValueError(f"{path}: 'min' has {len(low)} values but 'max' has {len(high)}")
    try:
        ranges = np.asarray([low, high], dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: 'min' and 'max' must be lists of numbers ({err})") from None
    return check_ranges(ranges, where=str(path), dim=dim)


def read_texts(path: str | os.PathLike, *, limit: int = 2000) -> list[str]:
    """Calibration texts from a file: one text a line (blank lines skipped), at most ``limit``.

    Raises:
        ValueError: ``path`` is a directory, or holds fewer than 2 distinct texts.
    """
    if Path(path).is_dir():
        raise ValueError(f"--calibration {path} is a directory; a text file (one text a line) is expected")
    with open(path, encoding="utf-8") as handle:
        texts = [line.strip() for line in handle if line.strip()]
    if len(texts) < 2:
        raise ValueError(f"{path}: calibration needs at least 2 non-empty lines (one text a line)")
    distinct = len(set(texts))
    if distinct < 2:
        raise ValueError(
            f"{path}: {len(texts)} lines but {distinct} distinct text; calibration ranges need varied texts like "
            "the served ones (a few hundred): give more varied ones"
        )
    return texts[:limit]
