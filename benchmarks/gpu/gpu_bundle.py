"""``make gpu-bundle``: what the GPU run needs beside the code, in one folder under 64 MiB.

- ``minilm/``: all-MiniLM-L6-v2 (its sentence-transformers folder) with the weights as fp16 safetensors;
- ``data/pairs.json.gz`` (SciFact train+dev (query, abstract) pairs) and ``data/texts.json.gz`` (10,000 texts of
  mixed length to encode: 5,000 STS-B sentences and 5,000 SciFact abstracts);
- ``pylib/``: copies of peft, accelerate and psutil (peft's requirements beyond the GPU image's torch,
  transformers, safetensors, numpy, tqdm, pyyaml) for the LoRA section; the run appends this folder to
  ``sys.path``, so an image that has them uses its own.

The rest of the script's imports are embforge's core (torch, transformers, tokenizers, safetensors, numpy, scipy,
tqdm, huggingface-hub): sentence-transformers itself requires scipy and huggingface-hub, so an image that has it
has them; no pyarrow, datasets or psutil is imported on the run's path.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

LIMIT = 64 * 2**20
PYLIB = ("peft", "accelerate", "psutil")
MODEL_FILES_LEFT_OUT = (
    "model.safetensors",
    "pytorch_model.bin",
    "*.onnx",
    "onnx",
    "openvino",
    "README.md",
    ".git*",
)


def folder_size(folder: Path) -> int:
    """Bytes of every file under ``folder`` (links not followed)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def check_size(folder: Path, limit: int = LIMIT) -> int:
    """``folder``'s size in bytes; a ``ValueError`` naming the largest files when it is over ``limit``."""
    size = folder_size(folder)
    if size > limit:
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)[:5]
        largest = ", ".join(f"{p.relative_to(folder)} ({p.stat().st_size / 2**20:.1f} MiB)" for p in files)
        raise ValueError(
            f"{folder} is {size / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB a GPU run can carry; "
            f"largest: {largest}"
        )
    return size


def collect_data(
    root: str | None = None, *, texts: int = 10_000
) -> tuple[tuple[list[str], list[str]], list[str]]:
    """SciFact (query, abstract) pairs and ``texts`` texts of mixed length (STS-B sentences, SciFact abstracts)."""
    from embforge.data.builtin.scifact import load_scifact
    from embforge.data.paths import data_root
    from embforge.data.retrieval import training_pairs
    from embforge.data.tables import read_table

    scifact = load_scifact("all", root=data_root(root) / "scifact" if root else None)
    pairs = training_pairs(scifact)
    sts = read_table(data_root(root) / "stsb_en" / "stsb-en-train.csv")
    sentences = list(dict.fromkeys(sts.columns["sentence1"] + sts.columns["sentence2"]))
    half = texts // 2
    mixed = [t for pair in zip(sentences[:half], scifact.documents[: texts - half]) for t in pair]
    return (pairs.columns["anchor"], pairs.columns["positive"]), mixed


def read_data(folder: Path) -> tuple[tuple[list[str], list[str]], list[str]]:
    """The bundle's pairs and texts (:func:`collect_data`'s output, as written by :func:`build_bundle`)."""
    pairs = _read_json_gz(folder / "pairs.json.gz")
    return (pairs["anchor"], pairs["positive"]), _read_json_gz(folder / "texts.json.gz")


def build_bundle(out: Path, *, data: str | None = None) -> int:
    """Write the bundle into ``out`` (replaced); returns its size in bytes, checked under :data:`LIMIT`."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _write_model(out / "minilm")
    (anchors, positives), texts = collect_data(data)
    (out / "data").mkdir()
    _write_json_gz(out / "data" / "pairs.json.gz", {"anchor": anchors, "positive": positives})
    _write_json_gz(out / "data" / "texts.json.gz", texts)
    for name in PYLIB:
        _copy_package(name, out / "pylib")
    return check_size(out)


def _write_model(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    from embforge.modeling.resolve import resolve_model_path

    source = resolve_model_path("all-MiniLM-L6-v2")
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(*MODEL_FILES_LEFT_OUT))
    weights = load_file(str(source / "model.safetensors"))
    half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    save_file(half, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _copy_package(name: str, pylib: Path) -> None:
    """Copy an installed package and its ``.dist-info`` (version checks read it), without byte-code."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ValueError(
            f"{name} is not installed here; pip install {name} (the bundle carries a copy of it)"
        )
    package = Path(spec.origin).parent
    shutil.copytree(package, pylib / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "tests"))
    for info in package.parent.glob(f"{name}-*.dist-info"):
        shutil.copytree(info, pylib / info.name)


def _write_json_gz(path: Path, value: Any) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump(value, handle, ensure_ascii=False)


def _read_json_gz(path: Path) -> Any:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)
