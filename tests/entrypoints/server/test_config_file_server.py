"""``octavo serve --config FILE.yaml`` as vLLM deployments start it: the
model, the served name, the key and the server's options from the file;
``root-path`` lets a proxy serve it under a prefix (requests with and
without the prefix reach the same routes)."""

from __future__ import annotations

import httpx

from tests.entrypoints.server.server_process import ServerProcess


def test_a_server_started_from_a_config_file(llama_dir, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"model: {llama_dir}\nserved-model-name: tiny-from-yaml\napi-key: yaml-key\nroot-path: /api\n"
        "max-model-len: 256\nnum-kv-blocks: 64\nengine-process: false\n"
    )
    headers = {"Authorization": "Bearer yaml-key"}
    with ServerProcess.running(None, ["--config", str(config)], tmp_path / "server.log") as server:
        for prefix in ("/api", ""):
            models = httpx.get(f"{server.url}{prefix}/v1/models", headers=headers, timeout=30)
            assert models.status_code == 200, models.text
            assert [m["id"] for m in models.json()["data"]] == ["tiny-from-yaml"]
        body = {"model": "tiny-from-yaml", "prompt": "Once upon a time", "max_tokens": 4}
        completion = httpx.post(f"{server.url}/api/v1/completions", json=body, headers=headers, timeout=60)
        assert completion.status_code == 200, completion.text
        assert httpx.get(f"{server.url}/api/v1/models", timeout=30).status_code == 401
