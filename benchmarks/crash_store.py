"""Crash test of the server's document store: ``kill -9`` a real server process during concurrent adds and
searches, many times, and check the store after every kill.

Each cycle starts a server process (``embforge.serve.runner.serve``: the code path of ``embforge serve --index``)
on the same ``--index`` folder, runs ``--writers`` clients adding documents (1-4 per request, unique ids) and
``--searchers`` clients searching, then SIGKILLs the server at a random moment. The documents are in SQLite (one
transaction per add); with ``--index-kind hnsw`` the vector index is also saved beside them, and compaction is set
small (``--compact-bytes``) so kills also land in the middle of index saves. After each kill the folder is opened
(read-only, as ``embforge index search`` does) and checked: it opens, every acknowledged document (its add answered
200) is there with its text, no add is half present (all of a request's documents or none), nothing is there that
was never sent, and the vector index holds exactly the stored documents.

Server processes are forked from a "zygote" that has imported torch, the server and the model code once, so a
cycle costs the model load, not the imports; the zygote runs no torch op before forking (fork safety). The
model is a tiny random BERT (built once) unless ``--model`` names one (e.g. all-MiniLM-L6-v2).

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/crash_store.py --cycles 120
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import HOST, free_port

ROOT = Path(__file__).resolve().parents[1]

ZYGOTE = r"""
import json, os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
import torch, uvicorn  # noqa: F401  (imported once, before any fork)
import embforge.encoder, embforge.serve.app, embforge.serve.runner, embforge.serve.store  # noqa: F401
import embforge.serve.sockets, embforge.retrieval.corpus_cache, embforge.retrieval.index.exact  # noqa: F401
import transformers, transformers.models.bert.modeling_bert, tokenizers  # noqa: F401
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
import uvicorn.protocols.http.httptools_impl, uvicorn.lifespan.on, uvicorn.loops.auto  # noqa: F401
for optional in ("uvloop", "faiss"):
    try:
        __import__(optional)
    except ImportError:
        pass
print("ready", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)
        from embforge.serve.config import ServeConfig
        from embforge.serve.runner import serve
        config = ServeConfig(model_name="crash", max_wait_ms=2, header_timeout_s=5)
        serve(cmd["model"], index=cmd["index"], index_kind=cmd["kind"], port=cmd["port"], config=config,
              log_level="critical", compact_bytes=cmd["compact_bytes"])
        os._exit(0)
    print(pid, flush=True)
"""

TINY = r"""
import sys
sys.path.insert(0, sys.argv[2])
from tests.conftest import make_bert, make_tokenizer
from embforge.encoder import Encoder
tok = make_tokenizer()
Encoder(make_bert(len(tok)), tok, pooling="mean", max_seq_length=64).save(sys.argv[1])
"""


def vocabulary() -> list[str]:
    """The words of the documents and queries: the vocabulary of the default tiny model (tests/conftest.py,
    which builds it in the TINY child)."""
    sys.path.insert(0, str(ROOT))
    from tests.conftest import WORDS

    return WORDS


def post(port: int, path: str, body: dict, timeout: float = 10.0) -> int:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def wait_ready(port: int, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server on port {port} not ready after {timeout} s")


class Ledger:
    """What the clients sent and what the server acknowledged, per request (a group of ids)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[str, list[str]] = {}  # group -> ids
        self.acked: set[str] = set()
        self.texts: dict[str, str] = {}
        self.search_ok = self.search_failed = self.add_rejected = 0


def writer(
    port: int, ledger: Ledger, name: str, stop: threading.Event, rng: random.Random, words: list[str]
) -> None:
    n = 0
    while not stop.is_set():
        group = f"{name}-{n}"
        ids = [f"{group}/{j}" for j in range(rng.randint(1, 4))]
        docs = [{"id": i, "text": " ".join(rng.choices(words, k=6)), "fields": {"g": group}} for i in ids]
        with ledger.lock:
            ledger.sent[group] = ids
            ledger.texts.update({d["id"]: d["text"] for d in docs})
        try:
            status = post(port, "/index/documents", {"documents": docs})
        except (OSError, http.client.HTTPException):
            return  # the server was killed
        with ledger.lock:
            if status == 200:
                ledger.acked.update(ids)
            else:
                ledger.add_rejected += 1
        n += 1


def searcher(port: int, ledger: Ledger, stop: threading.Event, rng: random.Random, words: list[str]) -> None:
    while not stop.is_set():
        try:
            status = post(port, "/search", {"query": " ".join(rng.choices(words, k=4)), "top_k": 5})
        except (OSError, http.client.HTTPException):
            return
        with ledger.lock:
            if status == 200:
                ledger.search_ok += 1
            else:
                ledger.search_failed += 1


def check(folder: Path, dim: int, ledger: Ledger) -> dict[str, int]:
    from embforge.serve.store import DocumentStore

    save_cut = (folder / "index.tmp").exists()  # the kill landed inside a save of the vector index
    store = DocumentStore.open(folder, dim=dim, read_only=True)  # raises if the folder cannot be opened
    stored = set(store.docs)
    sent_ids = {i for ids in ledger.sent.values() for i in ids}
    lost = ledger.acked - stored
    half = [g for g, ids in ledger.sent.items() if 0 < len(stored & set(ids)) < len(ids)]
    unknown = stored - sent_ids
    texts = store.fetch(sorted(stored & sent_ids))
    wrong_text = [i for i, doc in texts.items() if doc["text"] != ledger.texts[i]]
    index_mismatch = len(store.index) != len(stored) or not all(store.index.has(i) for i in stored)
    store.close()
    return {
        "stored": len(stored),
        "acked": len(ledger.acked),
        "lost": len(lost),
        "half_present": len(half),
        "unknown": len(unknown),
        "wrong_text": len(wrong_text),
        "index_mismatch": int(index_mismatch),
        "index_save_cut": int(save_cut),
        "unacked_present": len(stored - ledger.acked),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=120)
    parser.add_argument("--model", default=None, help="model folder or alias (default: a tiny random BERT)")
    parser.add_argument("--writers", type=int, default=6)
    parser.add_argument("--searchers", type=int, default=2)
    parser.add_argument("--min-run", type=float, default=0.2, help="shortest time before the kill (s)")
    parser.add_argument("--max-run", type=float, default=1.5, help="longest time before the kill (s)")
    parser.add_argument("--compact-bytes", type=int, default=48_000)
    parser.add_argument("--index-kind", default="exact", help="index kind of the store (exact, hnsw, ...)")
    parser.add_argument("--folder", default=None, help="index folder (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng, words = random.Random(args.seed), vocabulary()
    scratch = Path(tempfile.mkdtemp(prefix="embforge-crash-"))
    folder = Path(args.folder) if args.folder else scratch / "index"
    model = args.model
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if model is None:
        model = str(scratch / "tiny")
        subprocess.run([sys.executable, "-c", TINY, model, str(ROOT)], check=True, env=env)
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    assert zygote.stdout.readline().strip() == "ready"
    ledger = Ledger()
    totals = dict.fromkeys(
        ("opened", "lost", "half_present", "unknown", "wrong_text", "index_mismatch", "index_save_cut"), 0
    )
    started = time.perf_counter()
    dim = None
    try:
        for cycle in range(args.cycles):
            port = free_port()
            command = {
                "model": model,
                "index": str(folder),
                "port": port,
                "compact_bytes": args.compact_bytes,
                "kind": args.index_kind,
            }
            zygote.stdin.write(json.dumps(command) + "\n")
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            t0 = time.perf_counter()
            wait_ready(port)
            ready_s = time.perf_counter() - t0
            if dim is None:
                conn = http.client.HTTPConnection(HOST, port, timeout=10)
                conn.request("GET", "/health")
                dim = int(json.loads(conn.getresponse().read())["dim"])
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=writer,
                    args=(port, ledger, f"c{cycle}w{w}", stop, random.Random(rng.random()), words),
                )
                for w in range(args.writers)
            ]
            threads += [
                threading.Thread(
                    target=searcher, args=(port, ledger, stop, random.Random(rng.random()), words)
                )
                for _ in range(args.searchers)
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(args.min_run, args.max_run))
            os.kill(pid, signal.SIGKILL)
            stop.set()
            for t in threads:
                t.join(30)
            t0 = time.perf_counter()
            result = check(folder, dim, ledger)
            result["start_s"], result["check_s"] = round(ready_s, 2), round(time.perf_counter() - t0, 2)
            totals["opened"] += 1
            for key in ("lost", "half_present", "unknown", "wrong_text", "index_mismatch", "index_save_cut"):
                totals[key] += result[key]
            print(f"cycle {cycle + 1:3d}: {json.dumps(result)}", flush=True)
    finally:
        zygote.stdin.close()
        zygote.wait(30)
    summary = {
        "cycles": args.cycles,
        "store_opened": totals["opened"],
        "acknowledged_docs": len(ledger.acked),
        "lost_acknowledged": totals["lost"],
        "half_present_adds": totals["half_present"],
        "never_sent_present": totals["unknown"],
        "wrong_text": totals["wrong_text"],
        "index_mismatch": totals["index_mismatch"],
        "kills_inside_index_saves": totals["index_save_cut"],
        "adds_rejected": ledger.add_rejected,
        "searches_ok": ledger.search_ok,
        "searches_failed": ledger.search_failed,
        "seconds": round(time.perf_counter() - started, 1),
        "files_left": sorted(p.name for p in folder.iterdir()),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
