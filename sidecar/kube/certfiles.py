"""The serving pair in ``--cert-dir``, replaced so that a reader never sees half of it.

The directory is laid out the way kubelet lays out a mounted Secret: the files live in a
directory of their own (``..<random>``), the symlink ``..data`` points at it, and
``tls.crt`` and ``tls.key`` are symlinks through ``..data``. A new pair is a new directory
and one atomic rename of ``..data``; :class:`sidecar.kube.webhook.CertReloader` resolves
the symlinks, so it loads the old pair or the new one, never a new certificate with the
old key (which it would refuse, and log, until the key caught up).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CERT, KEY, DATA = "tls.crt", "tls.key", "..data"


def paths(directory: Path) -> tuple[Path, Path]:
    """The certificate and key paths to serve from (stable across replacements)."""
    return directory / CERT, directory / KEY


def read_pair(directory: Path) -> tuple[bytes, bytes] | None:
    """The pair in ``directory`` now, or ``None`` if there is none (yet)."""
    cert, key = paths(directory)
    try:
        return cert.read_bytes(), key.read_bytes()
    except OSError:
        return None


def write_pair(directory: Path, cert_pem: bytes, key_pem: bytes) -> bool:
    """Make ``cert_pem``/``key_pem`` the pair in ``directory``; False if it already was."""
    directory.mkdir(parents=True, exist_ok=True)
    if read_pair(directory) == (cert_pem, key_pem):
        return False
    version = Path(tempfile.mkdtemp(prefix="..", dir=directory))  # mode 0700
    (version / CERT).write_bytes(cert_pem)
    fd = os.open(version / KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as key_file:
        key_file.write(key_pem)
    _swap(directory, DATA, Path(version.name))
    for name in (CERT, KEY):
        if not (directory / name).is_symlink():  # the first pair; later ones reuse the links
            _swap(directory, name, Path(DATA) / name)
    for entry in os.scandir(directory):
        # earlier versions (a crash between mkdtemp and the swap may leave one too)
        if entry.name.startswith("..") and entry.name != version.name and not entry.is_symlink():
            shutil.rmtree(entry.path, ignore_errors=True)
    return True


def _swap(directory: Path, name: str, target: Path) -> None:
    """Point the symlink ``directory/name`` at ``target`` in one rename."""
    scratch = directory / f".{name}.new"
    scratch.unlink(missing_ok=True)
    scratch.symlink_to(target)
    scratch.replace(directory / name)
