"""Poison under load: good clients and clients sending bad inputs to one real server; no good request may fail.

Starts ``embforge serve`` (real model, micro-batching on) on loopback, then for ``--seconds`` runs ``--clients``
clients sending good single-sentence ``/v1/embeddings`` requests (STS-B test sentences, so they merge into
batches) and ``--bad-clients`` clients cycling through bad requests: lone surrogates (alone and inside a list of
good texts, in ``/v1/embeddings`` and ``/similarity``), NaN, empty and over-long texts, malformed JSON, a body
that is not UTF-8. Prints the status counts of both kinds and the failed good requests (the figure that must be
0). With ``--server-pythonpath OLD_CHECKOUT`` the server runs an older checkout, for the before/after table.

``--kind sparse`` / ``--kind multivector`` serve another kind through the same app: no pretrained SPLADE or
ColBERT folder is available offline, so the script builds one from ``--model`` (untrained, real size: sparse is
its encoder with a new MLM head over its 30,522-token vocabulary, multi-vector its encoder with a new 128-d
projection) into ``--kind-folder`` (kept and reused when given). ``--api-key KEY`` starts the server with a key:
the good clients send it, and the bad clients' cycle adds a request without it and one with a wrong key (401).

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/poison_load.py --clients 32 --bad-clients 4
    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/poison_load.py --kind sparse --api-key k --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import HOST, free_port, start_server, stop_servers, wait_ready

BAD = [
    b'{"input": "x\\ud800"}',
    b'{"input": ["a man plays the guitar", "a \\udfff dog", "the cat"]}',
    b'{"pairs": [["a cat", "a \\ud83d dog"]]}',
    b'{"input": ["fine", ""]}',
    b'{"input": "' + b"word " * 3000 + b'"}',
    b'{"input": ["ok", NaN]}',
    b'{"input": [',
    b"\xa6J\xa1\xdb",
    b'{"input": 5}',
]
PATHS = ["/v1/embeddings", "/v1/embeddings", "/similarity", *["/v1/embeddings"] * 6]
GOOD = b'{"input": "a man plays the guitar"}'  # a good body, sent by the bad clients without the key / a wrong key


def kind_folder(kind: str, model: str, folder: Path) -> str:
    """A ``kind`` model folder built from ``model`` (reused when ``folder`` already holds one)."""
    if (folder / "config.json").is_file() or (folder / "modules.json").is_file():
        return str(folder)
    from embforge.modeling.resolve import resolve_model_path

    base = resolve_model_path(model)
    if kind == "multivector":
        from embforge.multivector import MultiVectorEncoder

        MultiVectorEncoder.load(base).save(folder)
        return str(folder)
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    from embforge.sparse.model import SparseEncoder

    torch.manual_seed(0)
    mlm = folder.parent / f"{folder.name}-mlm"
    BertForMaskedLM.from_pretrained(base).save_pretrained(mlm)  # the MLM head's transform freshly initialised
    AutoTokenizer.from_pretrained(base).save_pretrained(mlm)
    SparseEncoder.load(mlm).save(folder)
    return str(folder)


async def run(
    url: str, sentences: list[str], clients: int, bad_clients: int, seconds: float, api_key: str | None = None
) -> dict:
    import httpx

    good: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    cycle = list(zip(BAD, PATHS, [headers] * len(BAD)))
    if api_key:  # a good body without the key, and with a wrong one
        cycle.append((GOOD, "/v1/embeddings", {"content-type": "application/json"}))
        cycle.append((GOOD, "/v1/embeddings", {**headers, "authorization": f"Bearer {api_key}x"}))
    limits = httpx.Limits(max_connections=clients + bad_clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        stop = time.perf_counter() + seconds

        async def good_client(k: int) -> None:
            n = k
            while time.perf_counter() < stop:
                body = json.dumps({"input": sentences[n % len(sentences)]}).encode()
                n += clients
                try:
                    response = await http.post("/v1/embeddings", content=body, headers=headers)
                    ok = response.status_code == 200 and len(response.json()["data"]) == 1
                    good["200" if ok else str(response.status_code)] += 1
                except httpx.HTTPError as err:
                    good[type(err).__name__] += 1

        async def bad_client(k: int) -> None:
            n = k
            while time.perf_counter() < stop:
                body, path, sent_headers = cycle[n % len(cycle)]
                n += 1
                try:
                    response = await http.post(path, content=body, headers=sent_headers)
                    bad[str(response.status_code)] += 1
                except httpx.HTTPError as err:
                    bad[f"{type(err).__name__} (bad request {(n - 1) % len(cycle)})"] += 1

        await asyncio.gather(
            *(good_client(k) for k in range(clients)), *(bad_client(k) for k in range(bad_clients))
        )
    failed = sum(v for k, v in good.items() if k != "200")
    return {"good": dict(good), "good_failed": failed, "bad": dict(bad), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--bad-clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--threads", type=int, default=1, help="model CPU threads")
    parser.add_argument("--server-pythonpath", default=None, help="run the server from this (older) checkout")
    parser.add_argument(
        "--kind",
        default="dense",
        choices=["dense", "sparse", "multivector"],
        help="model kind served: dense serves --model; sparse and multivector a folder built from it",
    )
    parser.add_argument(
        "--kind-folder", default=None, help="where the sparse/multivector folder is built or kept"
    )
    parser.add_argument("--api-key", default=None, help="start the server with this key (401 checks added)")
    parser.add_argument("--backend", default=None, help="the server's --backend (default: its own, auto)")
    args = parser.parse_args()

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table

    data = read_table(
        data_root() / "stsb_en" / "stsb-en-test.csv", header=False, columns="0=sentence1,1=sentence2,2=score"
    )
    sentences = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if args.kind != "dense":
            model = kind_folder(args.kind, args.model, Path(args.kind_folder or Path(tmp) / args.kind))
        port = free_port()
        url = f"http://{HOST}:{port}"
        flags = ["--timeout", "120", "--max-batch-size", "64", "--max-wait-ms", "5"]
        flags += ["--threads", str(args.threads)] if args.threads else []
        flags += ["--api-key", args.api_key] if args.api_key else []
        flags += ["--backend", args.backend] if args.backend else []
        proc = start_server(model, port, *flags, log_level="critical", checkout=args.server_pythonpath)
        try:
            wait_ready(url, proc)
            result = asyncio.run(
                run(url, sentences, args.clients, args.bad_clients, args.seconds, args.api_key)
            )
        finally:
            stop_servers([proc], timeout=60)
    result["server"] = args.server_pythonpath or "this checkout"
    result["kind"] = args.kind
    result["api_key"] = bool(args.api_key)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
