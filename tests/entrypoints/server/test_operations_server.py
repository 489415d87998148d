"""``octavo serve`` as an operator runs it: HTTPS with a self-signed
certificate, CORS for one origin, JSON logs with request ids, and request
traces sent to an OTLP receiver. (The engine stays in the server's process to
keep the test short; tests/entrypoints/test_operations.py covers how an engine
process takes the log format.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import httpx
import pytest

from tests.entrypoints.otlp_receiver import OtlpReceiver, attributes
from tests.entrypoints.server.conftest import wait_for

_LISTENING = re.compile(r"Uvicorn running on https://127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return key, cert


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_tls_cors_json_logs_and_traces(certificate, tmp_path):
    pytest.importorskip("opentelemetry.sdk")
    key, cert = certificate
    receiver = OtlpReceiver()
    endpoint = receiver.start()
    log_path = tmp_path / "server.log"
    command = [
        sys.executable, "-m", "octavo.entrypoints.cli.main", "serve", "--port", "0", "--dtype", "float32",
        "--max-num-seqs", "4", "--no-engine-process", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
        "--allowed-origins", "https://ui.example", "--log-format", "json", "--otlp-traces-endpoint", endpoint,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", OTEL_BSP_SCHEDULE_DELAY="50")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        port = wait_for(lambda: process.poll() is None and _LISTENING.search(log_path.read_text()) or _exited(process, log_path))
        url = f"https://127.0.0.1:{port.group(1)}"
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=120) as client:
            assert client.get(f"{url}/health").status_code == 200
            reply = client.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 5})
            assert reply.status_code == 200, reply.text
            request_id = reply.headers["x-request-id"]
            assert request_id in reply.json()["id"]
            preflight = client.options(f"{url}/v1/completions", headers={
                "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            })
            assert preflight.headers["access-control-allow-origin"] == "https://ui.example"
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port.group(1)}/health", timeout=10)
        spans = wait_for(lambda: _trace_of(receiver, request_id))
        assert {span.name for span in spans} == {"llm_request", "queue", "prefill", "decode"}
        lines = _json_lines(log_path.read_text())
        assert any(line.get("request_id") == request_id and "/v1/completions" in line["message"] for line in lines)
        assert any(line["message"].startswith("start-up: engine ready") for line in lines)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        receiver.stop()


def _exited(process, log_path):
    if process.poll() is not None:
        raise AssertionError(f"the server exited with {process.returncode}:\n{log_path.read_text()}")
    return None


def _trace_of(receiver: OtlpReceiver, request_id: str) -> list:
    spans = receiver.snapshot()
    roots = [s for s in spans if s.name == "llm_request" and request_id in attributes(s)["gen_ai.request.id"]]
    if not roots:
        return []
    trace = [s for s in spans if s.trace_id == roots[0].trace_id]
    return trace if len(trace) == 4 else []


def test_mutual_tls(certificate, tmp_path):
    """``--ssl-ca-certs`` with ``--ssl-cert-reqs 2``: a client with a certificate
    the CA signed is served; one without cannot connect."""
    key, cert = certificate
    client_key, client_cert = tmp_path / "client-key.pem", tmp_path / "client-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(client_key), "-out",
         str(client_cert), "-days", "1", "-subj", "/CN=client"],
        check=True, capture_output=True,
    )
    log_path = tmp_path / "server.log"
    command = [
        sys.executable, "-m", "octavo.entrypoints.cli.main", "serve", "--port", "0", "--dtype", "float32",
        "--max-num-seqs", "4", "--no-engine-process", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
        "--ssl-ca-certs", str(client_cert), "--ssl-cert-reqs", "2", "--enable-request-id-headers",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        port = wait_for(lambda: process.poll() is None and _LISTENING.search(log_path.read_text()) or _exited(process, log_path))
        url = f"https://127.0.0.1:{port.group(1)}"
        context = ssl.create_default_context(cafile=str(cert))
        context.load_cert_chain(str(client_cert), str(client_key))
        with httpx.Client(verify=context, timeout=120) as client:
            reply = client.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3})
            assert reply.status_code == 200, reply.text
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", verify=ssl.create_default_context(cafile=str(cert)), timeout=10)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
