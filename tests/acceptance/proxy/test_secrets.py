"""Secrets a rule marks - a token in the URL, fields of an answer - reach neither the
effect log (its SQLite file and WAL), nor the sidecar's log, nor the control API; the
agent still gets the real answer the first time."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from sidecar.testing.processes import Child
from tests.acceptance.conftest import REPO
from tests.acceptance.proxy.conftest import HERE, run_agent
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

TOKEN = "7234567890:AAHkq3-T0ken4TestsOnly_secretPart"


@pytest.fixture
def secret_api(tmp_path: Path) -> Iterator[str]:
    child = Child.python("tests.acceptance.proxy.secret_api", stderr_path=tmp_path / "api.log")
    with child:
        yield child.wait_for(r"secret api ready (\S+)").group(1)


@pytest.fixture
def stack(make_stack: Any, secret_api: str) -> Stack:
    rules = [REPO / "rules" / "webhooks.yaml", HERE / "secrets.yaml"]
    routes = ["api.telegram.org", "apps.secrets.test"]
    args = [arg for path in rules for arg in ("--rules", str(path))]
    args += [arg for host in routes for arg in ("--route", f"{host}={secret_api}")]
    stack: Stack = make_stack(sidecar_args=args)
    return stack


def at_rest(stack: Stack) -> bytes:
    """Everything the store and the sidecar's log hold, as bytes."""
    files = [stack.data_dir / f"effects.db{suffix}" for suffix in ("", "-wal", "-shm")]
    files += sorted(stack.root.glob("sidecar-*.log"))
    return b"".join(path.read_bytes() for path in files if path.exists())


def effects_text(stack: Stack, task: str) -> str:
    return json.dumps(stack.effects(task))


def test_a_bot_token_in_the_url_is_kept_nowhere_but_still_reaches_the_api(stack, secret_api):
    send = {
        "method": "POST",
        "url": f"https://api.telegram.org/bot{TOKEN}/sendMessage",
        "json": {"chat_id": 312, "text": "deployed"},
    }
    (first,) = run_agent(stack, "312", "requests", [send])
    (again,) = run_agent(stack, "312", "requests", [send])
    assert [first["x-sidecar-effect"], again["x-sidecar-effect"]] == ["recorded", "replayed"]
    assert again["body"] == first["body"]
    with urllib.request.urlopen(f"{secret_api}/_counts", timeout=10) as counts:
        assert json.load(counts) == {f"POST /bot{TOKEN}/sendMessage": 1}  # sent as it came

    (effect,) = stack.effects("312")
    assert effect["request"]["url"].endswith("/bot[redacted]/sendMessage")
    assert effect["key"].startswith("telegram.bot.send:POST /bot[redacted:")
    assert TOKEN not in effects_text(stack, "312")
    for part in (TOKEN, TOKEN.split(":")[1]):
        assert part.encode() not in at_rest(stack)
    assert any(line.get("effect_key") == effect["key"] for line in stack.log_lines())


def test_fields_a_rule_names_are_stored_redacted_and_replayed_so(stack):
    create = {"method": "POST", "url": "https://apps.secrets.test/apps", "json": {"name": "ci"}}
    (first,) = run_agent(stack, "312", "requests", [create])
    (again,) = run_agent(stack, "312", "requests", [create])
    secret = first["body"]["client_secret"]
    password = first["body"]["credentials"]["password"]
    assert secret.startswith("cs_")  # the agent got the real answer, once
    assert again["x-sidecar-effect"] == "replayed"
    assert again["body"] == first["body"] | {
        "client_secret": "[redacted]",
        "credentials": {"user": "bot", "password": "[redacted]"},
    }
    (effect,) = stack.effects("312")
    assert effect["state"] == "completed"
    with closing(sqlite3.connect(stack.data_dir / "effects.db")) as db:
        (headers, body) = db.execute(
            "SELECT response_headers, response_body FROM effects"
        ).fetchone()
    stored = json.loads(body)  # kept decoded: a compressed copy would hide the secret from a grep
    assert stored["client_secret"] == "[redacted]"
    assert "content-encoding" not in headers.lower()
    for value in (secret, password):
        assert value not in effects_text(stack, "312")
        assert value.encode() not in at_rest(stack)
