"""Teacher signals, computed once: scores for pair/triplet/mined files and cached embeddings for ``mse_distill``.

- :func:`score_rows` / :func:`write_scored` (``embforge score``): a teacher (cross-encoder or bi-encoder) scores
  each row — one ``score`` per pair file row, a list ``score: [T(q,p), T(q,n_1), …]`` per triplet or mined row —
  so ``margin_mse`` and ``kl_distill`` read them as labels. A cross-encoder gives raw logits (no activation), a
  bi-encoder the cosine.
- :func:`teacher_embeddings` embeds texts with the teacher into an on-disk cache keyed by a hash of the teacher's
  weights and the texts: a second run reads it, a different teacher or other texts get their own entry. It is the
  corpus cache (:mod:`embforge.retrieval.corpus_cache`: one mechanism, two users), written in checked shards of
  :data:`TEACHER_BLOCK` texts as they are computed, so a run killed midway resumes where it stopped, and a damaged
  shard is computed again.
- :func:`with_teacher_embeddings` turns a data set into an ``mse_distill`` task's data (its ``score`` column
  holds each row's teacher embeddings).

A student whose dimension differs from the teacher's gets a projection first (:mod:`embforge.distill.projection`).

Example:
    >>> teacher = Encoder.load("models/all-mpnet-base-v2")  # doctest: +SKIP
    >>> data = with_teacher_embeddings(read_table("sentences.txt"), teacher, cache_dir="runs/teacher-cache")  # doctest: +SKIP
    >>> from embforge.distill.projection import add_projection
    >>> add_projection(student, teacher.dim)  # doctest: +SKIP
    >>> train(student, [Task("distill", data, get_loss("mse_distill"))], TrainConfig())  # doctest: +SKIP
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embforge.cross_encoder import CrossEncoder
from embforge.data.tables import Dataset
from embforge.kinds import is_pair_scorer
from embforge.retrieval.corpus_cache import encode_corpus, model_fingerprint

if TYPE_CHECKING:
    from embforge.encoder import Encoder

# texts per cached shard: a killed run loses at most this many (about a minute of the general recipe's teacher)
TEACHER_BLOCK = 512


def teacher_tag(teacher: Encoder | CrossEncoder) -> str:
    """What identifies a teacher's outputs: its class, a hash of its weights, pooling and normalisation."""
    return f"{type(teacher).__name__}:{model_fingerprint(teacher)}"


def teacher_embeddings(
    teacher: Encoder,
    texts: Sequence[str],
    *,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 32,
    show_progress: bool = True,
) -> np.ndarray:
    """``(len(texts), teacher.dim)`` float32 embeddings, read from / written to ``cache_dir`` when given.

    Each (teacher weights, texts) pair gets its own sub-folder ``cache_dir/<key>`` (an
    :func:`~embforge.retrieval.corpus_cache.encode_corpus` folder of shards of :data:`TEACHER_BLOCK` texts, each
    written as soon as it is computed): an interrupted run resumes after its last written shard, and a complete
    entry is read from its shards, not recomputed.

    Embedding tens of thousands of texts takes many minutes, so with a cache this phase says what it does even in a
    quiet run: a line on stderr (how many texts, which teacher, which cache), then a progress bar unless the whole
    command is quiet (``--quiet``; then a line per shard). ``show_progress=False`` (a run's ``quiet = true``)
    silences per-step output, not this.
    """
    texts = list(texts)
    if cache_dir is None:
        return np.asarray(
            teacher.encode(texts, batch_size=batch_size, show_progress=show_progress), dtype=np.float32
        )
    tag = teacher_tag(teacher)
    folder = Path(cache_dir) / _cache_key(tag, texts)
    name = getattr(teacher, "name_or_path", None) or tag

    def announce(left: int, total: int) -> str:
        cached = f"; {total - left} of {total} already cached" if left < total else ""
        return f"embedding {left} texts with the teacher {name} (cache {folder}{cached}) ..."

    return np.asarray(
        encode_corpus(
            teacher,
            texts,
            [str(i) for i in range(len(texts))],
            folder,
            batch_size=batch_size,
            block_size=TEACHER_BLOCK,
            model_tag=tag,
            show_progress=True if show_progress else None,  # None: the command's setting (--quiet or not)
            announce=announce,
        )
    )


def _cache_key(tag: str, texts: Sequence[str]) -> str:
    digest = hashlib.sha256(tag.encode())
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def with_teacher_embeddings(
    data: Dataset,
    teacher: Encoder,
    *,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 32,
    show_progress: bool = True,
) -> Dataset:
    """A copy of ``data`` whose ``score`` column holds each row's teacher embeddings (for ``mse_distill``).

    One text column gives ``(dim,)`` per row; several give ``(columns, dim)`` (one target per column). Each
    distinct text is embedded once. An existing ``score``/``label`` column is an error (it would be replaced).
    """
    if data.label_column is not None:
        raise ValueError(
            f"{data.path}: has a {data.label_column!r} column; mse_distill's labels are the teacher's embeddings"
        )
    columns = data.text_columns
    if not columns:
        raise ValueError(f"{data.path}: no text column to embed")
    unique = sorted({t for c in columns for t in data.columns[c]})
    matrix = teacher_embeddings(
        teacher, unique, cache_dir=cache_dir, batch_size=batch_size, show_progress=show_progress
    )
    where = {t: i for i, t in enumerate(unique)}
    rows = np.stack([np.asarray(matrix[[where[t] for t in data.columns[c]]]) for c in columns], axis=1)
    labels = list(rows[:, 0] if len(columns) == 1 else rows)
    return replace(data, columns={**data.columns, "score": labels})


def score_rows(
    teacher: Encoder | CrossEncoder,
    data: Dataset,
    *,
    batch_size: int = 32,
    show_progress: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> list[float] | list[list[float]]:
    """Teacher scores: ``T(a, b)`` per pair row, ``[T(q, c) for c in candidates]`` per row of 3+ text columns.

    ``teacher`` is a :class:`~embforge.cross_encoder.CrossEncoder` (raw logits) or an
    :class:`~embforge.encoder.Encoder` (cosine similarity); a bi-encoder's embeddings of the rows' texts are
    cached in ``cache_dir`` when given (:func:`teacher_embeddings`: resumable).
    """
    columns = data.text_columns
    if len(columns) < 2:
        raise ValueError(f"{data.path}: scoring needs two or more text columns, found {columns}")
    first = data.columns[columns[0]]
    others = [data.columns[c] for c in columns[1:]]
    if is_pair_scorer(teacher):  # pair scores (the kind the teacher declares)
        pairs = [(q, c) for col in others for q, c in zip(first, col)]
        flat = np.asarray(
            teacher.predict(pairs, batch_size=batch_size, activation=False, show_progress=show_progress),
            dtype=np.float64,
        )
        if flat.ndim != 1:
            raise ValueError("the cross-encoder teacher must have one label (num_labels=1)")
        scores = flat.reshape(len(others), len(first)).T
    else:
        unique = sorted({*first, *(t for col in others for t in col)})
        emb = teacher_embeddings(
            teacher, unique, cache_dir=cache_dir, batch_size=batch_size, show_progress=show_progress
        )
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        where = {t: i for i, t in enumerate(unique)}
        q = emb[[where[t] for t in first]]
        scores = np.stack([(q * emb[[where[t] for t in col]]).sum(1) for col in others], axis=1)
    if len(others) == 1:
        return [float(s) for s in scores[:, 0]]
    return [[float(s) for s in row] for row in scores]


def write_scored(
    data: Dataset,
    scores: list[float] | list[list[float]],
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``data``'s text columns plus ``score`` to ``path`` (``.jsonl``, or ``.csv``/``.tsv`` for pair scores).

    An existing ``score``/``label`` column is kept unless ``overwrite`` (then it is replaced by the teacher's).
    """
    if data.label_column is not None and not overwrite:
        raise ValueError(
            f"{data.path}: already has a {data.label_column!r} column; pass --overwrite to replace it with "
            "the teacher's scores"
        )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    columns = data.text_columns
    listed = bool(scores) and isinstance(scores[0], list)
    if out.suffix in (".csv", ".tsv"):
        if listed:
            raise ValueError(
                f"{out}: rows with several candidates get a list of scores; write .jsonl instead"
            )
        delimiter = "\t" if out.suffix == ".tsv" else ","
        with out.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter=delimiter)
            writer.writerow([*columns, "score"])
            for r, score in enumerate(scores):
                writer.writerow([*(data.columns[c][r] for c in columns), repr(score)])
        return out
    with out.open("w", encoding="utf-8") as handle:
        for r, score in enumerate(scores):
            row: dict[str, object] = {c: data.columns[c][r] for c in columns}
            row["score"] = score
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return out
