"""Encode a large corpus to a memory-mapped ``.npy`` file, in length-sorted blocks, resumably.

Layout of the output folder::

    embeddings.npy   (n, dim) float32, written in place through a memory map
    ids.jsonl        one document id per line (a JSON string), in the rows' order
    progress.json    which blocks are written, and a fingerprint of (ids, texts, model, dim)

Documents are ordered by length (characters, a cheap proxy for tokens) and cut into blocks of ``block_size``
texts; each block is encoded (the encoder again sorts by token length inside it), written at the rows of its
documents, flushed, and only then recorded in ``progress.json``. Only one block's texts are tokenised and only
one batch's tensors live at a time, so 100k+ documents need little memory. If the process is interrupted, calling
:func:`encode_corpus` again with the same inputs skips the recorded blocks; different inputs start afresh.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge.files import write_text_atomic
from embforge.modeling.precision import autocast_tag
from embforge.progress import progress_bar, progress_enabled
from embforge.retrieval.index.base import read_ids, write_ids
from embforge.retrieval.sharded import broadcast_from_main, is_main, is_sharded, share_rows, unwrapped

if TYPE_CHECKING:
    from embforge.protocols import Embedder, HasWeights, TrainableEmbedder
    from embforge.retrieval.sharded import ShardedEncoder

EMBEDDINGS = "embeddings.npy"
PROGRESS = "progress.json"


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
) -> np.ndarray:
    """Embed ``texts`` into ``out_dir/embeddings.npy`` (resumable) and return it as a read-only memory map.

    Args:
        model: an :class:`~embforge.encoder.Encoder` (anything with ``encode`` and ``dim``).
        texts: the documents, aligned with ``ids``.
        ids: document ids (written to ``ids.jsonl``).
        out_dir: the output folder (created).
        batch_size: texts per forward pass.
        block_size: texts per written, resumable block.
        model_tag: identifies the model weights in the fingerprint (e.g. its path and a step number).
        prompt_name: the model prompt to use (e.g. ``"document"``), if any.
        show_progress: show a progress bar over documents (moving per batch; ``--quiet`` overrides it).
        on_block: called with the block number after each block is durably written (tests use it to interrupt).

    Returns:
        ``(n, dim)`` float32 memory map, row ``i`` for ``ids[i]``.
    """
    if len(texts) != len(ids):
        raise ValueError(f"encode_corpus: {len(texts)} texts but {len(ids)} ids")
    if not texts:
        raise ValueError("encode_corpus: the corpus is empty")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dim = int(model.dim)
    tag = fingerprint(ids, texts, model_tag or type(unwrapped(model)).__name__, dim)
    order = np.argsort(-np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), kind="stable")
    blocks = [order[i : i + block_size] for i in range(0, len(order), block_size)]
    # a sharded model (torchrun, retrieval/sharded.py): every rank encodes a share of each block, rank 0 writes
    writer = not is_sharded(model) or is_main()
    done = broadcast_from_main(_done_blocks(out, tag, len(blocks), block_size) if writer else None, model)
    resumed = sorted(done or ())
    emb_path = out / EMBEDDINGS
    if not writer:  # the other ranks keep the vectors in memory
        matrix: Any = np.empty((len(texts), dim), dtype=np.float32)  # or a memmap (flushed) below
        done = set(resumed)
    elif done is None:
        done = set()
        matrix = np.lib.format.open_memmap(emb_path, mode="w+", dtype=np.float32, shape=(len(texts), dim))
        write_ids(out, ids)
        _save_progress(out, tag, block_size, len(blocks), done)
    else:
        matrix = np.load(emb_path, mmap_mode="r+")
    remaining = sum(len(b) for n, b in enumerate(blocks) if n not in done)
    bar = progress_bar(
        total=len(texts),
        initial=len(texts) - remaining,
        desc="encode corpus",
        unit="doc",
        enabled=progress_enabled(show_progress) and writer,
    )
    # the bar moves per batch when the model reports batches (Encoder / OnnxEncoder), else per block
    per_batch = {"on_batch": bar.update} if "on_batch" in inspect.signature(model.encode).parameters else {}
    for number, rows in enumerate(blocks):
        if number in done:
            continue
        block_texts = [texts[i] for i in rows]
        matrix[np.sort(rows)] = model.encode(
            [block_texts[j] for j in np.argsort(rows)],
            batch_size=batch_size,
            prompt_name=prompt_name,
            show_progress=False,
            **per_batch,
        )
        done.add(number)
        if writer:
            matrix.flush()
            _save_progress(out, tag, block_size, len(blocks), done)
        if not per_batch:
            bar.update(len(rows))
        if on_block is not None:
            on_block(number)
    bar.close()
    if resumed and is_sharded(model):  # the blocks rank 0 had already written, for the other ranks
        share_rows(matrix, np.sort(np.concatenate([blocks[n] for n in resumed])), model)
    if not writer:
        return matrix
    del matrix
    return np.load(emb_path, mmap_mode="r")


def load_encoded(out_dir: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """``(ids, embeddings memmap)`` of a finished :func:`encode_corpus` folder."""
    out = Path(out_dir)
    progress = json.loads((out / PROGRESS).read_text())
    if len(progress["done"]) != progress["blocks"]:
        raise ValueError(
            f"{out}: corpus encoding is incomplete ({len(progress['done'])}/{progress['blocks']} blocks); "
            "run the encoding again to resume it"
        )
    return read_ids(out), np.load(out / EMBEDDINGS, mmap_mode="r")


def _done_blocks(out: Path, tag: str, blocks: int, block_size: int) -> set[int] | None:
    path = out / PROGRESS
    if not path.exists() or not (out / EMBEDDINGS).exists():
        return None
    try:
        progress = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    if progress.get("fingerprint") != tag or progress.get("block_size") != block_size:
        return None
    if progress.get("blocks") != blocks:
        return None
    return set(progress.get("done", []))


def _save_progress(out: Path, tag: str, block_size: int, blocks: int, done: set[int]) -> None:
    record = {"fingerprint": tag, "block_size": block_size, "blocks": blocks, "done": sorted(done)}
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
