"""Candidate search for :mod:`embforge.retrieval.mining`: dense top-k, BM25 top-k (``bm25s``), their hybrid (RRF), and
cross-encoder rescoring of the candidates.

:class:`CorpusSearch` is built once over the corpus (BM25 index, vector index) and asked per block of queries.
Corpus vectors are an array or :class:`~embforge.retrieval.corpus_cache.CorpusEmbeddings` (shards on disk): the
vector index is then trained on a sample and filled a shard at a time, and with ``ivfpq`` / ``pq`` it holds only
codes, the candidates re-ranked exactly with vectors read back from the shards, so the corpus's float matrix is
never in memory; ``exact`` search scans the shards one at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from embforge._optional import require
from embforge.retrieval.corpus_cache import CorpusEmbeddings, Vectors, encode_texts, unit_rows
from embforge.retrieval.index.base import VectorIndex
from embforge.retrieval.index.exact import topk_inner_product
from embforge.retrieval.index.faiss import FaissIndex, codes_index
from embforge.retrieval.index.registry import create_index

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.protocols import TrainableEmbedder

RRF_K = 60
SAMPLE_ROWS = 65_536  # vectors an IVF / PQ quantiser is trained on (FAISS wants >= 39 per IVF list)
ARRAY_BLOCK = 65_536  # rows of an in-memory corpus added to an index at a time
RERANK_ENTRIES = 4_000_000  # floats of candidate vectors gathered at a time for exact re-ranking
CODES_KINDS = ("ivfpq", "pq")
__all__ = ["unit_rows"]


def embed(
    model: TrainableEmbedder, texts: list[str], *, batch_size: int, max_tokens: int | None = None
) -> np.ndarray:
    """L2-normalised embeddings (so inner product is cosine), ``batch_size`` texts (at most ``max_tokens``) a batch."""
    return unit_rows(encode_texts(model, texts, batch_size=batch_size, max_tokens=max_tokens))


def vector_blocks(vectors: Vectors) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, float32 block)`` of corpus vectors: one shard at a time, or slices of an array."""
    if isinstance(vectors, CorpusEmbeddings):
        yield from vectors.blocks()
        return
    for first in range(0, len(vectors), ARRAY_BLOCK):
        yield first, np.ascontiguousarray(vectors[first : first + ARRAY_BLOCK], dtype=np.float32)


def sample_vectors(vectors: Vectors, size: int | None = None, *, seed: int = 0) -> np.ndarray:
    """``size`` rows (default :data:`SAMPLE_ROWS`) drawn without replacement (all rows of a smaller corpus), in
    position order."""
    size = SAMPLE_ROWS if size is None else size
    if size >= len(vectors):
        return np.ascontiguousarray(np.asarray(vectors), dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size=size, replace=False))
    return np.ascontiguousarray(vectors[rows], dtype=np.float32)


class DenseSearch:
    """Top-``depth`` corpus positions per query by inner product, over an index built once (see the module)."""

    def __init__(self, vectors: Vectors, index: str) -> None:
        self.vectors, self.kind = vectors, index
        self.codes: Any = None
        self.index: VectorIndex | None = None
        if index == "exact":
            return
        dim = int(vectors.shape[1])
        if index in CODES_KINDS:
            self.codes, self.refine = codes_index(index, dim, sample_vectors(vectors), total=len(vectors))
            for _, block in vector_blocks(vectors):
                self.codes.add(block)
            return
        self.index = create_index(index, dim)
        if isinstance(self.index, FaissIndex) and index == "ivf":
            self.index.train(sample_vectors(vectors), total=len(vectors))
        for first, block in vector_blocks(vectors):
            self.index.add([str(i) for i in range(first, first + len(block))], block)

    def search(self, q: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions (q, depth), scores)`` best first, -1 / -inf where an ANN index found fewer."""
        if self.codes is not None:
            return self._codes_search(q, depth)
        if self.index is not None:
            return self._index_search(q, depth)
        if not isinstance(self.vectors, CorpusEmbeddings):
            scores, positions = topk_inner_product(q, self.vectors, depth)
            return positions, scores.astype(np.float64)
        best_pos = np.empty((len(q), 0), dtype=np.int64)
        best = np.empty((len(q), 0), dtype=np.float32)
        for first, block in vector_blocks(self.vectors):  # one shard at a time; ties keep the lower position
            scores, positions = topk_inner_product(q, block, depth)
            best_pos = np.concatenate([best_pos, positions + first], axis=1)
            best = np.concatenate([best, scores], axis=1)
            keep = np.argsort(-best, axis=1, kind="stable")[:, :depth]
            best_pos, best = np.take_along_axis(best_pos, keep, 1), np.take_along_axis(best, keep, 1)
        return best_pos, best.astype(np.float64)

    def _codes_search(self, q: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidates from the codes, re-ranked by exact inner products with the stored vectors."""
        depth = min(depth, len(self.vectors))
        _, found = self.codes.search(q, min(len(self.vectors), int(depth * self.refine)))
        positions = np.full((len(q), depth), -1, dtype=np.int64)
        scores = np.full((len(q), depth), -np.inf)
        step = max(1, RERANK_ENTRIES // max(1, found.shape[1] * q.shape[1]))
        for start in range(0, len(q), step):
            cand = found[start : start + step]
            exact = np.einsum("qd,qkd->qk", q[start : start + step], self.vectors[np.maximum(cand, 0)])
            exact = np.where(cand >= 0, exact, -np.inf)
            order = np.argsort(-exact, axis=1, kind="stable")[:, :depth]
            top = np.take_along_axis(exact, order, 1)
            positions[start : start + step] = np.where(
                np.isfinite(top), np.take_along_axis(cand, order, 1), -1
            )
            scores[start : start + step] = top
        return positions, scores

    def _index_search(self, q: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.index is not None
        found_scores, found_ids = self.index.search(q, depth)
        positions = np.full((len(q), depth), -1, dtype=np.int64)
        scores = np.full((len(q), depth), -np.inf)
        for row, ids in enumerate(found_ids):
            positions[row, : len(ids)] = [int(i) for i in ids]
            scores[row, : len(ids)] = found_scores[row, : len(ids)]
        return positions, scores


def dense_candidates(q: np.ndarray, d: Vectors, depth: int, index: str) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, scores)`` of the top ``depth`` documents per query (positions -1 where an ANN found fewer)."""
    return DenseSearch(d, index).search(q, depth)


class BM25:
    """A ``bm25s`` index over a corpus (English stop words, lower-cased), for top-k and per-document scores."""

    def __init__(self, corpus: list[str]) -> None:
        self.bm25s = require("bm25s")
        tokens = self.bm25s.tokenize(corpus, stopwords="en", show_progress=False)
        self.retriever = self.bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)
        self.n_docs = len(corpus)

    def query_tokens(self, queries: list[str]) -> list[list[str]]:
        tokens = self.bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        return [t if t else [""] for t in tokens]

    def search(self, queries: list[str], depth: int) -> tuple[np.ndarray, np.ndarray]:
        """``(positions (q, depth), scores)`` best first."""
        depth = min(depth, self.n_docs)
        positions, scores = self.retriever.retrieve(self.query_tokens(queries), k=depth, show_progress=False)
        return np.asarray(positions, dtype=np.int64), np.asarray(scores, dtype=np.float64)

    def scores_of(self, queries: list[str], pos_q: np.ndarray, pos_d: np.ndarray) -> np.ndarray:
        """BM25 score of document ``pos_d[i]`` for query ``pos_q[i]``."""
        tokens = self.query_tokens(queries)
        out = np.empty(len(pos_q), dtype=np.float64)
        for qi in np.unique(pos_q):
            rows = np.flatnonzero(pos_q == qi)
            out[rows] = self.retriever.get_scores(tokens[qi])[pos_d[rows]]
        return out


class CorpusSearch:
    """The corpus side of mining, built once and asked per block of queries: a BM25 index (``bm25``, ``hybrid``)
    and a :class:`DenseSearch` over the corpus vectors (``dense``, ``hybrid``)."""

    def __init__(self, method: str, corpus: list[str], vectors: Vectors | None, index: str) -> None:
        self.method, self.corpus, self.vectors, self.n_docs = method, corpus, vectors, len(corpus)
        self.bm25 = BM25(corpus) if method != "dense" else None
        self.dense = DenseSearch(vectors, index) if method != "bm25" and vectors is not None else None

    def candidates(
        self, queries: list[str], q: np.ndarray | None, depth: int, pos_q: np.ndarray, pos_d: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(positions, scores, positive scores)`` of a block of queries (``q``: their unit embeddings)
        whose known positives are the pairs ``(pos_q[i], pos_d[i])``.

        BM25 ranks and scores by BM25; dense by cosine; hybrid fuses the two rankings (:func:`fuse`) and scores
        by cosine."""
        if self.method == "bm25":
            assert self.bm25 is not None
            positions, scores = self.bm25.search(queries, depth)
            return positions, scores, self.bm25.scores_of(queries, pos_q, pos_d)
        assert self.dense is not None and self.vectors is not None and q is not None
        positions, scores = self.dense.search(q, depth)
        pos_scores = np.einsum("ij,ij->i", q[pos_q], self.vectors[pos_d])
        if self.bm25 is not None:
            bm25_positions, _ = self.bm25.search(queries, depth)
            positions, scores = fuse(positions, bm25_positions, q, self.vectors, self.n_docs)
        return positions, scores, pos_scores


def fuse(
    dense_pos: np.ndarray, bm25_pos: np.ndarray, q: np.ndarray, d: Vectors, n_docs: int
) -> tuple[np.ndarray, np.ndarray]:
    """Union of dense and BM25 top-``depth``, ordered by reciprocal-rank fusion; scores are dense cosines.

    Returns ``(positions (q, width), cosine scores)`` padded with -1 / -inf, ``width <= 2 * depth``.
    """
    n_q, depth = dense_pos.shape
    ranks = np.arange(depth, dtype=np.float64)
    cand = np.concatenate([dense_pos, bm25_pos[:, :depth]], axis=1)
    rank = np.concatenate(
        [
            np.broadcast_to(ranks, dense_pos.shape),
            np.broadcast_to(ranks[: bm25_pos.shape[1]], bm25_pos.shape),
        ],
        1,
    )
    rows = np.broadcast_to(np.arange(n_q)[:, None], cand.shape)
    ok = cand >= 0
    keys, inverse = np.unique(rows[ok] * n_docs + cand[ok], return_inverse=True)
    fused = np.bincount(inverse, weights=1.0 / (RRF_K + 1 + rank[ok]), minlength=len(keys))
    key_q, key_d = keys // n_docs, keys % n_docs
    order = np.lexsort((key_d, -fused, key_q))
    key_q, key_d = key_q[order], key_d[order]
    counts = np.bincount(key_q, minlength=n_q)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    col = np.arange(len(key_q)) - starts[key_q]
    width = int(counts.max()) if len(counts) else 0
    positions = np.full((n_q, width), -1, dtype=np.int64)
    positions[key_q, col] = key_d
    scores = np.full((n_q, width), -np.inf)
    scores[key_q, col] = np.einsum("ij,ij->i", q[key_q], d[key_d])
    return positions, scores


def rescore(
    rescorer: CrossEncoder,
    queries: list[str],
    corpus: list[str],
    cand: np.ndarray,
    valid: np.ndarray,
    pos_q: np.ndarray,
    pos_d: np.ndarray,
    *,
    depth: int,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cross-encoder scores of the first ``depth`` valid candidates of each query and of every known positive.

    Each distinct ``(query, document)`` text pair is scored once, with the model's activation (sigmoid for a
    one-label model). Returns ``(positions (q, depth), scores, valid, positive scores)``: the kept candidates
    re-ranked by the cross-encoder, best first, padded with -1 / -inf / False where a query had fewer.
    """
    if rescorer.num_labels != 1:
        raise ValueError(
            f"mining: the rescoring cross-encoder must output one score, this one has {rescorer.num_labels} labels"
        )
    keep = np.argsort(~valid, axis=1, kind="stable")[:, :depth]
    cand = np.take_along_axis(cand, keep, axis=1)
    valid = np.take_along_axis(valid, keep, axis=1)
    rows, cols = np.nonzero(valid)
    pairs = [(queries[q], corpus[d]) for q, d in zip(rows.tolist(), cand[rows, cols].tolist())]
    pos_pairs = [(queries[q], corpus[d]) for q, d in zip(pos_q.tolist(), pos_d.tolist())]
    unique = list(dict.fromkeys([*pairs, *pos_pairs]))
    score_of = dict(zip(unique, rescorer.predict(unique, batch_size=batch_size).tolist()))
    scores = np.full(cand.shape, -np.inf)
    scores[rows, cols] = [score_of[p] for p in pairs]
    order = np.argsort(-scores, axis=1, kind="stable")
    cand, valid = np.take_along_axis(cand, order, axis=1), np.take_along_axis(valid, order, axis=1)
    cand[~valid] = -1
    pos_scores = np.array([score_of[p] for p in pos_pairs], dtype=np.float64)
    return cand, np.take_along_axis(scores, order, axis=1), valid, pos_scores
