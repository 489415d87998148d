"""Models named by their Hugging Face Hub id: ``org/name``, ``org/name:Q4_K_M``.

``resolve_model`` turns a model argument into a local path: a path that
exists is used as is; a Hub id is downloaded with ``huggingface_hub`` into
its cache (``--download-dir``, else ``HF_HUB_CACHE``), at ``--revision``,
with ``HF_TOKEN`` for private and gated repos, a progress bar, and files
already cached never fetched again. ``HF_HUB_OFFLINE=1`` (read when called)
uses the cache only; so does a Hub that cannot be reached, if the model is
cached.

Only what the engine loads is fetched: the top-level JSON files and
tokenizer files (with the JSON files of the sentence-transformers modules
that ``modules.json`` names, such as ``1_Pooling/config.json``: an embedding
model's pooling), then either the safetensors weights (the shards the index
names, when there is one) or one GGUF file (``--gguf-file``, or the one whose
name carries the ``:TAG``). Pickle weights are never downloaded: a repo that
has only ``.bin``/``.pt`` weights is refused before anything is fetched.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from octavo.errors import HubAccessError, HubUnreachableError, ModelLoadError, ModelNotFoundError

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[\w.-]+))?$")
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = frozenset({"tokenizer.model", "merges.txt", "vocab.txt", "tokenizer.tiktoken"})
SAFETENSORS_INDEX = "model.safetensors.index.json"
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


@dataclass(frozen=True)
class HubOptions:
    revision: str | None = None
    download_dir: str | None = None  # the Hub cache to download into (default: HF_HUB_CACHE)
    gguf_file: str | None = None  # the GGUF file to take from the repo


@dataclass(frozen=True)
class HubModelId:
    repo_id: str
    quant_tag: str | None = None  # ``org/name:Q4_K_M`` picks the GGUF file named for it


def parse_hub_id(model: str) -> HubModelId | None:
    """``org/name[:TAG]`` as a Hub id, or None if ``model`` cannot be one."""
    if model.startswith((".", "/", "~")):
        return None
    match = _HUB_ID.match(model)
    if match is None or ".." in match["repo"]:
        return None
    return HubModelId(match["repo"], match["tag"])


def resolve_model(model: str, options: HubOptions = HubOptions(), weights: bool = True) -> Path:
    """A local checkpoint directory or GGUF file for ``model`` (a path or a Hub id).

    ``weights=False`` (``load_format="dummy"``) fetches the configuration
    and tokenizer files of a Hub id only."""
    local = Path(model).expanduser()
    if local.exists():
        return local / options.gguf_file if options.gguf_file and local.is_dir() else local
    hub_id = parse_hub_id(model)
    if hub_id is None:
        raise ModelNotFoundError(f"model {model!r} not found: no such directory or file, and not a Hub id (org/name)")
    return _fetch(hub_id, options, weights=weights)


def resolve_tokenizer(tokenizer: str, options: HubOptions = HubOptions()) -> Path:
    """A local tokenizer directory for ``tokenizer`` (a path or a Hub id; no weights are fetched)."""
    local = Path(tokenizer).expanduser()
    if local.exists():
        return local
    hub_id = parse_hub_id(tokenizer)
    if hub_id is None:
        raise ModelNotFoundError(f"tokenizer {tokenizer!r} not found: no such directory, and not a Hub id (org/name)")
    return _fetch(HubModelId(hub_id.repo_id), options, weights=False)


def hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


# ------------------------------------------------------------ file selection


def metadata_files(filenames: list[str]) -> list[str]:
    """Top-level configuration and tokenizer files (small; always fetched)."""
    return sorted(f for f in filenames if "/" not in f and (f.endswith((".json", ".jinja")) or f in TOKENIZER_FILES))


def sentence_transformers_files(filenames: list[str], modules_json: Path) -> list[str]:
    """The JSON files in the folders of the sentence-transformers modules that
    ``modules_json`` lists (``1_Pooling/config.json``, ...), which set how an
    embedding model pools. A file that cannot be read names none: loading the
    model reports it."""
    try:
        modules = json.loads(modules_json.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return []
    if not isinstance(modules, list):
        return []
    folders = {str(m.get("path", "")).strip("/") for m in modules if isinstance(m, dict)} - {""}
    return sorted(f for f in filenames if f.endswith(".json") and f.rpartition("/")[0] in folders)


def select_gguf_file(filenames: list[str], repo_id: str, quant_tag: str | None, gguf_file: str | None) -> str | None:
    """The one GGUF file to fetch, or None when the request names none and safetensors exist."""
    ggufs = sorted(f for f in filenames if f.endswith(".gguf"))
    if gguf_file is not None:
        if gguf_file not in filenames:
            raise ModelNotFoundError(f"{repo_id} has no file {gguf_file!r} (GGUF files: {', '.join(ggufs) or 'none'})")
        return gguf_file
    if quant_tag is None:
        has_safetensors = any(f.endswith(".safetensors") and "/" not in f for f in filenames)
        if has_safetensors or not ggufs:
            return None
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelLoadError(
            f"{repo_id} holds several GGUF files; pick one with {repo_id}:TAG or --gguf-file: {', '.join(ggufs)}"
        )
    tag = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant_tag)}(?![A-Za-z0-9_])", re.IGNORECASE)
    matches = [f for f in ggufs if tag.search(f.rsplit("/", 1)[-1])]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ModelNotFoundError(f"{repo_id} has no GGUF file for {quant_tag!r} (GGUF files: {', '.join(ggufs) or 'none'})")
    raise ModelLoadError(f"several GGUF files of {repo_id} match {quant_tag!r}; pick one with --gguf-file: {', '.join(matches)}")


def check_weights_format(filenames: list[str], repo_id: str) -> None:
    """Refuse a repo whose only weights are pickles (they can run code when loaded)."""
    if any(f.endswith((".safetensors", ".gguf")) for f in filenames):
        return
    pickled = sorted(f for f in filenames if f.endswith(PICKLE_SUFFIXES))
    if pickled:
        raise ModelLoadError(
            f"{repo_id} has only pickle weights ({pickled[0]}); Octavo loads safetensors and GGUF only, "
            "because pickle files can run code when loaded. Use a repo with *.safetensors weights."
        )
    raise ModelLoadError(f"{repo_id} has no safetensors or GGUF weights")


def safetensors_to_fetch(filenames: list[str], index: dict | None) -> list[str]:
    """The shards the index names, else every top-level ``*.safetensors``."""
    if index is not None:
        try:
            return sorted(set(index["weight_map"].values()))
        except (KeyError, AttributeError, TypeError) as exc:
            raise ModelLoadError(f"{SAFETENSORS_INDEX} is not a valid safetensors index: {exc}") from exc
    return sorted(f for f in filenames if "/" not in f and f.endswith(".safetensors"))


# ------------------------------------------------------------------ fetching


def _fetch(hub_id: HubModelId, options: HubOptions, weights: bool) -> Path:
    from octavo.models.hub_client import HubClient

    client = HubClient(hub_id.repo_id, options)
    if hub_offline():
        return _from_cache(client, hub_id, options, weights, reason="HF_HUB_OFFLINE is set")
    try:
        commit, filenames = client.list_files()
    except HubUnreachableError as exc:
        logger.warning("%s; looking for %s in the local cache", exc.message, hub_id.repo_id)
        return _from_cache(client, hub_id, options, weights, reason=exc.message)
    if not weights:
        return _download_metadata(client, commit, filenames)
    gguf = select_gguf_file(filenames, hub_id.repo_id, hub_id.quant_tag, options.gguf_file)
    if gguf is not None:
        return client.download(commit, [gguf]) / gguf
    check_weights_format(filenames, hub_id.repo_id)
    folder = _download_metadata(client, commit, filenames)
    index_path = folder / SAFETENSORS_INDEX
    index = _read_index(index_path) if index_path.exists() else None
    return client.download(commit, safetensors_to_fetch(filenames, index))


def _download_metadata(client, commit: str, filenames: list[str]) -> Path:
    """The configuration and tokenizer files, then the module configs ``modules.json`` names."""
    folder = client.download(commit, metadata_files(filenames))
    module_files = sentence_transformers_files(filenames, folder / "modules.json")
    return client.download(commit, module_files) if module_files else folder


def _read_index(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not a valid safetensors index: {exc}") from exc


def _from_cache(client, hub_id: HubModelId, options: HubOptions, weights: bool, reason: str) -> Path:
    folder = client.cached_snapshot()
    if folder is None:
        raise ModelNotFoundError(
            f"{hub_id.repo_id} (revision {options.revision or 'main'}) is not in the local Hub cache "
            f"{client.cache_dir}, and it cannot be downloaded: {reason}"
        )
    filenames = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink()]
    if weights:
        gguf = select_gguf_file(filenames, hub_id.repo_id, hub_id.quant_tag, options.gguf_file)
        if gguf is not None:
            return folder / gguf
        if not any(f.endswith((".safetensors", *PICKLE_SUFFIXES)) for f in filenames):
            raise ModelNotFoundError(f"the cached snapshot {folder} holds no weights, and they cannot be downloaded: {reason}")
        check_weights_format(filenames, hub_id.repo_id)
    logger.info("using the cached snapshot %s", folder)
    return folder
