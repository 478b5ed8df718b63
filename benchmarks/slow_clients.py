"""Slow clients (slowloris) against ``embforge serve``: do trickling connections hold sockets and file descriptors?

Starts the server on loopback (``--header-timeout`` as given), opens ``--connections`` connections that send a
request head one header line every ``--trickle`` seconds and never finish it, and samples for ``--seconds`` the
server's open file descriptors (``/proc/PID/fd``) and how many of the slow connections are still open, while one
good client keeps sending requests. With ``--server-pythonpath OLD_CHECKOUT`` the server runs an older checkout.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/slow_clients.py --connections 300 --seconds 40
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import time

from _common import HOST, free_port, start_server, stop_servers, wait_ready


def still_open(sock: socket.socket) -> bool:
    """Whether the server has neither answered (408) nor closed the connection."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # the 408, or b"" after the close
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--trickle", type=float, default=1.0, help="seconds between header lines")
    parser.add_argument("--header-timeout", type=float, default=10.0)
    parser.add_argument("--server-pythonpath", default=None, help="run the server from this (older) checkout")
    args = parser.parse_args()

    port = free_port()
    flags = ["--threads", "1"] + (
        [] if args.server_pythonpath else ["--header-timeout", str(args.header_timeout)]
    )
    proc = start_server(args.model, port, *flags, log_level="critical", checkout=args.server_pythonpath)
    samples = []
    good = {"ok": 0, "failed": 0}
    try:
        wait_ready(f"http://{HOST}:{port}", proc)
        before = open_fds(proc.pid)
        socks = []
        for _ in range(args.connections):
            sock = socket.create_connection((HOST, port))
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        started = time.perf_counter()
        next_line = started
        while time.perf_counter() - started < args.seconds:
            if time.perf_counter() >= next_line:
                alive = 0
                for sock in socks:
                    if still_open(sock):
                        alive += 1
                        with contextlib.suppress(OSError):
                            sock.sendall(b"X-Slow: 1\r\n")
                samples.append((round(time.perf_counter() - started, 1), alive, open_fds(proc.pid)))
                next_line += args.trickle
            conn = http.client.HTTPConnection(HOST, port, timeout=30)
            try:
                conn.request(
                    "POST",
                    "/v1/embeddings",
                    body=b'{"input": "a cat"}',
                    headers={"content-type": "application/json"},
                )
                good["ok" if conn.getresponse().status == 200 else "failed"] += 1
            except OSError:
                good["failed"] += 1
            finally:
                conn.close()
        for sock in socks:
            sock.close()
    finally:
        stop_servers([proc])
    print(
        json.dumps(
            {
                "server": args.server_pythonpath or "this checkout",
                "fds_before": before,
                "samples (s, slow connections open, server fds)": samples[:: max(1, len(samples) // 10)],
                "good_requests": good,
            }
        )
    )


if __name__ == "__main__":
    main()
