"""What a text may hold: the one rule of the file readers (:mod:`embforge.data.tables`) and the server.

* **Empty**: a text with nothing visible — only whitespace (spaces, tabs, newlines, no-break and ideographic
  spaces) and zero-width or invisible format characters (U+200B-U+200D, U+2060, U+FEFF, U+00AD, U+180E) — is
  empty. Files: an error naming ``file:line`` and the column; server: a 422 naming the field and index.
  Embedding it would give a vector of the special tokens alone, the same for every such text.
* **Control characters**: a NUL (U+0000) in a text is an error naming the place: it marks a binary file or a
  UTF-16 file read as UTF-8, not text. Other control characters (U+0001-U+001F and U+007F-U+009F but tab, line
  feed and carriage return) are removed, as BERT's tokenizer would drop them, and the reader says so in one line
  (logger ``embforge.data``) once per file, with their count and the first place (real data has a few: STS-B train
  holds one U+0012 for an apostrophe).

>>> is_blank(" \\u200b\\t"), is_blank("a\\u200bcat")
(True, False)
>>> control_character("a\\tcat\\x12"), control_character("a cat"), replace_controls("it\\x12s")
(5, None, 'its')
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

from embforge.files import DataError

_BLANK = re.compile(r"[\s\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def is_blank(text: str) -> bool:
    """Whether ``text`` holds nothing visible (see the module docstring)."""
    return _BLANK.fullmatch(text) is not None


def control_character(text: str) -> int | None:
    """Position of the first control character other than tab, LF and CR in ``text``, or ``None``."""
    found = _CONTROL.search(text)
    return found.start() if found else None


def replace_controls(text: str) -> str:
    """``text`` without its control characters other than tab, LF and CR."""
    return _CONTROL.sub("", text)


log = logging.getLogger("embforge.data")
_SAID: set[tuple[str, int, int, str]] = set()  # (file, size, mtime, notice): each said once per process


class ControlCharacters:
    """The control characters of one file's texts: a NUL is an error, others are removed and counted;
    :meth:`warn` says how many and where the first was, in one line."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.texts = 0
        self.first: str | None = None

    def clean(self, text: str, *, line: int, column: str) -> str:
        """``text`` with its control characters replaced (a NUL: :class:`DataError` naming the place)."""
        position = control_character(text)
        if position is None:
            return text
        place = f"{self.path}:{line}: column {column!r}"
        if "\x00" in text:
            raise DataError(
                f"{place}: control character {describe_control(text, text.index(chr(0)))}: a NUL byte is not text "
                "(a binary file, or UTF-16 read as UTF-8?); save the file as UTF-8 text without NUL bytes"
            )
        self.texts += 1
        if self.first is None:
            char = text[position]
            name = unicodedata.name(char, "") or _CONTROL_NAMES.get(ord(char))
            described = f"U+{ord(char):04X}" + (f" ({name})" if name else "")
            self.first = f"{place}, character {position + 1}: control character {described}"
        return replace_controls(text)

    def warn(self) -> None:
        """Log (logger ``embforge.data``, level WARNING: one line on stderr when logging is not set up) where the
        first control character was and that every one was removed; once per file and contents per process, not
        on every read of it (a run reads a file in several stages). A log record, not a Python warning: a warning
        prints the source line of its caller, which tells the reader of a data file nothing."""
        if not self.texts:
            return
        texts = "1 text of this file" if self.texts == 1 else f"{self.texts} texts of this file"
        notice = f"{self.first} removed ({texts} held control characters; each was removed)"
        try:
            stat = Path(self.path).stat()
            key = (str(self.path), stat.st_size, stat.st_mtime_ns, notice)
        except OSError:
            key = (str(self.path), -1, -1, notice)
        if key not in _SAID:
            _SAID.add(key)
            log.warning(notice)


def describe_control(text: str, position: int) -> str:
    """``U+0000 (NULL) at character 5`` (1-based, as an editor counts) for the character at ``position``."""
    char = text[position]
    name = unicodedata.name(char, "") or _CONTROL_NAMES.get(ord(char), "control character")
    return f"U+{ord(char):04X} ({name}) at character {position + 1}"


_CONTROL_NAMES = {0: "NULL", 7: "BELL", 8: "BACKSPACE", 0x1B: "ESCAPE", 0x7F: "DELETE"}
