"""Pair data set loaders on the real files, and bad pair files failing with file and line."""

from __future__ import annotations

import argparse

import pytest

from embforge.data.builtin import load_builtin
from embforge.data.builtin._pairs import hash_split
from embforge.data.builtin.mrpc import load_mrpc
from embforge.data.builtin.senteval_cn import TASKS, load_senteval_cn
from embforge.data.builtin.snli import load_snli, read_senteval_nli
from embforge.data.builtin.stsb import load_stsb
from embforge.data.builtin.wikiqa import load_wikiqa
from embforge.data.builtin.wikiqa_passages import load_wikiqa_passages
from embforge.data.tables import DataError, read_table
from embforge.evaluate.rerank import group_candidates
from tests.conftest import benchmark_module, requires_data


@requires_data
def test_english_loaders_match_the_documented_sizes():
    assert [len(load_stsb(s)) for s in ("train", "dev", "test")] == [5749, 1500, 1379]
    assert len(load_mrpc("train")) + len(load_mrpc("dev")) == len(load_mrpc("train_all")) == 4076
    assert sum(load_mrpc("test").columns["label"]) == 1147
    assert [len(load_wikiqa(s)) for s in ("train", "dev", "test")] == [20360, 2733, 6165]
    assert len(group_candidates(load_wikiqa("test"))[0]) == 243
    test = load_snli("test")
    assert len(test) == 9824 and sum(test.columns["label"]) == 3368
    assert len(load_snli("train")) + len(load_snli("dev")) == 9842


@requires_data
def test_senteval_cn_trains_on_valid_and_tests_on_test():
    for task in TASKS:
        train, dev, test = (load_senteval_cn(task, s) for s in ("train", "dev", "test"))
        assert train.columns["sentence1"][0].strip() and test.label_column is not None
        if task == "STS-B":
            assert (len(train), len(test)) == (5231, 1361) and train.label_column == "score"
        else:
            assert len(train) + len(dev) == len(load_senteval_cn(task, "valid"))
            assert set(test.columns["label"]) == {0, 1}
    assert len(load_senteval_cn("PAWSX", "test")) == 2000


def test_hash_split_is_deterministic_and_disjoint(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("".join(f"question {i}\tanswer {i}\t{i % 2}\n" for i in range(200)))
    data = read_table(path, columns="0=sentence1,1=sentence2,2=label")
    train, dev = hash_split(data)
    again_train, _ = hash_split(data.subset(list(range(199, -1, -1))))
    assert len(train) + len(dev) == 200 and 5 < len(dev) < 40
    assert not set(train.columns["sentence1"]) & set(dev.columns["sentence1"])
    assert set(again_train.columns["sentence1"]) == set(train.columns["sentence1"])


def test_missing_second_text_fails_with_file_and_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a cat\ta dog\t1\nthe sun\t\t0\n")
    with pytest.raises(DataError, match=r"pairs\.tsv:2: column 'sentence2': empty text"):
        read_table(path, columns="0=sentence1,1=sentence2,2=label", label_set=[0, 1])


def test_label_outside_the_declared_set_fails_with_file_and_line(tmp_path):
    folder = tmp_path / "senteval_cn" / "BQ"
    folder.mkdir(parents=True)
    (folder / "BQ.test.data").write_text("甲\t乙\t1\n丙\t丁\t2\n")
    with pytest.raises(
        DataError, match=r"BQ\.test\.data:2: column 'label': 2 is not one of the allowed labels"
    ):
        load_senteval_cn("BQ", "test", root=tmp_path / "senteval_cn")


def test_snli_files_report_bad_lines(tmp_path):
    (tmp_path / "s1.dev").write_text("a man sleeps\na dog runs\n")
    (tmp_path / "s2.dev").write_text("a person rests\n \n")
    (tmp_path / "labels.dev").write_text("entailment\nneutral\n")
    with pytest.raises(DataError, match=r"s2\.dev:2: empty sentence"):
        read_senteval_nli(tmp_path, "dev")
    (tmp_path / "s2.dev").write_text("a person rests\nan animal moves\n")
    (tmp_path / "labels.dev").write_text("entailment\nmaybe\n")
    with pytest.raises(DataError, match=r"labels\.dev:2: label 'maybe'"):
        read_senteval_nli(tmp_path, "dev")
    (tmp_path / "labels.dev").write_text("entailment\ncontradiction\n")
    assert read_senteval_nli(tmp_path, "dev").columns["label"] == [1, 0]


@requires_data
def test_bench_cosent_vs_ce_runs_every_system_and_prints_mean_std(tiny_model_dir):
    """``benchmarks/cosent_vs_ce.py`` (the experiment script) on a tiny model: every system, mean ± std tables."""
    bench = benchmark_module("cosent_vs_ce")
    config = bench.BenchConfig(
        model=str(tiny_model_dir),
        datasets=["stsb", "mrpc"],
        systems=["cross-ce", "bi-softmax"],  # the two with special cases for graded labels
        seeds=[0, 1],
        train_size=24,
        dev_size=40,
        test_size=40,
        batch_size=8,
        max_seq_length=32,
    )
    result = bench.run_benchmark(config, echo=False)
    assert len(result["runs"]) == 2 * 2 * 2
    assert all("accuracy" in r for r in result["runs"] if r["dataset"] == "mrpc")
    assert not any("accuracy" in r for r in result["runs"] if r["dataset"] == "stsb")
    tables = result["tables"]
    assert "| system | stsb | mrpc | avg |" in tables and "| system | mrpc | avg |" in tables
    assert tables.count("±") == 2 * 3 + 2 * 2
    assert result["rows"]["mrpc"]["train"] == "24/3646"


def test_bench_cosent_vs_ce_command_line_fills_the_config_and_refuses_bad_values(capsys):
    bench = benchmark_module("cosent_vs_ce")
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    config = bench.config_from_args(parser.parse_args(["--quick", "--systems", "bi-cosent", "--seeds", "3"]))
    assert (config.datasets, config.train_size, config.systems, config.seeds) == (
        ["stsb", "mrpc"],
        64,
        ["bi-cosent"],
        [3],
    )
    assert bench.config_from_args(parser.parse_args(["--test-size", "0"])).test_size is None  # 0 = all rows
    with pytest.raises(SystemExit):
        bench.main(["--epochs", "0"])
    assert "--epochs: must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--datasets", "stsb,imdb"])
    assert "unknown data set 'imdb'" in capsys.readouterr().err


def test_wikiqa_passages_join_each_answered_questions_candidates_in_order(tmp_path):
    (tmp_path / "dev.txt").write_text(
        "who wrote it ?\tThe book is old .\t0\nwho wrote it ?\tAnn wrote it .\t1\n"
        "where is it ?\tIt is red .\t0\nwhen was it ?\tIt was 1900 .\t1\n"
    )
    pairs = load_wikiqa_passages("dev", root=tmp_path)
    assert pairs.columns == {
        "anchor": ["who wrote it ?", "when was it ?"],  # "where is it ?" has no correct answer
        "positive": ["The book is old . Ann wrote it .", "It was 1900 ."],
    }
    assert pairs.lines == [1, 4]  # each pair points at its question's first line
    with pytest.raises(ValueError, match="WikiQA passages split"):
        load_wikiqa_passages("all", root=tmp_path)


@requires_data
def test_wikiqa_passages_sizes():
    assert [len(load_builtin("wikiqa-passages", s)) for s in ("train", "dev", "test")] == [873, 126, 243]
