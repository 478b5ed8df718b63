"""Issue #15 (sockets): a real uvicorn on loopback. A 500 keeps the keep-alive connection usable; clients that
trickle headers or bodies are cut off; open connections are capped; a concurrent add of one id is one 200."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.conftest import fail_batches_of, running


def test_a_500_keeps_the_keep_alive_connection_usable(tiny_encoder):
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    fail_batches_of(tiny_encoder, 3)  # a model call that fails: 'out of memory'
    config = ServeConfig(max_wait_ms=0)
    with running(create_app(tiny_encoder, config=config), config) as (port, _):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"content-type": "application/json"}
        conn.request("POST", "/v1/embeddings", body=b'{"input": ["a", "b", "c"]}', headers=headers)
        failed = conn.getresponse()
        body = failed.read()
        assert failed.status == 500 and b"out of memory" in body
        if failed.getheader("connection", "").lower() != "close":  # keep-alive promised: it must hold
            conn.request("POST", "/v1/embeddings", body=b'{"input": "the cat"}', headers=headers)
            again = conn.getresponse()
            assert again.status == 200 and again.read()
        conn.close()


def test_slow_clients_are_cut_off_and_open_connections_are_capped(tiny_encoder):
    from embforge.serve.app import create_app
    from embforge.serve.config import ServeConfig

    config = ServeConfig(max_wait_ms=0, header_timeout_s=0.5, body_timeout_s=0.5, max_connections=40)
    with running(create_app(tiny_encoder, config=config), config) as (port, server):
        trickling = []
        for _ in range(30):  # slowloris: headers that never end
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")
            trickling.append(sock)
        body = socket.create_connection(("127.0.0.1", port))  # headers done, body never comes
        body.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n")
        body.sendall(b'content-length: 100\r\n\r\n{"input":')
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # connect, send nothing
        time.sleep(0.2)
        connections = server.server_state.connections
        assert len(connections) <= 40  # 51 opened, the cap holds
        for sock in trickling[:5]:
            sock.sendall(b"X-Slow: 1\r\n")  # still trickling: a byte now and then does not keep it alive
        deadline = time.time() + 10
        while connections and time.time() < deadline:
            time.sleep(0.05)
        assert not connections, f"{len(connections)} slow connections still open"
        answers = []
        for sock in [*trickling, *silent, body]:
            sock.settimeout(5)
            data = b""
            try:
                while chunk := sock.recv(4096):
                    data += chunk
            except ConnectionResetError:
                pass
            answers.append(data)
            sock.close()
        assert all(a == b"" or a.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for a in answers)
        assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) >= 30  # the trickling ones
        assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) == 11  # 51 connections, cap 40
        # and the server still serves
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request(
            "POST", "/v1/embeddings", body=b'{"input": "a cat"}', headers={"content-type": "application/json"}
        )
        assert conn.getresponse().status == 200
        conn.close()
