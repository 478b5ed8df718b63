"""The searchable documents: texts, fields and vectors in SQLite, with a vector index beside them, in one folder.

The one on-disk format of an index: ``embforge index build`` writes it, ``embforge serve --index`` and
``embforge index search`` open it. Layout::

    documents.sqlite   SQLite in WAL mode (format: PRAGMA user_version = 3)
                         documents(seq INTEGER PRIMARY KEY, id TEXT UNIQUE, text, fields JSON, vector float32 BLOB)
                         meta(key, value JSON): dim, kind, options, model {"name", "fingerprint"}
    index/             the vector index's own files + rows.json, for kinds other than exact (:mod:`.vectors`)
    storage/           where an index that keeps its own files (Qdrant's embedded mode) lives

An add is one SQLite transaction holding its documents and their vectors, committed (fsynced: WAL mode with
``synchronous=FULL``) before it is acknowledged. SQLite's recovery keeps every committed transaction and drops a
torn one, so a crash (kill -9 included) never loses an acknowledged add nor keeps half of one, and an add writes
the pages it changes, not the store. The vector index is derived from the rows: rebuilt from them, or reloaded
from ``index/`` and checked against them (:func:`~embforge.serve.vectors.load_vectors`). Vectors are
L2-normalised on the way in: scores are cosines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge.files import atomic_dir
from embforge.serve.database import (
    ModelMismatchError,
    SqliteRows,
    connect,
    is_store,
    model_identity,
    open_folder,
    read_meta,
    write_meta,
)
from embforge.serve.documents import (
    DuplicateIdError,
    Hit,
    StoredDocument,
    document_row,
    hit,
    taken,
    unit_vectors,
)
from embforge.serve.vectors import StoreIndex, load_vectors, save_index

if TYPE_CHECKING:
    pass

__all__ = ["DocumentStore", "DuplicateIdError", "ModelMismatchError", "model_identity"]

log = logging.getLogger("embforge.store")


class Documents(Mapping[str, StoredDocument]):
    """The stored documents, read-only: ``id -> {"text", "fields"}``, iterated in the order they were added."""

    def __init__(self, store: DocumentStore) -> None:
        self._store = store

    def __getitem__(self, key: str) -> StoredDocument:
        found = self._store.fetch([key])
        if key not in found:
            raise KeyError(key)
        return found[key]

    def __iter__(self) -> Iterator[str]:
        return iter([key for (key,) in self._store._read("SELECT id FROM documents ORDER BY seq", ())])

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and bool(
            self._store._read("SELECT 1 FROM documents WHERE id = ?", (key,))
        )


class DocumentStore:
    """Documents (id, text, fields) and their vectors; thread-safe; crash-consistent when it has a folder.

    Use :meth:`open` for a folder (create or recover) and the constructor for a memory-only store.

    Args:
        dim: Vector size.
        kind: Index kind (:data:`~embforge.retrieval.index.registry.INDEX_KINDS`).
        options: Index options (e.g. ``{"m": 32}`` for HNSW, ``{"url": ...}`` for a Qdrant server).
        model: ``{"name", "fingerprint"}`` of the model whose vectors the store holds (:func:`model_identity`).

    Example:
        >>> store = DocumentStore(2)  # memory-only
        >>> store.add([{"id": "a\\nb", "text": "first"}, {"id": "c", "text": "second", "fields": {"n": 1}}], np.eye(2))
        >>> [(hit["id"], hit["fields"]) for hit in store.search(np.array([[0.1, 1.0]]), 2)[0]]
        [('c', {'n': 1}), ('a\\nb', {})]
        >>> store.docs["a\\nb"], len(store)
        ({'text': 'first', 'fields': {}}, 2)
    """

    def __init__(
        self,
        dim: int,
        *,
        kind: str = "exact",
        options: Mapping[str, object] | None = None,
        model: Mapping[str, object] | None = None,
    ) -> None:
        conn = connect(":memory:")
        write_meta(conn, {"dim": int(dim), "kind": kind, "options": dict(options or {}), "model": model})
        self._attach(conn, conn, None, compact_bytes=None)

    def _attach(
        self,
        writer: sqlite3.Connection | None,
        reader: sqlite3.Connection,
        folder: Path | None,
        *,
        compact_bytes: int | None,
    ) -> None:
        meta = read_meta(reader)
        assert meta is not None
        self.dim, self.kind = int(meta["dim"]), str(meta["kind"])
        self.options, self.model = dict(meta.get("options") or {}), meta.get("model")
        self.folder = folder
        self._writer, self._reader = writer, reader
        self._read_lock = threading.Lock()  # the reader connection (the writer too, in a memory-only store)
        self._lock = threading.RLock()  # the vector index: held by search, and by add while it applies
        self._write_lock = threading.Lock()  # one writer at a time: seq order = commit order
        self._compact_lock = threading.Lock()
        self._seq = reader.execute("SELECT coalesce(max(seq), 0) FROM documents").fetchone()[0]
        self._count = reader.execute("SELECT count(*) FROM documents").fetchone()[0]
        self.index: StoreIndex = load_vectors(
            folder, SqliteRows(reader, self.dim), kind=self.kind, dim=self.dim, options=self.options
        )
        self.compact_bytes = compact_bytes
        self._wake = threading.Event()
        self._closing = False
        self._compactor: threading.Thread | None = None
        self._wake_compactor()  # a long tail of rows caught up on open: merge it soon

    # ---- opening -------------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        folder: str | Path,
        *,
        dim: int,
        kind: str | None = None,
        options: Mapping[str, object] | None = None,
        model: Mapping[str, object] | None = None,
        allow_model_mismatch: bool = False,
        read_only: bool = False,
        durable: bool = True,
        compact_bytes: int | None = 64 << 20,
    ) -> DocumentStore:
        """Open the store in ``folder`` (after any crash: SQLite recovers it), or start an empty one there.

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
            compact_bytes: Merge recent adds into the saved index in the background once their vectors take this
                many bytes (kinds other than exact; ``None``: only at close).
        """
        writer, reader = open_folder(
            Path(folder),
            dim=dim,
            kind=kind,
            options=options,
            model=model,
            allow_model_mismatch=allow_model_mismatch,
            read_only=read_only,
            durable=durable,
        )
        store = cls.__new__(cls)
        store._attach(writer, reader, Path(folder), compact_bytes=compact_bytes)
        return store

    @classmethod
    def build(
        cls,
        folder: str | Path,
        ids: Sequence[str],
        texts: Sequence[str],
        vectors: np.ndarray,
        *,
        kind: str = "exact",
        options: Mapping[str, object] | None = None,
        model: Mapping[str, object] | None = None,
    ) -> DocumentStore:
        """Write a new store of these documents to ``folder`` (replacing a store or index there), staged beside it
        and swapped in when complete (:func:`~embforge.files.atomic_dir`); what ``embforge index build`` does. Returns the store, open in ``folder``."""
        root = Path(folder)
        if len(ids) != len(texts) or len(ids) != len(vectors):
            raise ValueError(
                f"{len(ids)} ids, {len(texts)} texts and {len(vectors)} vectors; they must match"
            )
        if root.exists() and any(root.iterdir()) and not is_store(root):
            raise ValueError(
                f"{root} is a folder with other files, not an embforge index; choose another --index"
            )
        dim = int(np.shape(vectors)[1])

        def write(stage: Path) -> None:
            store = cls.open(stage, dim=dim, kind=kind, options=options, model=model, compact_bytes=None)
            store.add([{"id": key, "text": text} for key, text in zip(ids, texts)], vectors)
            store.close()  # merges the adds into the main index and saves it; folds SQLite's log in

        atomic_dir(root, write)
        return cls.open(root, dim=dim, model=model)

    # ---- reading and writing ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    @property
    def docs(self) -> Documents:
        """The documents as a read-only mapping ``id -> {"text", "fields"}`` (in the order they were added)."""
        return Documents(self)

    def _read(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        with self._read_lock:
            return self._reader.execute(sql, params).fetchall()

    def _present(
        self, ids: Sequence[str], read: Callable[[str, Sequence[Any]], Iterable[tuple]]
    ) -> list[int]:
        """Positions of ids that ``read`` (a connection's query) finds stored, or that repeat within ``ids``."""
        found: set[str] = set()
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            marks = ",".join("?" * len(part))
            found.update(key for (key,) in read(f"SELECT id FROM documents WHERE id IN ({marks})", part))
        return taken(ids, found)

    def duplicates(self, ids: Sequence[str]) -> list[int]:
        """Positions of ids that are already stored or repeated within ``ids``."""
        return self._present(ids, self._read)

    def fetch(self, ids: Sequence[str]) -> dict[str, StoredDocument]:
        """``{id: {"text", "fields"}}`` of the stored ones among ``ids``."""
        out: dict[str, StoredDocument] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            sql = f"SELECT id, text, fields FROM documents WHERE id IN ({','.join('?' * len(part))})"
            out.update({k: {"text": t, "fields": json.loads(f)} for k, t, f in self._read(sql, part)})
        return out

    def add(self, documents: Sequence[Mapping[str, object]], vectors: np.ndarray) -> None:
        """Add documents (``id``, ``text``, optional ``fields``) with their vectors; durable when it returns.

        Raises:
            DuplicateIdError: an id is already stored or repeated (checked atomically with the write, so of
                concurrent adds of one id exactly one succeeds).
            ValueError: a bad document, field (not JSON, NaN) or vector; nothing was changed.
        """
        if self._writer is None:
            raise ValueError(f"{self.folder}: the store was opened read-only")
        rows = [document_row(i, d) for i, d in enumerate(documents)]
        unit = unit_vectors(vectors, self.dim, len(rows))
        ids = [row[0] for row in rows]
        with self._write_lock, self._shared():
            dup = self._present(ids, self._writer.execute)
            if dup:
                raise DuplicateIdError(dup[0], ids[dup[0]])
            first = self._seq + 1
            values = [(first + i, *row, unit[i].astype("<f4").tobytes()) for i, row in enumerate(rows)]
            self._transaction("INSERT INTO documents VALUES (?, ?, ?, ?, ?)", values)
            try:
                with self._lock:
                    self.index.add(ids, unit, first + len(rows) - 1)
            except BaseException:
                self._transaction("DELETE FROM documents WHERE seq >= ?", [(first,)])
                raise
            self._seq += len(rows)
            self._count += len(rows)
        self._wake_compactor()

    def _shared(self) -> contextlib.AbstractContextManager:
        """The reader's lock when the reader is the writer (a memory-only store), so reads see no open write."""
        return self._read_lock if self._reader is self._writer else contextlib.nullcontext()

    def _transaction(self, sql: str, values: list[tuple]) -> None:
        assert self._writer is not None
        self._writer.execute("BEGIN IMMEDIATE")
        try:
            self._writer.executemany(sql, values)
            self._writer.execute("COMMIT")
        except BaseException:
            self._writer.execute("ROLLBACK")
            raise

    def search(self, queries: np.ndarray, k: int, *, with_text: bool = True) -> list[list[Hit]]:
        """Top-``k`` documents per query vector: ``[{"id", "score", "text", "fields"}, ...]`` best first."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        unit = queries / np.maximum(np.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
        with self._lock:
            if not len(self.index):
                return [[] for _ in range(len(unit))]
            scores, ids = self.index.search(unit, k)
        docs = self.fetch([key for row in ids for key in row])  # rows are never removed: no lock needed
        results = []
        for row_scores, row_ids in zip(scores, ids):
            hits = []
            for score, key in zip(row_scores, row_ids):
                doc = docs.get(key)
                if doc is None:  # a point a remote index holds without a row here
                    continue
                hits.append(hit(key, score, doc, with_text=with_text))
            results.append(hits)
        return results

    # ---- compaction ------------------------------------------------------------------------------------------

    def compact(self) -> bool:
        """Merge the adds since the last compaction into the main index and save it beside the rows (kinds other
        than exact), and checkpoint SQLite's log into the database; adds and searches go on meanwhile (they wait
        only for the cut). Returns whether there were adds to merge."""
        if self.folder is None or self._writer is None:
            return False
        with self._compact_lock:
            with self._write_lock, self._lock:
                merging = self.index.freeze()
            if merging:
                save_index(self.folder, self.index.merge(self._lock), self.index.seq)
            with self._write_lock:
                self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return merging

    def _wake_compactor(self) -> None:
        if self.compact_bytes is None or self._writer is None or self.folder is None:
            return
        if self.index.pending() * 4 * self.dim < self.compact_bytes:
            return
        if self._compactor is None and not self._closing:
            self._compactor = threading.Thread(
                target=self._compact_loop, name="embforge-compact", daemon=True
            )
            self._compactor.start()
        self._wake.set()

    def _compact_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self.compact()
            except Exception:  # the rows hold everything; the next compaction tries again
                log.exception("compaction of %s failed", self.folder)

    def close(self) -> None:
        """Compact (so the next open loads the index as it is), then release the database and the index."""
        self._closing = True
        self._wake.set()
        if self._compactor is not None:
            self._compactor.join()
        self.compact()
        with self._write_lock, self._read_lock:
            self._reader.close()  # first: the last connection to close (the writer) folds SQLite's log in
            if self._writer is not None:
                self._writer.close()
            self._writer = None
            self.index.close()
