"""Training from memory-mapped and streamed data (embforge/data/sources.py): the same batches and weights as the
in-memory path, exact resume of a streamed run, disjoint rows per rank, bad rows reported where the stream
reaches them."""

from __future__ import annotations

import functools
import json
import os
import random

import pytest
import torch

from embforge.data.sources import SourceOptions, StreamSource, hub_rows, open_source, row_count
from embforge.data.tables import DataError, Dataset
from embforge.encoder import Encoder
from embforge.losses import get_loss
from embforge.training.batches import TextKeys
from embforge.training.checkpoints import CheckpointError
from embforge.training.config import TrainConfig
from embforge.training.distributed import rank_rows
from embforge.training.loop import train
from embforge.training.run import RunSpec, build_tasks
from embforge.training.sampling import TaskPlan, epoch_plan
from embforge.training.state import Progress
from embforge.training.tasks import Task, prepare
from tests.conftest import WORDS as VOCABULARY
from tests.conftest import assert_same_weights

pytest.importorskip("datasets")

WORDS = VOCABULARY[:20]  # a small vocabulary: texts repeat


def pair_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` anchor/positive rows from the tiny vocabulary, some texts repeated (distinct batches matter)."""
    rnd = random.Random(seed)
    rows = []
    for _ in range(n):
        anchor = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 6)))
        rows.append({"anchor": anchor, "positive": anchor + " " + rnd.choice(WORDS)})
    for i in range(0, n, 7):  # duplicates: a batch must not hold the same text twice
        rows[i]["anchor"] = rows[0]["anchor"]
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def pairs(tmp_path):
    return write_jsonl(tmp_path / "pairs.jsonl", pair_rows(300))


def sources(path, tmp_path, window):
    memory = open_source(path, SourceOptions(mode="memory"))
    mmap = open_source(path, SourceOptions(mode="mmap", cache_dir=str(tmp_path / "cache")))
    stream = open_source(path, SourceOptions(mode="stream", window=window))
    return {"memory": memory, "mmap": mmap, "stream": stream}


def plan_batches(source, window, *, epoch=0):
    keys = TextKeys(source, source.text_columns)
    counts = None if row_count(source) is not None else [lambda s, e: len(source.rows(s, e)["anchor"])]
    plan = TaskPlan(
        [row_count(source)], 16, seed=3, epoch=epoch, distinct=[keys], windows=[window], counts=counts
    )
    progress = Progress()
    batches = []
    while progress.position < len(plan):
        rows = plan.take(progress, [1.0]).rows
        batches.append((rows, source.take(rows)["anchor"]))
    return batches


def test_the_three_modes_plan_the_same_batches(pairs, tmp_path):
    found = {name: plan_batches(s, 64) for name, s in sources(pairs, tmp_path, 64).items()}
    assert found["memory"] == found["mmap"] == found["stream"]
    rows = sorted(r for batch, _ in found["stream"] for r in batch)
    assert rows == list(range(300))  # every row once per epoch
    for _, texts in found["stream"]:
        assert len(set(texts)) == len(texts)  # no text twice in a batch
    # without a window, memory-mapped rows are shuffled whole, as in memory
    mmap = open_source(pairs, SourceOptions(mode="mmap", cache_dir=str(tmp_path / "cache")))
    memory = open_source(pairs, SourceOptions(mode="memory"))
    assert plan_batches(mmap, None) == plan_batches(memory, None)


def test_a_stream_is_read_a_window_at_a_time(pairs):
    stream = open_source(pairs, SourceOptions(mode="stream", window=64))
    assert isinstance(stream, StreamSource) and row_count(stream) is None
    plan_batches(stream, 64)
    assert stream.windows_read == 5  # 300 rows: 4 full windows and one of 44, each read once
    assert row_count(stream) == 300  # known once the stream has ended


def test_a_stream_that_ends_at_a_window_end_is_read_to_its_end_once(tmp_path):
    """256 rows in windows of 64: the window after the last one is empty, which ends the epoch after the 256 rows."""
    path = write_jsonl(tmp_path / "even.jsonl", [{"anchor": f"{r['anchor']} {i}", "positive": r["positive"]}
                                                   for i, r in enumerate(pair_rows(256))])  # fmt: skip
    stream = open_source(path, SourceOptions(mode="stream", window=64))
    batches = plan_batches(stream, 64)
    assert sorted(r for rows, _ in batches for r in rows) == list(range(256)) and row_count(stream) == 256


def train_run(path, tmp_path, model_dir, mode, *, out, stop_at=None, resume=False, save_every=2, max_steps=6):
    options = SourceOptions(mode=mode, window=64, cache_dir=str(tmp_path / "cache"))
    config = TrainConfig(
        output=str(out),
        max_steps=max_steps,
        batch_size=16,
        shuffle_window=64,
        save_every=save_every,
        resume=resume,
        quiet=True,
    )

    def on_step(step):
        if step == stop_at:
            raise KeyboardInterrupt

    model = Encoder.load(model_dir)
    train(model, [Task("pairs", open_source(path, options), get_loss("infonce"))], config, on_step=on_step)
    return Encoder.load(out).state_dict()


def test_streamed_and_memory_mapped_training_give_the_in_memory_weights(pairs, tmp_path, tiny_model_dir):
    memory = train_run(pairs, tmp_path, tiny_model_dir, "memory", out=tmp_path / "memory")
    for mode in ("mmap", "stream"):
        assert_same_weights(memory, train_run(pairs, tmp_path, tiny_model_dir, mode, out=tmp_path / mode))
    start = Encoder.load(tiny_model_dir).state_dict()
    assert any(not torch.equal(start[k], memory[k]) for k in start)  # it trained


@pytest.mark.parametrize("mode", ["memory", "mmap", "stream"])
def test_an_interrupted_run_resumes_to_the_same_weights_in_every_data_mode(
    pairs, tmp_path, tiny_model_dir, mode
):
    """Stopped after step 27 of 30 and resumed from checkpoint-25: the same weights as the uninterrupted run, bit
    for bit. The epoch has 43 batches in windows of 64 rows (the repeated texts make short batches), and
    checkpoint-25 is in the third window: past what a plan made afresh knows of the epoch before it re-cuts the
    windows already used."""
    run = functools.partial(train_run, pairs, tmp_path, tiny_model_dir, mode, max_steps=30, save_every=5)
    full = run(out=tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(out=tmp_path / "cut", stop_at=27)
    assert (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip() == "checkpoint-25"
    resumed = run(out=tmp_path / "cut", resume=True)
    assert_same_weights(full, resumed)


@pytest.mark.parametrize("mode", ["memory", "mmap", "stream"])
def test_a_resume_whose_training_data_changed_is_refused_naming_the_file(tmp_path, tiny_model_dir, mode):
    """The checkpoint records each training file's size and modification time: a file replaced (even by the same
    bytes), or a shard gone from a folder, is refused on resume with one line naming it."""
    rows = pair_rows(300)
    if mode == "memory":
        data = first = write_jsonl(tmp_path / "pairs.jsonl", rows)
    else:
        data = tmp_path / "shards"
        data.mkdir()
        first = write_jsonl(data / "part-0.jsonl", rows[:150])
        write_jsonl(data / "part-1.jsonl", rows[150:])
    run = functools.partial(
        train_run, data, tmp_path, tiny_model_dir, mode, out=tmp_path / "cut", save_every=2
    )
    with pytest.raises(KeyboardInterrupt):
        run(stop_at=3)
    original, stamp = first.read_bytes(), first.stat()
    write_jsonl(first, pair_rows(150, seed=1))  # replaced: other rows
    with pytest.raises(
        CheckpointError, match=rf"^{first}: changed since checkpoint-2 was saved \(.*--resume"
    ):
        run(resume=True)
    first.write_bytes(original)  # the same bytes again, but a new modification time: refused unless allowed
    with pytest.raises(CheckpointError, match=rf"^{first}: changed .*--allow-data-change"):
        run(resume=True)
    if mode != "memory":
        os.utime(first, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as it was
        (data / "part-1.jsonl").unlink()
        with pytest.raises(CheckpointError, match=rf"^{data / 'part-1.jsonl'}: deleted since checkpoint-2"):
            run(resume=True)
        write_jsonl(data / "part-1.jsonl", rows[150:])
    config = TrainConfig(output=str(tmp_path / "cut"), max_steps=6, batch_size=16, shuffle_window=64, resume=True,
                         allow_data_change=True, quiet=True)  # fmt: skip
    options = SourceOptions(mode=mode, window=64, cache_dir=str(tmp_path / "cache"))
    task = Task("pairs", open_source(data, options), get_loss("infonce"))
    assert train(Encoder.load(tiny_model_dir), [task], config)["steps"] == 6


def test_two_ranks_see_disjoint_rows_whose_union_is_the_epoch(pairs):
    stream = open_source(pairs, SourceOptions(mode="stream", window=64))
    seen: list[list[int]] = [[], []]
    for batch, _ in plan_batches(stream, 64):
        for rank in (0, 1):
            seen[rank] += rank_rows(batch, rank=rank, world=2)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(300))
    assert rank_rows((5,), rank=1, world=2) == ()  # a rank past a short batch's end reads nothing


def test_two_torchrun_ranks_see_disjoint_rows_whose_union_is_the_epoch(tmp_path, tiny_model_dir):
    """Two gloo processes train one epoch on a stream, each opening and reading it itself: the rows each rank
    fetches and tokenises (``gather_negatives=False``: each rank's loss is its own rows') are disjoint and together
    the epoch; with the gathered global loss (the default) both fetch each batch, and each embeds its share."""
    from tests.distributed_helpers import spawn, streamed_rows

    rows = [
        {"anchor": f"{r['anchor']} {i}", "positive": f"{r['positive']} {i}"}
        for i, r in enumerate(pair_rows(304))
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)  # distinct texts: 19 full batches of 16, none deferred
    for gather in (False, True):
        out = tmp_path / f"gather-{gather}"
        out.mkdir()
        spawn(streamed_rows, str(path), str(tiny_model_dir), str(out), gather, world=2)
        fetched = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
        assert len(fetched[0]) == len(fetched[1]) == 19  # the same plan in both processes: one fetch a step
        lines = [[line for rows in batches for line in rows] for batches in fetched]
        if gather:
            assert fetched[0] == fetched[1] and sorted(lines[0]) == list(range(1, 305))
        else:
            assert not set(lines[0]) & set(lines[1])
            assert sorted(lines[0] + lines[1]) == list(range(1, 305))  # stream lines are 1-based
            assert all(len(rows) == 8 for batches in fetched for rows in batches)  # half of each batch


def test_a_bad_row_deep_in_a_stream_stops_training_there_with_its_line(tmp_path, tiny_model_dir):
    rows = pair_rows(3000)
    rows[2500]["positive"] = "   "  # line 2501
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    config = TrainConfig(output=str(tmp_path / "out"), max_steps=400, batch_size=8, save_every=0, quiet=True)
    steps = []
    source = open_source(path, SourceOptions(mode="stream", window=500))
    task = Task("pairs", source, get_loss("infonce"))
    with pytest.raises(DataError, match=rf"{path}:2501: column 'positive': empty text"):
        train(Encoder.load(tiny_model_dir), [task], config, on_step=steps.append)
    assert len(steps) >= 250  # the first five windows trained before the stream reached the bad row


def test_bad_rows_are_skipped_and_counted_up_to_the_limit(tmp_path, capsys):
    rows = [json.dumps(r) for r in pair_rows(200)]
    rows[120] = '{"anchor": "a cat", '  # invalid JSON on line 121
    rows[150] = json.dumps({"anchor": "a dog", "positive": ""})  # empty text on line 151
    path = tmp_path / "two_bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    stream = open_source(path, SourceOptions(mode="stream", window=1000, max_bad_rows=2))
    assert len(stream.rows(0, 1000)["anchor"]) == 198
    err = capsys.readouterr().err
    assert f"{path}:121:" in err and f"{path}:151: column 'positive'" in err and "skipped 2 bad row(s)" in err
    with pytest.raises(DataError, match=f"{path}:151: .*over --max-bad-rows"):
        open_source(path, SourceOptions(mode="mmap", max_bad_rows=1, cache_dir=str(tmp_path / "c"))).take([0])


def bad_files(folder, *, per_file=3):
    """Two JSONL files of 100 rows, each with ``per_file`` bad rows (invalid JSON at lines 10, 20, ...)."""
    folder.mkdir()
    paths = []
    for k in range(2):
        rows = [json.dumps(r) for r in pair_rows(100, seed=k)]
        for i in range(per_file):
            rows[10 * (i + 1) - 1] = '{"anchor": "a cat", '
        paths.append(folder / f"part-{k}.jsonl")
        paths[-1].write_text("\n".join(rows) + "\n")
    return paths


def read_all(source):
    return (
        [source.rows(start, start + 64) for start in range(0, 256, 64)]
        if row_count(source) is None
        else [source.rows(0, row_count(source))]
    )


@pytest.mark.parametrize("mode", ["mmap", "stream"])
def test_max_bad_rows_counts_every_file_of_the_run(tmp_path, mode, tiny_encoder):
    """6 bad rows in two files are over --max-bad-rows 4, whether the files are one folder or two tasks (one
    options object per run); under the limit they are counted once each, however often a stream is read."""
    paths = bad_files(tmp_path / "shards")
    folder_options = SourceOptions(mode=mode, window=64, max_bad_rows=4, cache_dir=str(tmp_path / "c1"))
    with pytest.raises(DataError, match=r"part-1\.jsonl:20:.*over --max-bad-rows"):
        read_all(open_source(tmp_path / "shards", folder_options))
    run_options = SourceOptions(mode=mode, window=64, max_bad_rows=4, cache_dir=str(tmp_path / "c2"))
    with pytest.raises(DataError, match=r"part-1\.jsonl:20:.*over --max-bad-rows"):
        for path in paths:
            read_all(open_source(path, run_options))
    spec = RunSpec(
        train=[str(p) for p in paths],
        loss="infonce",
        data_mode=mode,
        max_bad_rows=4,
        data_cache=str(tmp_path / "c4"),
    )
    spec.config.data.shuffle_window = 64
    with pytest.raises(
        DataError, match=r"part-1\.jsonl:20:.*over --max-bad-rows"
    ):  # one count for the run's tasks
        for task in build_tasks(spec, tiny_encoder):
            read_all(task.data)
    enough = SourceOptions(mode=mode, window=64, max_bad_rows=6, cache_dir=str(tmp_path / "c3"))
    source = open_source(tmp_path / "shards", enough)
    for _ in range(3):  # three passes over a stream: the same 6 rows, not 18
        read_all(source)
    assert enough.bad_rows().count == 6 and row_count(source) == 194


@pytest.mark.parametrize("mode", ["mmap", "stream"])
@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_an_undecodable_line_is_a_bad_row_like_any_other(tmp_path, capsys, mode, suffix):
    rows = pair_rows(200)
    if suffix == ".jsonl":
        lines = [json.dumps(r).encode() for r in rows]
    else:
        sep = "," if suffix == ".csv" else "\t"
        lines = [f"anchor{sep}positive".encode()] + [
            f"{r['anchor']}{sep}{r['positive']}".encode() for r in rows
        ]
    lines[150] = b"caf\xe9 au lait" + lines[150][5:]  # Latin-1, not UTF-8: line 151
    path = tmp_path / f"latin{suffix}"
    path.write_bytes(b"\n".join(lines) + b"\n")
    options = SourceOptions(mode=mode, window=1000, max_bad_rows=10, cache_dir=str(tmp_path / "c"))
    source = open_source(path, options)
    assert len(source.rows(0, 1000)["anchor"]) == 199
    assert f"{path}:151:4: invalid UTF-8 (byte 0xe9)" in capsys.readouterr().err
    assert options.bad_rows().count == 1
    strict = SourceOptions(mode=mode, window=1000, cache_dir=str(tmp_path / "c0"))
    with pytest.raises(DataError, match=rf"{path}:151:4: invalid UTF-8 .*--max-bad-rows N skips"):
        open_source(path, strict).rows(0, 1000)
    with pytest.raises(DataError, match=rf"{path}:151:4: invalid UTF-8"):  # memory: the first bad row stops
        open_source(path, SourceOptions(mode="memory"))


def test_a_ragged_tsv_row_is_reported_with_file_and_line(tmp_path):
    lines = [f"{r['anchor']}\t{r['positive']}" for r in pair_rows(500)]
    lines[420] += "\textra"
    path = tmp_path / "pairs.tsv"
    path.write_text("anchor\tpositive\n" + "\n".join(lines) + "\n")
    stream = open_source(path, SourceOptions(mode="stream", window=100))
    assert len(stream.rows(0, 100)["anchor"]) == 100  # the first windows are fine
    with pytest.raises(DataError, match=rf"{path}:422: expected 2 columns, found 3"):
        stream.rows(400, 500)


def test_a_folder_of_parquet_shards_trains_memory_mapped(tmp_path, tiny_model_dir):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = pair_rows(120)
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(3):
        part = rows[i * 40 : (i + 1) * 40]
        table = pa.table({"query": [r["anchor"] for r in part], "doc": [r["positive"] for r in part]})
        pq.write_table(table, folder / f"part-{i:03d}.parquet")
    options = SourceOptions(mode="mmap", columns="query=anchor,doc=positive", cache_dir=str(tmp_path / "c"))
    source = open_source(folder, options)
    assert row_count(source) == 120 and source.take([0, 119])["anchor"] == [
        rows[0]["anchor"],
        rows[119]["anchor"],
    ]
    assert source.take([45])["_line"] == [6]  # row 6 of the second shard
    config = TrainConfig(output=str(tmp_path / "out"), max_steps=2, batch_size=16, save_every=0, quiet=True)
    summary = train(Encoder.load(tiny_model_dir), [Task("shards", source, get_loss("infonce"))], config)
    assert summary["steps"] == 2


def test_a_hugging_face_data_set_is_read_through_load_dataset_offline(tmp_path, monkeypatch):
    """``load_dataset`` resolves a local folder the way it resolves a Hub id from its cache (never the network)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    folder = tmp_path / "hub_like"
    folder.mkdir()
    write_jsonl(
        folder / "train.jsonl", [{"question": r["anchor"], "answer": r["positive"]} for r in pair_rows(50)]
    )
    mapping = "question=anchor,answer=positive"
    got = list(hub_rows(str(folder), "train", mapping, 0))
    assert len(got) == 50 and got[3]["_line"] == 4 and set(got[0]) == {"anchor", "positive", "_line", "_file"}
    stream = datasets.IterableDataset.from_generator(
        hub_rows, gen_kwargs={"name": str(folder), "split": "train", "columns": mapping, "max_bad_rows": 0}
    )
    source = StreamSource(stream, path=str(folder), window=20)
    assert source.take([41, 40])["anchor"] == [got[41]["anchor"], got[40]["anchor"]]


def test_memory_mode_still_reads_a_table_and_refuses_folders(pairs, tmp_path):
    assert isinstance(open_source(pairs, SourceOptions()), Dataset)
    with pytest.raises(ValueError, match="'mmap' or 'stream'"):
        open_source(tmp_path, SourceOptions())
    with pytest.raises(ValueError, match="max_bad_rows applies"):
        open_source(pairs, SourceOptions(max_bad_rows=3))


def test_windowed_plans_of_several_tasks_use_every_row_once():
    sizes = [70, 200]
    plan = epoch_plan(sizes, [1.0, 2.0], 8, seed=1, epoch=0, windows=[32, 50])
    for task, size in enumerate(sizes):
        rows = [r for b in plan if b.task == task for r in b.rows]
        assert sorted(rows) == list(range(size))
        window = [32, 50][task]
        assert all(
            len({r // window for r in b.rows}) == 1 for b in plan if b.task == task
        )  # inside one window


def test_prepared_task_tokenises_per_batch(pairs, tiny_encoder):
    prepared = prepare(
        Task("p", open_source(pairs, SourceOptions(mode="stream", window=64)), get_loss("infonce")),
        tiny_encoder,
    )
    ids = prepared.inputs((3, 1))
    rows = pair_rows(300)
    expected = tiny_encoder.tokenize_ids(
        [rows[3]["anchor"], rows[1]["anchor"], rows[3]["positive"], rows[1]["positive"]]
    )
    assert ids == expected
