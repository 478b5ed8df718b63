"""The document store: any id round-trips, an add writes what it adds (not the store), a crash (kill -9) never
leaves a store that refuses to open nor loses an acknowledged add, duplicate ids under concurrency, the vector index
checked against the rows, compaction, kinds and models recorded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from embforge.serve.store import DocumentStore, DuplicateIdError, ModelMismatchError

DIM = 8
ODD_IDS = [
    "a\nb",
    "c\rd",
    "e\ff",
    "g\x85h",
    "i\u2028j",
    "k\u2029l",
    " space ",
    "tab\t",
    '"quote"',
    "\\",
    "日本",
    "\x00",
]


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _docs(ids, prefix="text"):
    return [{"id": i, "text": f"{prefix} {i}", "fields": {"n": n}} for n, i in enumerate(ids)]


def crash_image(folder: Path, to: Path) -> Path:
    """The files of an open store as they are on disk now: what a kill -9 of its process would leave."""
    shutil.copytree(folder, to)
    return to


def _files(folder: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
        for p in folder.rglob("*")
        if p.is_file()
    }


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_ids_with_line_breaks_round_trip_through_a_restart(tmp_path: Path, kind: str):
    if kind != "exact":
        pytest.importorskip("faiss")
    vectors = _vectors(len(ODD_IDS))
    store = DocumentStore.open(tmp_path / "s", dim=DIM, kind=kind)
    store.add(_docs(ODD_IDS), vectors)
    store.close()  # SQLite's log folded into the database
    again = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert list(again.docs) == ODD_IDS
    hits = again.search(vectors, 1)
    assert [h[0]["id"] for h in hits] == ODD_IDS
    assert again.docs["i\u2028j"] == {"text": "text i\u2028j", "fields": {"n": 4}}
    again.add(_docs(["after"]), _vectors(1, 1))  # and from SQLite's log, before any checkpoint
    third = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert list(third.docs) == [*ODD_IDS, "after"]


@pytest.mark.parametrize("kind", ["exact", "flat"])
def test_index_save_and_load_keep_odd_ids(tmp_path: Path, kind: str):
    from embforge.retrieval.index.registry import create_index, load_index

    if kind != "exact":
        pytest.importorskip("faiss")
    vectors = _vectors(len(ODD_IDS))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = create_index(kind, DIM)
    index.add(ODD_IDS, vectors)
    index.save(tmp_path / "i")
    again = load_index(tmp_path / "i")
    assert len(again) == len(ODD_IDS)
    assert again.search(vectors, 1)[1] == [[i] for i in ODD_IDS]


@pytest.mark.parametrize("size", [1000, 20000])
def test_an_add_writes_what_it_adds_not_the_store(tmp_path: Path, size: int):
    store = DocumentStore.open(tmp_path / "s", dim=DIM)
    store.add(_docs([f"d{i}" for i in range(size)]), _vectors(size))
    store.compact()
    before = _files(tmp_path / "s")
    store.add(_docs([f"new{i}" for i in range(8)]), _vectors(8, 1))
    after = _files(tmp_path / "s")
    changed = {name for name in after if after[name] != before.get(name)}
    assert changed == {"documents.sqlite-wal"}  # only SQLite's log grew
    grown = sum(v[2] for v in after.values()) - sum(v[2] for v in before.values())
    assert grown <= 16 * (4096 + 24)  # a few pages (4 KiB + frame header), not the store's 0.3-6 MB
    store.close()
    assert len(DocumentStore.open(tmp_path / "s", dim=DIM)) == size + 8


def test_a_torn_tail_of_sqlites_log_is_cut_and_the_rest_kept(tmp_path: Path):
    store = DocumentStore.open(tmp_path / "s", dim=DIM, compact_bytes=None)
    store.add(_docs(["a", "b"]), _vectors(2))
    store.add(_docs(["c"]), _vectors(1, 1))
    folder = crash_image(tmp_path / "s", tmp_path / "crashed")
    store.close()
    with open(folder / "documents.sqlite-wal", "ab") as handle:  # the next commit died half-written
        handle.write(b"\x00\x00\x00\x02" + b"garbage" * 100)
    again = DocumentStore.open(folder, dim=DIM)
    assert list(again.docs) == ["a", "b", "c"]
    again.add(_docs(["d"]), _vectors(1, 2))
    again.close()
    assert list(DocumentStore.open(folder, dim=DIM).docs) == ["a", "b", "c", "d"]


def test_a_document_that_cannot_be_stored_changes_nothing(tmp_path: Path):
    store = DocumentStore.open(tmp_path / "s", dim=DIM)
    store.add(_docs(["a"]), _vectors(1))
    for bad in ({"x": float("nan")}, {"x": object()}):
        with pytest.raises(ValueError, match="cannot be stored"):
            store.add([{"id": "b", "text": "t", "fields": bad}], _vectors(1, 1))
    for key, text in (("b", "\ud800"), ("b\udfff", "t")):  # a lone surrogate is not text SQLite can hold
        with pytest.raises(ValueError, match="cannot be stored: not valid Unicode"):
            store.add([*_docs(["ok"]), {"id": key, "text": text}], _vectors(2, 1))
    with pytest.raises(ValueError, match="shape"):
        store.add(_docs(["b"]), _vectors(2))
    store.add(_docs(["b"]), _vectors(1, 1))  # not jammed: b was never half-added
    assert list(DocumentStore.open(tmp_path / "s", dim=DIM).docs) == ["a", "b"]


def test_concurrent_adds_of_one_id_exactly_one_wins(tmp_path: Path):
    store = DocumentStore.open(tmp_path / "s", dim=DIM, durable=False)
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def add(n: int) -> None:
        barrier.wait()
        try:
            store.add([{"id": "same", "text": f"t{n}"}], _vectors(1, n))
            outcomes.append("ok")
        except DuplicateIdError as err:
            outcomes.append(f"dup {err.position}")

    threads = [threading.Thread(target=add, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["dup 0"] * 7 + ["ok"]
    with pytest.raises(DuplicateIdError) as err:
        store.add(_docs(["new", "new"]), _vectors(2))
    assert err.value.position == 1


def test_compaction_in_the_background_keeps_every_add(tmp_path: Path):
    pytest.importorskip("faiss")
    store = DocumentStore.open(tmp_path / "s", dim=DIM, kind="hnsw", durable=False, compact_bytes=300)
    for n in range(60):
        store.add(_docs([f"d{n}"]), _vectors(1, n))
        if n % 7 == 0:
            assert store.search(_vectors(1, n), 1)[0][0]["id"] == f"d{n}"
    deadline = time.time() + 10
    while not (tmp_path / "s" / "index" / "rows.json").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "s" / "index" / "rows.json").exists()  # merged and saved off the request path
    store.close()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["documents.sqlite", "index"]
    assert json.loads((tmp_path / "s" / "index" / "rows.json").read_text()) == {"seq": 60}
    again = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert list(again.docs) == [f"d{n}" for n in range(60)]
    assert len(again.index.main) == 60 and again.index.pending() == 0


def test_kind_and_model_are_recorded_and_checked(tmp_path: Path):
    model = {"name": "m", "fingerprint": "abc"}
    DocumentStore.open(tmp_path / "s", dim=DIM, kind="exact", model=model).close()
    with pytest.raises(ValueError, match="'exact' but --index-kind is 'hnsw'"):
        DocumentStore.open(tmp_path / "s", dim=DIM, kind="hnsw")
    with pytest.raises(ValueError, match="8-d vectors but the model gives 4-d"):
        DocumentStore.open(tmp_path / "s", dim=4)
    other = {"name": "other", "fingerprint": "def"}
    with pytest.raises(ModelMismatchError, match=r"built by 'm'.*--allow-model-mismatch"):
        DocumentStore.open(tmp_path / "s", dim=DIM, model=other)
    assert DocumentStore.open(tmp_path / "s", dim=DIM, model=other, allow_model_mismatch=True).model == model
    assert DocumentStore.open(tmp_path / "s", dim=DIM, model=model).kind == "exact"


@pytest.mark.parametrize("old", ["store.json", "index.json"])
def test_a_folder_of_an_older_format_is_refused_with_what_to_do(tmp_path: Path, old: str):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / old).write_text(json.dumps({"dim": DIM, "index": "exact", "documents": 3}))  # format 1
    with pytest.raises(ValueError, match=r"older 'embforge index build'.*rebuild it: embforge index build"):
        DocumentStore.open(folder, dim=DIM)
    assert sorted(p.name for p in folder.iterdir()) == [old]  # nothing written


def _format2_record(docs: list[dict], vectors: np.ndarray) -> bytes:
    """One add as the previous format's log wrote it (EFW1 | length | CRC-32 | JSON length | JSON | float32)."""
    import struct
    import zlib

    meta = json.dumps({"docs": docs}, ensure_ascii=True).encode()
    payload = struct.pack("<I", len(meta)) + meta + np.asarray(vectors, "<f4").tobytes()
    return struct.pack("<4sII", b"EFW1", len(payload), zlib.crc32(payload)) + payload


def test_a_store_of_the_previous_format_is_converted_with_every_acknowledged_document(tmp_path: Path):
    from embforge.retrieval.index.exact import NumpyIndex

    folder, vectors = tmp_path / "old", _vectors(5)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    snapshot = NumpyIndex(DIM)
    snapshot.add(["a", "b\nc"], vectors[:2])
    snapshot.save(folder / "snap-00000001" / "index")
    (folder / "snap-00000001" / "documents.jsonl").write_text(
        "".join(json.dumps(d) + "\n" for d in _docs(["a", "b\nc"]))
    )
    logged = _format2_record(_docs(["d", "e"], "log"), vectors[2:4]) + _format2_record(
        _docs(["f"]), vectors[4:]
    )
    (folder / "wal-00000000.log").write_bytes(b"compacted already: ignored")
    (folder / "wal-00000001.log").write_bytes(logged + logged[:9])  # a torn last record
    meta = {"format": 2, "dim": DIM, "kind": "exact", "options": {}, "model": None}
    (folder / "store.json").write_text(json.dumps({**meta, "snapshot": "snap-00000001", "log_start": 1}))
    with pytest.raises(ValueError, match="open it once with 'embforge serve --index"):
        DocumentStore.open(folder, dim=DIM, read_only=True)
    store = DocumentStore.open(folder, dim=DIM)
    assert list(store.docs) == ["a", "b\nc", "d", "e", "f"]
    assert store.docs["e"] == {"text": "log e", "fields": {"n": 1}}
    assert [store.search(vectors[i : i + 1], 1)[0][0]["id"] for i in (1, 4)] == ["b\nc", "f"]
    store.close()
    assert sorted(p.name for p in folder.iterdir()) == ["documents.sqlite"]  # the old files are gone
    assert len(DocumentStore.open(folder, dim=DIM, read_only=True)) == 5


WRITER = """
import sys, numpy as np
from embforge.serve.store import DocumentStore
store = DocumentStore.open(sys.argv[1], dim=8, kind=sys.argv[2], compact_bytes=int(sys.argv[3]))
rng = np.random.default_rng(int(sys.argv[4]))
n = int(sys.argv[5])
while True:
    ids = [f"r{sys.argv[4]}-{n}-{j}" for j in range(4)]
    print("try", " ".join(ids), flush=True)
    store.add([{"id": i, "text": "t" + i, "fields": {"j": j}} for j, i in enumerate(ids)], rng.standard_normal((4, 8)))
    print("ack", " ".join(ids), flush=True)
    n += 1
"""


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_kill_9_during_adds_never_loses_or_half_keeps_a_document(tmp_path: Path, kind: str):
    """A real process adding documents is SIGKILLed at random moments (compactions included); each time the
    store opens, holds every acknowledged add, and no add partially."""
    if kind != "exact":
        pytest.importorskip("faiss")
    folder, acked, tried = tmp_path / "s", set(), set()
    rng = np.random.default_rng(0)
    for cycle in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), kind, "6000", str(cycle), "0"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        assert proc.stdout is not None
        started = time.time()
        line = proc.stdout.readline()  # imports done, adding
        assert line.startswith("try"), line
        time.sleep(float(rng.uniform(0.05, 0.4)))
        proc.kill()
        out, _ = proc.communicate()
        for record in [line, *out.splitlines()]:
            words = record.split()
            (acked if words[0] == "ack" else tried).update(words[1:])
        assert time.time() - started < 60
        store = DocumentStore.open(folder, dim=DIM)
        stored = set(store.docs)
        assert acked <= stored, f"lost {sorted(acked - stored)[:5]}"
        groups = {key.rsplit("-", 1)[0] for key in stored}
        assert all({f"{g}-{j}" for j in range(4)} <= stored for g in groups)  # an add is all or nothing
        assert stored <= tried
        assert len(store.index) == len(stored)
        store.close()


def test_an_hnsw_store_adds_to_an_exact_delta_and_merges_it_when_compacting(tmp_path: Path):
    pytest.importorskip("faiss")
    from embforge.retrieval.index.exact import NumpyIndex

    base = _vectors(300)
    store = DocumentStore.build(tmp_path / "s", [f"d{i}" for i in range(300)], ["t"] * 300, base, kind="hnsw")
    new = _vectors(40, 1)
    for n in range(5):
        store.add(_docs([f"new{n}-{j}" for j in range(8)]), new[8 * n : 8 * n + 8])
    assert len(store.index.main) == 300 and len(store.index.active) == 40  # adds did not touch HNSW
    exact = NumpyIndex(DIM)
    unit = np.concatenate([base, new]) / np.linalg.norm(np.concatenate([base, new]), axis=1, keepdims=True)
    exact.add([f"d{i}" for i in range(300)] + [f"new{n}-{j}" for n in range(5) for j in range(8)], unit)
    queries = _vectors(20, 2)
    truth = exact.search(queries, 5)[1]
    merged = [[h["id"] for h in row] for row in store.search(queries, 5)]
    assert np.mean([len(set(a) & set(b)) / 5 for a, b in zip(merged, truth)]) >= 0.9
    assert [store.search(new[i : i + 1], 1)[0][0]["id"] for i in (0, 39)] == ["new0-0", "new4-7"]
    assert store.compact()
    assert len(store.index.main) == 340 and len(store.index.active) == 0 and store.index.frozen is None
    store.close()
    again = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert len(again.index.main) == 340 and again.search(new[39:40], 1)[0][0]["id"] == "new4-7"


def test_the_saved_index_is_checked_against_the_rows_and_caught_up(tmp_path: Path, caplog):
    pytest.importorskip("faiss")
    from embforge.retrieval.index.registry import create_index

    base, new = _vectors(300), _vectors(40, 1)
    store = DocumentStore.build(tmp_path / "s", [f"d{i}" for i in range(300)], ["t"] * 300, base, kind="hnsw")
    store.add(_docs([f"new{j}" for j in range(40)]), new)
    crashed = crash_image(tmp_path / "s", tmp_path / "crashed")  # the 40 are in the rows, not in index/
    store.close()
    again = DocumentStore.open(crashed, dim=DIM)
    assert len(again.index.main) == 300 and again.index.pending() == 40  # loaded, then caught up
    assert again.search(new[39:40], 1)[0][0]["id"] == "new39"
    again.close()
    other = create_index("hnsw", DIM)  # an index/ that does not hold the rows' ids: rebuilt from the rows
    other.add([f"x{i}" for i in range(340)], _vectors(340, 3))
    other.save(crashed / "index")
    (crashed / "index" / "rows.json").write_text('{"seq": 340}')
    with caplog.at_level("WARNING", logger="embforge.store"):
        third = DocumentStore.open(crashed, dim=DIM)
    assert "does not match the documents" in caplog.text
    assert len(third.index) == 340 and third.search(base[:1], 1)[0][0]["id"] == "d0"


def test_a_qdrant_store_keeps_its_collection_and_catches_up_after_a_crash(tmp_path: Path):
    pytest.importorskip("qdrant_client")
    store = DocumentStore.open(tmp_path / "s", dim=DIM, kind="qdrant")
    store.add(_docs(["a", "b"]), _vectors(2))
    store.close()  # merged into the embedded collection (storage/), index/ records it
    store = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert store.kind == "qdrant" and len(store.index.main) == 2
    store.add(_docs(["c"]), _vectors(1, 1))
    assert store.compact()  # c is in the collection and index/ says rows 1..3
    store.add(_docs(["d"]), _vectors(1, 2))  # d only in the rows
    store.index.close()  # a crash: no compaction (the embedded client must let go of its folder)
    again = DocumentStore.open(tmp_path / "s", dim=DIM)
    assert list(again.docs) == ["a", "b", "c", "d"] and len(again.index) == 4
    assert [again.search(_vectors(1, 2), 1)[0][0]["id"]] == ["d"]
    again.close()
