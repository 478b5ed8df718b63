"""The notice that a file's texts held control characters (issue #48): one clean line on stderr naming the file,
line, column and character and saying what was done, once per file, without Python's echo of a source line."""

from __future__ import annotations

import logging
import subprocess
import sys

from embforge.data.tables import read_table
from tests.conftest import requires_data, shared_data

# the STS-B training file has one text with a control character (a mis-encoded apostrophe: "Treasury\x12s")
STSB = shared_data() / "stsb_en" / "stsb-en-train.csv"
READ_TWICE = (
    "import sys\n"
    "from embforge.data.sources import SourceOptions, open_source\n"
    "for _ in range(2):\n"
    "    open_source(sys.argv[1], SourceOptions())\n"
)


@requires_data
def test_reading_stsb_says_once_in_one_line_what_was_removed_where():
    run = subprocess.run(
        [sys.executable, "-c", READ_TWICE, str(STSB)], capture_output=True, text=True, timeout=300, check=True
    )
    assert run.stderr.splitlines() == [
        f"{STSB}:2919: column 'sentence1', character 9: control character U+0012 removed "
        "(1 text of this file held control characters; each was removed)"
    ]


def test_the_notice_is_a_log_record_naming_the_place(tmp_path, caplog):
    path = tmp_path / "sts.tsv"
    path.write_text(
        "sentence1\tsentence2\tscore\na cat\ta dog\t1\nthe sun\x07\train\t2\nthe \x1bsky\tsky\t3\n"
    )
    with caplog.at_level(logging.WARNING, logger="embforge.data"):
        data = read_table(path)
    assert data.columns["sentence1"] == ["a cat", "the sun", "the sky"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}:3: column 'sentence1', character 8: control character U+0007 (BELL) removed "
        "(2 texts of this file held control characters; each was removed)"
    ]
