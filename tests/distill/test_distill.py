"""Teacher signals (embforge.distill.signals), the student's Dense projection (2_Dense/) and `embforge score`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embforge.data.tables import Dataset, read_table
from embforge.distill.projection import add_projection, fit_projection
from embforge.distill.signals import score_rows, teacher_embeddings, with_teacher_embeddings, write_scored
from embforge.encoder import Encoder
from embforge.losses import get_loss
from tests.conftest import make_bert, make_tokenizer

TEXTS = ["a man plays the guitar", "a cat", "the stock market rises", "a child reads a book ."]


def _encoder(seed: int = 0, **kwargs: Any) -> Encoder:
    tokenizer = make_tokenizer()
    return Encoder(make_bert(len(tokenizer), seed=seed), tokenizer, max_seq_length=64, **kwargs)


class CountingEncoder:
    """Wraps an encoder and counts the texts it encodes."""

    def __init__(self, model: Encoder) -> None:
        self.model, self.encoded = model, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        self.encoded += len(texts)
        return self.model.encode(texts, **kwargs)


# ------------------------------------------------------------------ Dense projection
@pytest.mark.parametrize("normalize", [False, True])
def test_projection_saves_as_dense_and_both_libraries_load_it(tmp_path: Path, normalize: bool) -> None:
    model = _encoder(normalize=normalize)
    add_projection(model, 48)
    assert model.dim == 48
    expected = model.encode(TEXTS)
    assert expected.shape == (4, 48)
    model.save(tmp_path / "m")
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense"] + (
        ["Normalize"] if normalize else []
    )
    config = json.loads((tmp_path / "m" / "2_Dense" / "config.json").read_text())
    assert config == {
        "in_features": 32,
        "out_features": 48,
        "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity",
    }
    assert (
        json.loads((tmp_path / "m" / "1_Pooling" / "config.json").read_text())["word_embedding_dimension"]
        == 32
    )
    reloaded = Encoder.load(tmp_path / "m")
    np.testing.assert_allclose(reloaded.encode(TEXTS), expected, atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    peer = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    np.testing.assert_allclose(peer.encode(TEXTS), expected, atol=1e-5)
    with pytest.raises(ValueError, match="already has a 48-d Dense"):
        add_projection(reloaded, 64)


def test_a_sentence_transformers_dense_model_loads_in_embforge(tmp_path: Path, tiny_model_dir: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.models import Dense

    base = st.SentenceTransformer(str(tiny_model_dir), device="cpu")
    torch.manual_seed(0)
    peer = st.SentenceTransformer(modules=[*base, Dense(32, 16)], device="cpu")  # default tanh activation
    peer.save(str(tmp_path / "peer"))
    ours = Encoder.load(tmp_path / "peer")
    assert ours.dim == 16
    np.testing.assert_allclose(ours.encode(TEXTS), peer.encode(TEXTS), atol=1e-5)


def test_projection_trains_with_mse_distill() -> None:
    student, teacher = _encoder(seed=1), _encoder(seed=2)
    add_projection(teacher, 24)  # a 24-d "teacher" so that dims differ from the 32-d student
    target = torch.as_tensor(teacher.encode(TEXTS))
    loss_fn = get_loss("mse_distill")
    with pytest.raises(ValueError, match="add_projection"):
        loss_fn([student.embed_ids(student.tokenize_ids(TEXTS))], target)
    add_projection(student, 24)
    optim = torch.optim.Adam(student.parameters(), lr=1e-2)
    student.train()
    losses = []
    for _ in range(15):
        optim.zero_grad()
        loss = loss_fn([student.embed_ids(student.tokenize_ids(TEXTS))], target)
        loss.backward()
        assert student.dense is not None and student.dense.linear.weight.grad is not None
        optim.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_fit_projection_recovers_a_planted_linear_map_and_reports_its_error() -> None:
    model = _encoder()
    texts = [
        f"{w} {v} ."
        for w in ("a man", "the cat", "one child", "markets")
        for v in ("runs", "sleeps", "reads")
    ]
    pooled = model.encode(texts, normalize=False)  # 32-d, before any projection
    rng = np.random.default_rng(0)
    weight, bias = rng.normal(size=(32, 24)), rng.normal(size=24)
    targets = pooled @ weight + bias
    add_projection(model, 24)
    random_error = float(np.mean((model.encode(texts, normalize=False) - targets) ** 2))
    error = fit_projection(model, texts, targets)
    outputs = model.encode(texts, normalize=False)
    assert error == pytest.approx(float(np.mean((outputs - targets) ** 2)), rel=1e-3, abs=1e-6)
    # 12 texts < 33 unknowns per output: the ridge picks one map; it reproduces the targets all the same
    np.testing.assert_allclose(outputs, targets, atol=0.05 * np.abs(targets).max())
    assert error < 1e-3 * random_error


def test_fit_projection_needs_a_projection_and_matching_targets() -> None:
    model = _encoder()
    with pytest.raises(ValueError, match="add_projection"):
        fit_projection(model, TEXTS, np.zeros((4, 24)))
    add_projection(model, 24)
    with pytest.raises(ValueError, match=r"one 24-d target per text"):
        fit_projection(model, TEXTS, np.zeros((3, 24)))


# ------------------------------------------------------------------ teacher embeddings cache
def test_teacher_embeddings_are_cached_and_follow_the_teacher(tmp_path: Path) -> None:
    teacher = CountingEncoder(_encoder(seed=3))
    first = np.array(teacher_embeddings(teacher, TEXTS, cache_dir=tmp_path, show_progress=False))
    assert teacher.encoded == 4
    np.testing.assert_allclose(first, teacher.model.encode(TEXTS), atol=1e-6)
    teacher.encoded = 0
    again = teacher_embeddings(teacher, TEXTS, cache_dir=tmp_path, show_progress=False)
    assert teacher.encoded == 0  # reused, not recomputed
    np.testing.assert_array_equal(np.asarray(again), first)
    with torch.no_grad():  # a changed teacher: its own entry, recomputed
        teacher.model.backbone.embeddings.word_embeddings.weight.mul_(1.5)
    changed = np.array(teacher_embeddings(teacher, TEXTS, cache_dir=tmp_path, show_progress=False))
    assert teacher.encoded == 4
    assert not np.allclose(changed, first)
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    teacher.encoded = 0
    teacher_embeddings(teacher, TEXTS[:2], cache_dir=tmp_path, show_progress=False)  # other texts: new entry
    assert teacher.encoded == 2


def test_with_teacher_embeddings_gives_one_target_per_column(tmp_path: Path) -> None:
    teacher = CountingEncoder(_encoder(seed=3))
    data = Dataset("pairs", {"anchor": TEXTS[:3], "positive": [TEXTS[1], TEXTS[3], TEXTS[0]]}, [1, 2, 3])
    out = with_teacher_embeddings(data, teacher, cache_dir=tmp_path, show_progress=False)
    assert teacher.encoded == 4  # each distinct text once
    labels = out.labels()
    assert labels is not None and labels.shape == (3, 2, 32)
    np.testing.assert_allclose(labels[1, 1], teacher.model.encode(TEXTS[3]), atol=1e-5)
    single = with_teacher_embeddings(
        Dataset("t", {"text": TEXTS}, [1, 2, 3, 4]), teacher, cache_dir=tmp_path, show_progress=False
    )
    assert single.labels() is not None and single.labels().shape == (4, 32)
    with pytest.raises(ValueError, match="'score' column"):
        with_teacher_embeddings(out, teacher)


# ------------------------------------------------------------------ teacher scores
def test_score_rows_bi_encoder_cosines_and_lists_for_candidates() -> None:
    teacher = _encoder(seed=4)
    emb = teacher.encode(TEXTS, normalize=True)
    pairs = Dataset("p", {"sentence1": TEXTS[:2], "sentence2": TEXTS[2:]}, [1, 2])
    assert score_rows(teacher, pairs, show_progress=False) == pytest.approx(
        [float(emb[0] @ emb[2]), float(emb[1] @ emb[3])], abs=1e-5
    )
    mined = Dataset(
        "m",
        {"anchor": [TEXTS[0]], "positive": [TEXTS[1]], "negative_1": [TEXTS[2]], "negative_2": [TEXTS[3]]},
        [1],
    )
    (row,) = score_rows(teacher, mined, show_progress=False)
    assert row == pytest.approx([float(emb[0] @ emb[i]) for i in (1, 2, 3)], abs=1e-5)


def test_score_rows_cross_encoder_logits() -> None:
    from tests.losses.test_cross_losses import make_cross_encoder

    teacher = make_cross_encoder()
    data = Dataset("t", {"anchor": TEXTS[:2], "positive": TEXTS[2:], "negative": TEXTS[1:3]}, [1, 2])
    scores = score_rows(teacher, data, show_progress=False)
    expected = teacher.predict(
        [(TEXTS[0], TEXTS[2]), (TEXTS[0], TEXTS[1]), (TEXTS[1], TEXTS[3]), (TEXTS[1], TEXTS[2])],
        activation=False,
    )
    np.testing.assert_allclose(np.asarray(scores).reshape(-1), expected, atol=1e-5)


def test_write_scored_files_and_the_score_cli(tmp_path: Path, sts_csv: Path, tiny_model_dir: Path) -> None:
    pairs = Dataset("p", {"sentence1": ["a", "b"], "sentence2": ["c", "d"]}, [1, 2])
    write_scored(pairs, [0.5, 0.25], tmp_path / "p.csv")
    back = read_table(tmp_path / "p.csv")
    assert back.columns["score"] == [0.5, 0.25] and back.columns["sentence1"] == ["a", "b"]
    trip = Dataset("t", {"anchor": ["a"], "positive": ["b"], "negative": ["c"]}, [1])
    with pytest.raises(ValueError, match=r"write \.jsonl"):
        write_scored(trip, [[1.0, 0.0]], tmp_path / "t.csv")
    write_scored(trip, [[1.0, 0.0]], tmp_path / "t.jsonl")
    assert json.loads((tmp_path / "t.jsonl").read_text()) == {
        "anchor": "a",
        "positive": "b",
        "negative": "c",
        "score": [1.0, 0.0],
    }

    from embforge.cli import main

    out = tmp_path / "scored.csv"
    with pytest.raises(ValueError, match="already has"):
        write_scored(read_table(sts_csv), [0.0] * 32, out)
    assert (
        main(["score", "--teacher", str(tiny_model_dir), "--data", str(sts_csv), "--output", str(out)]) == 2
    )
    argv = [
        "score",
        "--teacher",
        str(tiny_model_dir),
        "--data",
        str(sts_csv),
        "--output",
        str(out),
        "--overwrite",
    ]
    assert main(argv) == 0
    scored = read_table(out)
    teacher = Encoder.load(tiny_model_dir)
    emb = teacher.encode(scored.columns["sentence1"][:1] + scored.columns["sentence2"][:1], normalize=True)
    assert scored.columns["score"][0] == pytest.approx(float(emb[0] @ emb[1]), abs=1e-5)


def test_list_scores_read_back_as_a_label_matrix(tmp_path: Path) -> None:
    """`embforge score` output for mined rows trains margin_mse / kl_distill directly (score lists -> (n, 1+k))."""
    trip = Dataset("t", {"anchor": ["a", "b"], "positive": ["c", "d"], "negative": ["e", "f"]}, [1, 2])
    write_scored(trip, [[1.0, 0.25], [0.5, 0.75]], tmp_path / "t.jsonl")
    back = read_table(tmp_path / "t.jsonl")
    labels = back.labels()
    assert labels is not None and labels.shape == (2, 2)
    assert labels.tolist() == [[1.0, 0.25], [0.5, 0.75]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"anchor": "a", "positive": "b", "negative": "c", "score": [1.0, "x"]}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        read_table(bad)
