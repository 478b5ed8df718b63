"""Property-based tests of the four readers (CSV, TSV, JSONL, Parquet).

* Round trip: any rows (cells with quotes, delimiters, line breaks, unicode; no lone surrogates, no control
  characters but tab and newline) written by :func:`embforge.data.writers.write_table` read back equal.
* A NUL in a text cell is an error naming ``file:line`` and the column; another control character is removed,
  counted in one warning.
* Malformed input (random bytes, noise made of delimiters/quotes/braces, mutated valid files) either reads or
  raises :class:`DataError` whose message starts with ``file:line:`` (Parquet: ``file:``); never another type.

``benchmarks/fuzz_readers.py`` runs the same strategies longer and counts the outcomes.
"""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embforge.data.columns import as_integer
from embforge.data.tables import DataError, Dataset, read_table
from embforge.data.texts import control_character, is_blank
from embforge.data.writers import write_table

FORMATS = ("csv", "tsv", "jsonl", "parquet")
TRICKY = [*",\t\"'\n\r \\{}[]:#=;|\ufeff\u2028\x85\x00\x1céß中😀", "0", "1", ".", "e", "-"]

_any_char = st.characters(exclude_categories=("Cs",))
# a text must have something visible and no control character but tab/newline (data/texts.py): others are errors
cells = st.text(alphabet=st.one_of(st.sampled_from(TRICKY), _any_char), min_size=1, max_size=30).filter(
    lambda s: not is_blank(s) and control_character(s) is None
)
class_names = cells.filter(lambda s: as_integer(s) is None)
scores = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _tsv_safe(text: str) -> bool:
    return not any(c in text for c in "\t\n\r")


@st.composite
def datasets(draw: st.DrawFn, fmt: str) -> Dataset:
    """Rows of one of the standard shapes: scored pairs, triplets, text + int/string label, text only."""
    text = cells.filter(_tsv_safe) if fmt == "tsv" else cells
    names = draw(st.sampled_from([("text", "label:int"), ("text", "label:str"), ("sentence1", "sentence2", "score"),
                                  ("anchor", "positive", "negative_1"), ("text",)]))  # fmt: skip
    n = draw(st.integers(1, 6))
    columns: dict[str, list] = {}
    label_names = None
    for name in names:
        if name == "score":
            columns[name] = draw(st.lists(scores, min_size=n, max_size=n))
        elif name == "label:int":
            columns["label"] = draw(st.lists(st.integers(-5, 10**12), min_size=n, max_size=n))
        elif name == "label:str":
            pool = draw(st.lists(class_names.filter(_tsv_safe) if fmt == "tsv" else class_names, min_size=1,
                                 max_size=3, unique=True))  # fmt: skip
            label_names = sorted(pool)
            columns["label"] = [label_names.index(draw(st.sampled_from(pool))) for _ in range(n)]
        else:
            columns[name] = draw(st.lists(text, min_size=n, max_size=n))
    if label_names is not None:  # the reader indexes the names it sees, in sorted order
        used = sorted({label_names[i] for i in columns["label"]})
        columns["label"] = [used.index(label_names[i]) for i in columns["label"]]
        label_names = used
    return Dataset("generated", columns, list(range(1, n + 1)), label_names)


FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_then_read_round_trips(fmt, tmp_path_factory):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    folder = tmp_path_factory.mktemp(fmt)

    @FUZZ
    @given(data=datasets(fmt))
    def check(data):
        path = write_table(data, folder / f"rows.{fmt}")
        back = read_table(path)
        assert back.columns == data.columns
        assert back.label_names == data.label_names

    check()


CONTROL = st.sampled_from([c for c in map(chr, [*range(32), *range(127, 160)]) if c not in "\t\n\r"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_control_character_is_an_error_or_removed_and_counted(fmt, tmp_path_factory, caplog):
    """A NUL in a text is an error naming ``file:line`` and the column; another control character is
    removed, with one notice naming the first."""
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    folder = tmp_path_factory.mktemp(f"control-{fmt}")
    files = itertools.count()

    @FUZZ
    @given(data=datasets(fmt), row=st.integers(0, 5), at=st.integers(0, 30), char=CONTROL)
    def check(data, row, at, char):
        name = data.text_columns[0]
        row = row % len(data)
        text = data.columns[name][row]
        data.columns[name][row] = text[:at] + char + text[at:]
        path = write_table(data, folder / f"rows{next(files)}.{fmt}")  # a new file: each is noticed once
        place = rf"{re.escape(str(path))}:\d+: column '{name}'"
        if char == "\x00":
            with pytest.raises(DataError, match=rf"^{place}: control character U\+0000"):
                read_table(path)
            return
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="embforge.data"):
            back = read_table(path)
        notice = rf"^{place}, character \d+: control character U\+{ord(char):04X}.* \(1 text of this file"
        assert [bool(re.search(notice, r.getMessage())) for r in caplog.records] == [True]
        assert back.columns[name][row] == text

    check()


def test_tsv_writer_refuses_what_tsv_cannot_hold(tmp_path):
    data = Dataset("x", {"text": ["one\ttwo"]}, [1])
    with pytest.raises(ValueError, match=r"row 1, column 'text' holds a tab"):
        write_table(data, tmp_path / "x.tsv")


# ---------------------------------------------------------------------------------- malformed input


def noise(fmt: str) -> st.SearchStrategy[bytes]:
    """Random bytes, delimiter/quote/brace noise, and valid files with bytes inserted, replaced or cut."""
    tokens = st.one_of(st.sampled_from([*TRICKY, "text", "label", "score", "true", "null", '"a"']), _any_char)
    structured = st.lists(tokens, max_size=120).map(lambda parts: "".join(parts).encode("utf-8"))
    return st.one_of(st.binary(max_size=300), structured, mutated(fmt))


@st.composite
def mutated(draw: st.DrawFn, fmt: str) -> bytes:
    """A valid file with a few random byte edits (insert, replace, delete, truncate)."""
    data = draw(datasets(fmt))
    folder = _scratch()
    raw = bytearray(write_table(data, folder / f"valid.{fmt}").read_bytes())
    for _ in range(draw(st.integers(1, 4))):
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        op = draw(st.sampled_from(["insert", "replace", "delete", "truncate"]))
        byte = draw(st.sampled_from([*b',\t"\n\r{}[]:\\0', 0x00, 0xFF, 0xC3, 0x80]))
        if op == "insert":
            raw.insert(at, byte)
        elif op == "replace":
            raw[at] = byte
        elif op == "delete":
            del raw[at]
        else:
            del raw[at:]
    return bytes(raw)


_SCRATCH: list[Path] = []


def _scratch() -> Path:
    """A folder for the valid files that :func:`mutated` starts from (made on first use, not at import)."""
    if not _SCRATCH:
        import tempfile

        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="embforge-fuzz-")))
    return _SCRATCH[0]


def read_outcome(path: Path) -> tuple[str, str]:
    """``("parsed" | "clear" | "unclear" | "crash", detail)`` of reading ``path``.

    A clear error is a :class:`DataError` starting ``file:line:`` (``file:`` for a whole-file Parquet problem).
    """
    try:
        read_table(path)
    except DataError as err:
        message = str(err)
        located = (
            rf"^{re.escape(str(path))}:(\d+:|\s)"
            if path.suffix == ".parquet"
            else rf"^{re.escape(str(path))}:\d+:"
        )
        return ("clear" if re.match(located, message) else "unclear"), message
    except Exception as err:  # anything else is a crash: the reader let an internal error escape
        return "crash", f"{type(err).__name__}: {err}"
    return "parsed", ""


@pytest.mark.parametrize("fmt", FORMATS)
def test_malformed_input_is_a_data_error_naming_file_and_line(fmt, tmp_path_factory):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    folder = tmp_path_factory.mktemp(f"bad-{fmt}")

    @settings(FUZZ, max_examples=150)
    @given(content=noise(fmt))
    def check(content):
        path = folder / f"input.{fmt}"
        path.write_bytes(content)
        outcome, detail = read_outcome(path)
        assert outcome in ("parsed", "clear"), detail

    check()
