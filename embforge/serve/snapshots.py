"""Opening, building and compacting the document store's folder (the format is described in
:mod:`embforge.serve.store`): recovery replays the log over the snapshot and cuts a torn tail; a snapshot is
written beside the old one and switched to by one atomic rename of ``store.json``; folders written before this
format (``store.json`` without ``format``) are migrated on open."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.registry import check_kind, create_index, load_index
from embforge.serve.store import (
    DOCS_FILE,
    INDEX_DIR,
    SEGMENT_NAME,
    STORAGE_DIR,
    STORE_FILE,
    ModelMismatchError,
    log,
    read_docs,
    remove,
    write_docs,
)
from embforge.serve.tiers import TieredIndex
from embforge.serve.wal import LogWriter, fsync_dir, fsync_tree, read_log, write_atomic

if TYPE_CHECKING:
    from embforge.serve.store import DocumentStore


def _segments(root: Path, start: int) -> list[int]:
    numbers = (SEGMENT_NAME.fullmatch(p.name) for p in root.iterdir())
    return sorted(n for n in (int(m.group(1)) for m in numbers if m) if n >= start)


def cleanup(root: Path, *, snapshot: str | None, log_start: int) -> None:
    """Delete what a finished compaction replaced or an interrupted one left: other snapshots, log segments
    before ``log_start``, temporary files."""
    for path in root.iterdir():
        segment = SEGMENT_NAME.fullmatch(path.name)
        stale_snapshot = path.name.startswith("snap-") and path.name != snapshot
        if stale_snapshot or path.name.endswith(".tmp") or (segment and int(segment.group(1)) < log_start):
            remove(path)


def _write_meta(store: DocumentStore, snapshot: str | None, log_start: int) -> None:
    assert store.folder is not None
    meta = {**store.meta(), "snapshot": snapshot, "log_start": log_start, "documents": len(store.docs)}
    write_atomic(store.folder / STORE_FILE, (json.dumps(meta, indent=1) + "\n").encode())


def write_snapshot(
    store: DocumentStore,
    segment: int,
    items: Sequence[tuple[str, dict[str, Any]]],
    write_index: Callable[[Path], None],
) -> None:
    """Write ``snap-<segment>`` (documents + index as captured), switch ``store.json`` to it, drop the rest."""
    root = store.folder
    assert root is not None
    name = f"snap-{segment:08d}"
    tmp = root / (name + ".tmp")
    remove(tmp)
    (tmp / INDEX_DIR).mkdir(parents=True)
    write_docs(tmp / DOCS_FILE, items)
    write_index(tmp / INDEX_DIR)
    fsync_tree(tmp)
    os.replace(tmp, root / name)
    fsync_dir(root)
    _write_meta(store, name, segment)
    cleanup(root, snapshot=name, log_start=segment)


def _check_model(root: Path, stored: dict | None, given: dict | None, allow: bool) -> None:
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


def _apply(store: DocumentStore, docs: list[dict[str, Any]], vectors: np.ndarray) -> None:
    """Replay one logged add (ids the index already holds, as a remote collection may, are not added again)."""
    fresh = [i for i, d in enumerate(docs) if d["id"] not in store.docs]
    missing = [i for i in fresh if not store.index.has(docs[i]["id"])]
    if missing:
        store.index.add([docs[i]["id"] for i in missing], vectors[missing])
    for i in fresh:
        store.docs[docs[i]["id"]] = {"text": docs[i]["text"], "fields": docs[i].get("fields") or {}}


def recover(
    cls: type[DocumentStore], root: Path, *, dim: int, kind: str | None, **settings: Any
) -> DocumentStore:
    """:meth:`DocumentStore.open`: create, or load the snapshot and replay the log (see its arguments)."""
    model, read_only = settings["model"], settings["read_only"]
    store_file = root / STORE_FILE
    if not store_file.exists():
        if (root / "index.json").exists():
            raise ValueError(
                f"{root} was written by an older 'embforge index build' (vectors without their texts); "
                f"rebuild it: embforge index build --index {root} ..."
            )
        if read_only or (root.exists() and any(root.iterdir())):
            raise FileNotFoundError(f"{root} is not an embforge index folder (no {STORE_FILE})")
        root.mkdir(parents=True, exist_ok=True)
        index = create_index(kind or "exact", dim, storage=root / STORAGE_DIR, **(settings["options"] or {}))
        store = cls(dim, kind=kind or "exact", options=settings["options"], model=model, index=index)
        store.index = TieredIndex(index)
        return _attach(store, root, segment=0, log_bytes=0, new=True, **settings)
    meta = json.loads(store_file.read_text())
    if "format" not in meta:
        return _migrate(cls, root, meta, dim=dim, kind=kind, **settings)
    if int(meta["dim"]) != dim:
        raise ValueError(
            f"{store_file}: the index holds {meta['dim']}-d vectors but the model gives {dim}-d ones; "
            "use the model that built it or another --index folder"
        )
    if kind is not None and check_kind(kind) != meta["kind"]:
        raise ValueError(
            f"{root}: the index there is of kind {meta['kind']!r} but --index-kind is {kind!r}; "
            f"leave --index-kind out (or pass {meta['kind']!r}) to open it, or use another --index folder"
        )
    _check_model(root, meta.get("model"), model, settings["allow_model_mismatch"])
    snapshot, log_start = meta.get("snapshot"), int(meta.get("log_start", 0))
    if not read_only:
        cleanup(root, snapshot=snapshot, log_start=log_start)
    storage = root / STORAGE_DIR
    if snapshot:
        index = load_index(root / snapshot / INDEX_DIR, storage=storage)
    else:
        index = create_index(meta["kind"], dim, storage=storage, **meta.get("options", {}))
    store = cls(
        dim, kind=meta["kind"], options=meta.get("options"), model=meta.get("model") or model, index=index
    )
    store.index = TieredIndex(index)  # adds go to an exact delta where the kind's own add is not cheap
    if snapshot:
        store.docs = read_docs(root / snapshot / DOCS_FILE)
    segments, logged = _segments(root, log_start) or [log_start], 0
    for number in segments:
        path = root / f"wal-{number:08d}.log"
        if not path.exists():
            continue
        records, end = read_log(path, dim=dim)
        if end < path.stat().st_size:
            log.warning(
                "%s: cut a torn record at byte %d (a crash during an add that was not acknowledged)",
                path,
                end,
            )
            if not read_only:
                with open(path, "r+b") as handle:
                    handle.truncate(end)
                    os.fsync(handle.fileno())
        for docs, vectors in records:
            _apply(store, docs, vectors)
        logged += end
    if read_only:
        store.folder = root
        return store
    return _attach(
        store,
        root,
        segment=segments[-1],
        log_bytes=logged,
        new=not meta.get("model") and bool(model),
        **settings,
    )


def _attach(
    store: DocumentStore, root: Path, *, segment: int, log_bytes: int, new: bool, **settings: Any
) -> DocumentStore:
    store.folder = root
    store._segment = segment
    store._log = LogWriter(root / f"wal-{segment:08d}.log", durable=settings["durable"])
    store._log_bytes = log_bytes
    store.compact_bytes = settings["compact_bytes"]
    if (
        store.compact_bytes is not None and log_bytes >= store.compact_bytes
    ):  # a long log replayed: compact soon
        store._start_compactor()
        store._wake.set()
    if new:
        meta = json.loads((root / STORE_FILE).read_text()) if (root / STORE_FILE).exists() else {}
        _write_meta(store, meta.get("snapshot"), int(meta.get("log_start", segment)))
    return store


def _migrate(
    cls: type[DocumentStore], root: Path, meta: dict, *, dim: int, kind: str | None, **settings: Any
) -> DocumentStore:
    """A folder of the format before this one: documents.jsonl + index/ rewritten on every add. A crash there
    could leave more documents than vectors; the documents without a vector are dropped (they were never
    acknowledged), then the folder is rewritten in this format."""
    old_kind = meta.get("index", "exact")
    if old_kind == "qdrant":
        raise ValueError(f"{root}: a Qdrant store written before format 2 cannot be migrated; re-create it")
    if int(meta["dim"]) != dim:
        raise ValueError(
            f"{root / STORE_FILE}: the index holds {meta['dim']}-d vectors but the model gives {dim}-d ones"
        )
    if kind is not None and kind != old_kind:
        raise ValueError(f"{root}: the index there is of kind {old_kind!r} but --index-kind is {kind!r}")
    index_dir = next(
        (
            root / n
            for n in (INDEX_DIR, INDEX_DIR + ".old", INDEX_DIR + ".tmp")
            if (root / n / "index.json").exists()
        ),
        None,
    )
    index: VectorIndex = load_index(index_dir) if index_dir else create_index(old_kind, dim)
    docs = read_docs(root / DOCS_FILE) if (root / DOCS_FILE).exists() else {}
    kept = {key: doc for key, doc in docs.items() if index.has(key)}
    if len(kept) < len(docs):
        log.warning(
            "%s: dropped %d documents without a vector (an interrupted add)", root, len(docs) - len(kept)
        )
    store = cls(dim, kind=old_kind, model=settings["model"], index=index)
    store.index = TieredIndex(index)
    store.docs = kept
    if settings["read_only"]:
        store.folder = root
        return store
    _attach(store, root, segment=0, log_bytes=1, new=False, **settings)
    store.compact()
    for name in (DOCS_FILE, INDEX_DIR, INDEX_DIR + ".old", INDEX_DIR + ".tmp"):
        remove(root / name)
    return store


def build(
    cls: type[DocumentStore],
    root: Path,
    ids: Sequence[str],
    texts: Sequence[str],
    vectors: np.ndarray,
    *,
    kind: str,
    options: dict[str, Any] | None,
    model: dict[str, Any] | None,
) -> DocumentStore:
    """:meth:`DocumentStore.build`: the documents in one snapshot, in a staging folder swapped in at the end."""
    if len(ids) != len(texts) or len(ids) != len(vectors):
        raise ValueError(f"{len(ids)} ids, {len(texts)} texts and {len(vectors)} vectors; they must match")
    if (
        root.exists()
        and any(root.iterdir())
        and not ((root / STORE_FILE).exists() or (root / "index.json").exists())
    ):
        raise ValueError(
            f"{root} is a folder with other files, not an embforge index; choose another --index"
        )
    dim = int(np.shape(vectors)[1])
    stage = root.with_name(root.name + ".building")
    remove(stage)
    stage.mkdir(parents=True)
    index = create_index(check_kind(kind), dim, storage=stage / STORAGE_DIR, **(options or {}))
    unit = np.asarray(vectors, dtype=np.float32)
    unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    index.add(list(ids), unit)
    store = cls(dim, kind=kind, options=options, model=model, index=index)
    store.folder = stage
    items = [(key, {"text": text, "fields": {}}) for key, text in zip(ids, texts)]
    write_snapshot(store, 0, items, index.snapshot())
    index.close()
    old = root.with_name(root.name + ".replaced")
    remove(old)
    if root.exists():
        os.replace(root, old)
    os.replace(stage, root)
    fsync_dir(root.parent)
    remove(old)
    return cls.open(root, dim=dim, model=model)
