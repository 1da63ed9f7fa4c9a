"""The CLI's way to a running sidecar: ``--control URL`` and its bearer token.

Verbs that read or change a running sidecar (``tasks``, ``effects``, ``effects
resolve``) take ``--control`` as ``http://HOST:PORT`` or plain ``HOST:PORT``, and the
token from ``--control-token-file`` or ``SIDECAR_CONTROL_TOKEN``.  Answers that are
problems become the CLI's errors (``sidecar.cli.main`` turns them into exit codes):
``lease_held`` exits 4, ``effect_unknown`` 3, 503 ``store_unavailable`` and no sidecar
answering 5, ``invalid_request`` 2, 401 (2) says how to give the token, anything else is
the problem's detail with its status and code (1).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from sidecar import config
from sidecar.config import control_url
from sidecar.errors import (
    ConfigError,
    EffectUnknown,
    InvalidRequest,
    LeaseHeld,
    NotFound,
    SidecarError,
    SidecarUnreachable,
    StoreUnavailable,
)

TIMEOUT_S = 30.0


def add_control_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--control",
        metavar="URL",
        help="a running sidecar's control API (http://HOST:PORT or HOST:PORT) instead of the store",
    )
    parser.add_argument(
        "--control-token-file",
        type=Path,
        metavar="FILE",
        help="its bearer token (or SIDECAR_CONTROL_TOKEN)",
    )


class ControlClient:
    """One session to a sidecar's control API; ``path`` arguments are already encoded."""

    def __init__(self, given: str, token_file: Path | None) -> None:
        self.base = control_url(given)
        token = config.load({"control_token_file": token_file}).token()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ControlClient:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=timeout)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        return await self.call("GET", path, query=query)

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> Any:
        assert self._session is not None, "use `async with ControlClient(...)`"
        url = URL(f"{self.base}{path}", encoded=True)
        if query:
            url = url.update_query(dict(query))
        try:
            async with self._session.request(method, url, json=body) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = str(exc) or type(exc).__name__
            raise SidecarUnreachable(f"no sidecar answers at {self.base} ({why})") from exc
        try:
            found = json.loads(text)
        except ValueError:
            found = {"detail": text}
        if 200 <= status < 300:
            return found
        problem = found if isinstance(found, dict) else {}
        detail = f"{problem.get('detail', text)} ({status} {problem.get('code', '')})".strip()
        raise problem_error(problem, status, detail)


def problem_error(problem: Mapping[str, Any], status: int, detail: str) -> SidecarError:
    """A problem+json answer as the error ``sidecar.cli.main`` gives its exit code."""
    code = problem.get("code")
    if code == "lease_held" and {"task", "holder", "holder_attempt_id", "lease_expires_at"} <= set(
        problem
    ):
        return LeaseHeld(
            str(problem["task"]),
            str(problem["holder"]),
            str(problem["holder_attempt_id"]),
            datetime.fromisoformat(str(problem["lease_expires_at"])),
        )
    if code == "effect_unknown":
        return EffectUnknown(str(problem.get("task")), str(problem.get("effect_key")), detail)
    if status == 401:
        return ConfigError(f"{detail}: give --control-token-file or SIDECAR_CONTROL_TOKEN")
    errors: dict[str, type[SidecarError]] = {
        "store_unavailable": StoreUnavailable,
        "not_found": NotFound,
        "invalid_request": InvalidRequest,
    }
    return errors.get(str(code), SidecarError)(detail)
