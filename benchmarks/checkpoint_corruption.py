"""Corrupt a real all-MiniLM-L6-v2 training checkpoint in every way a resume must refuse; print what happens.

Trains all-MiniLM-L6-v2 for 2 steps on 16 STS-B train rows (CPU, batch 8, checkpoint at step 2; the rows are
written to a CSV file of their own, the training file each checkpoint's ``data.json`` records), then, for each
case, copies the run folder, damages it and resumes it to step 3 (``train(..., resume=True)``, what
``embforge train --resume`` runs). Each outcome is the exception's class and message (paths shortened), or
"trained from step N to M". For the bit flip it also prints the value an unverified load would have trained with
(issue #15: "the resumed model had 3.4e38 in its word embeddings"). The last cases are the run's other checks: the
training file rewritten after the checkpoint, a resume into a folder that holds nothing, and the finished folder
reused without ``--resume`` or ``--overwrite`` (``claim_output``, what ``embforge train`` checks before training).

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/checkpoint_corruption.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embforge.data.paths import data_root
from embforge.data.tables import Dataset, read_table
from embforge.data.writers import write_table
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.artifacts import claim_output
from embforge.training.config import TrainConfig
from embforge.training.loop import train
from embforge.training.tasks import Task

MODEL = "all-MiniLM-L6-v2"
WORD_EMBEDDINGS = "embeddings.word_embeddings.weight"


def run(out: Path, data: Dataset, *, steps: int, resume: bool) -> dict:
    config = TrainConfig(output=str(out), max_steps=steps, batch_size=8, save_every=2, resume=resume, quiet=True,
                         keep_training_state=True, amp="no")  # fmt: skip
    return train(Encoder.load(MODEL), [Task("sts", data, get_loss("cosent"))], config)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def flip_exponent(path: Path) -> str:
    """Set the top exponent bits of word_embeddings[0, 0]: an unverified load trains with a huge value there."""
    data = bytearray(path.read_bytes())
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    start = 8 + struct.unpack("<Q", data[:8])[0] + header[WORD_EMBEDDINGS]["data_offsets"][0]
    before = struct.unpack("<f", data[start : start + 4])[0]
    data[start + 3] = (data[start + 3] & 0x80) | 0x7F  # sign kept, exponent 254: |x| in [1.7e38, 3.4e38)
    data[start + 2] &= 0x7F
    after = struct.unpack("<f", data[start : start + 4])[0]
    path.write_bytes(bytes(data))
    return f"word_embeddings[0, 0]: {before:.4g} -> {after:.4g}"


def rewrite(table: Path) -> None:
    """The training file rewritten after the checkpoint: its first data row dropped."""
    lines = table.read_text(encoding="utf-8").splitlines(keepends=True)
    table.write_text("".join(lines[:1] + lines[2:]), encoding="utf-8")


def cases(ckpt: str, table: Path) -> list[tuple[str, Callable[[Path], object]]]:
    files = ["model/model.safetensors", "model/config.json", "model/tokenizer.json", "losses.safetensors",
             "trainer_state.pt", "progress.json", "data.json"]  # fmt: skip
    found: list[tuple[str, Callable[[Path], object]]] = [("intact", lambda run: None)]
    for name in files:
        found.append((f"{name} truncated to half", lambda run, n=name: truncate(run / ckpt / n)))
        found.append((f"{name} one bit flipped", lambda run, n=name: flip(run / ckpt / n)))
        found.append((f"{name} deleted", lambda run, n=name: (run / ckpt / n).unlink()))
    found += [
        ("word embedding exponent flipped (issue #15)", lambda run: flip_exponent(run / ckpt / files[0])),
        ("progress.json not JSON", lambda run: (run / ckpt / "progress.json").write_text("{step: 2")),
        ("manifest.json not JSON", lambda run: (run / ckpt / "manifest.json").write_text("{")),
        ("no manifest (older embforge), progress.json not JSON",
         lambda run: [(run / ckpt / "manifest.json").unlink(), (run / ckpt / "progress.json").write_text("{")]),
        ("no manifest (older embforge), model truncated",
         lambda run: [(run / ckpt / "manifest.json").unlink(), truncate(run / ckpt / files[0])]),
        ("latest names a missing checkpoint", lambda run: (run / "checkpoints/latest").write_text("checkpoint-99\n")),
        ("latest holds garbage", lambda run: (run / "checkpoints/latest").write_text("\x00\x01")),
        ("latest deleted, checkpoint kept", lambda run: (run / "checkpoints/latest").unlink()),
        ("checkpoints/ deleted, the run finished", lambda run: shutil.rmtree(run / "checkpoints")),
        ("the training file rewritten after the checkpoint", lambda run: rewrite(table)),
        ("an empty run folder (nothing to resume)", lambda run: [shutil.rmtree(run), run.mkdir()]),
        ("the finished run's folder reused without --resume or --overwrite", lambda run: NEW_RUN),
    ]  # fmt: skip
    return found


NEW_RUN = object()  # a case that starts a new run (no --resume) in the folder instead of resuming it


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    rows = read_table(data_root() / "stsb_en" / "stsb-en-train.csv")
    with tempfile.TemporaryDirectory() as tmp:
        table = write_table(rows.subset(range(16)), Path(tmp) / "stsb-16.csv")
        original, stat = table.read_bytes(), table.stat()
        base = Path(tmp) / "base"
        run(base, read_table(table), steps=2, resume=False)
        print("| damage | outcome on `--resume` |")
        print("|---|---|")
        for label, damage in cases("checkpoints/checkpoint-2", table):
            folder = Path(tmp) / "case"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(base, folder)
            note = damage(folder)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    if note is NEW_RUN:
                        claim_output(folder, resume=False, overwrite=False)
                        raise AssertionError("claim_output accepted a folder holding a finished run")
                    summary = run(folder, read_table(table), steps=3, resume=True)
                    events = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
                    start = [e.get("step", 0) for e in events if e.get("event") == "resume"][-1:]
                    outcome = f"trained from step {start[0] if start else 0} to {summary['steps']}"
                except Exception as err:
                    outcome = f"{type(err).__name__}: {str(err).splitlines()[0].split('; ')[0]}"
            if table.read_bytes() != original:  # the next case reads the file the checkpoint recorded
                table.write_bytes(original)
                os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            outcome = outcome.replace(str(folder) + "/", "").replace(str(folder), "run")
            outcome = outcome.replace(str(table), table.name)
            warned = "; ".join(str(w.message).replace(str(folder) + "/", "").split(" (")[0] for w in caught
                               if "Warning" in type(w.message).__name__ and "Resume" in type(w.message).__name__)  # fmt: skip
            extra = (f" — {note}" if isinstance(note, str) else "") + (
                f" (warning: {warned})" if warned else ""
            )
            print(f"| {label} | {outcome}{extra} |")


if __name__ == "__main__":
    main()
