"""Mining and evaluation at corpus size: embeddings in shards, the index built from them, queries in blocks.

The property: the bytes numpy allocates while mining (``tracemalloc`` counts them; FAISS's own C++ memory, the
compact codes, is not in it) stay flat when the corpus grows, and far below its float matrix. Counts, not timings.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from embforge.retrieval import search
from embforge.retrieval.corpus_cache import CorpusEmbeddings, load_encoded, write_shards
from embforge.retrieval.mining import MiningConfig, mine_positions

DIM, BLOCK, QUERIES = 32, 2048, 256


def random_shards(folder: Path, rows: int, seed: int = 0) -> CorpusEmbeddings:
    """``rows`` random unit vectors written as an encode_corpus folder, one block at a time."""
    rng = np.random.default_rng(seed)
    blocks = (
        rng.standard_normal((min(BLOCK, rows - first), DIM)).astype(np.float32)
        for first in range(0, rows, BLOCK)
    )
    ids = [str(i) for i in range(rows)]
    return write_shards(folder, ids, blocks, block_size=BLOCK, rows=rows, dim=DIM).normalized()


def queries_near(emb: CorpusEmbeddings, seed: int = 1) -> tuple[np.ndarray, list[list[int]]]:
    """Queries close to one known positive each (the positive plus noise)."""
    rng = np.random.default_rng(seed)
    positives = rng.choice(len(emb), size=QUERIES, replace=False)
    q = emb.take(positives) + 0.3 * rng.standard_normal((QUERIES, DIM)).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True), [[int(p)] for p in positives]


def traced_peak(emb: CorpusEmbeddings, index: str, **config: int) -> tuple[int, np.ndarray]:
    """Peak bytes traced while mining ``QUERIES`` queries over ``emb``, and the negatives."""
    q, positives = queries_near(emb)
    corpus = [""] * len(emb)  # dense mining reads only the corpus's length
    texts = [""] * QUERIES
    tracemalloc.start()
    try:
        mined = mine_positions(
            texts,
            positives,
            corpus,
            MiningConfig(index=index, num_negatives=3, **config),
            query_emb=q,
            doc_emb=emb,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, mined.negatives


@pytest.mark.parametrize("index", ["exact", "ivfpq"])
def test_mining_memory_is_flat_in_the_corpus_size(tmp_path, monkeypatch, index):
    monkeypatch.setattr(
        search, "SAMPLE_ROWS", 10_000
    )  # the quantiser's training sample: fixed, as at 10M rows
    small = random_shards(tmp_path / "small", 20_000)
    large = random_shards(tmp_path / "large", 80_000)
    traced_peak(
        small, index
    )  # the first run imports (FAISS, the index modules): their objects are traced too
    small_peak, _ = traced_peak(small, index)
    large_peak, negatives = traced_peak(large, index)
    matrix = 80_000 * DIM * 4
    # what is held: one shard's scores for the block of queries (256 x 2,048 floats), the quantiser's sample,
    # the candidates; none of it grows with the corpus
    assert large_peak < matrix / 3, (large_peak, matrix)  # well below the float matrix (10 MB)
    assert large_peak < 1.25 * small_peak, (small_peak, large_peak)  # 4x the corpus, about the same bytes
    assert (negatives >= 0).all()


def test_shards_give_the_negatives_of_the_array_and_blocks_of_queries_those_of_one(tmp_path):
    emb = random_shards(tmp_path / "c", 9_000)  # 5 shards, the last one short
    q, positives = queries_near(emb)
    corpus, texts = [""] * len(emb), [""] * QUERIES

    def negatives(doc_emb, **config) -> np.ndarray:
        mining = MiningConfig(num_negatives=4, **config)
        return mine_positions(texts, positives, corpus, mining, query_emb=q, doc_emb=doc_emb).negatives

    whole = negatives(np.asarray(emb))
    assert np.array_equal(negatives(emb), whole)
    assert np.array_equal(negatives(emb, query_block=50), whole)  # 6 blocks of queries, the last one short
    assert not np.isin(whole, np.asarray(positives)).any(axis=1).all()  # some query's positive is elsewhere…
    assert not (whole == np.asarray(positives)).any()  # …and never among its own negatives


def test_shards_read_back_by_block_row_and_whole(tmp_path):
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((5_000, DIM)).astype(np.float32)
    blocks = (matrix[i : i + BLOCK] for i in range(0, 5_000, BLOCK))
    emb = write_shards(
        tmp_path / "c", [f"d{i}" for i in range(5_000)], blocks, block_size=BLOCK, rows=5_000, dim=DIM
    )
    ids, loaded = load_encoded(tmp_path / "c")
    assert ids[4_999] == "d4999" and loaded.shape == (5_000, DIM) and len(list(loaded.blocks())) == 3
    assert np.array_equal(np.asarray(loaded), matrix)
    rows = np.array([[4_999, 0], [2_048, 2_047]])
    assert np.array_equal(emb[rows], matrix[rows])
    assert np.allclose(emb.normalized()[[7]], matrix[[7]] / np.linalg.norm(matrix[7]))
    with pytest.raises(IndexError, match=r"\[0, 5000\)"):
        emb.take([5_000])
    with pytest.raises(ValueError, match="block 1 has shape"):
        write_shards(
            tmp_path / "bad", ["a"] * 10, iter([matrix[:4], matrix[:5]]), block_size=4, rows=10, dim=DIM
        )
