"""The playground's and dashboard's files, shipped in ``static/`` as package data.

Invariants: the files hold no data (no model name, no configuration, no key):
everything the pages show comes from API calls that need the key. So they can
load without one, and only these exact paths are exempt from authentication
(``public_paths``); any other path under ``/ui`` still needs the key. Every
file is read once when the app is built and served with a strict content
security policy: scripts and styles from this server only, no inline script,
connections to this server only, so model output that reached the page as
HTML could not run even if a renderer failed to escape it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from starlette.responses import Response

STATIC_PREFIX = "/ui/static/"
# Page path -> the file it serves.
PAGES = {"/": "playground.html", "/ui": "playground.html", "/dashboard": "dashboard.html"}
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Small files that change with the package: revalidate rather than cache stale copies.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str

    def response(self) -> Response:
        return Response(self.body, media_type=self.content_type, headers=_SECURITY_HEADERS)


def load_static_files() -> dict[str, StaticFile]:
    """File name -> contents, for every file in ``static/`` (flat: no subfolders)."""
    files = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _CONTENT_TYPES:
            files[entry.name] = StaticFile(entry.read_bytes(), _CONTENT_TYPES[suffix])
    missing = sorted(set(PAGES.values()) - set(files))
    if missing:
        raise FileNotFoundError(f"the web UI's files are missing from the install: {', '.join(missing)}")
    return files


def public_paths(files: dict[str, StaticFile]) -> frozenset[str]:
    """The exact paths that load without a key: the pages and their files."""
    return frozenset(PAGES) | {STATIC_PREFIX + name for name in files}
