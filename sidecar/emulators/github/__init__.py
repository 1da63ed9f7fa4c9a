"""A GitHub emulator: the REST API and git smart HTTP over bare repositories on disk.

It stands in for github.com in the demo and the tests, so real clients - the ``git``
CLI, PyGithub, httpx, requests - work against it unmodified: the same JSON shapes,
status codes and error bodies for the routes it serves.  Git data lives in bare
repositories under ``DATA/repos``; what GitHub keeps beside git (pull requests,
comments, labels, releases) in ``DATA/state.json``, so a restarted emulator keeps it.

Modules: ``state`` (records and persistence), ``gitdata`` (dulwich operations),
``git_http`` (git's http-backend as a CGI), ``api`` (errors, auth, URLs, pages),
``shapes`` (shared JSON objects), one module of routes per resource (``repos``,
``contents``, ``pulls``, ``issues``, ``releases``), ``app`` and ``server``.
"""

from sidecar.emulators.github.app import make_app
from sidecar.emulators.github.server import serve

__all__ = ["make_app", "serve"]
