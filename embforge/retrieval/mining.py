"""Hard-negative mining: BM25 (``bm25s``), dense (an embedding model + a vector index) or hybrid, with filters.

For each query the miner ranks corpus candidates, then removes, in this order (all vectorised over queries):

1. **known positives** — every document judged relevant for the query is never a negative (nor is a corpus
   entry whose text equals a positive in pairs mode, where documents are texts);
   then, with a ``rescorer`` (a one-label :class:`~embforge.cross_encoder.CrossEncoder`), the first
   ``rescore_depth`` remaining candidates of each query and every known positive are scored by the cross-encoder
   (with its activation: sigmoid scores in (0, 1)), the candidates are re-ranked by that score and the filters
   below use it instead of the retriever's — a cross-encoder is a far better judge of an unlabelled positive;
2. **relative margin** ``m`` — candidates scoring above ``s⁺ − |s⁺|·m`` (``(1 − m)·s⁺`` for positive scores)
   where ``s⁺`` is the query's lowest positive score: near-duplicates of a positive are likely unlabelled positives;
3. **absolute margin** ``a`` — candidates scoring above ``s⁺ − a``; **max_score** — candidates above a score;
4. **skip_top** ``r`` — the first ``r`` surviving candidates are skipped.

Without a rescorer, margins use the dense cosine score for ``dense`` and ``hybrid`` mining and the BM25 score
for ``bm25``. Then
``round(hard_ratio · n)`` negatives are taken from the survivors (the best ones, or a random sample with
``sampling="random"``) and the rest drawn uniformly from the whole corpus (never a known positive). This matches
sentence-transformers' ``mine_hard_negatives`` (``range_min`` = ``skip_top``, ``range_max`` = ``depth``) when
``hard_ratio=1`` and ``sampling="top"``. A row that cannot get ``n`` negatives is dropped and counted.

Example:
    >>> from embforge.retrieval.mining import MiningConfig, mine
    >>> rows = mine(model, data, MiningConfig(method="dense", num_negatives=3,
    ...                                       relative_margin=0.05))  # doctest: +SKIP
    >>> write_jsonl(rows, "triplets.jsonl")  # doctest: +SKIP
    >>> from embforge.cross_encoder import CrossEncoder
    >>> reranker = CrossEncoder.load("my-reranker")  # doctest: +SKIP
    >>> rows = mine(model, data, MiningConfig(method="bm25", relative_margin=0.1, rescore_depth=50),
    ...             rescorer=reranker)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from embforge._optional import require
from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset
from embforge.retrieval.corpus_cache import (
    CorpusEmbeddings,
    Vectors,
    encode_corpus,
    model_fingerprint,
    unit_rows,
)
from embforge.retrieval.mined_rows import mined_rows, mining_queries
from embforge.retrieval.negatives import filtered, pick_hard, random_negatives
from embforge.retrieval.search import CorpusSearch, embed, rescore

if TYPE_CHECKING:
    from embforge.cross_encoder import CrossEncoder
    from embforge.protocols import TrainableEmbedder

METHODS = ("dense", "bm25", "hybrid")


@dataclass
class MiningConfig:
    """How to mine. ``depth=None`` means ``skip_top + 10·num_negatives + max positives`` with a margin or max_score
    filter, else ``skip_top + num_negatives + max positives`` (sentence-transformers' rule), and at least
    ``rescore_depth`` when a cross-encoder rescores the top ``rescore_depth`` candidates of each query."""

    method: str = "dense"
    num_negatives: int = 3
    depth: int | None = None
    skip_top: int = 0
    relative_margin: float | None = None
    absolute_margin: float | None = None
    max_score: float | None = None
    hard_ratio: float = 1.0
    sampling: str = "top"
    index: str = "exact"
    batch_size: int = 32
    max_tokens: int | None = None
    rescore_depth: int = 30
    seed: int = 0
    query_block: int = 4096
    stats: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown mining method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.sampling not in ("top", "random"):
            raise ValueError(f"sampling must be 'top' or 'random', got {self.sampling!r}")
        if self.num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {self.num_negatives}")
        if self.skip_top < 0:
            raise ValueError(f"skip_top must be >= 0, got {self.skip_top}")
        if self.query_block < 1:
            raise ValueError(f"query_block must be >= 1, got {self.query_block}")
        if self.rescore_depth < 1:
            raise ValueError(f"rescore_depth must be >= 1, got {self.rescore_depth}")
        if not 0.0 <= self.hard_ratio <= 1.0:
            raise ValueError(f"hard_ratio must be between 0 and 1, got {self.hard_ratio}")
        if self.relative_margin is not None and not 0.0 <= self.relative_margin < 1.0:
            raise ValueError(f"relative_margin must be in [0, 1), got {self.relative_margin}")

    @property
    def num_hard(self) -> int:
        return round(self.hard_ratio * self.num_negatives)


@dataclass
class Mined:
    """Negatives per query: ``negatives (q, n)`` corpus positions (-1 where none), their scores (the rescorer's
    for every negative when one was given; else the retriever's, NaN for random negatives), the positives' scores
    (in the order of the queries' positives), and stats."""

    negatives: np.ndarray
    scores: np.ndarray
    positive_scores: np.ndarray
    stats: dict[str, int]


def mine_positions(
    query_texts: list[str],
    positives: list[list[int]],
    corpus: list[str],
    config: MiningConfig,
    *,
    model: TrainableEmbedder | None = None,
    query_emb: np.ndarray | None = None,
    doc_emb: Vectors | None = None,
    rescorer: CrossEncoder | None = None,
) -> Mined:
    """Mine negatives for queries whose known positives are corpus positions; the array-level core.

    The corpus side (BM25 index, vector index) is built once; the queries are then mined ``config.query_block``
    at a time, so the candidate arrays (and the query embeddings computed here) never grow with the number of
    queries; block ``b`` draws its random choices from ``config.seed + b``.

    Args:
        query_texts: the queries.
        positives: for each query, the corpus positions of its known positives (at least one each).
        corpus: the documents.
        config: mining settings.
        model: the embedding model (dense/hybrid), unless ``query_emb``/``doc_emb`` are given.
        query_emb: precomputed query embeddings.
        doc_emb: precomputed document embeddings: an array, or the shards of an
            :func:`~embforge.retrieval.corpus_cache.encode_corpus` folder (read a shard at a time).
        rescorer: a one-label cross-encoder that re-scores and re-ranks the first ``config.rescore_depth``
            candidates of each query and scores the positives; the filters then use its scores.
    """
    n_q = len(query_texts)
    if len(positives) != n_q or any(not p for p in positives):
        raise ValueError("mining: every query needs at least one known positive")
    dense = config.method != "bm25"
    if dense and (query_emb is None or doc_emb is None) and model is None:
        raise ValueError(f"{config.method} mining needs a model or precomputed embeddings")
    if dense and doc_emb is None:
        assert model is not None  # checked above
        doc_emb = embed(model, corpus, batch_size=config.batch_size, max_tokens=config.max_tokens)
    search = CorpusSearch(config.method, corpus, _float32(doc_emb), config.index)
    depth = _depth(config, positives, len(corpus), rescored=rescorer is not None)
    parts = []
    for number, start in enumerate(range(0, n_q, config.query_block)):
        end = start + config.query_block
        q = None
        if dense and query_emb is None:
            assert model is not None  # checked above
            q = embed(
                model, query_texts[start:end], batch_size=config.batch_size, max_tokens=config.max_tokens
            )
        elif dense and query_emb is not None:
            q = np.ascontiguousarray(query_emb[start:end], dtype=np.float32)
        block = _Block(query_texts[start:end], positives[start:end], q, config.seed + number)
        parts.append(_mine_block(search, block, config, depth, rescorer))
    stats: dict[str, int] = {}
    for part in parts:
        stats.update({k: stats.get(k, 0) + v for k, v in part.stats.items()})
    return Mined(
        negatives=np.concatenate([p.negatives for p in parts]),
        scores=np.concatenate([p.scores for p in parts]),
        positive_scores=np.concatenate([p.positive_scores for p in parts]),
        stats=stats,
    )


@dataclass
class _Block:
    """One block of queries being mined: texts, known positives, unit embeddings (dense), random seed."""

    texts: list[str]
    positives: list[list[int]]
    q: np.ndarray | None
    seed: int


def _float32(vectors: Vectors | None) -> Vectors | None:
    """Corpus vectors as float32: shards are read as they are, an array is made contiguous once."""
    if vectors is None or isinstance(vectors, CorpusEmbeddings):
        return vectors
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _depth(config: MiningConfig, positives: list[list[int]], n_docs: int, *, rescored: bool) -> int:
    """Candidates retrieved per query (see :class:`MiningConfig`), plus room for the known positives."""
    max_pos = max(len(p) for p in positives)
    depth = config.depth
    if depth is None:
        filtering = config.relative_margin is not None or config.absolute_margin is not None
        filtering = filtering or config.max_score is not None
        depth = config.skip_top + config.num_hard * (10 if filtering else 1) + max_pos
        depth = max(depth, config.rescore_depth) if rescored else depth
    return min(depth + max_pos, n_docs)


def _mine_block(
    search: CorpusSearch, block: _Block, config: MiningConfig, depth: int, rescorer: CrossEncoder | None
) -> Mined:
    """Candidates, known-positive removal, rescoring, filters and the chosen negatives of one block of queries."""
    n_q, n_docs = len(block.texts), search.n_docs
    pos_q = np.repeat(np.arange(n_q), [len(p) for p in block.positives])
    pos_d = np.concatenate([np.asarray(p, dtype=np.int64) for p in block.positives])
    pos_keys = np.unique(pos_q * n_docs + pos_d)  # (query, doc) keys, sorted for np.isin
    cand, scores, pos_scores = search.candidates(block.texts, block.q, depth, pos_q, pos_d)
    stats: dict[str, int] = {"candidates": int(np.count_nonzero(cand >= 0))}
    valid = cand >= 0
    is_pos = np.isin(np.arange(n_q)[:, None] * n_docs + cand, pos_keys) & valid
    stats["skipped_positive"] = int(is_pos.sum())
    valid &= ~is_pos
    if rescorer is not None:  # from here on the scores are the cross-encoder's
        cand, scores, valid, pos_scores = rescore(
            rescorer, block.texts, search.corpus, cand, valid, pos_q, pos_d,
            depth=config.rescore_depth, batch_size=config.batch_size,
        )  # fmt: skip
        stats["rescored"] = int(valid.sum())
    ref = np.full(n_q, np.inf, dtype=np.float64)
    np.minimum.at(ref, pos_q, pos_scores.astype(np.float64))
    valid &= ~filtered(
        scores,
        valid,
        ref[:, None],
        stats,
        relative_margin=config.relative_margin,
        absolute_margin=config.absolute_margin,
        max_score=config.max_score,
    )
    hard = pick_hard(
        valid, config.num_hard, skip_top=config.skip_top, sampling=config.sampling, seed=block.seed
    )
    negatives = np.take_along_axis(cand, np.maximum(hard, 0), axis=1)
    neg_scores = np.take_along_axis(scores, np.maximum(hard, 0), axis=1).astype(np.float32)
    negatives[hard < 0] = -1
    neg_scores[hard < 0] = -np.inf
    n_random = config.num_negatives - config.num_hard
    if n_random:
        rand = random_negatives(negatives, pos_keys, n_docs, n_random, block.seed)
        negatives = np.concatenate([negatives, rand], axis=1)
        neg_scores = np.concatenate(
            [neg_scores, _random_scores(rand, block, search, rescorer, config)], axis=1
        )
    stats["queries_short"] = int(np.any(negatives < 0, axis=1).sum())
    return Mined(negatives, neg_scores, pos_scores.astype(np.float32), stats)


def _random_scores(
    rand: np.ndarray, block: _Block, search: CorpusSearch, rescorer: CrossEncoder | None, config: MiningConfig
) -> np.ndarray:
    """NaN for random negatives, or the rescorer's scores, so that every mined row carries a complete teacher
    signal."""
    scores = np.full(rand.shape, np.nan, np.float32)
    if rescorer is None:
        return scores
    rows, cols = np.nonzero(rand >= 0)
    pairs = [(block.texts[q], search.corpus[d]) for q, d in zip(rows.tolist(), rand[rows, cols].tolist())]
    if pairs:
        scores[rows, cols] = rescorer.predict(pairs, batch_size=config.batch_size)
    return scores


def _cached_corpus(
    model: TrainableEmbedder, docs: list[str], ids: list[str], config: MiningConfig, folder: str | os.PathLike
) -> Vectors:
    """Unit-length corpus embeddings from (or written to) ``folder``, fingerprinted by weights and texts: the shards
    themselves (read a shard at a time), or under torchrun on ranks other than 0 the matrix in memory."""
    tag = model_fingerprint(model)
    emb = encode_corpus(model, docs, ids, folder, batch_size=config.batch_size, model_tag=tag)
    return emb.normalized() if isinstance(emb, CorpusEmbeddings) else unit_rows(emb)


def mine(
    model: TrainableEmbedder | None,
    data: RetrievalData | Dataset,
    config: MiningConfig,
    *,
    corpus: list[str] | None = None,
    query_emb: np.ndarray | None = None,
    doc_emb: Vectors | None = None,
    rescorer: CrossEncoder | None = None,
    corpus_cache: str | os.PathLike | None = None,
) -> Dataset:
    """Mine negatives and return ``anchor, positive, negative_1..n`` rows (one per relevant query-document pair).

    Args:
        model: the embedding model (ignored for ``bm25``).
        data: a :class:`RetrievalData` (ids + qrels: every judged-relevant document is a known positive) or an
            ``anchor, positive`` :class:`Dataset` (pairs mode: documents are texts; all positives of the same
            anchor text are known positives; the corpus is ``corpus`` plus the positives, de-duplicated).
        config: mining settings; ``config.stats`` is filled with filter counts.
        corpus: extra documents for pairs mode.
        query_emb: precomputed embeddings of the unique queries (in first-appearance order), if any.
        doc_emb: precomputed embeddings of the corpus (in pairs mode: ``corpus`` then new positives), if any.
        rescorer: optional cross-encoder (one label, e.g. a trained reranker): the first ``config.rescore_depth``
            retrieved candidates of each query (known positives already removed) and the query's positives are
            scored by it, the candidates re-ranked by its scores, and the margin / max_score / skip_top filters
            applied to its scores instead of the retriever's, so that likely false negatives are judged by the
            better model. Cost: about ``rescore_depth + positives`` cross-encoder pairs per query.
        corpus_cache: a folder for the corpus embeddings (dense and hybrid methods): written on the first call
            (resumable, in shards: :func:`embforge.retrieval.corpus_cache.encode_corpus`) and reused, without
            encoding, by later calls with the same model weights and documents — e.g. to try other filters. The
            vector index is then built from the shards (:mod:`embforge.retrieval.search`): with
            ``config.index`` ``ivfpq`` or ``pq`` the corpus's float matrix is never in memory.
    """
    docs, doc_ids, query_texts, positives = mining_queries(data, corpus)
    if not query_texts:
        raise ValueError("mining: no query has a relevant document")
    if corpus_cache is not None and doc_emb is None and config.method != "bm25":
        if model is None:
            raise ValueError(f"mining with method={config.method!r} and a corpus cache needs a model")
        doc_emb = _cached_corpus(model, docs, doc_ids, config, corpus_cache)
    mined = mine_positions(
        query_texts, positives, docs, config, model=model, query_emb=query_emb, doc_emb=doc_emb,
        rescorer=rescorer,
    )  # fmt: skip
    rows, dropped = mined_rows(
        mined.negatives, mined.scores, mined.positive_scores, query_texts, positives, docs,
        scored=rescorer is not None,
    )  # fmt: skip
    config.stats = {**mined.stats, "rows": len(rows), "rows_dropped": dropped}
    return rows


def write_jsonl(data: Dataset, path: str | os.PathLike) -> Path:
    """Write rows as JSONL: the dataset's text columns (``anchor, positive, negative_1..n``) and its score or label
    column if it has one (a rescored mining's ``score`` lists)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = data.text_columns + ([data.label_column] if data.label_column else [])
    with out.open("w", encoding="utf-8") as handle:
        for r in range(len(data)):
            handle.write(json.dumps({c: data.columns[c][r] for c in names}, ensure_ascii=False) + "\n")
    return out


def bm25_available() -> bool:
    """Whether ``bm25s`` can be imported (BM25 and hybrid mining need it)."""
    try:
        require("bm25s")
    except ImportError:
        return False
    return True
