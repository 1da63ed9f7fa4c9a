"""The rootless namespace's pieces that need no namespace: when it is known to be off,
and how its agent joins both namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.agent.isolation import netns, rootless


def test_a_switched_off_user_namespace_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switch = tmp_path / "unprivileged_userns_clone"
    switch.write_text("0\n")
    monkeypatch.setattr(rootless, "SWITCHES", ((switch, "kernel.unprivileged_userns_clone"),))
    assert rootless.unavailable() == (
        "it is not root and unprivileged user namespaces are off "
        "(kernel.unprivileged_userns_clone=0)"
    )
    switch.write_text("1\n")
    assert rootless.unavailable() is None


def test_an_absent_switch_does_not_stop_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rootless, "SWITCHES", ((tmp_path / "absent", "absent"),))
    assert rootless.unavailable() is None


def test_the_agent_joins_the_user_namespace_with_its_own_credentials() -> None:
    made_as_root = netns.Namespace(7)
    assert made_as_root.fds() == (7,)
    assert made_as_root.argv(["agent"], "/h", "")[:3] == ["nsenter", "--net=/proc/self/fd/7", "--"]
    made_rootless = netns.Namespace(7, user_fd=8)
    assert made_rootless.fds() == (7, 8)
    assert made_rootless.argv(["agent"], "/h", "")[:5] == [
        "nsenter",
        "--user=/proc/self/fd/8",
        "--preserve-credentials",
        "--net=/proc/self/fd/7",
        "--",
    ]
