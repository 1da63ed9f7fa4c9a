"""The relay in process in front of a scratch database (``tests/support/pg_relay.py``),
under the rules most pgwire tests use; a test module may give ``rules`` or ``database``
of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sidecar.rules import RuleSet
from tests.support.pg_relay import RULES, Relay, relay_on, rules_of
from tests.support.postgres import ScratchDatabase


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    return rules_of(tmp_path, RULES)


@pytest.fixture
def database(postgres_server: str) -> Iterator[ScratchDatabase]:
    scratch = ScratchDatabase.create(postgres_server, prefix="es_once")
    yield scratch
    scratch.drop()


@pytest.fixture
async def relay(tmp_path: Path, rules: RuleSet, database: ScratchDatabase) -> AsyncIterator[Relay]:
    async with relay_on(tmp_path, rules, database) as running:
        yield running
