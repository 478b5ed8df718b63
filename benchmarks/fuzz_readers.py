"""Fuzz the four table readers (CSV, TSV, JSONL, Parquet) and count what happens.

For each format, ``--examples`` malformed inputs (random bytes, delimiter/quote/brace noise, valid files with
random byte edits; the strategies of ``tests/data/test_tables_fuzz.py``) are read with ``read_table`` and sorted into:

* parsed: the input happened to be a valid table (counted again under "noticed" when the reader logged a notice
  on logger ``embforge.data``, e.g. control characters removed: counted, not printed; each input is a new file,
  as a file is noticed once per contents);
* clear: a ``DataError`` whose message starts ``file:line:`` (Parquet: ``file:``);
* unclear: a ``DataError`` without that location;
* crash: any other exception (the reader let an internal error escape).

Then ``--examples`` random tables are written with ``write_table`` and read back (round trips equal / not).
Prints a Markdown table and one example message per outcome. Hypothesis is seeded, so a run repeats.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/fuzz_readers.py --examples 2000 --seed 0
"""

from __future__ import annotations

import argparse
import collections
import itertools
import logging
import re
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embforge.data.tables import read_table
from embforge.data.writers import write_table
from tests.data.test_tables_fuzz import FORMATS, datasets, noise, read_outcome


def kind(message: str, path: Path) -> str:
    """An error message without its location and specifics: ``invalid UTF-8 (byte 0x…)``."""
    text = re.sub(rf"^{re.escape(str(path))}:(\d+:)*\s*", "", message)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"(?<!UTF-)\b\d+(\.\d+)?\b", "N", re.sub(r"0x[0-9a-f]{2}", "0x..", text))
    return text.split(";")[0][:90]


class Notices(logging.Handler):
    """Counts the records of logger ``embforge.data`` (the readers' notices) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def fuzz(
    fmt: str, examples: int, rng_seed: int, folder: Path
) -> tuple[collections.Counter, collections.Counter]:
    counts: collections.Counter = collections.Counter()
    samples: collections.Counter = collections.Counter()
    options = settings(
        max_examples=examples,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    names = itertools.count()
    notices = Notices()
    logger = logging.getLogger("embforge.data")
    logger.addHandler(notices)  # a handler of its own: nothing reaches stderr

    @options
    @seed(rng_seed)
    @given(content=noise(fmt))
    def malformed(content: bytes) -> None:
        path = folder / f"input{next(names)}.{fmt}"
        path.write_bytes(content)
        before = notices.count
        outcome, detail = read_outcome(path)
        path.unlink()
        counts[outcome] += 1
        counts["noticed"] += outcome == "parsed" and notices.count > before
        if outcome != "parsed":
            samples[f"{outcome}: {kind(detail, path)}"] += 1

    @options
    @seed(rng_seed)
    @given(data=datasets(fmt))
    def round_trip(data) -> None:
        path = folder / f"rows{next(names)}.{fmt}"
        before = notices.count
        back = read_table(write_table(data, path))
        path.unlink()
        counts["round trip noticed"] += notices.count > before
        same = back.columns == data.columns and back.label_names == data.label_names
        counts["round trip equal" if same else "round trip differs"] += 1

    try:
        malformed()
        round_trip()
    finally:
        logger.removeHandler(notices)
    return counts, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--examples", type=int, default=2000, help="inputs per format and kind (default 2000)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    columns = ["parsed", "clear", "unclear", "crash", "round trip equal", "round trip differs"]
    print(
        "| format | malformed inputs tried | parsed | of which noticed | clear errors | unclear errors | crashes "
        "| round trips | equal | round trips noticed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    all_samples = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            counts, samples = fuzz(fmt, args.examples, args.seed, Path(tmp))
            tried = sum(counts[c] for c in columns[:4])
            trips = counts["round trip equal"] + counts["round trip differs"]
            print(f"| {fmt} | {tried} | {counts['parsed']} | {counts['noticed']} | {counts['clear']} | "
                  f"{counts['unclear']} | {counts['crash']} | {trips} | {counts['round trip equal']} | "
                  f"{counts['round trip noticed']} |")  # fmt: skip
            all_samples[fmt] = samples
    print()
    for fmt, samples in all_samples.items():
        top = ", ".join(f"{text} ({n})" for text, n in samples.most_common(6))
        print(f"- {fmt}: {top}")


if __name__ == "__main__":
    main()
