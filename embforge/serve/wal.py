"""The document store's write-ahead log: acknowledged adds as checksummed, append-only records.

One record holds one add: its documents (id, text, fields) and their vectors, so a crash can never keep one
without the other. On disk::

    b"EFW1" | payload length (uint32 LE) | CRC-32 of the payload (uint32 LE) | payload
    payload = JSON length (uint32 LE) | JSON {"docs": [{"id", "text", "fields"}, ...]} | float32 LE vectors

The JSON is written with ``ensure_ascii=True``, so every Python string (line breaks, U+2028, lone surrogates)
reads back unchanged. A record is acknowledged once written and fsynced. A crash can only tear the record being
written, the last one: :func:`read_log` returns the records before the first bad one (short, wrong magic or
checksum, bad JSON) and where the good part ends, and the store cuts the file there.

Example:
    >>> import numpy as np, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "wal-00000000.log"
    >>> record = encode_record([{"id": "a\\nb", "text": "t", "fields": {}}], np.ones((1, 2), np.float32))
    >>> _ = path.write_bytes(record + record[:7])  # a second record torn by a crash
    >>> records, end = read_log(path, dim=2)
    >>> [d["id"] for docs, _ in records for d in docs], end == len(record)
    (['a\\nb'], True)
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"EFW1"
_HEADER = struct.Struct("<4sII")
_LENGTH = struct.Struct("<I")


def to_json(obj: Any) -> str:
    """JSON that reads back to the same value: ASCII only (any string survives), no NaN/Infinity."""
    return json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def encode_record(docs: Sequence[dict[str, Any]], vectors: np.ndarray) -> bytes:
    """One log record of ``docs`` and their ``(len(docs), dim)`` vectors.

    Raises:
        ValueError: a field cannot be stored as JSON (not a JSON type, NaN or infinity).
    """
    try:
        meta = to_json({"docs": list(docs)}).encode("ascii")
    except (TypeError, ValueError) as err:
        raise ValueError(f"a document cannot be stored: {err}") from err
    array = np.ascontiguousarray(vectors, dtype="<f4")
    payload = _LENGTH.pack(len(meta)) + meta + array.tobytes()
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def read_log(path: Path, *, dim: int) -> tuple[list[tuple[list[dict[str, Any]], np.ndarray]], int]:
    """``([(docs, vectors), ...], end)``: the good records of a log file, and the byte offset where they end."""
    data = path.read_bytes()
    records: list[tuple[list[dict[str, Any]], np.ndarray]] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, length, crc = _HEADER.unpack_from(data, pos)
        start, end = pos + _HEADER.size, pos + _HEADER.size + length
        if magic != MAGIC or end > len(data) or length < _LENGTH.size:
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        (meta_len,) = _LENGTH.unpack_from(payload, 0)
        try:
            docs = json.loads(payload[_LENGTH.size : _LENGTH.size + meta_len])["docs"]
        except (ValueError, KeyError, TypeError):
            break
        raw = payload[_LENGTH.size + meta_len :]
        if len(raw) != 4 * dim * len(docs):
            break
        records.append((docs, np.frombuffer(raw, dtype="<f4").reshape(len(docs), dim)))
        pos = end
    return records, pos


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file, fsync and rename: readers see the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root`` and the folders themselves."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    fsync_dir(root)


class LogWriter:
    """Appends records to one log segment; ``durable`` fsyncs each one before :meth:`append` returns."""

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable
        existed = path.exists()
        self._file = open(path, "ab")  # noqa: SIM115 (held open for the store's lifetime)
        if not existed:
            fsync_dir(path.parent)
        self.size = self._file.seek(0, os.SEEK_END)

    def append(self, record: bytes) -> None:
        """Write one record; on any error the segment is cut back to where it was, and the error raised."""
        start = self.size
        try:
            self._file.write(record)
            self._file.flush()
            if self.durable:
                os.fsync(self._file.fileno())
        except BaseException:
            self.truncate(start)
            raise
        self.size = start + len(record)

    def truncate(self, size: int) -> None:
        """Cut the segment back to ``size`` bytes (rolls back a record that was written but not applied)."""
        self._file.flush()
        self._file.truncate(size)
        self._file.seek(size)
        if self.durable:
            os.fsync(self._file.fileno())
        self.size = size

    def close(self) -> None:
        self._file.close()
