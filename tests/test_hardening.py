"""The last silent paths and a newcomer's stumbles: each test here failed on the code before its fix.

Checkpoints with non-finite values are refused, a finished run knows it finished (and its clean-up survives a
kill), control characters and invisible-only texts are errors, a folder that is not a model says so, two
``Authorization`` headers are refused, ``train`` checks its inputs before it loads a model and groups its help,
``best/`` and a pipeline's ``final/`` hold no second copy of the weights, ``curate --consistency`` says when it
cannot remove anything, model files honour the umask, and the HTML report names the run by a relative path.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embforge.cli import build_parser, main
from embforge.data.tables import read_table
from embforge.encoder import Encoder
from embforge.files import DataError
from embforge.losses import LOSSES
from embforge.losses.cross import CROSS_LOSSES
from embforge.training import artifacts
from embforge.training.checkpoints import CheckpointError, ResumeWarning, _write_manifest, load_trainer_state
from tests.conftest import free_port, train_sts

ROOT = Path(__file__).resolve().parents[1]


def _train(out, model_dir, csv, *, steps=4, save_every=2, **fields):
    return train_sts(
        out, model_dir, csv, max_steps=steps, save_every=save_every, keep_checkpoints=2, **fields
    )


def _rewrite_manifest(checkpoint: Path) -> None:
    """What a buggy writer would leave: files and a manifest that agree with each other."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "manifest.json").unlink()
    _write_manifest(checkpoint, run_id=manifest["run_id"], step=manifest["step"])


# ------------------------------------------------------------------------------ 1: non-finite checkpoints


@pytest.mark.parametrize("value", [float("nan"), 3.4e38, float("inf")])
def test_a_checkpoint_with_non_finite_weights_is_refused_by_name(tmp_path, tiny_model_dir, sts_csv, value):
    out = tmp_path / "run"
    _train(out, tiny_model_dir, sts_csv)
    checkpoint = out / "checkpoints" / "checkpoint-4"
    weights_file = checkpoint / "model" / "model.safetensors"
    weights = load_file(str(weights_file))
    name = next(k for k in weights if k.endswith("query.weight"))
    weights[name][0, 0] = value
    save_file(weights, str(weights_file), metadata={"format": "pt"})
    _rewrite_manifest(checkpoint)
    with pytest.raises(CheckpointError, match=r"checkpoint-4.*(non-finite|overflow).*checkpoint-2"):
        load_trainer_state(checkpoint)
    with pytest.raises(CheckpointError, match="checkpoint-4"):  # not a FloatingPointError steps later
        _train(out, tiny_model_dir, sts_csv, steps=6, resume=True)


def test_a_checkpoint_with_a_non_finite_optimiser_state_is_refused(tmp_path, tiny_model_dir, sts_csv):
    out = tmp_path / "run"
    _train(out, tiny_model_dir, sts_csv)
    checkpoint = out / "checkpoints" / "checkpoint-4"
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=True)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"].view(-1)[0] = float("inf")
    torch.save(state, checkpoint / "trainer_state.pt")
    _rewrite_manifest(checkpoint)
    with pytest.raises(CheckpointError, match=r"trainer_state.pt.*non-finite.*checkpoint-2"):
        load_trainer_state(checkpoint)


# ------------------------------------------------------------------------------ 2: a finished run finishes


class Killed(BaseException):
    """What a SIGKILL in the middle of a call looks like to the code after it: nothing more runs."""


_rmtree = shutil.rmtree


def _kill_midway(path, *args, **kwargs):
    """rmtree of the checkpoints folder killed half-way: every checkpoint and the pointer gone, the run file still
    there (any other folder is removed as usual)."""
    path = Path(path)
    if not (path / "run.json").exists():
        return _rmtree(path, *args, **kwargs)
    for child in path.iterdir():
        if child.name != "run.json":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    raise Killed(str(path))


def test_a_kill_during_the_clean_up_leaves_a_run_that_resumes_to_nothing(
    tmp_path, tiny_model_dir, sts_csv, monkeypatch
):
    out = tmp_path / "run"
    monkeypatch.setattr(artifacts.shutil, "rmtree", _kill_midway)
    with pytest.raises(Killed):
        _train(out, tiny_model_dir, sts_csv, keep_training_state=False)
    monkeypatch.undo()
    weights = (out / "model.safetensors").read_bytes()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)  # no "nothing to resume, training starts at step 0"
        summary, _ = _train(out, tiny_model_dir, sts_csv, resume=True, keep_training_state=False)
    assert summary["nothing_to_do"] is True and summary["steps"] == 4
    assert (out / "model.safetensors").read_bytes() == weights  # not trained again from step 0
    assert (out / "metrics.jsonl").read_text().splitlines()[: len(lines)] == lines
    assert not [
        json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()[len(lines) :] if "loss" in x
    ]
    assert not (out / "checkpoints").exists()  # the interrupted clean-up is completed
    assert sorted(p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp"))) == []


def test_resume_of_a_finished_run_exits_0_saying_there_is_nothing_to_do(
    tmp_path, tiny_model_dir, sts_csv, capsys
):
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model_dir), "--train", str(sts_csv), "--output", str(out)]
    args += ["--max-steps", "2", "--batch-size", "8", "--save-every", "1", "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    captured = capsys.readouterr()
    assert "nothing to do" in captured.err
    assert json.loads(captured.out.splitlines()[-1])["nothing_to_do"] is True
    # a new run (no --resume) in the same folder trains again once told to delete the finished one
    assert main([*args[:-1], "--overwrite"]) == 0
    assert "nothing to do" not in capsys.readouterr().err


# ------------------------------------------------------------------------------ 3 and 5: what a text may hold


def test_a_nul_byte_in_a_text_is_an_error_naming_its_place(tmp_path):
    path = tmp_path / "sts.csv"
    path.write_text("a cat,a d\x00og,3.0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"sts.csv:1: column 'sentence2'.* U\+0000 .*character 4.*UTF-8"):
        read_table(path)


@pytest.mark.parametrize(
    ("name", "content", "where", "column", "text"),
    [
        (
            "sts.tsv",
            "sentence1\tsentence2\tscore\na cat\ta dog\t1\nthe sun\x07\train\t2\n",
            r"sts.tsv:3: column 'sentence1', character 8: control character U\+0007 \(BELL\) removed \(1 text",
            "sentence1",
            "the sun",
        ),
        (
            "pairs.jsonl",
            '{"anchor": "a cat", "positive": "a \\u001b[31mdog\\u0012s"}\n',
            r"pairs.jsonl:1: column 'positive', character 3: control character U\+001B \(ESCAPE\) removed \(1 text",
            "positive",
            "a [31mdogs",
        ),
    ],
)
def test_other_control_characters_are_replaced_counted_and_named(
    tmp_path, caplog, name, content, where, column, text
):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="embforge.data"):
        data = read_table(path)
    assert len(caplog.records) == 1 and re.search(where, caplog.records[0].getMessage())
    assert text in data.columns[column]


def test_tab_and_newline_inside_a_text_are_allowed(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"anchor": "a\\tcat", "positive": "a dog\\non the road"}\n', encoding="utf-8")
    assert read_table(path).columns["positive"] == ["a dog\non the road"]


def test_eval_with_a_nul_byte_in_a_sentence_fails(tmp_path, tiny_model_dir, capsys):
    data = tmp_path / "sts.csv"
    data.write_text("a cat,a dog,3.0\nthe s\x00un,rain,1.0\n", encoding="utf-8")
    assert main(["eval", "sts", "--model", str(tiny_model_dir), "--data", str(data)]) == 2
    assert "sts.csv:2" in capsys.readouterr().err


INVISIBLE = ["   ", "\u200b\u200b", " \u2060\ufeff\t"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_an_invisible_only_text_is_empty_in_a_file(tmp_path, text):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"anchor": "a cat", "positive": text}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"pairs.jsonl:1: column 'positive': empty text"):
        read_table(path)


@pytest.mark.parametrize("text", INVISIBLE)
def test_an_invisible_only_text_is_a_422_at_the_server(tiny_encoder, text):
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    with TestClient(create_app(tiny_encoder, config=ServeConfig(max_wait_ms=1))) as client:
        reply = client.post("/v1/embeddings", json={"input": ["a cat", text]})
        assert reply.status_code == 422, reply.text
        assert reply.json()["error"]["param"] == "input[1]"
        assert "empty" in reply.json()["error"]["message"]
        assert client.post("/v1/embeddings", json={"input": "a\u200bcat"}).status_code == 200


# ------------------------------------------------------------------------------ 4: not a model folder


@pytest.mark.parametrize("folder", ["empty", "/etc"])
def test_a_folder_that_is_not_a_model_says_so(tmp_path, folder):
    path = tmp_path / folder if folder == "empty" else Path(folder)
    path.mkdir(exist_ok=True)
    expected = r"not a model folder: no config.json / modules.json in .*; expected a sentence-transformers"
    with pytest.raises(FileNotFoundError, match=expected):
        Encoder.load(path)


def test_the_cli_says_not_a_model_folder(tmp_path, sts_csv, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["eval", "sts", "--model", str(tmp_path / "empty"), "--data", str(sts_csv)]) == 2
    err = capsys.readouterr().err
    assert "not a model folder" in err and "sentencepiece" not in err


# ------------------------------------------------------------------------------ 6: two Authorization headers


def test_two_authorization_headers_are_a_400(tiny_encoder):
    from fastapi.testclient import TestClient

    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    app = create_app(tiny_encoder, config=ServeConfig(api_key="k", max_wait_ms=1))
    with TestClient(app) as client:
        body = {"input": "a cat"}
        good = [("authorization", "Bearer k")]
        assert client.post("/v1/embeddings", json=body, headers=good).status_code == 200
        for second in ("Bearer k", "Bearer wrong"):
            twice = [("authorization", "Bearer k"), ("authorization", second)]
            reply = client.post("/v1/embeddings", json=body, headers=twice)
            assert reply.status_code == 400, reply.text
            assert reply.json()["error"]["param"] == "authorization"
            assert "more than one" in reply.json()["error"]["message"]


# ------------------------------------------------------------------------------ 7: SIGTERM exits 0


def test_serve_exits_0_after_a_graceful_sigterm(tiny_model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "embforge", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[1].decode()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    assert reply.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/embeddings",
            data=b'{"input": "a cat"}',
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err.decode()[-3000:]


# ------------------------------------------------------------------------------ 10: make main without data


def test_make_main_without_the_data_folder_ends_with_one_clear_message(tmp_path):
    if shutil.which("make") is None or not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("needs make and the project's .venv")
    missing = tmp_path / "no-such-data"
    done = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "main", f"DATA={missing}", f"RUN={tmp_path}/runs/x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert "Traceback" not in text and "does not exist" not in text, text
    assert str(missing) in text and "EMBFORGE_DATA" in text, text
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------ 13, 14: train's arguments


def _train_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return verbs.choices["train"]


def test_train_help_is_grouped_with_meaningful_placeholders_and_every_choice():
    parser = _train_parser()
    titles = [group.title for group in parser._action_groups]
    for title in ("data", "model", "loss", "optimisation", "scale", "evaluation", "output"):
        assert title in titles, titles
    text = parser.format_help()
    for placeholder in ("TRAIN", "CONFIG_FLAG", "LOSS ", "AMP", "OUTPUT", "EPOCHS", "MODEL_TYPE"):
        assert f" {placeholder}" not in text, placeholder
    loss_help = " ".join(parser._option_string_actions["--loss"].help.split())
    assert [name for name in sorted(set(LOSSES) | set(CROSS_LOSSES)) if name not in loss_help] == []
    assert parser._option_string_actions["--amp"].choices
    assert parser._option_string_actions["--mine-method"].choices
    options = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    undocumented = [
        a.option_strings[0] for a in options if a.default is None and "default" not in (a.help or "")
    ]
    flags = ("--help", "--version", "--config", "--train", "--eval", "--resume", "--quiet", "--loss-option")
    assert [f for f in undocumented if f not in flags] == []


def _model_must_not_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(Encoder, "load", refuse)
    monkeypatch.setattr("embforge.cross_encoder.CrossEncoder.load", refuse)


def test_train_reports_a_misspelt_loss_without_loading_the_model(tmp_path, sts_csv, monkeypatch, capsys):
    _model_must_not_load(monkeypatch)
    config = tmp_path / "run.toml"
    config.write_text(f'train = ["{sts_csv}"]\nloss = "cosnet"\n')
    assert main(["train", str(config), "--output", str(tmp_path / "out")]) == 2
    assert "unknown loss 'cosnet'" in capsys.readouterr().err
    assert main(["train", "--train", str(sts_csv), "--loss", "cosnet", "--output", str(tmp_path / "o")]) == 2
    assert "unknown loss 'cosnet'" in capsys.readouterr().err


def test_train_reports_a_missing_file_without_loading_the_model(tmp_path, sts_csv, monkeypatch, capsys):
    _model_must_not_load(monkeypatch)
    out = str(tmp_path / "out")
    assert main(["train", "--train", str(tmp_path / "nope.csv"), "--output", out]) == 2
    assert "nope.csv" in capsys.readouterr().err
    assert main(["train", "--train", str(sts_csv), "--eval", str(tmp_path / "dev.csv"), "--output", out]) == 2
    assert "dev.csv" in capsys.readouterr().err
    assert (
        main(["train", "--model-type", "cross", "--train", str(sts_csv), "--loss", "simcse", "--output", out])
        == 2
    )
    assert "cross-encoder loss 'simcse'" in capsys.readouterr().err


# ------------------------------------------------------------------------------ 15: one copy of the weights


def test_a_pipelines_final_model_is_not_a_second_copy(tmp_path, tiny_model_dir, sts_csv):
    from embforge.training.pipeline import load_pipeline, run_pipeline

    (tmp_path / "pipe.toml").write_text(
        f'model = "{tiny_model_dir}"\n[defaults]\nbatch_size = 8\nsave_every = 0\nquiet = true\n'
        f'[[stages]]\nname = "sts"\nsteps = 2\n  [[stages.tasks]]\n  name = "sts"\n  data = "{sts_csv}"\n'
        '  loss = "cosent"\n'
    )
    result = run_pipeline(load_pipeline(tmp_path / "pipe.toml"), output=str(tmp_path / "out"))
    final = Path(result["final"]) / "model.safetensors"
    stage = next((tmp_path / "out").glob("stage-1-*")) / "model.safetensors"
    assert final.stat().st_ino == stage.stat().st_ino
    np.testing.assert_allclose(
        Encoder.load(final.parent).encode(["a cat"]), Encoder.load(stage.parent).encode(["a cat"])
    )


# ------------------------------------------------------------------------------ 16: curate --consistency


def test_curate_consistency_warns_when_the_file_has_no_more_candidates_than_top_k(
    tmp_path, tiny_model_dir, capsys
):
    data = tmp_path / "pairs.jsonl"
    rows = [
        ("a cat runs", "a dog runs"),
        ("the stock market", "oil price falls"),
        ("a man sings", "a woman reads"),
    ]
    data.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows))
    args = ["curate", "--data", str(data), "--output", str(tmp_path / "kept.jsonl"), "--near", "none"]
    args += ["--report", str(tmp_path / "report.json"), "--consistency", "--model", str(tiny_model_dir)]
    with pytest.warns(UserWarning, match=r"3 candidate texts.*--top-k 10"):
        assert main(args) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert "consistency_skipped" in json.dumps(report)


def test_curate_help_shows_the_top_k_default():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "(default 10" in " ".join(verbs.choices["curate"].format_help().split())


# ------------------------------------------------------------------------------ 17: minor


def test_saved_weights_honour_the_umask(tmp_path, tiny_encoder):
    old = os.umask(0o022)
    try:
        tiny_encoder.save(tmp_path / "m")
    finally:
        os.umask(old)
    assert (tmp_path / "m" / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_gradient_checkpointing_uses_the_current_api(tiny_encoder):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        tiny_encoder.gradient_checkpointing(True)
        tiny_encoder.gradient_checkpointing(False)


def test_the_report_names_the_run_by_a_relative_path(tmp_path, tiny_model_dir, sts_csv, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _train(Path("run"), tiny_model_dir, sts_csv, steps=2, save_every=0)
    assert main(["report", "run"]) == 0
    html = (tmp_path / "run" / "report.html").read_text()
    assert str(tmp_path) not in html
