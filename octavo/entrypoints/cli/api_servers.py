"""``octavo serve --api-server-count N``: N API processes in front of the
engine processes, for when one API process's Python (HTTP, JSON,
detokenizing) is what limits the server.

The launcher (this process) starts the engine replicas (each with one pipe
per API process), then the API processes. Each API process listens on the
same address with its own ``SO_REUSEPORT`` socket, so the kernel spreads
new connections over them; each has its own data-parallel front
(``DataParallelEngine`` over the replicas' pipes), tokenizer, output
processing and event loop, and a request lives in the API process that
accepted it. ``/metrics`` answers for all of them from any one
(``PROMETHEUS_MULTIPROC_DIR``; ``octavo:api_server_requests_total`` counts
per API process).

Lifecycle: the launcher logs the usual ``Uvicorn running on ...`` line once
every API process is listening. SIGTERM or SIGINT here is passed to the API
processes as SIGTERM (each drains as a single server does); an API process
that exits on its own stops the others. The replicas exit when every API
process has left them; whatever is left after a grace period is killed.
Exit status 0 after a drain, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.connection import wait

logger = logging.getLogger("octavo.serve")
START_TIMEOUT_S = 1800.0
REPLICA_EXIT_GRACE_S = 30.0


def listening_socket(host: str, port: int, listen: bool) -> socket.socket:
    """A TCP socket on ``host:port`` that other sockets of this user may share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
        sock.setblocking(False)
    return sock


def run_api_servers(args: argparse.Namespace) -> int:
    from octavo.distributed.data_parallel import spawn_replicas
    from octavo.entrypoints.cli.common import engine_args_from
    from octavo.runtime.executors.multiproc import kill_processes

    engine_args = dataclasses.replace(engine_args_from(args), engine_process=True)
    engine_args.validate()
    metrics_dir = tempfile.mkdtemp(prefix="octavo-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # the API processes inherit it
    reserved = listening_socket(args.host, args.port, listen=False)  # holds the port until they listen
    port = reserved.getsockname()[1]
    replicas, front_ends = spawn_replicas(engine_args, num_fronts=args.api_server_count)
    context = multiprocessing.get_context("spawn")
    options = {k: v for k, v in vars(args).items() if k != "func"}
    servers, ready = [], []
    for index, links in enumerate(front_ends):
        started = context.Event()
        process = context.Process(
            target=api_server_process, name=f"octavo-api-server-{index}",
            args=(index, port, links, [r.pid for r in replicas], options, started),
        )
        process.start()
        for conn in links:
            conn.close()
        logger.info("API server %d started (pid %d)", index, process.pid)
        servers.append(process)
        ready.append(started)
    stopping = _forward_signals(servers)
    try:
        if not _wait_ready(servers, ready, replicas):
            _terminate(servers)
        else:
            reserved.close()
            logger.info("Uvicorn running on http://%s:%d (%d API server processes; Press CTRL+C to quit)",
                        args.host, port, len(servers))
        clean = _supervise(servers, stopping)
    finally:
        reserved.close()
        _terminate(servers)
        deadline = time.monotonic() + REPLICA_EXIT_GRACE_S
        for process in [*servers, *replicas]:
            process.join(max(0.0, deadline - time.monotonic()))
        kill_processes([*servers, *replicas])
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0 if clean else 1


def _forward_signals(servers: list) -> list[bool]:
    stopping = [False]

    def forward(signum, frame) -> None:
        stopping[0] = True
        _terminate(servers)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return stopping


def _terminate(servers: list) -> None:
    for process in servers:
        if process.is_alive():
            process.terminate()  # SIGTERM: each drains


def _wait_ready(servers: list, ready: list, replicas: list) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(event.is_set() for event in ready):
        dead = [p for p in [*servers, *replicas] if not p.is_alive()]
        if dead or time.monotonic() > deadline:
            logger.error("%s exited before the server was ready", dead[0].name if dead else "nothing")
            return False
        time.sleep(0.1)
    return True


def _supervise(servers: list, stopping: list[bool]) -> bool:
    """Wait for every API process to exit; True if they drained after a signal."""
    clean = True
    while any(p.is_alive() for p in servers):
        for sentinel in wait([p.sentinel for p in servers if p.is_alive()], timeout=1.0):
            process = next(p for p in servers if p.sentinel == sentinel)
            process.join()
            if not stopping[0]:
                logger.error("API server %s exited (status %s): stopping the others", process.name, process.exitcode)
                stopping[0] = True
                clean = False
                _terminate(servers)
            clean = clean and process.exitcode == 0
    return clean


def api_server_process(index: int, port: int, links: list, replica_pids: list[int], options: dict, started) -> None:
    """One API process: a front over the replicas' pipes, the app, uvicorn on a shared port."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher coordinates the stop
    args = argparse.Namespace(**options)
    from octavo.distributed.data_parallel import DataParallelEngine
    from octavo.entrypoints.cli.common import engine_args_from
    from octavo.entrypoints.cli.serve import serve_app, server_config_from
    from octavo.entrypoints.logging_setup import configure_logging
    from octavo.entrypoints.openai.app import build_app

    configure_logging(args.log_level, args.log_format)

    config = server_config_from(args)
    engine = DataParallelEngine(engine_args_from(args), links=links, pids=replica_pids)
    app = build_app(engine, config, api_server_index=index)
    sock = listening_socket(args.host, port, listen=True)
    serve_app(app, args, config, sockets=[sock], on_started=started.set)
