"""Start the real ``octavo serve`` process on a loopback port, for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 180.0


# uvicorn logs the port it bound when asked for port 0 (no race for a "free" port).
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    """One ``python -m octavo.entrypoints.cli.main serve ...`` subprocess (on a loopback port the
    OS picks) and its log; ``url`` is known once ``wait_healthy`` returns."""

    def __init__(self, model: Path | str | None, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        """``model=None`` serves the default (demo) model."""
        self.url = ""
        self.log_path = log_path
        command = [sys.executable, "-m", "octavo.entrypoints.cli.main", "serve"]
        command += ([str(model)] if model is not None else []) + ["--port", "0"]
        command += ["--dtype", "float32", "--disable-uvicorn-access-log", *args]
        full_env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    @classmethod
    @contextmanager
    def running(cls, model: Path | str | None, args: list[str], log_path: Path) -> Iterator[ServerProcess]:
        """A healthy server for the ``with`` block, stopped after it."""
        process = cls(model, args, log_path)
        try:
            process.wait_healthy()
            yield process
        finally:
            process.stop()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            listening = _LISTENING.search(self.log())
            if listening:
                self.url = f"http://127.0.0.1:{listening.group(1)}"
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
