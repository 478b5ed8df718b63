"""Corrupt a real all-MiniLM-L6-v2 training checkpoint in every way a resume must refuse; print what happens.

Trains all-MiniLM-L6-v2 for 2 steps on 16 STS-B train rows (CPU, batch 8, checkpoint at step 2), then, for each
case, copies the run folder, damages it and resumes it to step 3 (``train(..., resume=True)``, what
``embforge train --resume`` runs). Each outcome is the exception's class and message (paths shortened), or
"resumed" with the step it resumed from. For the bit flip it also prints the value an unverified load would have
trained with (issue #15: "the resumed model had 3.4e38 in its word embeddings").

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/checkpoint_corruption.py
"""

from __future__ import annotations

import json
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
from embforge.encoder import Encoder
from embforge.losses import get_loss
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


def cases(ckpt: str) -> list[tuple[str, Callable[[Path], object]]]:
    files = ["model/model.safetensors", "model/config.json", "model/tokenizer.json", "losses.safetensors",
             "trainer_state.pt", "progress.json"]  # fmt: skip
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
        ("checkpoints/ deleted (nothing to resume)", lambda run: shutil.rmtree(run / "checkpoints")),
    ]  # fmt: skip
    return found


def main() -> None:
    rows = read_table(data_root() / "stsb_en" / "stsb-en-train.csv")
    data = rows.subset(range(16))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        run(base, data, steps=2, resume=False)
        print("| damage | outcome on `--resume` |")
        print("|---|---|")
        for label, damage in cases("checkpoints/checkpoint-2"):
            folder = Path(tmp) / "case"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(base, folder)
            note = damage(folder)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    summary = run(folder, data, steps=3, resume=True)
                    events = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
                    start = [e.get("step", 0) for e in events if e.get("event") == "resume"][-1:]
                    outcome = f"trained from step {start[0] if start else 0} to {summary['steps']}"
                except Exception as err:
                    outcome = f"{type(err).__name__}: {str(err).splitlines()[0].split('; ')[0]}"
            outcome = outcome.replace(str(folder) + "/", "").replace(str(folder), "run")
            warned = "; ".join(str(w.message).replace(str(folder) + "/", "").split(" (")[0] for w in caught
                               if "Warning" in type(w.message).__name__ and "Resume" in type(w.message).__name__)  # fmt: skip
            extra = (f" — {note}" if isinstance(note, str) else "") + (
                f" (warning: {warned})" if warned else ""
            )
            print(f"| {label} | {outcome}{extra} |")


if __name__ == "__main__":
    main()
