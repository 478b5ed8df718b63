"""Screenshots of the built site in headless Chromium, to look at what a reader sees (`make docs-shots`).

Serves ``site/`` (built by ``make docs``) with ``python -m http.server`` on loopback and has Chromium write one
PNG per page into ``--out`` (default ``site-shots/``, ignored by git). Not a suite test: CI has no Chromium
(``apt-get install -y chromium`` on Debian)::

    .venv/bin/python docs/screenshots.py --site site --out site-shots
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAGES = {"home": "", "api-models": "api/models/", "guide-dense": "guides/dense/", "results": "results/"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"the site server on port {port} did not start within {seconds:.0f} s")


def shoot(chromium: str, url: str, png: Path, *, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                f"--window-size=1280,{height}",
                "--hide-scrollbars",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    if not png.exists() or png.stat().st_size < 10_000:
        raise SystemExit(f"Chromium wrote no useful screenshot of {url} ({png})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--site", type=Path, default=Path("site"), help="the built site (make docs)")
    parser.add_argument("--out", type=Path, default=Path("site-shots"), help="folder for the PNGs")
    parser.add_argument("--height", type=int, default=900, help="window height in pixels (width 1280)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("no Chromium on PATH: apt-get install -y chromium")
    if not (args.site / "index.html").exists():
        raise SystemExit(f"{args.site}/index.html is missing: run make docs first")
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(args.site),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(port)
        for name, path in PAGES.items():
            png = args.out / f"{name}.png"
            shoot(chromium, f"http://127.0.0.1:{port}/{path}", png, height=args.height)
            print(png)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
