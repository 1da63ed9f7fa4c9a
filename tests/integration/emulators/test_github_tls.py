"""The GitHub emulator over HTTPS (``--tls-cert``/``--tls-key``), driven by requests and git.

One emulator process serves the module with a certificate for 127.0.0.1, api.github.com
and github.com signed by a test CA: a client trusting that CA gets GitHub's answers, one
that does not is refused by its own verification. Bad option combinations stop the
emulator before it serves anything.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.emulators import (
    TOKEN,
    Emulator,
    git,
    git_env,
    running_github_tls,
)
from tests.support import certs


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The test CA's certificate file, and a serving certificate and key it signed."""
    folder = tmp_path_factory.mktemp("tls")
    return certs.write_serving_chain(
        folder, "github emulator", dns=["api.github.com", "github.com"]
    )


@pytest.fixture(scope="module")
def emulator(
    tmp_path_factory: pytest.TempPathFactory, ca: tuple[Path, Path, Path]
) -> Iterator[Emulator]:
    with running_github_tls(tmp_path_factory.mktemp("github") / "data", ca) as running:
        yield running


def test_the_ready_line_and_the_urls_it_answers_with_say_https(emulator, ca):
    assert emulator.url.startswith("https://127.0.0.1:"), emulator.url
    ca_file, _, _ = ca
    made = requests.post(
        f"{emulator.url}/user/repos",
        json={"name": "secure", "auto_init": True},
        headers=TOKEN,
        verify=str(ca_file),
        timeout=10,
    )
    assert made.status_code == 201, made.text
    assert made.headers["Content-Type"] == "application/json; charset=utf-8"
    repo = made.json()
    assert repo["full_name"] == "agent/secure"
    assert repo["default_branch"] == "main"
    assert repo["url"] == f"{emulator.url}/repos/agent/secure"
    assert repo["clone_url"] == f"{emulator.url}/agent/secure.git"
    read = requests.get(f"{emulator.url}/repos/agent/secure", verify=str(ca_file), timeout=10)
    assert read.status_code == 200
    assert read.json()["id"] == repo["id"]


def test_git_clones_and_pushes_over_https_trusting_the_ca(emulator, ca, tmp_path):
    ca_file, _, _ = ca
    env = git_env(tmp_path / "home") | {"GIT_SSL_CAINFO": str(ca_file)}
    made = requests.post(
        f"{emulator.url}/user/repos",
        json={"name": "pushed", "auto_init": True},
        headers=TOKEN,
        verify=str(ca_file),
        timeout=10,
    )
    assert made.status_code == 201, made.text
    work = tmp_path / "work"
    git(env, tmp_path, "clone", "-q", f"{emulator.url}/agent/pushed.git", str(work))
    (work / "notes.txt").write_text("over TLS\n")
    git(env, work, "add", "notes.txt")
    git(env, work, "commit", "-q", "-m", "Add notes")
    head = git(env, work, "rev-parse", "HEAD").strip()
    git(env, work, "push", "-q", "origin", "HEAD:refs/heads/tls")
    assert emulator_branch_sha(emulator, ca_file, "agent/pushed", "tls") == head


def emulator_branch_sha(emulator: Emulator, ca_file: Path, repo: str, branch: str) -> str:
    answer = requests.get(
        f"{emulator.url}/repos/{repo}/branches/{branch}", verify=str(ca_file), timeout=10
    )
    assert answer.status_code == 200, answer.text
    sha: str = answer.json()["commit"]["sha"]
    return sha


def test_a_client_not_trusting_the_ca_fails_verification(emulator, tmp_path):
    # requests' own bundle (certifi) does not hold the test CA.
    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        requests.get(f"{emulator.url}/repos/agent/secure", timeout=10)
    # Nor does another CA, even one made the same way.
    other, _ = certs.write_ca(tmp_path / "other")
    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        requests.get(f"{emulator.url}/repos/agent/secure", verify=str(other), timeout=10)
    cloned = subprocess.run(
        ["git", "ls-remote", f"{emulator.url}/agent/secure.git"],
        env=git_env(tmp_path / "home") | {"GIT_SSL_CAINFO": str(other)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert cloned.returncode != 0
    assert "certificate" in cloned.stderr.lower(), cloned.stderr


def emulate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "emulate", "github", "--listen", "127.0.0.1:0",
         "--data-dir", str(tmp_path / "data"), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip


def test_a_certificate_without_its_key_is_refused_before_serving(ca, tmp_path):
    _, cert_file, _ = ca
    done = emulate(tmp_path, "--tls-cert", str(cert_file))
    assert done.returncode == 2, done
    assert "--tls-cert and --tls-key go together" in done.stderr
    assert "ready" not in done.stdout


def test_a_key_that_does_not_match_the_certificate_is_refused_before_serving(ca, tmp_path):
    _, cert_file, _ = ca
    _, other_key = certs.write_ca(tmp_path / "other")
    done = emulate(tmp_path, "--tls-cert", str(cert_file), "--tls-key", str(other_key))
    assert done.returncode == 2, done
    assert f"cannot load TLS certificate {cert_file} / key {other_key}" in done.stderr
    assert "ready" not in done.stdout
