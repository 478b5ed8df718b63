"""The prepared GPU run (benchmarks/gpu) keeps working between GPU sessions: its --cpu --tiny run covers every
section, and its bundle stays under the 64 MiB a GPU machine can carry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
SECTIONS = ("correctness", "train", "mfu", "encode", "decoder")
NO_GPU_WORDS = ("no gpu", "cuda", "not available", "skipped")


@pytest.fixture(scope="module")
def gpu_bundle_module():
    sys.path.insert(0, str(GPU))
    try:
        import gpu_bundle

        yield gpu_bundle
    finally:
        sys.path.remove(str(GPU))


@pytest.mark.slow
def test_cpu_tiny_run_reports_every_section(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(GPU / "run.sh"), str(out), "--cpu", "--tiny", "--bundle", str(tmp_path / "no-bundle")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    assert report["meta"]["mode"] == "tiny" and report["meta"]["torch"]
    for name in SECTIONS:
        section = report["sections"][name]
        if section["status"] == "error":  # only a "no GPU"-type reason is acceptable, never a crash
            assert any(word in section["error"].lower() for word in NO_GPU_WORDS), (name, section["error"])
            continue
        assert section["status"] == "ok" and section["rows"], name
        for row in section["rows"]:  # every row has figures, or says why not in a GPU-only way
            if "error" in row:
                assert any(word in row["error"].lower() for word in NO_GPU_WORDS), (name, row)
    checks = report["sections"]["correctness"]["rows"]
    assert len(checks) == 6 and all(row["pass"] for row in checks), checks
    train = [
        r
        for r in report["sections"]["train"]["rows"]
        if r["library"] in ("embforge", "sentence-transformers")
    ]
    assert len(train) == 6 and all(r["pairs/s"] > 0 and r["MFU %"] >= 0 for r in train), train
    markdown = (out / "gpu.md").read_text()
    assert "| check |" in markdown and "6 × N_non-embedding" in markdown


def test_size_check_names_the_largest_files(tmp_path, gpu_bundle_module):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "weights.bin").write_bytes(b"x" * 3000)
    (tmp_path / "small.txt").write_bytes(b"y" * 100)
    assert gpu_bundle_module.folder_size(tmp_path) == 3100
    assert gpu_bundle_module.check_size(tmp_path, limit=4000) == 3100
    with pytest.raises(ValueError, match=r"over the .* MiB.*a/weights.bin"):
        gpu_bundle_module.check_size(tmp_path, limit=3000)


@pytest.mark.slow
@pytest.mark.integration
def test_the_bundle_is_under_64_mib_and_the_run_reads_it(tmp_path, gpu_bundle_module):
    size = gpu_bundle_module.build_bundle(tmp_path / "bundle")
    assert 30 * 2**20 < size <= gpu_bundle_module.LIMIT == 64 * 2**20  # the model is in it, and it fits
    (anchors, positives), texts = gpu_bundle_module.read_data(tmp_path / "bundle" / "data")
    assert len(anchors) == len(positives) > 500 and len(texts) == 10_000
    assert (tmp_path / "bundle" / "minilm" / "tokenizer.json").is_file()
    for name in gpu_bundle_module.PYLIB:
        assert (tmp_path / "bundle" / "pylib" / name / "__init__.py").is_file()
