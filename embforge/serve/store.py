"""The searchable documents: texts and fields next to a vector index, crash-consistent in one folder.

The one on-disk format of an index: ``embforge index build`` writes it, ``embforge serve --index`` and
``embforge index search`` open it. Layout::

    store.json          {"format": 2, "dim", "kind", "options", "model": {"name", "fingerprint"},
                         "snapshot": "snap-00000003" | null, "log_start": 3}
    snap-00000003/      documents.jsonl (one {"id", "text", "fields"} a line, JSON-escaped) + index/ (its save)
    wal-00000003.log    adds acknowledged since that snapshot (:mod:`embforge.serve.wal`), then -00000004, ...

An add appends one checksummed record (documents and vectors together) to the log and fsyncs it before it is
acknowledged; nothing else is rewritten, so it costs the same at 1k and at 100k documents. Opening replays the
log over the snapshot; a record torn by a crash (the last one) is cut off, never an error. Compaction (a
background thread, when the log passes ``compact_bytes``, and at :meth:`close`) rotates to a new log segment,
writes a new snapshot from a capture of the state while adds and searches go on, then switches ``store.json`` to it
in one atomic rename and deletes what it replaced. Vectors are L2-normalised on the way in: scores are cosines.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.registry import check_kind, create_index
from embforge.serve.tiers import TieredIndex
from embforge.serve.wal import LogWriter, encode_record, to_json

STORE_FILE = "store.json"
DOCS_FILE = "documents.jsonl"
INDEX_DIR = "index"
STORAGE_DIR = "storage"  # where an index that keeps its own files (Qdrant's embedded mode) lives
FORMAT = 2
SEGMENT_NAME = re.compile(r"wal-(\d{8})\.log")
log = logging.getLogger("embforge.store")


class DuplicateIdError(ValueError):
    """An added id is already stored (or repeated in the same add); ``position`` is its place in the add."""

    def __init__(self, position: int, key: str) -> None:
        super().__init__(f"document id {key!r} (position {position}) is already in the index")
        self.position = position
        self.key = key


class ModelMismatchError(ValueError):
    """The store was built by another model than the one opening it."""


def model_identity(model: Any, name: str) -> dict[str, Any]:
    """``{"name", "fingerprint"}`` of an encoder: a hash of its weights (:func:`model_fingerprint`), or for an ONNX
    export the fingerprint of the model it was exported from (recorded by ``embforge export onnx``)."""
    fingerprint = None
    if hasattr(model, "state_dict"):
        from embforge.retrieval.corpus_cache import model_fingerprint

        fingerprint = model_fingerprint(model)
    else:
        fingerprint = (getattr(model, "meta", None) or {}).get("fingerprint")
    return {"name": str(name), "fingerprint": fingerprint}


def _unit(x: np.ndarray, dim: int, n: int) -> np.ndarray:
    array = np.asarray(x, dtype=np.float32)
    if array.shape != (n, dim):
        raise ValueError(f"expected vectors of shape ({n}, {dim}), got {tuple(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError("the vectors contain NaN or infinity")
    return array / np.maximum(np.linalg.norm(array, axis=-1, keepdims=True), 1e-12)


def _clean(position: int, doc: dict[str, Any]) -> dict[str, Any]:
    key, text, fields = doc.get("id"), doc.get("text"), doc.get("fields") or {}
    if not isinstance(key, str) or not key:
        raise ValueError(f"document {position}: 'id' must be a non-empty string, got {key!r}")
    if not isinstance(text, str):
        raise ValueError(f"document {position}: 'text' must be a string, got {type(text).__name__}")
    if not isinstance(fields, dict):
        raise ValueError(f"document {position}: 'fields' must be an object, got {type(fields).__name__}")
    return {"id": key, "text": text, "fields": dict(fields)}


class DocumentStore:
    """Documents (id, text, fields) and their vectors; thread-safe; crash-consistent when it has a folder.

    Use :meth:`open` for a folder (create or recover) and the constructor for a memory-only store.

    Args:
        dim: Vector size.
        kind: Index kind (:data:`~embforge.retrieval.index.registry.INDEX_KINDS`).
        options: Index options (e.g. ``{"m": 32}`` for HNSW, ``{"url": ...}`` for a Qdrant server).
        model: ``{"name", "fingerprint"}`` of the model whose vectors the store holds (:func:`model_identity`).
        index: An index to use instead of a new one of ``kind`` (:meth:`open` passes the loaded one).
    """

    def __init__(
        self,
        dim: int,
        *,
        kind: str = "exact",
        options: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        index: VectorIndex | None = None,
    ) -> None:
        self.dim = int(dim)
        self.kind = check_kind(kind)
        self.options = dict(options or {})
        self.model = model
        self.folder: Path | None = None
        self.docs: dict[str, dict[str, Any]] = {}
        main = index if index is not None else create_index(kind, self.dim, **self.options)
        self.index = TieredIndex(main, tiered=False)  # :meth:`open` tiers it (adds to a delta, merged later)
        self._lock = threading.RLock()  # the in-memory state: held by search, and by add while it applies
        self._write_lock = threading.Lock()  # one writer at a time: log order = apply order
        self._compact_lock = threading.Lock()
        self._log: LogWriter | None = None
        self._segment = 0
        self._log_bytes = 0  # logged since the last snapshot
        self.compact_bytes: int | None = None
        self._wake = threading.Event()
        self._closing = False
        self._compactor: threading.Thread | None = None

    # ---- opening -------------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        folder: str | Path,
        *,
        dim: int,
        kind: str | None = None,
        options: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        allow_model_mismatch: bool = False,
        read_only: bool = False,
        durable: bool = True,
        compact_bytes: int | None = 64 << 20,
    ) -> DocumentStore:
        """Open the store in ``folder``, recovering from any crash, or start an empty one there.

        Args:
            folder: The store folder (created when missing).
            dim: The model's vector size; a store of another size is an error.
            kind: Index kind of a new store (default ``exact``); for an existing store, a different kind is an
                error naming both (``None``: whatever it is).
            options: Index options of a new store.
            model: The opening model's :func:`model_identity`; a store built by another model is refused
                (:class:`ModelMismatchError`) unless ``allow_model_mismatch``.
            allow_model_mismatch: Open it anyway (logged as a warning).
            read_only: Change nothing on disk (``embforge index search``); :meth:`add` is then an error.
            durable: fsync each add before it is acknowledged (off only for benchmarks of the rest).
            compact_bytes: Compact in the background once this much log is written (``None``: only at close).
        """
        from embforge.serve.snapshots import recover

        return recover(
            cls,
            Path(folder),
            dim=dim,
            kind=kind,
            options=options,
            model=model,
            allow_model_mismatch=allow_model_mismatch,
            read_only=read_only,
            durable=durable,
            compact_bytes=compact_bytes,
        )

    @classmethod
    def build(
        cls,
        folder: str | Path,
        ids: Sequence[str],
        texts: Sequence[str],
        vectors: np.ndarray,
        *,
        kind: str = "exact",
        options: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
    ) -> DocumentStore:
        """Write a new store of these documents to ``folder`` (replacing a store or index there) in one snapshot;
        what ``embforge index build`` does. Returns the store, open in ``folder``."""
        from embforge.serve.snapshots import build

        return build(cls, Path(folder), ids, texts, vectors, kind=kind, options=options, model=model)

    # ---- reading and writing ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.docs)

    def duplicates(self, ids: Sequence[str]) -> list[int]:
        """Positions of ids that are already stored or repeated within ``ids``."""
        seen: set[str] = set()
        out = []
        with self._lock:
            for pos, key in enumerate(ids):
                if key in self.docs or key in seen:
                    out.append(pos)
                seen.add(key)
        return out

    def add(self, documents: Sequence[dict[str, Any]], vectors: np.ndarray) -> None:
        """Add documents (``id``, ``text``, optional ``fields``) with their vectors; durable when it returns.

        Raises:
            DuplicateIdError: an id is already stored or repeated (checked atomically with the write, so of
                concurrent adds of one id exactly one succeeds).
            ValueError: a bad document, field (not JSON, NaN) or vector; nothing was changed.
        """
        if self.folder is not None and self._log is None:
            raise ValueError(f"{self.folder}: the store was opened read-only")
        docs = [_clean(i, d) for i, d in enumerate(documents)]
        array = _unit(vectors, self.dim, len(docs))
        record = encode_record(docs, array) if self._log is not None else b""
        ids = [d["id"] for d in docs]
        with self._write_lock:
            dup = self.duplicates(ids)
            if dup:
                raise DuplicateIdError(dup[0], ids[dup[0]])
            start = self._log.size if self._log is not None else 0
            if self._log is not None:
                self._log.append(record)
            try:
                with self._lock:
                    self.index.add(ids, array)
                    for doc in docs:
                        self.docs[doc["id"]] = {"text": doc["text"], "fields": doc["fields"]}
            except BaseException:
                if self._log is not None:
                    self._log.truncate(start)
                raise
            self._log_bytes += len(record)
        if self.compact_bytes is not None and self._log_bytes >= self.compact_bytes:
            self._start_compactor()
            self._wake.set()

    def search(self, queries: np.ndarray, k: int, *, with_text: bool = True) -> list[list[dict[str, Any]]]:
        """Top-``k`` documents per query vector: ``[{"id", "score", "text", "fields"}, ...]`` best first."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        unit = queries / np.maximum(np.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
        with self._lock:
            if not self.docs:
                return [[] for _ in range(len(unit))]
            scores, ids = self.index.search(unit, k)
            results = []
            for row_scores, row_ids in zip(scores, ids):
                hits = []
                for score, key in zip(row_scores, row_ids):
                    doc = self.docs.get(key)
                    if doc is None:  # a vector whose add was rolled back in a remote index
                        continue
                    hit: dict[str, Any] = {"id": key, "score": float(score)}
                    if with_text:
                        hit["text"] = doc["text"]
                    hit["fields"] = doc["fields"]
                    hits.append(hit)
                results.append(hits)
            return results

    # ---- compaction ------------------------------------------------------------------------------------------

    def compact(self) -> bool:
        """Write a snapshot of everything logged so far and drop the log it replaces; adds and searches go on
        meanwhile (they wait only for the capture). Returns whether there was anything to compact."""
        if self.folder is None or self._log is None:
            return False
        from embforge.serve.snapshots import write_snapshot

        with self._compact_lock:
            with self._write_lock:
                if self._log_bytes == 0:
                    return False
                self._segment += 1
                old = self._log
                self._log = LogWriter(self._segment_path(self._segment), durable=old.durable)
                old.close()
                self._log_bytes = 0
                with self._lock:
                    items = list(self.docs.items())
                    write_index = self.index.freeze()
            if write_index is None:  # a tiered index: merge the frozen delta, then write the main index
                write_index = self.index.merge(self._lock)
            write_snapshot(self, self._segment, items, write_index)
        return True

    def _segment_path(self, number: int) -> Path:
        assert self.folder is not None
        return self.folder / f"wal-{number:08d}.log"

    def _start_compactor(self) -> None:
        if self._compactor is None and not self._closing:
            self._compactor = threading.Thread(
                target=self._compact_loop, name="embforge-compact", daemon=True
            )
            self._compactor.start()

    def _compact_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self.compact()
            except Exception:  # the log still holds everything; the next compaction tries again
                log.exception("compaction of %s failed", self.folder)

    def close(self) -> None:
        """Compact (so the next open replays nothing), then release the log and the index."""
        self._closing = True
        self._wake.set()
        if self._compactor is not None:
            self._compactor.join()
        self.compact()
        with self._write_lock:
            if self._log is not None:
                self._log.close()
                self._log = None
            self.index.close()

    def meta(self) -> dict[str, Any]:
        """The ``store.json`` fields describing this store (without the snapshot pointer)."""
        return {
            "format": FORMAT,
            "dim": self.dim,
            "kind": self.kind,
            "options": self.options,
            "model": self.model,
        }


def write_docs(path: Path, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """``documents.jsonl``: one ``{"id", "text", "fields"}`` per line, ASCII-escaped (any id round-trips)."""
    with open(path, "w", encoding="ascii") as handle:
        for key, doc in items:
            handle.write(to_json({"id": key, "text": doc["text"], "fields": doc["fields"]}) + "\n")


def read_docs(path: Path) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}:{err.colno}: {err.msg}") from err
            docs[doc["id"]] = {"text": doc.get("text", ""), "fields": doc.get("fields") or {}}
    return docs


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
