"""Load test of ``embforge serve`` on loopback: micro-batching vs batch-size-1 serving, same model, one run.

Starts two servers on 127.0.0.1 (free ports) with the same model: one with dynamic micro-batching
(``--max-batch-size 64 --max-wait-ms 5``) and one that runs every request alone (``--max-batch-size 1
--max-wait-ms 0``). For each concurrency level, N async clients (aiohttp) send single-sentence ``/v1/embeddings``
requests (STS-B test sentences) until a request count or a time limit is reached; the two servers are measured
alternately, several times, so both see the same machine load. Prints requests/s, p50/p99 latency and errors.
Both servers are stopped (SIGINT, graceful) at the end. Nothing leaves the machine.

    HF_HUB_OFFLINE=1 nice -n 5 .venv/bin/python benchmarks/load_test.py --clients 1,8,32 --requests 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess

from _common import HOST, free_port, post_load, start_server, stop_servers, wait_ready

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def start_embforge(
    model: str, backend: str, batch: int, wait_ms: float, threads: int | None
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    flags = ["--backend", backend, "--max-batch-size", str(batch), "--max-wait-ms", str(wait_ms)]
    flags += ["--timeout", "300", "--model-name", "m", *(["--threads", str(threads)] if threads else [])]
    return start_server(model, port, *flags), f"http://{HOST}:{port}"


def batch_stats(url: str) -> tuple[float, float]:
    """(model calls, items) so far, from the server's Prometheus text."""
    import httpx

    calls = items = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith('embforge_batch_size_count{model="embedding"}'):
            calls = float(line.split()[-1])
        elif line.startswith('embforge_batch_size_sum{model="embedding"}'):
            items = float(line.split()[-1])
    return calls, items


async def run_load(
    url: str, sentences: list[str], clients: int, total: int, max_seconds: float
) -> dict[str, float]:
    """N clients sending single-sentence requests until ``total`` requests or ``max_seconds``."""
    bodies = [json.dumps({"input": text, "model": "m"}).encode() for text in sentences]
    load = await post_load(url, "/v1/embeddings", bodies, clients, max_seconds, total=total)
    return {
        "requests": len(load.latencies),
        "rps": len(load.latencies) / load.seconds,
        **load.percentiles(),
        "errors": load.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--backend", choices=("torch", "onnx"), default="torch")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement")
    parser.add_argument("--threads", type=int, default=None, help="model CPU threads of both servers")
    parser.add_argument("--max-seconds", type=float, default=30, help="time limit per measurement")
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternating measurements per server and level"
    )
    parser.add_argument("--max-batch-size", type=int, default=64, help="the batching server's batch limit")
    parser.add_argument("--max-wait-ms", type=float, default=5, help="the batching server's wait for more")
    args = parser.parse_args()

    from embforge.data.paths import data_root
    from embforge.data.tables import read_table

    data = read_table(
        data_root() / "stsb_en" / "stsb-en-test.csv", header=None, columns="0=sentence1,1=sentence2,2=score"
    )
    sentences = list(dict.fromkeys(data.columns["sentence1"] + data.columns["sentence2"]))
    servers = {
        f"micro-batching ({args.max_batch_size}, {args.max_wait_ms:g} ms)": start_embforge(
            args.model, args.backend, args.max_batch_size, args.max_wait_ms, args.threads
        ),
        "batch size 1": start_embforge(args.model, args.backend, 1, 0, args.threads),
    }
    try:
        for proc, url in servers.values():
            wait_ready(url, proc)
        for _, url in servers.values():  # warm-up
            asyncio.run(run_load(url, sentences, 4, 40, 30))
        levels = [int(x) for x in args.clients.split(",")]
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        names = list(servers)
        for level in levels:
            for rep in range(args.repeats):
                for name in names if rep % 2 == 0 else names[::-1]:
                    url = servers[name][1]
                    calls0, items0 = batch_stats(url)
                    res = asyncio.run(run_load(url, sentences, level, args.requests, args.max_seconds))
                    calls1, items1 = batch_stats(url)
                    res["mean_batch"] = (items1 - items0) / max(1.0, calls1 - calls0)
                    results.setdefault((name, level), []).append(res)
                    print(
                        f"{name:28s} clients={level:3d} {res['rps']:7.1f} req/s p50 {res['p50_ms']:.1f} ms "
                        f"p99 {res['p99_ms']:.1f} ms errors {res['errors']} mean batch {res['mean_batch']:.1f}",
                        flush=True,
                    )
    finally:
        stop_servers(proc for proc, _ in servers.values())
    print(
        f"\nbackend {args.backend}, model {args.model}, {args.requests} single-sentence requests per measurement "
        f"(max {args.max_seconds:.0f} s), {args.repeats} alternating measurements each (median shown)"
    )
    print("| server | clients | requests/s | p50 ms | p99 ms | errors |")
    print("|---|---:|---:|---:|---:|---:|")
    for level in levels:
        for name in names:
            runs = results[(name, level)]
            med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
            errors = sum(int(r["errors"]) for r in runs)
            print(
                f"| {name} | {level} | {med['rps']:.1f} | {med['p50_ms']:.1f} | {med['p99_ms']:.1f} | {errors} |"
            )
    for level in levels:
        fast = statistics.median(r["rps"] for r in results[(names[0], level)])
        slow = statistics.median(r["rps"] for r in results[(names[1], level)])
        print(f"clients={level}: micro-batching / batch-size-1 throughput = {fast / slow:.2f}x")


if __name__ == "__main__":
    main()
