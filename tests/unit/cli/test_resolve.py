"""``sidecar effects resolve``: settling an effect from the command line, in a store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.cli.resolve import default_by
from sidecar.config import control_url
from sidecar.domain.model import EffectState
from sidecar.store import create_store
from tests.support.ports import free_port

KEY = "acme/app#thing:x"
RULES = """
rules:
  - name: test.things.blocked
    match: {host: things.test, method: POST, path: /things}
    effect: non_idempotent
    timeout_s: 0.001
    settle_s: 0
"""


@pytest.fixture
def data(tmp_path: Path) -> list[str]:
    """A store holding task 312 with one effect of unknown outcome, its attempt over."""
    url = f"sqlite:///{tmp_path}/effects.db"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)

    async def fill() -> None:
        async with create_store(url) as store:
            a = await store.claim("312", "worker-a", 60)
            await store.record_pending(
                "312", KEY, a.attempt_id, a.generation, kind="http",
                rule="test.things.blocked", fingerprint="f",
                idempotency_key=f"{a.attempt_id}:k", request={"method": "POST"},
            )  # fmt: skip
            await store.transition_effect(
                "312", KEY, a.attempt_id, a.generation, EffectState.UNKNOWN
            )
            await store.release("312", a.attempt_id, a.generation)

    asyncio.run(fill())
    return ["--store", url, "--rules", str(rules)]


def effect_of(where: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main(["effects", "312", "--store", where[1], "--json"]) == 0
    (effect,) = json.loads(capsys.readouterr().out)
    return effect


def test_completed_with_evidence_in_the_store(data, capsys):
    code = main([
        "effects", "resolve", "312", KEY, "--as", "completed", "--status", "201",
        "--header", "X-Thing: 42", "--body", '{"id": "thing_42"}',
        "--note", "found it in the dashboard", "--by", "alice@ops", *data,
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert f"effect {KEY!r} resolved completed" in out
    assert "completed by alice@ops: found it in the dashboard (evidence: status 201)" in out
    assert "later attempts are answered with this evidence" in out
    effect = effect_of(data, capsys)
    assert effect["state"] == "completed"
    assert effect["response"]["status"] == 201
    assert [e["event"] for e in effect["events"]] == ["pending", "unknown", "resolved"]


def test_failed_as_json_with_the_default_by(data, capsys):
    code = main(["effects", "resolve", "312", KEY, "--as", "failed", "--note", "not there",
                 "--json", *data])  # fmt: skip
    assert code == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["outcome"], answer["state"], answer["by"]) == ("failed", "failed", default_by())
    assert answer["effect"]["events"][-1]["event"] == "resolved"


def test_a_settled_effect_is_refused_with_exit_1(data, capsys):
    args = ["effects", "resolve", "312", KEY, "--as", "abandoned", "--note", "n", *data]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 1
    assert "not waiting for a human" in capsys.readouterr().err


def test_unknown_effect_exit_1(data, capsys):
    assert main(["effects", "resolve", "312", "nope", "--as", "failed", "--note", "n", *data]) == 1
    assert "no effect 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--as", "failed", "--status", "200"],
        ["--as", "completed", "--body", "{}"],
        ["--as", "completed", "--status", "99"],
        ["--as", "completed", "--status", "200", "--header", "nocolon"],
        ["--as", "failed", "--by", " "],
    ],
)
def test_usage_errors_exit_2(data, capsys, extra):
    assert main(["effects", "resolve", "312", KEY, "--note", "n", *extra, *data]) == 2
    assert capsys.readouterr().err


def test_missing_arguments_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["effects", "resolve", "312", KEY, "--as", "failed"])
    assert exited.value.code == 2
    assert "--note" in capsys.readouterr().err


def test_a_missing_store_exits_5(tmp_path, capsys):
    code = main(["effects", "resolve", "312", KEY, "--as", "failed", "--note", "n",
                 "--data-dir", str(tmp_path / "nothing")])  # fmt: skip
    assert code == 5
    assert not (tmp_path / "nothing" / "effects.db").exists()


def test_effects_task_still_lists_the_log(data, capsys):
    assert main(["effects", "312", "--store", data[1]]) == 0
    assert KEY in capsys.readouterr().out


def test_an_unreachable_sidecar_exits_5(capsys):
    # SPEC §5: 5 when nothing can be recorded (no store, or no sidecar in front of one)
    port = free_port()
    code = main(["effects", "resolve", "312", KEY, "--as", "failed", "--note", "n",
                 "--control", f"127.0.0.1:{port}"])  # fmt: skip
    assert code == 5
    assert f"no sidecar answers at http://127.0.0.1:{port}" in capsys.readouterr().err


def test_control_urls_take_host_port_too():
    assert control_url("127.0.0.1:7300") == "http://127.0.0.1:7300"
    assert control_url("https://s:1/") == "https://s:1"


def test_help_names_the_sub_verb():
    helped = subprocess.run(
        [sys.executable, "-m", "sidecar", "effects", "--help"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "sidecar effects resolve TASK" in " ".join(helped.stdout.split())
