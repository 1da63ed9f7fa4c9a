"""The webhook picks up a renewed certificate: the real app over TLS, the files replaced
under it (in place, or by a kubelet-style ``..data`` symlink swap), and each new
connection's certificate read off the handshake."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from sidecar.errors import ConfigError
from sidecar.kube.config import InjectConfig
from sidecar.kube.webhook import RELOADER, CertReloader, stamp, start
from sidecar.testing.served import stop_runner
from tests.support import certs

RELOAD_S = 0.05
PATIENCE_S = 10.0


class TestCA:
    """A CA the client trusts; each :meth:`issue` is a serving certificate it signed."""

    __test__ = False

    def __init__(self, directory: Path) -> None:
        self.cert, self.key = certs.make_ca("webhook test CA")
        self.path = directory / "ca.crt"
        self.path.write_bytes(certs.cert_pem(self.cert))

    def issue(self) -> tuple[bytes, bytes, int]:
        """A leaf for 127.0.0.1: (cert PEM, key PEM, serial)."""
        cert, key = certs.issue(self.cert, self.key)
        return certs.cert_pem(cert), certs.key_pem(key), cert.serial_number


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


async def served_serial(url: str, ca: TestCA) -> int:
    """The serial of the certificate a new TLS connection to ``url`` is shown (verified)."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca.path))
    _, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def eventually(condition: Callable[[], object], what: str) -> None:
    """Wait until ``condition()`` (a sync or async check) is truthy."""
    deadline = asyncio.get_running_loop().time() + PATIENCE_S
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {PATIENCE_S}s: {what}")
        await asyncio.sleep(RELOAD_S / 2)


async def serial_becomes(url: str, ca: TestCA, serial: int) -> None:
    async def shown() -> bool:
        return await served_serial(url, ca) == serial

    await eventually(shown, f"a new connection is shown serial {serial}")


@pytest.fixture
async def serving() -> AsyncIterator[Callable[[Path, Path], Awaitable[tuple[str, CertReloader]]]]:
    runners: list[web.AppRunner] = []

    async def run(cert: Path, key: Path) -> tuple[str, CertReloader]:
        runner, url = await start("127.0.0.1:0", cert, key, InjectConfig(), reload_s=RELOAD_S)
        runners.append(runner)
        return url, runner.app[RELOADER]

    try:
        yield run
    finally:
        for runner in runners:
            await stop_runner(runner)


async def test_a_renewed_pair_is_served_to_new_connections_and_a_mismatched_key_is_not(
    ca: TestCA, tmp_path: Path, serving, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="sidecar.kube.webhook")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    a_cert, a_key, a_serial = ca.issue()
    cert.write_bytes(a_cert)
    key.write_bytes(a_key)
    url, reloader = await serving(cert, key)
    assert await served_serial(url, ca) == a_serial

    # an established connection keeps A while the files change under it
    context = ssl.create_default_context(cafile=str(ca.path))
    host, port = url.removeprefix("https://").rsplit(":", 1)
    _, open_writer = await asyncio.open_connection(host, int(port), ssl=context)

    b_cert, b_key, b_serial = ca.issue()
    cert.write_bytes(b_cert)
    key.write_bytes(b_key)
    await serial_becomes(url, ca, b_serial)
    assert reloader.reloads >= 1  # (a check between the two writes may have seen cert B, key A)
    assert any(r.getMessage() == "TLS certificate reloaded" for r in caplog.records)
    old = open_writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    assert x509.load_der_x509_certificate(old).serial_number == a_serial
    open_writer.close()
    await open_writer.wait_closed()

    # a key that is not B's: a warning, and B stays
    reloads, rejected, logged = reloader.reloads, reloader.rejected, len(caplog.records)
    _, other_key, _ = ca.issue()
    key.write_bytes(other_key)
    await eventually(lambda: reloader.rejected > rejected, "the mismatched pair is rejected")
    assert await served_serial(url, ca) == b_serial

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records[logged:] if r.levelno == logging.WARNING]

    assert warnings()
    assert "keeping the old one" in warnings()[0]
    # it keeps trying, and warns once per version of the files, not every tick
    await eventually(lambda: reloader.rejected > rejected + 3, "the pair is checked again")
    assert len(warnings()) == 1
    assert await served_serial(url, ca) == b_serial
    assert reloader.reloads == reloads

    # the matching key arrives: C is taken
    c_cert, c_key, c_serial = ca.issue()
    cert.write_bytes(c_cert)
    key.write_bytes(c_key)
    await serial_becomes(url, ca, c_serial)
    assert reloader.reloads > reloads


async def test_a_half_written_certificate_keeps_the_old_one(ca: TestCA, tmp_path: Path, serving):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    a_cert, a_key, a_serial = ca.issue()
    cert.write_bytes(a_cert)
    key.write_bytes(a_key)
    url, reloader = await serving(cert, key)

    b_cert, b_key, b_serial = ca.issue()
    cert.write_bytes(b_cert[: len(b_cert) // 2])  # the writer is not done yet
    await eventually(lambda: reloader.rejected > 0, "the half-written file is rejected")
    assert await served_serial(url, ca) == a_serial
    key.unlink()  # between remove and create
    rejected = reloader.rejected
    await eventually(lambda: reloader.rejected > rejected, "the missing key is rejected")
    assert await served_serial(url, ca) == a_serial

    cert.write_bytes(b_cert)
    key.write_bytes(b_key)
    await serial_becomes(url, ca, b_serial)


def kubelet_mount(directory: Path, cert: bytes, key: bytes, version: str) -> None:
    """Publish a Secret the way kubelet's atomic writer does: a new timestamped directory,
    ``..data`` switched to it by a rename, the old directory removed; ``tls.crt`` and
    ``tls.key`` are symlinks through ``..data`` made once."""
    directory.mkdir(exist_ok=True)
    payload = directory / f"..2026_12_01_{version}"
    payload.mkdir()
    (payload / "tls.crt").write_bytes(cert)
    (payload / "tls.key").write_bytes(key)
    data = directory / "..data"
    old = data.resolve() if data.is_symlink() else None
    staging = directory / "..data_tmp"
    staging.symlink_to(payload.name)
    staging.replace(data)
    for name in ("tls.crt", "tls.key"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    if old is not None:
        for child in old.iterdir():
            child.unlink()
        old.rmdir()


async def test_a_kubelet_symlink_swap_is_picked_up(ca: TestCA, tmp_path: Path, serving):
    mount = tmp_path / "tls"
    a_cert, a_key, a_serial = ca.issue()
    kubelet_mount(mount, a_cert, a_key, "05_00_00.1")
    url, reloader = await serving(mount / "tls.crt", mount / "tls.key")
    assert await served_serial(url, ca) == a_serial

    b_cert, b_key, b_serial = ca.issue()
    kubelet_mount(mount, b_cert, b_key, "06_00_00.2")
    assert os.readlink(mount / "..data") == "..2026_12_01_06_00_00.2"
    await serial_becomes(url, ca, b_serial)
    assert reloader.reloads == 1


def test_a_check_with_nothing_changed_loads_nothing(ca: TestCA, tmp_path: Path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    a_cert, a_key, _ = ca.issue()
    cert.write_bytes(a_cert)
    key.write_bytes(a_key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    reloader = CertReloader(context, cert, key, stamp(cert, key))
    assert (reloader.check(), reloader.reloads, reloader.rejected) == (False, 0, 0)
    b_cert, b_key, _ = ca.issue()
    replacement = tmp_path / "new.crt"
    replacement.write_bytes(b_cert)
    key.write_bytes(b_key)
    replacement.replace(cert)  # a new inode, as a rename-into-place writer makes
    assert reloader.check() is True
    assert reloader.check() is False
    assert reloader.reloads == 1


@pytest.mark.parametrize("interval", [0, -1, float("nan")])
async def test_the_reload_interval_must_be_positive(ca: TestCA, tmp_path: Path, interval):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    a_cert, a_key, _ = ca.issue()
    cert.write_bytes(a_cert)
    key.write_bytes(a_key)
    with pytest.raises(ConfigError, match="reload interval"):
        await start("127.0.0.1:0", cert, key, InjectConfig(), reload_s=interval)


async def test_a_new_certificate_before_its_key_keeps_the_old_pair(
    ca: TestCA, tmp_path: Path, serving
):
    # Loading B's certificate next to A's key into the live context would leave it with
    # no key at all (OpenSSL drops a key that does not match a new certificate); the pair
    # is checked first, so A keeps being served.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    a_cert, a_key, a_serial = ca.issue()
    cert.write_bytes(a_cert)
    key.write_bytes(a_key)
    url, reloader = await serving(cert, key)

    b_cert, b_key, b_serial = ca.issue()
    cert.write_bytes(b_cert)
    await eventually(lambda: reloader.rejected > 0, "B's certificate with A's key is rejected")
    assert await served_serial(url, ca) == a_serial
    key.write_bytes(b_key)
    await serial_becomes(url, ca, b_serial)
