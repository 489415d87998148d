"""Hub downloads through a stand-in Hub on 127.0.0.1 (``HF_ENDPOINT``): a full
download, a resumed one, offline mode, gated and missing repos, a repo with
only pickle weights, and the choice of one GGUF file."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from octavo.errors import HubAccessError, ModelLoadError, ModelNotFoundError
from octavo.models.hub import (
    HubOptions,
    parse_hub_id,
    resolve_model,
    select_gguf_file,
    sentence_transformers_files,
)
from tests.models.stand_in_hub import GOOD_TOKEN, StandInHub, StandInRepo

REPO = "octavo-test/tiny-llama"


def _checkpoint_files(llama_dir: Path) -> dict[str, bytes]:
    files = {p.name: p.read_bytes() for p in llama_dir.iterdir() if p.is_file()}
    # What a real repo also holds, and Octavo must not fetch.
    files["README.md"] = b"# tiny"
    files["pytorch_model.bin"] = b"pickle, never fetched"
    files["original/consolidated.00.pth"] = b"pickle, never fetched"
    return files


@pytest.fixture
def hub(llama_dir, monkeypatch, tmp_path):
    stand_in = StandInHub(
        repos={
            REPO: StandInRepo(_checkpoint_files(llama_dir)),
            "octavo-test/gated": StandInRepo({"config.json": b"{}", "model.safetensors": b"x" * 64}, gated=True),
            "octavo-test/pickles": StandInRepo({"config.json": b"{}", "pytorch_model.bin": b"pickle"}),
        }
    )
    monkeypatch.setenv("HF_ENDPOINT", stand_in.start())
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    yield stand_in
    stand_in.stop()


def _fetched(hub: StandInHub) -> set[str]:
    return {path.split("/resolve/", 1)[1].split("/", 1)[1] for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path}


def test_full_download_fetches_only_what_the_engine_loads(hub, llama_dir, tmp_path, make_llm):
    path = resolve_model(REPO, HubOptions(download_dir=str(tmp_path / "cache")))
    assert (path / "model.safetensors").read_bytes() == (llama_dir / "model.safetensors").read_bytes()
    assert "pytorch_model.bin" not in _fetched(hub) and "README.md" not in _fetched(hub)
    assert not any(name.startswith("original/") for name in _fetched(hub))
    # The engine takes the Hub id itself, and gives what the local directory gives.
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6)
    remote = make_llm(REPO, download_dir=str(tmp_path / "cache")).generate("Hello", params)
    local = make_llm(llama_dir).generate("Hello", params)
    assert remote[0].outputs[0].token_ids == local[0].outputs[0].token_ids


def test_an_embedding_model_brings_its_sentence_transformers_modules(hub, pooling_dirs, tmp_path, make_llm):
    local = pooling_dirs("bert")  # mean pooling (1_Pooling/config.json), normalised
    files = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    files["onnx/model.onnx"] = b"another runtime's weights, never fetched"
    hub.repos["octavo-test/tiny-embedder"] = StandInRepo(files)
    texts = ["the cat sat on the mat", "hello"]
    remote = make_llm("octavo-test/tiny-embedder", download_dir=str(tmp_path / "cache"), max_model_len=64).embed(texts)
    assert "1_Pooling/config.json" in _fetched(hub) and "onnx/model.onnx" not in _fetched(hub)
    expected = make_llm(local, max_model_len=64).embed(texts)
    for ours, reference in zip(remote, expected):
        assert ours.outputs.embedding == reference.outputs.embedding


def test_only_the_listed_modules_json_files_are_named(tmp_path):
    modules = [{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense/"}, {"path": "3_Normalize"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    filenames = ["config.json", "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors",
                 "9_Other/config.json", "1_Pooling/nested/x.json"]
    assert sentence_transformers_files(filenames, tmp_path / "modules.json") == ["1_Pooling/config.json", "2_Dense/config.json"]
    (tmp_path / "modules.json").write_text("not json")
    assert sentence_transformers_files(filenames, tmp_path / "modules.json") == []
    assert sentence_transformers_files(filenames, tmp_path / "absent.json") == []


def test_a_dropped_connection_resumes_with_a_range_request(hub, tmp_path):
    # huggingface_hub keeps what it received in whole 10 MiB chunks: the
    # connection drops after the first chunk, and the download resumes there.
    weights = bytes(range(256)) * (48 << 10)  # 12 MiB
    hub.repos["octavo-test/big"] = StandInRepo({"config.json": b"{}", "model.safetensors": weights})
    hub.drop_after["model.safetensors"] = 11 << 20
    path = resolve_model("octavo-test/big", HubOptions(download_dir=str(tmp_path)))
    assert (path / "model.safetensors").read_bytes() == weights
    assert hub.gets("model.safetensors") == [None, f"bytes={10 << 20}-"]


def test_an_interrupted_download_fetches_only_the_missing_files_again(hub, tmp_path):
    hub.fail.add("model.safetensors")
    with pytest.raises(Exception, match="failed|reach"):
        resolve_model(REPO, HubOptions(download_dir=str(tmp_path)))
    hub.fail.clear()
    hub.requests.clear()
    resolve_model(REPO, HubOptions(download_dir=str(tmp_path)))
    assert _fetched(hub) == {"model.safetensors"}


def test_offline_mode_uses_the_cache_and_never_the_network(hub, tmp_path, monkeypatch):
    online = resolve_model(REPO, HubOptions(download_dir=str(tmp_path)))
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(REPO, HubOptions(download_dir=str(tmp_path))) == online
    assert hub.requests == []
    with pytest.raises(ModelNotFoundError, match="not in the local Hub cache.*HF_HUB_OFFLINE"):
        resolve_model(REPO, HubOptions(download_dir=str(tmp_path / "empty")))


def test_an_unreachable_hub_falls_back_to_the_cache_or_says_so(hub, tmp_path, monkeypatch):
    online = resolve_model(REPO, HubOptions(download_dir=str(tmp_path)))
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{sock.getsockname()[1]}")
    assert resolve_model(REPO, HubOptions(download_dir=str(tmp_path))) == online
    with pytest.raises(ModelNotFoundError, match="could not reach the Hub"):
        resolve_model(REPO, HubOptions(download_dir=str(tmp_path / "empty")))


def test_gated_repo_needs_a_token_with_access(hub, tmp_path, monkeypatch):
    with pytest.raises(HubAccessError, match="gated repo and no token is set.*HF_TOKEN"):
        resolve_model("octavo-test/gated", HubOptions(download_dir=str(tmp_path)))
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(HubAccessError, match="has no access"):
        resolve_model("octavo-test/gated", HubOptions(download_dir=str(tmp_path)))
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    path = resolve_model("octavo-test/gated", HubOptions(download_dir=str(tmp_path)))
    assert (path / "model.safetensors").read_bytes() == b"x" * 64


def test_missing_repo_and_revision_are_clear_errors(hub, tmp_path):
    with pytest.raises(ModelNotFoundError, match="octavo-test/nope was not found"):
        resolve_model("octavo-test/nope", HubOptions(download_dir=str(tmp_path)))
    with pytest.raises(ModelNotFoundError, match="no revision 'v9'"):
        resolve_model(REPO, HubOptions(revision="v9", download_dir=str(tmp_path)))


def test_a_repo_with_only_pickle_weights_is_refused_before_any_download(hub, tmp_path):
    with pytest.raises(ModelLoadError, match="only pickle weights.*safetensors and GGUF only"):
        resolve_model("octavo-test/pickles", HubOptions(download_dir=str(tmp_path)))
    assert _fetched(hub) == set()


def test_dummy_weights_fetch_only_the_configuration(hub, tmp_path, monkeypatch):
    path = resolve_model(REPO, HubOptions(download_dir=str(tmp_path)), weights=False)
    assert (path / "config.json").exists() and not (path / "model.safetensors").exists()
    assert "model.safetensors" not in _fetched(hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # that snapshot is no checkpoint to load offline
    with pytest.raises(ModelNotFoundError, match="holds no weights"):
        resolve_model(REPO, HubOptions(download_dir=str(tmp_path)))


def test_hub_ids_and_gguf_choice():
    assert parse_hub_id("Qwen/Qwen3-0.6B").repo_id == "Qwen/Qwen3-0.6B"
    assert parse_hub_id("org/name-GGUF:Q4_K_M").quant_tag == "Q4_K_M"
    assert parse_hub_id("./local/dir") is None and parse_hub_id("a/b/c") is None and parse_hub_id("x") is None
    files = ["config.json", "m-Q4_K_M.gguf", "m-Q4_K.gguf", "m-Q8_0.gguf", "README.md"]
    assert select_gguf_file(files, "o/m", "q4_k_m", None) == "m-Q4_K_M.gguf"
    assert select_gguf_file(files, "o/m", "Q4_K", None) == "m-Q4_K.gguf"
    assert select_gguf_file(files, "o/m", None, "m-Q8_0.gguf") == "m-Q8_0.gguf"
    with pytest.raises(ModelLoadError, match="several GGUF files.*o/m:TAG"):
        select_gguf_file(files, "o/m", None, None)
    with pytest.raises(ModelNotFoundError, match="no GGUF file for 'IQ2'"):
        select_gguf_file(files, "o/m", "IQ2", None)
    assert select_gguf_file(["model.safetensors", "m.gguf"], "o/m", None, None) is None
    assert select_gguf_file(["only.gguf"], "o/m", None, None) == "only.gguf"
