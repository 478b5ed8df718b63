"""What several benchmarks share, written once: training settings, measured child processes, a server on loopback.

Training: ``args`` is the benchmark's parsed command line with ``epochs``, ``batch_size``, ``lr``, ``seed``,
``device`` and ``amp`` (``no`` or ``bf16``). Both sides get 10 % linear warm-up, weight decay 0.01, clipping at
1.0, no intermediate checkpoints and no progress output; ``overrides`` replace or add fields (``max_steps``, a
seed of their own, ...).

Serving: ``embforge serve`` started on 127.0.0.1 at a free port, waited for (``/health``), stopped (SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embforge.training.config import TrainConfig

HOST = "127.0.0.1"


# ------------------------------------------------------------------------------------------------ training
def peer_training_args(cls: Any, args: Any, out: Any, **overrides: Any) -> Any:
    """sentence-transformers' ``SentenceTransformerTrainingArguments`` / ``CrossEncoderTrainingArguments``."""
    settings = {
        "output_dir": str(out),
        "num_train_epochs": args.epochs,
        "per_device_train_batch_size": args.batch_size,
        "learning_rate": args.lr,
        "warmup_steps": 0.1,  # a float below 1 is a ratio of the total steps
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "seed": args.seed,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 10_000,
        "use_cpu": args.device == "cpu",
        "bf16": args.amp == "bf16",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }
    return cls(**{**settings, **overrides})


def quiet_config(output: Any, **fields: Any) -> TrainConfig:
    """A :class:`TrainConfig` for a measured run: no intermediate checkpoints, no progress output."""
    from embforge.training.config import TrainConfig

    return TrainConfig(**{"output": str(output), "save_every": 0, "quiet": True, **fields})


def embforge_train_config(args: Any, out: Any, **overrides: Any) -> TrainConfig:
    """embforge's :class:`TrainConfig` with the same settings as :func:`peer_training_args`."""
    shared = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed}
    shared |= {"warmup_ratio": 0.1, "weight_decay": 0.01, "max_grad_norm": 1.0}
    return quiet_config(out, **{**shared, "device": args.device, "amp": args.amp, **overrides})


# -------------------------------------------------------------------------------------- measured children
def parent_or_child(
    parser: argparse.ArgumentParser, child: Callable[[argparse.Namespace], None], *hidden: str
) -> argparse.Namespace | None:
    """Parse a benchmark's command line that measures itself in child processes (:func:`run_child`): adds the
    hidden flags ``--child`` and ``--NAME`` for each of ``hidden``; under ``--child`` runs ``child(args)`` and
    returns None, else returns the parent's arguments."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in hidden:
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        return args
    child(args)
    return None


def run_child(command: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> dict:
    """Run a benchmark's child process; its last stdout line (JSON) plus its own peak RSS (``wait4``), in MB."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, env=env, text=True)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise RuntimeError(f"{what} failed with status {status}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


# ------------------------------------------------------------------------------------- a server on loopback
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_server(
    model: str, port: int, *flags: str, log_level: str = "warning", checkout: str | None = None
) -> subprocess.Popen:
    """Start ``embforge serve`` for ``model`` on ``HOST:port`` (``flags``: more of its flags). With ``checkout``
    (an older checkout's folder) that checkout serves: it is the working folder, which ``python -c`` puts first on
    ``sys.path``, and the ``PYTHONPATH``."""
    run_cli = "import sys; from embforge.cli import main; sys.exit(main())"
    serve = ["serve", "--model", model, "--host", HOST, "--port", str(port), "--log-level", log_level]
    env = {**os.environ, **({"PYTHONPATH": checkout} if checkout else {})}
    return subprocess.Popen([sys.executable, "-c", run_cli, *serve, *flags], env=env, cwd=checkout)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Wait until the server at ``url`` answers ``/health`` (an error if its process ``proc`` ends first)."""
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server for {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server {url} not ready after {timeout}s")


def stop_servers(procs: Iterable[subprocess.Popen], timeout: float = 30) -> None:
    """Stop servers gracefully (SIGINT, all at once); kill one that is still running after ``timeout`` seconds."""
    procs = list(procs)
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass
class Load:
    """What :func:`post_load` measured: each answered or failed request's latency (s), the failures, the time."""

    latencies: list[float]
    errors: int
    seconds: float

    def percentiles(self) -> dict[str, float]:
        """p50 and p99 latency, in milliseconds."""
        ordered = sorted(self.latencies)
        return {
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        }


async def post_load(
    url: str,
    path: str,
    bodies: list[bytes],
    clients: int,
    seconds: float,
    *,
    total: int = 0,
    timeout: float = 60,
) -> Load:
    """``clients`` clients on kept-alive connections POST ``bodies`` (JSON, built before the clock starts) in turn
    to ``url + path`` for ``seconds`` (or until ``total`` requests, when given); answers are read whole but not
    parsed. aiohttp: a light client, so the load generator's own CPU use, which shares the cores with the
    servers, stays small."""
    import aiohttp

    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    errors = sent = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as http:
        start = time.perf_counter()
        stop_at = start + seconds

        async def client() -> None:
            nonlocal sent, errors
            while (not total or sent < total) and time.perf_counter() < stop_at:
                body = bodies[sent % len(bodies)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    async with http.post(path, data=body, headers=headers) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok

        await asyncio.gather(*(client() for _ in range(clients)))
        return Load(latencies, errors, time.perf_counter() - start)
