"""Poison under load: good clients and clients sending bad inputs to one real server; no good request may fail.

Starts ``embforge serve`` (real model, micro-batching on) on loopback, then for ``--seconds`` runs ``--clients``
clients sending good single-sentence ``/v1/embeddings`` requests (STS-B test sentences, so they merge into
batches) and ``--bad-clients`` clients cycling through bad requests: lone surrogates (alone and inside a list of
good texts, in ``/v1/embeddings`` and ``/similarity``), NaN, empty and over-long texts, malformed JSON, a body
that is not UTF-8. Prints the status counts of both kinds and the failed good requests (the figure that must be
0). With ``--server-pythonpath OLD_CHECKOUT`` the server runs an older checkout, for the before/after table.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/poison_load.py --clients 32 --bad-clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

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


async def run(url: str, sentences: list[str], clients: int, bad_clients: int, seconds: float) -> dict:
    import httpx

    good: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    headers = {"content-type": "application/json"}
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
                body, path = BAD[n % len(BAD)], PATHS[n % len(BAD)]
                n += 1
                try:
                    response = await http.post(path, content=body, headers=headers)
                    bad[str(response.status_code)] += 1
                except httpx.HTTPError as err:
                    bad[type(err).__name__] += 1

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
    args = parser.parse_args()

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table

    data = read_table(
        data_root() / "stsb_en" / "stsb-en-test.csv", header=False, columns="0=sentence1,1=sentence2,2=score"
    )
    sentences = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))
    port = free_port()
    url = f"http://{HOST}:{port}"
    flags = ["--timeout", "120", "--max-batch-size", "64", "--max-wait-ms", "5"]
    flags += ["--threads", str(args.threads)] if args.threads else []
    proc = start_server(args.model, port, *flags, log_level="critical", checkout=args.server_pythonpath)
    try:
        wait_ready(url, proc)
        result = asyncio.run(run(url, sentences, args.clients, args.bad_clients, args.seconds))
    finally:
        stop_servers([proc], timeout=60)
    result["server"] = args.server_pythonpath or "this checkout"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
