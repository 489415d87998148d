"""The web playground (``/``, ``/ui``) and live dashboard (``/dashboard``) of ``octavo serve``.

Plain HTML, CSS and JavaScript in ``static/`` (no build step, nothing fetched
from the internet); the pages talk to the server's own API: the OpenAI routes
for chat and completions, ``/ui/api/config`` and ``/ui/api/stats`` for the
dashboard. The pages and their files load without a key (they hold no data);
every data call needs it (``static_files`` says which paths are exempt).
``--no-ui`` leaves all of this out: the paths answer 404 (401 without a key).
"""

from __future__ import annotations

from fastapi import FastAPI

from octavo.entrypoints.ui import api
from octavo.entrypoints.ui.static_files import PAGES, STATIC_PREFIX, StaticFile, load_static_files, public_paths


def add_ui_routes(app: FastAPI) -> frozenset[str]:
    """Register the pages, their files and the dashboard's JSON; return the paths to exempt from auth."""
    files = load_static_files()
    for path, name in PAGES.items():
        app.add_api_route(path, _serve(files[name]), methods=["GET"], include_in_schema=False)
    for name, static_file in files.items():
        app.add_api_route(STATIC_PREFIX + name, _serve(static_file), methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui/api/config", api.config, methods=["GET"])
    app.add_api_route("/ui/api/stats", api.stats, methods=["GET"])
    return public_paths(files)


def _serve(static_file: StaticFile):
    async def serve():
        return static_file.response()

    return serve
