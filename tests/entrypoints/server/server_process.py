"""Start the real ``octavo serve`` process on a free loopback port, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """One ``python -m octavo.entrypoints.cli.main serve ...`` subprocess and its log."""

    def __init__(self, model: Path | str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [sys.executable, "-m", "octavo.entrypoints.cli.main", "serve", str(model), "--port", str(self.port)]
        command += ["--dtype", "float32", "--disable-uvicorn-access-log", *args]
        full_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{self.log()}")

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        self.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
