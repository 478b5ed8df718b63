"""Embedding shards that say what they hold: each ``NNNNN.npy`` has a manifest ``NNNNN.json``, checked on read.

A manifest records what decides the vectors and what the bytes must be:

=========== ==========================================================================================
fingerprint the cache folder's: a hash of the whole corpus, the model, the dimension and the precision
model       the model's fingerprint (a hash of its weights, or the tag the caller gave)
corpus      a hash of the ids and texts of the rows this shard covers
first_row   the corpus row of the shard's first vector; ``rows``, ``shape`` and ``dtype`` of the array
bytes       the ``.npy`` file's size; ``sha256`` its checksum
=========== ==========================================================================================

:func:`write_shard` refuses vectors that are not finite (NaN or inf), naming the row and its document id, then
writes the array and its manifest, each atomically (:func:`embforge.files.write_bytes_atomic`): the shard first,
so a shard without its manifest (a write interrupted between the two) is not trusted. :func:`shard_problem`
says what is wrong with a shard — missing, empty, truncated, bytes changed since they were written (flipped
bits, all-zero rows, another file copied over it), written for other documents or another model, rows missing,
NaN/inf rows — or ``None``; :func:`read_shard` reads one that passes and raises :class:`ShardError` (a
``ValueError`` whose message starts with the shard's path) for one that does not.

:class:`CorpusEmbeddings` reads a folder of them (:mod:`embforge.retrieval.corpus_cache` writes it): each shard is
checked as it is read, so a vector is never used unless its shard matches its manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from embforge.files import write_bytes_atomic, write_text_atomic

__all__ = [
    "CacheWarning",
    "CorpusEmbeddings",
    "ShardError",
    "ShardKey",
    "check_finite",
    "corpus_digest",
    "manifest_path",
    "read_shard",
    "remove_shard",
    "shard_path",
    "shard_problem",
    "unit_rows",
    "write_shard",
]

FORMAT = "embforge-shard-1"
SHARDS = "shards"  # the sub-folder of a corpus cache holding them
RECOMPUTE = "run the command that wrote this corpus cache again: it re-encodes damaged shards"
DTYPE = np.dtype(np.float32)


class ShardError(ValueError):
    """A shard that cannot be used; the message starts with the shard file and says what is wrong."""


class CacheWarning(UserWarning):
    """A cached shard was damaged or stale (its file named): it is discarded and computed again."""


@dataclass(frozen=True)
class ShardKey:
    """What a shard must hold: ``rows`` vectors of ``dim`` from corpus row ``first_row``, for this folder
    ``fingerprint`` and ``model``; ``corpus`` (the digest of those rows' ids and texts) is checked when known."""

    fingerprint: str
    model: str
    first_row: int
    rows: int
    dim: int
    corpus: str | None = None


def manifest_path(shard: Path) -> Path:
    return shard.with_suffix(".json")


def corpus_digest(ids: Sequence[str], texts: Sequence[str]) -> str:
    """A hash of the documents a shard covers (their ids and texts, in order)."""
    digest = hashlib.sha256()
    for doc_id, text in zip(ids, texts):
        digest.update(doc_id.encode() + b"\0" + text.encode() + b"\1")
    return digest.hexdigest()


def check_finite(path: Path, vectors: np.ndarray, ids: Sequence[str], first_row: int = 0) -> None:
    """Raise :class:`ShardError` naming ``path`` and the first row (with its document id) that holds NaN or inf.

    Args:
        path: the shard these vectors are for.
        vectors: ``(rows, dim)``.
        ids: the whole corpus's document ids.
        first_row: the corpus row of ``vectors[0]``.
    """
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if len(bad):
        row = first_row + int(bad[0])
        more = f" and {len(bad) - 1} more rows" if len(bad) > 1 else ""
        raise ShardError(
            f"{path}: row {row} (id {ids[row]!r}){more}: the model's vectors are not finite (NaN or inf), so "
            "they were not cached; check the model and its precision (fp16 overflows), or drop those documents"
        )


def write_shard(path: Path, vectors: np.ndarray, key: ShardKey, ids: Sequence[str]) -> None:
    """Write ``vectors`` (finite, ``(key.rows, key.dim)``) and then its manifest, each atomically."""
    vectors = np.ascontiguousarray(vectors, dtype=DTYPE)
    if vectors.shape != (key.rows, key.dim):
        raise ShardError(
            f"{path}: {vectors.shape[0]} vectors of {vectors.shape[1:]}, expected {(key.rows, key.dim)}"
        )
    check_finite(path, vectors, ids, key.first_row)
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    data = buffer.getvalue()
    manifest = {
        "format": FORMAT,
        "fingerprint": key.fingerprint,
        "model": key.model,
        "corpus": key.corpus,
        "first_row": key.first_row,
        "rows": key.rows,
        "shape": list(vectors.shape),
        "dtype": DTYPE.str,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    manifest_path(path).unlink(missing_ok=True)  # a new shard is not trusted until its manifest is written
    write_bytes_atomic(path, data)
    write_text_atomic(manifest_path(path), json.dumps(manifest, indent=1) + "\n")


def read_shard(path: Path, key: ShardKey) -> np.ndarray:
    """The vectors of a shard that matches ``key`` and its manifest; :class:`ShardError` otherwise."""
    vectors, problem = _checked(path, key)
    if vectors is None:
        raise ShardError(f"{path}: {problem}")
    return vectors


def shard_problem(path: Path, key: ShardKey) -> str | None:
    """What is wrong with a shard (a phrase, the path not included), or ``None`` when it can be used."""
    return _checked(path, key)[1]


def _checked(path: Path, key: ShardKey) -> tuple[np.ndarray | None, str | None]:
    manifest, problem = _manifest(path, key)
    if manifest is None:
        return None, problem
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "the shard file is missing"
    if len(data) != manifest["bytes"]:
        kind = "an empty file" if not data else f"{len(data):,} bytes"
        return None, f"{kind}, its manifest says {manifest['bytes']:,} bytes (truncated or replaced)"
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        return None, "checksum mismatch: its bytes changed after they were written (damaged or overwritten)"
    try:
        vectors = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        return None, f"not a readable .npy file ({err})"
    if vectors.shape != (key.rows, key.dim) or vectors.dtype != DTYPE:
        return None, f"holds {vectors.dtype} {vectors.shape}, expected float32 {(key.rows, key.dim)}"
    bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if len(bad):
        return None, f"{len(bad)} rows hold NaN or inf (first: row {key.first_row + int(bad[0])})"
    return vectors, None


def _manifest(path: Path, key: ShardKey) -> tuple[dict[str, object] | None, str | None]:
    """The shard's manifest when it describes the shard ``key`` asks for, else ``(None, what is wrong)``."""
    file = manifest_path(path)
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(manifest.get("bytes"), int):
            raise ValueError("not a JSON object with the shard's size")
        if not isinstance(manifest.get("sha256"), str):
            raise ValueError("no checksum")
    except FileNotFoundError:
        return None, f"no manifest ({file.name}): written by an older embforge, or its write was interrupted"
    except (OSError, ValueError) as err:
        return None, f"unreadable manifest {file.name} ({type(err).__name__}: {err})"
    if manifest.get("format") != FORMAT:
        return None, f"manifest {file.name} is of format {manifest.get('format')!r}, not {FORMAT!r}"
    if manifest.get("model") != key.model:
        return None, f"embeddings of another model ({manifest.get('model')!r}, expected {key.model!r})"
    if key.corpus is not None and manifest.get("corpus") != key.corpus:
        return None, (
            f"embeddings of other documents: it does not cover rows {key.first_row} to "
            f"{key.first_row + key.rows - 1} of this corpus (corpus digest differs)"
        )
    if manifest.get("fingerprint") != key.fingerprint:
        return None, "written for another corpus, model, dimension or precision (fingerprint differs)"
    expected = {
        "first_row": key.first_row,
        "rows": key.rows,
        "shape": [key.rows, key.dim],
        "dtype": DTYPE.str,
    }
    for name, value in expected.items():
        if manifest.get(name) != value:
            return None, f"its manifest says {name} {manifest.get(name)!r}, expected {value!r}"
    return manifest, None


def remove_shard(path: Path) -> None:
    """Delete a shard and its manifest (the manifest first: a shard without one is never trusted)."""
    manifest_path(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------- a folder of shards


def unit_rows(emb: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32 (zero rows stay zero)."""
    emb = np.asarray(emb, dtype=np.float32)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


class CorpusEmbeddings:
    """The ``(rows, dim)`` float32 embeddings of an :func:`~embforge.retrieval.corpus_cache.encode_corpus` folder, read a shard at a time.

    ``unit=True`` (see :meth:`normalized`) scales every row read to unit length. Indexing with an array of row
    positions (``emb[rows]``) is :meth:`take`; ``np.asarray(emb)`` reads every shard into one matrix. Every
    shard is checked against its manifest as it is read (``fingerprint``: the folder's; ``model``: the model's
    tag); one that fails raises :class:`ShardError` naming it.
    """

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(
        self,
        folder: str | os.PathLike,
        rows: int,
        dim: int,
        block_size: int,
        *,
        fingerprint: str,
        model: str,
        unit: bool = False,
    ):
        self.folder, self.rows, self.dim, self.block_size, self.unit = (
            Path(folder),
            rows,
            dim,
            block_size,
            unit,
        )
        self.fingerprint, self.model = fingerprint, model
        self._checked: set[int] = (
            set()
        )  # shards whose bytes were checked (take() memory-maps them afterwards)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.dim)

    def __len__(self) -> int:
        return self.rows

    @property
    def num_blocks(self) -> int:
        return -(-self.rows // self.block_size)

    def normalized(self) -> CorpusEmbeddings:
        """The same shards, every row read scaled to unit length."""
        unit = CorpusEmbeddings(
            self.folder,
            self.rows,
            self.dim,
            self.block_size,
            fingerprint=self.fingerprint,
            model=self.model,
            unit=True,
        )
        unit._checked = self._checked
        return unit

    def shard_path(self, number: int) -> Path:
        return shard_path(self.folder, number)

    def shard_key(self, number: int, corpus: str | None = None) -> ShardKey:
        """What shard ``number`` must hold (``corpus``: the digest of its documents, when known)."""
        first = number * self.block_size
        rows = min(self.block_size, self.rows - first)
        return ShardKey(self.fingerprint, self.model, first, rows, self.dim, corpus)

    def block(self, number: int) -> np.ndarray:
        """Shard ``number`` read into memory (rows ``number * block_size`` onwards), checked."""
        try:
            vectors = read_shard(self.shard_path(number), self.shard_key(number))
        except ShardError as err:
            raise ShardError(f"{err}; {RECOMPUTE}") from None
        self._checked.add(number)
        return unit_rows(vectors) if self.unit else vectors

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, vectors)`` of each shard in order; one shard is in memory at a time."""
        for number in range(self.num_blocks):
            yield number * self.block_size, self.block(number)

    def take(self, rows: np.ndarray | Sequence[int]) -> np.ndarray:
        """The vectors of ``rows`` (any shape of int positions): shape ``(*rows.shape, dim)``; only the shards
        holding them are opened (memory-mapped, read where the rows are)."""
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(flat) and (flat.min() < 0 or flat.max() >= self.rows):
            raise IndexError(f"row positions must be in [0, {self.rows}), got {flat.min()}..{flat.max()}")
        out = np.empty((len(flat), self.dim), dtype=np.float32)
        shard = flat // self.block_size
        for number in np.unique(shard).tolist():
            if number not in self._checked:
                self.block(number)  # its bytes are checked once; then it is memory-mapped
            picked = shard == number
            out[picked] = np.load(self.shard_path(number), mmap_mode="r")[
                flat[picked] - number * self.block_size
            ]
        out = unit_rows(out) if self.unit else out
        return out.reshape(*np.shape(rows), self.dim)

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            return self.take(np.arange(self.rows)[key])
        if isinstance(key, (int, np.integer)):
            return self.take([int(key)])[0]
        return self.take(key)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        parts = [vectors for _, vectors in self.blocks()]
        matrix = np.concatenate(parts) if parts else np.empty((0, self.dim), np.float32)
        return matrix if dtype is None else matrix.astype(dtype, copy=False)


Vectors = Union[np.ndarray, CorpusEmbeddings]  # noqa: UP007 (a runtime alias)


def shard_path(folder: Path, number: int) -> Path:
    return folder / SHARDS / f"{number:05d}.npy"
