"""Classification, clustering and Matryoshka evaluators and their CLI (embforge eval classification|clustering)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, v_measure_score

from embforge.cli import main
from embforge.data.tables import read_table
from embforge.evaluate.classification import evaluate_classification
from embforge.evaluate.clustering import evaluate_clustering
from embforge.evaluate.matryoshka import TruncatedModel, evaluate_matryoshka, format_table, plot_matryoshka
from embforge.evaluate.sts import evaluate_sts
from tests.conftest import requires_data, requires_minilm

TOPICS = {
    "music": ["guitar", "piano", "flute", "song", "sings", "music"],
    "money": ["bank", "money", "price", "stock", "market", "oil"],
    "nature": ["tree", "river", "sky", "sun", "rain", "park"],
}


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic = list(TOPICS)[i % 3]
        rows.append({"text": " ".join(rng.choices(TOPICS[topic], k=4)), "label": topic})
    return rows


@pytest.fixture
def topic_files(tmp_path):
    paths = []
    for name, seed in (("train", 0), ("test", 1)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _rows(60, seed)))
        paths.append(path)
    return paths


def test_classification_equals_sklearn_on_the_same_embeddings(tiny_encoder, topic_files):
    train, test = (read_table(p, label_names=sorted(TOPICS)) for p in topic_files)
    result = evaluate_classification(tiny_encoder, train, test)
    x_train = tiny_encoder.encode(train.columns["text"], normalize=True)
    x_test = tiny_encoder.encode(test.columns["text"], normalize=True)
    predicted = (
        LogisticRegression(max_iter=1000, random_state=42).fit(x_train, train.labels()).predict(x_test)
    )
    assert result["accuracy"] == pytest.approx(100 * accuracy_score(test.labels(), predicted))
    assert result["f1_macro"] == pytest.approx(100 * f1_score(test.labels(), predicted, average="macro"))
    assert result["n_test"] == 60


def test_clustering_equals_sklearn_kmeans_v_measure(tiny_encoder, topic_files):
    data = read_table(topic_files[0])
    result = evaluate_clustering(tiny_encoder, data, seeds=2)
    x = tiny_encoder.encode(data.columns["text"], normalize=True)
    expected = np.mean(
        [v_measure_score(data.labels(), KMeans(3, n_init=1, random_state=s).fit_predict(x)) for s in range(2)]
    )
    assert result["v_measure"] == pytest.approx(100 * expected)
    assert result["clusters"] == 3


def test_classification_rejects_labels_missing_from_train(tiny_encoder, tmp_path):
    train, test = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    train.write_text('{"text": "a cat", "label": 0}\n{"text": "a dog", "label": 1}\n')
    test.write_text('{"text": "a cat", "label": 0}\n{"text": "a sun", "label": 5}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl: labels \[5\]"):
        evaluate_classification(tiny_encoder, read_table(train), read_table(test))


def test_cli_classification_and_clustering_print_json_last(tiny_model_dir, topic_files, capsys):
    assert main(["eval", "classification", "--model", str(tiny_model_dir), "--train", str(topic_files[0]),
                 "--test", str(topic_files[1])]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= result["accuracy"] <= 100 and result["n_train"] == 60
    assert main(["eval", "clustering", "--model", str(tiny_model_dir), "--data", str(topic_files[0])]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= result["v_measure"] <= 100


def test_cli_clustering_missing_label_column_names_the_file(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "nolabel.jsonl"
    path.write_text('{"text": "a cat"}\n{"text": "a dog"}\n')
    assert main(["eval", "clustering", "--model", str(tiny_model_dir), "--data", str(path)]) == 2
    assert "nolabel.jsonl:1: missing column 'label'" in capsys.readouterr().err


def test_truncated_view_equals_encode_with_dim(tiny_encoder):
    texts = ["a man plays the guitar", "the stock market rises", "rain on the river"]
    view = TruncatedModel(tiny_encoder, 8)
    for normalize in (True, False):
        np.testing.assert_allclose(
            view.encode(texts, normalize=normalize),
            tiny_encoder.encode(texts, dim=8, normalize=normalize),
            atol=1e-6,
        )
    with pytest.raises(ValueError, match="between 1 and the model's dimension 32"):
        TruncatedModel(tiny_encoder, 64)


def test_matryoshka_table_and_plot(tiny_encoder, sts_csv, tmp_path):
    data = read_table(sts_csv, columns="0=sentence1,1=sentence2,2=score")
    calls = []

    def evaluator(model):
        calls.append(model.dim)
        return evaluate_sts(model, data)

    result = evaluate_matryoshka(tiny_encoder, evaluator, [8, 16], metric="spearman")
    assert result["dims"] == [8, 16, 32] and calls == [8, 16, 32]
    assert result["retained"][32] == pytest.approx(1.0)
    assert result["scores"][8] == pytest.approx(
        evaluate_sts(TruncatedModel(tiny_encoder, 8), data)["spearman"]
    )
    assert result["scores"][32] == pytest.approx(evaluate_sts(tiny_encoder, data)["spearman"], abs=1e-6)
    table = format_table({"tiny": result})
    assert table.splitlines()[0].startswith("| dim | tiny spearman") and "| 32 |" in table
    png = plot_matryoshka({"tiny": result}, tmp_path / "plot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
@requires_minilm
@requires_data
def test_minilm_banking77_subset_classification_and_clustering():
    from embforge.data.builtin.banking77 import load_banking77
    from embforge.encoder import Encoder

    model = Encoder.load("all-MiniLM-L6-v2")
    train, test = load_banking77("train"), load_banking77("test")
    train = train.subset(list(range(0, len(train), 12)))  # ~750 rows, all 77 intents
    test = test.subset(list(range(0, len(test), 16)))
    result = evaluate_classification(model, train, test)
    assert result["accuracy"] > 50  # MTEB reports ~80 with the full train set
    clusters = evaluate_clustering(model, test, seeds=1)
    assert clusters["v_measure"] > 50


def test_cli_matryoshka_prints_table_and_saves_plot(tiny_model_dir, sts_csv, tmp_path, capsys):
    plot = tmp_path / "m.png"
    args = ["eval", "matryoshka", "--model", str(tiny_model_dir), "--task", "sts", "--data", str(sts_csv)]
    args += ["--columns", "0=sentence1,1=sentence2,2=score", "--dims", "8,16", "--plot", str(plot)]
    assert main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert sorted(result["scores"], key=int) == ["8", "16", "32"] and result["retained"][
        "32"
    ] == pytest.approx(1.0)
    assert any(line.startswith("| 16 |") for line in out)
    assert plot.read_bytes()[:4] == b"\x89PNG"
