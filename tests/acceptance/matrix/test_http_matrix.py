"""`sidecar matrix` on an agent written only for these tests, against a counting upstream.

Every cell is a real run: the agent and its sidecar are real processes, killed with a
real SIGKILL (or frozen with SIGSTOP, or the store's file really locked), and each cell
is checked by counting charges, invoices and receipts on the upstream itself.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.matrix.faults import FAULTS
from sidecar.testing.processes import Child
from tests.acceptance.matrix.conftest import AGENTS, HERE, cells, matrix, shop_matrix

pytestmark = pytest.mark.acceptance


@pytest.mark.timeout(600)  # 27 cells, four at a time: about two minutes
def test_every_cell_of_a_well_ruled_agent_passes(tmp_path: Path, upstream: str) -> None:
    out = tmp_path / "out"
    done = shop_matrix(out, upstream, "shop.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    found = cells(out)
    assert len(found) == 3 * len(FAULTS)  # a charge, an invoice, a receipt x every fault
    assert {(c["verdict"], c["fault"]) for c in found} == {("PASS", f.name) for f in FAULTS}
    assert all(any("--check passed" in e for e in c["evidence"]) for c in found)
    table = (out / "matrix.md").read_text()
    assert table.count("| TESTED ") == len(found)
    assert "Any stage: lease expiry while worker is slow" in table
    assert f"matrix: {len(found)} cells in" in done.stdout
    progress = done.stderr
    assert "clean run: 3 effect(s)" in progress
    assert f"cell {len(found)}/{len(found)}" in progress
    assert "ETA" in progress


def test_a_key_that_changes_between_attempts_fails_the_cells_and_names_the_duplicate(
    tmp_path: Path, upstream: str
) -> None:
    out = tmp_path / "out"
    done = shop_matrix(
        out, upstream, "shop-broken-key.yaml", "--faults", "agent-killed-after-record"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = {c["effect_index"]: c for c in cells(out)}
    assert verdicts[1]["verdict"] == "PASS"  # the charge's key is stable
    for index in (2, 3):
        cell = verdicts[index]
        assert cell["verdict"] == "FAIL"
        assert any(
            e.startswith("duplicate: rule shop.things.create made") for e in cell["evidence"]
        )
        assert any("--check exited 1" in e and "2 " in e for e in cell["evidence"])
    assert "FAIL: duplicate: rule shop.things.create" in (out / "matrix.md").read_text()
    assert "FAIL: #2 shop.things.create x agent-killed-after-record: duplicate" in done.stdout


def test_an_agent_that_does_not_finish_when_nothing_goes_wrong_is_refused(
    tmp_path: Path, upstream: str
) -> None:
    done = matrix(
        "--rules", str(HERE / "shop.yaml"), "--out", str(tmp_path / "out"),
        "--", sys.executable, "-c", "raise SystemExit(3)",
    )  # fmt: skip
    assert done.returncode == 1
    assert "the clean run did not finish" in done.stderr


def test_usage_errors_say_what_to_do(tmp_path: Path) -> None:
    no_agent = matrix("--out", str(tmp_path / "out"))
    assert no_agent.returncode == 2
    assert "give the agent's command after --" in no_agent.stderr
    bad_fault = matrix("--faults", "agent-killed,stale-worker", "--", "true")
    assert bad_fault.returncode == 2
    assert "unknown fault(s) agent-killed" in bad_fault.stderr
    assert "agent-killed-after-record" in bad_fault.stderr  # the list to choose from
    assert not (AGENTS / "out").exists()


def test_against_a_running_sidecar_the_faults_done_to_the_worker_are_injected(
    tmp_path: Path, upstream: str
) -> None:
    token = tmp_path / "token"
    token.write_text("matrix-test-token\n")
    rules = str(HERE / "shop.yaml")
    serve = [
        "serve", "--data-dir", str(tmp_path / "data"), "--control-listen", "127.0.0.1:0",
        "--proxy-listen", "127.0.0.1:0", "--control-token-file", str(token),
        "--rules", rules, "--route", f"api.shop.test={upstream}",
    ]  # fmt: skip
    with Child.python("sidecar", *serve, stderr_path=tmp_path / "sidecar.log") as sidecar:
        control = sidecar.wait_for(r"effect-sidecar ready control=(\S+)", timeout=60).group(1)
        out = tmp_path / "out"
        done = matrix(
            "--control", control, "--control-token-file", str(token), "--rules", rules,
            "--check", f"{sys.executable} {AGENTS / 'shop_check.py'} {upstream}",
            "--faults", "agent-killed-after-record,stale-worker,sidecar-killed-after-forward",
            "--out", str(out), "--", sys.executable, str(AGENTS / "shop_agent.py"),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = {(c["effect_index"], c["fault"]): c for c in cells(out)}
    for index in (1, 2, 3):
        assert verdicts[index, "agent-killed-after-record"]["verdict"] == "PASS"
        assert verdicts[index, "stale-worker"]["verdict"] == "PASS"
        killed = verdicts[index, "sidecar-killed-after-forward"]
        assert killed["verdict"] == "CANNOT_DETERMINE"
        assert "needs a private sidecar" in killed["evidence"][0]


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (e.g. a matrix's out dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_an_interrupted_matrix_stops_every_process_of_its_cells(
    tmp_path: Path, upstream: str
) -> None:
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "sidecar", "matrix", "--rules", str(HERE / "shop.yaml"),
        "--route", f"api.shop.test={upstream}", "--out", str(out),
        "--", sys.executable, str(AGENTS / "shop_agent.py"),
    ]  # fmt: skip
    log = tmp_path / "matrix.log"
    with log.open("wb") as stderr:
        matrix_run = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 60
        while "cells, 4 at a time" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # cells are running: sidecars, agents, frozen ones
        assert processes_mentioning(str(out)), "the cells' processes are running"
        matrix_run.send_signal(signal.SIGTERM)
        assert matrix_run.wait(timeout=60) == 130
    time.sleep(0.5)
    assert processes_mentioning(str(out)) == [], "no sidecar or agent of a cell outlives it"
