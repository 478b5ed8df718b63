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
    """Calibration ranges of ``model`` on ``texts`` (a few hundred to thousands of texts like the served ones)."""
    return ranges_of(np.asarray(model.encode(list(texts), batch_size=batch_size), dtype=np.float32))


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


def read_ranges(folder: str | os.PathLike) -> np.ndarray | None:
    """Calibration ranges saved in ``folder`` (or beside a ``.onnx``/``.xml`` file in it); ``None`` if none."""
    base = Path(folder)
    path = (base.parent if base.is_file() else base) / RANGES_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return np.asarray([record["min"], record["max"]], dtype=np.float32)


def read_texts(path: str | os.PathLike, *, limit: int = 2000) -> list[str]:
    """Calibration texts from a file: one text a line (blank lines skipped), at most ``limit``."""
    with open(path, encoding="utf-8") as handle:
        texts = [line.strip() for line in handle if line.strip()]
    if len(texts) < 2:
        raise ValueError(f"{path}: calibration needs at least 2 non-empty lines (one text a line)")
    return texts[:limit]
