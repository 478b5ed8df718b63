"""Vector indexes: exact numpy search, FAISS flat/HNSW/IVF/IVF-PQ/fast-scan PQ, save/load, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from embforge.retrieval.index.exact import NumpyIndex
from embforge.retrieval.index.registry import create_index, load_index

pytest.importorskip("faiss")


def _unit(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def corpus():
    vectors = _unit(2000, 16, 0)
    ids = [f"doc{i}" for i in range(len(vectors))]
    queries = _unit(50, 16, 1)
    return ids, vectors, queries


def test_numpy_index_is_exact(corpus):
    ids, vectors, queries = corpus
    index = NumpyIndex(16)
    index.add(ids[:700], vectors[:700])
    index.add(ids[700:], vectors[700:])  # two adds concatenate
    scores, found = index.search(queries, 10)
    sims = queries @ vectors.T
    expected = np.argsort(-sims, axis=1, kind="stable")[:, :10]
    assert found == [[ids[p] for p in row] for row in expected]
    np.testing.assert_allclose(scores, np.take_along_axis(sims, expected, axis=1), rtol=1e-5)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq", "pq"])
def test_faiss_kinds_recall_and_roundtrip(corpus, tmp_path, kind):
    ids, vectors, queries = corpus
    exact = NumpyIndex(16)
    exact.add(ids, vectors)
    _, truth = exact.search(queries, 10)
    # nlist is capped at 2000 // 39 = 51, so nprobe=51 probes every list: only PQ's quantisation is approximate
    options = {"ivf": {"nprobe": 51}, "ivfpq": {"nprobe": 51, "pq_m": 8, "pq_bits": 6, "refine": 10}}.get(
        kind, {}
    )
    index = create_index(kind, 16, **options)
    index.add(ids, vectors)
    scores, found = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)])
    assert recall >= (1.0 if kind in ("flat", "ivf") else 0.9), recall
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # best first
    index.save(tmp_path / kind)
    again = load_index(tmp_path / kind)
    assert len(again) == len(ids)
    assert again.search(queries, 10)[1] == found


def test_numpy_index_roundtrip(corpus, tmp_path):
    ids, vectors, queries = corpus
    index = create_index("exact", 16)
    index.add(ids, vectors)
    index.save(tmp_path / "exact")
    assert load_index(tmp_path / "exact").search(queries, 5)[1] == index.search(queries, 5)[1]


def test_k_larger_than_index_and_empty_index():
    index = NumpyIndex(4)
    assert index.search(np.ones((2, 4), np.float32), 3)[1] == [[], []]
    index.add(["a", "b"], np.eye(4, dtype=np.float32)[:2])
    scores, found = index.search(np.ones((1, 4), np.float32), 10)
    assert scores.shape == (1, 2) and found == [["a", "b"]]  # tie broken by insertion order


@pytest.mark.parametrize("kind", ["exact", "flat"])
def test_bad_input_messages(kind):
    index = create_index(kind, 4)
    with pytest.raises(ValueError, match=r"shape \(n, 4\)"):
        index.add(["a"], np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="2 ids for 1 vectors"):
        index.add(["a", "b"], np.ones((1, 4), np.float32))
    index.add(["a"], np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match="'a' is already in the index"):
        index.add(["a"], np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"shape \(q, 4\)"):
        index.search(np.ones((1, 5), np.float32), 1)


def test_unknown_kind_and_option():
    with pytest.raises(ValueError, match="choose one of exact, flat, hnsw"):
        create_index("annoy", 4)
    with pytest.raises(ValueError, match=r"unknown option.*efsearch.*known: m, ef_construction, ef_search"):
        create_index("hnsw", 4, efsearch=10)


def test_search_options_change_the_trade_off(corpus):
    ids, vectors, queries = corpus
    exact = NumpyIndex(16)
    exact.add(ids, vectors)
    _, truth = exact.search(queries, 10)
    index = create_index("pq", 16, pq_m=4, refine=1)  # coarse codes, no re-ranking depth
    index.add(ids, vectors)

    def recall() -> float:
        found = index.search(queries, 10)[1]
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))

    shallow = recall()
    index.set_search_options(refine=50)
    assert recall() > shallow
    assert recall() >= 0.99  # 500 of 2,000 re-ranked exactly
    with pytest.raises(ValueError, match="pq index has no search option 'nprobe'"):
        index.set_search_options(nprobe=4)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_tiled_exact_top_k_breaks_ties_by_position_across_tiles(monkeypatch, k):
    from embforge.retrieval.index import exact as numpy_index

    monkeypatch.setattr(numpy_index, "_CHUNK_ENTRIES", 64)  # 7 queries x blocks of 9 vectors: many tiles
    rng = np.random.default_rng(3)
    vectors = rng.integers(-2, 3, size=(100, 4)).astype(np.float32)  # few distinct scores: ties everywhere
    queries = rng.integers(-2, 3, size=(7, 4)).astype(np.float32)
    scores, positions = numpy_index.topk_inner_product(queries, vectors, k)
    sims = queries @ vectors.T
    expected = np.lexsort((np.broadcast_to(np.arange(100), sims.shape), -sims), axis=1)[:, :k]
    np.testing.assert_array_equal(positions, expected)
    np.testing.assert_array_equal(scores, np.take_along_axis(sims, expected, axis=1))
