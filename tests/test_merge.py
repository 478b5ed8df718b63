"""Model merging (embforge.merge, `embforge merge`): end points exact, formulas by hand, sentence-transformers
loads the result, disagreeing settings are errors, --choose-on picks from a printed table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embforge.encoder import Encoder
from embforge.merge import Merger, merge_state_dicts, trim_top
from tests.conftest import make_bert, make_tokenizer

TEXTS = ["a man plays the guitar", "a cat", "the stock market rises", "a child reads a book ."]


def _save(tmp: Path, name: str, seed: int, **kwargs: object) -> Path:
    tokenizer = make_tokenizer()
    settings: dict = {"pooling": "mean", "normalize": False, "max_seq_length": 64, **kwargs}
    Encoder(make_bert(len(tokenizer), seed=seed), tokenizer, **settings).save(tmp / name)
    return tmp / name


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path, Path]:
    return _save(tmp_path, "base", 0), _save(tmp_path, "a", 1), _save(tmp_path, "b", 2)


def _state(path: Path) -> dict[str, torch.Tensor]:
    return Encoder.load(path).state_dict()


def _equal(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_end_points_reproduce_the_inputs_exactly(folders: tuple[Path, Path, Path]) -> None:
    base, a, b = folders
    linear = Merger([a, b])
    assert _equal(linear.merge([1.0, 0.0]).state_dict(), _state(a))
    assert _equal(linear.merge([0.0, 1.0]).state_dict(), _state(b))
    for method in ("task_arithmetic", "ties"):
        merger = Merger([a], method=method, base=base, density=1.0)
        assert _equal(merger.merge([0.0]).state_dict(), _state(base)), method
        assert _equal(merger.merge([1.0]).state_dict(), _state(a)), method


def test_linear_and_task_arithmetic_by_hand(folders: tuple[Path, Path, Path]) -> None:
    base, a, b = folders
    sa, sb, s0 = _state(a), _state(b), _state(base)
    key = "backbone.encoder.layer.0.attention.self.query.weight"
    out = Merger([a, b]).merge([0.3, 0.7]).state_dict()
    assert torch.allclose(out[key], 0.3 * sa[key] + 0.7 * sb[key], atol=1e-6)
    out = Merger([a, b], method="task_arithmetic", base=base).merge([0.5, 0.25]).state_dict()
    expected = s0[key] + 0.5 * (sa[key] - s0[key]) + 0.25 * (sb[key] - s0[key])
    assert torch.allclose(out[key], expected, atol=1e-6)
    ints = [{"ids": torch.arange(3)}, {"ids": torch.arange(3)}]  # integer buffers are copied, never averaged
    assert torch.equal(merge_state_dicts(ints, [0.5, 0.5])["ids"], torch.arange(3))
    with pytest.raises(ValueError, match="integer buffer differs"):
        merge_state_dicts([ints[0], {"ids": torch.arange(1, 4)}], [0.5, 0.5])
    averaged = Merger([a, b]).merge().state_dict()  # checkpoint averaging: equal weights
    assert torch.allclose(averaged[key], (sa[key] + sb[key]) / 2, atol=1e-6)


def test_layer_scaling_keeps_shallow_layers_near_the_base(folders: tuple[Path, Path, Path]) -> None:
    base, a, _ = folders
    sa, s0 = _state(a), _state(base)
    layers = 1 + max(int(k.split("layer.")[1].split(".")[0]) for k in s0 if ".layer." in k)
    merger = Merger([a], method="task_arithmetic", base=base, layer_scaling=0.0)
    out = merger.merge([0.8]).state_dict()
    # alpha 0: embeddings stay the base's, layer l gets (l+1)/L of the task vector, the last layer all of it
    emb = "backbone.embeddings.word_embeddings.weight"
    assert torch.equal(out[emb], s0[emb])
    for layer in range(layers):
        key = f"backbone.encoder.layer.{layer}.output.dense.weight"
        expected = s0[key] + 0.8 * (layer + 1) / layers * (sa[key] - s0[key])
        assert torch.allclose(out[key], expected, atol=1e-6)
    # alpha 1 is plain task arithmetic; alpha 0.5 puts the embeddings halfway
    plain = Merger([a], method="task_arithmetic", base=base).merge([0.8]).state_dict()
    assert _equal(
        Merger([a], method="task_arithmetic", base=base, layer_scaling=1.0).merge([0.8]).state_dict(), plain
    )
    half = Merger([a], method="task_arithmetic", base=base, layer_scaling=0.5).merge([1.0]).state_dict()
    assert torch.allclose(half[emb], (s0[emb] + sa[emb]) / 2, atol=1e-6)
    with pytest.raises(ValueError, match="layer scaling needs a base"):
        merge_state_dicts([sa, s0], [0.5, 0.5], layer_scaling=0.0)


def test_ties_trims_elects_signs_and_adds_agreeing_entries() -> None:
    base = {"w": torch.zeros(4)}
    one = {"w": torch.tensor([3.0, -1.0, 0.2, 2.0])}
    two = {"w": torch.tensor([-1.0, -2.0, 0.1, -5.0])}
    assert trim_top(one["w"], 0.5).tolist() == [True, False, False, True]
    # density 0.5: one -> [3, 0, 0, 2], two -> [0, -2, 0, -5]; elected sign of the sum: [+, -, 0, -]
    out = merge_state_dicts([one, two], [1.0, 1.0], method="ties", base=base, density=0.5)["w"]
    assert out.tolist() == [3.0, -2.0, 0.0, -5.0]
    out = merge_state_dicts([one, two], [0.5, 0.5], method="ties", base=base, density=1.0)["w"]
    # signs of 0.5*(one+two) = [+, -, +, -]: entry 0 keeps one's 3, entry 3 keeps two's -5
    assert torch.allclose(out, torch.tensor([1.5, -1.5, 0.15, -2.5]))


def test_errors(folders: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, a, b = folders
    cls = _save(tmp_path, "cls", 3, pooling="cls")
    with pytest.raises(ValueError, match=r"pooling differs .*'mean'.*'cls'"):
        Merger([a, cls])
    normed = _save(tmp_path, "normed", 3, normalize=True)
    with pytest.raises(ValueError, match="normalize differs"):
        Merger([a, normed])
    prompted = _save(tmp_path, "prompted", 3)
    config = prompted / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prompts": {"query": "query: "}}))
    with pytest.raises(ValueError, match="prompts differs"):
        Merger([a, prompted])
    plain = _save(
        tmp_path, "plain", 4
    )  # a folder without similarity_fn_name means cosine (as in all-MiniLM-L6-v2)
    config = plain / "config_sentence_transformers.json"
    config.write_text(
        json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "similarity_fn_name"})
    )
    assert Merger([a, plain]).settings["similarity_fn_name"] == "cosine"
    with pytest.raises(ValueError, match="sum to 1"):
        Merger([a, b]).merge([0.5, 0.6])
    with pytest.raises(
        ValueError, match=r"ties merging needs 1 or more fine-tuned models and their base \(--base\)"
    ):
        Merger([a, b], method="ties")


def test_merged_model_loads_in_sentence_transformers_with_equal_embeddings(
    folders: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    st = pytest.importorskip("sentence_transformers")
    base, a, b = folders
    merger = Merger([a, b], method="ties", base=base)
    model = merger.merge([0.6, 0.6])
    expected = model.encode(TEXTS)
    merger.save(tmp_path / "merged", recipe={"method": "ties"})
    np.testing.assert_allclose(Encoder.load(tmp_path / "merged").encode(TEXTS), expected, atol=1e-6)
    peer = st.SentenceTransformer(str(tmp_path / "merged"), device="cpu")
    np.testing.assert_allclose(peer.encode(TEXTS), expected, atol=1e-5)
    config = json.loads((tmp_path / "merged" / "config_sentence_transformers.json").read_text())
    assert config["embforge_merge"] == {"method": "ties"}


def test_merge_cli_weights_and_choose_on(
    folders: tuple[Path, Path, Path], tmp_path: Path, sts_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from embforge.cli import main
    from embforge.data.tables import read_table
    from embforge.evaluate.sts import evaluate_sts

    base, a, b = folders
    out = tmp_path / "out"
    assert main(["merge", "--models", str(a), str(b), "--weights", "1,0", "--output", str(out)]) == 0
    assert _equal(_state(out), _state(a))
    argv = ["merge", "--models", str(a), "--base", str(base), "--method", "task_arithmetic"]
    argv += ["--output", str(out), "--choose-on", f"sts:{sts_csv}", "--grid", "0,0.5,1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    table = result["table"]
    assert [row["w"] for row in table] == [0.0, 0.5, 1.0]
    best = max(table, key=lambda row: row["mean"])
    assert result["weights"] == [best["w"]]
    assert "<- chosen" in captured.err
    data = read_table(sts_csv)
    assert table[0][f"sts:{sts_csv}"] == pytest.approx(
        evaluate_sts(Encoder.load(base), data)["spearman"], abs=1e-6
    )
    assert evaluate_sts(Encoder.load(out), data)["spearman"] == pytest.approx(best["mean"], abs=1e-6)


def test_merge_cli_new_methods(
    folders: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from embforge.cli import main

    base, a, b = folders
    outs = []
    for name, seed in (("one", "1"), ("two", "1"), ("three", "2")):
        argv = ["merge", "--models", str(a), str(b), "--base", str(base), "--method", "dare_ties"]
        argv += ["--density", "0.5", "--seed", seed, "--weights", "0.5,0.5", "--output", str(tmp_path / name)]
        assert main(argv) == 0
        outs.append(_state(tmp_path / name))
    assert _equal(outs[0], outs[1]) and not _equal(outs[0], outs[2])  # the seed decides the drops
    config = json.loads((tmp_path / "one" / "config_sentence_transformers.json").read_text())
    assert config["embforge_merge"]["density"] == 0.5 and config["embforge_merge"]["seed"] == 1
    stock = tmp_path / "stock"
    argv = ["merge", "--models", str(a), str(b), "--base", str(base), "--method", "model_stock"]
    assert main([*argv, "--output", str(stock)]) == 0
    assert (
        "weights"
        not in json.loads((stock / "config_sentence_transformers.json").read_text())["embforge_merge"]
    )
    assert main([*argv, "--output", str(stock), "--choose-on", "sts:x.csv"]) != 0
    assert "model_stock merging has no weight to choose: drop --choose-on" in capsys.readouterr().err
    slerp = tmp_path / "slerp"
    assert (
        main(
            [
                "merge",
                "--models",
                str(a),
                str(b),
                "--method",
                "slerp",
                "--weights",
                "0,1",
                "--output",
                str(slerp),
            ]
        )
        == 0
    )
    assert _equal(_state(slerp), _state(b))
