"""Encode a large corpus into ``.npy`` shards, one per block of rows, resumably; read them back a shard at a time.

Layout of the output folder::

    shards/00000.npy ...  (block_size, dim) float32 each: rows ``k*block_size ...`` of the corpus, in its order
    shards/00000.json ... each shard's manifest: model, corpus digest, rows, shape, dtype, size and checksum
    ids.jsonl             one document id per line (a JSON string), in the rows' order
    progress.json         which blocks are written, and a fingerprint of (ids, texts, model, dim)

The corpus is cut into blocks of ``block_size`` consecutive texts; each block is encoded (the encoder sorts its
texts by token length, so padding stays small), written to its own shard file atomically with its manifest
(:mod:`embforge.retrieval.checked_shards`), and only then recorded in ``progress.json``. One block's texts are
tokenised and one block's vectors are held at a time, and a shard is written with ``write`` (the page cache),
never through a memory map of the whole matrix, so encoding 10M documents holds a few MB of vectors. If the
process is interrupted, calling :func:`encode_corpus` again with the same inputs skips the recorded blocks;
different inputs start afresh.

Shards are checked, never trusted blindly. This is a cache, so :func:`encode_corpus` (which has the model) treats
a recorded shard that fails its check — damaged bytes, another corpus's shard copied in, rows missing, an empty
file, NaN rows, no manifest (an older embforge's cache) — as a miss: a :class:`CacheWarning` names the file and
what is wrong, and the block is encoded again; refusing would only make the user delete the folder by hand to
get the same result. Vectors that are not finite are refused on write (a ``ValueError`` naming the shard, the row
and its id): a model that gives NaN would give it again. A reader without the model (:func:`load_encoded`)
cannot recompute, so :class:`CorpusEmbeddings` raises :class:`ShardError` (a ``ValueError`` whose message starts
with the shard file) when a shard fails its check as it is read.

:class:`CorpusEmbeddings` reads the folder: ``blocks()`` yields one shard at a time (what a FAISS index is built
from, :mod:`embforge.retrieval.search`), ``take(rows)`` gathers rows (re-ranking, positives' scores), and
``np.asarray(embeddings)`` joins every shard into one matrix for small corpora.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embforge.files import write_text_atomic
from embforge.modeling.encoding import reports_batches
from embforge.modeling.precision import autocast_tag
from embforge.progress import progress_bar, progress_enabled
from embforge.retrieval.checked_shards import (
    RECOMPUTE,
    SHARDS,
    CacheWarning,
    CorpusEmbeddings,
    ShardError,
    Vectors,
    check_finite,
    corpus_digest,
    remove_shard,
    shard_problem,
    unit_rows,
    write_shard,
)
from embforge.retrieval.index.base import read_ids, write_ids
from embforge.retrieval.sharded import broadcast_from_main, is_main, is_sharded, unwrapped

if TYPE_CHECKING:
    from embforge.protocols import Embedder, HasWeights, TrainableEmbedder
    from embforge.retrieval.sharded import ShardedEncoder

__all__ = [  # the shards' reader lives in checked_shards; its users import it from here too
    "CacheWarning",
    "CorpusEmbeddings",
    "ShardError",
    "Vectors",
    "encode_corpus",
    "encode_texts",
    "fingerprint",
    "load_encoded",
    "model_fingerprint",
    "unit_rows",
    "write_shards",
]

PROGRESS = "progress.json"
LEGACY_EMBEDDINGS = "embeddings.npy"  # the one-file layout of earlier versions (re-encoded into shards)
LAYOUT = "shards-v2"  # v2: a checked manifest per shard (v1 folders are encoded again)


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
    show_progress: bool | None = True,
    announce: Callable[[int, int], str] | None = None,
    on_block: Callable[[int], None] | None = None,
) -> Vectors:
    """Embed ``texts`` into shards under ``out_dir`` (resumable) and return them as :class:`CorpusEmbeddings`;
    a damaged or stale shard found there is discarded with a :class:`CacheWarning` naming it and encoded again.

    Args:
        model: an :class:`~embforge.encoder.Encoder` (anything with ``encode`` and ``dim``).
        texts: the documents, aligned with ``ids``.
        ids: document ids (written to ``ids.jsonl``).
        out_dir: the output folder (created).
        batch_size: texts per forward pass.
        block_size: texts per written, resumable block (one shard file each).
        model_tag: identifies the model weights in the fingerprint (e.g. its path and a step number).
        prompt_name: the model prompt to use (e.g. ``"document"``), if any.
        show_progress: show a progress bar over documents (moving per batch; ``--quiet`` overrides it);
            ``None``: the command's setting (:func:`embforge.progress.progress_enabled`).
        announce: ``(documents left, total) -> line`` for stderr before encoding starts, even with no bar (then
            a line per shard): a long phase of a quiet run says what it does.
        on_block: called with the block number after each block is durably written (tests use it to interrupt).

    Returns:
        ``(n, dim)`` float32 embeddings, row ``i`` for ``ids[i]``: a :class:`CorpusEmbeddings` on the process
        that writes the folder; under torchrun the other ranks hold the matrix in memory (an array).

    Raises:
        ShardError: When the model gives a vector that is not finite (naming the shard, the row and its id).
    """
    _check_corpus(texts, ids)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dim, name = int(model.dim), model_tag or type(unwrapped(model)).__name__
    tag = fingerprint(ids, texts, name, dim)
    shards = CorpusEmbeddings(out, len(texts), dim, block_size, fingerprint=tag, model=name)
    # a sharded model (torchrun, retrieval/sharded.py): every rank encodes a share of each block, rank 0 writes
    writer = not is_sharded(model) or is_main()
    found = broadcast_from_main(_done_blocks(shards, ids, texts) if writer else None, model)
    resumed = sorted(found or ())
    done = set(resumed)
    matrix = None if writer else np.empty(shards.shape, dtype=np.float32)  # the other ranks keep the vectors
    if writer and found is None:
        _start_afresh(out, ids, shards)
    cached = _rows_of(shards, done)
    if announce is not None and writer and cached < len(texts):
        print(announce(len(texts) - cached, len(texts)), file=sys.stderr, flush=True)
    bar = progress_bar(
        total=len(texts),
        initial=cached,
        desc="encode corpus",
        unit="doc",
        enabled=progress_enabled(show_progress, steps=-(-len(texts) // batch_size)) and writer,
    )
    # the bar moves per batch when the model reports batches (Encoder / OnnxEncoder), else per block
    per_batch = {"on_batch": bar.update} if reports_batches(model) else {}
    options = {"batch_size": batch_size, "prompt_name": prompt_name, "show_progress": False, **per_batch}
    for number in (n for n in range(shards.num_blocks) if n not in done):
        first, rows = number * block_size, shards.shard_key(number).rows
        vectors = np.asarray(model.encode(list(texts[first : first + rows]), **options), dtype=np.float32)
        _keep(shards, number, vectors, ids, texts, done, matrix)
        if not per_batch:
            bar.update(len(vectors))
        if announce is not None and bar.disable and writer:  # no bar: a line per shard
            print(f"{out}: {_rows_of(shards, done)}/{len(texts)} embedded", file=sys.stderr, flush=True)
        if on_block is not None:
            on_block(number)
    bar.close()
    if resumed and is_sharded(model):  # the blocks rank 0 had already written, for the other ranks
        _share_resumed(shards, resumed, matrix, model)
    return shards if matrix is None else matrix


def _keep(
    shards: CorpusEmbeddings,
    number: int,
    vectors: np.ndarray,
    ids: Sequence[str],
    texts: Sequence[str],
    done: set[int],
    matrix: np.ndarray | None,
) -> None:
    """Block ``number``'s vectors, refused when not finite (on every rank: all of them stop), then written with
    its manifest and recorded in ``done`` and the progress file (the writer) or kept in ``matrix`` (other ranks)."""
    first = number * shards.block_size
    check_finite(shards.shard_path(number), vectors, ids, first)
    done.add(number)
    if matrix is not None:
        matrix[first : first + len(vectors)] = vectors
        return
    digest = corpus_digest(ids[first : first + len(vectors)], texts[first : first + len(vectors)])
    write_shard(shards.shard_path(number), vectors, shards.shard_key(number, digest), ids)
    _save_progress(shards, done)


def _rows_of(shards: CorpusEmbeddings, blocks: set[int]) -> int:
    return sum(shards.shard_key(n).rows for n in blocks)


def _share_resumed(
    shards: CorpusEmbeddings, resumed: list[int], matrix: np.ndarray | None, model: object
) -> None:
    """Rank 0 sends the vectors of the blocks it had written before (``resumed``) to the other ranks' ``matrix``."""
    rows = np.concatenate(
        [np.arange(n * shards.block_size, min((n + 1) * shards.block_size, shards.rows)) for n in resumed]
    )
    sent: np.ndarray | None = shards.take(rows) if matrix is None else None
    shared = broadcast_from_main(sent, model)
    if matrix is not None and shared is not None:
        matrix[rows] = shared


def _check_corpus(texts: Sequence[str], ids: Sequence[str]) -> None:
    if len(texts) != len(ids):
        raise ValueError(f"encode_corpus: {len(texts)} texts but {len(ids)} ids")
    if not texts:
        raise ValueError("encode_corpus: the corpus is empty")


def load_encoded(out_dir: str | os.PathLike) -> tuple[list[str], CorpusEmbeddings]:
    """``(ids, embeddings)`` of a finished :func:`encode_corpus` folder (each shard checked as it is read)."""
    out = Path(out_dir)
    progress = json.loads((out / PROGRESS).read_text())
    if progress.get("layout") != LAYOUT:
        raise ShardError(
            f"{out / PROGRESS}: a corpus cache written by an older embforge (no shard manifests): its shards "
            f"cannot be checked; {RECOMPUTE}"
        )
    if len(progress["done"]) != progress["blocks"]:
        raise ValueError(
            f"{out}: corpus encoding is incomplete ({len(progress['done'])}/{progress['blocks']} blocks); "
            "run the encoding again to resume it"
        )
    embeddings = CorpusEmbeddings(
        out,
        progress["rows"],
        progress["dim"],
        progress["block_size"],
        fingerprint=progress["fingerprint"],
        model=progress["model"],
    )
    return read_ids(out), embeddings


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
    tag = f"external:{rows}:{dim}"
    shards = CorpusEmbeddings(out, rows, dim, block_size, fingerprint=tag, model=tag)
    _start_afresh(out, ids, shards)
    done: set[int] = set()
    for number, vectors in enumerate(blocks):
        expected = min(block_size, rows - number * block_size)
        if np.shape(vectors) != (expected, dim):
            raise ValueError(
                f"write_shards: block {number} has shape {np.shape(vectors)}, expected {(expected, dim)}"
            )
        key = shards.shard_key(number)
        digest = corpus_digest(ids[key.first_row : key.first_row + key.rows], [""] * key.rows)
        write_shard(shards.shard_path(number), np.asarray(vectors), shards.shard_key(number, digest), ids)
        done.add(number)
    _save_progress(shards, done)
    if len(done) != shards.num_blocks:
        raise ValueError(f"write_shards: {len(done)} blocks for {rows} rows of {block_size}")
    return shards


def _start_afresh(out: Path, ids: Sequence[str], shards: CorpusEmbeddings) -> None:
    """Remove an earlier encoding's shards (another corpus, model or layout) and record an empty one."""
    shutil.rmtree(out / SHARDS, ignore_errors=True)
    (out / LEGACY_EMBEDDINGS).unlink(missing_ok=True)
    (out / SHARDS).mkdir()
    write_ids(out, ids)
    _save_progress(shards, set())


def _done_blocks(shards: CorpusEmbeddings, ids: Sequence[str], texts: Sequence[str]) -> set[int] | None:
    """The recorded blocks whose shards pass their checks (a :class:`CacheWarning` for each one that does not),
    or ``None`` when the folder holds no encoding of this corpus by this model (start afresh)."""
    out = shards.folder
    path = out / PROGRESS
    if (out / LEGACY_EMBEDDINGS).exists() and not path.exists():
        _stale(out / LEGACY_EMBEDDINGS, "an older embforge's one-file layout, without checksums")
        return None
    if not path.exists() or not (out / SHARDS).is_dir():
        return None
    try:
        progress = json.loads(path.read_text())
        if not isinstance(progress, dict):
            raise ValueError("not a JSON object")
    except (ValueError, OSError) as err:
        _stale(path, f"unreadable ({type(err).__name__}: {err})")
        return None
    if progress.get("layout") != LAYOUT:
        _stale(path, "written by an older embforge, without shard manifests: its shards cannot be checked")
        return None
    expected = {
        "fingerprint": shards.fingerprint,
        "block_size": shards.block_size,
        "blocks": shards.num_blocks,
    }
    if any(progress.get(key) != value for key, value in expected.items()):
        return None  # another corpus, model or block size: replaced, as any cache entry is
    done = set()
    for number in progress.get("done", []):
        key = shards.shard_key(number)
        digest = corpus_digest(
            ids[key.first_row : key.first_row + key.rows], texts[key.first_row : key.first_row + key.rows]
        )
        problem = shard_problem(shards.shard_path(number), shards.shard_key(number, digest))
        if problem is None:
            done.add(number)
        else:
            _stale(shards.shard_path(number), problem)
            remove_shard(shards.shard_path(number))
    if len(done) < len(progress.get("done", [])):
        _save_progress(shards, done)  # the discarded shards are no longer recorded
    return done


def _stale(path: Path, problem: str) -> None:
    warnings.warn(
        f"{path}: {problem}; discarded from the corpus cache, its documents are encoded again",
        CacheWarning,
        stacklevel=4,
    )


def _save_progress(shards: CorpusEmbeddings, done: set[int]) -> None:
    record = {
        "layout": LAYOUT,
        "fingerprint": shards.fingerprint,
        "model": shards.model,
        "rows": shards.rows,
        "dim": shards.dim,
        "block_size": shards.block_size,
        "blocks": shards.num_blocks,
        "done": sorted(done),
    }
    write_text_atomic(shards.folder / PROGRESS, json.dumps(record) + "\n")


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
