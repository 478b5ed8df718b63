"""Hard-negative mining: filters, known positives, hard:random ratio, parity with sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embforge.data.retrieval import RetrievalData
from embforge.data.tables import Dataset
from embforge.retrieval.mining import MiningConfig, mine, mine_positions, write_jsonl
from tests.conftest import make_cross_encoder

pytest.importorskip("bm25s")

DOCS = [
    "a man plays the guitar in the park",
    "a woman sings a song",
    "the stock market rises",
    "oil price falls",
    "a child reads a book",
    "a dog runs in the park",
    "a red car drives on the road",
    "the sun in the sky",
    "rain on the river",
    "a cat eats food",
    "a man plays the guitar in the park",  # d10: an unlabelled exact duplicate of d0, the positive of q0
    "a plane is taking off",
]


def _data(docs: list[str] = DOCS) -> RetrievalData:
    ids = [f"d{i}" for i in range(len(docs))]
    return RetrievalData(
        ids,
        list(docs),
        ["q0", "q1"],
        [DOCS[0], "money in the bank and the stock market"],  # q0 is its positive's text: cosine 1 for both
        {"q0": {"d0": 1}, "q1": {"d2": 1, "d3": 0}},
    )


@pytest.mark.parametrize("method", ["dense", "bm25", "hybrid"])
def test_relative_margin_drops_a_duplicate_of_the_positive(tiny_encoder, method):
    data = _data()
    plain = mine(tiny_encoder, data, MiningConfig(method=method, num_negatives=2, depth=11))
    assert plain.columns["anchor"][0] == DOCS[0] and plain.columns["positive"][0] == DOCS[0]
    # the duplicate scores exactly like the positive (the best possible score), so the unfiltered miner ranks it
    # first among the non-positives and emits it
    assert plain.columns["negative_1"][0] == DOCS[10]
    config = MiningConfig(method=method, num_negatives=2, depth=11, relative_margin=0.05)
    filtered = mine(tiny_encoder, data, config)
    rows = [r for r in range(len(filtered)) if filtered.columns["anchor"][r] == DOCS[0]]
    assert rows, config.stats
    assert DOCS[10] not in {filtered.columns[f"negative_{j}"][r] for j in (1, 2) for r in rows}
    assert config.stats["skipped_relative_margin"] >= 1


def test_positions_core_skip_top_and_margins():
    # 1 query, corpus scores are exactly the first coordinate: 0.9 (positive), 0.88, 0.7, 0.5, 0.3, 0.1
    values = np.array([0.9, 0.88, 0.7, 0.5, 0.3, 0.1])
    d = np.stack([values, np.sqrt(1 - values**2)], axis=1).astype(np.float32)
    q = np.array([[1.0, 0.0]], np.float32)
    corpus = [f"t{i}" for i in range(6)]

    def negs(**kw):
        config = MiningConfig(num_negatives=2, depth=5, **kw)
        return mine_positions(["q"], [[0]], corpus, config, query_emb=q, doc_emb=d).negatives[0].tolist()

    assert negs() == [1, 2]
    assert negs(skip_top=1) == [2, 3]
    assert negs(relative_margin=0.05) == [2, 3]  # 0.88 > 0.95 * 0.9 = 0.855
    assert negs(absolute_margin=0.25) == [3, 4]  # keep scores <= 0.65
    assert negs(max_score=0.6) == [3, 4]
    assert negs(absolute_margin=0.25, skip_top=2) == [5, -1]  # not enough left: -1


def test_hard_random_ratio_and_jsonl(tiny_encoder, tmp_path):
    config = MiningConfig(num_negatives=4, hard_ratio=0.5, depth=6, seed=3)
    rows = mine(tiny_encoder, _data(DOCS[:10]), config)  # no duplicate texts here
    assert len(rows) == 2 and rows.text_columns[-1] == "negative_4"
    for r in range(len(rows)):
        negatives = [rows.columns[f"negative_{j}"][r] for j in range(1, 5)]
        assert len(set(negatives)) == 4  # random ones never repeat a hard one
    path = write_jsonl(rows, tmp_path / "mined.jsonl")
    first = path.read_text().splitlines()[0]
    assert first.startswith('{"anchor": ') and '"negative_4": ' in first


def test_pairs_mode_groups_positives_of_the_same_anchor(tiny_encoder):
    pairs = Dataset(
        "pairs.csv",
        {"anchor": ["cat food", "cat food", "the sky"], "positive": ["a cat eats food", DOCS[0], DOCS[7]]},
        [2, 3, 4],
    )
    rows = mine(tiny_encoder, pairs, MiningConfig(num_negatives=3), corpus=DOCS)
    for r in range(len(rows)):
        negatives = {rows.columns[f"negative_{j}"][r] for j in (1, 2, 3)}
        if rows.columns["anchor"][r] == "cat food":
            assert not negatives & {"a cat eats food", DOCS[0]}


def test_bad_config():
    with pytest.raises(ValueError, match="choose one of dense, bm25, hybrid"):
        MiningConfig(method="splade")
    with pytest.raises(ValueError, match="hard_ratio must be between 0 and 1"):
        MiningConfig(hard_ratio=1.5)
    with pytest.raises(ValueError, match="needs at least one known positive"):
        mine_positions(["q"], [[]], ["a"], MiningConfig(), query_emb=np.ones((1, 2)), doc_emb=np.ones((1, 2)))


words = st.sampled_from(
    [
        "cat",
        "dog",
        "man",
        "woman",
        "guitar",
        "piano",
        "park",
        "road",
        "river",
        "sky",
        "sun",
        "rain",
        "book",
        "song",
    ]
)
texts = st.lists(words, min_size=1, max_size=6).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    corpus=st.lists(texts, min_size=4, max_size=25),
    queries=st.lists(texts, min_size=1, max_size=5),
    seed=st.integers(0, 10_000),
    method=st.sampled_from(["dense", "bm25", "hybrid"]),
    hard_ratio=st.sampled_from([0.0, 0.5, 1.0]),
    sampling=st.sampled_from(["top", "random"]),
)
def test_no_known_positive_is_ever_a_negative(corpus, queries, seed, method, hard_ratio, sampling):
    rng = np.random.default_rng(seed)
    positives = [
        sorted(rng.choice(len(corpus), size=rng.integers(1, 4), replace=False).tolist()) for _ in queries
    ]
    q = rng.standard_normal((len(queries), 8)).astype(np.float32)
    d = rng.standard_normal((len(corpus), 8)).astype(np.float32)
    config = MiningConfig(method=method, num_negatives=3, hard_ratio=hard_ratio, sampling=sampling, seed=seed)
    mined = mine_positions(queries, positives, corpus, config, query_emb=q, doc_emb=d)
    for row, pos in zip(mined.negatives, positives):
        chosen = [int(x) for x in row if x >= 0]
        assert not set(chosen) & set(pos)
        assert len(chosen) == len(set(chosen))
        # with enough non-positive documents every slot is filled
        if len(corpus) - len(pos) >= 3 + 8 and method != "bm25":
            assert len(chosen) == 3


def test_same_negatives_as_sentence_transformers(tiny_model_dir):
    st_module = pytest.importorskip("sentence_transformers")
    from datasets import Dataset as HFDataset

    from embforge.encoder import Encoder

    anchors = ["a man playing guitar", "oil and the stock market", "a child with a book", "rain and sun"]
    positives = [DOCS[0], DOCS[2], DOCS[4], DOCS[8]]
    settings_ = {"num_negatives": 3, "relative_margin": 0.05}
    theirs = st_module.util.mine_hard_negatives(
        HFDataset.from_dict({"anchor": anchors, "positive": positives}),
        st_module.SentenceTransformer(str(tiny_model_dir), device="cpu"),
        corpus=DOCS,
        range_min=1,
        output_format="n-tuple",
        verbose=False,
        **settings_,
    )
    pairs = Dataset("pairs", {"anchor": anchors, "positive": positives}, [1, 2, 3, 4])
    ours = mine(Encoder.load(tiny_model_dir), pairs, MiningConfig(skip_top=1, **settings_), corpus=DOCS)
    assert ours.columns["anchor"] == theirs["anchor"]
    for j in (1, 2, 3):
        assert ours.columns[f"negative_{j}"] == theirs[f"negative_{j}"]


# ---------------------------------------------------------------- cross-encoder rescoring
QUERY = "a man plays music"


def _line_embeddings(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A query and documents whose cosine scores are exactly ``values``."""
    d = np.stack([values, np.sqrt(1 - values**2)], axis=1).astype(np.float32)
    return np.array([[1.0, 0.0]], np.float32), d


def test_rescorer_reranks_candidates_by_its_own_scores():
    ce = make_cross_encoder(seed=1)
    corpus = DOCS[:10]
    by_hand = ce.predict([(QUERY, t) for t in corpus])
    assert (
        len(set(np.round(by_hand, 5).tolist())) == 10
    )  # distinct scores: the expected order is well defined
    q, d = _line_embeddings(np.linspace(0.95, 0.05, 10))  # the retriever ranks d1, d2, d3, ... (d0: positive)

    def mined(rescore_depth: int, rescorer=ce):
        config = MiningConfig(num_negatives=3, depth=10, rescore_depth=rescore_depth)
        return mine_positions([QUERY], [[0]], corpus, config, query_emb=q, doc_emb=d, rescorer=rescorer)

    assert mined(9, rescorer=None).negatives[0].tolist() == [1, 2, 3]
    full = mined(9)
    expected = (np.argsort(-by_hand[1:], kind="stable")[:3] + 1).tolist()
    assert full.negatives[0].tolist() == expected and expected != [1, 2, 3]
    np.testing.assert_allclose(full.scores[0], by_hand[expected], atol=1e-5)
    np.testing.assert_allclose(full.positive_scores, by_hand[[0]], atol=1e-5)
    assert full.stats["rescored"] == 9
    # only the retriever's first 4 candidates (d1..d4) are scored by the cross-encoder
    shallow = mined(4)
    expected = (np.argsort(-by_hand[1:5], kind="stable")[:3] + 1).tolist()
    assert shallow.negatives[0].tolist() == expected and shallow.stats["rescored"] == 4


def test_relative_margin_applies_to_the_rescorer_scores():
    ce = make_cross_encoder(seed=1)
    corpus = DOCS[:10]
    by_hand = ce.predict([(QUERY, t) for t in corpus])
    ranked = np.argsort(-by_hand, kind="stable").tolist()
    positive, runner_up = ranked[0], ranked[1]  # the positive is the cross-encoder's best document
    # a margin between the runner-up and the third: (1 - m)·s⁺ is the midpoint of their scores
    margin = float(1 - (by_hand[ranked[1]] + by_hand[ranked[2]]) / 2 / by_hand[positive])
    # the retriever gives the positive 0.99 and every other document at most 0.5: the same margin on its scores
    # drops nothing
    q, d = _line_embeddings(np.where(np.arange(10) == positive, 0.99, np.linspace(0.5, 0.05, 10)))

    def mined(relative_margin, rescorer=ce):
        config = MiningConfig(num_negatives=2, depth=10, relative_margin=relative_margin)
        return mine_positions(
            [QUERY], [[positive]], corpus, config, query_emb=q, doc_emb=d, rescorer=rescorer
        )

    assert mined(margin, rescorer=None).stats["skipped_relative_margin"] == 0
    assert mined(None).negatives[0].tolist() == [runner_up, ranked[2]]
    filtered = mined(margin)
    assert filtered.stats["skipped_relative_margin"] == 1
    assert filtered.negatives[0].tolist() == [ranked[2], ranked[3]]


@pytest.mark.parametrize("method", ["dense", "bm25", "hybrid"])
def test_rescored_mining_never_emits_a_known_positive(method):
    ce = make_cross_encoder(seed=2)
    rng = np.random.default_rng(0)
    queries = [QUERY, "the stock market and the oil price", "a cat in the park"]
    positives = [[0, 10, 5], [2, 3], [9]]  # d10 is d0's text: both known positives of the first query
    q = rng.standard_normal((3, 8)).astype(np.float32)
    d = rng.standard_normal((len(DOCS), 8)).astype(np.float32)
    for sampling, hard_ratio in (("top", 1.0), ("random", 0.5)):
        config = MiningConfig(
            method=method, num_negatives=4, hard_ratio=hard_ratio, sampling=sampling, rescore_depth=6
        )
        mined = mine_positions(queries, positives, DOCS, config, query_emb=q, doc_emb=d, rescorer=ce)
        for row, pos in zip(mined.negatives.tolist(), positives):
            assert min(row) >= 0 and len(set(row)) == 4 and not set(row) & set(pos)


def test_cli_mine_with_a_cross_encoder(tmp_path, tiny_model_dir, capsys):
    import json

    from embforge.cli import main
    from embforge.cli.retrieval import load_data
    from embforge.cross_encoder import CrossEncoder

    make_cross_encoder(seed=1).save(tmp_path / "ce")
    root = tmp_path / "beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS))
    )
    queries = [QUERY, "the stock market and the oil price", "a child with a book"]
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(queries))
    )
    (root / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq0\td0\t1\nq1\td2\t1\nq1\td3\t1\nq2\td4\t1\n"
    )
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--data", str(root), "--method", "bm25", "--num-negatives", "2", "--output", str(out)]
    assert main([*argv, "--cross-encoder", str(tmp_path / "ce"), "--rescore-depth", "4"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["rescored"] == 3 * 4 and stats["rows"] == 4
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the same rows as the library call with the loaded cross-encoder, best cross-encoder score first
    ce = CrossEncoder.load(tmp_path / "ce")
    config = MiningConfig(method="bm25", num_negatives=2, rescore_depth=4)
    expected = mine(None, load_data(str(root), "train"), config, rescorer=ce)
    assert [r["negative_1"] for r in rows] == expected.columns["negative_1"]
    assert [r["negative_2"] for r in rows] == expected.columns["negative_2"]
    for row in rows:
        first, second = ce.predict([(row["anchor"], row["negative_1"]), (row["anchor"], row["negative_2"])])
        assert first >= second and row["positive"] not in (row["negative_1"], row["negative_2"])
    # a bi-encoder folder is refused: it would score with an untrained head
    assert main([*argv, "--cross-encoder", str(tiny_model_dir)]) == 2
    assert "--cross-encoder: " in (err := capsys.readouterr().err) and "not a cross-encoder" in err


@pytest.mark.parametrize("method", ["dense", "hybrid"])
def test_corpus_cache_is_written_once_and_reused(tiny_encoder, tmp_path, monkeypatch, method):
    config = lambda: MiningConfig(method=method, num_negatives=2, relative_margin=0.05)  # noqa: E731
    plain = mine(tiny_encoder, _data(), config())
    encoded: list[int] = []
    encode = tiny_encoder.encode
    monkeypatch.setattr(
        tiny_encoder, "encode", lambda texts, **kw: encoded.append(len(texts)) or encode(texts, **kw)
    )
    first = mine(tiny_encoder, _data(), config(), corpus_cache=tmp_path / "cache")
    assert (
        encoded == [len(DOCS), 2] and (tmp_path / "cache" / "shards" / "00000.npy").exists()
    )  # corpus, queries
    again = mine(tiny_encoder, _data(), config(), corpus_cache=tmp_path / "cache")
    # the second run encoded the queries only: the corpus came from the cache
    assert encoded == [len(DOCS), 2, 2]
    for rows in (first, again):
        assert rows.columns == plain.columns


def test_rescored_mining_keeps_the_cross_encoder_scores_for_distillation(tmp_path):
    """`mine --cross-encoder` computed the scores and threw them away; each row now carries them as
    ``score = [s(q, positive), s(q, negative_1), ...]`` (random negatives scored too), the list that
    ``embforge score`` writes, so margin_mse / kl_distill train on the mined file without re-scoring."""
    from embforge.data.tables import read_table

    ce = make_cross_encoder(seed=1)
    pairs = Dataset("p", {"anchor": [QUERY, "a cat in the park"], "positive": [DOCS[0], DOCS[9]]}, [1, 2])
    for hard_ratio in (1.0, 0.5):  # the second: one hard and one random negative per row
        config = MiningConfig(method="bm25", num_negatives=2, hard_ratio=hard_ratio, rescore_depth=6)
        rows = mine(None, pairs, config, corpus=DOCS, rescorer=ce)
        assert "score" in rows.columns and len(rows.columns["score"]) == len(rows)
        for i in range(len(rows)):
            texts = [rows.columns[c][i] for c in ("positive", "negative_1", "negative_2")]
            by_hand = ce.predict([(rows.columns["anchor"][i], t) for t in texts])
            np.testing.assert_allclose(rows.columns["score"][i], by_hand, atol=1e-5)
        back = read_table(write_jsonl(rows, tmp_path / "mined.jsonl"))
        labels = back.labels()
        assert labels is not None and labels.shape == (len(rows), 3)
    # without a cross-encoder the retriever's scores are not a teacher signal: no score column
    assert "score" not in mine(None, pairs, MiningConfig(method="bm25", num_negatives=2), corpus=DOCS).columns
