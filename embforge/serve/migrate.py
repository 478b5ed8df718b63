"""Convert a document store of the previous format (format 2) into this one, keeping every acknowledged document.

Format 2 was ``store.json`` + ``snap-NNNNNNNN/`` (``documents.jsonl`` and the index's save) + ``wal-NNNNNNNN.log``
segments of checksummed add records (``b"EFW1" | payload length | CRC-32 | JSON length | JSON {"docs"} | float32
vectors``). Documents added through the server exist nowhere else, so opening such a folder converts it: the
snapshot's documents with their vectors, then every whole record of the log (a torn last record is dropped, as
format 2's own recovery did), inserted as rows in one transaction; the old files are then removed. Vectors must be
recoverable exactly from the snapshot's index (exact, flat, HNSW); for the lossy kinds the folder is refused with
the command that rebuilds it.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from embforge.retrieval.index.exact import NumpyIndex
from embforge.retrieval.index.faiss import FaissIndex
from embforge.retrieval.index.registry import load_index

OLD_META = "store.json"
_SEGMENT = re.compile(r"wal-(\d{8})\.log")
_HEADER = struct.Struct("<4sII")
_LENGTH = struct.Struct("<I")


def is_format2(root: Path) -> bool:
    meta = root / OLD_META
    return meta.exists() and json.loads(meta.read_text()).get("format") == 2


def _records(path: Path, dim: int) -> Iterator[tuple[list[dict[str, Any]], np.ndarray]]:
    """The whole records of one log segment, stopping at the first torn or corrupt one."""
    data, pos = path.read_bytes(), 0
    while pos + _HEADER.size <= len(data):
        magic, length, crc = _HEADER.unpack_from(data, pos)
        payload = data[pos + _HEADER.size : pos + _HEADER.size + length]
        if magic != b"EFW1" or len(payload) != length or length < _LENGTH.size or zlib.crc32(payload) != crc:
            return
        (meta_len,) = _LENGTH.unpack_from(payload, 0)
        docs = json.loads(payload[_LENGTH.size : _LENGTH.size + meta_len])["docs"]
        raw = payload[_LENGTH.size + meta_len :]
        if len(raw) != 4 * dim * len(docs):
            return
        yield docs, np.frombuffer(raw, dtype="<f4").reshape(len(docs), dim)
        pos += _HEADER.size + length


def _snapshot(root: Path, name: str, dim: int) -> Iterator[tuple[list[dict[str, Any]], np.ndarray]]:
    folder = root / name
    docs = [
        json.loads(line) for line in (folder / "documents.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    saved = json.loads((folder / "index" / "index.json").read_text())
    index = load_index(folder / "index")
    try:
        if isinstance(index, NumpyIndex):
            ids, vectors = index.ids, np.asarray(index.vectors)
        elif isinstance(index, FaissIndex) and saved.get("kind") in ("flat", "hnsw"):  # they keep the vectors
            ids, vectors = index.ids, index.index.reconstruct_n(0, index.index.ntotal)
        else:
            raise ValueError(
                f"{root}: a store of the previous format whose {saved.get('kind', saved.get('backend'))!r} index "
                f"does not keep its vectors exactly; rebuild it: embforge index build --index {root} ..."
            )
    finally:
        index.close()
    position = {key: i for i, key in enumerate(ids)}
    yield docs, vectors[[position[d["id"]] for d in docs]].reshape(len(docs), dim)


def read_format2(root: Path) -> tuple[dict[str, Any], list[tuple]]:
    """``(meta, rows)`` of the format-2 store in ``root``: ``meta`` as the new database records it, ``rows`` as
    ``(seq, id, text, fields JSON, vector bytes)`` in the order the documents were added."""
    meta = json.loads((root / OLD_META).read_text())
    dim, start = int(meta["dim"]), int(meta.get("log_start", 0))
    parts: list[Iterator[tuple[list[dict[str, Any]], np.ndarray]]] = []
    if meta.get("snapshot"):
        parts.append(_snapshot(root, meta["snapshot"], dim))
    segments = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _SEGMENT.fullmatch(p.name)))
    parts += [_records(path, dim) for number, path in segments if number >= start]
    rows: list[tuple] = []
    seen: set[str] = set()
    for part in parts:
        for docs, vectors in part:
            for doc, vector in zip(docs, vectors):
                if doc["id"] not in seen:
                    seen.add(doc["id"])
                    fields = json.dumps(doc.get("fields") or {}, ensure_ascii=True, separators=(",", ":"))
                    vector_bytes = np.asarray(vector, "<f4").tobytes()
                    rows.append((len(rows) + 1, doc["id"], doc.get("text", ""), fields, vector_bytes))
    return {k: meta.get(k) for k in ("dim", "kind", "options", "model")}, rows


def remove_format2(root: Path) -> None:
    """Delete the old files once the new database holds their documents."""
    for path in list(root.iterdir()):
        old = (
            path.name in (OLD_META, "index.tmp")
            or path.name.startswith("snap-")
            or _SEGMENT.fullmatch(path.name)
        )
        if old:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
