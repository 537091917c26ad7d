"""Starting `anychip serve` on a loopback port for the serving tests (and the serving benchmark)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`anychip serve --model MODEL --device DEVICE *ARGS` in a child process on a free loopback
    port, ready (its /health answers) when the constructor returns. Use as a context manager."""

    def __init__(self, model: Path | str, device: str = "cpu", *args, ready_s: float = 120,
                 env: dict | None = None):
        self._stderr = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "anychip.cli.main", "serve", "--model", str(model), "--device", device,
               "--port", str(self.port), *map(str, args)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"anychip serve exited with {self.proc.returncode}:\n{self.proc.stderr.read()}")
            try:
                self.get("/health")
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"anychip serve did not answer /health within {ready_s} s")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def text(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.read().decode()

    def stop(self) -> str:
        """Stops the server; returns what it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._stderr is None:
            self._stderr = self.proc.stderr.read()
        return self._stderr

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
