"""The web UI's server side, without a browser: which paths load without a key,
the headers they carry, the dashboard's JSON, per-replica series, ``--no-ui``."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from octavo.core.kv_cache_manager import PrefixCacheStats
from octavo.core.scheduler import SchedulerStats
from octavo.entrypoints.openai.app import build_app
from octavo.entrypoints.openai.config import ServerConfig
from octavo.entrypoints.ui.api import registry_sample
from octavo.entrypoints.ui.static_files import PAGES, STATIC_PREFIX, load_static_files, public_paths

API_KEY = "ui-key"
KEY = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def engine():
    from octavo import LLM

    llm = LLM(dtype="float32", max_model_len=256, num_kv_blocks=64)  # the demo model
    yield llm.engine
    llm.engine.shutdown()


@pytest.fixture(scope="module")
def client(engine):
    app = build_app(engine, ServerConfig(served_model_names=["demo"], api_key=API_KEY))
    with TestClient(app) as client:
        yield client


def test_pages_and_their_files_load_without_a_key(client):
    for path in PAGES:
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
        # Every file a page names is served, without a key, and nothing comes from elsewhere.
        for reference in re.findall(r'(?:src|href)="([^"]+)"', response.text):
            if reference.startswith("/"):
                assert client.get(reference).status_code == 200, reference
            else:
                assert not reference.startswith(("http:", "https:", "//")), reference
    assert client.get(STATIC_PREFIX + "playground.js").headers["content-type"].startswith("text/javascript")


def test_the_pages_hold_no_data(client):
    text = "".join(client.get(path).text for path in PAGES)
    assert "demo" not in text and API_KEY not in text


def test_data_calls_and_other_paths_need_the_key(client):
    for path in ("/ui/api/config", "/ui/api/stats", "/metrics", STATIC_PREFIX + "missing.js", "/ui/other", "/dashboard/x"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
    assert client.get("/ui/api/config", headers=KEY).status_code == 200
    assert client.get(STATIC_PREFIX + "missing.js", headers=KEY).status_code == 404
    assert client.post("/", headers=KEY).status_code == 405


def test_public_paths_are_exactly_the_pages_and_files():
    files = load_static_files()
    assert public_paths(files) == {"/", "/ui", "/dashboard"} | {STATIC_PREFIX + name for name in files}
    assert {"playground.html", "dashboard.html", "common.js", "markdown.js", "style.css"} <= set(files)


def test_config_reports_the_engine(client):
    config = client.get("/ui/api/config", headers=KEY).json()
    assert config["served_model_names"] == ["demo"]
    assert config["model_path"].endswith("demo-model") and config["architecture"] == "LlamaForCausalLM"
    assert (config["dtype"], config["platform"], config["quantization"]) == ("float32", "cpu", None)
    assert config["attention_backends"] == ["torch_paged"]
    assert config["num_replicas"] == 1 and config["num_kv_blocks"] == 64
    assert config["max_model_len"] == 256 and config["max_num_batched_tokens"] >= 256
    assert config["enable_prefix_caching"] is True and config["kv_cache_dtype"] == "auto"


def test_stats_are_the_metrics_as_json(client):
    body = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    assert client.post("/v1/completions", json=body, headers=KEY).status_code == 200
    stats = client.get("/ui/api/stats", headers=KEY).json()
    series = stats["series"]
    assert series["generation_tokens"] >= 5 and series["prompt_tokens"] >= 1
    assert series["engine_alive"] == 1 and series["num_requests_running"] == 0
    assert stats["labelled"]["request_success"]["length"] >= 1
    ttft = stats["histograms"]["time_to_first_token_seconds"]
    assert ttft["le"][-1] is None and ttft["counts"][-1] == ttft["count"] >= 1
    assert stats["histograms"]["inter_token_latency_seconds"]["count"] >= 4
    assert stats["replicas"] == []


def test_stats_per_replica():
    from octavo.distributed.replica_stats import ReplicaStats
    from octavo.entrypoints.engine_stats import EngineSnapshot
    from octavo.entrypoints.metrics import ServerMetrics

    def replica(index: int, running: int) -> ReplicaStats:
        scheduler = SchedulerStats(running, 1, 0.25 * (index + 1), 10, index, PrefixCacheStats(100, 40 + index, 3))
        return ReplicaStats(index, scheduler, 32, 7 + index, 5)

    metrics = ServerMetrics(num_replicas=2)
    replicas = (replica(0, 2), replica(1, 3))
    combined = SchedulerStats(5, 2, 0.375, 20, 1, PrefixCacheStats(200, 81, 6))
    metrics.update_engine_stats(EngineSnapshot(combined, replicas), True, 5)
    sample = registry_sample(metrics.registry, 12.5)
    assert sample["time"] == 12.5 and sample["series"]["num_requests_running"] == 5
    first, second = sample["replicas"]
    assert (first["num_requests_running"], second["num_requests_running"]) == (2, 3)
    assert (first["kv_cache_usage_perc"], second["kv_cache_usage_perc"]) == (0.25, 0.5)
    assert (first["prefix_cache_hits"], second["prefix_cache_queries"]) == (40, 100)
    assert (second["num_preemptions"], second["requests_routed"]) == (1, 8)


def test_no_ui_turns_the_pages_off(engine):
    app = build_app(engine, ServerConfig(served_model_names=["demo"], api_key=API_KEY, enable_ui=False))
    with TestClient(app) as client:
        for path in (*PAGES, STATIC_PREFIX + "style.css", "/ui/api/config"):
            assert client.get(path).status_code == 401, path  # deny by default: no longer public
            assert client.get(path, headers=KEY).status_code == 404, path
        assert client.get("/health").status_code == 200


def test_no_ui_without_a_key_is_404(engine):
    app = build_app(engine, ServerConfig(served_model_names=["demo"], enable_ui=False))
    with TestClient(app) as client:
        assert client.get("/").status_code == 404 and client.get("/dashboard").status_code == 404


def test_serve_flag():
    import argparse

    from octavo.entrypoints.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    assert serve.server_config_from(parser.parse_args(["serve"])).enable_ui is True
    assert serve.server_config_from(parser.parse_args(["serve", "--no-ui"])).enable_ui is False
