"""Files, written safely and read with errors that say where: atomic writes and JSON Lines.

* :func:`write_bytes_atomic`, :func:`write_text_atomic` and :func:`atomic_dir` write to a temporary name beside the
  target, ``fsync`` it and rename it into place, so a reader (or a run resumed after a crash) sees the old
  content or the new one, never half of one.
* :func:`read_lines` decodes a UTF-8 file line by line; :func:`read_jsonl` reads one JSON object per line. Both
  raise :class:`DataError` naming ``file:line:column`` for invalid UTF-8, broken JSON, duplicate keys and lines
  that are not objects.
* :func:`write_jsonl` and :func:`append_jsonl` write the records :func:`read_jsonl` reads back.

Lines are split on ``\\n`` only (``\\r\\n`` endings are fine): a text holding ``\\u2028`` or ``\\x85``, which
``str.splitlines`` would break, stays one line.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "rows.jsonl"
>>> _ = write_jsonl(path, [{"text": "a\\u2028b"}, {"text": "c"}])
>>> [(line, row["text"]) for line, row in read_jsonl(path)]
[(1, 'a\\u2028b'), (2, 'c')]
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DataError",
    "append_jsonl",
    "atomic_dir",
    "fsync_dir",
    "fsync_tree",
    "read_jsonl",
    "read_lines",
    "write_bytes_atomic",
    "write_jsonl",
    "write_text_atomic",
]

BOM = "\ufeff"


class DataError(ValueError):
    """A problem in an input file; the message starts with ``file:line:`` (``file:line:column:`` where known)."""


# ------------------------------------------------------------------------------------------------- writing


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename it into place."""
    path = Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically: readers see the old content or the new one."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def atomic_dir(final: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_dir)`` and move the finished folder to ``final`` so readers never see a half-written one.

    An existing ``final`` is swapped out only after the new folder is complete (and ``fsync``-ed).
    """
    final = Path(final)
    tmp = final.with_name(final.name + ".tmp")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """``fsync`` every file under ``root`` (then its folders), so a rename after it publishes complete data."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:  # some systems cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _jsonl_line(record: object, *, allow_nan: bool) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=allow_nan) + "\n"


def write_jsonl(path: str | os.PathLike, records: Iterable[object]) -> Path:
    """Write one JSON value per line (UTF-8, non-ASCII kept), atomically. NaN/infinity are refused."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, "".join(_jsonl_line(r, allow_nan=False) for r in records))


def append_jsonl(path: str | os.PathLike, record: object) -> None:
    """Append one record as a line (a log such as ``metrics.jsonl``); the line is written with one call.

    A NaN metric is written as ``NaN`` (which Python's ``json`` and :func:`read_jsonl` read back) rather than
    failing the run that logs it.
    """
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(_jsonl_line(record, allow_nan=True))


# ------------------------------------------------------------------------------------------------- reading


def read_lines(
    path: str | os.PathLike, skip: Callable[[DataError], None] | None = None
) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a UTF-8 file, line ending kept, a leading BOM dropped.

    Args:
        path: The file.
        skip: When given, an undecodable line's error is handed to it and the line left out; else it is raised.

    Raises:
        DataError: ``file:line:column: invalid UTF-8 (byte 0x..)`` at the first undecodable byte (no ``skip``).
    """
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
                bad = raw[err.start : err.start + 1].hex()
                error = DataError(
                    f"{path}:{number}:{column}: invalid UTF-8 (byte 0x{bad}); save the file as UTF-8"
                )
                if skip is None:
                    raise error from None
                skip(error)
                continue
            if number == 1 and text.startswith(BOM):
                text = text[1:]
            yield number, text


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    record: dict[str, object] = {}
    for key, value in pairs:
        if key in record:
            raise _DuplicateKey(key)
        record[key] = value
    return record


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON Lines file.

    Raises:
        DataError: naming ``file:line:column`` for invalid UTF-8, invalid JSON, a duplicate key (the last one
            would silently win otherwise) and a line that is not a JSON object.
    """
    for number, text in read_lines(path):
        if not text.strip():
            continue
        try:
            record = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{path}:{number}:{err.colno}: invalid JSON ({err.msg}); each line must be one JSON object"
            ) from None
        except _DuplicateKey as err:
            column = _key_column(text, err.key)
            raise DataError(
                f"{path}:{number}:{column}: duplicate key {err.key!r} in one JSON object (the last one "
                "would silently win); keep one"
            ) from None
        except RecursionError:
            raise DataError(f"{path}:{number}:1: JSON nested too deeply") from None
        if not isinstance(record, dict):
            raise DataError(
                f"{path}:{number}:1: expected a JSON object, found {type(record).__name__}; a JSON Lines file "
                "holds one object per line"
            )
        yield number, record


def _key_column(text: str, key: str) -> int:
    """Column of the second occurrence of ``"key"`` in a line (1 when it cannot be found)."""
    quoted = json.dumps(key)
    first = text.find(quoted)
    second = text.find(quoted, first + 1) if first >= 0 else -1
    return second + 1 if second >= 0 else 1
