"""The document store's SQLite database: its schema, its connections, and opening a store folder with its checks
(the model that opens it is the one that built it: :func:`model_identity`).

SQLite does the durability (:mod:`embforge.serve.store` describes the folder): WAL mode, one transaction per add,
``synchronous=FULL`` so a commit is on disk before the add is acknowledged. This module knows the tables; the store
knows what an add, a search and a compaction are.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge.retrieval.index.registry import check_kind, create_index
from embforge.serve.migrate import is_format2, read_format2, remove_format2
from embforge.serve.vectors import STORAGE_DIR

if TYPE_CHECKING:
    from embforge.protocols import Embedder

DB_FILE = "documents.sqlite"
FORMAT = 3  # PRAGMA user_version; 2 was store.json + snapshots + a home-made log, 1 documents.jsonl + index/
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS documents (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
    "text TEXT NOT NULL, fields TEXT NOT NULL, vector BLOB NOT NULL)",
)
_BLOCK = 8192  # rows per read when loading vectors
log = logging.getLogger("embforge.store")


class ModelMismatchError(ValueError):
    """The store was built by another model than the one opening it."""


def model_identity(model: Embedder, name: str) -> dict[str, object]:
    """``{"name", "fingerprint"}`` of an encoder: a hash of its weights (:func:`model_fingerprint`), or for an ONNX
    export the fingerprint of the model it was exported from (recorded by ``embforge export onnx``)."""
    from torch import nn

    fingerprint = None
    if isinstance(model, nn.Module):  # a PyTorch model: its own weights
        from embforge.retrieval.corpus_cache import model_fingerprint

        fingerprint = model_fingerprint(model)
    else:
        fingerprint = (getattr(model, "meta", None) or {}).get("fingerprint")
    return {"name": str(name), "fingerprint": fingerprint}


def to_json(obj: object) -> str:
    """JSON that reads back to the same value: ASCII only (any string survives), no NaN/Infinity."""
    return json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def connect(path: Path | str, *, read_only: bool = False, durable: bool = True) -> sqlite3.Connection:
    """A connection to a store's database: WAL mode, each commit fsynced when ``durable``; usable from any
    thread (the store serialises its use). ``":memory:"``: a memory-only database."""
    if read_only:
        uri = f"{Path(path).resolve().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    if str(path) != ":memory:":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
    return conn


def read_meta(conn: sqlite3.Connection, where: Path | str = "the database") -> dict[str, Any] | None:
    """The store's ``meta`` (``dim``, ``kind``, ``options``, ``model``); ``None`` for an empty database."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        return None
    if version != FORMAT:
        raise ValueError(
            f"{where}: a store of format {version}; this embforge reads format {FORMAT}: upgrade it"
        )
    return {key: json.loads(value) for key, value in conn.execute("SELECT key, value FROM meta")}


def write_meta(conn: sqlite3.Connection, meta: Mapping[str, object], rows: Sequence[tuple] = ()) -> None:
    """Create the tables (if missing) and record ``meta`` (and ``rows``: a converted store's), in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in SCHEMA:
            conn.execute(statement)
        conn.executemany(
            "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, to_json(v)) for k, v in meta.items()]
        )
        conn.executemany("INSERT INTO documents VALUES (?, ?, ?, ?, ?)", rows)
        conn.execute(f"PRAGMA user_version = {FORMAT}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class SqliteRows:
    """The rows as :class:`~embforge.serve.vectors.Rows`: ids and vectors in ``seq`` order."""

    def __init__(self, conn: sqlite3.Connection, dim: int) -> None:
        self.conn, self.dim = conn, dim

    def ids_upto(self, seq: int) -> list[str]:
        rows = self.conn.execute("SELECT id FROM documents WHERE seq <= ? ORDER BY seq", (seq,))
        return [key for (key,) in rows]

    def vectors_after(self, seq: int) -> Iterator[tuple[list[str], np.ndarray, int]]:
        cursor = self.conn.execute("SELECT seq, id, vector FROM documents WHERE seq > ? ORDER BY seq", (seq,))
        while block := cursor.fetchmany(_BLOCK):
            data = b"".join(row[2] for row in block)
            if len(data) != 4 * self.dim * len(block):
                raise ValueError(f"rows {block[0][0]}..{block[-1][0]}: vectors are not {self.dim}-d float32")
            yield [row[1] for row in block], np.frombuffer(data, "<f4").reshape(-1, self.dim), block[-1][0]


def is_store(root: Path) -> bool:
    """Whether ``root`` holds a store (of this format or an older one) or an older index."""
    return any((root / name).exists() for name in (DB_FILE, "store.json", "index.json"))


def _refuse_other(root: Path, read_only: bool) -> None:
    """A folder without a database: an error unless it can become a new store (or be converted into one)."""
    if read_only and is_format2(root):
        raise ValueError(
            f"{root} holds a store of the previous format; open it once with 'embforge serve --index {root}' "
            "(which converts it) before searching it read-only"
        )
    if (root / "index.json").exists() or ((root / "store.json").exists() and not is_format2(root)):
        raise ValueError(
            f"{root} was written by an older 'embforge index build' (or server); rebuild it: "
            f"embforge index build --index {root} ..."
        )
    if read_only or (root.exists() and any(root.iterdir()) and not is_format2(root)):
        raise FileNotFoundError(f"{root} is not an embforge index folder (no {DB_FILE})")


def _check(root: Path, meta: Mapping[str, Any], *, dim: int, kind: str | None) -> None:
    if int(meta["dim"]) != dim:
        raise ValueError(
            f"{root / DB_FILE}: the index holds {meta['dim']}-d vectors but the model gives {dim}-d ones; "
            "use the model that built it or another --index folder"
        )
    if kind is not None and check_kind(kind) != meta["kind"]:
        raise ValueError(
            f"{root}: the index there is of kind {meta['kind']!r} but --index-kind is {kind!r}; "
            f"leave --index-kind out (or pass {meta['kind']!r}) to open it, or use another --index folder"
        )


def check_model(root: Path, stored: Mapping | None, given: Mapping | None, allow: bool) -> None:
    """Refuse (or with ``allow``, warn about) a store built by another model than ``given``."""
    if (
        not stored
        or not given
        or (stored.get("fingerprint") and stored["fingerprint"] == given.get("fingerprint"))
    ):
        return
    message = (
        f"{root}: the index was built by {stored.get('name')!r} (fingerprint {stored.get('fingerprint')}) but the "
        f"model is {given.get('name')!r} (fingerprint {given.get('fingerprint') or 'unknown'}); its vectors would "
        "not match the queries. Use the model that built it, rebuild the index with this one, or pass "
        "--allow-model-mismatch"
    )
    if not allow:
        raise ModelMismatchError(message)
    log.warning("%s (allowed)", message)


def open_folder(
    root: Path,
    *,
    dim: int,
    kind: str | None,
    options: Mapping[str, object] | None,
    model: Mapping[str, object] | None,
    allow_model_mismatch: bool,
    read_only: bool,
    durable: bool,
) -> tuple[sqlite3.Connection | None, sqlite3.Connection]:
    """``(writer, reader)`` connections of the store in ``root`` (writer ``None`` when ``read_only``), created
    when missing; the arguments as in :meth:`~embforge.serve.store.DocumentStore.open`."""
    db = root / DB_FILE
    if not db.exists():
        _refuse_other(root, read_only)
        root.mkdir(parents=True, exist_ok=True)
    writer = None if read_only else connect(db, durable=durable)
    reader = connect(db, read_only=True)
    try:
        meta = read_meta(reader, db)
        if meta is None and writer is not None and is_format2(root):  # (again, if a conversion was cut short)
            meta, rows = read_format2(root)
            write_meta(writer, meta, rows)
            log.warning("%s: converted %d documents from the previous store format", root, len(rows))
        if meta is not None and writer is not None and is_format2(root):
            remove_format2(root)
        if meta is None and writer is not None:  # new, or its creation was cut short (nothing else written)
            new_kind = check_kind(kind or "exact")
            create_index(new_kind, dim, storage=root / STORAGE_DIR, **(options or {})).close()  # bad options
            write_meta(
                writer, {"dim": int(dim), "kind": new_kind, "options": dict(options or {}), "model": model}
            )
            return writer, reader
        if meta is None:
            raise FileNotFoundError(f"{root} is not an embforge index folder (its {DB_FILE} is empty)")
        _check(root, meta, dim=dim, kind=kind)
        check_model(root, meta.get("model"), model, allow_model_mismatch)
        if writer is not None and model and not meta.get("model"):
            write_meta(writer, {"model": model})
    except BaseException:
        for conn in (writer, reader):
            if conn is not None:
                conn.close()
        raise
    return writer, reader
