"""Emulators run as real processes and driven by real clients.

``running_github`` starts ``sidecar emulate github`` on a free port over a data folder
and stops it afterwards; the test modules build their fixtures from it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sidecar.testing.processes import Child

TOKEN = {"Authorization": "token t"}


@dataclass
class Emulator:
    child: Child
    url: str
    data: Path

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_emulator/state").json()["repos"]


@contextmanager
def running_github(data: Path, *args: str) -> Iterator[Emulator]:
    child = Child.python(
        "sidecar",
        "emulate",
        "github",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(data),
        *args,
        stderr_path=data.with_name(f"{data.name}.log"),
    )
    with child:
        url = child.wait_for(r"github emulator ready (\S+)", timeout=30).group(1)
        yield Emulator(child, url, data)


@contextmanager
def running_github_tls(data: Path, chain: tuple[Path, Path, Path]) -> Iterator[Emulator]:
    """The emulator over HTTPS, serving the certificate of ``chain`` (CA file, certificate
    file, key file: ``tests.support.certs.write_serving_chain``)."""
    _, cert_file, key_file = chain
    with running_github(data, "--tls-cert", str(cert_file), "--tls-key", str(key_file)) as up:
        yield up


def git_env(home: Path) -> dict[str, str]:
    """An environment in which git reads no user or system configuration and never asks."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": "Agent",
        "GIT_AUTHOR_EMAIL": "agent@example.com",
        "GIT_COMMITTER_NAME": "Agent",
        "GIT_COMMITTER_EMAIL": "agent@example.com",
    }


def git(env: dict[str, str], cwd: Path, *args: str, check: bool = True) -> str:
    """Run the real git CLI; return stdout and stderr together (push reports on stderr)."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr
