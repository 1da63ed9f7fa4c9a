"""The pair in ``--cert-dir``: written through a ``..data`` symlink that one rename swaps,
the key private, earlier versions cleaned up, an unchanged pair not rewritten, and the
webhook's :class:`CertReloader` taking each new pair whole."""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

from sidecar.kube import certfiles
from sidecar.kube.webhook import CertReloader, stamp
from tests.support import certs


def pair() -> tuple[bytes, bytes]:
    ca_cert, ca_key = certs.make_ca("files test CA")
    cert, key = certs.issue(ca_cert, ca_key)
    return certs.cert_pem(cert), certs.key_pem(key)


def versions(directory: Path) -> list[str]:
    return sorted(
        e.name for e in os.scandir(directory) if e.name.startswith("..") and not e.is_symlink()
    )


def test_the_first_pair_is_laid_out_like_a_mounted_secret(tmp_path: Path):
    directory = tmp_path / "certs"
    cert_pem, key_pem = pair()
    assert certfiles.read_pair(directory) is None
    assert certfiles.write_pair(directory, cert_pem, key_pem) is True
    cert, key = certfiles.paths(directory)
    assert (cert.read_bytes(), key.read_bytes()) == (cert_pem, key_pem)
    assert os.readlink(cert) == "..data/tls.crt"
    assert os.readlink(key) == "..data/tls.key"
    (version,) = versions(directory)
    assert os.readlink(directory / "..data") == version
    assert stat.S_IMODE(key.resolve().stat().st_mode) == 0o600
    assert certfiles.read_pair(directory) == (cert_pem, key_pem)


def test_the_same_pair_again_writes_nothing(tmp_path: Path):
    cert_pem, key_pem = pair()
    certfiles.write_pair(tmp_path, cert_pem, key_pem)
    before = stamp(*certfiles.paths(tmp_path))
    assert certfiles.write_pair(tmp_path, cert_pem, key_pem) is False
    assert stamp(*certfiles.paths(tmp_path)) == before


def test_a_new_pair_replaces_the_old_whole_and_the_old_version_goes(tmp_path: Path):
    first, second = pair(), pair()
    certfiles.write_pair(tmp_path, *first)
    (old,) = versions(tmp_path)
    assert certfiles.write_pair(tmp_path, *second) is True
    assert certfiles.read_pair(tmp_path) == second
    (new,) = versions(tmp_path)
    assert new != old
    leftovers = {e.name for e in os.scandir(tmp_path)} - {"tls.crt", "tls.key", "..data", new}
    assert leftovers == set()


def test_the_reloader_takes_each_written_pair(tmp_path: Path):
    first, second = pair(), pair()
    certfiles.write_pair(tmp_path, *first)
    cert, key = certfiles.paths(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    reloader = CertReloader(context, cert, key, stamp(cert, key))
    assert reloader.check() is False
    certfiles.write_pair(tmp_path, *second)
    assert reloader.check() is True
    assert (reloader.reloads, reloader.rejected) == (1, 0)


def test_a_regular_file_where_a_link_belongs_is_replaced(tmp_path: Path):
    cert_pem, key_pem = pair()
    (tmp_path / "tls.crt").write_bytes(b"stale")
    certfiles.write_pair(tmp_path, cert_pem, key_pem)
    assert (tmp_path / "tls.crt").is_symlink()
    assert certfiles.read_pair(tmp_path) == (cert_pem, key_pem)
