"""Header detection by content, ``header=``/``--header`` overrides, and ``--columns`` names with spaces and ``#``
(issue #16 item 2): the project's own data files read as their SOURCE.md describes them."""

from __future__ import annotations

import json

import pytest

from embforge.cli import main
from embforge.data.tables import DataError, read_table
from tests.conftest import requires_data, shared_data

MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
MRPC_ROWS = [
    "1\t1089874\t1089925\tPCCW's chief operating officer will report to Mr So.\tThe officer reports to Mr So.\n",
    "0\t3019446\t3019327\tSales declined more than predicted last month.\tSales rose last month.\n",
    "1\t1945605\t1945824\tThe stock rose 2 percent on Monday.\tOn Monday the stock rose 2 percent.\n",
]


def write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding)
    return path


@pytest.fixture
def mrpc_like(tmp_path):
    return write(tmp_path / "msr.txt", "\ufeff" + MRPC_HEADER + "".join(MRPC_ROWS * 3))


def test_mrpc_header_names_with_spaces_and_hash(mrpc_like):
    data = read_table(
        mrpc_like, columns="Quality=label,#1 String=sentence1,#2 String=sentence2", label_set=[0, 1]
    )
    assert len(data) == 9 and data.lines[0] == 2
    assert data.columns["label"][:3] == [1, 0, 1]
    assert data.columns["sentence1"][1] == "Sales declined more than predicted last month."


def test_mrpc_header_is_detected_with_positions(mrpc_like):
    data = read_table(mrpc_like, columns="0=label,3=sentence1,4=sentence2", label_set=[0, 1])
    assert len(data) == 9 and data.columns["label"][0] == 1


def test_mrpc_header_without_a_mapping_names_the_unknown_columns(mrpc_like):
    with pytest.raises(DataError, match=r"msr\.txt:1: .*'Quality', '#1 ID'.*--columns"):
        read_table(mrpc_like)


def test_a_mapped_name_missing_from_the_header_lists_the_header(mrpc_like):
    with pytest.raises(DataError, match=r"msr\.txt:1: .*'#3 String'.* not in the header .*'#1 String'"):
        read_table(mrpc_like, columns="Quality=label,#1 String=sentence1,#3 String=sentence2")


def _banking_like(tmp_path, rows=40):
    intents = ["card_arrival", "card_linking", "exchange_rate", "lost_or_stolen_card"]
    lines = [f"how do I fix problem number {i} please,{intents[i % 4]}\n" for i in range(rows)]
    return write(tmp_path / "bank.csv", "text,category\n" + "".join(lines))


def test_banking_header_is_detected_by_its_category_column(tmp_path):
    path = _banking_like(tmp_path)
    with pytest.raises(DataError, match=r"bank\.csv:1: .*'category'.*--columns"):
        read_table(path)
    data = read_table(path, columns="text=text,category=label")
    assert len(data) == 40 and data.label_names == [
        "card_arrival",
        "card_linking",
        "exchange_rate",
        "lost_or_stolen_card",
    ]


def test_a_text_only_header_is_detected_by_its_shape(tmp_path):
    rows = "".join(f"what is the answer to question {i},it is the number {i}\n" for i in range(20))
    path = write(tmp_path / "qa.csv", "question,answer\n" + rows)
    with pytest.raises(DataError, match=r"qa\.csv:1: .*'question', 'answer'"):
        read_table(path)
    data = read_table(path, columns="question=anchor,answer=positive")
    assert len(data) == 20 and data.columns["anchor"][0] == "what is the answer to question 0"


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("a cat,a dog,4.5\nx y,z w,0\n", ["sentence1", "sentence2", "score"]),
        ("one sentence here,another one here\nand a third,and a fourth\n", ["anchor", "positive"]),
        ("".join(f"movie {i} was fine,{'positive' if i % 2 else 'negative'}\n" for i in range(30)), None),
    ],
)
def test_headerless_files_keep_their_first_row(tmp_path, content, names):
    path = write(tmp_path / "h.csv", content)
    data = read_table(path) if names else read_table(path, columns="0=text,1=label")
    assert data.lines[0] == 1
    if names:
        assert list(data.columns) == names


def test_header_override(tmp_path):
    path = write(tmp_path / "o.csv", "sentence1,sentence2,score\nx,y,1\n")
    forced = read_table(path, header=False, columns="0=sentence1,1=sentence2")
    assert forced.columns["sentence1"] == ["sentence1", "x"]
    plain = write(tmp_path / "p.csv", "first row a,first row b\nsecond a,second b\n")
    assert read_table(plain, header=True, columns="first row a=anchor,first row b=positive").lines == [2]
    with pytest.raises(ValueError, match=r"names columns .* a header"):
        read_table(path, header=False, columns="sentence1=sentence1")


def test_cli_header_flag_and_named_columns(tmp_path, tiny_model_dir, mrpc_like, capsys):
    args = ["eval", "pairs", "--model", str(tiny_model_dir), "--data", str(mrpc_like)]
    named = ["--columns", "Quality=label,#1 String=sentence1,#2 String=sentence2"]
    assert main([*args, *named]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*args, "--no-header", "--columns", "0=label,3=sentence1,4=sentence2"]) == 2
    assert "msr.txt:1: column 'label': 'Quality'" in capsys.readouterr().err


# ---------------------------------------------------------------- the project's own data files


@requires_data
@pytest.mark.parametrize(
    ("relative", "columns", "rows"),
    [
        ("mrpc/msr_paraphrase_test.txt", "Quality=label,#1 String=sentence1,#2 String=sentence2", 1725),
        ("mrpc/msr_paraphrase_train.txt", "0=label,3=sentence1,4=sentence2", 4076),
        ("banking77/train.csv", "text=text,category=label", 10003),
        ("banking77/test.csv", "text=text,category=label", 3080),
        ("stsb_en/stsb-en-train.csv", None, 5749),
        ("wikiqa/train.txt", "0=sentence1,1=sentence2,2=label", 20360),
        ("senteval_cn/STS-B/STS-B.train.data", None, 5231),
        ("senteval_cn/LCQMC/LCQMC.test.data", "0=sentence1,1=sentence2,2=label", 12500),
        ("csts_zh/OCNLI/dev.txt", "0=sentence1,1=sentence2,2=label", 2950),
        ("atec_original/atec_nlp_sim_train.csv", "1=sentence1,2=sentence2,3=label", 39346),
        ("tnews_subset/dev.json", "sentence=text,label=label", 4928),
        ("scifact/qrels/train.tsv", "query-id=anchor,corpus-id=positive", 919),
    ],
)
def test_shared_data_files_read_as_documented(relative, columns, rows):
    data = read_table(shared_data() / relative, columns=columns)
    assert len(data) == rows


@requires_data
def test_cli_eval_pairs_on_mrpc_and_classification_on_banking77(tmp_path, tiny_model_dir, capsys):
    """The commands of issue #16 on the first rows of the real files (a tiny model keeps it fast)."""
    root = shared_data()
    mrpc = tmp_path / "msr_paraphrase_test.txt"
    mrpc.write_bytes(b"".join((root / "mrpc" / "msr_paraphrase_test.txt").read_bytes().splitlines(True)[:81]))
    code = main(["eval", "pairs", "--model", str(tiny_model_dir), "--data", str(mrpc),
                 "--columns", "Quality=label,#1 String=sentence1,#2 String=sentence2"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    bank = {}
    for split, keep in (("train", range(0, 10003, 50)), ("test", range(0, 3080, 40))):
        lines = (root / "banking77" / f"{split}.csv").read_text(encoding="utf-8").splitlines(True)
        bank[split] = write(tmp_path / f"{split}.csv", lines[0] + "".join(lines[1 + i] for i in keep))
    code = main(["eval", "classification", "--model", str(tiny_model_dir), "--train", str(bank["train"]),
                 "--test", str(bank["test"]), "--columns", "text=text,category=label"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["n_train"] == 201 and result["n_test"] == 77
