"""Encode a large corpus into ``.npy`` shards, one per block of rows, resumably; read them back a shard at a time.

Layout of the output folder::

    shards/00000.npy ...  (block_size, dim) float32 each: rows ``k*block_size ...`` of the corpus, in its order
    ids.jsonl             one document id per line (a JSON string), in the rows' order
    progress.json         which blocks are written, and a fingerprint of (ids, texts, model, dim)

The corpus is cut into blocks of ``block_size`` consecutive texts; each block is encoded (the encoder sorts its
texts by token length, so padding stays small), written to its own shard file atomically, and only then recorded
in ``progress.json``. One block's texts are tokenised and one block's vectors are held at a time, and a shard is
written with ``write`` (the page cache), never through a memory map of the whole matrix, so encoding 10M
documents holds a few MB of vectors. If the process is interrupted, calling :func:`encode_corpus` again with the
same inputs skips the recorded blocks; different inputs start afresh.

:class:`CorpusEmbeddings` reads the folder: ``blocks()`` yields one shard at a time (what a FAISS index is built
from, :mod:`embforge.retrieval.search`), ``take(rows)`` gathers rows (re-ranking, positives' scores), and
``np.asarray(embeddings)`` joins every shard into one matrix for small corpora.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from embforge.files import write_bytes_atomic, write_text_atomic
from embforge.modeling.precision import autocast_tag
from embforge.progress import progress_bar, progress_enabled
from embforge.retrieval.index.base import read_ids, write_ids
from embforge.retrieval.sharded import broadcast_from_main, is_main, is_sharded, unwrapped

if TYPE_CHECKING:
    from embforge.protocols import Embedder, HasWeights, TrainableEmbedder
    from embforge.retrieval.sharded import ShardedEncoder

SHARDS = "shards"
PROGRESS = "progress.json"
LEGACY_EMBEDDINGS = "embeddings.npy"  # the one-file layout of earlier versions (re-encoded into shards)
LAYOUT = "shards-v1"


def unit_rows(emb: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as float32 (zero rows stay zero)."""
    emb = np.asarray(emb, dtype=np.float32)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


class CorpusEmbeddings:
    """The ``(rows, dim)`` float32 embeddings of an :func:`encode_corpus` folder, read a shard at a time.

    ``unit=True`` (see :meth:`normalized`) scales every row read to unit length. Indexing with an array of row
    positions (``emb[rows]``) is :meth:`take`; ``np.asarray(emb)`` reads every shard into one matrix.
    """

    dtype = np.dtype(np.float32)
    ndim = 2

    def __init__(
        self, folder: str | os.PathLike, rows: int, dim: int, block_size: int, *, unit: bool = False
    ):
        self.folder, self.rows, self.dim, self.block_size, self.unit = (
            Path(folder),
            rows,
            dim,
            block_size,
            unit,
        )

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
        return CorpusEmbeddings(self.folder, self.rows, self.dim, self.block_size, unit=True)

    def shard_path(self, number: int) -> Path:
        return shard_path(self.folder, number)

    def block(self, number: int) -> np.ndarray:
        """Shard ``number`` read into memory (rows ``number * block_size`` onwards)."""
        vectors = np.load(self.shard_path(number))
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


def fingerprint(ids: Sequence[str], texts: Sequence[str], model_tag: str, dim: int) -> str:
    """A hash of everything that decides the embeddings (autocast included), so a resume never mixes two runs."""
    digest = hashlib.sha256(f"{model_tag}\0{dim}\0{len(ids)}\0{autocast_tag()}".encode())
    for doc_id, text in zip(ids, texts):
        digest.update(doc_id.encode())
        digest.update(b"\0")
        digest.update(text.encode())
        digest.update(b"\1")
    return digest.hexdigest()


def model_fingerprint(model: HasWeights | ShardedEncoder) -> str:
    """A short hash of a model's weights (all parameters, sampled), so cached embeddings follow the weights."""
    model = unwrapped(model)  # a sharded model (retrieval/sharded.py) is its model
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, param in sorted(model.state_dict().items()):
        flat = param.detach().reshape(-1)
        digest.update(name.encode())
        digest.update(flat[:: max(1, flat.numel() // 64)].float().cpu().numpy().tobytes())
    for attr in ("pooling", "normalize", "max_seq_length"):
        digest.update(repr(getattr(model, attr, None)).encode())
    return digest.hexdigest()[:16]


def encode_corpus(
    model: Embedder,
    texts: Sequence[str],
    ids: Sequence[str],
    out_dir: str | os.PathLike,
    *,
    batch_size: int = 64,
    block_size: int = 4096,
    model_tag: str = "",
    prompt_name: str | None = None,
    show_progress: bool = True,
    on_block: Callable[[int], None] | None = None,
) -> Vectors:
    """Embed ``texts`` into shards under ``out_dir`` (resumable) and return them as :class:`CorpusEmbeddings`.

    Args:
        model: an :class:`~embforge.encoder.Encoder` (anything with ``encode`` and ``dim``).
        texts: the documents, aligned with ``ids``.
        ids: document ids (written to ``ids.jsonl``).
        out_dir: the output folder (created).
        batch_size: texts per forward pass.
        block_size: texts per written, resumable block (one shard file each).
        model_tag: identifies the model weights in the fingerprint (e.g. its path and a step number).
        prompt_name: the model prompt to use (e.g. ``"document"``), if any.
        show_progress: show a progress bar over documents (moving per batch; ``--quiet`` overrides it).
        on_block: called with the block number after each block is durably written (tests use it to interrupt).

    Returns:
        ``(n, dim)`` float32 embeddings, row ``i`` for ``ids[i]``: a :class:`CorpusEmbeddings` on the process
        that writes the folder; under torchrun the other ranks hold the matrix in memory (an array).
    """
    _check_corpus(texts, ids)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dim = int(model.dim)
    tag = fingerprint(ids, texts, model_tag or type(unwrapped(model)).__name__, dim)
    shards = CorpusEmbeddings(out, len(texts), dim, block_size)
    # a sharded model (torchrun, retrieval/sharded.py): every rank encodes a share of each block, rank 0 writes
    writer = not is_sharded(model) or is_main()
    found = broadcast_from_main(_done_blocks(out, tag, shards) if writer else None, model)
    resumed = sorted(found or ())
    done = set(resumed)
    matrix = None if writer else np.empty(shards.shape, dtype=np.float32)  # the other ranks keep the vectors
    if writer and found is None:
        _start_afresh(out, ids, tag, shards)
    bar = progress_bar(
        total=len(texts),
        initial=sum(min(block_size, len(texts) - n * block_size) for n in done),
        desc="encode corpus",
        unit="doc",
        enabled=progress_enabled(show_progress) and writer,
    )
    # the bar moves per batch when the model reports batches (Encoder / OnnxEncoder), else per block
    per_batch = {"on_batch": bar.update} if "on_batch" in inspect.signature(model.encode).parameters else {}
    for number in (n for n in range(shards.num_blocks) if n not in done):
        first = number * block_size
        options = {"batch_size": batch_size, "prompt_name": prompt_name, "show_progress": False, **per_batch}
        vectors = np.asarray(
            model.encode(list(texts[first : first + block_size]), **options), dtype=np.float32
        )
        done.add(number)
        if matrix is not None:
            matrix[first : first + len(vectors)] = vectors
        else:
            _write_shard(shards.shard_path(number), vectors)
            _save_progress(out, tag, shards, done)
        if not per_batch:
            bar.update(len(vectors))
        if on_block is not None:
            on_block(number)
    bar.close()
    if resumed and is_sharded(model):  # the blocks rank 0 had already written, for the other ranks
        rows = np.concatenate(
            [np.arange(n * block_size, min((n + 1) * block_size, len(texts))) for n in resumed]
        )
        sent: np.ndarray | None = shards.take(rows) if matrix is None else None
        shared = broadcast_from_main(sent, model)
        if matrix is not None and shared is not None:
            matrix[rows] = shared
    return shards if matrix is None else matrix


def _check_corpus(texts: Sequence[str], ids: Sequence[str]) -> None:
    if len(texts) != len(ids):
        raise ValueError(f"encode_corpus: {len(texts)} texts but {len(ids)} ids")
    if not texts:
        raise ValueError("encode_corpus: the corpus is empty")


def load_encoded(out_dir: str | os.PathLike) -> tuple[list[str], CorpusEmbeddings]:
    """``(ids, embeddings)`` of a finished :func:`encode_corpus` folder."""
    out = Path(out_dir)
    progress = json.loads((out / PROGRESS).read_text())
    if len(progress["done"]) != progress["blocks"]:
        raise ValueError(
            f"{out}: corpus encoding is incomplete ({len(progress['done'])}/{progress['blocks']} blocks); "
            "run the encoding again to resume it"
        )
    return read_ids(out), CorpusEmbeddings(out, progress["rows"], progress["dim"], progress["block_size"])


def write_shards(
    out_dir: str | os.PathLike,
    ids: Sequence[str],
    blocks: Iterator[np.ndarray],
    *,
    block_size: int,
    rows: int,
    dim: int,
) -> CorpusEmbeddings:
    """A complete :func:`encode_corpus` folder from vectors computed elsewhere (``blocks``: ``block_size`` rows
    each, the last one shorter), e.g. a benchmark's random vectors or another tool's embeddings."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = CorpusEmbeddings(out, rows, dim, block_size)
    tag = f"external:{rows}:{dim}"
    _start_afresh(out, ids, tag, shards)
    done: set[int] = set()
    for number, vectors in enumerate(blocks):
        expected = min(block_size, rows - number * block_size)
        if np.shape(vectors) != (expected, dim):
            raise ValueError(
                f"write_shards: block {number} has shape {np.shape(vectors)}, expected {(expected, dim)}"
            )
        _write_shard(shards.shard_path(number), np.asarray(vectors, dtype=np.float32))
        done.add(number)
    _save_progress(out, tag, shards, done)
    if len(done) != shards.num_blocks:
        raise ValueError(f"write_shards: {len(done)} blocks for {rows} rows of {block_size}")
    return shards


def _start_afresh(out: Path, ids: Sequence[str], tag: str, shards: CorpusEmbeddings) -> None:
    """Remove an earlier encoding's shards (another corpus, model or layout) and record an empty one."""
    shutil.rmtree(out / SHARDS, ignore_errors=True)
    (out / LEGACY_EMBEDDINGS).unlink(missing_ok=True)
    (out / SHARDS).mkdir()
    write_ids(out, ids)
    _save_progress(out, tag, shards, set())


def _write_shard(path: Path, vectors: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(vectors, dtype=np.float32))
    write_bytes_atomic(path, buffer.getvalue())


def _done_blocks(out: Path, tag: str, shards: CorpusEmbeddings) -> set[int] | None:
    path = out / PROGRESS
    if not path.exists() or not (out / SHARDS).is_dir():
        return None
    try:
        progress = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    expected = {
        "layout": LAYOUT,
        "fingerprint": tag,
        "block_size": shards.block_size,
        "blocks": shards.num_blocks,
    }
    if any(progress.get(key) != value for key, value in expected.items()):
        return None
    return {n for n in progress.get("done", []) if shards.shard_path(n).exists()}


def _save_progress(out: Path, tag: str, shards: CorpusEmbeddings, done: set[int]) -> None:
    record = {
        "layout": LAYOUT,
        "fingerprint": tag,
        "rows": shards.rows,
        "dim": shards.dim,
        "block_size": shards.block_size,
        "blocks": shards.num_blocks,
        "done": sorted(done),
    }
    write_text_atomic(out / PROGRESS, json.dumps(record) + "\n")


def encode_texts(
    model: TrainableEmbedder, texts: Sequence[str], *, batch_size: int = 32, max_tokens: int | None = None
) -> np.ndarray:
    """``model.encode`` with fixed batches, or — with ``max_tokens`` — length-sorted chunks of at most that many
    padded tokens (faster on CPUs, where short texts then run in bigger batches and long ones in smaller)."""
    if max_tokens is None:
        return np.asarray(
            model.encode(list(texts), batch_size=batch_size, show_progress=False), dtype=np.float32
        )
    import torch

    was_training = model.training
    model.eval()
    ids = model.tokenize_ids(list(texts))
    with torch.inference_mode():
        out = model.embed_ids(ids, max_tokens=max_tokens).float().cpu().numpy()
    model.train(was_training)
    if model.normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out
