"""The calls Octavo makes to the Hugging Face Hub, through ``huggingface_hub``,
and the translation of its errors into Octavo's typed ones.

``HF_ENDPOINT`` and ``HF_TOKEN`` are read when a client is made (not when
``huggingface_hub`` was imported), so a process can switch endpoints. The
cache is the Hub's own layout (``models--org--name/{blobs,refs,snapshots}``),
so models downloaded by other tools are found, and theirs by ours.
"""

from __future__ import annotations

import os
from pathlib import Path

from octavo.errors import HubAccessError, HubUnreachableError, ModelLoadError, ModelNotFoundError, OctavoError
from octavo.models.hub import COMMIT_HASH, HubOptions

# Transport failures of requests/httpx-style clients, matched by name so that
# any HTTP library huggingface_hub uses is covered.
_NETWORK_ERRORS = frozenset({"TransportError", "ConnectionError", "Timeout", "TimeoutException", "OfflineModeIsEnabled"})


class HubClient:
    def __init__(self, repo_id: str, options: HubOptions) -> None:
        from huggingface_hub import constants

        self.repo_id = repo_id
        self.revision = options.revision or "main"
        self.cache_dir = Path(options.download_dir or constants.HF_HUB_CACHE).expanduser()
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.storage = self.cache_dir / f"models--{repo_id.replace('/', '--')}"

    def list_files(self) -> tuple[str, list[str]]:
        """The commit ``revision`` points at, and the repo's file names there."""
        from huggingface_hub import HfApi, get_token

        try:
            info = HfApi(endpoint=self.endpoint).model_info(self.repo_id, revision=self.revision)
        except Exception as exc:
            raise self._translate(exc) from exc
        if info.gated and get_token() is None:
            raise HubAccessError(self._gated_message("no token is set"))
        return str(info.sha), [sibling.rfilename for sibling in info.siblings or []]

    def download(self, commit: str, filenames: list[str]) -> Path:
        """Fetch ``filenames`` at ``commit`` (those cached are not fetched again); the snapshot folder."""
        from huggingface_hub import snapshot_download

        if filenames:
            try:
                snapshot_download(
                    self.repo_id, revision=commit, cache_dir=str(self.cache_dir),
                    allow_patterns=filenames, endpoint=self.endpoint,
                )
            except Exception as exc:
                raise self._translate(exc) from exc
        self._remember_revision(commit)
        return self.storage / "snapshots" / commit

    def cached_snapshot(self) -> Path | None:
        """The cached snapshot of ``revision``, without the network; None if there is none."""
        commit = self.revision
        if not COMMIT_HASH.match(commit):
            ref = self.storage / "refs" / self.revision
            if not ref.is_file():
                return None
            commit = ref.read_text().strip()
        folder = self.storage / "snapshots" / commit
        return folder if folder.is_dir() else None

    def _remember_revision(self, commit: str) -> None:
        # Downloads are made at the commit (so that every file comes from the
        # same one); the ref lets an offline start find it by branch or tag.
        if COMMIT_HASH.match(self.revision):
            return
        ref = self.storage / "refs" / self.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        partial = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
        partial.write_text(commit)
        partial.replace(ref)

    def _gated_message(self, why: str) -> str:
        return (
            f"{self.repo_id} is a gated repo and {why}: accept its conditions at {self.endpoint}/{self.repo_id} "
            "and set HF_TOKEN to a token of that account"
        )

    def _translate(self, exc: Exception) -> Exception:
        """Octavo's error for what ``huggingface_hub`` raised (unknown errors pass through)."""
        from huggingface_hub import errors

        name = f"{self.repo_id} (revision {self.revision})"
        if isinstance(exc, errors.GatedRepoError):
            return HubAccessError(self._gated_message("the token set has no access to it"))
        if isinstance(exc, errors.RevisionNotFoundError):
            return ModelNotFoundError(f"{self.repo_id} has no revision {self.revision!r} on {self.endpoint}")
        if isinstance(exc, errors.RepositoryNotFoundError):
            return ModelNotFoundError(
                f"{self.repo_id} was not found on {self.endpoint} (a private repo needs HF_TOKEN)"
            )
        if isinstance(exc, errors.EntryNotFoundError) and not isinstance(exc, errors.LocalEntryNotFoundError):
            return ModelNotFoundError(f"a file of {name} was not found on {self.endpoint}: {exc}")
        if isinstance(exc, errors.LocalEntryNotFoundError) or _is_network_error(exc):
            return HubUnreachableError(f"could not reach the Hub at {self.endpoint} ({type(exc).__name__})")
        if isinstance(exc, errors.HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                return HubAccessError(f"the Hub refused {name} (HTTP {status}): set HF_TOKEN to a token that may read it")
            if status is not None and status >= 500:
                return HubUnreachableError(f"the Hub at {self.endpoint} failed (HTTP {status})")
            return ModelLoadError(f"downloading {name} failed: {exc}")
        if isinstance(exc, OSError) and not isinstance(exc, OctavoError):  # disk full, size mismatch, ...
            return ModelLoadError(f"downloading {name} failed: {exc}")
        return exc


def _is_network_error(exc: BaseException) -> bool:
    return any(cls.__name__ in _NETWORK_ERRORS for cls in type(exc).__mro__)
