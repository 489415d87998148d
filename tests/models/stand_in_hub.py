"""A stand-in for the Hugging Face Hub on 127.0.0.1, for download tests
(reached through ``HF_ENDPOINT``; never the internet).

It answers the routes ``huggingface_hub`` calls: the model info API
(``/api/models/{repo}/revision/{rev}``), the tree listing
(``/api/models/{repo}/tree/{rev}``), and ``HEAD``/``GET``
``/{repo}/resolve/{rev}/{file}`` with the ``ETag``, ``X-Repo-Commit`` and
``Content-Length`` headers and ``Range`` requests (206) it uses to resume.
Gated repos answer 401 without a token and 403 with a wrong one (with
``X-Error-Code: GatedRepo``); missing repos 404 ``RepoNotFound``. Faults:
``drop_after[file] = n`` sends the first GET's headers for the whole file,
then only ``n`` bytes before closing the connection (the client resumes with
a Range request); ``fail`` lists files whose GETs answer 500.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

GOOD_TOKEN = "hf_stand_in_token"


@dataclass
class StandInRepo:
    files: dict[str, bytes]
    gated: bool = False

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for name in sorted(self.files):
            digest.update(name.encode() + hashlib.sha1(self.files[name]).digest())
        return digest.hexdigest()


@dataclass
class StandInHub:
    repos: dict[str, StandInRepo] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)
    # (method, path, Range header) of every request, in order.
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            stand_in = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def gets(self, filename: str) -> list[str | None]:
        """The Range header of each GET of ``filename`` (None: the whole file)."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith(f"/resolve/{self._any_commit(p)}/{filename}")]

    @staticmethod
    def _any_commit(path: str) -> str:
        match = re.search(r"/resolve/([^/]+)/", path)
        return match.group(1) if match else ""


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stand_in: StandInHub

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _route(self, head: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.stand_in.requests.append(("HEAD" if head else "GET", path, self.headers.get("Range")))
        api, resolve = _API.match(path), _RESOLVE.match(path)
        if api:
            self._api(api["repo"], api["kind"], api["rev"])
        elif resolve:
            self._resolve(resolve["repo"], resolve["rev"], resolve["file"], head)
        else:
            self._error(404, "RepoNotFound", "no such route")

    def _repo_at(self, repo_id: str, revision: str) -> StandInRepo | None:
        repo = self.stand_in.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        elif revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id")
            return None
        return repo

    def _api(self, repo_id: str, kind: str, revision: str) -> None:
        repo = self._repo_at(repo_id, revision)
        if repo is None:
            return
        if kind == "revision":
            body = {
                "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "gated": "manual" if repo.gated else False, "disabled": False,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            }
        else:
            body = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(repo.files.items())
            ]
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _resolve(self, repo_id: str, revision: str, filename: str, head: bool) -> None:
        repo = self._repo_at(repo_id, revision)
        if repo is None:
            return
        if repo.gated:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(401, "GatedRepo", "Access to this model is restricted: log in")
            if auth != f"Bearer {GOOD_TOKEN}":
                return self._error(403, "GatedRepo", "Access to this model is restricted: ask for access")
        data = repo.files.get(filename)
        if data is None:
            return self._error(404, "EntryNotFound", "Entry not found")
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{hashlib.sha256(data).hexdigest()}"', "Accept-Ranges": "bytes"}
        if head:
            return self._send(200, b"", {**headers, "Content-Length": str(len(data))}, body_length=len(data))
        if filename in self.stand_in.fail:
            return self._error(500, None, "stand-in failure")
        start = _range_start(self.headers.get("Range"))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._send(206, data[start:], headers)
        drop = self.stand_in.drop_after.pop(filename, None)
        if drop is not None:  # the whole file announced, part of it sent, then the connection dropped
            self._send(200, data[:drop], {**headers, "Content-Length": str(len(data))}, body_length=len(data))
            self.close_connection = True
            return
        self._send(200, data, headers)

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code is not None:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _send(self, status: int, body: bytes, headers: dict[str, str], body_length: int | None = None) -> None:
        self.send_response(status)
        if "Content-Length" not in headers:
            headers = {**headers, "Content-Length": str(len(body) if body_length is None else body_length)}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            self.wfile.flush()


def _range_start(header: str | None) -> int:
    match = re.match(r"bytes=(\d+)-$", header or "")
    return int(match.group(1)) if match else 0
