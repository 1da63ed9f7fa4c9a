"""``sidecar exec`` starts once per agent run, so what it loads is every run's cost."""

from __future__ import annotations

from tests.support.imports import loaded_after_importing


def test_exec_loads_neither_the_store_nor_an_x509_parser():
    # exec keeps its lease through the control API, not a store; and it writes the Java
    # trust store from the PEM bundle's base64 alone. The store's package and
    # `cryptography` were about a fifth of its start-up. (The worker is what exec's run
    # imports.)
    loaded = loaded_after_importing("sidecar.cli.exec, sidecar.agent.worker", among="")
    assert not {m for m in loaded if m.startswith(("sidecar.store", "cryptography"))}


def test_exec_imports_aiohttp_only_when_it_runs():
    # run() imports it through sidecar.runtime.tls_roots, its trusted roots loading on a
    # thread meanwhile: imported any earlier, it would load them on the way.
    loaded = loaded_after_importing("sidecar.cli.exec", among="aiohttp")
    assert not loaded
