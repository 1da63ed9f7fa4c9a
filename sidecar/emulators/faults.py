"""Faults an emulator can be told to inject, so failure paths can be tested for real.

``--late METHOD:PATH_REGEX=SECONDS`` makes matching requests act normally and then hold
their answer for SECONDS: the outside world changed, but a client with a shorter timeout
never learns it - the seed's "API timeout, unknown whether 201 was received".
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from sidecar.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Late:
    method: str
    path: re.Pattern[str]
    seconds: float

    @classmethod
    def parse(cls, spec: str) -> Late:
        where, sep, seconds = spec.rpartition("=")
        method, colon, path = where.partition(":")
        try:
            if not (sep and colon and method):
                raise ValueError("missing part")
            return cls(method.upper(), re.compile(path), float(seconds))
        except (re.error, ValueError) as error:
            raise ConfigError(f"--late wants METHOD:PATH_REGEX=SECONDS, got {spec!r}") from error


def late_middleware(lates: Sequence[Late]) -> Middleware:
    @web.middleware
    async def answer_late(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        for late in lates:
            if request.method == late.method and late.path.fullmatch(request.path):
                await asyncio.sleep(late.seconds)
                break
        return response

    return answer_late
